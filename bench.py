"""
Measure training speed, side by side, in one process:

    python bench.py                      # train steps: baseline vs reduced vs reduced_mlp
    python bench.py --n_layer=4 --n_embd=256 --block_size=256 --batch_size=8
    python bench.py --variants=baseline,reduced,baseline+modern,reduced+modern  # '+' stacks
    python bench.py --variants=baseline,reduced --optimizers=adamw,muon  # each under each

The variants' steps alternate, so drift of a shared machine hits all of them alike, and the
medians are reported. On a GPU, MFU is against the device's bf16 peak; on a CPU, achieved FLOP/s
is compared with this machine's own measured matmul throughput. Each variant also prints one
JSON line (prefixed "json:"). The lab's benchmarks (decoding, preparing, runs per hour,
attention kernels) are `python -m lab.costs`.
"""
from kvgpt.errors import quiet_imports  # first: Ctrl-C in the imports below is one line
quiet_imports(__name__)

import json
import os
import statistics
import time

import torch

from kvgpt.config import (Kind, config_file, defaults, keys, parse_config, run_config_file,
                          variant_settings)
from kvgpt.data import open_dataset
from kvgpt.device import DTYPES, device_peak_flops, setup_device
from kvgpt.errors import UserError, run_main
from kvgpt.optimizer import OPTIMIZERS, build_optimizer
from model import GPT, GPTConfig
from train import DEFAULTS as TRAIN_DEFAULTS

KEYS = keys(
    variants=('baseline,reduced,reduced_mlp', "config/<name>.py files, compared side by side"),
    optimizers=('adamw', "train.py's optimizer settings, each variant timed under each"),
    n_layer=(12, "the geometry every variant is measured at (GPT-2 small's by default)"),
    n_head=(12, "attention heads"),
    n_embd=(768, "width; a variant file's settings are evaluated against it"),
    block_size=(1024, "tokens per sequence"),
    vocab_size=(50304, "GPT-2's, padded to a multiple of 64"),
    batch_size=(4, "sequences per step"),
    steps=(10, "timed steps per variant"),
    warmup=(2, "untimed steps per variant first (compilation happens here)"),
    device=(None, "None: cuda when available, else cpu", Kind('device')),
    dtype=(None, "None: bfloat16 on a GPU with native bf16, float16 on an older one, "
                  "float32 on cpu", Kind(str, DTYPES)),
    compile=(None, "None: on for cuda", Kind(bool)),
    dataset=(None, "train on real tokens from data/<dataset>/train.bin; None: random tokens",
             Kind(str)),
    data_root=('data', "where prepared datasets live (with dataset)"),
    json_out=(None, "append the results' JSON lines to this file", Kind(str)),
    seed=(1337, "model init and random tokens"),
)
DEFAULTS = defaults(KEYS)


def variant_config(name, c):
    """The model of config/<name>.py at bench's geometry: the file's model settings, evaluated
    against n_embd and n_head, so the paper's variants keep their ratios at any size. A name
    like 'reduced+modern' stacks config/modern.py's model settings onto the variant's."""
    geometry = {k: c[k] for k in ('n_layer', 'n_head', 'n_embd', 'block_size', 'vocab_size')}
    base = dict(GPTConfig(**geometry).__dict__)
    first, *extras = name.split('+')
    settings = variant_settings(first, base, base.keys())
    for extra in extras:
        path = config_file(extra)
        if not os.path.isfile(path):
            raise UserError(f"unknown config '{extra}' in '{name}': what follows a '+' is a file "
                            "config/<name>.py stacked onto the variant")
        made = run_config_file(path, {**base, **settings})
        settings.update({k: v for k, v in made.items() if k in base})
    return GPTConfig(**{**geometry, **settings})


def sync(device):
    if device.startswith('cuda'):
        torch.cuda.synchronize()


def cpu_matmul_flops(dtype=torch.float32, n=2048, reps=5):
    """This machine's own matmul throughput: the ceiling a CPU figure is compared with."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / statistics.median(times)


def batches(c, device):
    if c['dataset']:
        data = open_dataset(c['data_root'], c['dataset'], c['block_size'])
        return data.batch('train', data.starts('train', c['batch_size'], c['seed']), device)
    g = torch.Generator().manual_seed(c['seed'])
    xy = torch.randint(c['vocab_size'], (c['batch_size'], c['block_size'] + 1), generator=g)
    return xy[:, :-1].contiguous().to(device), xy[:, 1:].contiguous().to(device)


def bench_train(c, dev):
    """Train steps of every variant, alternated step by step, then the medians."""
    x, y = batches(c, dev.device)
    runs, optimizers = [], c['optimizers'].split(',')
    for optimizer in optimizers:
        if optimizer not in OPTIMIZERS:
            raise UserError(f"optimizers: {optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
    for name in c['variants'].split(','):
        for optimizer in optimizers:  # train.py's defaults: its optimizer as a run builds it
            torch.manual_seed(c['seed'])
            model = GPT(variant_config(name, c), verbose=False).to(dev.device)
            opt = build_optimizer(model, dict(TRAIN_DEFAULTS, optimizer=optimizer), dev.type)
            label = name if optimizers == ['adamw'] else f"{name} {optimizer}"
            runs.append(dict(name=label, model=model, opt=opt, times=[], peak=0,
                             fn=torch.compile(model) if dev.compile else model))
    for r in runs:
        for _ in range(c['warmup']):
            train_step(r, x, y, dev)
    for _ in range(c['steps']):
        for r in runs:  # alternate: drift hits every variant alike
            timed_step(r, x, y, dev)
    peak = device_peak_flops(dev.device)
    mm_dtype = torch.float32 if dev.dtype == 'float16' else getattr(torch, dev.dtype)
    ceiling = None if peak else cpu_matmul_flops(mm_dtype)
    device = torch.cuda.get_device_name(dev.device) if dev.type == 'cuda' else 'cpu'
    tokens = c['batch_size'] * c['block_size']
    results = [dict(mode='train', device=device, dtype=dev.dtype, compile=dev.compile,
                    **train_result(r, tokens, c['block_size'], peak, ceiling)) for r in runs]
    print(f"\n{c['batch_size']} x {c['block_size']} tokens per step, "
          f"{c['n_layer']}L/{c['n_head']}H/{c['n_embd']}d, {dev.device} {dev.dtype}, "
          f"compile={dev.compile}, median of {c['steps']} alternated steps")
    print(f"{'variant':<20}{'params':>12}{'ms/step':>10}{'tokens/s':>11}{'vs first':>10}"
          f"{'FLOP ratio':>11}{'TFLOP/s':>9}{'MFU' if peak else '% of mm':>9}{'state MB':>10}")
    ref = results[0]
    for r in results:
        util = r['mfu'] if peak else r['fraction_of_matmul']
        print(f"{r['variant']:<20}{r['params']:>12,}{r['ms_per_step']:>10.1f}"
              f"{r['tokens_per_s']:>11,.0f}{r['ms_per_step'] / ref['ms_per_step']:>10.3f}"
              f"{r['flops_per_token'] / ref['flops_per_token']:>11.3f}"
              f"{r['achieved_tflops']:>9.3f}{100 * util:>8.1f}%{r['state_mb']:>10.1f}")
    for r in results:
        print('json: ' + json.dumps(r))
    return results


def train_step(r, x, y, dev):
    with dev.ctx:
        _, loss = r['fn'](x, y)
    loss.backward()
    r['opt'].step()
    r['opt'].zero_grad(set_to_none=True)


def timed_step(r, x, y, dev):
    sync(dev.device)
    if dev.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(dev.device)
        base = torch.cuda.memory_allocated(dev.device)
    t0 = time.perf_counter()
    train_step(r, x, y, dev)
    sync(dev.device)
    r['times'].append(time.perf_counter() - t0)
    if dev.type == 'cuda':
        r['peak'] = max(r['peak'], torch.cuda.max_memory_allocated(dev.device) - base)


def train_result(r, tokens, block_size, peak, ceiling):
    model = r['model']
    dt = statistics.median(r['times'])
    state = sum(p.numel() * p.element_size() * 2 for p in model.parameters())  # weights + grads
    state += sum(t.numel() * t.element_size() for s in r['opt'].state.values()
                 for t in s.values() if torch.is_tensor(t))
    achieved = model.flops_per_token(block_size) * tokens / dt
    return dict(variant=r['name'], params=model.get_num_params(), ms_per_step=dt * 1000,
                tokens_per_s=tokens / dt, flops_per_token=model.flops_per_token(block_size),
                achieved_tflops=achieved / 1e12, mfu=achieved / peak if peak else None,
                matmul_ceiling_tflops=None if peak else ceiling / 1e12,
                fraction_of_matmul=None if peak else achieved / ceiling,
                state_mb=state / 2 ** 20, step_peak_mb=r['peak'] / 2 ** 20 if r['peak'] else None,
                spread_ms=(min(r['times']) * 1000, max(r['times']) * 1000))


def write_results(c, results):
    if c['json_out']:
        with open(c['json_out'], 'a') as f:
            for r in results if isinstance(results, list) else [results]:
                f.write(json.dumps(r) + '\n')
    return results


def main(argv=None):
    c = parse_config(KEYS, argv, usage=__doc__)
    dev = setup_device(c['device'], c['dtype'], c['compile'])
    return write_results(c, bench_train(c, dev))


if __name__ == '__main__':
    run_main(main)
