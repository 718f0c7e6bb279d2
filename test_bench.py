import json
import os
import subprocess
import sys

import pytest

import bench
import common
import report
import train
from common import UserError
from model import GPT, GPTConfig

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = ['--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=16', '--vocab_size=64',
        '--batch_size=2', '--device=cpu']
PLOTS = 'matplotlib draws the report plots (pip install -r requirements-dev.txt)'


def test_bench_train_reports_every_variant(capsys):
    results = bench.main(TINY + ['--steps=3', '--warmup=1',
                                 '--variants=baseline,reduced,reduced_mlp,key_identity'])
    out = capsys.readouterr().out
    assert [r['variant'] for r in results] == ['baseline', 'reduced', 'reduced_mlp', 'key_identity']
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


def test_bench_sample_compares_cache_with_recomputation(capsys):
    r = bench.main(TINY + ['--mode=sample', '--variants=reduced', '--max_new_tokens=30',
                           '--prompt_tokens=4'])
    assert r['same_tokens'] and r['new_tokens'] == 30 and r['speedup'] > 0
    assert 'speedup' in capsys.readouterr().out


@pytest.mark.slow
def test_bench_prepare_counts_every_token(monkeypatch):
    import prepare
    # the first 300 pydocs pages stand in for the corpus: the same code path, a tenth of the time
    docs = prepare.pydocs_documents()[:300]
    monkeypatch.setattr(prepare, 'pydocs_documents', lambda: docs)
    r = bench.main(['--mode=prepare', '--tokenizer=byte', '--num_proc=2', '--repeat=2'])
    assert r['documents'] == 600 and r['tokens'] == 2 * sum(len(d.encode()) + 1 for d in docs)
    assert r['prepare_tokens_per_s'] > 0 and 0 < r['fraction_of_ideal']


def test_bench_rejects_unknown_variant_and_mode():
    with pytest.raises(UserError, match="unknown variant 'tiny'"):
        bench.main(TINY + ['--variants=tiny'])
    with pytest.raises(UserError, match='mode must be'):
        bench.main(TINY + ['--mode=fly'])


def test_report_table_and_plot(data_root, tmp_path):
    pytest.importorskip('matplotlib', reason=PLOTS)
    common = ['--dataset=tiny', f'--data_root={data_root}', '--n_layer=1', '--n_head=2',
              '--n_embd=32', '--block_size=32', '--batch_size=4', '--gradient_accumulation_steps=1',
              '--max_iters=6', '--eval_interval=3', '--eval_iters=1', '--log_interval=2',
              '--device=cpu', '--compile=False']
    train.main(common + [f'--out_dir={tmp_path}/base'])
    train.main(common + [f'--out_dir={tmp_path}/red', '--query=identity'])
    png, md = tmp_path / 'plots' / 'loss.png', tmp_path / 'loss.md'
    runs = report.main([f'{tmp_path}/base', f'{tmp_path}/red', f'--png={png}', f'--md={md}'])
    assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    text = md.read_text()
    lines = text.splitlines()
    assert lines[0].startswith('| run | variant | params') and len(lines) == 4
    assert lines[2].startswith('| base | full attention') and '+0.00%' in lines[2]
    assert lines[3].startswith('| red | W_Q=I') and f"{runs[1]['params'] / 1e3:.1f}K" in lines[3]
    assert runs[0]['params'] - runs[1]['params'] == 32 * 32
    final = [float(l.split('|')[5]) for l in lines[2:]]
    # every val token, not a sample
    assert final == [round(r['evals'][-1]['val_loss_full'], 4) for r in runs]


@pytest.mark.slow
def test_report_errors_are_clear(tmp_path):
    with pytest.raises(UserError, match='no log.jsonl'):
        report.main([str(tmp_path)])
    r = subprocess.run([sys.executable, 'report.py'], cwd=HERE, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith('error: give one or more run directories')


# -----------------------------------------------------------------------------
# report.py over paired seeds, the weight-decay sweep and the diagnostics figure, on tiny logs

def fake_run(root, name, val_losses, seed, wd=0.1, diagnostics=False, **model):
    """A run directory as train.py writes it, with evaluations every 10 steps of 100 tokens."""
    import torch
    from model import GPTConfig
    out = root / name
    out.mkdir(parents=True)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=32, **model)
    torch.save(dict(model={}, model_args=cfg.__dict__), out / 'ckpt.pt')
    (out / 'config.json').write_text(json.dumps(dict(seed=seed, data_seed=seed, weight_decay=wd)))
    with open(out / 'log.jsonl', 'w') as f:
        for i, v in enumerate(val_losses):
            entry = dict(iter=10 * i, tokens=1000 * i, train_loss=v + 0.01, val_loss=v)
            if diagnostics:
                norms = dict(attn_in=1.0, attn_out=0.5, mlp_in=2.0, mlp_out=1.0, embeddings=3.0)
                entry['diagnostics'] = dict(logit_std=[0.1 * i, 0.2 * i], entropy=[1.0, 0.9],
                                            entropy_norm=[0.9, 0.8], q_rms=[1.0, 1.1],
                                            k_rms=[0.5, 0.6], weight_norm=norms)
            f.write(json.dumps(entry) + '\n')
            if i:
                step = dict(iter=10 * i, tokens=1000 * i, loss=v, lr=1e-3, tokens_per_s=5.0)
                f.write(json.dumps(step) + '\n')
    return str(out)


def test_report_aggregates_paired_seeds_and_states_the_verdict(tmp_path):
    pytest.importorskip('matplotlib', reason=PLOTS)
    base = [[3.0, 2.5, 2.0], [3.0, 2.6, 2.1], [3.0, 2.4, 1.9]]
    red = [[3.0, 2.6, 2.02], [3.0, 2.6, 2.12], [3.0, 2.4, 1.9]]
    dirs = [fake_run(tmp_path, f'base_s{s + 1}', base[s], s + 1) for s in range(3)]
    dirs += [fake_run(tmp_path, f'red_s{s + 1}', red[s], s + 1, wd=0.03125, query='identity')
             for s in range(3)]
    md_path, gap_png = tmp_path / 'agg.md', tmp_path / 'gap.png'
    report.main(dirs + [f'--md={md_path}', f'--gap_png={gap_png}'])
    gaps = [100 * (r[-1] - b[-1]) / b[-1] for r, b in zip(red, base)]  # 1%, 0.952%, 0%
    mean = sum(gaps) / 3
    sd = (sum((g - mean) ** 2 for g in gaps) / 2) ** 0.5
    half = 4.303 * sd / 3 ** 0.5  # one comparison: the 95% t interval, 2 degrees of freedom
    p = report.compare([gaps])[0]['p_t']
    rows = md_path.read_text().split('\n\n')[1].splitlines()
    assert rows[2] == "| base | 0.1 | 3 | 2.0000 +- 0.1000 | (reference) | | | |"
    assert rows[3] == (f"| red | 0.03125 | 3 | 2.0133 +- 0.1102 | {mean:+.2f}% +- {sd:.2f}% | "
                       f"[{mean - half:+.2f}%, {mean + half:+.2f}%] (95.0%) | {p:.3f} ({p:.3f}) "
                       "| could not tell |")
    runs = [report.read_run(d) for d in dirs]
    groups = report.group_runs(runs)
    assert list(groups) == ['base', 'red']
    assert report.paired_gaps(groups['base'], groups['red'], at=10) == pytest.approx(
        {1: 100 * 0.1 / 2.5, 2: 0.0, 3: 0.0})
    assert gap_png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert [b for b, _ in report.BANDS] == [0.0, 0.1, -0.1, -0.35]


@pytest.mark.parametrize('gaps,word', [([1.0, 1.1, 0.9], 'worse'), ([-0.5, -0.6, -0.4], 'better'),
                                       ([0.1, -0.1, 0.05], 'matches'),
                                       ([2.0, -1.5, 0.3], 'could not tell'),
                                       ([0.2], 'could not tell'), ([0.1, 0.1, 0.1], 'worse')])
def test_decision_rule(gaps, word):
    assert report.compare([gaps])[0]['verdict'] == word


def test_report_sweep_table_and_diagnostics_figure(tmp_path):
    pytest.importorskip('matplotlib', reason=PLOTS)
    dirs = [fake_run(tmp_path, f'{arm}_wd{wd}_s1', [3.0, v], 1, wd=wd, diagnostics=True, query=q)
            for arm, q, wd, v in [('baseline', 'linear', 0.1, 2.0),
                                  ('baseline', 'linear', 1.0, 2.2),
                                  ('reduced', 'identity', 0.1, 2.1),
                                  ('reduced', 'identity', 1.0, 1.9)]]
    runs = report.main(dirs + ['--sweep=True', f'--md={tmp_path / "s.md"}',
                               f'--png={tmp_path / "s.png"}', f'--diag_png={tmp_path / "d.png"}'])
    assert (tmp_path / 's.md').read_text().splitlines() == [
        "| weight decay | baseline | reduced |", "|---|---|---|",
        "| 0.1 | 2.0000 | 2.1000 (+5.00%) |", "| 1 | 2.2000 | 1.9000 (-13.64%) |",
        "| best | 0.1 | 1 |"]
    for png in ('s.png', 'd.png'):
        assert (tmp_path / png).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert report.main([dirs[2], '--best=True']) == dirs[2] and len(runs) == 4
    plain = fake_run(tmp_path, 'plain', [3.0, 2.0], 1)
    with pytest.raises(UserError, match='no diagnostics'):
        report.main([plain, f'--diag_png={tmp_path / "x.png"}'])


def test_bench_diagnostics_overhead_is_a_fraction():
    r = bench.main(TINY + ['--mode=diagnostics', '--steps=2', '--warmup=1', '--eval_interval=10'])
    assert r['step_ms'] > 0 and r['diagnostics_ms'] > 0 and r['eval_interval'] == 10
    expected = r['diagnostics_ms'] / (r['diagnostics_ms'] + 10 * r['step_ms'])
    assert r['overhead'] == pytest.approx(expected)


def test_every_variant_follows_the_geometry_it_is_measured_at():
    """A variant file is written against the width: at n_embd 128 baseline_small is 124 wide (31/32,
    a multiple of n_head), not GPT-2 small's 744; every variant keeps n_layer and n_head."""
    geometry = dict(bench.DEFAULTS, n_layer=4, n_head=2, n_embd=128, block_size=128, vocab_size=320)
    small = bench.variant_config('baseline_small', geometry)
    assert (small.n_embd, small.mlp_hidden) == (124, 496)
    assert GPT(small, verbose=False).get_num_params() == 794_716
    cfg = GPTConfig(**{k: geometry[k] for k in ('n_layer', 'n_head', 'n_embd')})
    for name in common.variants(dict(cfg.__dict__)):
        cfg = bench.variant_config(name, geometry)
        assert (cfg.n_layer, cfg.n_head) == (4, 2) and cfg.n_embd in (124, 128), name


def test_bench_attention_times_every_path_and_marks_the_choice(capsys):
    results = bench.main(['--mode=attention', '--n_head=2', '--n_embd=32', '--block_size=16',
                          '--batch_size=2', '--steps=2', '--warmup=1', '--device=cpu'])
    kernels = ('explicit', 'sdpa', 'sdpa_math', 'sdpa_flash')
    assert {(r['dtype'], r['kernel']) for r in results} == {
        (d, k) for d in ('float32', 'bfloat16') for k in kernels}
    assert [(r['dtype'], r['kernel']) for r in results if r['auto']] == [('float32', 'sdpa'),
                                                                         ('bfloat16', 'explicit')]
    assert all(r['ms'] > 0 for r in results)


@pytest.mark.slow
def test_bench_runs_times_the_experiments_own_command_per_dtype_and_layout(data_root, monkeypatch,
                                                                           capsys):
    import experiment_v3
    real = experiment_v3.command
    tiny = ['--dataset=tiny', '--n_layer=1', '--n_embd=32', '--block_size=32', '--batch_size=2',
            '--eval_iters=1']
    monkeypatch.setattr(experiment_v3, 'command',
                        lambda run, base, work: real(run, base, work) + tiny)
    # two concurrent jobs, as the runner starts them
    results = bench.main(['--mode=runs', '--run_steps=10', f'--data_root={data_root}',
                          '--layouts=2x1', '--dtypes=bfloat16'])
    assert [(r['dtype'], r['jobs'], r['threads']) for r in results] == [('bfloat16', 2, 1)]
    for r in results:
        assert r['step_ms'] > 0 and r['eval_final_s'] > 0 and r['startup_s'] > 0
        assert r['runs_per_hour'] == pytest.approx(r['jobs'] * 3600 / r['full_run_s'])
    assert 'runs/hour' in capsys.readouterr().out


def test_bench_train_times_each_attention_path_side_by_side(monkeypatch):
    import model
    seen = []
    real = model.attend
    monkeypatch.setattr(model, 'attend',
                        lambda *a, **kw: seen.append(model.attention_path(a[0])) or real(*a, **kw))
    results = bench.main(TINY + ['--steps=1', '--warmup=1', '--variants=reduced',
                                 '--dtype=bfloat16', '--attention=sdpa,auto'])
    assert [r['variant'] for r in results] == ['reduced [sdpa]', 'reduced [auto]']
    assert {'sdpa', 'explicit'} == set(seen)  # bf16 on a CPU: auto takes the explicit path
    assert model.attention_path.__name__ == 'attention_path'  # restored
    with pytest.raises(UserError, match='attention takes auto, sdpa and explicit'):
        bench.main(TINY + ['--attention=flash'])
