"""
Experiment v3 of docs/experiments.md: the paper's four claims at GPT-2 small's init geometry.
experiment.py runs it (`python experiment.py`, `--status=True`, `--report=True`); this module
states the design, names its runs, and computes its tables and figures from the committed logs.

The design below is the one the docs state; change it there first. Each arm's peak LR is
chosen on three selection seeds (the lowest mean full val loss on a sqrt(2) grid, bracketed);
its weight decay is the paper's for its family. Then the primary pair on 20 fresh paired seeds
and each secondary arm on the first 10 of them, the primary pair at twice the budget on 4 of
them, and the baseline in bf16 autocast on 4 of them (the dtype check).
"""
import math
import os

import experiment as E
import report
import train
from common import read_jsonl

NAME = 'v3'
BASE = ('config/small.py', 'config/repro.py', 'config/gpt2_init.py', 'config/repro_v3.py')
ARMS = ('baseline', 'reduced', 'reduced_mlp', 'baseline_small_mlp')  # config/<arm>.py
PRIMARY = ('baseline', 'reduced')  # claim (i), the one primary comparison
# weight decay per arm, not tuned: the paper's 0.1 for the baselines, 2^-5 for W_Q = I
WD = dict(baseline=0.1, reduced=2 ** -5, reduced_mlp=2 ** -5, baseline_small_mlp=0.1)
SELECTION_SEEDS = (201, 202, 203)  # tuning only
TEST_SEEDS = tuple(range(301, 321))  # fresh: no earlier experiment and no tuning used them
SECONDARY_SEEDS = TEST_SEEDS[:10]
LR_GRID, LR_STEP = (2e-3, 2.83e-3, 4e-3, 5.66e-3), 2 ** 0.5
LONG_BUDGET, LONG_SEEDS = 2.0, TEST_SEEDS[:4]
DTYPE_ARM, DTYPE_SEEDS = 'baseline', TEST_SEEDS[:4]
MARGIN = E.MARGIN  # % of loss: "matches" is within it, by two one-sided tests
# claim (iii): above the tuning grid, the stability phase climbs in sqrt(2) steps until a seed
# diverges, at most STABILITY_STEPS times (baseline and reduced trained on every seed at its top)
STABILITY_ARMS, STABILITY_STEPS = PRIMARY, 4
# the order the runner starts them: the primary pair's test and longer budget as soon as the pair
# is tuned, then the secondaries' tuning (their tests join 'test' once it ends)
RUN_ORDER = ('test', 'longer', 'tuning', 'dtype', 'stability')
Run = E.Run  # (arm, lr, wd, seed, budget, init_std, dtype): v3 sets the geometry in BASE instead


def seed_losses(arm, lr, results):
    """The selection seeds' full val losses at lr, None while one is missing (inf: diverged)."""
    losses = [results.get(Run(arm, lr, WD[arm], s).name) for s in SELECTION_SEEDS]
    return None if None in losses else losses


def tune(arm, results):
    """(tuning runs named so far, the selected LR or None): the lowest mean over the selection
    seeds, the grid extended by the bracket rule until that LR is interior."""
    lrs = list(LR_GRID)
    while True:
        runs = [Run(arm, lr, WD[arm], s) for lr in lrs for s in SELECTION_SEEDS]
        means = {lr: seed_losses(arm, lr, results) for lr in lrs}
        if None in means.values():
            return runs, None
        means = {lr: sum(v) / len(v) for lr, v in means.items()}
        nxt = E.bracket(means, LR_STEP)
        if nxt is None or len(lrs) - len(LR_GRID) >= E.MAX_EXTENSIONS:
            return runs, min(means, key=means.get)
        lrs.append(nxt)


def stability_lrs(arm, results):
    """The LRs above the tuning grid the stability phase names so far: the next one joins once
    every seed of the last has finished and none diverged."""
    lrs, lr = [], max(LR_GRID)
    while arm in STABILITY_ARMS and len(lrs) < STABILITY_STEPS:
        lr = E.grid_value(lr * LR_STEP)
        lrs.append(lr)
        losses = seed_losses(arm, lr, results)
        if losses is None or any(math.isinf(x) for x in losses):
            break
    return lrs


def plan(results):
    """{phase: [runs]} the design names given the results so far, and the arms still tuning."""
    phases = dict(tuning=[], test=[], longer=[], dtype=[], stability=[])
    chosen, waiting = {}, []
    for arm in ARMS:
        runs, lr = tune(arm, results)
        phases['tuning'] += runs
        if lr is None:
            waiting.append(arm)
        else:
            chosen[arm] = lr
    # the primary pair first, then the secondaries, each seed by seed so that a partial test
    # phase stays paired: the one primary comparison is never left waiting on a secondary arm
    secondary = [a for a in ARMS if a not in PRIMARY]
    for arms, seeds in ((PRIMARY, TEST_SEEDS), (secondary, SECONDARY_SEEDS)):
        phases['test'] += [Run(a, chosen[a], WD[a], s) for s in seeds for a in arms if a in chosen]
    phases['longer'] = [Run(a, chosen[a], WD[a], s, budget=LONG_BUDGET)
                        for s in LONG_SEEDS for a in PRIMARY if a in chosen]
    if DTYPE_ARM in chosen:
        phases['dtype'] = [Run(DTYPE_ARM, chosen[DTYPE_ARM], WD[DTYPE_ARM], s, dtype='bfloat16')
                           for s in DTYPE_SEEDS]
    phases['stability'] = [Run(a, lr, WD[a], s) for a in STABILITY_ARMS
                           for lr in stability_lrs(a, results) for s in SELECTION_SEEDS]
    return phases, waiting


def base_config():
    return train.settings(list(BASE))


def command(run, base, work):
    return E.run_command(run, base, work, BASE)


# -----------------------------------------------------------------------------
# the write-up: tables and figures from the committed logs alone

COMPARISONS = (('reduced', 'baseline', '(i)'), ('reduced_mlp', 'baseline', '(ii)'),
               ('reduced', 'baseline_small_mlp', '(iv)'))  # (arm, reference, claim): primary first
INDUCTION_THRESHOLD = 0.3  # the strongest head's score that counts as an induction head


def committed(root):
    results = E.committed_results(root, NAME)
    return results, plan(results)[0]


def log_of(root, run):
    return read_jsonl(os.path.join(root, NAME, run.name, 'log.jsonl'))


def spikes(log, warmup):
    """{step: rise in %} after warmup where the run spiked by the design's (amended) definition: the
    loss on the fixed val windows rose from one evaluation to the next, or a loss was non-finite
    (inf). The training loss alone is not a criterion: its batches differ from step to step."""
    found = {e['iter']: math.inf for e in log if e['iter'] > warmup and
             not all(math.isfinite(e[k]) for k in ('loss', 'val_loss') if k in e)}
    evals = [e for e in log if 'val_loss' in e and e['iter'] > warmup]
    for a, b in zip(evals, evals[1:]):
        if math.isfinite(a['val_loss']) and b['val_loss'] > a['val_loss']:
            found.setdefault(b['iter'], 100 * (b['val_loss'] - a['val_loss']) / a['val_loss'])
    return dict(sorted(found.items()))


def grad_ratio(log, warmup):
    """The largest gradient norm after warmup over its median: how far the worst step stood out."""
    norms = sorted(e['grad_norm'] for e in log if 'grad_norm' in e and e['iter'] > warmup)
    return norms[-1] / norms[len(norms) // 2] if norms and norms[len(norms) // 2] > 0 else None


def run_state(loss, log, warmup):
    """'diverged', 'spiked at step (+rise%)…', '' (clean) or None (not committed: loss None)."""
    if loss is None:
        return None
    if math.isinf(loss):
        return 'diverged'
    found = spikes(log, warmup)
    return ('spiked at ' + ', '.join(f"{k} ({E.pct(v)})" for k, v in list(found.items())[:3])
            if found else '')


def lr_rows(root, results, lrs_of):
    """A row per arm and LR in lrs_of(arm): every selection seed's loss and state."""
    warmup = base_config()['warmup_iters']
    rows = []
    for arm in ARMS:
        chosen = tune(arm, results)[1]
        for lr in lrs_of(arm):
            seeds = [Run(arm, lr, WD[arm], s) for s in SELECTION_SEEDS]
            losses = [results.get(r.name) for r in seeds]
            logs = [log_of(root, r) if r.name in results else None for r in seeds]  # read once
            rows.append(dict(arm=arm, lr=lr, losses=losses, selected=lr == chosen,
                             states=[run_state(x, g, warmup) for x, g in zip(losses, logs)],
                             grad=[grad_ratio(g, warmup) if g is not None else None
                                   for g in logs],
                             mean=None if None in losses else sum(losses) / len(losses)))
    return rows


def tuning_rows(root, results):
    return lr_rows(root, results, lambda arm: sorted({r.lr for r in tune(arm, results)[0]}))


def stability_rows(root, results):
    """The tuning grid and the stability phase's LRs above it."""
    return lr_rows(root, results, lambda arm: sorted(
        {r.lr for r in tune(arm, results)[0]} | set(stability_lrs(arm, results))))


def fmt_loss(x):
    return '-' if x is None else 'diverged' if math.isinf(x) else f"{x:.4f}"


def tuning_block(root, results):
    rows = tuning_rows(root, results)
    out = ["| arm | weight decay | peak LR | " + " | ".join(f"seed {s}" for s in SELECTION_SEEDS) +
           " | mean | |", "|---|---|---|" + "---|" * len(SELECTION_SEEDS) + "---|---|"]
    for r in rows:
        out.append(f"| {r['arm']} | {WD[r['arm']]:g} | {r['lr']:g} | " +
                   " | ".join(fmt_loss(x) for x in r['losses']) +
                   f" | {fmt_loss(r['mean'])} | {'**selected**' if r['selected'] else ''} |")
    for arm in ARMS:
        lr = tune(arm, results)[1]
        if lr is not None:
            lrs = [r['lr'] for r in rows if r['arm'] == arm]
            word = 'on the edge' if lr in (min(lrs), max(lrs)) else 'bracketed'
            out.append(f"| {arm} | | {lr:g} | " + " | " * len(SELECTION_SEEDS) + f" | {word} |")
    return '\n'.join(out) + '\n'


def stability_summary(mine):
    """(the runs that spiked or diverged, as text; the largest LR below the first such; whether
    none did) over an arm's rows whose seeds have all finished."""
    bad = [r for r in mine if any(r['states'])]
    first_bad = min((r['lr'] for r in bad), default=math.inf)
    stable = [r['lr'] for r in mine if r['lr'] < first_bad]
    where = '; '.join(f"{r['lr']:g}: " + ', '.join(f"{s} {st}" for s, st in
                                                  zip(SELECTION_SEEDS, r['states']) if st)
                      for r in bad)
    return where or 'none', (max(stable) if stable else None), not bad


def stability_block(root, results):
    rows = stability_rows(root, results)
    out = ["| arm | weight decay | LRs run | runs spiked or diverged (LR: seeds) "
           "| largest LR with no spike | largest grad norm ÷ median, per LR |",
           "|---|---|---|---|---|---|"]
    for arm in ARMS:
        mine = [r for r in rows if r['arm'] == arm and None not in r['states']]
        if not mine:
            out.append(f"| {arm} | {WD[arm]:g} | | not yet | | |")
            continue
        where, top, clean = stability_summary(mine)
        bound = " (a lower bound: no run spiked)" if clean else ""
        top = 'none' if top is None else f"{top:g}{bound}"
        grads = ', '.join(f"{max(g for g in r['grad'] if g):.1f}" for r in mine if any(r['grad']))
        out.append(f"| {arm} | {WD[arm]:g} | {', '.join(format(r['lr'], 'g') for r in mine)} "
                   f"| {where} | {top} | {grads} |")
    above = [r for r in rows if r['lr'] > max(LR_GRID)]
    if above:
        out += ["", "Above the tuning grid (the stability phase): full val loss per selection "
                "seed.",
                "",
                "| arm | peak LR | " + " | ".join(f"seed {s}" for s in SELECTION_SEEDS) + " |",
                "|---|---|" + "---|" * len(SELECTION_SEEDS)]
        out += [f"| {r['arm']} | {r['lr']:g} | " + " | ".join(map(fmt_loss, r['losses'])) + " |"
                for r in above]
    figure = '\n![final loss against peak LR, every seed](assets/v3_stability.png)\n' if any(
        None not in r['losses'] for r in rows) else ''
    return '\n'.join(out) + '\n' + figure


def test_runs(phases, arm, seeds=None):
    return [r for r in phases['test'] if r.arm == arm and (seeds is None or r.seed in seeds)]


def comparison_gaps(results, phases, arm, ref):
    return E.gaps_of(results, test_runs(phases, ref), test_runs(phases, arm))


def needed(arm, ref):
    return TEST_SEEDS if (arm, ref) == COMPARISONS[0][:2] else SECONDARY_SEEDS


def verdict_rows(stats, comparisons):
    rows = []
    for (arm, ref, claim), s in zip(comparisons, stats):
        flag = " (t and sign-flip disagree at 0.05)" if s['flag'] else ""
        rows.append(f"| {claim} {arm} − {ref} | {s['n']} | {E.pct(s['mean'])} ± {s['sd']:.2f}% | "
                    f"[{E.pct(s['mean'] - s['half'])}, {E.pct(s['mean'] + s['half'])}] "
                    f"({100 * s['level']:.1f}%) | "
                    f"{E.fmt_p(s['p_t'])} ({E.fmt_p(s['p_t_holm'])}) | {E.fmt_p(s['p_perm'])} | "
                    f"{E.fmt_p(s['p_tost'])} ({E.fmt_p(s['p_tost_holm'])}) | {s['mde']:.2f}% | "
                    f"**{s['verdict']}**{flag} |")
    return rows


def verdict_stats(results, phases):
    """report.compare's statistics per comparison, None while it lacks seeds: the primary alone,
    the secondaries together (Holm), once both have all theirs."""
    gaps = [comparison_gaps(results, phases, arm, ref) for arm, ref, _ in COMPARISONS]
    done = [len(g) >= len(needed(a, r)) for g, (a, r, _) in zip(gaps, COMPARISONS)]
    primary = report.compare([list(gaps[0].values())], MARGIN) if done[0] else [None]
    secondary = (report.compare([list(g.values()) for g in gaps[1:]], MARGIN) if all(done[1:])
                 else [None] * (len(COMPARISONS) - 1))
    return primary + secondary


def tested_arms(results, phases):
    """The arms whose test runs have all finished."""
    return [a for a in ARMS if test_runs(phases, a) and
            all(r.name in results for r in test_runs(phases, a))]


def verdict_block(results, phases):
    stats = verdict_stats(results, phases)
    waiting = [(a, r) for s, (a, r, _) in zip(stats, COMPARISONS) if s is None]
    note = "" if not waiting else "Not yet: paired seeds so far " + ', '.join(
        f"{a} − {r} {len(comparison_gaps(results, phases, a, r))} of {len(needed(a, r))}"
        for a, r in waiting) + ".\n"
    if all(s is None for s in stats):
        return note
    means = ["| arm | peak LR | weight decay | seeds | full val loss, mean ± sd |",
             "|---|---|---|---|---|"]
    for arm in tested_arms(results, phases):
        losses = [results[r.name] for r in test_runs(phases, arm)]
        m, sd = report.mean_sd(losses)
        means.append(f"| {arm} | {test_runs(phases, arm)[0].lr:g} | {WD[arm]:g} | {len(losses)} "
                     f"| {m:.4f} ± {sd:.4f} |")
    rows = ["| comparison | seeds | paired gap, mean ± sd | interval (level) | t p (Holm) "
            "| sign-flip p | TOST ±0.3% p (Holm) | resolution | verdict |",
            "|---|---|---|---|---|---|---|---|---|"]
    rows += verdict_rows(*zip(*[(s, c) for s, c in zip(stats, COMPARISONS) if s is not None]))
    return '\n'.join(means) + '\n\n' + '\n'.join(rows) + (
        "\n\nResolution: the smallest gap this comparison's measured noise detects with 80% power "
        "at its level (the primary alone at 0.05; the secondaries at Holm's strictest, 0.025).\n"
        + ("\n" + note if note else ""))


def eval_series(root, run, key='val_loss'):
    return {e['iter']: e[key] for e in log_of(root, run) if key in e}


def trajectories(root, results, phases, arm, ref, seeds):
    """{seed: {step: paired gap % on the fixed val windows}} for the seeds both arms finished."""
    out = {}
    for a, b in zip(test_runs(phases, arm, seeds), test_runs(phases, ref, seeds)):
        if a.name in results and b.name in results and a.seed == b.seed:
            x, y = eval_series(root, a), eval_series(root, b)
            out[a.seed] = {k: 100 * (x[k] - y[k]) / y[k] for k in sorted(x) if k in y and k > 0}
    return out


def slope(points):
    """Least-squares slope of [(step, gap)], in % per 100 steps."""
    xs, ys = [p[0] / 100 for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def complete_trajectories(root, results, phases):
    """([(arm, ref, claim, {seed: {step: gap}})] of the comparisons with all their seeds, the
    rest as a 'Not yet' line or '')."""
    out, waiting = [], []
    for arm, ref, claim in COMPARISONS:
        series = trajectories(root, results, phases, arm, ref, needed(arm, ref))
        if len(series) < len(needed(arm, ref)):
            waiting.append(f"{claim} {arm} − {ref} {len(series)} of {len(needed(arm, ref))}")
        else:
            out.append((arm, ref, claim, series))
    return out, ("Not yet: paired seeds so far " + ", ".join(waiting) + ".\n" if waiting else "")


def trajectory_block(root, results, phases):
    comps, note = complete_trajectories(root, results, phases)
    if not comps:
        return note
    steps = sorted(next(iter(comps[0][3].values())))
    rows = ["| step | " + " | ".join(f"{c} {a} − {r}, mean [95% interval]" for a, r, c, _ in comps)
            + " |", "|---|" + "---|" * len(comps)]
    for step in steps:
        rows.append(f"| {step} | " + " | ".join(E.interval_cell([series[s][step] for s in series])
                                                for *_, series in comps) + " |")
    last = [k for k in steps if k >= steps[-1] * 2 / 3]
    rows.append(f"| slope over steps {last[0]}–{last[-1]}, per 100 steps | " + " | ".join(
        E.interval_cell([slope([(k, series[s][k]) for k in last]) for s in series])
        for *_, series in comps) + " |")
    return '\n'.join(rows) + '\n\n![the paired gap through the run](assets/v3_trajectory.png)\n' + (
        '\n' + note if note else '')


def longer_block(results, phases):
    long_runs = phases['longer']
    if not long_runs or any(r.name not in results for r in long_runs):
        done = sum(r.name in results for r in long_runs)
        return (f"Not yet: {done} of {len(PRIMARY) * len(LONG_SEEDS)} runs at {LONG_BUDGET:g}× "
                "have finished.\n")
    ref, arm = PRIMARY
    short = E.gaps_of(results, test_runs(phases, ref, LONG_SEEDS),
                      test_runs(phases, arm, LONG_SEEDS))
    longer = E.gaps_of(results, [r for r in long_runs if r.arm == ref],
                       [r for r in long_runs if r.arm == arm])
    rows = [f"| budget | paired gap {arm} − {ref}, mean [95% interval] | per seed |",
            "|---|---|---|"]
    for label, gaps in (("1×", short), (f"{LONG_BUDGET:g}×", longer)):
        rows.append(f"| {label} | {E.interval_cell(list(gaps.values()))} | " +
                    ", ".join(f"{s}: {E.pct(g)}" for s, g in sorted(gaps.items())) + " |")
    difference = E.interval_cell([longer[s] - short[s] for s in LONG_SEEDS])
    rows.append(f"| {LONG_BUDGET:g}× − 1× | {difference} | |")
    return '\n'.join(rows) + '\n'


def induction_curve(root, run):
    """{step: (strongest head's induction score, repeat loss)} of a committed run."""
    return {e['iter']: (max(max(layer) for layer in e['induction']), e['repeat_loss'])
            for e in log_of(root, run) if 'induction' in e}


def onset(curve):
    """The first evaluated step at which the strongest head passes the threshold, None if never."""
    return next((k for k in sorted(curve) if curve[k][0] >= INDUCTION_THRESHOLD), None)


def induction_arms(results, phases):
    """The arms with every one of the induction seeds finished: the reference first, or none."""
    done = [a for a in ARMS if len(test_runs(phases, a, SECONDARY_SEEDS)) == len(SECONDARY_SEEDS)
            and all(r.name in results for r in test_runs(phases, a, SECONDARY_SEEDS))]
    return done if ARMS[0] in done and len(done) > 1 else []


def induction_lag(on, ref_on):
    paired = [on[s] - ref_on[s] for s in on if on[s] is not None and ref_on[s] is not None]
    if len(paired) < 2:
        return "-"
    m, lo, hi = E.interval95(paired)
    return f"{m:+.0f} [{lo:+.0f}, {hi:+.0f}] steps (n = {len(paired)})"


def induction_block(root, results, phases):
    seeds, arms = SECONDARY_SEEDS, induction_arms(results, phases)
    rest = [a for a in ARMS if a not in arms]
    note = f"Not yet: {', '.join(rest)} need test seeds {seeds[0]}–{seeds[-1]}.\n" if rest else ""
    if not arms:
        return note
    curves = {a: {r.seed: induction_curve(root, r) for r in test_runs(phases, a, seeds)}
              for a in arms}
    ref_on = {s: onset(c) for s, c in curves[ARMS[0]].items()}
    rows = [f"| arm | step the strongest head passes {INDUCTION_THRESHOLD} (mean; per seed) "
            "| its largest score in the run | its score at the end | repeat loss at the end "
            "| onset − baseline's, mean [95% interval] |", "|---|---|---|---|---|---|"]
    for arm in arms:
        on = {s: onset(c) for s, c in curves[arm].items()}
        end = [c[max(c)] for c in curves[arm].values()]
        peak = max(v[0] for c in curves[arm].values() for v in c.values())
        hit = [v for v in on.values() if v is not None]
        mean_on = f"{sum(hit) / len(hit):.0f}" if hit else "never"
        lag = "(reference)" if arm == ARMS[0] else induction_lag(on, ref_on)
        rows.append(f"| {arm} | {mean_on}; " + ", ".join(str(on[s]) if on[s] else "never"
                                                          for s in seeds) +
                    f" | {peak:.3f} | {sum(e[0] for e in end) / len(end):.3f} "
                    f"| {sum(e[1] for e in end) / len(end):.3f} | {lag} |")
    return '\n'.join(rows) + ('\n\n![induction score and repeat loss through the run]'
                              '(assets/v3_induction.png)\n') + ('\n' + note if note else '')


def dtype_block(root, results, phases):
    bf16 = phases['dtype']
    fp32 = test_runs(phases, DTYPE_ARM, DTYPE_SEEDS)
    if not bf16 or any(r.name not in results for r in bf16 + fp32):
        return (f"Not yet: {sum(r.name in results for r in bf16)} of {len(DTYPE_SEEDS)} bf16 runs "
                "have finished.\n")
    step_ms = lambda runs: sorted(e['dt_ms'] for r in runs for e in log_of(root, r)
                                  if e.get('dt_ms'))
    med = {k: v[len(v) // 2] for k, v in (('fp32', step_ms(fp32)), ('bf16', step_ms(bf16)))}
    gaps = E.gaps_of(results, fp32, bf16)
    return (f"| | float32 | bf16 autocast |\n|---|---|---|\n"
            f"| median step time (ms, every logged step of "
            f"{len(DTYPE_SEEDS)} runs) | {med['fp32']:.1f} | {med['bf16']:.1f} |\n"
            f"| full val loss, mean | {sum(results[r.name] for r in fp32) / len(fp32):.4f} | "
            f"{sum(results[r.name] for r in bf16) / len(bf16):.4f} |\n\n"
            f"Paired difference bf16 − fp32 ({DTYPE_ARM}, "
            f"seeds {DTYPE_SEEDS[0]}–{DTYPE_SEEDS[-1]}): "
            f"{E.interval_cell(list(gaps.values()))} (95%).\n")


def stability_word(root, results):
    """Claim (iii)'s cell: per arm, the largest LR with no spike once its LRs have all finished."""
    grid, words = stability_rows(root, results), []
    for arm in ARMS:
        mine = [r for r in grid if r['arm'] == arm]
        if not mine or any(None in r['states'] for r in mine):
            words.append(f"{arm} not yet")
            continue
        _, lr, clean = stability_summary(mine)
        words.append(f"{arm} {'none' if lr is None else f'{lr:g}'}{'+' if clean else ''}")
    return "; ".join(words)


def claims_block(root, results, phases):
    stats = verdict_stats(results, phases)
    rows = ["| claim | tested here as | verdict | resolution |", "|---|---|---|---|"]
    texts = {'(i)': "the reduced model matches the baseline",
             '(ii)': "reduced_mlp beats the baseline",
             '(iv)': "the reduced model beats the parameter-matched baseline_small_mlp"}
    for s, (arm, ref, claim) in zip(stats, COMPARISONS):
        verdict = "not yet" if s is None else f"**{s['verdict']}** ({E.pct(s['mean'])})"
        res = "" if s is None else f"{s['mde']:.2f}% (n = {s['n']})"
        rows.append(f"| {claim} {texts[claim]} | {arm} − {ref}, paired full val loss "
                    f"| {verdict} | {res} |")
    rows.insert(4, "| (iii) it trains stably at 3× lower weight decay | the largest peak LR with "
                   "no spike on the tuning grid and above it, each arm at its paper λ "
                   "| descriptive: "
                   f"{stability_word(root, results)} | the √2 grid |")
    return '\n'.join(rows) + ("\n\n(iii): `+` marks an arm none of whose runs spiked: its "
                              "largest LR is a lower bound.\n")


def blocks(root):
    """{block name: markdown} for v3's generated blocks of the docs, from the committed logs."""
    results, phases = committed(root)
    return dict(v3_tuning=tuning_block(root, results), v3_stability=stability_block(root, results),
                v3_verdict=verdict_block(results, phases),
                v3_trajectory=trajectory_block(root, results, phases),
                v3_longer=longer_block(results, phases),
                v3_induction=induction_block(root, results, phases),
                v3_dtype=dtype_block(root, results, phases),
                v3_claims=claims_block(root, results, phases))


# -----------------------------------------------------------------------------
# figures

def write_figures(root, folder):
    """Each figure once its runs are committed: stability (as the tuning goes), trajectory,
    induction."""
    results, phases = committed(root)
    rows = [r for r in stability_rows(root, results) if None not in r['losses']]
    if rows:
        stability_figure(rows, os.path.join(folder, 'v3_stability.png'))
    comps = complete_trajectories(root, results, phases)[0]
    if comps:
        trajectory_figure(comps, os.path.join(folder, 'v3_trajectory.png'))
    arms = induction_arms(results, phases)
    if arms:
        induction_figure(root, phases, arms, os.path.join(folder, 'v3_induction.png'))


def stability_figure(rows, path):
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    diverged = []
    for i, arm in enumerate(ARMS):
        mine = [r for r in rows if r['arm'] == arm]
        color = report.variant_color(arm, i)
        for r in mine:
            for loss, state in zip(r['losses'], r['states']):
                if math.isfinite(loss):
                    ax.scatter(r['lr'], loss, color=color, marker='x' if state else 'o', s=18,
                               alpha=0.7)
                else:
                    diverged.append((r['lr'], color))
        finite = [r for r in mine if math.isfinite(r['mean'])]
        ax.plot([r['lr'] for r in finite], [r['mean'] for r in finite], color=color, label=arm)
    top = ax.get_ylim()[1]
    for lr, color in diverged:  # a diverged run has no loss: a triangle on the top edge
        ax.scatter(lr, top, color=color, marker='^', s=30, clip_on=False)
    ax.set(xscale='log', xlabel='peak LR', ylabel='full val loss', ylim=(None, top),
           title='every selection seed (x: spiked, ▲ on the top edge: diverged), line: the mean')
    ax.legend(fontsize=8)
    report.save_figure(fig, path)


def trajectory_figure(comps, path):
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (arm, ref, claim, series) in enumerate(comps):
        steps = sorted(next(iter(series.values())))
        stats = [E.interval95([series[s][k] for s in series]) for k in steps]
        color = report.variant_color(arm, i) if ref == 'baseline' else 'grey'
        ax.plot(steps, [m for m, _, _ in stats], color=color, marker='.',
                label=f"{claim} {arm} − {ref}")
        ax.fill_between(steps, [lo for _, lo, _ in stats], [hi for _, _, hi in stats], color=color,
                        alpha=0.15)
    ax.axhline(0, color='black', lw=0.8)
    ax.set(xlabel='step', ylabel='paired gap on the fixed val windows (%)',
           title='the paired gap through the run (mean, 95% interval)')
    ax.legend(fontsize=8)
    report.save_figure(fig, path)


def induction_figure(root, phases, arms, path):
    plt = report.pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True)
    for i, arm in enumerate(arms):
        curves = [induction_curve(root, r) for r in test_runs(phases, arm, SECONDARY_SEEDS)]
        steps = sorted(curves[0])
        color = report.variant_color(arm, i)
        top.plot(steps, [sum(c[k][0] for c in curves) / len(curves) for k in steps], color=color,
                 label=arm)
        bottom.plot(steps, [sum(c[k][1] for c in curves) / len(curves) for k in steps], color=color)
    top.axhline(INDUCTION_THRESHOLD, color='black', lw=0.6, ls=':')
    top.set(ylabel='strongest head\'s induction score', title=f'induction probe, mean of seeds '
            f'{SECONDARY_SEEDS[0]}–{SECONDARY_SEEDS[-1]}')
    bottom.set(xlabel='step', ylabel='loss on the repeated half')
    top.legend(fontsize=8)
    report.save_figure(fig, path)
