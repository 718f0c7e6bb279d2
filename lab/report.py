"""
Compare finished runs: loss curves, a table, and, for runs repeated over paired seeds, the
paired gap against the first variant with the verdict of the decision rule stated below.

    python -m lab.report out-small/baseline out-small/reduced --png=loss.png --md=table.md
    python -m lab.report out/baseline_s{1,2,3} out/reduced_s{1,2,3} --gap_png=gap.png
    python -m lab.report out-repro/*_s1 --sweep=True --md=sweep.md --png=sweep.png

The first run (the first variant) is the reference. Runs whose names differ only by a final
`_s<seed>` are one variant over seeds, paired by seed (seed = data_seed: the same batches).
The decision rule is docs/experiments.md's: a variant is "better" or "worse" when its paired t
test rejects after Holm's correction across the table's comparisons, "matches" when two
one-sided tests put the gap within +-0.3%, else "could not tell". The final val loss is
val_loss_full (every val token once) where the run has it. matplotlib is needed for plots.
"""
import functools
import os
import re
import statistics
import sys

if not __package__:  # run as a file, not with -m: import from the repository root all the same
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from kvgpt.errors import quiet_imports  # first: Ctrl-C in the imports below is one line
quiet_imports(__name__)

import torch

from kvgpt.checkpoint import load_checkpoint
from kvgpt.config import Kind, defaults, keys, parse_config, variants
from kvgpt.errors import UserError, run_main
from kvgpt.files import atomic_write, read_json, read_jsonl, write_text
from lab import markdown as md, stats
from lab.plan import log_file
from model import GPT, GPTConfig

KEYS = keys(
    png=(None, "loss curves (with sweep=True: final val loss against weight decay); None: no plot",
         Kind(str)),
    md=(None, "where to write the markdown tables; they are printed either way", Kind(str)),
    gap_png=(None, "the paired relative gap of each variant to the first, against tokens",
             Kind(str)),
    diag_png=(None, "every run's diagnostics (attention logit std, entropy, q/k RMS, weight "
              "norms)", Kind(str)),
    sweep=(False, "runs named <arm>_wd<lambda>_s<seed>: final val loss per arm and weight decay"),
    smooth=(0.9, "the train-loss curve's moving average: this much weight per step on the past"),
    best=(False, "only print the run directory with the lowest final val loss"),
)
DEFAULTS = defaults(KEYS)
QUERY_LABEL = dict(linear='full attention', identity='W_Q=I', residual='q=x+xW_Q',
                   residual_gelu='q=x+GELU(xW_Q)', nonlinear='nonlinear q')
# the gap figure's reference lines: no gap, and the margin within which the rule says "matches"
BANDS = [(0.0, 'no gap'), (stats.MARGIN, f'±{stats.MARGIN:g}%: the margin of "matches"'),
         (-stats.MARGIN, None)]
SMOOTH_MIN_POINTS = 10  # fewer logged steps than this are drawn as they are
# what variant files are read against
DEFAULT_GEOMETRY = {k: v for k, v in GPTConfig().__dict__.items()}


def read_run(out_dir):
    log_path = log_file(out_dir)  # a committed run's is gzipped
    if log_path is None:
        raise UserError(f"no log.jsonl (nor log.jsonl.gz) in {out_dir}: is it a train.py run "
                        "directory?")
    log = read_jsonl(log_path)
    config = read_json(os.path.join(out_dir, 'config.json'), 'config.json')
    evals = [e for e in log if 'val_loss' in e]
    if not evals:
        raise UserError(f"{out_dir} has no evaluation yet: nothing to compare")
    model_args = (config.get('model_args')
                  or load_checkpoint(os.path.join(out_dir, 'ckpt.pt'), mmap=True)['model_args'])
    with torch.device('meta'):  # runs from before config.json held model_args: from the checkpoint
        model = GPT(GPTConfig.from_dict(model_args), verbose=False)
    name = os.path.basename(os.path.normpath(out_dir))
    return dict(name=name, arm=re.sub(r'_s\d+$', '', name), config=config, evals=evals,
                steps=[e for e in log if 'loss' in e], params=model.get_num_params(),
                settings=settings_of(model.config, config))


def settings_of(cfg, config):
    """What a run's variant column can name: its query and what else sets a variant apart."""
    query = ('W_K=I' if cfg.key_identity else 'W_V=I' if cfg.value_identity
             else QUERY_LABEL[cfg.query])
    return dict(query=query, d=cfg.n_embd, layers=cfg.n_layer, heads=cfg.n_head,
                kv_heads=cfg.n_kv_head, mlp=cfg.mlp_hidden, pos=cfg.pos,
                qk_norm='on' if cfg.qk_norm else 'off',
                scale=f"1/{1 / cfg.scale:.3g}" + (' learned' if cfg.learn_scale else ''),
                wd=f"{config.get('weight_decay', float('nan')):g}")


def describe(runs):
    """Each run's variant: its query, then every setting in which the runs differ."""
    keys = [k for k in runs[0]['settings'] if k == 'query' or
            len({r['settings'][k] for r in runs}) > 1]
    return [', '.join(r['settings'][k] if k == 'query' else f"{k}={r['settings'][k]}"
                      for k in keys) for r in runs]


def mismatch(runs):
    """A one-line warning when the runs are not comparable as trained (their lengths, tokens,
    data or vocabulary differ), else None."""
    what = dict(steps=lambda r: r['evals'][-1]['iter'], tokens=lambda r: r['evals'][-1]['tokens'],
                data=lambda r: r['config'].get('dataset'),
                vocabulary=lambda r: r['config'].get('model_args', {}).get('vocab_size'))
    differ = [f"{name} ({', '.join(map(str, dict.fromkeys(get(r) for r in runs)))})"
              for name, get in what.items() if len({get(r) for r in runs}) > 1]
    return ("warning: these runs differ in " + '; '.join(differ) +
            ": their losses are not a like-for-like comparison") if differ else None


def fmt_params(n):
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def final(run):
    """The run's final val loss: over the whole val split when it has one (val_loss_full)."""
    last = run['evals'][-1]
    return last.get('val_loss_full', last['val_loss'])


def table(runs):
    ref, warning = final(runs[0]), mismatch(runs)
    rows = ([warning, ''] if warning else []) + [
        *md.head('run', 'variant', 'params', 'tokens', 'final val loss (full split)',
                 'best val loss (fixed windows)', 'vs first', 'tokens/s (median)')]
    windows = [r['name'] for r in runs if 'val_loss_full' not in r['evals'][-1]]
    for r, variant in zip(runs, describe(runs)):
        speeds = [e['tokens_per_s'] for e in r['steps'] if e.get('tokens_per_s')]
        speed = f"{statistics.median(speeds):,.0f}" if speeds else "-"
        mark = '*' if r['name'] in windows else ''
        rows.append(f"| {r['name']} | {variant} | {fmt_params(r['params'])} "
                    f"| {r['evals'][-1]['tokens']:,} | "
                    f"{final(r):.4f}{mark} | {min(e['val_loss'] for e in r['evals']):.4f} | "
                    f"{100 * (final(r) - ref) / ref:+.2f}% | {speed} |")
    if windows:  # a run still going, or stopped before its final evaluation
        rows += ['', "\\* no full-split loss yet: the fixed-window loss of the run's last "
                 "evaluation, at the tokens shown"]
    return '\n'.join(rows) + '\n'


# -----------------------------------------------------------------------------
# variants over paired seeds

def group_runs(runs):
    """{arm: [runs]} in the order the arms first appear."""
    groups = {}
    for r in runs:
        groups.setdefault(r['arm'], []).append(r)
    return groups


def paired_gaps(ref_runs, runs, at=None):
    """{seed: 100 (L - L_ref) / L_ref} for the seeds both have, at eval step `at` (None: the
    last)."""
    def loss(r):
        if at is None:
            return final(r)
        return next((e['val_loss'] for e in r['evals'] if e['iter'] == at), None)
    return stats.paired_gaps({r['config']['seed']: loss(r) for r in runs},
                             {r['config']['seed']: loss(r) for r in ref_runs})


def aggregate_table(groups):
    """Each variant against the first over paired seeds, by the rule of docs/experiments.md (Holm
    across the table's comparisons, equivalence within +-MARGIN %)."""
    (ref_name, ref_runs), others = next(iter(groups.items())), list(groups.items())[1:]
    found = stats.compare([list(paired_gaps(ref_runs, runs).values()) for _, runs in others])
    rows = md.head('variant', 'weight decay', 'seeds', 'final val loss (mean +- sd)',
                   f'paired gap to {ref_name} (mean +- sd)', 'interval (Holm level)', 'p (Holm)',
                   'verdict')
    for i, (name, runs) in enumerate(groups.items()):
        mean, sd = stats.mean_sd(final(r) for r in runs)
        wd = ', '.join(sorted({f"{r['config']['weight_decay']:g}" for r in runs}))
        head = f"| {name} | {wd} | {len(runs)} | {mean:.4f} +- {sd:.4f} |"
        if i == 0:
            rows.append(head + " (reference) | | | |")
            continue
        s = found[i - 1]
        low, high = s['mean'] - s['half'], s['mean'] + s['half']
        rows.append(f"{head} {s['mean']:+.2f}% +- {s['sd']:.2f}% | [{low:+.2f}%, "
                    f"{high:+.2f}%] ({100 * s['level']:.1f}%) "
                    f"| {s['p_t']:.3f} ({s['p_t_holm']:.3f}) | {s['verdict']} |")
    return '\n'.join(rows) + '\n'


def sweep_table(runs):
    """Final val loss of each arm at each weight decay, one seed; the gap to the first arm at the
    same weight decay (matched lambda) beside it."""
    cells = {(r['arm'].split('_wd')[0], r['config']['weight_decay']): r for r in runs}
    arms = list(dict.fromkeys(a for a, _ in cells))
    rows = md.head('weight decay', *arms)
    for wd in sorted({w for _, w in cells}):
        ref = cells.get((arms[0], wd))
        row = [f"{wd:g}"]
        for arm in arms:
            r = cells.get((arm, wd))
            paired = r and ref and arm != arms[0]
            gap = f" ({100 * (final(r) - final(ref)) / final(ref):+.2f}%)" if paired else ""
            row.append(f"{final(r):.4f}{gap}" if r else "-")
        rows.append("| " + " | ".join(row) + " |")
    best = {arm: min((r for (a, _), r in cells.items() if a == arm), key=final) for arm in arms}
    rows.append("| best | " + " | ".join(f"{best[a]['config']['weight_decay']:g}" for a in arms)
                + " |")
    return '\n'.join(rows) + '\n'


# -----------------------------------------------------------------------------
# plots

def pyplot():
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("plots need matplotlib: `pip install matplotlib`, or leave out the png "
                        "options") from None
    return plt


def save_figure(fig, path):
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format='png'))
    pyplot().close(fig)
    print(f"wrote {path}")


@functools.lru_cache(maxsize=None)
def known_variants():
    return tuple(variants(dict(DEFAULT_GEOMETRY)))


def variant_color(name, i=0):
    """One colour per variant in every figure: the variant's place among the config files (on
    tab20), for a run or arm named after it (the longest variant name it starts with); else the
    i-th default colour."""
    names = known_variants()
    match = max((v for v in names if name == v or name.startswith(v + '_')), key=len, default=None)
    return pyplot().get_cmap('tab20')(names.index(match) % 20) if match else f"C{i % 10}"


def smoothed(steps, values, beta):
    """An exponential moving average over steps, not over logged points: beta is the weight per
    step on the past, so points logged every k steps carry beta**k, and the curve follows the
    run at any log interval (time constant 1/(1 - beta) steps)."""
    out, avg, last = [], None, None
    for step, v in zip(steps, values):
        w = beta ** (step - last) if avg is not None else 0.0
        avg, last = w * avg + (1 - w) * v if avg is not None else v, step
        out.append(avg)
    return out


def train_curve(r, beta):
    """(steps' tokens, losses, how they were drawn): a moving average over steps, or the logged
    losses as they are when a run has few of them."""
    steps = r['steps']
    tokens, losses = [e['tokens'] for e in steps], [e['loss'] for e in steps]
    if len(steps) < SMOOTH_MIN_POINTS or not 0 < beta < 1:
        return tokens, losses, False
    return tokens, smoothed([e['iter'] for e in steps], losses, beta), True


def plot(runs, path, beta):
    fig, (ax_train, ax_val) = pyplot().subplots(1, 2, figsize=(13, 4.8))
    drawn = set()
    for i, r in enumerate(runs):
        label, color = f"{r['name']} ({fmt_params(r['params'])})", variant_color(r['name'], i)
        if r['steps']:
            tokens, losses, smooth = train_curve(r, beta)
            drawn.add(smooth)
            ax_train.plot(tokens, losses, label=label, color=color,
                          marker=None if smooth else 'o', ms=3)
        ax_val.plot([e['tokens'] for e in r['evals']], [e['val_loss'] for e in r['evals']],
                    marker='o', ms=3, label=label, color=color)
    how = {frozenset({True}): f'moving average over steps, time constant {1 / (1 - beta):.0f} '
           'steps', frozenset({False}): 'as logged'}.get(frozenset(drawn),
                                                          f'as logged under {SMOOTH_MIN_POINTS} '
                                                          'points, else averaged over steps')
    # the interesting part is the end: zoom the val panel on the last two thirds, and say so
    tail = [e['val_loss'] for r in runs for e in r['evals'][len(r['evals']) // 3:]]
    top = max(tail) + 0.02
    ax_val.set_ylim(min(tail) - 0.02, top)
    off = sum(e['val_loss'] > top for r in runs for e in r['evals'])
    zoom = f"; {off} earlier point{'s' * (off != 1)} above {top:.2f} off the chart" if off else ""
    for ax, title in ((ax_train, f'train loss ({how})'),
                      (ax_val, f'val loss (fixed windows{zoom})')):
        ax.set(xlabel='tokens seen', ylabel='loss', title=title)
        ax.grid(alpha=0.3)
    ax_val.legend(fontsize=8)
    warn(fig, runs)
    save_figure(fig, path)


def warn(fig, runs):
    """The runs' mismatch warning (if any) across the top of a figure."""
    warning = mismatch(runs)
    if warning:
        fig.suptitle(warning, color='firebrick', fontsize=9)


def seeds_word(n):
    return f"{n} seed" + ("" if n == 1 else "s")


def plot_gaps(groups, path):
    """Mean paired gap +- sd against tokens, with the rule's reference lines, each labelled."""
    fig, ax = pyplot().subplots(figsize=(8, 4.8))
    ref_name, ref_runs = next(iter(groups.items()))
    for name, runs in list(groups.items())[1:]:
        iters = [e['iter'] for e in runs[0]['evals'] if e['iter'] > 0]
        points = [(it, stats.mean_sd(paired_gaps(ref_runs, runs, at=it).values())) for it in iters
                  if paired_gaps(ref_runs, runs, at=it)]
        last = runs[0]['evals'][-1]
        tokens = [it * last['tokens'] / last['iter'] for it, _ in points]
        means = [m for _, (m, _) in points]
        sds = [0.0 if s != s else s for _, (_, s) in points]
        line, = ax.plot(tokens, means, marker='o', ms=3,
                        label=f"{name} ({seeds_word(len(runs))})", color=variant_color(name))
        ax.fill_between(tokens, [m - s for m, s in zip(means, sds)],
                        [m + s for m, s in zip(means, sds)], color=line.get_color(), alpha=0.2)
    for y, label in BANDS:
        ax.axhline(y, color='grey', lw=0.8, ls='-' if y == 0 else ':', label=label)
    ax.set(xlabel='tokens seen', ylabel=f'val loss gap to {ref_name} (%)',
           title='paired relative gap, mean +- sd over seeds')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    warn(fig, [r for runs in groups.values() for r in runs])
    save_figure(fig, path)


def plot_sweep(runs, path):
    fig, ax = pyplot().subplots(figsize=(7, 4.5))
    arms = group_runs([dict(r, arm=r['arm'].split('_wd')[0]) for r in runs])
    for i, (arm, members) in enumerate(arms.items()):
        members = sorted(members, key=lambda r: r['config']['weight_decay'])
        ax.plot([r['config']['weight_decay'] for r in members], [final(r) for r in members],
                marker='o', label=arm, color=variant_color(arm, i))
    positive = [r['config']['weight_decay'] for r in runs if r['config']['weight_decay'] > 0]
    # a log axis would drop weight decay 0: linear below the smallest positive value
    ax.set_xscale('symlog', linthresh=min(positive, default=1.0))
    ax.set(xlabel='weight decay (logarithmic above the smallest positive value; 0 shown)',
           ylabel='final val loss', title='each arm at matched weight decay')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    warn(fig, runs)
    save_figure(fig, path)


DIAG_PANELS = [('logit_std', 'attention logit std (after scale)'),
               ('entropy_norm', 'attention entropy / ln t'),
               ('q_rms', 'RMS of q'), ('k_rms', 'RMS of k')]
NORM_GROUPS = ['attn_in', 'attn_out', 'mlp_in', 'mlp_out', 'embeddings']


def plot_diagnostics(runs, path):
    """Small multiples: per-layer attention statistics (one line per layer, darker = deeper) and
    the Frobenius norm of each weight group, against tokens."""
    runs = [r for r in runs if any('diagnostics' in e for e in r['evals'])]
    if not runs:
        raise UserError("no diagnostics in these runs' logs (trained without --probe=lab.probes?)")
    plt = pyplot()
    fig, axes = plt.subplots(3, 3, figsize=(14, 10))
    for i, r in enumerate(runs):
        evals = [e for e in r['evals'] if 'diagnostics' in e]
        tokens = [e['tokens'] for e in evals]
        n_layer = len(evals[0]['diagnostics']['entropy'])
        color = variant_color(r['name'], i)
        dot = dict(marker='o') if len(evals) == 1 else {}  # one evaluation: a point, not a line
        for ax, (key, _) in zip(axes.flat, DIAG_PANELS):
            for layer in range(n_layer):
                ax.plot(tokens, [e['diagnostics'][key][layer] for e in evals], color=color,
                        alpha=0.35 + 0.65 * (layer + 1) / n_layer,
                        label=r['name'] if layer == n_layer - 1 else None, **dot)
        for ax, group in zip(axes.flat[len(DIAG_PANELS):], NORM_GROUPS):
            ax.plot(tokens, [e['diagnostics']['weight_norm'][group] for e in evals], color=color,
                    label=r['name'], **dot)
    titles = [t for _, t in DIAG_PANELS] + [f'|W| {g}' for g in NORM_GROUPS]
    for ax, title in zip(axes.flat, titles):
        ax.set(xlabel='tokens seen', title=title)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    save_figure(fig, path)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    dirs = [a for a in argv if not a.startswith('-')]
    c = parse_config(KEYS, [a for a in argv if a.startswith('-')], usage=__doc__)
    if not dirs:
        raise UserError("give one or more run directories: "
                        "python -m lab.report out-a out-b [--png=x.png] [--md=x.md]")
    runs = [read_run(d) for d in dirs]
    if c['best']:
        best = min(zip(runs, dirs), key=lambda rd: final(rd[0]))[1]
        print(os.path.normpath(best))
        return best
    groups = group_runs(runs)
    md = sweep_table(runs) if c['sweep'] else table(runs)
    if not c['sweep'] and any(len(g) > 1 for g in groups.values()):
        md += '\n' + aggregate_table(groups)
    print(md, end='')
    if c['md']:
        os.makedirs(os.path.dirname(c['md']) or '.', exist_ok=True)
        write_text(c['md'], md)
    if c['png']:
        plot_sweep(runs, c['png']) if c['sweep'] else plot(runs, c['png'], c['smooth'])
    if c['gap_png']:
        plot_gaps(groups, c['gap_png'])
    if c['diag_png']:
        plot_diagnostics(runs, c['diag_png'])
    return runs


if __name__ == '__main__':
    run_main(main)
