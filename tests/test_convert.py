import os
import subprocess
import sys

import pytest
import torch

from kvgpt.checkpoint import load_checkpoint, save_checkpoint
from kvgpt.errors import UserError, model_errors
from model import GPT, GPTConfig
import sample
from tools import convert
import train

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
TRAIN = dict(n_head=4, n_embd=32, block_size=32, batch_size=4, gradient_accumulation_steps=1,
             max_iters=12, eval_interval=12, eval_iters=1, log_interval=100, device='cpu',
             compile=False, dtype='float32', learning_rate=3e-3, warmup_iters=2, lr_decay_iters=12,
             tie_weights=False)
HF = 'transformers is the optional GPT-2 import dependency'
EXACT = {  # the paper's settings where W_Q elimination is exact (section 4)
    'single_layer_no_norm': dict(n_layer=1, norm=False),  # theorem 4.1
    'single_layer_tied': dict(n_layer=1, norm=False, tie_weights=True),
    'attention_only_skips': dict(n_layer=3, norm=False, mlp_residual=False),  # theorem 4.2
    'attention_only_skips_gqa': dict(n_layer=2, norm=False, mlp_residual=False, n_kv_head=2),
    'shared_layers': dict(n_layer=3, norm=False, share_layers=True),  # theorem 4.3
    'shared_attention_only_skips': dict(n_layer=3, norm=False, share_layers=True,
                                        mlp_residual=False),
    'biases': dict(n_layer=2, norm=False, mlp_residual=False, bias=True),
    # RoPE turns q and k after their projections: the change of basis before them stays exact
    'rope_single_layer': dict(n_layer=1, norm=False, pos='rope'),
    'rope_attention_only_skips': dict(n_layer=3, norm=False, mlp_residual=False, pos='rope'),
}


def trained(data_root, out_dir, **kw):
    cfg = dict(TRAIN, dataset='tiny', data_root=data_root, out_dir=str(out_dir))
    cfg.update(kw)
    train.main([f'--{k}={v}' for k, v in cfg.items()])
    return str(out_dir)


def run_convert(in_dir, out_dir, **kw):
    return convert.convert(dict(convert.DEFAULTS, in_dir=in_dir, out_dir=str(out_dir), **kw))


@pytest.mark.parametrize('name', EXACT)
def test_exact_settings_convert_to_identical_logits(data_root, tmp_path, name):
    src_dir = trained(data_root, tmp_path / 'src', **EXACT[name])
    if name == 'biases':  # a query bias adds a per-key logit term no identity query has: zero it
        ckpt = load_checkpoint(os.path.join(src_dir, 'ckpt.pt'))
        for k, v in ckpt['model'].items():
            if k.endswith('attn.c_attn.bias'):
                v[:32] = 0
        save_checkpoint(ckpt, os.path.join(src_dir, 'ckpt.pt'))
    res = run_convert(src_dir, tmp_path / 'dst', data_root=data_root)
    assert res['exact'] and res['check'].startswith('held-out tokens')
    assert res['max_logit_diff_float64'] < (1e-12 if 'rope' in name else 1e-9)
    assert res['max_logit_diff_float32'] < 1e-4
    assert abs(res['loss_before'] - res['loss_after']) < 1e-5
    n_blocks = 1 if EXACT[name].get('share_layers') else EXACT[name]['n_layer']
    saved = (32 * 32 + (32 if EXACT[name].get('bias') else 0)) * n_blocks
    assert res['attention_params_before'] - res['attention_params_after'] == saved
    assert res['untied'] == EXACT[name].get('tie_weights', False)
    src_ckpt = load_checkpoint(os.path.join(src_dir, 'ckpt.pt'))
    src = GPT.from_checkpoint(src_ckpt, verbose=False).eval()
    dst_ckpt = load_checkpoint(str(tmp_path / 'dst' / 'ckpt.pt'))
    dst = GPT.from_checkpoint(dst_ckpt, verbose=False).eval()
    assert dst.config.query == 'identity' and dst.config.scale == src.config.scale
    assert not dst.config.tie_weights
    prompt = torch.tensor([[10, 60, 32, 101]])
    assert torch.equal(src.generate(prompt, 40, temperature=0.0),
                       dst.generate(prompt, 40, temperature=0.0))


def test_converted_checkpoint_fine_tunes_and_samples(data_root, tmp_path):
    src_dir = trained(data_root, tmp_path / 'src', n_layer=1, norm=False)
    run_convert(src_dir, tmp_path / 'dst', data_root=data_root)
    log = trained(data_root, tmp_path / 'dst', n_layer=1, norm=False, init_from='resume',
                  max_iters=16)
    assert load_checkpoint(os.path.join(log, 'ckpt.pt'))['iter_num'] == 16
    texts = sample.sample(dict(sample.DEFAULTS, out_dir=str(tmp_path / 'dst'), num_samples=1,
                               max_new_tokens=10, device='cpu'))
    assert len(texts) == 1


def test_a_conversion_replaces_only_an_earlier_conversion(data_root, tmp_path):
    src_dir = trained(data_root, tmp_path / 'src', n_layer=1, norm=False)
    run_convert(src_dir, tmp_path / 'dst', data_root=data_root)
    run_convert(src_dir, tmp_path / 'dst', data_root=data_root)  # an earlier conversion: replaced
    trained(data_root, tmp_path / 'dst', n_layer=1, norm=False, init_from='resume', max_iters=16)
    src_bytes = open(os.path.join(src_dir, 'ckpt.pt'), 'rb').read()
    os.makedirs(tmp_path / 'foreign')
    save_checkpoint(load_checkpoint(os.path.join(src_dir, 'ckpt.pt')),
                    str(tmp_path / 'foreign' / 'ckpt.pt'))
    for out_dir, words in [(src_dir, 'is the run it converts'),
                           (tmp_path / 'dst', r'holds a training run \(config.json\)'),
                           (tmp_path / 'foreign', 'holds a checkpoint that is not an earlier')]:
        with pytest.raises(UserError, match=f"--out_dir={out_dir} {words}"):
            run_convert(src_dir, out_dir, data_root=data_root)
    # the fine-tuned run and the source are as they were
    assert load_checkpoint(str(tmp_path / 'dst' / 'ckpt.pt'))['iter_num'] == 16
    assert open(os.path.join(src_dir, 'ckpt.pt'), 'rb').read() == src_bytes


def test_pre_ln_model_is_refused_then_approximated(data_root, tmp_path):
    src_dir = trained(data_root, tmp_path / 'src', n_layer=2)
    with pytest.raises(UserError, match='LayerNorm'):
        run_convert(src_dir, tmp_path / 'dst', data_root=data_root)
    assert not (tmp_path / 'dst').exists()
    res = run_convert(src_dir, tmp_path / 'dst', data_root=data_root, approximate=True)
    assert not res['exact'] and 'LayerNorm' in res['reason']
    assert res['max_logit_diff_float64'] > 1e-3  # measured, not hidden
    assert res['loss_after'] != res['loss_before']
    assert load_checkpoint(str(tmp_path / 'dst' / 'ckpt.pt'))['conversion']['exact'] is False


def test_full_skips_without_norm_need_shared_weights(data_root, tmp_path):
    src_dir = trained(data_root, tmp_path / 'src', n_layer=2, norm=False)
    with pytest.raises(UserError, match='one basis of the residual stream cannot make every W_Q '
                                        'the identity'):
        run_convert(src_dir, tmp_path / 'dst', data_root=data_root)


def test_singular_query_weight_and_query_bias_are_refused(data_root, tmp_path):
    src_dir = trained(data_root, tmp_path / 'src', n_layer=1, norm=False, bias=True)
    with pytest.raises(UserError, match='non-zero query bias'):
        run_convert(src_dir, tmp_path / 'dst', data_root=data_root)
    ckpt = load_checkpoint(os.path.join(src_dir, 'ckpt.pt'))
    # one query output: W_Q loses rank
    ckpt['model']['transformer.h.0.attn.c_attn.weight'][:32][5] = 0
    ckpt['model']['transformer.h.0.attn.c_attn.bias'][:32] = 0
    save_checkpoint(ckpt, os.path.join(src_dir, 'ckpt.pt'))
    with pytest.raises(UserError, match=r'W_Q of layer 0 is singular or ill-conditioned '
                                        r'\(condition number'):
        run_convert(src_dir, tmp_path / 'dst', data_root=data_root)


@pytest.mark.slow
def test_cli_refusal_is_one_line(data_root, tmp_path):
    src_dir = trained(data_root, tmp_path / 'src', n_layer=1)
    r = subprocess.run([sys.executable, '-m', 'tools.convert', f'--in_dir={src_dir}'], cwd=HERE,
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count('\n') == 1
    assert 'refusing' in r.stderr and '--approximate=True' in r.stderr


# -----------------------------------------------------------------------------
# imports: OpenAI GPT-2 (Hugging Face format) and nanoGPT checkpoints

@pytest.mark.slow  # a GPT-2 import
@pytest.mark.gpt2_bpe
def test_gpt2_import_matches_transformers(tmp_path):
    transformers = pytest.importorskip('transformers', reason=HF)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=24, vocab_size=50257)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(tmp_path / 'gpt2-tiny')
    ours = GPT.from_pretrained(str(tmp_path / 'gpt2-tiny')).eval()
    assert ours.get_num_params() == sum(p.numel() for p in hf.parameters())
    idx = torch.randint(0, 50257, (2, 24))
    with torch.no_grad():
        want = hf(idx).logits
        got, _ = ours(idx, targets=idx)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    texts = sample.sample(dict(sample.DEFAULTS, init_from=str(tmp_path / 'gpt2-tiny'),
                               start='Hello', num_samples=1, max_new_tokens=5, device='cpu'))
    assert len(texts) == 1


def test_gpt2_import_errors_are_clear(tmp_path):
    # model.py raises; a script makes it one line
    with pytest.raises(ValueError, match="init_from 'gpt3' is no file or folder here"):
        GPT.from_pretrained('gpt3')
    with pytest.raises(UserError, match="init_from 'gpt3' is no file or folder here"):
        with model_errors():
            GPT.from_pretrained('gpt3')
    run = tmp_path / 'out-run'  # a run folder has a config.json too: not GPT-2's weights
    run.mkdir()
    (run / 'ckpt.pt').write_bytes(b'')
    (run / 'config.json').write_text('{}')
    with pytest.raises(ValueError, match=f"^{run} is a run folder, not GPT-2 weights: name its "
                                         f"checkpoint \\(init_from={run}/ckpt.pt\\)"):
        GPT.from_pretrained(str(run))
    pytest.importorskip('transformers', reason=HF)
    with pytest.raises(ValueError, match="cannot load GPT-2 weights 'gpt2'.*without network"):
        GPT.from_pretrained('gpt2')  # the hub is unreachable here (HF_HUB_OFFLINE in conftest)


@pytest.mark.gpt2_bpe
def test_nanogpt_checkpoint_loads_as_a_baseline(tmp_path):
    torch.manual_seed(0)
    args = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=50304, bias=True)
    src = GPT(GPTConfig(**args), verbose=False)
    # nanoGPT's keys: model_args without the new fields, compiled-model prefixes, a tensor loss
    nanogpt = dict(
        model={f'_orig_mod.{k}': v for k, v in src.state_dict().items()},
        model_args=dict(args, dropout=0.0),
        iter_num=5000, best_val_loss=torch.tensor(2.85), config=dict(dataset='openwebtext'))
    (tmp_path / 'run').mkdir()
    torch.save(nanogpt, tmp_path / 'run' / 'ckpt.pt')
    model = GPT.from_checkpoint(load_checkpoint(str(tmp_path / 'run' / 'ckpt.pt')), verbose=False)
    idx = torch.randint(0, 50257, (1, 16))
    torch.testing.assert_close(model(idx, idx)[0], src(idx, idx)[0], rtol=0, atol=0)
    texts = sample.sample(dict(sample.DEFAULTS, out_dir=str(tmp_path / 'run'), num_samples=1,
                               max_new_tokens=4, device='cpu', start='Hi'))
    assert len(texts) == 1


def test_a_qk_norm_model_is_refused_in_one_line(data_root, tmp_path):
    src_dir = trained(data_root, tmp_path / 'src', n_layer=1, norm=False, pos='rope', qk_norm=True)
    with pytest.raises(UserError,
                       match="qk_norm: it normalises each head's x W_Q, and with W_Q = I"):
        run_convert(src_dir, tmp_path / 'dst', data_root=data_root)
    assert not (tmp_path / 'dst').exists()
