"""The CUDA path: tests marked `cuda` run on a GPU (`pytest -m cuda`, or tools/gpu_check.sh) and
are skipped with their reason elsewhere; the rest are the CPU regression tests of what reading the
CUDA path found, and the dry run of gpu_check.sh."""
import contextlib
import json
import re
import os
import subprocess

import pytest
import torch

from kvgpt import files
from kvgpt.errors import UserError
from kvgpt.device import PEAK_FLOPS, device_peak_flops, pick_precision
from lab import costs
from model import GPT, GPTConfig, KVCache
import train

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason='needs a CUDA GPU (run tools/gpu_check.sh on one)')
SMALLISH = dict(n_layer=2, n_head=4, n_embd=128, block_size=128, vocab_size=512)


def scaled_model(device, **kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**SMALLISH, **kw}), verbose=False).to(device).eval()
    # larger weights than init: well-separated logits, so rounding cannot flip a tie
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0 if p.dim() == 2 else 1.0)
    return model


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize('query', ['linear', 'identity', 'nonlinear'])
def test_cuda_bf16_cached_decoding_matches_recomputation(query):
    model = scaled_model('cuda', query=query).to(torch.bfloat16)
    g = torch.Generator('cuda').manual_seed(0)
    prompt = torch.randint(512, (1, 8), device='cuda', generator=g)
    cached = model.generate(prompt, 40, temperature=0.0)
    assert torch.equal(cached, model.generate(prompt, 40, temperature=0.0, use_cache=False))
    # teacher-forced, so both paths see the same tokens: bf16 logits agree to 5e-2 (stated
    # tolerance)
    assert costs.cache_logit_diff(model, cached) < 5e-2


@pytest.mark.cuda
@cuda
def test_cuda_compiled_step_matches_eager_and_uses_fused_adamw():
    results = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = GPT(GPTConfig(**SMALLISH, query='identity'), verbose=False).cuda()
        opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cuda')
        assert opt.defaults['fused'] is True
        fn = torch.compile(model) if compiled else model
        g = torch.Generator('cuda').manual_seed(1)
        x = torch.randint(512, (4, 128), device='cuda', generator=g)
        for _ in range(3):
            with torch.autocast('cuda', dtype=torch.bfloat16):
                _, loss = fn(x, x)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        results.append((loss.item(), model.lm_head.weight.detach().float().clone()))
    assert results[0][0] == pytest.approx(results[1][0], rel=2e-2)
    # AdamW moves a weight by about lr a step whatever its gradient's size, so a weight whose tiny
    # gradient has the other sign in bf16 under the other kernels can differ by 2 lr a step (on
    # an H200 one weight in 65,536 did: 5.1e-3 after 3 steps); nearly all agree far closer
    steps, lr = 3, 1e-3
    diff = (results[0][1] - results[1][1]).abs()
    assert diff.max() <= 2 * steps * lr
    assert (diff > lr).float().mean() < 1e-3


@pytest.mark.cuda
@cuda
def test_cuda_resume_reproduces_the_next_losses_and_mfu_is_a_fraction(data_root, tmp_path):
    args = lambda out, **kw: [f'--{k}={v}' for k, v in {**dict(
        dataset='tiny', data_root=data_root, out_dir=out, n_layer=2, n_head=2, n_embd=64,
        block_size=64, batch_size=8, gradient_accumulation_steps=1, max_iters=12, eval_interval=6,
        eval_iters=2, log_interval=1, dropout=0.0, learning_rate=1e-3, device='cuda'),
        **kw}.items()]
    train.main(args(tmp_path / 'full'))
    train.main(args(tmp_path / 'half', max_iters=6))
    train.main(args(tmp_path / 'half', init_from='resume'))
    read = lambda d: [e for e in files.read_jsonl(tmp_path / d / 'log.jsonl') if 'loss' in e]
    full, half = read('full'), read('half')
    assert [e['iter'] for e in full] == [e['iter'] for e in half]
    for a, b in zip(full, half):
        assert a['loss'] == pytest.approx(b['loss'], rel=1e-3)
    mfus = [e['mfu'] for e in full if e['mfu'] is not None]
    assert device_peak_flops('cuda') is not None, \
        torch.cuda.get_device_name() + ' is not in PEAK_FLOPS'
    assert mfus and all(0 < m < 1 for m in mfus)


# -----------------------------------------------------------------------------
# CPU regression tests of the CUDA path

def test_every_peak_entry_maps_its_full_device_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    for name, peak in PEAK_FLOPS.items():
        monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None, name=name: name)
        assert device_peak_flops('cuda') == peak, name
    expected = {'NVIDIA L40': 181e12, 'NVIDIA L4': 121e12, 'NVIDIA H100 PCIe': 756e12,
                'NVIDIA H100 NVL': 835e12, 'NVIDIA H100 80GB HBM3': 989e12, 'NVIDIA H200': 989e12,
                'NVIDIA H200 NVL': 835e12, 'NVIDIA B200': None}
    for name, peak in expected.items():
        monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None, name=name: name)
        assert device_peak_flops('cuda') == peak, name
    assert device_peak_flops('cpu') is None


@pytest.mark.parametrize('native,expected', [(True, 'bfloat16'), (False, 'float16')])
def test_precision_asks_for_native_bf16(monkeypatch, native, expected):
    asked = []
    def is_bf16_supported(including_emulation=True):
        asked.append(including_emulation)
        return native
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', is_bf16_supported)
    assert pick_precision(None, 'cuda:0') == expected and asked == [False]
    assert pick_precision(None, 'cpu') == 'float32'
    assert pick_precision('float32', 'cuda') == 'float32'


def test_cache_is_one_tensor_per_layer_in_the_autocast_dtype():
    model = scaled_model('cpu')
    cache = KVCache(model.config, 2, 'cpu', model.cache_dtype('cpu'))
    assert len(cache.k) == len(cache.v) == 2 and cache.k[0].dtype == torch.float32
    assert cache.k[0].shape == (2, 4, 128, 32) and cache.k[0].data_ptr() != cache.k[1].data_ptr()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert model.cache_dtype('cpu') == torch.bfloat16
        seen = []
        real = KVCache.__init__
        KVCache.__init__ = lambda self, *a: seen.append(a[-1]) or real(self, *a)
        try:
            out = model.generate(torch.zeros(1, 4, dtype=torch.long), 6, temperature=0.0)
        finally:
            KVCache.__init__ = real
    assert seen == [torch.bfloat16] and out.shape == (1, 10)
    prompt = torch.randint(512, (1, 6), generator=torch.Generator().manual_seed(3))
    assert torch.equal(model.generate(prompt, 20, temperature=0.0),
                       model.generate(prompt, 20, temperature=0.0, use_cache=False))


def test_bench_sample_warms_up_both_paths_before_timing(monkeypatch):
    calls = []
    real = GPT.generate
    def generate(self, idx, n, **kw):
        calls.append((n, kw.get('use_cache', True)))
        return real(self, idx, n, **kw)
    monkeypatch.setattr(GPT, 'generate', generate)
    r = costs.main(['--mode=sample', '--n_layer=1', '--n_head=2', '--n_embd=32',
                        '--block_size=32', '--vocab_size=64', '--max_new_tokens=12',
                        '--prompt_tokens=4', '--device=cpu'])
    assert calls == [(4, True), (4, False), (12, True), (12, False)]
    assert r['max_logit_diff'] < 1e-4 and r['same_tokens']
    assert r['decoding_attention'] == 'kvgpt'


def test_bench_sample_can_decode_with_torchs_attention_kernels(monkeypatch):
    """--decoding_attention=torch times generate() with torch's kernel choice (on CUDA, cuDNN's
    too), for the GPU check to show beside generate()'s own; afterwards generate() has its own."""
    import model as model_module
    original, contexts = model_module.decoding_attention, []
    real = GPT.generate
    def generate(self, idx, n, **kw):
        contexts.append(model_module.decoding_attention('cuda'))
        return real(self, idx, n, **kw)
    monkeypatch.setattr(GPT, 'generate', generate)
    argv = ['--mode=sample', '--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=32',
            '--vocab_size=64', '--max_new_tokens=6', '--prompt_tokens=4', '--device=cpu']
    r = costs.main(argv + ['--decoding_attention=torch'])
    assert r['decoding_attention'] == 'torch' and r['same_tokens']
    assert contexts and all(isinstance(x, contextlib.nullcontext) for x in contexts)
    assert model_module.decoding_attention is original
    with pytest.raises(UserError, match='decoding_attention must be one of kvgpt, torch'):
        costs.main(argv + ['--decoding_attention=cudnn'])


@pytest.mark.long
@pytest.mark.slow
def test_gpu_check_dry_run_writes_its_results(tmp_path):
    env = dict(os.environ, DRY_RUN='1', OUT=str(tmp_path))
    r = subprocess.run(['bash', 'tools/gpu_check.sh'], cwd=HERE, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = json.loads((tmp_path / 'results.json').read_text())
    assert [t['variant'] for t in results['train']] == ['baseline', 'reduced', 'reduced_mlp',
                                                         'nonlinear']
    assert results['sample'][0]['same_tokens'] and results['run']['steps'] == 4
    md = (tmp_path / 'results.md').read_text()
    assert '| reduced | cpu | float32 | False |' in md
    assert 'KV-cache decoding' in md and 'with a resume' in md
    assert [r['variant'] for r in results['muon']] == ['baseline adamw', 'baseline muon',
                                                        'reduced adamw', 'reduced muon']
    assert re.search(r'Muon against AdamW \(reduced\): [\d.]+ against [\d.]+ ms/step', md)
    pytest_out = (tmp_path / 'pytest.txt').read_text()
    if not torch.cuda.is_available():
        assert 'needs a CUDA GPU' in pytest_out and ' skipped' in pytest_out
        assert 'failed' not in pytest_out


@pytest.mark.skipif(torch.cuda.is_available(), reason='on a CUDA machine it runs the check')
def test_gpu_check_without_a_gpu_stops_in_one_line(tmp_path):
    # it once started GPT-2 small's benchmark on the CPU
    env = {k: v for k, v in os.environ.items() if k != 'DRY_RUN'}
    out = tmp_path / 'gpu-check'
    r = subprocess.run(['bash', 'tools/gpu_check.sh'], cwd=HERE, env=dict(env, OUT=str(out)),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: torch sees no CUDA GPU here: run this on a CUDA machine, or DRY_RUN=1 for the CPU "
        "rehearsal"]
    assert not out.exists()  # nothing made: the machine is left as it was
