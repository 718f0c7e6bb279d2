"""
Export a kvgpt checkpoint to the Hugging Face transformers GPT-2 format (config.json,
model.safetensors, and GPT-2's tokenizer files), for transformers pipelines, evaluation
harnesses, inference servers and llama.cpp converters:

    python -m tools.export --in_dir=out-reduced --out_dir=hf-reduced   # a GPT-2 BPE run

Every model GPT-2's format can hold is exactly a GPT-2: W_Q = I is written out as an identity
matrix (so an exported reduced model gives up its 7M-parameter saving at inference), a softmax
scale other than 1/sqrt(hd) (a learned one per head too) is folded into the query weights
(s q.k = (1/sqrt(hd)) (s sqrt(hd) q).k), missing biases are zeros, the wider MLP is GPT-2's
n_inner and untied heads set tie_word_embeddings=False. The export is checked against kvgpt's
logits before it is moved into place. What GPT-2 cannot express is refused with the reason; the
checkpoint is only read. out_dir is replaced whole, so it must be new, empty or an earlier export.
"""
import os
import shutil
import sys

if not __package__:  # run as a file, not with -m: import from the repository root all the same
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from kvgpt.errors import quiet_imports  # first: Ctrl-C in the imports below is one line
quiet_imports(__name__)

import torch

from kvgpt.config import defaults, keys, parse_config
from kvgpt.errors import UserError, run_main
from tools import read_run, run_keys

KEYS = {**run_keys("the run to export", "the Hugging Face folder", '-hf'), **keys(
    check_tokens=(256, "random tokens on which the export's logits are compared with kvgpt's"),
    seed=(1337, "the random tokens of the check"),
)}
DEFAULTS = defaults(KEYS)
HF_ACTIVATION = {'gelu': 'gelu', 'gelu_tanh': 'gelu_new', 'relu': 'relu'}
# tiktoken's cache key
GPT2_BPE = 'https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/'


def refusal(cfg, tokenizer):
    """None when GPT-2's format holds this model exactly, else the reason it does not."""
    if cfg.query not in ('linear', 'identity'):
        return (f"its query is '{cfg.query}', not a matrix: GPT-2's attention has a linear "
                "query only")
    if cfg.n_kv_head != cfg.n_head:
        return (f"it uses grouped-query attention ({cfg.n_kv_head} K/V heads for "
                f"{cfg.n_head}); GPT-2 has one per head")
    if not cfg.norm or not cfg.mlp_residual:
        return ("it uses the paper's theoretical block (no LayerNorm or no MLP skip); GPT-2's "
                "block has both")
    if cfg.share_layers:
        return "its layers share one block's weights; GPT-2 stores every layer's own"
    if cfg.pos != 'learned':
        return f"its positions are '{cfg.pos}' (rotary); GPT-2 has a learned position table only"
    if cfg.qk_norm:
        return "it normalises q and k per head (qk_norm); GPT-2's attention has no such norm"
    if tokenizer != 'gpt2':
        return (f"its tokenizer is '{tokenizer}', which has no GPT-2 tokenizer to ship with it "
                "(prepare GPT-2-token data, e.g. `python prepare.py --dataset=pydocs "
                "--tokenizer=gpt2 --out_name=pydocs_gpt2`, and train with "
                "--dataset=pydocs_gpt2)")
    return None


def hf_state_dict(model):
    """kvgpt's weights in GPT2LMHeadModel's names and Conv1D (in, out) layout."""
    cfg, C = model.config, model.config.n_embd
    sd, out = model.state_dict(), {}
    eye = torch.eye(C)
    for i in range(cfg.n_layer):
        p = f'transformer.h.{i}.'
        attn = model.transformer.h[i].attn
        sizes = [attn.q_dim, attn.k_dim, attn.v_dim]
        parts = list(sd[p + 'attn.c_attn.weight'].split(sizes))
        biases = list(sd[p + 'attn.c_attn.bias'].split(sizes)) if cfg.bias else [None] * 3
        for j in range(3):
            if parts[j].numel() == 0:  # the identity weight, written out; its bias is zero
                parts[j], biases[j] = eye.clone(), None
            biases[j] = torch.zeros(C) if biases[j] is None else biases[j]
        # each head's scale over 1/sqrt(hd) (1/2 for the paper's halved one, per head when learned)
        scale = torch.full((cfg.n_head,), cfg.scale) if attn.log_scale is None else \
            attn.log_scale.detach().exp()
        q_fold = (scale * cfg.head_dim ** 0.5).repeat_interleave(cfg.head_dim)
        parts[0], biases[0] = parts[0] * q_fold[:, None], biases[0] * q_fold
        out[p + 'attn.c_attn.weight'] = torch.cat(parts).T
        out[p + 'attn.c_attn.bias'] = torch.cat(biases)
        for name in ('attn.c_proj', 'mlp.c_fc', 'mlp.c_proj'):
            w = sd[p + name + '.weight']
            out[p + name + '.weight'] = w.T
            out[p + name + '.bias'] = sd.get(p + name + '.bias', torch.zeros(w.size(0)))
        for name in ('ln_1', 'ln_2'):
            out[p + name + '.weight'] = sd[p + name + '.weight']
            out[p + name + '.bias'] = sd.get(p + name + '.bias', torch.zeros(C))
    for name in ('transformer.wte.weight', 'transformer.wpe.weight', 'lm_head.weight',
                 'transformer.ln_f.weight'):
        out[name] = sd[name]
    out['transformer.ln_f.bias'] = sd.get('transformer.ln_f.bias', torch.zeros(C))
    return {k: v.contiguous().float() for k, v in out.items()}


def hf_model(model):
    try:
        import transformers
    except ImportError:
        raise UserError("the export needs transformers: "
                        "`pip install transformers safetensors`") from None
    cfg = model.config
    config = transformers.GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd,
        n_layer=cfg.n_layer, n_head=cfg.n_head, n_inner=cfg.mlp_hidden,
        activation_function=HF_ACTIVATION[cfg.activation],
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
        tie_word_embeddings=cfg.tie_weights, bos_token_id=50256, eos_token_id=50256)
    hf = transformers.GPT2LMHeadModel(config)
    missing, unexpected = hf.load_state_dict(hf_state_dict(model), strict=False)
    if unexpected or [k for k in missing if not k.endswith(('.attn.bias', '.attn.masked_bias'))]:
        raise UserError(f"internal: the GPT-2 layout did not match (missing {missing[:3]}, "
                        f"unexpected {unexpected[:3]})")
    return hf.eval()


def write_tokenizer(folder, block_size):
    """GPT-2's own BPE files, the bytes tiktoken caches (encoder.json is vocab.json, vocab.bpe is
    merges.txt): no download when TIKTOKEN_CACHE_DIR holds them."""
    import json
    from tiktoken.load import read_file_cached
    try:
        files = {'vocab.json': read_file_cached(GPT2_BPE + 'encoder.json'),
                 'merges.txt': read_file_cached(GPT2_BPE + 'vocab.bpe')}
    except Exception as e:
        raise UserError(f"cannot read GPT-2's BPE files ({type(e).__name__}): set "
                        "TIKTOKEN_CACHE_DIR to tiktoken's cache, or connect once") from None
    for name, data in files.items():
        with open(os.path.join(folder, name), 'wb') as f:
            f.write(data)
    with open(os.path.join(folder, 'tokenizer_config.json'), 'w') as f:
        json.dump(dict(tokenizer_class='GPT2Tokenizer', model_max_length=block_size,
                       bos_token='<|endoftext|>', eos_token='<|endoftext|>',
                       unk_token='<|endoftext|>', add_prefix_space=False), f, indent=2)


@torch.no_grad()
def max_logit_diff(model, hf, c):
    g = torch.Generator().manual_seed(c['seed'])
    T = min(c['check_tokens'], model.config.block_size)
    idx = torch.randint(model.config.vocab_size, (2, T), generator=g)
    ours, _ = model(idx, targets=torch.zeros_like(idx))
    return (ours - hf(idx).logits).abs().max().item()


def is_export(folder):
    """A folder an earlier export wrote: the transformers files, and no run of kvgpt's."""
    names = set(os.listdir(folder))
    return {'config.json', 'model.safetensors'} <= names and not names & {'ckpt.pt', 'log.jsonl'}


def check_out_dir(out_dir, in_dir):
    """An export replaces out_dir whole, so out_dir may only be new, empty or an earlier export:
    never the run it reads, a folder holding it or the working folder, nor anyone's files."""
    out = os.path.realpath(out_dir)
    for inside, what in ((in_dir, 'the run it exports'), (os.getcwd(), 'the working folder')):
        here = os.path.realpath(inside)
        if here == out or here.startswith(out.rstrip(os.sep) + os.sep):
            raise UserError(f"--out_dir={out_dir} is or holds {what}, and an export replaces "
                            "its folder whole: name a new folder")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"--out_dir={out_dir} is a file: name a new folder")
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not is_export(out_dir):
        raise UserError(f"--out_dir={out_dir} holds files that are not an earlier export, and an "
                        "export replaces its folder whole: name a new folder, or empty it first")


def export(c):
    out_dir, model, ckpt = read_run(c, '-hf', check_out_dir)
    model = model.float().eval()
    tokenizer = ckpt['meta'].get('tokenizer', 'gpt2')  # nanoGPT checkpoints: GPT-2 BPE
    reason = refusal(model.config, tokenizer)
    if reason:
        raise UserError(f"cannot export {c['in_dir']} to GPT-2's format: {reason}")
    hf = hf_model(model)
    diff = max_logit_diff(model, hf, c)
    if diff > 1e-4:
        raise UserError(f"internal: the exported model's logits differ from kvgpt's by "
                        f"{diff:.3g}; nothing was written")
    tmp = out_dir.rstrip('/') + '.tmp'
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        hf.save_pretrained(tmp, safe_serialization=True)
        write_tokenizer(tmp, model.config.block_size)
        umask = os.umask(0)
        os.umask(umask)
        for name in os.listdir(tmp):  # transformers writes some files 0600: as any file written
            if os.path.isfile(os.path.join(tmp, name)):
                os.chmod(os.path.join(tmp, name), 0o666 & ~umask)
    except BaseException:  # a failed export leaves nothing behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)  # complete before it appears under its name
    identity = ', W_Q = I written out' if model.config.query == 'identity' else ''
    params = sum(p.numel() for p in hf.parameters())
    print(f"wrote {out_dir}: GPT2LMHeadModel, {params:,} parameters{identity}; "
          f"max |logit difference| against kvgpt {diff:.2e}")
    return dict(out_dir=out_dir, max_logit_diff=diff)




def main(argv=None):
    return export(parse_config(KEYS, argv, show=True, usage=__doc__))


if __name__ == '__main__':
    run_main(main)
