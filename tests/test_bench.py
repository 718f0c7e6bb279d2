import json
import os

import pytest
import torch

import bench
from kvgpt.config import variants
from kvgpt.errors import UserError
from lab import costs
from model import GPT, GPTConfig

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
TINY = ['--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=16', '--vocab_size=64',
        '--batch_size=2', '--device=cpu']


def test_bench_train_reports_every_variant(capsys):
    results = bench.main(TINY + ['--steps=3', '--warmup=1',
                                 '--variants=baseline,reduced,reduced_mlp,key_identity'])
    out = capsys.readouterr().out
    variants = [r['variant'] for r in results]
    assert variants == ['baseline', 'reduced', 'reduced_mlp', 'key_identity']
    base, red, mlp, _ = results
    assert base['params'] - red['params'] == 32 * 32 and mlp['params'] == base['params']
    assert red['flops_per_token'] < base['flops_per_token'] == mlp['flops_per_token']
    for r in results:
        assert r['ms_per_step'] > 0
        assert r['tokens_per_s'] == pytest.approx(32 / (r['ms_per_step'] / 1000))
        assert r['mfu'] is None and 0 < r['fraction_of_matmul'] and r['matmul_ceiling_tflops'] > 0
        assert r['state_mb'] > 0 and r['step_peak_mb'] is None
    lines = [json.loads(line[6:]) for line in out.splitlines() if line.startswith('json: ')]
    assert [l['variant'] for l in lines] == ['baseline', 'reduced', 'reduced_mlp', 'key_identity']


def test_bench_times_each_variant_under_each_optimizer():
    results = bench.main(TINY + ['--steps=2', '--warmup=1', '--variants=baseline,reduced',
                                 '--optimizers=adamw,muon'])
    assert [r['variant'] for r in results] == ['baseline adamw', 'baseline muon',
                                               'reduced adamw', 'reduced muon']
    # AdamW keeps two moments a weight, Muon one for the blocks' matrices: less state
    assert results[1]['state_mb'] < results[0]['state_mb']
    with pytest.raises(UserError, match="optimizers: 'sgd' is not one of adamw, muon"):
        bench.main(TINY + ['--optimizers=adamw,sgd'])


def test_bench_sample_compares_cache_with_recomputation(capsys):
    r = costs.main(TINY + ['--mode=sample', '--variants=reduced', '--max_new_tokens=30',
                               '--prompt_tokens=4'])
    assert r['same_tokens'] and r['new_tokens'] == 30 and r['speedup'] > 0
    assert 'speedup' in capsys.readouterr().out


@pytest.mark.slow
def test_bench_prepare_counts_every_token(monkeypatch):
    import prepare
    # 300 pydoc topic pages stand in for the corpus: the same code path without parsing the
    # standard library
    docs = tuple(prepare.pydocs_topics() * 4)[:300]
    monkeypatch.setattr(prepare, 'pydocs_documents', lambda: docs)
    r = costs.main(['--mode=prepare', '--tokenizer=byte', '--num_proc=2', '--repeat=2'])
    assert r['documents'] == 600 and r['tokens'] == 2 * sum(len(d.encode()) + 1 for d in docs)
    assert r['prepare_tokens_per_s'] > 0 and 0 < r['fraction_of_ideal']


def test_bench_rejects_unknown_variant_and_mode():
    with pytest.raises(UserError, match="unknown variant 'tiny'"):
        bench.main(TINY + ['--variants=tiny'])
    with pytest.raises(UserError, match='mode must be'):
        costs.main(TINY + ['--mode=fly'])
    with pytest.raises(UserError, match='unknown config key .mode.'):  # the trainer's bench: one
        bench.main(TINY + ['--mode=sample'])


def test_bench_diagnostics_overhead_is_a_fraction():
    r = costs.main(TINY + ['--mode=diagnostics', '--steps=2', '--warmup=1',
                               '--eval_interval=10'])
    assert r['step_ms'] > 0 and r['diagnostics_ms'] > 0 and r['eval_interval'] == 10
    expected = r['diagnostics_ms'] / (r['diagnostics_ms'] + 10 * r['step_ms'])
    assert r['overhead'] == pytest.approx(expected)


def test_every_variant_follows_the_geometry_it_is_measured_at():
    """A variant file is written against the width: at n_embd 128 baseline_small is 124 wide
    (31/32, a multiple of n_head), not GPT-2 small's 744; every variant keeps n_layer, n_head."""
    geometry = dict(bench.DEFAULTS, n_layer=4, n_head=2, n_embd=128, block_size=128,
                    vocab_size=320)
    small = bench.variant_config('baseline_small', geometry)
    assert (small.n_embd, small.mlp_hidden) == (124, 496)
    assert GPT(small, verbose=False).get_num_params() == 794_716
    cfg = GPTConfig(**{k: geometry[k] for k in ('n_layer', 'n_head', 'n_embd')})
    for name in variants(dict(cfg.__dict__)):
        cfg = bench.variant_config(name, geometry)
        assert (cfg.n_layer, cfg.n_head) == (4, 2) and cfg.n_embd in (124, 128), name


def test_bench_attention_times_every_kernel_in_both_dtypes():
    results = costs.main(['--mode=attention', '--n_head=2', '--n_embd=32', '--block_size=16',
                              '--batch_size=2', '--steps=2', '--warmup=1', '--device=cpu'])
    kernels = ('sdpa', 'sdpa_math', 'matmul', 'sdpa_flash')
    assert [(r['dtype'], r['kernel']) for r in results] == [
        (d, k) for d in ('float32', 'bfloat16') for k in kernels]
    assert all(r['ms'] > 0 for r in results)


def test_the_attention_kernels_compute_one_function():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 9, 8, dtype=torch.float64) for _ in range(3))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    outs = [costs.attention_by(kernel, q, k, v, sdpa_kernel)
            for kernel in (None, SDPBackend.MATH, 'matmul')]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=1e-10, atol=1e-10)


@pytest.mark.slow
def test_bench_runs_times_a_studys_own_command_per_dtype_and_layout(data_root, monkeypatch,
                                                                    capsys):
    from lab import plan
    real = plan.train_args
    tiny = ['--dataset=tiny', '--n_layer=1', '--n_embd=32', '--block_size=32', '--batch_size=2',
            '--eval_iters=1', '--probe=None']
    monkeypatch.setattr(plan, 'train_args', lambda *a, **kw: real(*a, **kw) + tiny)
    # two concurrent jobs, as the runner starts them
    results = costs.main(['--mode=runs', '--run_steps=10', f'--data_root={data_root}',
                              '--layouts=2x1', '--dtypes=bfloat16'])
    assert [(r['dtype'], r['jobs'], r['threads']) for r in results] == [('bfloat16', 2, 1)]
    for r in results:
        assert r['step_ms'] > 0 and r['eval_final_s'] > 0 and r['startup_s'] > 0
        assert r['runs_per_hour'] == pytest.approx(r['jobs'] * 3600 / r['full_run_s'])
    assert 'runs/hour' in capsys.readouterr().out
