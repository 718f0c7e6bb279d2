import json
import os
import subprocess
import sys

import pytest

import bench
import report
import train
from common import UserError

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = ['--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=16', '--vocab_size=64', '--batch_size=2',
        '--device=cpu']


def test_bench_train_reports_every_variant(capsys):
    results = bench.main(TINY + ['--steps=3', '--warmup=1', '--variants=baseline,reduced,reduced_mlp,key_identity'])
    out = capsys.readouterr().out
    assert [r['variant'] for r in results] == ['baseline', 'reduced', 'reduced_mlp', 'key_identity']
    base, red, mlp, _ = results
    assert base['params'] - red['params'] == 32 * 32 and mlp['params'] == base['params']
    assert red['flops_per_token'] < base['flops_per_token'] == mlp['flops_per_token']
    for r in results:
        assert r['ms_per_step'] > 0 and r['tokens_per_s'] == pytest.approx(32 / (r['ms_per_step'] / 1000))
        assert r['mfu'] is None and 0 < r['fraction_of_matmul'] and r['matmul_ceiling_tflops'] > 0
        assert r['state_mb'] > 0 and r['step_peak_mb'] is None
    lines = [json.loads(line[6:]) for line in out.splitlines() if line.startswith('json: ')]
    assert [l['variant'] for l in lines] == ['baseline', 'reduced', 'reduced_mlp', 'key_identity']


def test_bench_sample_compares_cache_with_recomputation(capsys):
    r = bench.main(TINY + ['--mode=sample', '--variants=reduced', '--max_new_tokens=30', '--prompt_tokens=4'])
    assert r['same_tokens'] and r['new_tokens'] == 30 and r['speedup'] > 0
    assert 'speedup' in capsys.readouterr().out


def test_bench_prepare_counts_every_token():
    r = bench.main(['--mode=prepare', '--tokenizer=byte', '--num_proc=1', '--repeat=1'])
    assert r['tokens'] > 2_000_000 and r['prepare_tokens_per_s'] > 0 and 0 < r['fraction_of_ideal']


def test_bench_rejects_unknown_variant_and_mode():
    with pytest.raises(UserError, match="unknown variant 'tiny'"):
        bench.main(TINY + ['--variants=tiny'])
    with pytest.raises(UserError, match='mode must be'):
        bench.main(TINY + ['--mode=fly'])


def test_report_table_and_plot(data_root, tmp_path):
    common = ['--dataset=tiny', f'--data_root={data_root}', '--n_layer=1', '--n_head=2', '--n_embd=32',
              '--block_size=32', '--batch_size=4', '--gradient_accumulation_steps=1', '--max_iters=6',
              '--eval_interval=3', '--eval_iters=1', '--log_interval=2', '--device=cpu', '--compile=False']
    train.main(common + [f'--out_dir={tmp_path}/base'])
    train.main(common + [f'--out_dir={tmp_path}/red', '--query_identity=True'])
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
    assert final == [round(r['evals'][-1]['val_loss'], 4) for r in runs]


def test_report_errors_are_clear(tmp_path):
    with pytest.raises(UserError, match='no log.jsonl'):
        report.main([str(tmp_path)])
    r = subprocess.run([sys.executable, 'report.py'], cwd=HERE, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith('error: give one or more run directories')
