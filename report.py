"""
Compare finished runs: a PNG of train and val loss against tokens seen, and a markdown
table (parameters, final and best val loss, difference against the first run, tokens/s).

    python report.py out-small/baseline out-small/reduced --png=loss.png --md=table.md

The first run is the reference. matplotlib is needed for the PNG only.
"""
import os
import statistics
import sys

import torch

from common import UserError, atomic_write, load_checkpoint, parse_config, read_json, read_jsonl, run_main, write_text
from model import GPT, GPTConfig

DEFAULTS = dict(
    png=None,  # where to write the plot; None: no plot
    md=None,  # where to write the markdown table; it is printed either way
    smooth=0.9,  # exponential smoothing of the per-step train loss in the plot
    best=False,  # only print the run directory with the lowest final val loss
)


def read_run(out_dir):
    log_path = os.path.join(out_dir, 'log.jsonl')
    if not os.path.exists(log_path):
        raise UserError(f"no log.jsonl in {out_dir}: is it a train.py run directory?")
    log = read_jsonl(log_path)
    config = read_json(os.path.join(out_dir, 'config.json'), 'config.json')
    evals = [e for e in log if 'val_loss' in e]
    steps = [e for e in log if 'loss' in e]
    if not evals:
        raise UserError(f"{out_dir} has no evaluation yet: nothing to compare")
    model_args = load_checkpoint(os.path.join(out_dir, 'ckpt.pt'), mmap=True)['model_args']
    with torch.device('meta'):
        model = GPT(GPTConfig.from_dict(model_args), verbose=False)
    return dict(name=os.path.basename(os.path.normpath(out_dir)), config=config, evals=evals, steps=steps,
                params=model.get_num_params(), describe=describe(model.config, config))


def describe(cfg, config):
    parts = [f"{'W_Q=I' if cfg.query_identity else 'W_K=I' if cfg.key_identity else 'W_V=I' if cfg.value_identity else 'full attention'}"]
    parts.append(f"d={cfg.n_embd}, mlp={cfg.mlp_hidden}, wd={config['weight_decay']:g}")
    return ', '.join(parts)


def fmt_params(n):
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def table(runs):
    ref = runs[0]['evals'][-1]['val_loss']
    rows = ["| run | variant | params | tokens | final val loss | best val loss | vs first | tokens/s (median) |",
            "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        final, best = r['evals'][-1]['val_loss'], min(e['val_loss'] for e in r['evals'])
        speeds = [e['tokens_per_s'] for e in r['steps'] if e.get('tokens_per_s')]
        speed = f"{statistics.median(speeds):,.0f}" if speeds else "-"
        rows.append(f"| {r['name']} | {r['describe']} | {fmt_params(r['params'])} | {r['evals'][-1]['tokens']:,} | "
                    f"{final:.4f} | {best:.4f} | {100 * (final - ref) / ref:+.2f}% | {speed} |")
    return '\n'.join(rows) + '\n'


def smoothed(values, beta):
    out, avg = [], None
    for v in values:
        avg = v if avg is None else beta * avg + (1 - beta) * v
        out.append(avg)
    return out


def plot(runs, path, beta):
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("the plot needs matplotlib: `pip install matplotlib`, or leave out --png") from None
    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(13, 4.8))
    for r in runs:
        label = f"{r['name']} ({fmt_params(r['params'])})"
        if r['steps']:
            ax_train.plot([e['tokens'] for e in r['steps']], smoothed([e['loss'] for e in r['steps']], beta), label=label)
        ax_val.plot([e['tokens'] for e in r['evals']], [e['val_loss'] for e in r['evals']], marker='o', ms=3, label=label)
    for ax, title in ((ax_train, f'train loss (per step, smoothed {beta})'), (ax_val, 'val loss (fixed eval batches)')):
        ax.set_xlabel('tokens seen')
        ax.set_ylabel('loss')
        ax.set_title(title)
        ax.grid(alpha=0.3)
    # the interesting part is the end: zoom the val panel on the last two thirds
    tail = [e['val_loss'] for r in runs for e in r['evals'][len(r['evals']) // 3:]]
    ax_val.set_ylim(min(tail) - 0.02, max(tail) + 0.02)
    ax_val.legend(fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format='png'))
    plt.close(fig)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    dirs = [a for a in argv if not a.startswith('--')]
    c = parse_config(DEFAULTS, [a for a in argv if a.startswith('--')])
    if not dirs:
        raise UserError("give one or more run directories: python report.py out-a out-b [--png=x.png] [--md=x.md]")
    runs = [read_run(d) for d in dirs]
    if c['best']:
        best = min(zip(runs, dirs), key=lambda rd: rd[0]['evals'][-1]['val_loss'])[1]
        print(os.path.normpath(best))
        return best
    md = table(runs)
    print(md, end='')
    if c['md']:
        os.makedirs(os.path.dirname(c['md']) or '.', exist_ok=True)
        write_text(c['md'], md)
    if c['png']:
        os.makedirs(os.path.dirname(c['png']) or '.', exist_ok=True)
        plot(runs, c['png'], c['smooth'])
        print(f"wrote {c['png']}")
    return runs


if __name__ == '__main__':
    run_main(main)
