"""
A study's tables, from its committed logs alone: each generated block of its docs is a kind of
table (lab/docs.py names them) with the parameters the study file's `tables` gives it, grouped
here by what they show. A block says "Not yet" until the runs it needs are committed. The
Context below reads a study's committed runs once; the figures use it too.
"""
import math
import os

from kvgpt.files import read_json, read_jsonl
from lab import markdown as md, plan as S, stats
from model import GPTConfig
from train import get_lr


# -----------------------------------------------------------------------------
# a study's committed runs, read once, and the cells every table formats

class Context:
    """A study's committed results, its plan given them, and each run's log read once."""

    def __init__(self, s, root):
        self.s, self.root = s, root
        self.results, self.folders = S.results_of(s, root)
        self.plan = S.plan(s, self.results)
        self.logs = {}

    def log(self, run):
        if run.name not in self.logs:
            self.logs[run.name] = read_jsonl(S.log_file(self.folders[run.name]))
        return self.logs[run.name]

    def loss(self, run):
        return None if run is None else self.results.get(run.name)

    def config(self, run):
        """The settings a committed run trained with (its config.json)."""
        path = os.path.join(self.folders[run.name], 'config.json')
        return read_json(path, "a run's config.json")

    def at(self, arm, seed, **extra):
        """The arm's run at its selected (or fixed) LR on seed; None while it is tuning."""
        if arm not in self.plan.chosen:
            return None
        lr, wd = self.plan.chosen[arm]
        return S.Run(arm, lr, wd, seed, **extra)

    def done(self, arm, seeds, **extra):
        """The arm's runs at its selected LR on seeds that are committed."""
        runs = [self.at(arm, s, **extra) for s in seeds]
        return [r for r in runs if r is not None and r.name in self.results]

    def gaps(self, arm, ref, seeds, **extra):
        """{seed: paired gap in %} for the seeds both have (stats.paired_gaps)."""
        return stats.paired_gaps({s: self.loss(self.at(arm, s, **extra)) for s in seeds},
                                 {s: self.loss(self.at(ref, s, **extra)) for s in seeds})

    def tuning_runs(self, arm):
        return S.tune(self.s, arm, self.results, self.plan.chosen)[0]

    def climb_lrs(self, arm):
        lrs = [lr for phase in self.s.phases if phase['kind'] == 'climb'
               and arm in phase['arms'] for lr in S.climb_lrs(self.s, phase, arm, self.results)]
        return sorted(set(lrs))

    def warmup(self):
        return S.base_config(self.s)['warmup_iters']


def pct(x):
    return f"{x:+.2f}%"


def fmt_p(p):
    return f"{p:.3f}" if p >= 0.001 else f"{p:.0e}"


def fmt_loss(x):
    return '-' if x is None else 'diverged' if math.isinf(x) else f"{x:.4f}"


def interval_cell(values):
    """'mean [low, high]' of the 95% t interval, in % with a sign: a table cell."""
    m, lo, hi = stats.interval95(values)
    return f"{pct(m)} [{pct(lo)}, {pct(hi)}]"


def gap_cells(r):
    """A comparison's paired gap as the cells 'mean ± sd | interval (level) | t p (Holm)'."""
    return (f"{pct(r['mean'])} ± {r['sd']:.2f}% | [{pct(r['mean'] - r['half'])}, "
            f"{pct(r['mean'] + r['half'])}] ({100 * r['level']:.1f}%) | "
            f"{fmt_p(r['p_t'])} ({fmt_p(r['p_t_holm'])})")


def steps_cell(values):
    m, lo, hi = stats.interval95(values)
    return f"{m:+.0f} [{lo:+.0f}, {hi:+.0f}]"


def eval_series(log, key='val_loss'):
    return {e['iter']: e[key] for e in log if key in e}


def pair(ctx, c, seed):
    """(the arm's run, its reference's run) of a comparison on a seed: each at its selected LR,
    or at the LRs c['lrs'] names (tuning runs, to compare two arms at one LR)."""
    if 'lrs' in c:
        return tuple(S.Run(arm, lr, ctx.s.arm(arm)['weight_decay'], seed)
                     for arm, lr in zip((c['arm'], c['ref']), c['lrs']))
    extra = dict(budget=c.get('budget', 1.0))
    return ctx.at(c['arm'], seed, **extra), ctx.at(c['ref'], seed, **extra)


def pair_name(c):
    """A comparison as the tables and figures name it: its label, the arm − its reference, and
    the LRs where it names them."""
    if 'lrs' in c:
        return f"{c['label']} {c['arm']} at {c['lrs'][0]:g} − {c['ref']} at {c['lrs'][1]:g}"
    return f"{c['label']} {c['arm']} − {c['ref']}"


# -----------------------------------------------------------------------------
# tuning: the LR (and weight decay) selected on the selection seeds

def lr_rows(ctx, arms, lrs_of, states=False):
    """A row per arm and LR in lrs_of(arm): every tuning seed's loss (and with states, each run's
    spikes and gradient ratio, from its log)."""
    rows, warmup = [], ctx.warmup() if states else None
    for arm in arms:
        chosen = ctx.plan.chosen.get(arm, (None,))[0]
        wd = ctx.s.arm(arm)['weight_decay']
        for lr in lrs_of(arm):
            runs = [S.Run(arm, lr, wd, seed) for seed in S.tuning_seeds(ctx.s, arm)]
            losses = [ctx.results.get(r.name) for r in runs]
            row = dict(arm=arm, wd=wd, lr=lr, losses=losses, selected=lr == chosen,
                       mean=None if None in losses else sum(losses) / len(losses))
            if states:
                logs = [ctx.log(r) if r.name in ctx.results else None for r in runs]
                row['states'] = [run_state(x, g, warmup) for x, g in zip(losses, logs)]
                row['grad'] = [grad_ratio(g, warmup) if g is not None else None for g in logs]
            rows.append(row)
    return rows


def tuning_table(ctx, arms=None, also=()):
    """Each arm's tuning runs by LR, its selection, and whether the selection is bracketed. also:
    phases whose runs of an arm at its tuning seeds join its rows (a bracket checked later)."""
    arms = arms or [a for a in ctx.s.arms if 'grid' in ctx.s.arm(a)]
    seeds = S.tuning_seeds(ctx.s, arms[0])
    later = [r for phase in also for r in ctx.plan.phases.get(phase, ())]
    rows = lr_rows(ctx, arms, lambda arm: sorted({r.lr for r in ctx.tuning_runs(arm)} | {
        r.lr for r in later if r.arm == arm and r.seed in S.tuning_seeds(ctx.s, arm)}))
    out = md.head('arm', 'weight decay', 'peak LR', *(f"seed {s}" for s in seeds), 'mean', '')
    for r in rows:
        out.append(f"| {r['arm']} | {r['wd']:g} | {r['lr']:g} | " +
                   " | ".join(fmt_loss(x) for x in r['losses']) +
                   f" | {fmt_loss(r['mean'])} | {'**selected**' if r['selected'] else ''} |")
    for arm in arms:
        if arm in ctx.plan.chosen:
            lr = ctx.plan.chosen[arm][0]
            out.append(f"| {arm} | | {lr:g} | " + " | " * len(seeds) +
                       f" | {bracket_word(rows, arm, lr)} |")
    return '\n'.join(out) + '\n'


def bracket_word(rows, arm, lr):
    """Whether the selected LR has a finished LR on either side, and if so, whether it is the
    lowest (a selection kept by a margin need not be)."""
    means = {r['lr']: r['mean'] for r in rows if r['arm'] == arm and r['mean'] is not None}
    if lr in (min(means), max(means)):
        return 'on the edge'
    return 'bracketed' if means[lr] == min(means.values()) else 'bracketed; another LR is lower'


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


# -----------------------------------------------------------------------------
# stability: spikes, divergence and the climb of the LR

def spikes(log, warmup):
    """{step: rise in %} after warmup where the run spiked by v3's (amended) definition: the loss
    on the fixed val windows rose from one evaluation to the next, or a loss was non-finite (inf).
    The training loss alone is not a criterion: its batches differ from step to step."""
    found = {e['iter']: math.inf for e in log if e['iter'] > warmup and
             not all(math.isfinite(e[k]) for k in ('loss', 'val_loss') if k in e)}
    evals = [e for e in log if 'val_loss' in e and e['iter'] > warmup]
    for a, b in zip(evals, evals[1:]):
        if math.isfinite(a['val_loss']) and b['val_loss'] > a['val_loss']:
            found.setdefault(b['iter'], 100 * (b['val_loss'] - a['val_loss']) / a['val_loss'])
    return dict(sorted(found.items()))


def grad_ratio(log, warmup, every=1):
    """The largest gradient norm after warmup over its median: how far the worst step stood out.
    every: only the steps that are multiples of it (to compare a run logged at every step with
    one logged every 10)."""
    norms = sorted(e['grad_norm'] for e in log
                   if 'grad_norm' in e and e['iter'] > warmup and e['iter'] % every == 0)
    return norms[-1] / norms[len(norms) // 2] if norms and norms[len(norms) // 2] > 0 else None


def run_state(loss, log, warmup, most=3):
    """'diverged', 'spiked at step (+rise%)…' (the first `most`), '' (clean) or None (loss None:
    not committed)."""
    if loss is None:
        return None
    if math.isinf(loss):
        return 'diverged'
    found = list(spikes(log, warmup).items())[:most]
    return 'spiked at ' + ', '.join(f"{k} ({pct(v)})" for k, v in found) if found else ''


def stability_rows(ctx, arms):
    """The tuning grid and the climb's LRs above it, with each run's state."""
    return lr_rows(ctx, arms, lambda arm: sorted(
        {r.lr for r in ctx.tuning_runs(arm)} | set(ctx.climb_lrs(arm))), states=True)


def stability_summary(mine, seeds):
    """(the runs that spiked or diverged, as text; the largest LR below the first such; whether
    none did) over an arm's rows whose seeds have all finished."""
    bad = [r for r in mine if any(r['states'])]
    first_bad = min((r['lr'] for r in bad), default=math.inf)
    stable = [r['lr'] for r in mine if r['lr'] < first_bad]
    where = '; '.join(f"{r['lr']:g}: " + ', '.join(f"{s} {st}" for s, st in
                                                  zip(seeds, r['states']) if st) for r in bad)
    return where or 'none', (max(stable) if stable else None), not bad


def stability_table(ctx, arms, above, figure):
    rows, seeds = stability_rows(ctx, arms), S.tuning_seeds(ctx.s, arms[0])
    out = md.head('arm', 'weight decay', 'LRs run', 'runs spiked or diverged (LR: seeds)',
                  'largest LR with no spike', 'largest grad norm ÷ median, per LR')
    for arm in arms:
        mine = [r for r in rows if r['arm'] == arm and None not in r['states']]
        if not mine:
            out.append(f"| {arm} | {ctx.s.arm(arm)['weight_decay']:g} | | not yet | | |")
            continue
        where, top, clean = stability_summary(mine, seeds)
        bound = " (a lower bound: no run spiked)" if clean else ""
        top = 'none' if top is None else f"{top:g}{bound}"
        grads = ', '.join(f"{max(g for g in r['grad'] if g):.1f}" for r in mine if any(r['grad']))
        out.append(f"| {arm} | {mine[0]['wd']:g} | {', '.join(format(r['lr'], 'g') for r in mine)}"
                   f" | {where} | {top} | {grads} |")
    high = [r for r in rows if r['lr'] > above]
    if high:
        out += ["", "Above the tuning grid (the stability phase): full val loss per selection "
                "seed.", "",
                *md.head('arm', 'peak LR', *(f"seed {s}" for s in seeds))]
        out += [f"| {r['arm']} | {r['lr']:g} | " + " | ".join(map(fmt_loss, r['losses'])) + " |"
                for r in high]
    shown = f'\n![final loss against peak LR, every seed]({figure})\n' if any(
        None not in r['losses'] for r in rows) else ''
    return '\n'.join(out) + '\n' + shown


def stability_word(ctx, arms):
    """Claim (iii)'s cell: per arm, the largest LR with no spike once its LRs have all finished."""
    grid, words = stability_rows(ctx, arms), []
    for arm in arms:
        mine = [r for r in grid if r['arm'] == arm]
        if not mine or any(None in r['states'] for r in mine):
            words.append(f"{arm} not yet")
            continue
        _, lr, clean = stability_summary(mine, S.tuning_seeds(ctx.s, arm))
        words.append(f"{arm} {'none' if lr is None else f'{lr:g}'}{'+' if clean else ''}")
    return "; ".join(words)


def climb_table(ctx, arms, lrs, stall=0.8):
    """Every run of a climb, each described by its log: diverged; stalled (its fixed-window loss
    at the end above `stall` of its value at step 100); every rise of that loss between two
    evaluations; and its largest gradient norm after warmup over the median, on every 10th step
    (what v3's climbs logged, so the arms compare on one footing) and, where logged, on every."""
    warmup = ctx.warmup()
    rows = md.head('arm', 'weight decay', 'peak LR', 'seed', 'full val loss', 'end ÷ step 100',
                   'state', 'rises of the fixed-window loss (step: %)',
                   'grad norm max ÷ median, every 10th step (every step)')
    for arm in arms:
        wd = ctx.s.arm(arm)['weight_decay']
        for lr in lrs:
            for seed in ctx.s.tuning['seeds']:
                run = S.Run(arm, lr, wd, seed)
                loss = ctx.results.get(run.name)
                if loss is None:
                    continue
                rows.append(climb_row(ctx, run, loss, warmup, stall))
    return '\n'.join(rows) + '\n'


def climb_row(ctx, run, loss, warmup, stall):
    if math.isinf(loss):
        return f"| {run.arm} | {run.wd:g} | {run.lr:g} | {run.seed} | diverged | | diverged | | |"
    log = ctx.log(run)
    ratio, rises = end_ratio(log), spikes(log, warmup)
    state = 'stalled' if ratio > stall else 'learning'
    grad = f"{grad_ratio(log, warmup, every=10):.1f}"
    if log_every(log) == 1:  # logged at every step: the worst step, beside the common footing
        grad += f" ({grad_ratio(log, warmup):.1f})"
    listed = ', '.join(f"{k}: {pct(v)}" for k, v in rises.items()) or 'none'
    return (f"| {run.arm} | {run.wd:g} | {run.lr:g} | {run.seed} | {loss:.4f} | {ratio:.2f} | "
            f"{state} | {listed} | {grad} |")


def end_ratio(log):
    """The fixed-window val loss at the end over its value at step 100: how much a run learned
    after its first 100 steps."""
    series = eval_series(log)
    return series[max(series)] / series[100]


def log_every(log):
    steps = [e['iter'] for e in log if 'loss' in e]
    return steps[1] - steps[0] if len(steps) > 1 else 1


# -----------------------------------------------------------------------------
# paired comparisons on the test seeds, and their verdicts

def comparison_stats(ctx, comparisons, margin):
    """stats.compare's dict per comparison, None while it lacks seeds: each family (Holm within
    it) once every comparison of it has all its seeds."""
    gaps = [ctx.gaps(c['arm'], c['ref'], c['seeds']) for c in comparisons]
    out = [None] * len(comparisons)
    for family in dict.fromkeys(c['family'] for c in comparisons):
        members = [i for i, c in enumerate(comparisons) if c['family'] == family]
        if all(len(gaps[i]) >= len(comparisons[i]['seeds']) for i in members):
            for i, r in zip(members, stats.compare([list(gaps[i].values()) for i in members],
                                                   margin)):
                out[i] = r
    return out, gaps


def compared_arms(ctx, comparisons):
    """{arm: seeds}: each arm of the comparisons with every seed any of them pairs it on."""
    seeds = {}
    for c in comparisons:
        for arm in (c['arm'], c['ref']):
            seeds[arm] = sorted(set(seeds.get(arm, ())) | set(c['seeds']))
    return {a: seeds[a] for a in ctx.s.arms if a in seeds}


def means_table(ctx, comparisons):
    rows = md.head('arm', 'peak LR', 'weight decay', 'seeds', 'full val loss, mean ± sd')
    for arm, seeds in compared_arms(ctx, comparisons).items():
        runs = ctx.done(arm, seeds)
        if len(runs) == len(seeds):
            m, sd = stats.mean_sd(ctx.loss(r) for r in runs)
            rows.append(f"| {arm} | {runs[0].lr:g} | {runs[0].wd:g} | {len(runs)} "
                        f"| {m:.4f} ± {sd:.4f} |")
    return rows


def verdicts_table(ctx, comparisons, explain, margin=stats.MARGIN):
    found, gaps = comparison_stats(ctx, comparisons, margin)
    waiting = [(c, g) for r, c, g in zip(found, comparisons, gaps) if r is None]
    note = "" if not waiting else "Not yet: paired seeds so far " + ', '.join(
        f"{c['arm']} − {c['ref']} {len(g)} of {len(c['seeds'])}" for c, g in waiting) + ".\n"
    if all(r is None for r in found):
        return note
    rows = md.head('comparison', 'seeds', 'paired gap, mean ± sd', 'interval (level)',
                   't p (Holm)', 'sign-flip p', 'TOST ±0.3% p (Holm)', 'resolution', 'verdict')
    for c, r in zip(comparisons, found):
        if r is not None:
            flag = " (t and sign-flip disagree at 0.05)" if r['flag'] else ""
            rows.append(f"| {pair_name(c)} | {r['n']} | {gap_cells(r)} | "
                        f"{fmt_p(r['p_perm'])} | {fmt_p(r['p_tost'])} "
                        f"({fmt_p(r['p_tost_holm'])}) | {r['mde']:.2f}% | "
                        f"**{r['verdict']}**{flag} |")
    return ('\n'.join(means_table(ctx, comparisons)) + '\n\n' + '\n'.join(rows) + '\n\n' + explain
            + '\n' + ("\n" + note if note else ""))


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


def decision_gaps(ctx, comparisons):
    """{label: {seed: gap %}}: each pair's paired gaps, then each contrast's (`combine`: {label:
    weight}), a per-seed weighted sum of earlier labels' gaps on the seeds they all have."""
    gaps = {}
    for c in comparisons:
        if 'combine' in c:
            seeds = sorted(set.intersection(*(set(gaps[k]) for k in c['combine'])))
            gaps[c['label']] = {s: sum(w * gaps[k][s] for k, w in c['combine'].items())
                                for s in seeds}
        else:
            gaps[c['label']] = ctx.gaps(c['arm'], c['ref'], c['seeds'])
    return gaps


def decisions_table(ctx, comparisons, family, margin, beside=(), one_level=False):
    """v5's rule: worse, better, matches (TOST within +-margin), not worse (one-sided below
    +margin) or could not tell, Holm over a family of `family` comparisons read as soon as every
    one declared so far has all its seeds (those not declared yet count as p = 1: the adjusted p
    values are upper bounds, so a verdict reached stands), each with the smallest margins its
    data support. `beside`: pairs given with their own unadjusted tests, outside the family.
    one_level: every interval and margin at Bonferroni's 0.05/family (stats.compare). A
    contrast in the family may combine a pair of `beside` (v8's b: a family pair minus one
    outside it)."""
    gaps = decision_gaps(ctx, [*beside, *comparisons])
    ready = all(len(gaps[c['label']]) >= len(c['seeds']) for c in comparisons)
    waiting = ', '.join(f"{c['label']} {len(gaps[c['label']])} of {len(c['seeds'])}"
                        for c in comparisons if len(gaps[c['label']]) < len(c['seeds']))
    if not ready:
        return f"Not yet: paired seeds so far {waiting}.\n"
    found = stats.compare([unpaired_tests(ctx, c, margin) if c.get('unpaired') else
                           list(gaps[c['label']].values()) for c in comparisons], margin,
                          worse_margin=margin, family=family, one_level=one_level)
    rows = md.head('comparison', 'seeds', 'paired gap, mean ± sd', 'interval (level)',
                   't p (Holm)', 'sign-flip p', f'TOST ±{margin:g}% p (Holm)',
                   f'not worse +{margin:g}% p (Holm)', 'smallest margin: not worse, matches',
                   'resolution', 'verdict')
    for c, r in zip(comparisons, found):
        rows.append(decision_row(c.get('name') or pair_name(c), r))
    paired = [dict(c, unpaired=False, how=', paired') for c in comparisons if c.get('unpaired')]
    for c in paired + list(beside):  # each read as declared: Welch where unpaired
        alone = stats.compare([unpaired_tests(ctx, c, margin) if c.get('unpaired') else
                               list(ctx.gaps(c['arm'], c['ref'], c['seeds']).values())], margin,
                              worse_margin=margin)[0]
        rows.append(decision_row(pair_name(c) + c.get('how', ''), alone, outside=True))
    pairs = [c for c in comparisons if 'combine' not in c] + list(beside)
    missing = family - len(comparisons)
    level = (f"each at Bonferroni's 0.05/{family}, as the family's intervals, so that all of "
             "them hold together" if one_level else "each at the level Holm tests it at")
    note = (f"Holm over the family's {family} comparisons" + (
        f"; the {missing} not in yet count as p = 1, so each adjusted p is an upper bound of "
        "its final value and a verdict reached stands" if missing else "") + ". Smallest "
        "margin: the upper end of the one-sided interval (not worse) and the larger end in size "
        f"of the two-sided one (matches), {level}. Resolution: the "
        f"smallest gap detected with 80% power at Holm's strictest level, 0.05/{family} (exact, "
        "noncentral t).")
    return '\n'.join(means_table(ctx, pairs)) + '\n\n' + '\n'.join(rows) + '\n\n' + note + '\n'


def unpaired_tests(ctx, c, margin):
    """An unpaired comparison's tests (Welch) on the two arms' final losses over its seeds."""
    losses = [[ctx.loss(ctx.at(arm, s)) for s in c['seeds']] for arm in (c['arm'], c['ref'])]
    return stats.welch_tests(*losses, margin)


def decision_row(name, r, outside=False):
    """One comparison's row; outside the family its name says so, unadjusted, and it has no
    verdict word: a verdict is the family's alone (its interval and p say what it shows)."""
    name += ', unpaired' if r.get('unpaired') else ''
    name += ' (outside the family, unadjusted)' if outside else ''
    verdict = "– (outside the family)" if outside else f"**{r['verdict']}**"
    if r.get('unpaired'):  # the gap of the two arms' means, with its standard error
        return (f"| {name} | {r['n']} + {r['n_ref']} | {pct(r['mean'])} (se "
                f"{r['se']:.2f}%) | [{pct(r['mean'] - r['half'])}, {pct(r['mean'] + r['half'])}] "
                f"({100 * r['level']:.1f}%) | {fmt_p(r['p_t'])} ({fmt_p(r['p_t_holm'])}) | – | "
                f"{fmt_p(r['p_tost'])} ({fmt_p(r['p_tost_holm'])}) | {fmt_p(r['p_ni'])} "
                f"({fmt_p(r['p_ni_holm'])}) | {pct(r['ni_bound'])}, ±{r['tost_bound']:.2f}% | "
                f"{r['mde']:.2f}% | {verdict} |")
    return (f"| {name} | {r['n']} | {gap_cells(r)} | {fmt_p(r['p_perm'])} | "
            f"{fmt_p(r['p_tost'])} ({fmt_p(r['p_tost_holm'])}) | {fmt_p(r['p_ni'])} "
            f"({fmt_p(r['p_ni_holm'])}) | {pct(r['ni_bound'])}, ±{r['tost_bound']:.2f}% | "
            f"{r['mde']:.2f}% | {verdict} |")


def claims_table(ctx, comparisons, texts, stability):
    """The paper's claims, each with its comparison's verdict, and (iii) descriptive."""
    found = comparison_stats(ctx, comparisons, stats.MARGIN)[0]
    rows = md.head('claim', 'tested here as', 'verdict', 'resolution')
    for r, c in zip(found, comparisons):
        verdict = "not yet" if r is None else f"**{r['verdict']}** ({pct(r['mean'])})"
        res = "" if r is None else f"{r['mde']:.2f}% (n = {r['n']})"
        rows.append(f"| {c['label']} {texts[c['label']]} | {c['arm']} − {c['ref']}, paired full "
                    f"val loss | {verdict} | {res} |")
    label, claim, tested = stability['label'], texts[stability['label']], stability['tested']
    rows.append(f"| {label} {claim} | {tested} | descriptive: "
                f"{stability_word(ctx, stability['arms'])} | the √2 grid |")
    rows = rows[:2] + sorted(rows[2:], key=lambda row: row.split(' ')[1])
    return '\n'.join(rows) + (f"\n\n{label}: `+` marks an arm none of whose runs spiked: its "
                              "largest LR is a lower bound.\n")


# -----------------------------------------------------------------------------
# the gap over training and over budgets

def trajectories(ctx, arm, ref, seeds, budget=1.0):
    """{seed: {step: paired gap % on the fixed val windows}} for the seeds both arms finished."""
    out = {}
    for seed in seeds:
        a, b = ctx.at(arm, seed, budget=budget), ctx.at(ref, seed, budget=budget)
        if ctx.loss(a) is not None and ctx.loss(b) is not None:
            x, y = eval_series(ctx.log(a)), eval_series(ctx.log(b))
            out[seed] = {k: 100 * (x[k] - y[k]) / y[k] for k in sorted(x) if k in y and k > 0}
    return out


def slope(points):
    """Least-squares slope of [(step, gap)], in % per 100 steps."""
    return stats.slope([p[0] / 100 for p in points], [p[1] for p in points])


def complete_trajectories(ctx, comparisons):
    """([(comparison, {seed: {step: gap}})] of the comparisons with all their seeds, the rest as a
    'Not yet' line or '')."""
    out, waiting = [], []
    for c in comparisons:
        series = trajectories(ctx, c['arm'], c['ref'], c['seeds'])
        if len(series) < len(c['seeds']):
            waiting.append(f"{pair_name(c)} {len(series)} of "
                           f"{len(c['seeds'])}")
        else:
            out.append((c, series))
    return out, ("Not yet: paired seeds so far " + ", ".join(waiting) + ".\n" if waiting else "")


def trajectory_table(ctx, comparisons, figure=None, every=None):
    """The paired gap at each evaluation (or at every `every` steps), and its slope over the last
    third of the run."""
    comps, note = complete_trajectories(ctx, comparisons)
    if not comps:
        return note
    steps = sorted(next(iter(comps[0][1].values())))
    rows = md.head('step', *(f"{pair_name(c)}, mean [95% interval]" for c, _ in comps))
    for step in (k for k in steps if not every or k % every == 0):
        rows.append(f"| {step} | " + " | ".join(interval_cell([series[s][step] for s in series])
                                                for _, series in comps) + " |")
    last = [k for k in steps if k >= steps[-1] * 2 / 3]
    rows.append(f"| slope over steps {last[0]}–{last[-1]}, per 100 steps | " + " | ".join(
        interval_cell([slope([(k, series[s][k]) for k in last]) for s in series])
        for _, series in comps) + " |")
    shown = f'\n![the paired gap through the run]({figure})\n' if figure else ''
    return '\n'.join(rows) + '\n' + shown + ('\n' + note if note else '')


def budget_gap_table(ctx, arm, ref, seeds, budget):
    """The paired gap at 1x and at `budget`x on the same seeds, and their difference."""
    runs = [r for a in (ref, arm) for r in (ctx.at(a, s, budget=budget) for s in seeds) if r]
    done = sum(r.name in ctx.results for r in runs)
    if len(runs) < 2 * len(seeds) or done < len(runs):
        return f"Not yet: {done} of {2 * len(seeds)} runs at {budget:g}× have finished.\n"
    short, longer = ctx.gaps(arm, ref, seeds), ctx.gaps(arm, ref, seeds, budget=budget)
    rows = md.head('budget', f'paired gap {arm} − {ref}, mean [95% interval]', 'per seed')
    for label, gaps in (("1×", short), (f"{budget:g}×", longer)):
        rows.append(f"| {label} | {interval_cell(list(gaps.values()))} | " +
                    ", ".join(f"{s}: {pct(g)}" for s, g in sorted(gaps.items())) + " |")
    rows.append(f"| {budget:g}× − 1× | {interval_cell([longer[s] - short[s] for s in seeds])} | |")
    return '\n'.join(rows) + '\n'


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


def budgets_table(ctx, comparisons, references, params, margin=stats.MARGIN):
    """The paired gap at the end of each annealed budget (one Holm family), beside the same pair's
    gap at v3's 1x schedule (`references`, which ends at 93.6% of the peak LR), with tokens per
    parameter."""
    found, gaps = comparison_stats(ctx, comparisons, margin)
    # a reference is a family of its own; so is an annealed comparison whose seeds are in while
    # its family's are not (unadjusted, and marked so)
    rows_of = [(c, comparison_stats(ctx, [c], margin)[0][0], False) for c in references]
    for c, r, g in zip(comparisons, found, gaps):
        alone = r is None and len(g) == len(c['seeds'])
        if alone:
            r = comparison_stats(ctx, [dict(c, family=c['label'])], margin)[0][0]
        rows_of.append((c, r, alone))
    base = S.base_config(ctx.s)
    rows = md.head('schedule', 'steps', 'tokens', 'tokens per parameter', 'peak LR (ref, arm)',
                   'paired gap, mean ± sd', 'interval (level)', 't p (Holm)', 'resolution',
                   'verdict')
    for c, r, alone in rows_of:
        if r is None:
            rows.append(f"| {c['label']} | | | | | not yet | | | | |")
            continue
        schedule = schedule_of(ctx, c['arm'], base)
        tokens = S.tokens(schedule)
        lrs = f"{ctx.plan.chosen[c['ref']][0]:g}, {ctx.plan.chosen[c['arm']][0]:g}"
        rows.append(f"| {c['label']} | {schedule['max_iters']} | {tokens / 1e6:.2f}M | "
                    f"{tokens / params:.1f} | {lrs} | {gap_cells(r)} | {r['mde']:.2f}% | "
                    f"**{r['verdict']}**{' (unadjusted: its family waits)' if alone else ''} |")
    return '\n'.join(rows) + '\n' + budget_changes(ctx, [c for c, r, _ in rows_of if r])


def tokens_gaps_table(ctx, comparisons, params, paper=440):
    """Each pair's gap at the end of each budget against tokens per parameter (the baseline's),
    described, not tested: the paired mean with its 95% interval, and the gap of the two arms'
    means with its 95% Welch interval (v5's 4x reading). The verdicts are the family's."""
    base = S.base_config(ctx.s)
    rows = md.head('pair', 'steps', 'tokens', 'byte tokens per baseline parameter', 'seeds',
                   'paired gap, mean [95% interval]', 'gap of the means [95% Welch interval]')
    t = stats.t_dist()
    for c in comparisons:
        schedule = schedule_of(ctx, c['arm'], base)
        tokens = S.tokens(schedule)
        where = f"| {c['label']} | {schedule['max_iters']} | {tokens / 1e6:.2f}M | " \
            f"{tokens / params:.1f} | {c['seeds'][0]}–{c['seeds'][-1]} |"
        gaps = ctx.gaps(c['arm'], c['ref'], c['seeds'])
        if len(gaps) < len(c['seeds']):
            rows.append(f"{where} not yet ({len(gaps)} of {len(c['seeds'])} seeds) | |")
            continue
        arm, ref = ([ctx.loss(ctx.at(name, seed)) for seed in c['seeds']]
                    for name in (c['arm'], c['ref']))
        w = stats.welch_tests(arm, ref, stats.MARGIN)
        half = t.ppf(0.975, w['df']) * w['se']
        rows.append(f"{where} {interval_cell(list(gaps.values()))} | {pct(w['mean'])} "
                    f"[{pct(w['mean'] - half)}, {pct(w['mean'] + half)}] |")
    return ('\n'.join(rows) + f"\n\nTokens are bytes (the byte-level tokenizer), over the "
            f"baseline's {params:,} parameters for both arms. The paper's runs: ~{paper} GPT-2 "
            "BPE tokens per parameter, a coarser unit (a BPE token holds several bytes). "
            "Intervals are 95% and unadjusted; the verdicts, and the change from one budget to "
            "the next seed by seed, are the family's.\n")


def budget_changes(ctx, schedules):
    """Seed by seed, how much the paired gap moves from each schedule to the next, on the seeds
    both have: a difference of two gaps, so outside their Holm family."""
    rows = md.head('change of the paired gap', 'seeds', 'mean [95% interval], points of %',
                   't p', 'gap larger on')
    for before, after in zip(schedules, schedules[1:]):
        first = ctx.gaps(before['arm'], before['ref'], before['seeds'])
        second = ctx.gaps(after['arm'], after['ref'], after['seeds'])
        seeds = sorted(set(first) & set(second))
        if len(seeds) < 2:
            continue
        moves = [second[s] - first[s] for s in seeds]
        m, lo, hi = stats.interval95(moves)
        rows.append(f"| {after['label']} − {before['label']} | {seeds[0]}–{seeds[-1]} | "
                    f"{pct(m)} [{pct(lo)}, {pct(hi)}] | {fmt_p(stats.tests(moves, 0)['p_t'])} "
                    f"| {sum(x > 0 for x in moves)} of {len(seeds)} |")
    if len(rows) == 2:
        return ''
    return ('\n' + '\n'.join(rows) + "\n\nEach seed's gap at the later schedule minus its gap "
            "at the earlier one, with a 95% interval outside the Holm family; the schedules' LRs "
            "differ, each tuned for its own.\n")


def schedule_of(ctx, arm, base):
    return dict(base, **ctx.s.arm(arm).get('settings', {}))


# -----------------------------------------------------------------------------
# the step lag: how much later the arm reaches each loss

def crossing(series, level):
    """The first step at which a loss curve {step: loss} reaches level, interpolated linearly
    between the two evaluations around it; None if it never does."""
    steps = sorted(series)
    for a, b in zip(steps, steps[1:]):
        if series[a] > level >= series[b]:
            return a + (b - a) * (series[a] - level) / (series[a] - series[b])
    return None


def seed_lags(ctx, c, levels):
    """{level: {seed: steps the arm needs beyond its reference to reach it}} on the levels every
    run of both arms reaches, and the seeds both finished."""
    found = {}
    for seed in c['seeds']:
        a, b = pair(ctx, c, seed)
        if ctx.loss(a) is None or ctx.loss(b) is None or math.isinf(ctx.loss(a) + ctx.loss(b)):
            continue
        x, y = eval_series(ctx.log(a)), eval_series(ctx.log(b))
        for level in levels:
            found.setdefault(level, {})[seed] = (crossing(x, level), crossing(y, level))
    reached = {lv: {s: xa - ya for s, (xa, ya) in by.items()} for lv, by in found.items()
               if all(xa is not None and ya is not None for xa, ya in by.values())}
    return reached


def complete_lags(ctx, c, levels):
    """seed_lags of the comparison once every one of its seeds has finished; None until then."""
    lags = seed_lags(ctx, c, levels)
    return lags if lags and len(next(iter(lags.values()))) >= len(c['seeds']) else None


def lag_table(ctx, comparisons, levels, figure=None, changes=False):
    """Per comparison, the steps the arm needs beyond its reference to reach each loss level
    (mean [95% interval] over the paired seeds), and their mean from the second level down;
    with `changes`, how that mean moves from each comparison to the next (lag_changes)."""
    rows, waiting, complete = [], [], []
    header = md.head('comparison', *(f"{lv:g}" for lv in levels), f"mean, {levels[1]:g} and below")
    for c in comparisons:
        lags = complete_lags(ctx, c, levels)
        if lags is None:
            waiting.append(f"{c['arm']} − {c['ref']}")
            continue
        cells = [steps_cell(list(lags[lv].values())) if lv in lags else "not reached"
                 for lv in levels]
        per_seed = mean_lags(lags, levels[1:])
        complete.append((c, lags))
        rows.append(f"| {pair_name(c)} | " + " | ".join(cells) +
                    f" | {steps_cell(list(per_seed.values())) if per_seed else '-'} |")
    note = "Not yet: " + ", ".join(waiting) + ".\n" if waiting else ""
    if not rows:
        return note
    shown = f"\n![the step lag at each loss level]({figure})\n" if figure else ""
    return ('\n'.join(header + rows) +
            "\n\nSteps the arm needs beyond its reference to reach each fixed-window val loss "
            "(a crossing interpolated between evaluations); positive: the arm is later.\n"
            + (lag_changes(complete, levels[1:]) if changes else "")
            + shown + ("\n" + note if note else ""))


def lag_changes(complete, levels):
    """Seed by seed, the change of the mean lag from each comparison to the next, over the
    levels both reach and the seeds both have."""
    rows = md.head('change of the mean lag', 'levels', 'seeds', 'mean [95% interval], steps',
                   't p', 'shorter on')
    for (before, first), (after, second) in zip(complete, complete[1:]):
        used = [lv for lv in levels if lv in first and lv in second]
        seeds = sorted(set(first[used[0]]) & set(second[used[0]])) if used else []
        if len(seeds) < 2:
            continue
        moves = [sum(second[lv][s] - first[lv][s] for lv in used) / len(used) for s in seeds]
        rows.append(f"| {after['label']} − {before['label']} | {used[0]:g}–{used[-1]:g} | "
                    f"{seeds[0]}–{seeds[-1]} | {steps_cell(moves)} | "
                    f"{fmt_p(stats.tests(moves, 0)['p_t'])} | "
                    f"{sum(x < 0 for x in moves)} of {len(seeds)} |")
    return "" if len(rows) == 2 else "\n" + "\n".join(rows) + "\n"


def mean_lags(lags, levels):
    """{seed: the seed's mean lag over those of levels that every run reaches}."""
    used = [lv for lv in levels if lv in lags]
    seeds = next(iter(lags.values())).keys() if lags else []
    return {s: sum(lags[lv][s] for lv in used) / len(used) for s in seeds} if used else {}


def seed_lag_table(ctx, comparisons, levels):
    """Seed by seed, each comparison's mean lag over the levels from levels[1] down: whether the
    arm that changes one thing removes the delay on every seed or on average."""
    columns = []
    for c in comparisons:
        lags = complete_lags(ctx, c, levels)
        if lags is None:
            return f"Not yet: {c['arm']} − {c['ref']} lacks seeds.\n"
        columns.append(mean_lags(lags, levels[1:]))
    seeds = sorted(columns[0])
    rows = md.head('seed', *(f"{c['arm']} − {c['ref']}" for c in comparisons))
    rows += [f"| {s} | " + " | ".join(f"{col[s]:+.0f}" for col in columns) + " |" for s in seeds]
    rows.append("| mean [95% interval] | " + " | ".join(steps_cell(list(col.values()))
                                                        for col in columns) + " |")
    return '\n'.join(rows) + '\n'


# -----------------------------------------------------------------------------
# inside the models: the probes' induction heads, logits and scales

def induction_curve(log):
    """{step: (strongest head's induction score, repeat loss)} of a committed run's log."""
    return {e['iter']: (max(max(layer) for layer in e['induction']), e['repeat_loss'])
            for e in log if 'induction' in e}


def onset(curve, threshold):
    """The first evaluated step at which the strongest head passes threshold, None if never."""
    return next((k for k in sorted(curve) if curve[k][0] >= threshold), None)


def seed_phase_table(ctx, comparison, reference, threshold):
    """Seed by seed, a comparison's final gap beside its two arms' final losses and their
    strongest induction head (its score at the end, the first step it reaches threshold); then how
    the spread is made, at this budget and at the reference comparison's: each arm's sd over seeds,
    the correlation of the two arms' losses, and that of the gap with the difference in the
    strongest head's score (Pearson, across seeds)."""
    from scipy.stats import pearsonr
    c, seeds = comparison, comparison['seeds']
    runs = {s: (ctx.at(c['ref'], s), ctx.at(c['arm'], s)) for s in seeds}
    if any(ctx.loss(x) is None for pair in runs.values() for x in pair):
        return f"Not yet: {pair_name(c)} on every seed of {seeds[0]}–{seeds[-1]}.\n"
    rows = md.head('seed', c['ref'], c['arm'], 'gap',
                   f"strongest induction head at the end ({c['ref']}, {c['arm']})",
                   f"first step at {threshold:g} ({c['ref']}, {c['arm']})")
    gaps, scores = [], []
    for s, (ref, arm) in runs.items():
        curves = [induction_curve(ctx.log(r)) for r in (ref, arm)]
        ends = [cv[max(cv)][0] for cv in curves]
        starts = [onset(cv, threshold) for cv in curves]
        gaps.append(100 * (ctx.loss(arm) - ctx.loss(ref)) / ctx.loss(ref))
        scores.append(ends[1] - ends[0])
        rows.append(f"| {s} | {ctx.loss(ref):.4f} | {ctx.loss(arm):.4f} | {pct(gaps[-1])} | "
                    f"{ends[0]:.3f}, {ends[1]:.3f} | "
                    + ', '.join('never' if x is None else str(x) for x in starts) + " |")
    r, p = pearsonr(scores, gaps)
    lines = md.head('pair', 'seeds', 'sd of the final loss, ref, arm',
                    "r between the arms' losses")
    for pair in (reference, c):
        done = [(ctx.loss(ctx.at(pair['ref'], s)), ctx.loss(ctx.at(pair['arm'], s)))
                for s in pair['seeds']]
        if any(x is None for d in done for x in d):
            continue
        refs, arms = zip(*done)
        lines.append(f"| {pair['label']} | {pair['seeds'][0]}–{pair['seeds'][-1]} | "
                     f"{stats.mean_sd(refs)[1]:.4f}, {stats.mean_sd(arms)[1]:.4f} | "
                     f"{pearsonr(refs, arms)[0]:+.2f} |")
    return ('\n'.join(rows) + f"\n\nAcross the {len(seeds)} seeds the gap and the arm's strongest "
            f"head minus the reference's (at the end) correlate with r = {r:+.2f} "
            f"(p {fmt_p(p)}).\n"
            "\n" + '\n'.join(lines) + '\n')


def induction_arms(ctx, arms, seeds):
    """The arms with every one of the seeds finished: the reference (first) among them, or none."""
    done = [a for a in arms if len(ctx.done(a, seeds)) == len(seeds)]
    return done if arms[0] in done and len(done) > 1 else []


def induction_lag(on, ref_on):
    paired = [on[s] - ref_on[s] for s in on if on[s] is not None and ref_on[s] is not None]
    if len(paired) < 2:
        return "-"
    m, lo, hi = stats.interval95(paired)
    return f"{m:+.0f} [{lo:+.0f}, {hi:+.0f}] steps (n = {len(paired)})"


def induction_table(ctx, arms, seeds, threshold, figure):
    done = induction_arms(ctx, arms, seeds)
    rest = [a for a in arms if a not in done]
    note = f"Not yet: {', '.join(rest)} need test seeds {seeds[0]}–{seeds[-1]}.\n" if rest else ""
    if not done:
        return note
    curves = {a: {r.seed: induction_curve(ctx.log(r)) for r in ctx.done(a, seeds)} for a in done}
    ref_on = {s: onset(c, threshold) for s, c in curves[arms[0]].items()}
    rows = md.head('arm', f'step the strongest head passes {threshold} (mean; per seed)',
                   'its largest score in the run', 'its score at the end',
                   'repeat loss at the end', "onset − baseline's, mean [95% interval]")
    for arm in done:
        on = {s: onset(c, threshold) for s, c in curves[arm].items()}
        end = [c[max(c)] for c in curves[arm].values()]
        peak = max(v[0] for c in curves[arm].values() for v in c.values())
        hit = [v for v in on.values() if v is not None]
        mean_on = f"{sum(hit) / len(hit):.0f}" if hit else "never"
        lag = "(reference)" if arm == arms[0] else induction_lag(on, ref_on)
        rows.append(f"| {arm} | {mean_on}; " + ", ".join(str(on[s]) if on[s] else "never"
                                                          for s in seeds) +
                    f" | {peak:.3f} | {sum(e[0] for e in end) / len(end):.3f} "
                    f"| {sum(e[1] for e in end) / len(end):.3f} | {lag} |")
    return ('\n'.join(rows) + f'\n\n![induction score and repeat loss through the run]({figure})\n'
            + ('\n' + note if note else ''))


# -----------------------------------------------------------------------------
# the mechanism (v6): induction onsets seed by seed, the gap through the run, attention before
# the heads form

def pair_runs(ctx, c):
    """{seed: (reference's run, arm's run)} of a comparison, or None until every seed is in; a
    comparison naming `steps` reads the arms' runs to that many steps (v7's stable runs)."""
    runs = {s: tuple(wsd_run(ctx, a, s, c['steps']) if 'steps' in c else ctx.at(a, s)
                     for a in (c['ref'], c['arm'])) for s in c['seeds']}
    return None if any(ctx.loss(x) is None for p in runs.values() for x in p) else runs


def censored_onset(ctx, run, threshold):
    """(onset step or None for never, the step counted in a correlation: a never as the run's last
    evaluation plus one interval, a lower bound)."""
    curve = induction_curve(ctx.log(run))
    on = onset(curve, threshold)
    steps = sorted(curve)
    return on, on if on is not None else steps[-1] + (steps[-1] - steps[-2])


def onset_row(ctx, ref, arm, threshold):
    """One seed: (final gap %, (ref onset, arm onset), delay counted, (ref peak, arm peak),
    (ref onset counted, arm onset counted))."""
    ons = [censored_onset(ctx, r, threshold) for r in (ref, arm)]
    peaks = [max(v[0] for v in induction_curve(ctx.log(r)).values()) for r in (ref, arm)]
    gap = 100 * (ctx.loss(arm) - ctx.loss(ref)) / ctx.loss(ref)
    both_never = ons[0][0] is None and ons[1][0] is None
    return (gap, (ons[0][0], ons[1][0]), None if both_never else ons[1][1] - ons[0][1], peaks,
            (ons[0][1], ons[1][1]))


def onset_text(step):
    return 'never' if step is None else str(step)


def correlation_cells(xs, ys):
    """'r [95% interval] (p) | Spearman rho (permutation p)' of paired values; '-' under four
    points."""
    from scipy.stats import pearsonr, spearmanr
    if len(xs) < 4 or len(set(xs)) < 2:
        return '- | -'
    r, p = pearsonr(xs, ys)
    lo, hi = stats.fisher_interval(r, len(xs))
    rho = spearmanr(xs, ys)[0]
    return (f"{r:+.2f} [{lo:+.2f}, {hi:+.2f}] ({fmt_p(p)}) | {rho:+.2f} "
            f"({fmt_p(stats.spearman_p(xs, ys))})")


def sign_cell(delays):
    """'later, same, earlier (p)': the arm's onset against its reference's seed by seed, with
    the exact two-sided sign test over the seeds whose onsets differ."""
    from scipy.stats import binomtest
    later, earlier = sum(d > 0 for d in delays), sum(d < 0 for d in delays)
    p = binomtest(later, later + earlier).pvalue if later + earlier else 1.0
    return f"{later}, {len(delays) - later - earlier}, {earlier} ({fmt_p(p)})"


def confound_cells(rows):
    """'r within ref, r within arm | gap at equal onset' over rows of (ref loss, arm loss, ref
    onset, arm onset): each arm's Pearson r of its runs' full val loss with their onsets, and the
    arm indicator's coefficient in a least-squares fit of every run's full val loss on its onset
    and the arm, in % of the reference's mean loss (descriptive: no interval)."""
    import numpy as np
    from scipy.stats import pearsonr
    if len(rows) < 4 or any(len(set(r[i] for r in rows)) < 2 for i in range(4)):
        return '- | -'
    ref, arm, ref_on, arm_on = (list(v) for v in zip(*rows))
    within = [pearsonr(on, loss)[0] for on, loss in ((ref_on, ref), (arm_on, arm))]
    design = np.column_stack([np.ones(2 * len(rows)), ref_on + arm_on,
                              [0] * len(rows) + [1] * len(rows)])
    fit = np.linalg.lstsq(design, np.array(ref + arm), rcond=None)[0]
    return (f"{within[0]:+.2f}, {within[1]:+.2f} | "
            f"{pct(100 * fit[2] / (sum(ref) / len(ref)))}")


def onsets_table(ctx, pairs, thresholds):
    """Seed by seed, for each pair: the final gap (full val loss) and both arms' full val loss,
    both arms' induction onsets at the first threshold (the first evaluation whose strongest head
    reaches it), the delay, and both arms' peak scores; then, at every threshold, how many seeds'
    arm forms its head later (sign test), the correlation of the final gap with the delay across
    seeds (Pearson with Fisher's 95% interval, Spearman beside, its permutation p: exact to 12
    seeds), and beside them what
    confounds it: within each arm, the correlation of the full val loss with the onset, and the
    gap at equal onset (confound_cells). A never counts as the run's last evaluation plus one
    interval; a seed where neither arm reaches the threshold has no delay and sits out."""
    done = [(c, runs) for c in pairs if (runs := pair_runs(ctx, c))]
    rest = [pair_name(c) for c in pairs if not pair_runs(ctx, c)]
    note = f"\nNot yet: {', '.join(rest)}.\n" if rest else ""
    if not done:
        return note.lstrip('\n')
    first = thresholds[0]
    rows = md.head('pair', 'seed', 'final gap', 'full val loss (ref, arm)',
                   f'onset at {first:g} (ref, arm)', 'delay (steps)', 'peak score (ref, arm)')
    for c, runs in done:
        for seed, (ref, arm) in runs.items():
            gap, ons, delay, peaks, _ = onset_row(ctx, ref, arm, first)
            rows.append(f"| {c['label']} | {seed} | {pct(gap)} | {ctx.loss(ref):.4f}, "
                        f"{ctx.loss(arm):.4f} | {onset_text(ons[0])}, "
                        f"{onset_text(ons[1])} | {'–' if delay is None else f'{delay:+d}'} | "
                        f"{peaks[0]:.3f}, {peaks[1]:.3f} |")
    exact = all(len(runs) <= stats.EXACT_PAIRINGS for _, runs in done)
    lines = md.head('pair', 'threshold', 'seeds with a delay',
                    'arm later, same, earlier (sign test p)', 'mean delay (steps)',
                    'r of the final gap with the delay [95%] (p)',
                    'Spearman ρ (exact p)' if exact else 'Spearman ρ (permutation p)',
                    'r of the full val loss with the onset, within ref, within arm',
                    'gap at equal onset')
    for c, runs in done:
        for threshold in thresholds:
            found = [(onset_row(ctx, ref, arm, threshold), ctx.loss(ref), ctx.loss(arm))
                     for ref, arm in runs.values()]
            found = [(d, g, (lr, la, *on)) for (g, _, d, _, on), lr, la in found if d is not None]
            delays, gaps = [d for d, _, _ in found], [g for _, g, _ in found]
            mean = f"{sum(delays) / len(delays):+.0f}" if delays else '–'
            lines.append(f"| {c['label']} | {threshold:g} | {len(found)} of {len(runs)} | "
                         f"{sign_cell(delays) if delays else '–'} | {mean} | "
                         + correlation_cells(delays, gaps) + " | "
                         + confound_cells([x for _, _, x in found]) + " |")
    legend = '; '.join(f"{c['label']}: {c['arm']} − {c['ref']}" for c, _ in done)
    return ('\n'.join(rows) + '\n\n' + '\n'.join(lines) + f"\n\nPairs: {legend}. A never counts "
            "as the run's last evaluation plus one interval (a lower bound); a seed where neither "
            "arm reaches the threshold has no delay and sits out. Sign test: exact, two-sided, "
            "over the seeds whose onsets differ. Spearman's p: " + (
                "exact, over every pairing of the delays with the gaps" if exact else
                f"over the pairings of the delays with the gaps, every one up to "
                f"{stats.EXACT_PAIRINGS} seeds, above that {stats.DRAWS:,} random ones from a "
                "fixed seed, (hits + 1) / (draws + 1), with a standard error of at most 0.0005")
            + ". Within each arm: Pearson's r of its runs' full val loss with "
            "their onsets, over the same seeds. Gap at equal onset: the arm's coefficient in a "
            "least-squares fit of every run's full val loss on its onset and its arm, in % of the "
            "reference's mean loss; descriptive (the onset is an outcome of training, not a "
            "treatment), no interval.\n" + note)


def gap_steps_table(ctx, pairs, steps):
    """The paired gap on the fixed val windows at each of these steps (mean over seeds [95%
    interval]), pairs side by side, with the tokens seen; '' where a pair has no evaluation
    there. The last row: the full val loss at each pair's end."""
    done = [(c, series) for c in pairs
            if len(series := trajectories(ctx, c['arm'], c['ref'], c['seeds'])) == len(c['seeds'])]
    rest = [pair_name(c) for c in pairs if c not in [d for d, _ in done]]
    note = f"\nNot yet: {', '.join(rest)}.\n" if rest else ""
    if not done:
        return note.lstrip('\n')
    per_step = S.tokens(S.base_config(ctx.s)) // S.base_config(ctx.s)['max_iters']
    rows = md.head('step', 'tokens', *(c['label'] for c, _ in done))
    for k in steps:
        cells = [interval_cell([g[k] for g in series.values()]) if all(k in g for g in
                 series.values()) else '' for _, series in done]
        if any(cells):
            rows.append(f"| {k} | {k * per_step / 1e6:.2f}M | " + " | ".join(cells) + " |")
    ends = [interval_cell(list(ctx.gaps(c['arm'], c['ref'], c['seeds']).values()))
            for c, _ in done]
    rows.append("| end, full val loss | | " + " | ".join(ends) + " |")
    legend = '; '.join(f"{c['label']}: {c['arm']} − {c['ref']}, seeds {c['seeds'][0]}–"
                       f"{c['seeds'][-1]}" for c, _ in done)
    return '\n'.join(rows) + f"\n\nPaired gap, mean over seeds [95% interval]. {legend}.\n" + note


# -----------------------------------------------------------------------------
# tokens against schedule: a longer pair's gap beside a shorter one's at matched points

def schedule_point(ctx, c, step):
    """(tokens seen, fraction of the run, LR in % of the peak) at an evaluation step of a pair's
    runs, from its reference's config.json on its first seed; 'end' is the last step."""
    config = ctx.config(ctx.at(c['ref'], c['seeds'][0]))
    last = config['max_iters']
    step = last if step == 'end' else step
    return (S.tokens(config) * step // last, step / last,
            100 * get_lr(step, config) / config['learning_rate'])


def point_gaps(ctx, c, step):
    """{seed: paired gap %} at a step on the fixed val windows, or of the full val loss ('end')."""
    if step == 'end':
        return ctx.gaps(c['arm'], c['ref'], c['seeds'])
    return {seed: g[step] for seed, g in trajectories(ctx, c['arm'], c['ref'], c['seeds']).items()
            if step in g}


def tokens_schedule_table(ctx, long, short, points, post_hoc=None):
    """The long pair's paired gap beside the short pair's at matched points, each a (long step,
    short step): the same tokens at different points of the two schedules, or the same point of
    the schedule at more tokens. Each row gives both gaps on the seeds the pairs share and the
    mean of the seed-by-seed differences, with its 95% interval: outside any Holm family.
    post_hoc: when the table was added after results were seen, which, said first."""
    seeds = [s for s in long['seeds'] if s in short['seeds']]
    L, R = long['label'], short['label']
    rows = md.head(f'step ({L}, {R})', f'tokens ({L}, {R})', f'LR, % of peak ({L}, {R})',
                   'matched', f"{L} gap [95%]", f"{R} gap [95%]",
                   f"{L} − {R}, points of % [95%]", 't p', f'{L} gap larger on')
    for at_long, at_short in points:
        a, b = point_gaps(ctx, long, at_long), point_gaps(ctx, short, at_short)
        for c, step, found in ((long, at_long, a), (short, at_short, b)):
            if any(s not in found for s in seeds):
                where = 'its end' if step == 'end' else f'step {step}'
                return (f"Not yet: {pair_name(c)} at {where} on every seed of "
                        f"{seeds[0]}–{seeds[-1]}.\n")
        (tl, fl, ll), (ts, fs, ls) = (schedule_point(ctx, long, at_long),
                                      schedule_point(ctx, short, at_short))
        matched = 'tokens' if tl == ts else 'point of the schedule' if fl == fs else '–'
        moves = [a[s] - b[s] for s in seeds]
        rows.append(f"| {at_long}, {at_short} | {tl / 1e6:.2f}M, {ts / 1e6:.2f}M | {ll:.1f}, "
                    f"{ls:.1f} | {matched} | {interval_cell([a[s] for s in seeds])} | "
                    f"{interval_cell([b[s] for s in seeds])} | {interval_cell(moves)} | "
                    f"{fmt_p(stats.tests(moves, 0)['p_t'])} | "
                    f"{sum(x > 0 for x in moves)} of {len(seeds)} |")
    return ('\n'.join(rows) + "\n\n" + (f"Post hoc: every row of this table was added by an "
                                         f"amendment {post_hoc}. " if post_hoc else "")
            + f"Paired gaps on seeds {seeds[0]}–{seeds[-1]}, the seeds both "
            f"pairs have; {L}: {long['arm']} − {long['ref']}; {R}: {short['arm']} − "
            f"{short['ref']}. A step's gap is on the fixed val windows, the end's on the full val "
            f"loss. {L} − {R}: the mean over seeds of each seed's {L} gap minus its {R} gap, with "
            "a 95% interval, unadjusted and outside the Holm family. The LR is the schedule's at "
            "the step, for the update after it. Each arm runs at its own peak LR for its "
            "budget.\n")


def diag_gap(ctx, runs, step, key, layer):
    """{seed: the arm's logged diagnostic minus its reference's} at an evaluation step."""
    out = {}
    for seed, pair in runs.items():
        values = [next((e['diagnostics'][key][layer] for e in ctx.log(r)
                        if e['iter'] == step and 'diagnostics' in e), None) for r in pair]
        if None not in values:
            out[seed] = values[1] - values[0]
    return out


def attention_lag_table(ctx, pair, steps, thresholds):
    """Before and apart from the induction heads: per layer, the arm's attention logit std and
    entropy minus its reference's at some steps (mean over seeds [95% interval], marked where
    the interval at Bonferroni's level over every cell of the table excludes 0 too); then seed by
    seed, at each threshold, the paired gap on the fixed val windows averaged over the
    evaluations before the earlier of the two onsets (step 0 left out), with how many evaluations
    that is, and its mean over seeds with its t test and the seeds where it is positive."""
    runs = pair_runs(ctx, pair)
    if runs is None:
        return f"Not yet: {pair_name(pair)} on every seed.\n"
    layers = len(next(e for e in ctx.log(runs[pair['seeds'][0]][0]) if 'diagnostics' in e)
                 ['diagnostics']['logit_std'])
    cells = 2 * layers * len(steps)
    rows = md.head('measure', 'layer', *(f"step {k}" for k in steps))
    for key, name in (('logit_std', 'logit std'), ('entropy', 'entropy (nats)')):
        for layer in range(layers):
            row = []
            for k in steps:
                d = list(diag_gap(ctx, runs, k, key, layer).values())
                m, lo, hi = stats.interval95(d) if len(d) > 1 else (float('nan'),) * 3
                mark = ' *' if len(d) > 1 and stats.tests(d, 0)['p_t'] < 0.05 / cells else ''
                row.append(f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]{mark}" if d else '')
            rows.append(f"| {name} | {layer} | " + " | ".join(row) + " |")
    series = trajectories(ctx, pair['arm'], pair['ref'], pair['seeds'])
    before = md.head('seed', *(f'{what} {t:g}{after}' for t in thresholds for what, after in (
        ('earlier onset at', ' (evaluations before it)'), ('mean paired gap before it, at', ''))))
    means = {t: [] for t in thresholds}
    for seed, (ref, arm) in runs.items():
        line = [str(seed)]
        for t in thresholds:
            ons = [onset(induction_curve(ctx.log(r)), t) for r in (ref, arm)]
            first = min((o for o in ons if o is not None), default=None)
            gaps = [g for k, g in series[seed].items() if first is None or k < first]
            if gaps:
                means[t].append(sum(gaps) / len(gaps))
            line += [f"{onset_text(first)} ({len(gaps)})", pct(means[t][-1]) if gaps else '–']
        before.append(md.row(line))
    summary = ''.join(
        f"At {t:g}, over the {len(m)} seeds with evaluations before an onset: "
        f"{interval_cell(m)} (mean [95% interval]), t p {fmt_p(stats.tests(m, 0)['p_t'])}, "
        f"positive on {sum(x > 0 for x in m)} of {len(m)}.\n\n" for t, m in means.items()
        if len(m) > 1)[:-1]
    return ('\n'.join(rows) + f"\n\n{pair_name(pair)}: the arm minus its reference, mean over "
            f"seeds {pair['seeds'][0]}–{pair['seeds'][-1]} [95% interval], {cells} intervals, "
            f"each unadjusted; * marks those whose interval at Bonferroni's 0.05/{cells} "
            f"({100 * (1 - 0.05 / cells):.1f}%) excludes 0 too.\n\n"
            + '\n'.join(before) + '\n\n' + summary)


def diag_mean(ctx, arm, seeds, step, key, layer=None):
    """The mean over seeds of a logged diagnostic at an evaluation step (one layer, or the mean
    over layers)."""
    values = []
    for r in ctx.done(arm, seeds):
        entry = next(e for e in ctx.log(r) if e['iter'] == step and 'diagnostics' in e)
        v = entry['diagnostics'][key]
        values.append(v[layer] if layer is not None else sum(v) / len(v))
    return sum(values) / len(values)


def logits_table(ctx, arms, seeds, steps):
    """Per arm, its attention logits' growth: the first layer's logit std and normalised entropy,
    and both as means over the layers, at some evaluation steps (means over the seeds)."""
    done = [a for a in arms if len(ctx.done(a, seeds)) == len(seeds)]
    if not done:
        return "Not yet: no arm has all its seeds.\n"
    cols = [f"{name} at {k}" for name in ("layer-0 logit std", "mean logit std",
                                          "layer-0 entropy / ln t", "mean entropy / ln t")
            for k in steps]
    rows = md.head('arm', 'scale', *cols)
    for arm in done:
        cells = [diag_mean(ctx, arm, seeds, k, key, layer) for key, layer in
                 (('logit_std', 0), ('logit_std', None), ('entropy_norm', 0),
                                  ('entropy_norm', None)) for k in steps]
        rows.append(f"| {arm} | {run_scale(ctx, arm, seeds)} | " +
                    " | ".join(f"{v:.2f}" for v in cells) + " |")
    rest = [a for a in arms if a not in done]
    return '\n'.join(rows) + '\n' + (f"\nNot yet: {', '.join(rest)}.\n" if rest else '')


def learned_scale_table(ctx, arm, seeds, steps):
    """Where a learned softmax scale went (learn_scale): per layer, at some evaluation steps, each
    head's exp(theta_h) as 1/n, the mean over seeds and heads with the lowest and highest."""
    runs = ctx.done(arm, seeds)
    if len(runs) < len(seeds):
        return f"Not yet: {arm} has {len(runs)} of {len(seeds)} seeds.\n"
    at = {(r.seed, e['iter']): e['diagnostics']['scale'] for r in runs for e in ctx.log(r)
          if 'diagnostics' in e and 'scale' in e['diagnostics']}
    if any((r.seed, k) not in at for r in runs for k in steps):
        return f"Not logged: {arm}'s runs do not all log their learned scale at steps " \
               f"{', '.join(map(str, steps))}.\n"
    layers, heads_each = len(at[runs[0].seed, steps[0]]), len(at[runs[0].seed, steps[0]][0])
    rows = md.head('layer', *(f"scale at {k}, mean [lowest, highest]" for k in steps))
    for layer in range(layers):
        cells = []
        for k in steps:
            heads = [v for r in runs for v in at[r.seed, k][layer]]
            cells.append(f"1/{len(heads) / sum(heads):.1f} [1/{1 / min(heads):.1f}, "
                         f"1/{1 / max(heads):.1f}]")
        rows.append(f"| {layer} | " + " | ".join(cells) + " |")
    return '\n'.join(rows) + (f"\n\nEach head's learned softmax scale exp(θ_h) as 1/n, "
                               f"over {len(runs)} seeds × {heads_each} heads.\n")


def run_scale(ctx, arm, seeds):
    """The softmax scale the arm's first committed run trained with (its config.json), as 1/n;
    a learned scale is marked as learned from there."""
    folder = ctx.folders[ctx.done(arm, seeds)[0].name]
    config = GPTConfig.from_dict(read_json(os.path.join(folder, 'config.json'),
                                           'config.json')['model_args'])
    return f"1/{1 / config.scale:g}" + (", learned from there" if config.learn_scale else "")


def diagnostics_note(ctx, arms, seed, figure):
    done = [a for a in arms if ctx.done(a, (seed,))]
    if len(done) < len(arms):
        return f"Not yet: {len(done)} of {len(arms)} arms have finished test seed {seed}.\n"
    return (f"Test seed {seed}, every arm at its selected settings (one line per layer, "
            f"darker = deeper):\n\n![attention and weight diagnostics]({figure})\n")


# -----------------------------------------------------------------------------
# checks: a run repeated, the dtype, the init geometry, the modern block's pilot

def rerun_table(ctx, arms, seed, tag):
    """Each arm's run repeated under `tag` against the committed one: the full val loss of each,
    their difference, and the largest difference of the fixed-window losses on the way."""
    rows = md.head('arm', 'seed', 'full val loss', 'repeated here', 'difference',
                   'largest difference on the way')
    for arm in arms:
        a, b = ctx.at(arm, seed), ctx.at(arm, seed, tag=tag)
        if ctx.loss(a) is None or ctx.loss(b) is None:
            return f"Not yet: {arm} on seed {seed} has not been repeated.\n"
        x, y = eval_series(ctx.log(a)), eval_series(ctx.log(b))
        worst = max(abs(y[k] - x[k]) / x[k] for k in x if k in y)
        rows.append(f"| {arm} | {seed} | {ctx.loss(a):.6f} | {ctx.loss(b):.6f} | "
                    f"{100 * (ctx.loss(b) - ctx.loss(a)) / ctx.loss(a):+.5f}% | {worst:.1e} |")
    return '\n'.join(rows) + '\n'


def dtype_table(ctx, arm, seeds, dtype):
    other, fp32 = ctx.done(arm, seeds, dtype=dtype), ctx.done(arm, seeds)
    if len(other) < len(seeds) or len(fp32) < len(seeds):
        return f"Not yet: {len(other)} of {len(seeds)} bf16 runs have finished.\n"
    step_ms = lambda runs: sorted(e['dt_ms'] for r in runs for e in ctx.log(r) if e.get('dt_ms'))
    med = {k: v[len(v) // 2] for k, v in (('fp32', step_ms(fp32)), ('bf16', step_ms(other)))}
    gaps = {s: 100 * (ctx.loss(b) - ctx.loss(a)) / ctx.loss(a) for s, a, b in zip(seeds, fp32,
                                                                                 other)}
    return ('\n'.join(md.head('', 'float32', 'bf16 autocast')) + '\n'
            f"| median step time (ms, every logged step of "
            f"{len(seeds)} runs) | {med['fp32']:.1f} | {med['bf16']:.1f} |\n"
            f"| full val loss, mean | {sum(map(ctx.loss, fp32)) / len(fp32):.4f} | "
            f"{sum(map(ctx.loss, other)) / len(other):.4f} |\n\n"
            f"Paired difference bf16 − fp32 ({arm}, seeds {seeds[0]}–{seeds[-1]}): "
            f"{interval_cell(list(gaps.values()))} (95%).\n")


def geometry_gaps(ctx, pair, seeds, init_std):
    """({seed: gap %} at init_std, the same at the base's init std) on the seeds."""
    return (ctx.gaps(pair[1], pair[0], seeds, init_std=init_std),
            ctx.gaps(pair[1], pair[0], seeds))


def geometry_table(ctx, pair, seeds, init_std, figure):
    wide, std = geometry_gaps(ctx, pair, seeds, init_std)
    if len(wide) < len(seeds) or len(std) < len(seeds):
        return f"Not yet: {len(wide)} of {len(seeds)} seeds at init_std {init_std:g}.\n"
    base = S.base_config(ctx.s)
    base_std = S.derived_model(base)['init_std']
    rows = md.head('init_std', 'σ·√d', f'paired gap {pair[1]} − {pair[0]}, mean [95% interval]')
    for value, gaps in ((base_std, std), (init_std, wide)):
        rows.append(f"| {value:g} | {value * base['n_embd'] ** 0.5:.2f} "
                    f"| {interval_cell(list(gaps.values()))} |")
    m, lo, hi = stats.interval95([wide[s] - std[s] for s in seeds])
    word = ("depends on the init geometry" if lo > 0 or hi < 0
            else "no dependence on the init geometry detected")
    rows.append(f"| difference | | {pct(m)} [{pct(lo)}, {pct(hi)}]: **{word}** |")
    return '\n'.join(rows) + f'\n\n![the paired gap at two init geometries]({figure})\n'


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


# -----------------------------------------------------------------------------
# v7: every budget from one warmup-stable-decay run per seed and arm (its cooldown branches)

def wsd_run(ctx, arm, seed, steps, lr=None):
    """The arm's wsd run to `steps` on seed: at lr, or at its selection once tuned; None until
    then. A run to the arm's own max_iters carries no steps in its name (lab/plan.py)."""
    lr = lr or (ctx.plan.chosen.get(arm) or (None,))[0]
    if lr is None:
        return None
    steps = S.steps_name(ctx.s, arm, steps)
    return S.Run(arm, lr, ctx.s.arm(arm)['weight_decay'], seed, steps=steps)


def wsd_check_table(ctx, pairs, seed, lr, margin):
    """Each (wsd arm, cosine arm, steps): the two runs' full val losses on one seed and LR, their
    difference, and the design's rule: WSD stands in for the cosine runs if every difference is
    within margin %."""
    rows, diffs = md.head('arm', 'budget (steps)', 'WSD', 'cosine', 'WSD − cosine'), []
    for wsd, cosine, steps in pairs:
        a = ctx.loss(wsd_run(ctx, wsd, seed, steps, lr))
        b = ctx.loss(S.Run(cosine, lr, ctx.s.arm(cosine)['weight_decay'], seed))
        diff = None if a is None or b is None else 100 * (a - b) / b
        diffs.append(diff)
        rows.append(f"| {wsd} | {steps} | {fmt_loss(a)} | {fmt_loss(b)} | "
                    f"{'-' if diff is None else pct(diff)} |")
    if None in diffs:
        word = f"Not yet: {len(diffs) - diffs.count(None)} of {len(diffs)} pairs of runs are in."
    else:
        within = all(abs(d) <= margin for d in diffs)
        word = (f"Every difference is within ±{margin:g}%: by the design's rule WSD stands in for "
                "the cosine runs." if within else f"Not every difference is within ±{margin:g}%:"
                " by the design's rule v7 is read on its own terms.")
    return '\n'.join(rows) + f"\n\nSeed {seed}, LR {lr:g}, full val loss. {word}\n"


def wsd_gaps(ctx, pair, seeds, steps):
    """{seed: paired gap %} of the pair's wsd runs to `steps`, on the seeds both have."""
    arm, ref = pair
    return stats.paired_gaps({s: ctx.loss(wsd_run(ctx, arm, s, steps)) for s in seeds},
                             {s: ctx.loss(wsd_run(ctx, ref, s, steps)) for s in seeds})


def wsd_budgets_table(ctx, pair, seeds, budgets, steps_1x, margin, below):
    """The family: the paired gap at each budget (the seeds in so far), Holm over the budgets and
    every interval at Bonferroni's level; per seed beside; and the first budget whose interval's
    upper end is below `below` %."""
    sets = [(b, wsd_gaps(ctx, pair, seeds, b * steps_1x)) for b in budgets]
    found = [(b, g) for b, g in sets if len(g) >= 2]
    if not found:
        return "Not yet: no budget has two seeds of both arms.\n"
    results = stats.compare([list(g.values()) for _, g in found], margin=margin,
                            family=len(budgets), one_level=True)
    rows = md.head('budget', 'seeds', 'paired gap, mean ± sd', 'interval (level)', 't p (Holm)',
                   'resolution', 'verdict', 'per seed')
    first = None
    for (b, g), r in zip(found, results):
        per_seed = ', '.join(f"{s}: {pct(x)}" for s, x in sorted(g.items()))
        rows.append(f"| {b:g}× | {len(g)} | {gap_cells(r)} | {r['mde']:.2f}% | "
                    f"{r['verdict']} | {per_seed} |")
        if first is None and r['mean'] + r['half'] < below:
            first = b
    waiting = [f"{b:g}×" for b, g in sets if len(g) < len(seeds)]
    note = (f" Not yet complete: {', '.join(waiting)} (a budget with fewer seeds is an interim "
            "read; the missing budgets count as p = 1)." if waiting else "")
    upper = (f"The first budget whose interval's upper end is below {pct(below)}: "
             f"{'none' if first is None else f'{first:g}×'}.")
    return ('\n'.join(rows) + f"\n\n{pair[0]} − {pair[1]}, full val loss, paired by seed. "
            f"{upper}{note}\n")


def wsd_slopes(ctx, pair, seeds, budgets, steps_1x):
    """({seed: [gap % at each budget]}, {seed: slope per doubling}) for the seeds that have every
    budget of the fit."""
    series = {}
    for seed in seeds:
        gaps = [wsd_gaps(ctx, pair, (seed,), b * steps_1x).get(seed) for b in budgets]
        if None not in gaps:
            series[seed] = gaps
    xs = [math.log2(b) for b in budgets]
    return series, {s: stats.slope(xs, g) for s, g in series.items()}


def crossing_budget(mean_gap, mean_x, slope):
    """The x = log2(budget) where a line through (mean_x, mean_gap) with this slope reaches 0;
    None when it never does ahead (a slope of 0 or of the gap's own sign)."""
    if slope == 0 or (mean_gap > 0) == (slope > 0):
        return None
    return mean_x - mean_gap / slope


def wsd_trend_table(ctx, pair, seeds, budgets, steps_1x, margin, beside, paper=415):
    """The primary reading: each seed's slope of its gap on log2(budget) over `budgets`; the mean
    slope's 95% interval and t p, TOST at ±margin, the resolution and the smallest margin the data
    support; the design's word; and, labelled as extrapolation, where the fitted line reaches 0,
    in byte tokens per parameter of each arm."""
    series, slopes = wsd_slopes(ctx, pair, seeds, budgets, steps_1x)
    if len(slopes) < 2:
        return f"Not yet: {len(slopes)} of {len(seeds)} seeds have every budget of the fit.\n"
    r = stats.tests(list(slopes.values()), margin)
    t = stats.t_dist()
    half = t.ppf(0.975, r['df']) * r['se']
    word = ('closing' if r['p_t'] < 0.05 and r['mean'] < 0 else
            'widening' if r['p_t'] < 0.05 else
            'not closing' if r['p_tost'] < 0.05 else 'could not tell')
    supported = abs(r['mean']) + t.ppf(0.95, r['df']) * r['se']
    resolution = stats.resolution(r['se'], r['df'], 0.05)
    rows = md.head('seed', *(f"{b:g}×" for b in budgets), 'slope (points per doubling)')
    for seed, gaps in sorted(series.items()):
        rows.append(f"| {seed} | " + ' | '.join(pct(g) for g in gaps)
                    + f" | {slopes[seed]:+.3f} |")
    means = [sum(g[i] for g in series.values()) / len(series) for i in range(len(budgets))]
    rows.append("| mean | " + ' | '.join(pct(m) for m in means) + f" | {r['mean']:+.3f} |")
    text = '\n'.join(rows) + (
        f"\n\nMean slope {r['mean']:+.3f} points per doubling [{r['mean'] - half:+.3f}, "
        f"{r['mean'] + half:+.3f}] (95%, {len(slopes)} seeds), t p {fmt_p(r['p_t'])}; TOST at "
        f"±{margin:g} p {fmt_p(r['p_tost'])}; resolution {resolution:.2f} (80% power, 0.05); "
        f"the data support |slope| < {supported:.2f} (one-sided 95%). "
        + (f"By the design's rule: **{word}**." if len(slopes) == len(seeds) else
           f"Interim, {len(slopes)} of {len(seeds)} seeds: the design's rule is read at all of "
           f"them (now: {word})."))
    return text + '\n\n' + extrapolation(ctx, pair, series, slopes, budgets, steps_1x, half,
                                         paper) + beside_note(ctx, pair, seeds, beside,
                                                              steps_1x)


def extrapolation(ctx, pair, series, slopes, budgets, steps_1x, half, paper):
    """Where the line fitted to the mean gap reaches 0, with the range over the slope's 95%
    interval, in byte tokens per parameter of each arm."""
    xs = [math.log2(b) for b in budgets]
    mean_x = sum(xs) / len(xs)
    mean_gap = sum(sum(g) / len(g) for g in series.values()) / len(series)
    b = sum(slopes.values()) / len(slopes)
    seed = next(iter(series))
    runs = [wsd_run(ctx, arm, seed, budgets[0] * steps_1x) for arm in pair]
    params = [ctx.config(r)['params'] for r in runs]
    tokens_1x = S.tokens(dict(ctx.config(runs[0]), max_iters=steps_1x))
    at = lambda x: ('never ahead' if x is None else ', '.join(
        f"{tokens_1x * 2 ** x / p:,.0f}" for p in params))
    x0 = crossing_budget(mean_gap, mean_x, b)
    ends = [crossing_budget(mean_gap, mean_x, s) for s in (b - half, b + half)]
    label = ' and '.join(pair)
    return (f"Extrapolation, beyond the runs: the fitted line reaches 0 at {at(x0)} byte tokens "
            f"per parameter ({label}); over the slope's 95% interval, from {at(ends[0])} to "
            f"{at(ends[1])}. The paper measures at about {paper} BPE tokens per parameter; the "
            f"longest run here is {budgets[-1] * tokens_1x / params[0]:,.0f} ({pair[0]}).")


def beside_note(ctx, pair, seeds, beside, steps_1x):
    """The gap at a budget outside the fit (2x), for the same seeds."""
    gaps = wsd_gaps(ctx, pair, seeds, beside * steps_1x)
    if len(gaps) < 2:
        return "\n"
    return (f" Outside the fit, at {beside:g}×: {interval_cell(list(gaps.values()))} (95%, "
            f"{len(gaps)} seeds).\n")


def wsd_cooldown_table(ctx, pair, seeds, budgets, steps_1x, stable):
    """Tokens against the cooldown: at each budget's last step, the stable runs' paired gap (the
    peak LR, no cooldown) beside the branches' (the same val windows), and what each arm's
    cooldown gains over its stable run, mean over seeds [95% interval], unadjusted."""
    rows = md.head('budget', 'step', f'stable runs {pair[0]} − {pair[1]}',
                   'branches, the same windows', f'cooldown {pair[0]}',
                   f'cooldown {pair[1]}', 'seeds')
    for b in budgets:
        step, cells = b * steps_1x, {'stable': [], 'branch': [], 0: [], 1: []}
        for seed in seeds:
            runs = [(wsd_run(ctx, a, seed, stable), wsd_run(ctx, a, seed, step)) for a in pair]
            if any(ctx.loss(r) is None for two in runs for r in two):
                continue
            val = [[eval_series(ctx.log(r)).get(step) for r in two] for two in runs]
            if any(v is None for two in val for v in two):
                continue
            (arm_stable, arm_branch), (ref_stable, ref_branch) = val
            cells['stable'].append(100 * (arm_stable - ref_stable) / ref_stable)
            cells['branch'].append(100 * (arm_branch - ref_branch) / ref_branch)
            for i, (s_loss, b_loss) in enumerate(val):
                cells[i].append(100 * (b_loss - s_loss) / s_loss)
        show = lambda v: interval_cell(v) if len(v) > 1 else '-'
        rows.append(f"| {b:g}× | {step} | " + ' | '.join(
            show(cells[k]) for k in ('stable', 'branch', 0, 1)) + f" | {len(cells[0])} |")
    return ('\n'.join(rows) + "\n\nVal loss on the fixed windows of the evaluations, in % (mean "
            "over seeds [95% interval], unadjusted, outside the family). A cooldown column is "
            "the branch's loss against its stable run's at the same step. The stable run at its "
            "last step has cooled down itself, so its budget has no row.\n")
