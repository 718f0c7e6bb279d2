"""
A study's figures, from its committed logs alone: each one a kind below with the parameters the
study file's `figures` gives it (and its path). A kind draws nothing and returns None until its
runs are committed. Colours are the variants' own (lab/report.py's variant_color).
"""
import math

from lab import plan as S, report, stats, tables
from lab.tables import geometry_gaps, seed_slopes


def seeds_and_mean(ax, lines, xs, values, color):
    """Each seed's line in grey, the mean over seeds at each x with its 95% interval, and the
    zero line; returns the (mean, low, high) at each x."""
    for points in lines:
        ax.plot(*zip(*points), color='grey', alpha=0.5, lw=0.8, marker='.')
    found = [stats.interval95(v) for v in values]
    ax.errorbar(xs, [m for m, _, _ in found],
                yerr=[[m - lo for m, lo, _ in found], [hi - m for m, _, hi in found]],
                color=color, marker='o', capsize=4,
                label="mean over seeds, 95% interval (grey: each seed)")
    ax.axhline(0, color='black', lw=0.8)
    return found


def trend_figure(ctx, path, pair, budgets, seeds):
    series, slopes = seed_slopes(ctx, pair, budgets, seeds)
    if len(slopes) < len(seeds):
        return None
    fig, ax = report.pyplot().subplots(figsize=(7, 4.5))
    points = list(zip(*[series[s] for s in seeds]))
    seeds_and_mean(ax, [series[s] for s in seeds], [p[0][0] for p in points],
                   [[g for _, g in p] for p in points], report.variant_color(pair[1]))
    ax.set(xscale='log', xlabel='tokens', ylabel=f'{pair[1]} − {pair[0]} (% of val loss)',
           title='paired gap against the budget')
    ax.legend(fontsize=8)
    report.save_figure(fig, path)
    return True


def geometry_figure(ctx, path, pair, seeds, init_std):
    wide, std = geometry_gaps(ctx, pair, seeds, init_std)
    if not len(wide) == len(std) == len(seeds):
        return None
    base_std = 0.02
    fig, ax = report.pyplot().subplots(figsize=(6, 4.5))
    for i, seed in enumerate(seeds):
        ax.plot([base_std, init_std], [std[seed], wide[seed]],
                color=report.variant_color(pair[1]), marker='o', alpha=0.7,
                label=None if i else f"one line per test seed ({len(seeds)})")
    ax.axhline(0, color='black', lw=0.8)
    ax.set(xticks=[base_std, init_std], xlabel='init_std', ylabel=f'{pair[1]} − {pair[0]} (%)',
           title='paired gap at two init geometries')
    ax.legend(fontsize=8)
    report.save_figure(fig, path)
    return True


def diagnostics_figure(ctx, path, arms, seed):
    runs = [r for a in arms for r in ctx.done(a, (seed,))]
    if len(runs) < len(arms):
        return None
    report.plot_diagnostics([dict(report.read_run(ctx.folders[r.name]), name=r.name)
                             for r in runs], path)
    return True


def stability_figure(ctx, path, arms):
    rows = [r for r in tables.stability_rows(ctx, arms) if None not in r['losses']]
    if not rows:
        return None
    fig, ax = report.pyplot().subplots(figsize=(7, 4.5))
    diverged = []
    for i, arm in enumerate(arms):
        mine, color = [r for r in rows if r['arm'] == arm], report.variant_color(arm, i)
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
    return True


def trajectory_figure(ctx, path, comparisons):
    comps = tables.complete_trajectories(ctx, comparisons)[0]
    if not comps:
        return None
    fig, ax = report.pyplot().subplots(figsize=(7, 4.5))
    used = []
    for i, (c, series) in enumerate(comps):
        steps = sorted(next(iter(series.values())))
        found = [stats.interval95([series[s][k] for s in series]) for k in steps]
        color = report.variant_color(c['arm'], i) if c['ref'] == 'baseline' else 'grey'
        color = f"C{i % 10}" if color in used else color  # two pairs of one variant: tell apart
        used.append(color)
        ax.plot(steps, [m for m, _, _ in found], color=color, marker='.',
                label=tables.pair_name(c))
        ax.fill_between(steps, [lo for _, lo, _ in found], [hi for _, _, hi in found],
                        color=color, alpha=0.15)
    ax.axhline(0, color='black', lw=0.8)
    ax.set(xlabel='step', ylabel='paired gap on the fixed val windows (%)',
           title='the paired gap through the run (mean, 95% interval)')
    ax.legend(fontsize=8)
    report.save_figure(fig, path)
    return True


def seed_gaps_figure(ctx, path, comparison):
    """The paired gap against the step seed by seed (left), and each seed's final gap against
    its arm's strongest induction head minus its reference's (right)."""
    c = comparison
    series = tables.trajectories(ctx, c['arm'], c['ref'], c['seeds'])
    if len(series) < len(c['seeds']):
        return None
    fig, (left, right) = report.pyplot().subplots(1, 2, figsize=(12, 4.5))
    for i, (seed, gap) in enumerate(sorted(series.items())):
        steps = sorted(gap)
        left.plot(steps, [gap[k] for k in steps], color=f"C{i % 10}", lw=1, label=str(seed))
        ends = [tables.induction_curve(ctx.log(ctx.at(a, seed))) for a in (c['ref'], c['arm'])]
        score = ends[1][max(ends[1])][0] - ends[0][max(ends[0])][0]
        final = 100 * (ctx.loss(ctx.at(c['arm'], seed)) - ctx.loss(ctx.at(c['ref'], seed))) \
            / ctx.loss(ctx.at(c['ref'], seed))
        right.scatter([score], [final], color=f"C{i % 10}")
        right.annotate(str(seed), (score, final), fontsize=8, xytext=(3, 3),
                       textcoords='offset points')
    for ax in (left, right):
        ax.axhline(0, color='black', lw=0.8)
    left.set(xlabel='step', ylabel='paired gap on the fixed val windows (%)',
             title=f"{tables.pair_name(c)}, seed by seed")
    left.legend(fontsize=7, ncol=2)
    right.set(xlabel=f"strongest induction head at the end, {c['arm']} minus {c['ref']}",
              ylabel='paired gap in full val loss at the end (%)', title='the gap and induction')
    report.save_figure(fig, path)
    return True


def induction_figure(ctx, path, arms, seeds, threshold):
    done = tables.induction_arms(ctx, arms, seeds)
    if not done:
        return None
    fig, (top, bottom) = report.pyplot().subplots(2, 1, figsize=(7, 6.5), sharex=True)
    for i, arm in enumerate(done):
        curves = [tables.induction_curve(ctx.log(r)) for r in ctx.done(arm, seeds)]
        steps, color = sorted(curves[0]), report.variant_color(arm, i)
        top.plot(steps, [sum(c[k][0] for c in curves) / len(curves) for k in steps], color=color,
                 label=arm)
        bottom.plot(steps, [sum(c[k][1] for c in curves) / len(curves) for k in steps],
                    color=color)
    top.axhline(threshold, color='black', lw=0.6, ls=':')
    top.set(ylabel='strongest head\'s induction score',
            title=f'induction probe, mean of seeds {seeds[0]}–{seeds[-1]}')
    bottom.set(xlabel='step', ylabel='loss on the repeated half')
    top.legend(fontsize=8)
    report.save_figure(fig, path)
    return True


def lag_figure(ctx, path, comparisons, levels):
    """The step lag against the loss level, one line per comparison (mean, 95% interval)."""
    drawn = [(c, tables.complete_lags(ctx, c, levels)) for c in comparisons]
    drawn = [(c, lags) for c, lags in drawn if lags is not None]
    if not drawn:
        return None
    fig, ax = report.pyplot().subplots(figsize=(10.5, 4.8))
    for i, (c, lags) in enumerate(drawn):
        shown = [lv for lv in levels if lv in lags]
        found = [stats.interval95(list(lags[lv].values())) for lv in shown]
        color = f'C{i % 10}'  # the arms share variants: one colour per comparison
        ax.plot(shown, [m for m, _, _ in found], marker='o', ms=3, color=color,
                label=tables.pair_name(c))
        ax.fill_between(shown, [lo for _, lo, _ in found], [hi for _, _, hi in found],
                        color=color, alpha=0.12)
    ax.axhline(0, color='black', lw=0.8, label='no lag')
    ax.set(xlabel='fixed-window val loss reached (falls to the right)', ylabel='steps later',
           title='the step lag at each loss (mean over paired seeds, 95% interval)')
    ax.invert_xaxis()
    ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1))  # beside the lines, not over
    report.save_figure(fig, path)
    return True


def logits_figure(ctx, path, arms, seeds, lag):
    """Each arm's attention-logit std (top row) and normalised entropy (bottom row) against the
    step, one column per layer (means over its seeds), and beside them the step lag of each
    comparison in `lag`."""
    done = [a for a in arms if len(ctx.done(a, seeds)) == len(seeds)]
    if not done:
        return None
    first = ctx.log(ctx.done(done[0], seeds)[0])
    layers = len(next(e for e in first if 'diagnostics' in e)['diagnostics']['logit_std'])
    colors = {arm: f'C{i % 10}' for i, arm in enumerate(arms)}  # one per arm, in both panels
    fig = report.pyplot().figure(figsize=(3.4 * (layers + 1), 7))
    grid = fig.add_gridspec(2, layers + 1)
    for row, (key, what) in enumerate((('logit_std', 'attention-logit std (after the scale)'),
                                       ('entropy_norm', 'attention entropy / ln t'))):
        for layer in range(layers):
            ax = fig.add_subplot(grid[row, layer])
            for arm in done:
                steps = sorted(e['iter'] for e in ctx.log(ctx.done(arm, seeds)[0])
                               if 'diagnostics' in e)
                ax.plot(steps, [tables.diag_mean(ctx, arm, seeds, k, key, layer) for k in steps],
                        color=colors[arm], label=arm)
            ax.set(xlabel='step', title=f'layer {layer}: {what}')
            ax.title.set_fontsize(8)
            ax.grid(alpha=0.3)
            if row == 0 and layer == 0:
                ax.legend(fontsize=7)
    lag_panel(ctx, fig.add_subplot(grid[:, layers]), lag['comparisons'], lag['levels'], colors)
    report.save_figure(fig, path)
    return True


def lag_panel(ctx, ax, comparisons, levels, colors):
    """The mean step lag of each comparison whose seeds have all finished, in its arm's
    colour."""
    for c in comparisons:
        lags = tables.complete_lags(ctx, c, levels)
        if lags is None:
            continue
        shown = [lv for lv in levels if lv in lags]
        ax.plot(shown, [sum(lags[lv].values()) / len(lags[lv]) for lv in shown], marker='o',
                ms=3, color=colors[c['arm']], label=f"{c['arm']} − {c['ref']}")
    ax.axhline(0, color='black', lw=0.8)
    ax.invert_xaxis()
    ax.set(xlabel='fixed-window val loss reached', ylabel='steps later',
           title='the step lag (mean over seeds)')
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def budgets_figure(ctx, path, comparisons, references, params, paper=440):
    """The paired gap against tokens per parameter: each annealed budget (mean and 95% interval)
    and v3's unannealed 1x on the same seeds, with the paper's tokens per parameter marked. No
    line is drawn through the points: two budgets are not a trend to extrapolate."""
    base = S.base_config(ctx.s)
    points = []
    for c in references + comparisons:
        gaps = ctx.gaps(c['arm'], c['ref'], c['seeds'])
        if len(gaps) == len(c['seeds']):
            tokens = S.tokens(tables.schedule_of(ctx, c['arm'], base))
            points.append((c, tokens / params, stats.interval95(list(gaps.values()))))
    if not any(c in comparisons for c, _, _ in points):
        return None
    fig, ax = report.pyplot().subplots(figsize=(7.5, 4.6))
    for c, x, (m, lo, hi) in points:
        annealed = c in comparisons  # a reference shares its budget's x: drawn just left of it
        ax.errorbar([x if annealed else x / 1.08], [m], yerr=[[m - lo], [hi - m]], capsize=4,
                    marker='o' if annealed else 's', color='C0' if annealed else 'grey',
                    label=c['label'] + ('' if annealed else ' (drawn just left of its budget)'))
    ax.axvline(paper, color='black', ls=':', lw=1,
               label=f"the paper's runs: ~{paper} GPT-2 BPE tokens per parameter")
    ax.axhline(0, color='black', lw=0.8)
    ax.set(xscale='log', xlabel="byte tokens per baseline parameter", xlim=(1, 1000),
           ylabel='reduced − baseline, full val loss (%)',
           title='the paired gap at the end of each budget (95% interval)')
    ax.legend(fontsize=7)
    report.save_figure(fig, path)
    return True


def onset_gaps_figure(ctx, path, comparison, threshold):
    """One panel a seed: the paired gap on the fixed val windows against the step, with the
    reference's induction onset (solid) and the arm's (dashed) at threshold."""
    c = comparison
    series = tables.trajectories(ctx, c['arm'], c['ref'], c['seeds'])
    if len(series) < len(c['seeds']):
        return None
    cols = 5
    rows = math.ceil(len(series) / cols)
    fig, axes = report.pyplot().subplots(rows, cols, figsize=(3 * cols, 2.6 * rows), sharex=True,
                                         sharey=True, squeeze=False)
    for ax, (seed, gap) in zip(axes.flat, sorted(series.items())):
        steps = sorted(gap)
        ax.plot(steps, [gap[k] for k in steps], color='C0', lw=1)
        ax.axhline(0, color='black', lw=0.6)
        for run, style in ((ctx.at(c['ref'], seed), '-'), (ctx.at(c['arm'], seed), '--')):
            on = tables.onset(tables.induction_curve(ctx.log(run)), threshold)
            if on is not None:
                ax.axvline(on, color='C3', lw=1, ls=style)
        ax.set_title(f"seed {seed}", fontsize=9)
    for ax in list(axes.flat)[len(series):]:
        ax.axis('off')
    for ax in axes[-1]:
        ax.set_xlabel('step')
    for ax in axes[:, 0]:
        ax.set_ylabel('paired gap (%)')
    fig.suptitle(f"{tables.pair_name(c)}: the gap on the fixed val windows; induction onset at "
                 f"{threshold:g}, {c['ref']} solid, {c['arm']} dashed", fontsize=10)
    report.save_figure(fig, path)
    return True


def wsd_gaps_figure(ctx, path, pair, seeds, budgets, steps_1x, fit):
    """The paired gap against the tokens, each seed a grey line, the mean with its 95% interval,
    and the trend table's line over the `fit` budgets (the seeds that have every one of them)."""
    series = {b: tables.wsd_gaps(ctx, pair, seeds, b * steps_1x) for b in budgets}
    if any(len(g) < 2 for g in series.values()):
        return None
    config = ctx.config(tables.wsd_run(ctx, pair[1], next(iter(series[budgets[0]])), budgets[0]
                                       * steps_1x))
    tokens = {b: S.tokens(dict(config, max_iters=b * steps_1x)) for b in budgets}
    fig, ax = report.pyplot().subplots(figsize=(7, 4.5))
    lines = [[(tokens[b], series[b][seed]) for b in budgets if seed in series[b]]
             for seed in seeds]
    seeds_and_mean(ax, lines, [tokens[b] for b in budgets],
                   [list(series[b].values()) for b in budgets], report.variant_color(pair[0]))
    # The line is the trend table's: fitted over the seeds that have every budget of the fit, so
    # that its slope is the table's mean slope while seeds are still coming in.
    fitted, slopes = tables.wsd_slopes(ctx, pair, seeds, fit, steps_1x)
    if fitted:
        xs = [math.log2(b) for b in fit]
        means = [sum(g[i] for g in fitted.values()) / len(fitted) for i in range(len(fit))]
        b, mean_x = sum(slopes.values()) / len(slopes), sum(xs) / len(xs)
        line = [sum(means) / len(means) + b * (x - mean_x) for x in xs]
        ax.plot([tokens[f] for f in fit], line, color='black', ls='--', lw=1,
                label=f"fitted over {fit[0]:g}×–{fit[-1]:g}× ({len(fitted)} seeds with every "
                      f"budget): {b:+.2f} points per doubling")
    ax.set(xscale='log', xlabel='byte tokens', ylabel=f'{pair[0]} − {pair[1]} (% of val loss)',
           title='paired gap against the tokens: cooldown branches of one WSD run per seed')
    ax.legend(fontsize=8)
    report.save_figure(fig, path)
    return True


FIGURES = dict(wsd_gaps=wsd_gaps_figure, seed_gaps=seed_gaps_figure, trend=trend_figure,
               geometry=geometry_figure,
               diagnostics=diagnostics_figure,
               stability=stability_figure, trajectory=trajectory_figure,
               induction=induction_figure, lag=lag_figure, logits=logits_figure,
               budgets=budgets_figure, onset_gaps=onset_gaps_figure)
