"""lab/report.py: the table, the paired-seed verdict, the sweep and the figures, on real and on
tiny hand-made runs."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from kvgpt.errors import UserError
from lab import plan, report, stats
import train

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
PLOTS = 'matplotlib draws the report plots (pip install -r requirements-test.txt)'


def test_report_table_and_plot(data_root, tmp_path):
    pytest.importorskip('matplotlib', reason=PLOTS)
    common = ['--dataset=tiny', f'--data_root={data_root}', '--n_layer=1', '--n_head=2',
              '--n_embd=32', '--block_size=32', '--batch_size=4',
              '--gradient_accumulation_steps=1',
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
    r = subprocess.run([sys.executable, '-m', 'lab.report'], cwd=HERE, capture_output=True,
                       text=True)
    assert r.returncode == 2 and r.stderr.startswith('error: give one or more run directories')


def test_a_committed_runs_gzipped_log_reads_as_the_plain_one(tmp_path):
    """docs/report.md draws its figures from committed runs, whose logs are gzipped."""
    plain = fake_run(tmp_path / 'work', 'base_s1', [3.0, 2.5, 2.0], 1)
    committed = shutil.copytree(plain, tmp_path / 'experiments' / 'base_s1')
    plan.commit_log(os.path.join(plain, 'log.jsonl'), committed)
    assert 'log.jsonl' not in os.listdir(committed)
    assert report.read_run(committed) == report.read_run(plain)
    gz = committed / 'log.jsonl.gz'
    gz.write_bytes(gz.read_bytes()[:-8])  # cut short: one line, not a traceback
    with pytest.raises(UserError, match=f"{gz} is not a whole gzip file"):
        report.read_run(committed)


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
    p = stats.compare([gaps])[0]['p_t']
    sections = md_path.read_text().split('\n\n')
    # the fake runs log no full-split loss: the run table marks its finals as window losses
    assert sections[1].startswith("\\* no full-split loss yet: the fixed-window loss")
    rows = sections[2].splitlines()
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
    assert [b for b, _ in report.BANDS] == [0.0, 0.3, -0.3]


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


# -----------------------------------------------------------------------------
# the figures tell the truth: smoothing over steps, every run drawn, every line labelled

def logged_run(root, name, steps, every, seed=1, **model):
    """A run logged every `every` steps whose training loss falls from 5 to 2 linearly."""
    out = fake_run(root, name, [3.0, 2.5], seed, **model)
    with open(os.path.join(out, 'log.jsonl'), 'a') as f:
        for k in range(every, steps + 1, every):
            f.write(json.dumps(dict(iter=k, tokens=100 * k, loss=5.0 - 3.0 * k / steps)) + '\n')
    return out


def figure_of(monkeypatch, draw):
    """The matplotlib figure a report function draws, instead of its file."""
    pytest.importorskip('matplotlib', reason=PLOTS)
    drawn = []
    monkeypatch.setattr(report, 'save_figure', lambda fig, path: drawn.append(fig))
    draw()
    return drawn[0]


def test_the_train_curve_is_averaged_over_steps_not_logged_points(tmp_path):
    run = report.read_run(logged_run(tmp_path, 'r', steps=100, every=10))
    run['steps'] = [e for e in run['steps'] if e['iter'] % 10 == 0 and e['iter'] >= 10][-10:]
    tokens, curve, smooth = report.train_curve(run, 0.9)
    logged = [e['loss'] for e in run['steps']]
    assert smooth and len(curve) == 10
    # time constant 10 steps: the end follows the last few logged losses, not the first ones
    assert min(logged[-3:]) <= curve[-1] <= max(logged[-3:])
    # the old average over logged points lagged by 90 steps: far above them
    naive = logged[0]
    for v in logged[1:]:
        naive = 0.9 * naive + 0.1 * v
    assert naive > max(logged[-3:]) + 0.5
    few = dict(run, steps=run['steps'][:3])
    assert report.train_curve(few, 0.9)[1:] == ([e['loss'] for e in few['steps']], False)


def test_every_run_is_drawn_and_the_title_says_how(tmp_path, monkeypatch):
    one = fake_run(tmp_path, 'one', [3.0, 2.5], 1)  # a single logged step
    many = logged_run(tmp_path, 'many', steps=200, every=10)
    runs = [report.read_run(d) for d in (one, many)]
    fig = figure_of(monkeypatch, lambda: report.plot(runs, 'x.png', 0.9))
    train_ax = fig.axes[0]
    lines = {line.get_label().split(' ')[0]: line for line in train_ax.get_lines()}
    assert len(lines['one'].get_xdata()) == 1 and lines['one'].get_marker() == 'o'
    assert 'as logged under 10 points, else averaged over steps' in train_ax.get_title()


def test_the_gap_figure_labels_its_lines_and_counts_seeds_in_the_singular(tmp_path, monkeypatch):
    dirs = [fake_run(tmp_path, 'base_s1', [3.0, 2.5, 2.0], 1),
            fake_run(tmp_path, 'red_s1', [3.0, 2.6, 2.1], 1, query='identity')]
    groups = report.group_runs([report.read_run(d) for d in dirs])
    fig = figure_of(monkeypatch, lambda: report.plot_gaps(groups, 'x.png'))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ['red (1 seed)', 'no gap', '±0.3%: the margin of "matches"']


def test_the_variant_column_names_every_setting_that_differs(tmp_path):
    dirs = [fake_run(tmp_path, 'plain', [3.0, 2.0], 1, query='identity'),
            fake_run(tmp_path, 'modern', [3.0, 2.0], 1, query='identity', pos='rope',
                     qk_norm=True)]
    rows = report.table([report.read_run(d) for d in dirs]).splitlines()
    assert rows[2].startswith('| plain | W_Q=I, pos=learned, qk_norm=off |')
    assert rows[3].startswith('| modern | W_Q=I, pos=rope, qk_norm=on |')
    assert '| 2.0000* | 2.0000 |' in rows[2]  # no full-split loss logged: marked, and said below


def test_runs_of_different_lengths_get_a_warning_in_table_and_figure(tmp_path, monkeypatch):
    short = logged_run(tmp_path, 'short', steps=100, every=10)
    long = logged_run(tmp_path, 'long', steps=200, every=10)
    runs = [report.read_run(d) for d in (short, long)]
    for r, n in zip(runs, (100, 200)):  # the final evaluation at each run's own last step
        r['evals'][-1] = dict(r['evals'][-1], iter=n, tokens=100 * n)
    text = report.table(runs)
    assert text.startswith('warning: these runs differ in steps (100, 200); tokens (10000, 20000)')
    fig = figure_of(monkeypatch, lambda: report.plot(runs, 'x.png', 0.9))
    assert fig._suptitle.get_text().startswith('warning: these runs differ in steps')
    assert report.mismatch(runs[:1] * 2) is None


def test_the_sweep_figure_shows_weight_decay_zero(tmp_path, monkeypatch):
    dirs = [fake_run(tmp_path, f'baseline_wd{wd}_s1', [3.0, 2.0 + wd], 1, wd=wd)
            for wd in (0.0, 0.03125, 0.1)]
    runs = [report.read_run(d) for d in dirs]
    fig = figure_of(monkeypatch, lambda: report.plot_sweep(runs, 'x.png'))
    ax = fig.axes[0]
    assert ax.get_xscale() == 'symlog' and list(ax.get_lines()[0].get_xdata()) == [0.0, 0.03125,
                                                                                  0.1]
    assert ax.get_xlim()[0] < 0 < ax.get_xlim()[1]  # 0 is inside the axis, not off its edge


def test_the_zoomed_val_panel_says_what_it_leaves_off(tmp_path, monkeypatch):
    # 6 evaluations: the last two thirds (2.0 .. 1.8) set the limits, so 5.0 and 3.0 are off
    run = report.read_run(fake_run(tmp_path, 'r', [5.0, 3.0, 2.0, 1.9, 1.85, 1.8], 1))
    fig = figure_of(monkeypatch, lambda: report.plot([run], 'x.png', 0.9))
    val_ax = fig.axes[1]
    assert val_ax.get_ylim()[1] == pytest.approx(2.02)
    assert val_ax.get_title() == ('val loss (fixed windows; 2 earlier points above 2.02 off the '
                                  'chart)')
    whole = report.read_run(fake_run(tmp_path, 'w', [1.9, 2.0, 1.85], 1))  # all in view
    fig = figure_of(monkeypatch, lambda: report.plot([whole], 'x.png', 0.9))
    assert fig.axes[1].get_title() == 'val loss (fixed windows)'
