"""
The experiment of docs/experiments.md, as a runner that can be stopped and continued anywhere:

    python experiment.py                # run what is left, `jobs` at a time; skip finished runs
    python experiment.py --status=True  # what is done, what would run next, what waits on others
    python experiment.py --report=True  # rewrite the docs' tables and figures from committed logs

The design below is the one the docs state. Arms are config files (config/<arm>.py): a run
takes the model settings an arm's file makes, evaluated at this experiment's geometry, so a
variant is defined once. Tuning runs on a selection seed that no test uses: weight decay first
at the starting LR, then LR at the best weight decay, each optimum bracketed (a best value on
a grid's edge adds the next one outward). Then every arm at its own selected settings on fresh
paired seeds (seed = data_seed), the trend over budgets, the init-geometry check, and each
arm's selected LR over and times sqrt(2) on the selection seed (is a factor-2 grid fine enough?).

A run trains in out-<name>/<run>/ (checkpoints, stdout); once it has finished, its log.jsonl
and config.json are copied to experiments/<name>/<run>/, which is what is committed and what
every table is computed from. A run whose committed log is complete is never run again.
"""
import fcntl
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from common import UserError, parse_config, read_jsonl, run_main, variant_settings, write_text
import report
import train

DEFAULTS = dict(
    jobs=1,  # runs at a time (see docs/benchmarks.md for the measured rate)
    threads=None,  # threads per run; None: cores // jobs
    status=False,  # only list the runs and their state
    report=False,  # only regenerate the docs' tables and figures from experiments/<name>/
    dry=False,  # with the runner: print the commands it would start, start nothing
    root='experiments',  # committed logs: <root>/<name>/<run>/{log.jsonl,config.json}
    work_root='.',  # runs train in <work_root>/out-<name>/<run>/ (checkpoints, stdout; uncommitted)
    docs='docs/experiments.md',  # the write-up whose generated blocks --report rewrites
    design='v3',  # the experiment the runner and --status work on: 'v3' (current) or 'verdict' (v2)
)

# -----------------------------------------------------------------------------
# the design (docs/experiments.md states it and why; change it there first)
NAME = 'verdict'
BASE = ('config/small.py', 'config/repro.py')  # the scaled-down setting every run starts from
ARMS = ('baseline', 'reduced', 'reduced_mlp', 'nonlinear')  # config/<arm>.py, the reference first
SELECTION_SEED = 100  # tuning only
TEST_SEEDS = (101, 102, 103, 104, 105, 106)  # never used for tuning, nor by an earlier experiment
LR_START, LR_GRID, LR_STEP = 2e-3, (1e-3, 2e-3, 4e-3), 2.0
WD_GRID, WD_STEP = (0.0, 2 ** -5, 0.1), 10 ** 0.5
MAX_EXTENSIONS = 3  # bracket steps outward at most, per search
TREND_ARMS, TREND_BUDGETS, TREND_SEEDS = ('baseline', 'reduced'), (0.25, 0.5), TEST_SEEDS[:4]
GEOMETRY_ARMS, GEOMETRY_SEEDS = ('baseline', 'reduced'), TEST_SEEDS[:4]
# sigma * sqrt(d) of GPT-2 small at d = 128: 0.049
GEOMETRY_STD = round(0.02 * math.sqrt(768 / 128), 4)
# the LR grid's resolution check: the selected LR over and times sqrt(2)
REFINE = (LR_STEP ** -0.5, LR_STEP ** 0.5)
# % of loss: the smallest effect of interest ("matches" = within it, by two one-sided tests)
MARGIN = 0.3


@dataclass(frozen=True)
class Run:
    arm: str
    lr: float
    wd: float
    seed: int
    budget: float = 1.0  # a multiple of the base run's steps, with the same schedule shape
    init_std: float = None  # None: the base's (v2: the model's default, 0.02)
    dtype: str = None  # None: the base's (float32 in every design here)

    @property
    def name(self):
        extra = ((f"_b{self.budget:g}" if self.budget != 1 else "")
                 + (f"_std{self.init_std:g}" if self.init_std else "")
                 + (f"_{self.dtype}" if self.dtype else ""))
        return f"{self.arm}_lr{self.lr:g}_wd{self.wd:g}_s{self.seed}{extra}"


def grid_value(x):
    """A grid value as runs are named: 3 significant digits (2e-3 * sqrt(2) -> 0.00283)."""
    return float(f"{x:.3g}")


def outward(x, grid, step):
    """The next grid value past x outward; None below 0's edge."""
    if x == max(grid):
        return grid_value(x * step)
    return grid_value(x / step) if x > 0 else None


def bracket(losses, step):
    """The value to try next so that the best one is interior, or None once it is (or when it sits
    on 0, the edge of weight decay's domain). losses: {value: final loss}, inf for a diverged
    run."""
    best = min(losses, key=losses.get)
    if min(losses) < best < max(losses):
        return None
    return outward(best, losses, step)


def search(make, grid, step, results):
    """(runs named so far, the best value or None while one is missing); make(value) is the run at
    a value. The grid is extended by the bracket rule, at most MAX_EXTENSIONS times."""
    values = list(grid)
    while True:
        losses = {v: results.get(make(v).name) for v in values}
        if None in losses.values():
            return [make(v) for v in values], None
        nxt = bracket(losses, step)
        if nxt is None or len(values) - len(grid) >= MAX_EXTENSIONS:
            return [make(v) for v in values], min(losses, key=losses.get)
        values.append(nxt)


def tune(arm, results):
    """(tuning runs named so far, (lr, wd) selected or None): weight decay at LR_START, then LR."""
    wd_runs, wd = search(lambda v: Run(arm, LR_START, v, SELECTION_SEED), WD_GRID, WD_STEP, results)
    if wd is None:
        return wd_runs, None
    lr_runs, lr = search(lambda v: Run(arm, v, wd, SELECTION_SEED), LR_GRID, LR_STEP, results)
    runs = wd_runs + [r for r in lr_runs if r not in wd_runs]
    return runs, (None if lr is None else (lr, wd))


def plan(results):
    """{phase: [runs]} of every run the design names given the results so far, and the arms
    whose later phases wait on their tuning."""
    phases = dict(tuning=[], test=[], trend=[], geometry=[], refine=[])
    waiting = []
    for arm in ARMS:
        runs, chosen = tune(arm, results)
        phases['tuning'] += runs
        if chosen is None:
            waiting.append(arm)
            continue
        lr, wd = chosen
        phases['test'] += [Run(arm, lr, wd, s) for s in TEST_SEEDS]
        if arm in TREND_ARMS:
            phases['trend'] += [Run(arm, lr, wd, s, budget=b)
                                for b in TREND_BUDGETS for s in TREND_SEEDS]
        if arm in GEOMETRY_ARMS:
            phases['geometry'] += [Run(arm, lr, wd, s, init_std=GEOMETRY_STD)
                                   for s in GEOMETRY_SEEDS]
        phases['refine'] += [Run(arm, grid_value(lr * f), wd, SELECTION_SEED) for f in REFINE]
    return phases, waiting


# -----------------------------------------------------------------------------
# runs on disk

def base_config():
    return train.settings(list(BASE))


def arm_settings(arm, base):
    """The model settings config/<arm>.py makes at the base geometry: the one definition of a
    variant."""
    return variant_settings(arm, base, train.MODEL_KEYS)


def run_command(run, base, work, base_files):
    """train.py's command line for a run of any design: its base config files, its arm's model
    settings, and what the run names (LR, weight decay, seed, budget, init std, dtype)."""
    args = [*base_files, *(f'--{k}={v!r}' for k, v in arm_settings(run.arm, base).items()),
            f'--learning_rate={run.lr!r}', f'--min_lr={run.lr / 10!r}',
            f'--weight_decay={run.wd!r}', f'--seed={run.seed}', f'--data_seed={run.seed}',
            f'--out_dir={work}']
    if run.budget != 1:  # the same schedule shape: warmup and horizon scale with the steps
        args += [f"--{k}={max(1, round(base[k] * run.budget))}"
                 for k in ('max_iters', 'warmup_iters', 'lr_decay_iters')]
    if run.init_std:
        args.append(f'--init_std={run.init_std!r}')
    if run.dtype:
        args.append(f'--dtype={run.dtype}')
    init = 'resume' if os.path.exists(os.path.join(work, 'ckpt.pt')) else 'scratch'
    return [sys.executable, 'train.py', *args, f'--init_from={init}']


def command(run, base, work):
    return run_command(run, base, work, BASE)


def final_loss(folder):
    """The full val loss of a committed run, inf for a diverged one, None if it is not there."""
    if os.path.exists(os.path.join(folder, 'diverged.txt')):
        return math.inf
    if not train.run_finished(folder):
        return None
    return next(e['val_loss_full'] for e in reversed(read_jsonl(os.path.join(folder, 'log.jsonl')))
                if 'val_loss_full' in e)


def committed_results(root, name=None):
    folder = os.path.join(root, name or NAME)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    results = {n: final_loss(os.path.join(folder, n)) for n in names}
    return {n: v for n, v in results.items() if v is not None}


def commit_run(work, dest, error):
    """Copy a finished run's log and config, with a divergence's one-line error, into the committed
    folder; 'finished', 'diverged', or None for a run that stopped early (it resumes next time)."""
    diverged = 'non-finite' in error
    if not (train.run_finished(work) or diverged):
        return None
    os.makedirs(dest, exist_ok=True)
    for f in ('config.json', 'log.jsonl'):
        if os.path.exists(os.path.join(work, f)):
            with open(os.path.join(work, f)) as src:
                write_text(os.path.join(dest, f), src.read())
    if diverged:
        write_text(os.path.join(dest, 'diverged.txt'), error.strip() + '\n')
    return 'diverged' if diverged else 'finished'


# -----------------------------------------------------------------------------
# the write-up: tables (and figures) from the committed logs alone

def pct(x):
    return f"{x:+.2f}%"


def fmt_p(p):
    return f"{p:.3f}" if p >= 0.001 else f"{p:.0e}"


def tuning_block(results):
    rows = ["| arm | peak LR | weight decay | full val loss | |", "|---|---|---|---|---|"]
    for arm in ARMS:
        runs, chosen = tune(arm, results)
        for r in runs:
            loss = results.get(r.name)
            mark = "**selected**" if chosen == (r.lr, r.wd) else ""
            cell = '-' if loss is None else f'{loss:.4f}'
            rows.append(f"| {arm} | {r.lr:g} | {r.wd:g} | {cell} | {mark} |")
        if chosen is not None:
            lrs = {r.lr for r in runs if r.wd == chosen[1]}
            wds = {r.wd for r in runs if r.lr == LR_START}
            edges = [n for n, v, grid in (('LR', chosen[0], lrs), ('weight decay', chosen[1], wds))
                     if v in (min(grid), max(grid)) and v != 0]
            word = 'on the edge: ' + ', '.join(edges) if edges else 'bracketed'
            edge = ' (weight decay 0: the edge of its domain)' if chosen[1] == 0 else ''
            rows.append(f"| {arm} | | | | {word}{edge} |")
    return '\n'.join(rows) + '\n'


def gaps_of(results, ref_runs, runs):
    """{seed: paired gap in %} for the seeds both have."""
    ref = {r.seed: results.get(r.name) for r in ref_runs}
    return {r.seed: 100 * (results[r.name] - ref[r.seed]) / ref[r.seed]
            for r in runs if results.get(r.name) is not None and ref.get(r.seed) is not None}


def verdict_block(results, phases):
    test = {arm: [r for r in phases['test'] if r.arm == arm] for arm in ARMS}
    if not all(test.values()):
        return "Not yet: the test runs are named once every arm's tuning has finished.\n"
    ref = test[ARMS[0]]
    gap_sets = [gaps_of(results, ref, test[arm]) for arm in ARMS[1:]]
    if any(len(g) < len(TEST_SEEDS) for g in gap_sets):
        done = sum(results.get(r.name) is not None for runs in test.values() for r in runs)
        return f"Not yet: {done} of {sum(map(len, test.values()))} test runs have finished.\n"
    stats = report.compare([list(g.values()) for g in gap_sets], MARGIN)
    rows = ["| arm | peak LR | weight decay | full val loss, mean ± sd | paired gap, mean ± sd "
            "| interval (level) | t p (Holm) | sign-flip p | TOST ±0.3% p (Holm) | verdict |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for arm in ARMS:
        losses = [results[r.name] for r in test[arm]]
        m, sd = report.mean_sd(losses)
        head = (f"| {arm} | {test[arm][0].lr:g} | {test[arm][0].wd:g} | {m:.4f} ± {sd:.4f} "
                f"({100 * sd / m:.2f}%) |")
        if arm == ARMS[0]:
            rows.append(head + " (reference) | | | | | |")
            continue
        s = stats[ARMS.index(arm) - 1]
        flag = " (t and sign-flip disagree at 0.05)" if s['flag'] else ""
        rows.append(f"{head} {pct(s['mean'])} ± {s['sd']:.2f}% | [{pct(s['mean'] - s['half'])}, "
                    f"{pct(s['mean'] + s['half'])}] ({100 * s['level']:.1f}%) "
                    f"| {fmt_p(s['p_t'])} ({fmt_p(s['p_t_holm'])}) | {fmt_p(s['p_perm'])} "
                    f"| {fmt_p(s['p_tost'])} ({fmt_p(s['p_tost_holm'])}) "
                    f"| **{s['verdict']}**{flag} |")
    noise = '; '.join(f"{arm} {stats[i]['mde']:.2f}%" for i, arm in enumerate(ARMS[1:]))
    return '\n'.join(rows) + (f"\n\nThe smallest gap this noise detects with 80% power "
                              f"(n = {len(TEST_SEEDS)}, at the level 0.05/{len(ARMS) - 1}): "
                              f"{noise}.\n")


def seed_slopes(results, phases):
    """Per test seed: [(tokens, gap %)] over the budgets, and the least-squares slope per
    doubling."""
    base = base_config()
    tokens_full = (base['max_iters'] * base['batch_size'] * base['block_size']
                   * base['gradient_accumulation_steps'])
    series = {}
    for b in (*TREND_BUDGETS, 1.0):
        pick = [r for r in phases['trend'] + phases['test']
                if r.budget == b and r.seed in TREND_SEEDS]
        gaps = gaps_of(results, [r for r in pick if r.arm == TREND_ARMS[0]],
                       [r for r in pick if r.arm == TREND_ARMS[1]])
        for seed, g in gaps.items():
            series.setdefault(seed, []).append((round(tokens_full * b), g))
    slopes = {}
    for seed, points in series.items():
        if len(points) == len(TREND_BUDGETS) + 1:
            xs = [math.log2(t) for t, _ in points]
            mx, my = sum(xs) / len(xs), sum(g for _, g in points) / len(points)
            slopes[seed] = (sum((x - mx) * (g - my) for x, (_, g) in zip(xs, points))
                            / sum((x - mx) ** 2 for x in xs))
    return series, slopes


def interval95(values):
    m, sd = report.mean_sd(values)
    half = report.t_quantile(0.975, len(values) - 1) * sd / len(values) ** 0.5
    return m, m - half, m + half


def interval_cell(values):
    """'mean [low, high]' of interval95, in % with a sign: a table cell."""
    m, lo, hi = interval95(values)
    return f"{pct(m)} [{pct(lo)}, {pct(hi)}]"


def trend_block(results, phases):
    series, slopes = seed_slopes(results, phases)
    if len(slopes) < len(TREND_SEEDS):
        return f"Not yet: {len(slopes)} of {len(TREND_SEEDS)} seeds have all three budgets.\n"
    rows = [f"| tokens | paired gap {TREND_ARMS[1]} − {TREND_ARMS[0]}, mean [95% interval] |",
            "|---|---|"]
    for i, (tokens, _) in enumerate(series[TREND_SEEDS[0]]):
        rows.append(f"| {tokens:,} | {interval_cell([series[s][i][1] for s in TREND_SEEDS])} |")
    rows.append(f"| slope per doubling of tokens | {interval_cell(list(slopes.values()))} |")
    return '\n'.join(rows) + '\n\n![the paired gap against the budget](assets/trend.png)\n'


def geometry_gaps(results, phases):
    """{seed: gap %} at init_std GEOMETRY_STD and at the default 0.02 (the test runs), for the
    geometry seeds."""
    def gaps(runs):
        pick = [r for r in runs if r.seed in GEOMETRY_SEEDS]
        return gaps_of(results, [r for r in pick if r.arm == GEOMETRY_ARMS[0]],
                       [r for r in pick if r.arm == GEOMETRY_ARMS[1]])
    return gaps(phases['geometry']), gaps(phases['test'])


def geometry_block(results, phases):
    wide, std = geometry_gaps(results, phases)
    if len(wide) < len(GEOMETRY_SEEDS) or len(std) < len(GEOMETRY_SEEDS):
        return (f"Not yet: {len(wide)} of {len(GEOMETRY_SEEDS)} seeds at init_std "
                f"{GEOMETRY_STD:g}.\n")
    rows = [f"| init_std | σ·√d | paired gap {GEOMETRY_ARMS[1]} − {GEOMETRY_ARMS[0]}, "
            "mean [95% interval] |", "|---|---|---|"]
    for std_value, gaps in ((0.02, std), (GEOMETRY_STD, wide)):
        rows.append(f"| {std_value:g} | {std_value * 128 ** 0.5:.2f} "
                    f"| {interval_cell(list(gaps.values()))} |")
    m, lo, hi = interval95([wide[s] - std[s] for s in GEOMETRY_SEEDS])
    word = ("depends on the init geometry" if lo > 0 or hi < 0
            else "no dependence on the init geometry detected")
    rows.append(f"| difference | | {pct(m)} [{pct(lo)}, {pct(hi)}]: **{word}** |")
    return '\n'.join(rows) + '\n\n![the paired gap at two init geometries](assets/geometry.png)\n'


def refine_block(results, phases):
    """The LR grid's resolution: each arm at its selected LR and its two sqrt(2) neighbours, seed
    100."""
    done = [r for r in phases['refine'] if r.name in results]
    if not phases['refine'] or len(done) < len(phases['refine']):
        return f"Not yet: {len(done)} of {len(REFINE) * len(ARMS)} runs have finished.\n"
    rows = ["| arm | weight decay | loss at LR ÷√2, selected, ×√2 | best on the finer grid "
            f"| gain | gap to {ARMS[0]}: selected → finer best |", "|---|---|---|---|---|---|"]
    best, moved = {}, []
    for arm in ARMS:
        lr, wd = tune(arm, results)[1]
        runs = sorted([Run(arm, lr, wd, SELECTION_SEED)]
                      + [r for r in phases['refine'] if r.arm == arm], key=lambda r: r.lr)
        losses = {r.lr: results[r.name] for r in runs}
        top = min(losses, key=losses.get)
        best[arm] = (losses[lr], losses[top])
        if top != lr:
            moved.append(arm)
        gaps = "(reference)" if arm == ARMS[0] else ' → '.join(
            pct(100 * (best[arm][i] - best[ARMS[0]][i]) / best[ARMS[0]][i]) for i in (0, 1))
        rows.append(f"| {arm} | {wd:g} | " + ', '.join(f"{v:g}: {losses[v]:.4f}" for v in losses) +
                    f" | {top:g} | {pct(100 * (losses[top] - losses[lr]) / losses[lr])} | {gaps} |")
    verdict = (f"**grid-sensitive**: {', '.join(moved)}" if moved
               else "no arm's best moves on the finer grid")
    return '\n'.join(rows) + f"\n\n{verdict}.\n"


def figures(root, results, phases, folder):
    """The trend, geometry and diagnostics figures, each once its runs are all committed."""
    series, slopes = seed_slopes(results, phases)
    if len(slopes) == len(TREND_SEEDS):
        fig, ax = report.pyplot().subplots(figsize=(7, 4.5))
        for seed in TREND_SEEDS:
            ax.plot(*zip(*series[seed]), color='grey', alpha=0.5, lw=0.8, marker='.')
        points = list(zip(*[series[s] for s in TREND_SEEDS]))
        stats = [interval95([g for _, g in p]) for p in points]
        ax.errorbar([p[0][0] for p in points], [m for m, _, _ in stats],
                    yerr=[[m - lo for m, lo, _ in stats], [hi - m for m, _, hi in stats]],
                    color=report.variant_color(TREND_ARMS[1]), marker='o', capsize=4,
                    label="mean over seeds, 95% interval (grey: each seed)")
        ax.axhline(0, color='black', lw=0.8)
        ax.set(xscale='log', xlabel='tokens',
               ylabel=f'{TREND_ARMS[1]} − {TREND_ARMS[0]} (% of val loss)',
               title='paired gap against the budget')
        ax.legend(fontsize=8)
        report.save_figure(fig, os.path.join(folder, 'trend.png'))
    wide, std = geometry_gaps(results, phases)
    if len(wide) == len(std) == len(GEOMETRY_SEEDS):
        fig, ax = report.pyplot().subplots(figsize=(6, 4.5))
        for i, seed in enumerate(GEOMETRY_SEEDS):
            ax.plot([0.02, GEOMETRY_STD], [std[seed], wide[seed]],
                    color=report.variant_color(GEOMETRY_ARMS[1]), marker='o', alpha=0.7,
                    label=None if i else f"one line per test seed ({len(GEOMETRY_SEEDS)})")
        ax.axhline(0, color='black', lw=0.8)
        ax.set(xticks=[0.02, GEOMETRY_STD], xlabel='init_std',
               ylabel=f'{GEOMETRY_ARMS[1]} − {GEOMETRY_ARMS[0]} (%)',
               title='paired gap at two init geometries')
        ax.legend(fontsize=8)
        report.save_figure(fig, os.path.join(folder, 'geometry.png'))
    diag = [os.path.join(root, NAME, r.name) for r in phases['test']
            if r.seed == TEST_SEEDS[0] and r.name in results]
    if len(diag) == len(ARMS):
        report.plot_diagnostics([dict(report.read_run(d), name=os.path.basename(d)) for d in diag],
                                os.path.join(folder, 'diagnostics.png'))


def diagnostics_block(results, phases):
    done = [r for r in phases['test'] if r.seed == TEST_SEEDS[0] and r.name in results]
    if len(done) < len(ARMS):
        return (f"Not yet: {len(done)} of {len(ARMS)} arms have finished test seed "
                f"{TEST_SEEDS[0]}.\n")
    return (f"Test seed {TEST_SEEDS[0]}, every arm at its selected settings (one line per layer, "
            "darker = deeper):\n\n"
            "![attention and weight diagnostics](assets/diagnostics.png)\n")


def blocks(root):
    """{block name: markdown} for every generated block of the docs, from the committed logs."""
    results = committed_results(root)
    phases, _ = plan(results)
    return dict(tuning=tuning_block(results), verdict=verdict_block(results, phases),
                trend=trend_block(results, phases), geometry=geometry_block(results, phases),
                refine=refine_block(results, phases),
                diagnostics=diagnostics_block(results, phases))


def write_figures(root, folder):
    results = committed_results(root)
    figures(root, results, plan(results)[0], folder)


PILOT = 'modern_pilot'  # <root>/modern_pilot/<arm>[_modern]_s<seed>/: the modern block's pilot


def pilot_block(root):
    """The modern block's pilot (docs/experiments.md): final full val loss of baseline and reduced,
    with and without config/modern.py, per seed, and modern − plain per seed."""
    folder = os.path.join(root, PILOT)
    runs = {n: final_loss(os.path.join(folder, n)) for n in sorted(os.listdir(folder))} \
        if os.path.isdir(folder) else {}
    seeds = sorted({int(n.rsplit('_s', 1)[1]) for n in runs})
    if not runs:
        return "Not yet: no pilot run is committed.\n"
    rows = ["| arm | seed | learned positions | RoPE + QK-norm | modern − plain |",
            "|---|---|---|---|---|"]
    fmt = lambda x: '-' if x is None else f"{x:.4f}"
    for arm in ('baseline', 'reduced'):
        for s in seeds:
            plain, modern = runs.get(f'{arm}_s{s}'), runs.get(f'{arm}_modern_s{s}')
            both = plain is not None and modern is not None
            diff = pct(100 * (modern - plain) / plain) if both else '-'
            rows.append(f"| {arm} | {s} | {fmt(plain)} | {fmt(modern)} | {diff} |")
    return '\n'.join(rows) + '\n'


def all_blocks(root):
    """The generated blocks of every design, by their (distinct) names, and the pilot's."""
    made = {'modern_pilot': pilot_block(root)}
    for d in designs().values():
        made.update(d.blocks(root))
    return made


BLOCK = re.compile(r'(<!-- generated: (\w+) -->\n)(.*?)(<!-- end -->)', re.S)


def fill(text, made):
    """The docs' text with each generated block replaced by its new content."""
    return BLOCK.sub(lambda m: m.group(1) + made[m.group(2)] + m.group(4), text)


def write_report(c):
    if not os.path.isfile(c['docs']):
        raise UserError(f"{c['docs']} not found: --docs names the write-up whose generated blocks "
                        "are rewritten")
    with open(c['docs']) as f:
        text = f.read()
    made = all_blocks(c['root'])
    write_text(c['docs'], fill(text, made))
    print(f"wrote {len(made)} blocks into {c['docs']}")
    for d in designs().values():
        d.write_figures(c['root'], os.path.join(os.path.dirname(c['docs']), 'assets'))
    for name, md in made.items():
        print(f"\n{name}:\n{md}", end='')
    return made


# -----------------------------------------------------------------------------
# the runner

def designs():
    """{name: the module that states it}: each has NAME, plan, command, base_config and blocks."""
    import experiment_v3
    return {NAME: sys.modules[__name__], experiment_v3.NAME: experiment_v3}


def pending(root, d):
    """(runs to start, not yet committed, in the design's RUN_ORDER of phases or else in plan
    order; phases; arms waiting; results) of design d."""
    results = committed_results(root, d.NAME)
    phases, waiting = d.plan(results)
    order = getattr(d, 'RUN_ORDER', tuple(phases))
    todo = [r for phase in order for r in phases[phase] if r.name not in results]
    return list(dict.fromkeys(todo)), phases, waiting, results


def start(run, c, base, d):
    work = os.path.join(c['work_root'], f'out-{d.NAME}', run.name)
    os.makedirs(work, exist_ok=True)
    cmd = d.command(run, base, work)
    print(f"{time.strftime('%H:%M:%S')} start {run.name}", flush=True)
    threads = c['threads'] or max(1, (os.cpu_count() or 1) // c['jobs'])
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = open(os.path.join(work, 'stdout.txt'), 'a')
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True, env=env), work, out


def finish(run, proc, work, out, root, d):
    error = proc.stderr.read()
    out.close()
    state = commit_run(work, os.path.join(root, d.NAME, run.name), error)
    tail = error.strip().splitlines()[-1] if error.strip() else f"exit code {proc.returncode}"
    why = "" if state == 'finished' else f": {tail}"
    print(f"{time.strftime('%H:%M:%S')} {state or 'stopped'} {run.name}{why}", flush=True)
    return state


def run_all(c, d):
    """Start runs as slots free up, re-planning after each one (a finished tuning run can name the
    next); a run that stops without finishing is not retried in this invocation. SIGTERM or SIGINT
    stops the runner cleanly: each running train.py gets SIGTERM, saves its checkpoint and exits,
    and the next `python experiment.py` resumes it."""
    base, running, stopped, signals = d.base_config(), {}, set(), []
    handlers = {s: signal.signal(s, lambda signum, frame: signals.append(signum))
                for s in (signal.SIGTERM, signal.SIGINT)}
    replan = True  # the plan reads every committed log: only when a run has ended
    try:
        while True:
            if replan:
                todo, _, waiting, _ = pending(c['root'], d)
                todo = [r for r in todo if r not in running and r not in stopped]
                replan = False
            while todo and len(running) < c['jobs'] and not signals:
                run = todo.pop(0)
                running[run] = start(run, c, base, d)
            if signals:
                return stop_runs(running, c, d)
            if not running:
                print("nothing left to run" if not waiting and not stopped else
                      f"stopped: {len(stopped)} run(s) did not finish; run again to resume them")
                return
            time.sleep(2)
            for run, (proc, work, out) in list(running.items()):
                if proc.poll() is not None:
                    del running[run]
                    replan = True
                    if finish(run, proc, work, out, c['root'], d) is None:
                        stopped.add(run)
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)


def stop_runs(running, c, d):
    """SIGTERM to every running train.py, then wait while each saves its checkpoint and exits."""
    for proc, _, _ in running.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for run, (proc, work, out) in running.items():
        proc.wait()
        finish(run, proc, work, out, c['root'], d)
    print(f"stopped by a signal: {len(running)} run(s) saved their checkpoints; "
          "python experiment.py resumes them")


def status(c, d):
    todo, phases, waiting, results = pending(c['root'], d)
    base = d.base_config()
    print(f"experiment {d.NAME}:")
    for phase, runs in phases.items():
        done = sum(r.name in results for r in dict.fromkeys(runs))
        print(f"{phase}: {done} of {len(set(runs))} named runs done")
    if waiting:
        print(f"waiting on tuning: {', '.join(waiting)} (their later phases are named once it "
              "ends)")
    print(f"to run now: {len(todo)}"
          + ("" if todo else " (nothing left to run)" if not waiting else ""))
    for run in todo:
        work = os.path.join(c['work_root'], f'out-{d.NAME}', run.name)
        print(f"  {run.name}" + ("" if not c['dry'] else
                                 "\n    " + ' '.join(d.command(run, base, work)[1:])))
    return todo


def lock(root):
    os.makedirs(root, exist_ok=True)
    f = open(os.path.join(root, '.runner.lock'), 'a')
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise UserError(f"another experiment.py is running on {root}: wait for it or stop "
                        "it") from None
    return f


def main(argv=None):
    c = parse_config(DEFAULTS, argv)
    if c['jobs'] < 1:
        raise UserError(f"jobs must be at least 1, got {c['jobs']}")
    if c['report']:
        return write_report(c)
    known = designs()
    if c['design'] not in known:
        raise UserError(f"design must be one of {', '.join(known)}, got {c['design']!r}")
    if c['status'] or c['dry']:
        return status(c, known[c['design']])
    with lock(c['root']):
        run_all(c, known[c['design']])


if __name__ == '__main__':
    run_main(main)
