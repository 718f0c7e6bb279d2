"""
The tables of experiment v2 (lab/studies/v2.py) and of the modern block's pilot: v2 tunes weight
decay and LR on one seed, compares every arm with the first, and checks the trend over budgets,
the init geometry and the LR grid's resolution.
"""
import math
import os

from lab import markdown as md, plan as S, stats
from lab.tables import fmt_p, gap_cells, interval_cell, pct


def wd_lr_tuning_table(ctx, arms):
    """Every tuning run (weight decay at the starting LR, then LR), the selection, and whether
    each optimum is bracketed."""
    rows = md.head('arm', 'peak LR', 'weight decay', 'full val loss', '')
    lr_start = ctx.s.tuning['lr_start']
    for arm in arms:
        runs, chosen = ctx.tuning_runs(arm), ctx.plan.chosen.get(arm)
        for r in runs:
            loss = ctx.results.get(r.name)
            mark = "**selected**" if chosen == (r.lr, r.wd) else ""
            cell = '-' if loss is None else f'{loss:.4f}'
            rows.append(f"| {arm} | {r.lr:g} | {r.wd:g} | {cell} | {mark} |")
        if chosen is not None:
            lrs = {r.lr for r in runs if r.wd == chosen[1]}
            wds = {r.wd for r in runs if r.lr == lr_start}
            edges = [n for n, v, grid in (('LR', chosen[0], lrs), ('weight decay', chosen[1], wds))
                     if v in (min(grid), max(grid)) and v != 0]
            word = 'on the edge: ' + ', '.join(edges) if edges else 'bracketed'
            edge = ' (weight decay 0: the edge of its domain)' if chosen[1] == 0 else ''
            rows.append(f"| {arm} | | | | {word}{edge} |")
    return '\n'.join(rows) + '\n'


def arm_verdicts_table(ctx, arms, seeds, margin=stats.MARGIN):
    """Every arm against the first on the test seeds, Holm across the comparisons."""
    if any(a not in ctx.plan.chosen for a in arms):
        return "Not yet: the test runs are named once every arm's tuning has finished.\n"
    gap_sets = [ctx.gaps(arm, arms[0], seeds) for arm in arms[1:]]
    if any(len(g) < len(seeds) for g in gap_sets):
        done = sum(len(ctx.done(a, seeds)) for a in arms)
        return f"Not yet: {done} of {len(arms) * len(seeds)} test runs have finished.\n"
    found = stats.compare([list(g.values()) for g in gap_sets], margin)
    rows = md.head('arm', 'peak LR', 'weight decay', 'full val loss, mean ± sd',
                   'paired gap, mean ± sd', 'interval (level)', 't p (Holm)', 'sign-flip p',
                   'TOST ±0.3% p (Holm)', 'verdict')
    for i, arm in enumerate(arms):
        runs = ctx.done(arm, seeds)
        m, sd = stats.mean_sd(ctx.loss(r) for r in runs)
        head = (f"| {arm} | {runs[0].lr:g} | {runs[0].wd:g} | {m:.4f} ± {sd:.4f} "
                f"({100 * sd / m:.2f}%) |")
        if i == 0:
            rows.append(head + " (reference) | | | | | |")
            continue
        r = found[i - 1]
        flag = " (t and sign-flip disagree at 0.05)" if r['flag'] else ""
        rows.append(f"{head} {gap_cells(r)} | {fmt_p(r['p_perm'])} "
                    f"| {fmt_p(r['p_tost'])} ({fmt_p(r['p_tost_holm'])}) "
                    f"| **{r['verdict']}**{flag} |")
    noise = '; '.join(f"{arm} {found[i]['mde']:.2f}%" for i, arm in enumerate(arms[1:]))
    return '\n'.join(rows) + (f"\n\nThe smallest gap this noise detects with 80% power "
                              f"(n = {len(seeds)}, at the level 0.05/{len(arms) - 1}): "
                              f"{noise}.\n")


def seed_slopes(ctx, pair, budgets, seeds):
    """Per seed: [(tokens, gap %)] over the budgets and the full run, and the least-squares slope
    of the gap per doubling of tokens."""
    base = S.base_config(ctx.s)
    tokens_full = S.tokens(base)
    series = {}
    for b in (*budgets, 1.0):
        for seed, g in ctx.gaps(pair[1], pair[0], seeds, budget=b).items():
            series.setdefault(seed, []).append((round(tokens_full * b), g))
    slopes = {}
    for seed, points in series.items():
        if len(points) == len(budgets) + 1:
            slopes[seed] = stats.slope([math.log2(t) for t, _ in points], [g for _, g in points])
    return series, slopes


def trend_table(ctx, pair, budgets, seeds, figure):
    series, slopes = seed_slopes(ctx, pair, budgets, seeds)
    if len(slopes) < len(seeds):
        return f"Not yet: {len(slopes)} of {len(seeds)} seeds have all three budgets.\n"
    rows = md.head('tokens', f'paired gap {pair[1]} − {pair[0]}, mean [95% interval]')
    for i, (tokens, _) in enumerate(series[seeds[0]]):
        rows.append(f"| {tokens:,} | {interval_cell([series[s][i][1] for s in seeds])} |")
    rows.append(f"| slope per doubling of tokens | {interval_cell(list(slopes.values()))} |")
    return '\n'.join(rows) + f'\n\n![the paired gap against the budget]({figure})\n'


def geometry_gaps(ctx, pair, seeds, init_std):
    """({seed: gap %} at init_std, the same at the base's init std) on the seeds."""
    return (ctx.gaps(pair[1], pair[0], seeds, init_std=init_std),
            ctx.gaps(pair[1], pair[0], seeds))


def geometry_table(ctx, pair, seeds, init_std, figure):
    wide, std = geometry_gaps(ctx, pair, seeds, init_std)
    if len(wide) < len(seeds) or len(std) < len(seeds):
        return f"Not yet: {len(wide)} of {len(seeds)} seeds at init_std {init_std:g}.\n"
    base = S.base_config(ctx.s)
    rows = md.head('init_std', 'σ·√d', f'paired gap {pair[1]} − {pair[0]}, mean [95% interval]')
    for value, gaps in ((base['init_std'], std), (init_std, wide)):
        rows.append(f"| {value:g} | {value * base['n_embd'] ** 0.5:.2f} "
                    f"| {interval_cell(list(gaps.values()))} |")
    m, lo, hi = stats.interval95([wide[s] - std[s] for s in seeds])
    word = ("depends on the init geometry" if lo > 0 or hi < 0
            else "no dependence on the init geometry detected")
    rows.append(f"| difference | | {pct(m)} [{pct(lo)}, {pct(hi)}]: **{word}** |")
    return '\n'.join(rows) + f'\n\n![the paired gap at two init geometries]({figure})\n'


def refine_table(ctx, arms, seed, factors):
    """The LR grid's resolution: each arm at its selected LR and its neighbours on seed."""
    named = [S.Run(a, S.grid_value(ctx.plan.chosen[a][0] * f), ctx.plan.chosen[a][1], seed)
             for a in arms if a in ctx.plan.chosen for f in factors]
    done = [r for r in named if r.name in ctx.results]
    if not named or len(done) < len(factors) * len(arms):
        return f"Not yet: {len(done)} of {len(factors) * len(arms)} runs have finished.\n"
    rows = md.head('arm', 'weight decay', 'loss at LR ÷√2, selected, ×√2',
                   'best on the finer grid', 'gain', f'gap to {arms[0]}: selected → finer best')
    best, moved = {}, []
    for arm in arms:
        lr, wd = ctx.plan.chosen[arm]
        runs = sorted([S.Run(arm, lr, wd, seed)] + [r for r in named if r.arm == arm],
                      key=lambda r: r.lr)
        losses = {r.lr: ctx.loss(r) for r in runs}
        top = min(losses, key=losses.get)
        best[arm] = (losses[lr], losses[top])
        if top != lr:
            moved.append(arm)
        gaps = "(reference)" if arm == arms[0] else ' → '.join(
            pct(100 * (best[arm][i] - best[arms[0]][i]) / best[arms[0]][i]) for i in (0, 1))
        grid = ', '.join(f"{v:g}: {losses[v]:.4f}" for v in losses)
        rise = pct(100 * (losses[top] - losses[lr]) / losses[lr])
        rows.append(f"| {arm} | {wd:g} | {grid} | {top:g} | {rise} | {gaps} |")
    verdict = (f"**grid-sensitive**: {', '.join(moved)}" if moved
               else "no arm's best moves on the finer grid")
    return '\n'.join(rows) + f"\n\n{verdict}.\n"


def diagnostics_note(ctx, arms, seed, figure):
    done = [a for a in arms if ctx.done(a, (seed,))]
    if len(done) < len(arms):
        return f"Not yet: {len(done)} of {len(arms)} arms have finished test seed {seed}.\n"
    return (f"Test seed {seed}, every arm at its selected settings (one line per layer, "
            f"darker = deeper):\n\n![attention and weight diagnostics]({figure})\n")


def pilot_table(ctx, folder):
    """The modern block's pilot: final full val loss of baseline and reduced, with and without
    config/modern.py, per seed, and modern − plain per seed (runs named <arm>[_modern]_s<seed>)."""
    folder = os.path.join(ctx.root, folder)
    runs = {n: S.final_loss(os.path.join(folder, n)) for n in sorted(os.listdir(folder))} \
        if os.path.isdir(folder) else {}
    if not runs:
        return "Not yet: no pilot run is committed.\n"
    seeds = sorted({int(n.rsplit('_s', 1)[1]) for n in runs})
    rows = md.head('arm', 'seed', 'learned positions', 'RoPE + QK-norm', 'modern − plain')
    fmt = lambda x: '-' if x is None else f"{x:.4f}"
    for arm in ('baseline', 'reduced'):
        for s in seeds:
            plain, modern = runs.get(f'{arm}_s{s}'), runs.get(f'{arm}_modern_s{s}')
            both = plain is not None and modern is not None
            diff = pct(100 * (modern - plain) / plain) if both else '-'
            rows.append(f"| {arm} | {s} | {fmt(plain)} | {fmt(modern)} | {diff} |")
    return '\n'.join(rows) + '\n'


TABLES = dict(wd_lr_tuning=wd_lr_tuning_table, arm_verdicts=arm_verdicts_table,
              trend=trend_table, geometry=geometry_table, refine=refine_table,
              diagnostics_note=diagnostics_note, pilot=pilot_table)
