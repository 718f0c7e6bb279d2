"""The study runner (lab/study.py, lab/plan.py) and the study tables (lab/tables.py,
lab/docs.py): a study file's plan, its runs, its commits and its report, on synthetic committed
logs with known answers, on a tiny study run for real, and on the committed experiments."""
import gzip
import json
import math
import os
import shutil
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from kvgpt.files import read_jsonl
from lab import docs, plan as P, study as S
from lab.tables import spikes

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
STUDIES = os.path.join(HERE, 'lab', 'studies')
PLOTS = 'matplotlib draws the study figures (pip install -r requirements-test.txt)'


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.chdir(HERE)  # study files name their base configs from the repository root


def load(name):
    return P.load_study(os.path.join(STUDIES, f'{name}.py'))


# -----------------------------------------------------------------------------
# planning: the bracket rule, tuning over seeds, the climb, the lattice

def test_bracket_rule():
    assert P.bracket({1e-3: 2.0, 2e-3: 1.9, 4e-3: 1.8}, 2.0) == 8e-3  # best on the upper edge
    assert P.bracket({1e-3: 1.8, 2e-3: 1.9, 4e-3: 2.0}, 2.0) == 5e-4  # lower edge
    assert P.bracket({1e-3: 2.0, 2e-3: 1.8, 4e-3: 2.0}, 2.0) is None  # interior
    assert P.bracket({1e-3: 2.0, 2e-3: 1.9, 4e-3: math.inf}, 2.0) is None  # diverged: the worst
    assert P.bracket({0.0: 1.8, 2 ** -5: 1.9, 0.1: 2.0}, 10 ** 0.5) is None  # 0: wd's edge
    assert P.bracket({0.0: 2.0, 2 ** -5: 1.9, 0.1: 1.8}, 10 ** 0.5) == 0.316


def test_tuning_takes_the_mean_over_seeds_and_brackets_it():
    s = load('v3')
    results = {}
    for lr in s.arm('reduced')['grid']:  # seed 201 alone would pick 2e-3; the mean picks the top
        for seed in s.tuning['seeds']:
            results[P.Run('reduced', lr, 2 ** -5, seed).name] = 2.0 - lr * (1 if seed != 201
                                                                               else -1)
    runs, chosen = P.tune(s, 'reduced', results, {})
    assert chosen is None and runs[-1].lr == 0.008  # on the edge: 8e-3 joins, on all three seeds
    for seed in s.tuning['seeds']:
        results[P.Run('reduced', 0.008, 2 ** -5, seed).name] = math.inf  # diverged on every seed
    assert P.tune(s, 'reduced', results, {})[1] == (5.66e-3, 2 ** -5)


def test_a_kept_selection_stays_unless_another_lr_beats_it_by_the_margin():
    """v6's 16x check: each arm's 4x selection on seed 201 against one sqrt(2) step below, with
    no bracket extension; the lower LR is taken only when it is lower by more than 0.5%."""
    s = load('v6')
    arm = 'baseline_anneal16x'
    name = lambda lr: P.Run(arm, lr, 0.1, 201).name
    runs, chosen = P.tune(s, arm, {}, {})
    assert chosen is None and sorted(r.lr for r in runs) == [2e-3, 2.83e-3]
    assert {r.seed for r in runs} == {201}
    # lower by 0.4%: the selection stays, and the grid is not extended below
    runs, chosen = P.tune(s, arm, {name(2.83e-3): 1.000, name(2e-3): 0.996}, {})
    assert chosen == (2.83e-3, 0.1) and len(runs) == 2
    # lower by 0.6%: the lower LR is taken
    assert P.tune(s, arm, {name(2.83e-3): 1.000, name(2e-3): 0.994}, {})[1] == (2e-3, 0.1)
    assert P.kept({1: 1.0, 2: 0.9}, None, 0.5) == 2  # no kept value: the lowest mean


def test_v2_tunes_weight_decay_first_then_lr_at_it():
    s = load('v2')
    results = {}
    losses = {0.0: 2.0, 2 ** -5: 1.9, 0.1: 1.8, 0.316: 1.85}  # best at 0.1 once 0.316 is tried
    runs, chosen = P.tune(s, 'baseline', results, {})
    assert [r.wd for r in runs] == [0.0, 2 ** -5, 0.1] and chosen is None
    results.update({r.name: losses[r.wd] for r in runs})
    runs, chosen = P.tune(s, 'baseline', results, {})
    assert runs[-1].wd == 0.316 and chosen is None
    results[runs[-1].name] = losses[0.316]
    runs, chosen = P.tune(s, 'baseline', results, {})  # LR at wd 0.1: 2e-3 is done
    assert [(r.lr, r.wd) for r in runs[4:]] == [(1e-3, 0.1), (4e-3, 0.1)] and chosen is None
    for r, loss in zip(runs[4:], (1.9, 1.7)):
        results[r.name] = loss
    runs, chosen = P.tune(s, 'baseline', results, {})
    assert runs[-1].lr == 8e-3
    results[runs[-1].name] = math.inf
    assert P.tune(s, 'baseline', results, {})[1] == (4e-3, 0.1)


def test_a_grid_around_another_arms_selection_sits_on_the_lattice():
    s = load('v4')
    assert P.lr_grid(s, 'baseline_anneal4x', {}) is None  # waits for the 1x tuning
    for lr, grid in ((1.41e-3, (1e-3, 1.41e-3, 2e-3)), (2e-3, (1.41e-3, 2e-3, 2.83e-3)),
                     (0.000997, (7.07e-4, 1e-3, 1.41e-3))):
        assert P.lr_grid(s, 'baseline_anneal4x', {'baseline_anneal': (lr, 0.1)}) == grid
    assert P.tuning_seeds(s, 'baseline_anneal4x') == (201, 202)


def test_the_climb_goes_up_until_a_seed_diverges():
    s = load('v3')
    climb = next(p for p in s.phases if p['kind'] == 'climb')
    results = {}
    assert P.climb_lrs(s, climb, 'reduced', results) == [0.008]
    for seed in climb['seeds']:
        results[P.Run('reduced', 0.008, 2 ** -5, seed).name] = 2.0
    assert P.climb_lrs(s, climb, 'reduced', results) == [0.008, 0.0113]  # 8e-3 has every seed
    results[P.Run('reduced', 0.0113, 2 ** -5, 201).name] = math.inf
    assert P.climb_lrs(s, climb, 'reduced', results) == [0.008, 0.0113]  # a divergence ends it


def test_a_spike_is_a_rise_of_the_fixed_window_loss_or_a_non_finite_loss():
    clean = [dict(iter=k, loss=3.0 - k / 1000) for k in range(10, 300, 10)] + \
        [dict(iter=k, val_loss=3.0 - k / 1000) for k in (0, 100, 200)]
    assert spikes(clean, 24) == {}
    assert spikes(clean + [dict(iter=300, val_loss=2.9)], 24) == {300: pytest.approx(100 / 28)}
    # a hard batch moves the training loss, not the fixed windows: no spike
    assert spikes(clean + [dict(iter=310, loss=2.71 * 1.6)], 24) == {}
    assert spikes([dict(iter=20, val_loss=9.0), dict(iter=30, val_loss=2.0),
                   dict(iter=100, val_loss=2.1)], 24) == {100: pytest.approx(5.0)}  # no warmup
    assert spikes([dict(iter=30, loss=2.0), dict(iter=40, loss=math.nan)], 24) == {40: math.inf}


def test_a_study_file_declares_only_what_the_runner_reads(tmp_path):
    bad = tmp_path / 'bad.py'
    bad.write_text("name = 'x'\nbase = ('config/cpu/small.py',)\narms = dict(a=dict())\n"
                   "phases = []\nseeds = (1, 2)\n")
    with pytest.raises(P.UserError, match='unknown declaration.*seeds.*UPPERCASE'):
        P.load_study(str(bad))
    bad.write_text("name = 'x'\nbase = ('config/cpu/small.py',)\n"
                   "arms = dict(a=dict(lr=1e-3, weight_decay=0.1))\n"
                   "phases = [dict(name='t', kind='at', arms=('b',), seeds=(1,))]\n")
    with pytest.raises(P.UserError, match="unknown arms \\['b'\\]"):
        P.load_study(str(bad))
    with pytest.raises(P.UserError, match="study file 'nope.py' not found"):
        P.load_study('nope.py')


# -----------------------------------------------------------------------------
# v3 on synthetic committed logs with known answers

ONSET = dict(baseline=400, reduced=500, reduced_mlp=400, baseline_small_mlp=400)
LAG = dict(baseline=0.0, reduced=0.05, reduced_mlp=0.0, baseline_small_mlp=0.0)


def synthetic_loss(run):
    """Tuning: every arm's optimum at 2.83e-3 (interior). Test: reduced +0.5% (+0.3% at 2x), with
    seed noise of +-0.1%; reduced_mlp -0.2%; baseline_small_mlp +0.8%; bf16 +0.01%."""
    if run.seed in (201, 202, 203):
        return 2.0 + math.log2(run.lr / 2.83e-3) ** 2 * 0.01 + 0.001 * (run.seed - 201)
    base = 2.0 + 0.01 * (run.seed - 300) - 0.1 * math.log2(run.budget)
    gap = dict(baseline=0.0, reduced=(0.5 if run.budget == 1 else 0.3) + 0.1 * (run.seed % 3 - 1),
               reduced_mlp=-0.2 + 0.05 * (run.seed % 2),
               baseline_small_mlp=0.8 + 0.1 * (run.seed % 3 - 1))[run.arm]
    return base * (1 + gap / 100) * (1.0001 if run.dtype else 1)


def write_run(root, name, run):
    """A committed run whose log has the shape train.py writes; the climb's reduced run at
    1.13e-2 on seed 203 diverges, its reduced run at 5.66e-3 on seed 202 rises at step 300."""
    steps, final = round(1200 * run.budget), synthetic_loss(run)
    spiky = run.arm == 'reduced' and run.lr == 5.66e-3 and run.seed == 202
    log = []
    for k in range(0, steps + 1, 50):
        if k:
            grad = 3.0 if run.lr > 5.66e-3 and k == 500 else 1.0
            log.append(dict(iter=k, loss=final + 1.0 - k / steps, grad_norm=grad,
                            dt_ms=150.0 if not run.dtype else 120.0))
        if k % 100 == 0:
            val = final + (1.0 + LAG[run.arm]) * (steps - k) / steps + (0.3 if spiky and k == 300
                                                                        else 0.0)
            score = 0.5 if k >= ONSET[run.arm] else 0.1
            entry = dict(iter=k, val_loss=val, induction=[[0.0, score]], repeat_loss=3.0 - score)
            entry.update(val_loss_full=final) if k == steps else None
            log.append(entry)
    folder = os.path.join(root, name, run.name)
    os.makedirs(folder)
    with open(os.path.join(folder, 'config.json'), 'w') as f:
        json.dump(dict(max_iters=steps), f)
    with open(os.path.join(folder, 'log.jsonl'), 'w') as f:
        f.write(''.join(json.dumps(e) + '\n' for e in log))
    if run.arm == 'reduced' and run.lr == 0.0113 and run.seed == 203:
        with open(os.path.join(folder, 'diverged.txt'), 'w') as f:
            f.write('error: the loss became non-finite at step 140\n')


def fill(s, root, keep=lambda run: True):
    """Commit every run the study names, round after round as tuning names more; the rounds."""
    rounds = 0
    while todo := [r for r in S.pending(s, root)[0] if keep(r)]:
        for run in todo:
            write_run(root, s.name, run)
        rounds += 1
    return rounds


def test_v3_names_its_runs_and_waits_on_tuning(tmp_path):
    s, root = load('v3'), str(tmp_path)
    p = P.plan(s, {})
    assert p.waiting == list(s.arms) and len(p.phases['tuning']) == 4 * 4 * 3
    assert not p.phases['test']
    assert fill(s, root) == 4  # tuning, then what it names, as the stability phase climbs
    p = P.plan(s, P.results_of(s, root)[0])
    assert not p.waiting and len(p.phases['tuning']) == 48  # every optimum interior
    assert len(p.phases['test']) == 20 * 2 + 10 * 2
    assert len(p.phases['longer']) == 8 and len(p.phases['dtype']) == 4
    above = sorted({(r.arm, r.lr) for r in p.phases['stability']})  # up to the first divergence
    assert above == [('baseline', lr) for lr in (0.008, 0.0113, 0.016, 0.0226)] + \
        [('reduced', 0.008), ('reduced', 0.0113)]
    assert p.phases['longer'][0].name == 'baseline_lr0.00283_wd0.1_s301_b2'
    assert p.phases['dtype'][0].name == 'baseline_lr0.00283_wd0.1_s301_bfloat16'


def test_the_runner_starts_the_primary_pair_before_the_secondaries_are_tuned(tmp_path):
    s, root = load('v3'), str(tmp_path)
    primary = ('baseline', 'reduced')
    fill(s, root, lambda r: r.arm in primary and r.seed > 300 or (
        r.arm in primary and r.lr in s.arm(r.arm)['grid']))
    todo, p, _, _ = S.pending(s, root)
    assert p.waiting == ['reduced_mlp', 'baseline_small_mlp']
    assert todo[0].arm == 'reduced_mlp' and all(r.arm not in primary for r in todo[:12])


def test_report_writes_every_v3_block_with_the_known_answers(tmp_path):
    pytest.importorskip('matplotlib', reason=PLOTS)
    s, root = load('v3'), str(tmp_path / 'experiments')
    fill(s, root)
    s.docs = str(tmp_path / 'docs' / 'experiments.md')
    os.makedirs(os.path.dirname(s.docs))
    with open(os.path.join(HERE, 'docs', 'experiments.md')) as f:
        original = f.read()
    with open(s.docs, 'w') as f:
        f.write(original)
    made = docs.write_report(s, root)
    assert made['v3_tuning'].count('**selected**') == 4
    assert made['v3_tuning'].count('| bracketed |') == 4
    stability = made['v3_stability'].splitlines()
    assert stability[3] == ('| reduced | 0.03125 | 0.002, 0.00283, 0.004, 0.00566, 0.008, 0.0113 '
                            '| 0.00566: 202 spiked at 300 (+7.36%); 0.0113: 203 diverged | 0.004 '
                            '| 1.0, 1.0, 1.0, 1.0, 3.0, 3.0 |')
    assert '| reduced | 0.0113 | 2.0399 | 2.0409 | diverged |' in stability
    verdict = made['v3_verdict']
    assert '| (i) reduced − baseline | 20 | +0.50% ±' in verdict
    assert verdict.count('**worse**') == 1
    assert '| (ii) reduced_mlp − baseline | 10 | -0.17% ± 0.03% |' in verdict
    slope_row = made['v3_trajectory'].splitlines()[-3]
    assert slope_row.startswith('| slope over steps 800–1200, per 100 steps | -')
    assert '| 2× − 1× | -0.20% [' in made['v3_longer']
    assert '+100 [+100, +100] steps (n = 10)' in made['v3_induction']
    assert '| median step time (ms, every logged step of 4 runs) | 150.0 | 120.0 |' \
        in made['v3_dtype']
    assert 'descriptive: baseline 0.0226+; reduced 0.004; ' in made['v3_claims']
    for png in ('v3_stability.png', 'v3_trajectory.png', 'v3_induction.png'):
        assert (tmp_path / 'docs' / 'assets' / png).read_bytes()[:4] == b'\x89PNG'
    with open(s.docs) as f:
        written = f.read()
    assert written != original and docs.fill(original, made) == written


def test_the_primary_comparison_is_reported_while_the_secondaries_wait(tmp_path):
    s, root = load('v3'), str(tmp_path)
    fill(s, root, lambda r: r.arm in ('baseline', 'reduced'))
    made = docs.blocks(s, root)
    verdict = made['v3_verdict']
    assert '| (i) reduced − baseline | 20 | +0.50% ±' in verdict and '(ii)' not in verdict
    assert verdict.endswith('Not yet: paired seeds so far reduced_mlp − baseline 0 of 10, '
                            'reduced − baseline_small_mlp 0 of 10.\n')
    assert made['v3_claims'].count('| not yet |') == 2
    assert made['v3_induction'].endswith(
        'Not yet: reduced_mlp, baseline_small_mlp need test seeds 301–310.\n')


def test_the_v3_commands_train_each_arm_at_the_geometry_and_budget():
    s = load('v3')
    base = P.base_config(s)
    assert P.derived_model(base)['init_std'] == 0.02 * 6 ** 0.5 and base['dataset'] == 'pysource'
    assert (base['n_embd'] // base['n_head'], base['eval_interval'], base['dtype'],
            base['probe']) == (64, 100, 'float32', 'lab.probes')
    run = P.Run('baseline_small_mlp', 4e-3, 0.1, 301, budget=2.0, dtype='bfloat16')
    args = P.train_args(s, run, base, 'w')
    assert '--mlp_ratio=3.5' in args and '--max_iters=2400' in args
    assert P.derived_model(train_settings(args))['mlp_hidden'] == 448
    assert '--warmup_iters=48' in args and '--lr_decay_iters=13720' in args
    assert '--dtype=bfloat16' in args and args[-1] == '--init_from=auto'
    reduced = P.train_args(s, P.Run('reduced', 2e-3, 2 ** -5, 301), base, 'w')
    assert '--query=identity' in reduced and not any('attn_scale' in a for a in reduced)
    # the scale is model.py's for W_Q = I: the same 1/16 the committed runs recorded
    assert P.derived_model(train_settings(reduced[:-1]))['attn_scale'] == 0.0625


# -----------------------------------------------------------------------------
# commits, reuse, the runner's loop

def test_a_diverged_run_is_committed_as_infinitely_bad(tmp_path):
    work, dest = tmp_path / 'work', tmp_path / 'dest'
    work.mkdir()
    (work / 'log.jsonl').write_text(json.dumps(dict(iter=0, val_loss=5.0)) + '\n')
    (work / 'config.json').write_text(json.dumps(dict(max_iters=10)))
    error = "error: the loss became non-finite by iter 5; ...\n"
    assert P.commit_run(str(work), str(dest), error) == 'diverged'
    assert P.final_loss(str(dest)) == math.inf
    assert P.commit_run(str(work), str(tmp_path / 'other'), "interrupted\n") is None
    assert not (tmp_path / 'other').exists()


def test_a_finished_run_is_committed_with_its_log_gzipped_the_same_bytes_every_time(tmp_path):
    work = tmp_path / 'work'
    work.mkdir()
    log = b''.join(json.dumps(e).encode() + b'\n' for e in (
        dict(iter=0, val_loss=5.0), dict(iter=5, loss=4.5), dict(iter=10, val_loss_full=4.0)))
    (work / 'log.jsonl').write_bytes(log)
    (work / 'config.json').write_text(json.dumps(dict(max_iters=10)))
    made = []
    for dest in (tmp_path / 'a', tmp_path / 'b'):
        assert P.commit_run(str(work), str(dest), '') == 'finished'
        assert sorted(os.listdir(dest)) == ['config.json', 'log.jsonl.gz']
        assert P.final_loss(str(dest)) == 4.0
        made.append((dest / 'log.jsonl.gz').read_bytes())
    assert gzip.decompress(made[0]) == log  # every step line kept, byte for byte
    # the gzip header holds no file name (flags 0) and no time (0): the same log, the same bytes
    assert made[0][3:8] == bytes(5) and made[0] == made[1]


def test_a_runs_final_loss_is_its_full_val_loss_at_max_iters_and_nothing_else(tmp_path):
    line = lambda **e: json.dumps(e).encode() + b'\n'
    (tmp_path / 'config.json').write_text(json.dumps(dict(max_iters=10)))
    log = tmp_path / 'log.jsonl'
    steps = line(iter=0, val_loss=5.0, val_loss_full=5.1) + line(iter=5, loss=4.5)
    final = line(iter=10, val_loss=4.1, val_loss_full=4.0)
    for text, loss in ((steps + final, 4.0),
                       (steps + final + line(iter=10, loss=3.9), 4.0),  # lines after it
                       (steps, None),  # stopped before max_iters: its earlier one is not final
                       (steps + final[:-3], None)):  # the final one cut short by a crash
        log.write_bytes(text)
        assert P.final_loss(str(tmp_path)) == loss, text
    # an evaluation damaged before the end, met on the way back to the final one
    log.write_bytes(steps + final + final[:-3] + b'\n' + line(iter=10, loss=3.9))
    with pytest.raises(P.UserError, match=r"log.jsonl is damaged at line 4 of 5"):
        P.final_loss(str(tmp_path))


def test_collect_gzips_the_plain_logs_an_older_runner_committed(tmp_path, capsys):
    s, root = load('v3'), str(tmp_path / 'experiments')
    fill(s, root, lambda run: run.seed < 300)  # tuning's runs, as plain log.jsonl
    folders = P.run_folders(root, 'v3')
    logs = [read_jsonl(os.path.join(f, 'log.jsonl')) for f in folders]
    results, blocks = P.results_of(s, root), docs.blocks(s, root)
    S.main([s.path, f'--root={root}', f'--work_root={tmp_path}', '--collect=True'])
    assert f'compacted {len(folders)} plain log(s)' in capsys.readouterr().out
    assert all('log.jsonl' not in os.listdir(f) for f in folders)
    assert [read_jsonl(P.log_file(f)) for f in folders] == logs
    assert (P.results_of(s, root), docs.blocks(s, root)) == (results, blocks)
    S.main([s.path, f'--root={root}', f'--work_root={tmp_path}', '--collect=True'])
    assert 'compacted' not in capsys.readouterr().out  # nothing plain is left


def test_v4_reuses_v3s_runs_only_where_the_commands_agree(tmp_path):
    s = load('v4')
    results, folders = P.results_of(s, os.path.join(HERE, 'experiments'))
    p = P.plan(s, results)
    reference = [r for r in p.phases['reference']]
    assert len(reference) == 20 and all('/v3/' in folders[r.name] for r in reference)
    assert len(P.check_reused(s, p, folders, P.base_config(s), 'experiments')) == 20
    # a reused run made with other settings is refused
    run = reference[0]
    copy = tmp_path / 'v3' / run.name
    copy.mkdir(parents=True)
    saved = json.loads(open(os.path.join(folders[run.name], 'config.json')).read())
    (copy / 'config.json').write_text(json.dumps(dict(saved, batch_size=8)))
    with pytest.raises(P.UserError, match=f"{run.name} is reused by v4 but was run with other "
                                          "settings \\(batch_size\\)"):
        P.check_reused(s, p, dict(folders, **{run.name: str(copy)}), P.base_config(s),
                       'experiments')


def test_a_cosine_horizon_left_to_max_iters_matches_one_written_out():
    """config/cpu/small.py now leaves lr_decay_iters None; a run committed when it said 1200 beside
    max_iters 1200 was the same run, and one whose horizon was elsewhere was not."""
    import train
    saved = P.comparable(dict(train.DEFAULTS, max_iters=1200, lr_decay_iters=1200))
    assert P.comparable(dict(train.DEFAULTS, max_iters=1200, lr_decay_iters=None)) == saved
    assert P.comparable(dict(train.DEFAULTS, max_iters=4800, lr_decay_iters=None)) != \
        P.comparable(dict(train.DEFAULTS, max_iters=4800, lr_decay_iters=1200))


@pytest.mark.parametrize('study,run', [
    ('v5', P.Run('identity_mlp_anneal_wd0.1', 4e-3, 0.1, 301)),
    ('v6', P.Run('query16_anneal4x_wd0.1', 2.83e-3, 0.1, 301))])
def test_a_committed_run_that_wrote_out_derived_values_matches_todays_choices(study, run):
    """Committed runs hold the scale, MLP width, query rank and init std as numbers their config
    files computed; today's commands state choices (attn_scale_factor, mlp_ratio, query_ratio,
    init_width). Compared as derived they agree, and another choice does not."""
    s = load(study)
    folder = os.path.join(HERE, 'experiments', study, run.name)
    saved = P.comparable(json.loads(open(os.path.join(folder, 'config.json')).read()))
    args = P.train_args(s, run, P.base_config(s), 'w')
    made = P.comparable(train_settings(args))
    derived = ('attn_scale', 'mlp_hidden', 'query_rank', 'init_std')
    assert [saved[k] for k in derived] == [made[k] for k in derived]
    assert not set(P.DERIVED_FROM) & set(made)
    other = P.comparable(train_settings(args + ['--attn_scale_factor=0.5']))
    assert other['attn_scale'] != saved['attn_scale']


def test_the_runner_plans_again_only_when_a_run_ends(monkeypatch, capsys):
    """The plan reads every committed log, so polling the running jobs must not redo it: once at
    the start, then once after each poll at which runs ended, however many polls a run lasts."""
    runs = [P.Run('baseline', 2e-3, 0.1, seed) for seed in (1, 2, 3)]
    done, plans = set(), []

    def pending(s, root):
        plans.append(sorted(r.seed for r in done))
        p = P.Plan({'test': runs}, {}, [], {r.name: {} for r in runs})
        return [r for r in runs if r not in done], p, {}, {}

    class Proc:  # a job that reports itself finished on its fifth poll
        def __init__(self):
            self.polls = 0

        def poll(self):
            self.polls += 1
            return 0 if self.polls >= 5 else None
    monkeypatch.setattr(S, 'pending', pending)
    monkeypatch.setattr(S, 'check_reused', lambda *a: set())
    monkeypatch.setattr(S, 'start', lambda run, c, s, base, logging, init: Proc())
    monkeypatch.setattr(S, 'finish', lambda run, c, s: done.add(run) or 'finished')
    monkeypatch.setattr(S.time, 'sleep', lambda seconds: None)
    monkeypatch.setattr(S, 'base_config', lambda s: {})
    monkeypatch.setattr(S, 'uncarry', lambda c, s: None)  # nothing carried
    S.run_all(dict(root='unused', jobs=2), None)
    # two jobs at a time: seeds 1 and 2 end on the same poll, then seed 3 on its own
    assert plans == [[], [1, 2], [1, 2, 3]]
    assert capsys.readouterr().out == "nothing left to run\n"


# -----------------------------------------------------------------------------
# a new study, run for real: by the runner, and by its --print lines as a shell script

def tiny_study(tmp_path, data_root, endless=False):
    (tmp_path / 'tiny.py').write_text('\n'.join([
        "dataset = 'tiny'", f"data_root = {data_root!r}", "n_layer = 1", "n_head = 2",
        "n_embd = 32", "block_size = 32", "batch_size = 2", "eval_iters = 1",
        f"max_iters = {10 ** 6 if endless else 4}", "lr_decay_iters = 4", "warmup_iters = 1",
        f"eval_interval = {10 ** 6 if endless else 2}", "log_interval = 1", ""]))
    (tmp_path / 'study.py').write_text(f'''"""A tiny study: reduced against the baseline."""
name = 'tiny'
docs = {str(tmp_path / 'tiny.md')!r}
base = ('config/cpu/small.py', {str(tmp_path / 'tiny.py')!r})
arms = dict(baseline=dict(weight_decay=0.1, lr=2e-3), reduced=dict(weight_decay=2 ** -5, lr=2e-3))
phases = [dict(name='test', kind='at', arms=('baseline', 'reduced'), seeds=(1, 2))]
PAIR = [dict(label='(a)', arm='reduced', ref='baseline', seeds=(1, 2), family='one')]
tables = dict(tiny_verdict=dict(kind='verdicts', comparisons=PAIR, explain='Two seeds.'))
''')
    (tmp_path / 'tiny.md').write_text("# Tiny\n\n<!-- generated: tiny_verdict -->\n<!-- end -->\n")
    return str(tmp_path / 'study.py')


FIXED = "arms = dict(a=dict(weight_decay=0.1, lr=1e-3))\n"
AT = "phases = [dict(name='t', kind='at', arms=('a',), seeds=(1,))]\n"


@pytest.mark.parametrize('body, words', [
    ("arms = dict(a=dict(lr=1e-3))\n" + AT, "arm a has no weight_decay: fix it"),
    ("arms = dict(a=dict(weight_decay=0.1))\n" + AT,
     "phase 't': arm a has neither lr nor grid"),
    (FIXED + "phases = [dict(name='t', kind='at', arms=('a',), seeds=1)]\n",
     r"phase 't': seeds must be a tuple of integers \(seeds=\(301, 302\)\), got 1$"),
    (FIXED + "phases = [dict(name='t', kind='at', arms=('a',))]\n", "seeds .* got None$"),
    ("arms = dict(a=dict(weight_decay=0.1, grid=(1e-3, 2e-3)))\n" + AT,
     "arm a tunes its LR over a grid, on no seeds: declare tuning=dict"),
    ("arms = dict(a=dict(grid=(1e-3, 2e-3)))\ntuning = dict(seeds=(1,))\n" + AT,
     "arm a has no weight_decay"),
    ("arms = dict(a=dict(weight_decay=0.1, lr=1e-3, settings=dict(max_iter=20)))\n" + AT,
     r"arm a: unknown train.py setting 'max_iter' \(did you mean 'max_iters'\?\)$"),
    (FIXED + "phases = [dict(name='t', kind='at', arms=('a',), seeds=(1,), "
     "settings=dict(eval_interal=5))]\n", "phase 't': unknown train.py setting 'eval_interal'"),
    ("arms = dict(a=dict(grid=(1e-3,)))\ntuning = dict(seeds=(1,))\n"
     "phases = [dict(name='c', kind='climb', arms=('a',), seeds=(1,), above=1e-3, steps=2)]\n",
     "arm a has no weight_decay"),
    ("arms = dict(a=dict(weight_decay=0.1))\n"
     "phases = [dict(name='c', kind='climb', arms=('a',), seeds=(1,))]\n",
     r"phase 'c': a climb names the LR it starts above and its number of steps"),
])
def test_a_study_files_mistakes_are_one_line_when_it_loads(tmp_path, body, words):
    # each once ended in a traceback, planned nothing, or failed only when train.py started
    bad = tmp_path / 'bad.py'
    bad.write_text("name = 'x'\nbase = ('config/cpu/small.py',)\n" + body)
    with pytest.raises(P.UserError, match=f"^{re.escape(str(bad))}: .*{words}"):
        P.load_study(str(bad))


def test_a_misspelt_reuse_a_table_given_wrong_parameters_and_no_docs_are_one_line(tmp_path):
    study = tmp_path / 's.py'
    study.write_text("name = 'x'\nbase = ('config/cpu/small.py',)\n" + FIXED + AT
                     + "reuse = ('v44',)\ntables = dict(t=dict(kind='verdicts', comparison=[]))\n")
    s, root = P.load_study(str(study)), str(tmp_path / 'experiments')
    with pytest.raises(P.UserError, match=f"reuse names 'v44', but {root}/v44/ does not exist"):
        S.main([str(study), f'--root={root}', '--status=True'])
    with pytest.raises(P.UserError, match=r"table t of kind 'verdicts': missing a required "
                                          r"argument: 'comparisons' \(its parameters: "
                                          r"comparisons"):
        docs.blocks(s, root)
    with pytest.raises(P.UserError, match=f"^{re.escape(str(study))} declares no docs"):
        docs.write_report(s, root)


def test_the_docs_example_study_loads_plans_its_runs_and_fills_its_block(tmp_path):
    text = open(os.path.join(HERE, 'docs', 'experiments.md')).read()
    section = text.split('### A study of your own')[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    begin, end = re.search(r"a line `(<!-- generated: \w+ -->)`\nand, on the next, "
                           r"`(<!-- end -->)`", section).groups()
    block = f"{begin}\n{end}\n"
    mine = repr(str(tmp_path / 'mine.md'))
    (tmp_path / 'mine.py').write_text(code.replace("'docs/mine.md'", mine))
    (tmp_path / 'mine.md').write_text(block)
    s = P.load_study(str(tmp_path / 'mine.py'))
    runs = P.plan(s, {}).phases['test']
    assert [r.name for r in runs] == [f'{arm}_lr0.002_wd{wd:g}_s{seed}' for seed in (1, 2, 3)
                                      for arm, wd in (('baseline', 0.1), ('reduced', 2 ** -5))]
    made = docs.write_report(s, str(tmp_path / 'experiments'))
    assert made == {'mine_verdict': 'Not yet: paired seeds so far reduced − baseline 0 of 3.\n'}
    assert made['mine_verdict'] in (tmp_path / 'mine.md').read_text()


@pytest.mark.slow
def test_a_run_that_fails_makes_the_runner_fail_in_one_line(data_root, tmp_path, capsys):
    path = tiny_study(tmp_path, str(tmp_path / 'no_data'))  # train.py: no prepared dataset
    with pytest.raises(P.UserError, match=r"^4 run\(s\) failed, \S+_s1 first "
                                          r"\(its error is above, and in .*/stderr.txt\): fix"):
        S.main([path, f'--root={tmp_path / "e"}', f'--work_root={tmp_path / "w"}', '--jobs=2',
                '--threads=1', '--print=False'])
    assert 'error: no prepared dataset' in capsys.readouterr().out


@pytest.mark.slow
def test_a_new_study_file_runs_commits_and_reports_and_its_print_lines_do_the_same(
        data_root, tmp_path, capsys):
    path = tiny_study(tmp_path, data_root)
    root, work = str(tmp_path / 'experiments'), str(tmp_path / 'work')
    S.main([path, f'--root={root}', f'--work_root={work}', '--jobs=2', '--threads=1'])
    assert 'nothing left to run' in capsys.readouterr().out
    assert sorted(os.listdir(os.path.join(root, 'tiny'))) == [
        f'{arm}_lr0.002_wd{wd:g}_s{seed}' for arm, wd in (('baseline', 0.1), ('reduced', 2 ** -5))
        for seed in (1, 2)]
    made = S.main([path, f'--root={root}', '--report=True'])[0]
    assert capsys.readouterr().out.startswith('wrote 1 block of tiny into ')
    finals = {}
    for run in os.listdir(os.path.join(root, 'tiny')):
        log = read_jsonl(os.path.join(root, 'tiny', run, 'log.jsonl.gz'))
        finals[run] = next(e['val_loss_full'] for e in log if 'val_loss_full' in e)
    ref = lambda s: finals[f'baseline_lr0.002_wd0.1_s{s}']
    gaps = [100 * (finals[f'reduced_lr0.002_wd0.03125_s{s}'] - ref(s)) / ref(s) for s in (1, 2)]
    row = next(line for line in made['tiny_verdict'].splitlines() if line.startswith('| (a)'))
    assert row.startswith(f"| (a) reduced − baseline | 2 | {sum(gaps) / 2:+.2f}% ± ")
    assert made['tiny_verdict'].endswith('Two seeds.\n')
    assert made['tiny_verdict'] in open(tmp_path / 'tiny.md').read()
    # the same study by its printed lines, as a scheduler would run them: seed 1 is committed
    # there already, so they name seed 2's runs only
    other, other_work = str(tmp_path / 'again'), str(tmp_path / 'work2')
    for run in ('baseline_lr0.002_wd0.1_s1', 'reduced_lr0.002_wd0.03125_s1'):
        shutil.copytree(os.path.join(root, 'tiny', run), os.path.join(other, 'tiny', run))
    lines = S.main([path, f'--root={other}', f'--work_root={other_work}', '--print=True',
                    '--threads=1'])[0]
    script = capsys.readouterr().out
    assert len(lines) == len(script.splitlines()) == 2 and {r.seed for r in lines} == {2}
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH'])
    halves = ['\n'.join(script.splitlines()[i::2]) for i in (0, 1)]  # two shells, as two nodes
    shells = [subprocess.Popen(['bash', '-e', '-c', half], cwd=HERE, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE) for half in halves]
    for shell in shells:
        _, err = shell.communicate(timeout=600)
        assert shell.returncode == 0, err[-2000:]
    S.main([path, f'--root={other}', f'--work_root={other_work}', '--collect=True'])
    assert 'collected 2 run(s)' in capsys.readouterr().out
    again = docs.blocks(P.load_study(path), other)
    assert again == made  # the same runs, the same table
    assert S.main([path, f'--root={other}', '--print=True'])[0] == []


@pytest.mark.slow
def test_a_signal_stops_the_runner_and_its_runs_save_their_checkpoints(data_root, tmp_path,
                                                                       monkeypatch, capsys):
    path = tiny_study(tmp_path, data_root, endless=True)
    root, work = str(tmp_path / 'experiments'), tmp_path / 'work'
    real_start = S.start

    def signal_once_training(run_dir):
        deadline, log = time.time() + 120, os.path.join(run_dir, 'log.jsonl')
        while time.time() < deadline and not (os.path.exists(log) and 'loss' in open(log).read()):
            time.sleep(0.1)  # train.py has set its own handlers by its first logged step
        os.kill(os.getpid(), signal.SIGTERM)

    def start_then_signal(run, c, s, base, logging, init):
        proc = real_start(run, c, s, base, logging, init)
        if run.seed == 1 and run.arm == 'baseline':
            threading.Thread(target=signal_once_training, args=(S.work_dir(c, s, run),),
                             daemon=True).start()
        return proc
    monkeypatch.setattr(S, 'start', start_then_signal)
    before = signal.getsignal(signal.SIGTERM)
    S.main([path, f'--root={root}', f'--work_root={work}', '--threads=1'])
    assert 'stopped by a signal: 1 run(s) saved their checkpoints' in capsys.readouterr().out
    run_dir = work / 'out-tiny' / 'baseline_lr0.002_wd0.1_s1'
    assert (run_dir / 'ckpt.pt').exists() and not os.path.exists(root)  # saved, not committed
    assert signal.getsignal(signal.SIGTERM) is before  # the runner gave the handler back
    # carried to another machine: the checkpoint, config and log go into the committed tree...
    S.main([path, f'--root={root}', f'--work_root={work}', '--carry=True'])
    assert capsys.readouterr().out.startswith(f"carried 1 run(s) into {root}/tiny/carry/ (")
    carried = os.path.join(root, 'tiny', 'carry', 'baseline_lr0.002_wd0.1_s1')
    assert sorted(os.listdir(carried)) == ['ckpt.pt', 'config.json', 'log.jsonl.gz']
    assert P.run_folders(root, 'tiny') == [] and P.results_of(P.load_study(path), root) == ({}, {})
    # ...and a runner on a machine without the work folder resumes from them, byte for byte
    saved = {f: (run_dir / f).read_bytes() for f in ('ckpt.pt', 'config.json', 'log.jsonl')}
    other = tmp_path / 'other'
    line = S.main([path, f'--root={root}', f'--work_root={other}', '--print=True'])[0][0]
    resumed = other / 'out-tiny' / 'baseline_lr0.002_wd0.1_s1'
    assert line.name == 'baseline_lr0.002_wd0.1_s1' and 'carried in' in capsys.readouterr().out
    assert {f: (resumed / f).read_bytes() for f in saved} == saved
    (resumed / 'ckpt.pt').write_bytes(b'further along')  # a machine's own state is never replaced
    S.main([path, f'--root={root}', f'--work_root={other}', '--print=True'])
    assert (resumed / 'ckpt.pt').read_bytes() == b'further along'
    capsys.readouterr()
    # a run with nothing to resume from is carried no more, and an empty carry folder goes
    shutil.rmtree(run_dir)
    S.main([path, f'--root={root}', f'--work_root={work}', '--carry=True'])
    assert capsys.readouterr().out == "nothing to carry: no run of tiny is stopped part-way in " \
        "the work folders\n"
    assert not os.path.exists(os.path.join(root, 'tiny', 'carry'))


def test_carry_takes_what_the_unfinished_runs_resume_from(tmp_path):
    """v7 with its checks committed (seed 201's runs) and seed 301's 2x branch: seed 301's stable
    runs, stopped, carry their checkpoints; seed 302's baseline carries the checkpoint its
    unstarted 2x branch starts from, and none of a run committed already (seed 301's 2x branch
    left its work folder behind)."""
    s, work, root = load('v7'), tmp_path / 'work', tmp_path / 'experiments'
    for run in P.run_folders(os.path.join(HERE, 'experiments'), 'v7'):
        if run.endswith('_s201') or '_s201_' in run or run.endswith('wd0.1_s301_i2400'):
            shutil.copytree(run, root / 'v7' / os.path.basename(run))
    stable = 'baseline_wsd_lr0.00283_wd0.1_s{}_i38400'
    for name, files in ((stable.format(301), ('ckpt.pt', 'config.json', 'log.jsonl')),
                        (stable.format(302), ('ckpt.pt', 'ckpt_1920.pt', 'log.jsonl')),
                        ('baseline_wsd_lr0.00283_wd0.1_s301_i2400', ('ckpt.pt', 'log.jsonl'))):
        (work / 'out-v7' / name).mkdir(parents=True)
        for f in files:
            (work / 'out-v7' / name / f).write_text(f)
    c = dict(root=str(root), work_root=str(work))
    assert S.carried_files(c, s) == {stable.format(301): ['ckpt.pt', 'config.json', 'log.jsonl'],
                                     stable.format(302): ['ckpt.pt', 'ckpt_1920.pt',
                                                          'config.json', 'log.jsonl']}


@pytest.mark.slow
def test_a_reader_that_stops_early_is_not_an_error():
    """`python -m lab.study lab/studies/v3.py --status=True | head -3`: a closed pipe ends the
    script quietly (141, as a shell's SIGPIPE)."""
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first line
    r = subprocess.run([sys.executable, '-m', 'lab.study', 'lab/studies/v3.py', '--status=True'],
                       cwd=HERE, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write)
    assert (r.returncode, r.stderr) == (141, '')


# -----------------------------------------------------------------------------
# the committed experiments: every generated block, and every study's figures, byte for byte

ALL = sorted(f[:-3] for f in os.listdir(STUDIES) if f.endswith('.py'))
EXPERIMENTS = os.path.join(HERE, 'experiments')


def stale_experiments_docs(studies=STUDIES, root=EXPERIMENTS):
    """docs/experiments.md's generated blocks against what the studies in `studies` that write
    there make of the committed logs under root: (blocks missing or extra, whether any is stale).
    A study of a user's own writes its own docs file and is left out."""
    with open(os.path.join(HERE, 'docs', 'experiments.md')) as f:
        text = f.read()
    made = {}
    for name in sorted(f[:-3] for f in os.listdir(studies) if f.endswith('.py')):
        s = P.load_study(os.path.join(studies, f'{name}.py'))
        if s.docs == 'docs/experiments.md':
            made.update(docs.blocks(s, root))
    found = sorted(m.group(2) for m in docs.BLOCK.finditer(text))
    return sorted(set(found) ^ set(made)), docs.fill(text, made) != text


def misplaced_runs(studies=STUDIES, root=EXPERIMENTS):
    """The folders under root that are no study's, and the committed runs that hold more or less
    than their config.json and gzipped log."""
    named = {P.load_study(os.path.join(studies, f)).name: f[:-3]
             for f in os.listdir(studies) if f.endswith('.py')}  # {its folder: its study file}
    problems = [f"{name}: no study in {studies} names it"
                for name in sorted(set(os.listdir(root)) - set(named))]
    for name, study in named.items():
        for folder in P.run_folders(root, name):
            if set(os.listdir(folder)) - {'diverged.txt'} != {'config.json', 'log.jsonl.gz'}:
                problems.append(f"{folder}: run python -m lab.study lab/studies/{study}.py "
                                "--collect=True")
    return problems


def test_docs_blocks_match_the_committed_logs():
    """Every generated block of docs/experiments.md is what its study's committed logs give."""
    differ, stale = stale_experiments_docs()
    assert not differ and not stale, \
        "docs/experiments.md is stale: run python -m lab.study lab/studies/*.py --report=True"


def test_each_committed_run_holds_its_config_and_one_gzipped_log():
    """The logs stay out of the way of a reader of the tree: a plain log.jsonl (a runner from
    before the compact logs committed it) is gzipped by --collect=True."""
    assert misplaced_runs() == []


def test_a_study_of_your_own_made_as_the_docs_say_leaves_these_checks_passing(tmp_path):
    """docs/experiments.md's recipe, followed: its study file in lab/studies/, its docs file,
    and its runs committed under experiments/mine/ (one stands in for the six)."""
    text = open(os.path.join(HERE, 'docs', 'experiments.md')).read()
    recipe = text.split('### A study of your own', 1)[1].split('```python\n', 1)[1]
    recipe = recipe.split('```', 1)[0]
    assert '`lab/studies/mine.py`' in text and 'python -m lab.study lab/studies/mine.py' in text
    studies, root = tmp_path / 'lab' / 'studies', tmp_path / 'experiments'
    shutil.copytree(STUDIES, studies)
    (studies / 'mine.py').write_text(recipe)
    root.mkdir()
    for name in os.listdir(EXPERIMENTS):
        os.symlink(os.path.join(EXPERIMENTS, name), root / name)
    run = root / 'mine' / 'baseline_lr0.002_wd0.1_s1'
    shutil.copytree(next(iter(P.run_folders(EXPERIMENTS, 'v5'))), run)
    assert misplaced_runs(str(studies), str(root)) == []
    assert stale_experiments_docs(str(studies), str(root)) == ([], False)
    assert not [f for f in os.listdir(HERE) if f == 'mine.py']  # nothing at the root


@pytest.mark.slow  # seconds of matplotlib each
@pytest.mark.parametrize('name', ['v2', 'v3', 'v4', 'v5', 'v6', 'v7', 'v8'])
def test_the_figures_regenerate_byte_for_byte(name, tmp_path):
    """Each study's figures, from its committed runs."""
    pytest.importorskip('matplotlib', reason=PLOTS)
    import matplotlib
    s = load(name)
    drawn = docs.write_figures(s, os.path.join(HERE, 'experiments'), str(tmp_path))
    assets = os.path.join(HERE, 'docs', 'assets')
    present = [png for png in s.figures if os.path.exists(os.path.join(assets, png))]
    # v4 drew some figures only while its runs were kept
    assert sorted(drawn) == sorted(s.figures if name != 'v4' else present)
    for png in drawn:
        committed = open(os.path.join(HERE, 'docs', 'assets', png), 'rb').read()
        made = (tmp_path / png).read_bytes()
        assert f'Matplotlib version{matplotlib.__version__}'.encode() in committed, \
            "the committed figures were drawn by another matplotlib: requirements-test.txt pins it"
        assert made == committed, png


# -----------------------------------------------------------------------------
# v2 and the pilot on synthetic committed logs with known answers

DIAG = dict(logit_std=[0.1], entropy=[1.0], entropy_norm=[0.5], q_rms=[1.0], k_rms=[0.2],
            weight_norm=dict(attn_in=1.0, attn_out=1.0, mlp_in=1.0, mlp_out=1.0, embeddings=1.0))


def v2_loss(run):
    """Known answers: reduced is 0.5% + 0.1% per doubling of tokens behind, plus 0.2% at the wide
    init; reduced_mlp within 0.05% of the baseline; nonlinear 1% ahead, with seed noise; tuning
    optimum interior (nonlinear's, 2.6e-3, is found only by the finer grid)."""
    if run.seed == 100:
        best_lr = 2.6e-3 if run.arm == 'nonlinear' else 2e-3
        return 2.0 + (math.log2(run.lr / best_lr)) ** 2 * 0.01 + abs(run.wd - 2 ** -5)
    base = 2.0 + 0.01 * (run.seed - 100) - 0.1 * math.log2(run.budget)
    gap = dict(baseline=0.0,
               reduced=0.5 + 0.1 * math.log2(run.budget) + (0.2 if run.init_std else 0.0),
               reduced_mlp=0.05 * (-1) ** run.seed, nonlinear=-1.0 + 0.1 * (run.seed % 3))[run.arm]
    return base * (1 + gap / 100)


def committed_v2(root, name, run, loss):
    folder = os.path.join(root, name, run.name)
    os.makedirs(folder)
    with open(os.path.join(folder, 'config.json'), 'w') as f:
        json.dump(dict(max_iters=10, seed=run.seed, weight_decay=run.wd,
                       model_args=dict(n_layer=1, n_embd=32, n_head=2)), f)
    with open(os.path.join(folder, 'log.jsonl'), 'w') as f:
        f.write(json.dumps(dict(iter=10, tokens=100, val_loss=loss, val_loss_full=loss,
                                diagnostics=DIAG)) + '\n')


def test_report_writes_every_v2_block_and_figure_with_the_known_answers(tmp_path):
    pytest.importorskip('matplotlib', reason=PLOTS)
    s, root = load('v2'), str(tmp_path / 'experiments')
    while todo := S.pending(s, root)[0]:
        for run in todo:
            committed_v2(root, s.name, run, v2_loss(run))
    made = docs.blocks(s, root)
    selected = [line for line in made['tuning'].splitlines() if 'selected' in line]
    assert [line.split(' | ')[1:3] for line in selected] == [['0.002', '0.03125']] * 4
    assert made['tuning'].count('| bracketed |') == 4
    verdicts = [line.rsplit('|', 2)[1].strip() for line in made['verdict'].splitlines()[3:6]]
    # gap sds 0, 0.0548 and 0.0894 over 6 seeds: 80% power at 0.05/3, exact (noncentral t)
    assert made['verdict'].endswith("(n = 6, at the level 0.05/3): reduced 0.00%; "
                                    "reduced_mlp 0.10%; nonlinear 0.17%.\n")
    assert verdicts == ['**worse**', '**matches**', '**better**']
    assert '| slope per doubling of tokens | +0.10% [+0.10%, +0.10%] |' in made['trend']
    assert ('| difference | | +0.20% [+0.20%, +0.20%]: **depends on the init geometry** |'
            in made['geometry'])
    refine = made['refine'].splitlines()
    assert refine[2] == ('| baseline | 0.03125 | 0.00141: 2.0025, 0.002: 2.0000, 0.00283: 2.0025 '
                         '| 0.002 | +0.00% | (reference) |')
    assert refine[5].startswith('| nonlinear | 0.03125 | 0.00141: 2.0078, 0.002: 2.0014, '
                                '0.00283: 2.0001 | 0.00283 | -0.06% | +0.07% → +0.01% |')
    assert made['refine'].endswith('**grid-sensitive**: nonlinear.\n')
    assert 'assets/diagnostics.png' in made['diagnostics']
    assert sorted(docs.write_figures(s, root, str(tmp_path))) == sorted(s.figures)


def test_v2s_arms_come_from_their_config_files_at_its_geometry():
    s = load('v2')
    base = P.base_config(s)
    run = P.Run('reduced_mlp', 4e-3, 0.1, 101, budget=0.25, init_std=0.049)
    assert run.name == 'reduced_mlp_lr0.004_wd0.1_s101_b0.25_std0.049'
    args = P.train_args(s, run, base, 'out-x/r')
    assert sorted(args[2:4]) == ['--mlp_ratio=4.5', '--query=identity']
    assert P.derived_model(train_settings(args))['attn_scale'] == 0.0625
    c = train_settings(args)
    pick = lambda *keys: tuple(c[k] for k in keys)
    assert pick('max_iters', 'warmup_iters', 'lr_decay_iters') == (300, 6, 1715)  # same shape
    assert P.derived_model(c)['mlp_hidden'] == 576
    assert pick('learning_rate', 'min_lr', 'weight_decay') == (4e-3, 4e-4, 0.1)
    assert pick('seed', 'data_seed', 'init_std', 'n_head') == (101, 101, 0.049, 2)
    nonlinear = P.train_args(s, P.Run('nonlinear', 4e-3, 0.1, 101), base, 'w')
    assert sorted(nonlinear[2:5]) == ['--attn_scale_factor=0.5', '--query=nonlinear',
                                      '--query_mix=1.0']
    assert P.derived_model(train_settings(nonlinear))['attn_scale'] == 0.0625


def train_settings(args):
    import train
    return train.settings(args)


def test_the_pilots_table_pairs_each_arm_with_its_modern_block(tmp_path):
    s, root = load('modern_pilot'), tmp_path / 'experiments'
    assert docs.blocks(s, str(root))['modern_pilot'] == "Not yet: no pilot run is committed.\n"
    for name, loss in (('baseline_s1', 2.0), ('baseline_modern_s1', 1.98), ('reduced_s1', 2.1),
                       ('reduced_modern_s1', 2.121)):
        folder = root / 'modern_pilot' / name
        folder.mkdir(parents=True)
        (folder / 'config.json').write_text(json.dumps(dict(max_iters=600)))
        line = json.dumps(dict(iter=600, val_loss=loss, val_loss_full=loss))
        (folder / 'log.jsonl').write_text(line + '\n')
    rows = docs.blocks(s, str(root))['modern_pilot'].splitlines()
    assert rows[2:] == ['| baseline | 1 | 2.0000 | 1.9800 | -1.00% |',
                        '| reduced | 1 | 2.1000 | 2.1210 | +1.00% |']
    assert P.plan(s, {}).phases == {}  # its runs were made by hand: it names none


# -----------------------------------------------------------------------------
# warmup-stable-decay studies (v7): a stable run per seed and arm, cooldown branches off it

def test_a_wsd_phase_names_each_stable_run_its_branches_and_the_checkpoints_they_start_from():
    s = load('v7')
    results = {}
    for arm in ('baseline_wsd', 'identity_wsd_wd0.1'):  # the LR check done: 2.83e-3 kept
        for lr in (2e-3, 2.83e-3, 4e-3):
            results[P.Run(arm, lr, 0.1, 201).name] = 1.0 + abs(lr - 2.83e-3)
    p = P.plan(s, results)
    seed_301 = [r for r in p.phases['test'] if r.seed == 301]
    stable = P.Run('baseline_wsd', 2.83e-3, 0.1, 301, steps=38400)
    assert stable.name == 'baseline_wsd_lr0.00283_wd0.1_s301_i38400'
    assert [r.name for r in seed_301 if r.arm == 'baseline_wsd'] == [
        'baseline_wsd_lr0.00283_wd0.1_s301_i38400', 'baseline_wsd_lr0.00283_wd0.1_s301_i2400',
        'baseline_wsd_lr0.00283_wd0.1_s301_i4800', 'baseline_wsd_lr0.00283_wd0.1_s301',
        'baseline_wsd_lr0.00283_wd0.1_s301_i19200']  # 8x is the arm's own max_iters: no suffix
    branches = [r for r in seed_301 if r.source]
    assert {r.source for r in branches if r.arm == 'baseline_wsd'} == {
        (stable.name, 1920), (stable.name, 3840), (stable.name, 7680), (stable.name, 15360)}
    assert p.settings[stable.name]['keep_checkpoints'] == (1920, 3840, 7680, 15360)
    args = P.train_args(s, branches[0], P.base_config(s), 'w', p.settings[branches[0].name])
    assert '--max_iters=2400' in args and '--lr_schedule=wsd' in args
    assert '--cooldown_frac=0.2' in args and args[-1] == '--init_from=auto'
    # the check's 8x branch off the 16x stable run is the LR check's 2.83e-3 run: one run
    check = [r for r in p.order if r.seed == 201 and r.arm == 'baseline_wsd']
    assert [r.name for r in check].count('baseline_wsd_lr0.00283_wd0.1_s201') == 1
    assert next(r for r in check if r.name.endswith('_s201')).source == (
        'baseline_wsd_lr0.00283_wd0.1_s201_i19200', 7680)


def test_a_wsd_phase_that_cannot_branch_is_refused(tmp_path):
    body = ("name = 'w'\nbase = ('config/cpu/small.py',)\n"
            "arms = dict(a=dict(weight_decay=0.1, lr=1e-3, settings={settings}))\n"
            "phases = [dict(name='t', kind='wsd', arms=('a',), seeds=(1,), steps=100, "
            "branches={branches})]\n")
    path = tmp_path / 'w.py'
    path.write_text(body.format(settings="dict(lr_schedule='wsd')", branches=(50, 100)))
    with pytest.raises(P.UserError, match="names its stable run's steps and the shorter branches"):
        P.load_study(str(path))
    path.write_text(body.format(settings="dict()", branches=(50,)))
    with pytest.raises(P.UserError, match="arm\\(s\\) a do not set lr_schedule='wsd'"):
        P.load_study(str(path))


def test_a_branch_starts_off_its_source_checkpoint_waits_for_it_or_runs_from_scratch(tmp_path):
    s = type('Study', (), dict(name='w'))()
    c = dict(work_root=str(tmp_path))
    branch = P.Run('a', 1e-3, 0.1, 1, steps=8, source=('a_stable', 4))
    assert P.init_from(c, s, branch, {}) is None  # the source has not written it yet
    assert P.init_from(c, s, branch, {'a_stable': 1.0}) == 'auto'  # finished elsewhere: scratch
    kept = tmp_path / 'out-w' / 'a_stable' / 'ckpt_4.pt'
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b'')
    assert P.init_from(c, s, branch, {}) == str(kept)
    own = tmp_path / 'out-w' / branch.name / 'ckpt.pt'
    own.parent.mkdir(parents=True)
    own.write_bytes(b'')
    assert P.init_from(c, s, branch, {}) == 'auto'  # a branch that stopped resumes itself
    assert P.init_from(c, s, P.Run('a', 1e-3, 0.1, 1), {}) == 'auto'


@pytest.mark.slow
@pytest.mark.long
def test_a_wsd_study_runs_a_branch_off_its_stable_runs_kept_checkpoint(data_root, tmp_path,
                                                                       capsys):
    (tmp_path / 'tiny.py').write_text('\n'.join([
        "dataset = 'tiny'", f"data_root = {data_root!r}", "n_layer = 1", "n_head = 2",
        "n_embd = 32", "block_size = 32", "batch_size = 2", "eval_iters = 1", "max_iters = 8",
        "warmup_iters = 1", "eval_interval = 2", "log_interval = 1", ""]))
    (tmp_path / 'study.py').write_text(f'''"""A tiny wsd study."""
name = 'tinywsd'
base = ('config/cpu/small.py', {str(tmp_path / 'tiny.py')!r})
WSD = dict(lr_schedule='wsd', cooldown_frac=0.5)
arms = dict(baseline=dict(weight_decay=0.1, lr=2e-3, settings=WSD))
phases = [dict(name='test', kind='wsd', arms=('baseline',), seeds=(1,), steps=16, branches=(8,))]
''')
    root, work = str(tmp_path / 'experiments'), str(tmp_path / 'work')
    S.main([str(tmp_path / 'study.py'), f'--root={root}', f'--work_root={work}', '--jobs=1',
            '--threads=1'])
    assert 'nothing left to run' in capsys.readouterr().out
    committed = os.path.join(root, 'tinywsd')
    assert sorted(os.listdir(committed)) == ['baseline_lr0.002_wd0.1_s1',
                                             'baseline_lr0.002_wd0.1_s1_i16']
    stable = json.load(open(os.path.join(committed, 'baseline_lr0.002_wd0.1_s1_i16',
                                         'config.json')))
    branch = json.load(open(os.path.join(committed, 'baseline_lr0.002_wd0.1_s1', 'config.json')))
    assert stable['keep_checkpoints'] == [4] and stable['max_iters'] == 16
    source = os.path.join(work, 'out-tinywsd', 'baseline_lr0.002_wd0.1_s1_i16', 'ckpt_4.pt')
    assert branch['init_from'] == source
    log = read_jsonl(os.path.join(committed, 'baseline_lr0.002_wd0.1_s1', 'log.jsonl.gz'))
    assert log[0]['iter'] == 4 and log[-1]['iter'] == 8 and 'val_loss_full' in log[-1]
