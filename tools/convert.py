"""
The paper's theorems as a tool: turn a trained standard checkpoint into a query='identity'
one by a change of basis of the residual stream, and verify it.

    python train.py config/lab/theory.py               # first, a model the theorems cover (~2 min)
    python -m tools.convert --in_dir=out-theory    # writes out-theory-qid/ckpt.pt, exact
    python train.py config/cpu/small.py --out_dir=out-small   # a standard pre-LN GPT (~4 min)
    python -m tools.convert --in_dir=out-small --approximate=True   # the best effort, its gap

(The README's demo, out-demo, is W_Q = I already: there is nothing to convert.)

Attention reads its input x only through x W_Q, x W_K, x W_V. If the stream entering a
layer is written in the basis Theta = W_Q (x' = x Theta), then Theta^-1 W_Q = I and the
query weight is gone; Theta^-1 goes into every weight that reads the stream (W_K, W_V,
the MLP input, the LM head) and Theta into every weight that writes it (embeddings,
attention and MLP output projections). This is exact when nothing between those weights
depends on the basis, i.e. without normalization, and when one Theta can serve every layer:
  - a single layer (theorem 4.1: "free lunch"),
  - skip connections around the attention only, so each layer's MLP output starts a fresh
    stream in the next layer's basis (theorem 4.2),
  - all layers sharing one block's weights, hence one W_Q (theorem 4.3).
LayerNorm normalizes coordinates, which a change of basis does not commute with: the
standard pre-LN GPT is refused unless --approximate=True, which writes the best-effort
conversion (one Theta, the first layer's W_Q; every other W_Q replaced by I) and reports
the gap, a starting point for fine-tuning.

"""
import math
import os
import sys
from dataclasses import asdict

if not __package__:  # run as a file, not with -m: import from the repository root all the same
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from kvgpt.errors import quiet_imports  # first: Ctrl-C in the imports below is one line
quiet_imports(__name__)

import torch

from kvgpt.checkpoint import load_checkpoint, save_checkpoint
from kvgpt.config import defaults, keys, parse_config
from kvgpt.data import open_dataset
from kvgpt.errors import UserError, run_main
from lab.probes import param_breakdown
from tools import read_run, run_keys
from model import GPT, GPTConfig

KEYS = {**run_keys("the standard checkpoint to convert", "where the W_Q = I checkpoint goes",
                   '-qid'), **keys(
    approximate=(False, "allow the settings where the conversion cannot be exact"),
    max_cond=(1e6, "refuse a W_Q whose condition number is larger"),
    data_root=('data', "held-out tokens for the check: data_root/<checkpoint's dataset>/val.bin"),
    check_tokens=(4096, "held-out tokens on which both models' logits are compared"),
    seed=(1337, "which held-out windows the check reads"),
)}
DEFAULTS = defaults(KEYS)


def exactness(cfg):
    """None when the change of basis is exact for this architecture, else the reason it is not.
    RoPE rotates q and k after their projections, so it leaves the change of basis exact."""
    if cfg.norm:
        return ("the model has LayerNorm, which does not commute with a change of basis "
                "(train with norm=False for an exact conversion)")
    if cfg.n_layer > 1 and cfg.mlp_residual and not cfg.share_layers:
        return (f"{cfg.n_layer} layers with their own W_Q and skip connections around the MLP: "
                "one basis of the residual stream cannot make every W_Q the identity "
                "(theorems 4.2/4.3 need attention-only skips or shared weights)")
    return None


def split_attn(cfg, sd_prefix, sd):
    """W_Q, W_K, W_V of one block in row-vector form (x @ W), and the biases."""
    C, kv = cfg.n_embd, cfg.n_kv_head * cfg.head_dim
    w = sd[f'{sd_prefix}attn.c_attn.weight'].T
    b = sd.get(f'{sd_prefix}attn.c_attn.bias')
    Wq, Wk, Wv = w[:, :C], w[:, C:C + kv], w[:, C + kv:]
    bq, bk, bv = (None, None, None) if b is None else (b[:C], b[C:C + kv], b[C + kv:])
    return Wq, Wk, Wv, bq, bk, bv


def check_conditioning(W, layer, max_cond):
    cond = torch.linalg.cond(W).item()
    if not math.isfinite(cond) or cond > max_cond:
        raise UserError(f"W_Q of layer {layer} is singular or ill-conditioned (condition number "
                        f"{cond:.3g} > max_cond {max_cond:.3g}): it cannot be inverted reliably, "
                        "so it is not converted")
    return cond


def convert_state(sd, cfg, approximate, max_cond):
    """(new state dict, new config, report) in float64; sd holds float64 tensors."""
    n_blocks = 1 if cfg.share_layers else cfg.n_layer
    prefixes = [f'transformer.h.{i}.' for i in range(n_blocks)]
    Wqs = [split_attn(cfg, p, sd)[0] for p in prefixes]
    per_layer = not cfg.mlp_residual and not cfg.share_layers
    # with one basis for every layer only the first W_Q is inverted (the rest, approximate mode,
    # become I)
    inverted = Wqs if per_layer else Wqs[:1]
    conds = [check_conditioning(W, i, max_cond) for i, W in enumerate(inverted)]
    # the basis of the stream entering each block, and the one after the last block
    bases = Wqs if per_layer else [Wqs[0]] * n_blocks
    final = torch.eye(cfg.n_embd, dtype=torch.float64) if per_layer else bases[0]
    out = {}
    for i, p in enumerate(prefixes):
        P = bases[i]
        # where the MLP writes
        N = (bases[i + 1] if i + 1 < n_blocks else final) if per_layer else P
        Pi = torch.linalg.inv(P)
        Wq, Wk, Wv, bq, bk, bv = split_attn(cfg, p, sd)
        if bq is not None and bq.abs().max() > 0 and not approximate:
            raise UserError(f"layer {i} has a non-zero query bias: it adds a per-key term to the "
                            "logits that no identity query can reproduce; use --approximate=True "
                            "to drop it")
        out[f'{p}attn.c_attn.weight'] = torch.cat([Pi @ Wk, Pi @ Wv], dim=1).T  # reads the stream
        if bk is not None:
            out[f'{p}attn.c_attn.bias'] = torch.cat([bk, bv])
        out[f'{p}attn.c_proj.weight'] = (sd[f'{p}attn.c_proj.weight'].T @ P).T  # writes the stream
        out[f'{p}mlp.c_fc.weight'] = (Pi @ sd[f'{p}mlp.c_fc.weight'].T).T
        out[f'{p}mlp.c_proj.weight'] = (sd[f'{p}mlp.c_proj.weight'].T @ N).T
        for name, basis in (('attn.c_proj.bias', P), ('mlp.c_proj.bias', N)):
            if f'{p}{name}' in sd:
                out[f'{p}{name}'] = sd[f'{p}{name}'] @ basis
        if f'{p}mlp.c_fc.bias' in sd:
            out[f'{p}mlp.c_fc.bias'] = sd[f'{p}mlp.c_fc.bias']
        for k in sd:  # LayerNorms (approximate mode only) pass through unchanged
            if k.startswith(p) and '.ln_' in k:
                out[k] = sd[k]
    out['transformer.wte.weight'] = sd['transformer.wte.weight'] @ bases[0]
    if 'transformer.wpe.weight' in sd:  # RoPE models have no position table
        out['transformer.wpe.weight'] = sd['transformer.wpe.weight'] @ bases[0]
    out['lm_head.weight'] = sd['lm_head.weight'] @ torch.linalg.inv(final).T  # logits = h W^T
    for k in sd:
        if k.startswith('transformer.ln_f.'):
            out[k] = sd[k]
    new_cfg = GPTConfig(**{**asdict(cfg), 'query': 'identity', 'attn_scale': cfg.scale,
                           'tie_weights': False})
    return out, new_cfg, dict(condition_numbers=conds, untied=cfg.tie_weights)


def check_tokens(ckpt, c, vocab, block_size):
    """Held-out tokens of the checkpoint's own dataset when prepared here, else random ones."""
    dataset = ckpt['config'].get('dataset')
    n = max(1, c['check_tokens'] // block_size)
    if dataset:
        try:
            data = open_dataset(c['data_root'], dataset, block_size)
            x, y = data.batch('val', data.starts('val', n, c['seed']))
            return x, y, f'held-out tokens of {data.dir}/val.bin'
        except UserError:
            pass  # not prepared here: random tokens still check the conversion
    g = torch.Generator().manual_seed(c['seed'])
    x = torch.randint(vocab, (n, block_size + 1), generator=g)
    return x[:, :-1], x[:, 1:], 'random tokens (no prepared val.bin found)'


@torch.no_grad()
def compare(a, b, x, y):
    """Max |logit difference| and both losses, all positions."""
    la, loss_a = a(x, y)
    lb, loss_b = b(x, y)
    return (la - lb).abs().max().item(), loss_a.item(), loss_b.item()


def check_out_dir(out_dir, in_dir):
    """convert writes out_dir/ckpt.pt: never over the run it reads, over a training run (its
    config.json and log.jsonl describe its ckpt.pt) or over a checkpoint it did not write."""
    if os.path.realpath(out_dir) == os.path.realpath(in_dir):
        raise UserError(f"--out_dir={out_dir} is the run it converts: name a new folder")
    for record in ('config.json', 'log.jsonl'):
        if os.path.exists(os.path.join(out_dir, record)):
            raise UserError(f"--out_dir={out_dir} holds a training run ({record}), whose "
                            "checkpoint a conversion would replace: name a new folder")
    path = os.path.join(out_dir, 'ckpt.pt')
    if os.path.exists(path) and 'conversion' not in load_checkpoint(path, mmap=True):
        raise UserError(f"--out_dir={out_dir} holds a checkpoint that is not an earlier "
                        "conversion: name a new folder")


def convert(c):
    out_dir, src, ckpt = read_run(c, '-qid', check_out_dir)
    cfg = src.config
    if cfg.query != 'linear':
        raise UserError(f"the checkpoint's query is '{cfg.query}', not a linear W_Q: only a "
                        "linear query is a change of basis away from the identity; convert a "
                        "standard model")
    if cfg.key_identity or cfg.value_identity:
        raise UserError("the checkpoint already has an identity attention weight: convert a "
                        "standard model")
    if cfg.qk_norm:
        raise UserError("the checkpoint has qk_norm: it normalises each head's x W_Q, and with "
                        "W_Q = I it would normalise raw slices of the residual stream instead, a "
                        "different function that no change of basis reaches; convert a model "
                        "trained without qk_norm")
    if cfg.learn_scale:
        raise UserError("the checkpoint learns its softmax scale per head (learn_scale): convert "
                        "a model with a fixed scale")
    reason = exactness(cfg)
    if reason and not c['approximate']:
        raise UserError(f"refusing: the conversion would not be exact because {reason}. "
                        "Pass --approximate=True to write the best-effort conversion and measure "
                        "its gap")
    sd64 = {k: v.double() for k, v in src.state_dict().items()}
    new_sd, new_cfg, report = convert_state(sd64, cfg, c['approximate'], c['max_cond'])
    dst = GPT(new_cfg, verbose=False).double()
    dst.load_state_dict(new_sd)
    src = src.double().eval()
    dst.eval()
    x, y, where = check_tokens(ckpt, c, cfg.vocab_size, cfg.block_size)
    d64 = compare(src, dst, x, y)
    d32 = compare(src.float(), dst.float(), x, y)
    before, after = param_breakdown(src), param_breakdown(dst)
    os.makedirs(out_dir, exist_ok=True)
    result = dict(exact=reason is None, reason=reason, check=where, max_logit_diff_float64=d64[0],
                  max_logit_diff_float32=d32[0], loss_before=d32[1], loss_after=d32[2],
                  attention_params_before=before['attention'],
                  attention_params_after=after['attention'],
                  condition_numbers=report['condition_numbers'], untied=report['untied'])
    save_checkpoint(dict(model=dst.float().state_dict(), model_args=asdict(new_cfg),
                         iter_num=ckpt.get('iter_num', 0),
                         best_val_loss=float(ckpt.get('best_val_loss', float('inf'))),
                         config=ckpt['config'], meta=ckpt['meta'],
                         converted_from=os.path.abspath(c['in_dir']), conversion=result),
                    os.path.join(out_dir, 'ckpt.pt'))
    print_conversion(result, cfg, out_dir, ckpt.get('iter_num', 0))
    return result


def print_conversion(r, cfg, out_dir, step):
    print(f"{'exact' if r['exact'] else 'APPROXIMATE'} conversion, checked on {r['check']}:")
    print(f"  max |logit difference|: {r['max_logit_diff_float64']:.3e} (float64), "
          f"{r['max_logit_diff_float32']:.3e} (float32)")
    print(f"  loss: {r['loss_before']:.6f} before, {r['loss_after']:.6f} after")
    saved = r['attention_params_before'] - r['attention_params_after']
    n_blocks = cfg.n_layer if not cfg.share_layers else 1
    print(f"  attention parameters: {r['attention_params_before']:,} -> "
          f"{r['attention_params_after']:,} (-{saved:,} = {n_blocks} x n_embd^2)")
    print(f"  W_Q condition numbers: {', '.join(f'{k:.3g}' for k in r['condition_numbers'])}")
    if r['untied']:
        print("  note: the LM head was tied to the token embedding; a non-orthogonal change of "
              "basis unties them (tie_weights=False)")
    if r['reason']:
        print(f"  why not exact: {r['reason']}")
    print(f"wrote {out_dir}/ckpt.pt (step {step}); to fine-tune it: python train.py <the source "
          f"run's config file> --init_from=resume --out_dir={out_dir} --max_iters=<above {step}>")




def main(argv=None):
    return convert(parse_config(KEYS, argv, show=True, usage=__doc__))


if __name__ == '__main__':
    run_main(main)
