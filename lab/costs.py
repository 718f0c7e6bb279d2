"""
What the rest costs, beside the trainer's steps (bench.py): sampling, preparing data, the
probes, attention kernels, a study's runs per hour, and the GPU check's summary:

    python -m lab.costs --mode=sample --variants=reduced  # KV cache vs recomputing, 500 tokens
    python -m lab.costs --mode=prepare --tokenizer=gpt2   # prepare.py vs the tokenizer alone
    python -m lab.costs --mode=runs       # a study's runs per hour: dtypes, jobs x threads
    python -m lab.costs --mode=attention --n_head=2 --n_embd=128 --block_size=128 --batch_size=16
    python -m lab.costs --mode=diagnostics --variants=reduced --n_layer=4 --n_embd=128 \\
        --block_size=128 --vocab_size=320 --batch_size=32   # the probes against a step
    python -m lab.costs --mode=summary --json_out=gpu-check --run_dir=gpu-check/run  # GPU check

Each prints its figures and one JSON line per result (prefixed "json:").
"""
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import unittest.mock

if not __package__:  # run as a file, not with -m: import from the repository root all the same
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from kvgpt.errors import quiet_imports  # first: Ctrl-C in the imports below is one line
quiet_imports(__name__)

import torch

import bench
from bench import batches, sync, timed_step, variant_config, write_results
from kvgpt.config import Kind, defaults, keys, parse_config
from kvgpt.device import setup_device
from kvgpt.errors import UserError, run_main
from kvgpt.files import read_jsonl, write_json, write_text
from lab import markdown as md, probes
import model as model_module
from model import GPT, KVCache, causal_mask

KEYS = dict(bench.KEYS, **keys(  # bench's: the geometry, the variants, the device
    mode=('sample', "sample | diagnostics | prepare | summary | runs | attention"),
    max_new_tokens=(500, "sample mode"),
    prompt_tokens=(16, "sample mode"),
    decoding_attention=('kvgpt', "sample mode: kvgpt (generate's own kernels: on CUDA none of "
                        "cuDNN's) or torch (torch's choice, cuDNN's included), to compare",
                        Kind(str, ('kvgpt', 'torch'))),
    tokenizer=('gpt2', "prepare mode"),
    num_proc=(2, "prepare mode"),
    repeat=(10, "prepare mode: copies of pydocs in the corpus"),
    run_dir=(None, "summary mode: a train.py run to summarise too (json_out: the folder)",
             Kind(str)),
    eval_interval=(250, "diagnostics mode: steps between evaluations (config/cpu/demo.py's)"),
    study=('lab/studies/v3.py', "runs mode: the study whose baseline run is timed"),
    dtypes=('float32,bfloat16', "runs mode: the dtypes compared"),
    layouts=('1x2,2x1', "runs mode: jobs x threads per job, side by side"),
    run_steps=(100, "runs mode: steps of each short run (the full run is projected from its "
               "parts)"),
))
DEFAULTS = defaults(KEYS)


def bench_sample(c, dev):
    """Greedy decoding with the KV cache against recomputing the whole context, both paths
    warmed up first (compiled, each is its own graph: a cold one would time its compilation).
    On CUDA the weights and cache are in the 16-bit dtype, as sample.py runs them."""
    name = c['variants'].split(',')[0]
    torch.manual_seed(c['seed'])
    model = dev.for_inference(GPT(variant_config(name, c), verbose=False))
    if dev.compile:
        model.compile(dynamic=True)
    g = torch.Generator().manual_seed(c['seed'])
    prompt = torch.randint(c['vocab_size'], (1, c['prompt_tokens']), generator=g).to(dev.device)
    out, times = {}, {}
    # 'torch': generate() runs with torch's own choice of attention kernels (in this process only)
    kernels = (contextlib.nullcontext() if c['decoding_attention'] == 'kvgpt' else
               unittest.mock.patch.object(model_module, 'decoding_attention',
                                          lambda device: contextlib.nullcontext()))
    with dev.ctx, kernels:
        for use_cache in (True, False):
            model.generate(prompt, 4, temperature=0.0, use_cache=use_cache)  # warm-up, compilation
        for use_cache in (True, False):
            sync(dev.device)
            t0 = time.perf_counter()
            out[use_cache] = model.generate(prompt, c['max_new_tokens'], temperature=0.0,
                                            use_cache=use_cache)
            sync(dev.device)
            times[use_cache] = time.perf_counter() - t0
        diff = cache_logit_diff(model, out[True])
    n = c['max_new_tokens']
    cache = KVCache(model.config, 1, 'meta', model.cache_dtype(dev.device))
    result = dict(mode='sample', variant=name, params=model.get_num_params(), new_tokens=n,
                  dtype=dev.dtype, compile=dev.compile, decoding_attention=c['decoding_attention'],
                  device=torch.cuda.get_device_name(dev.device) if dev.type == 'cuda' else 'cpu',
                  cached_tokens_per_s=n / times[True], uncached_tokens_per_s=n / times[False],
                  speedup=times[False] / times[True],
                  same_tokens=bool(torch.equal(out[True], out[False])),
                  max_logit_diff=diff, cache_bytes=cache.nbytes())
    print('\n'.join([
        f"\n{name}, {model.get_num_params():,} params, {n} new tokens after a "
        f"{c['prompt_tokens']}-token prompt, {dev.device} {dev.dtype}, compile={dev.compile}, "
        f"attention kernels {c['decoding_attention']}'s:",
        f"  KV cache:       {result['cached_tokens_per_s']:8.1f} tokens/s",
        f"  recompute all:  {result['uncached_tokens_per_s']:8.1f} tokens/s",
        f"  speedup {result['speedup']:.1f}x; identical greedy tokens: {result['same_tokens']}; "
        f"max |logit difference| of cached decoding against one full forward pass: {diff:.2e} "
        f"(16-bit rounding alone can flip a near tie)",
        'json: ' + json.dumps(result)]))
    return result


@torch.no_grad()
def cache_logit_diff(model, tokens):
    """Max |logit difference| between cached decoding of `tokens` one at a time and one full
    forward pass over them (teacher-forced: both see the same tokens, so no divergence)."""
    T = min(tokens.size(1), model.config.block_size)
    tokens = tokens[:, :T]
    full, _ = model(tokens, targets=torch.zeros_like(tokens))
    cache = KVCache(model.config, 1, tokens.device, model.cache_dtype(tokens.device))
    stepwise = torch.cat([model(tokens[:, t:t + 1], cache=cache)[0] for t in range(T)], dim=1)
    return (full.float() - stepwise.float()).abs().max().item()


def bench_prepare(c):
    """prepare.py end to end (load, split, tokenize in num_proc workers, write) on a JSONL
    file, as a corpus on disk is prepared, against the tokenizer alone in one process times
    num_proc: the ideal parallel speed. The corpus is pydocs repeated `repeat` times."""
    import prepare
    from prepare import get_tokenizer
    tok = get_tokenizer(c['tokenizer'])
    docs = list(prepare.pydocs_documents()) * c['repeat']
    t0 = time.perf_counter()
    n = sum(len(tok.encode(d)) + 1 for d in docs)
    single = n / (time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as root:
        src = os.path.join(root, 'corpus.jsonl')
        with open(src, 'w') as f:
            for d in docs:
                f.write(json.dumps({'text': d}) + '\n')
        t0 = time.perf_counter()
        meta = prepare.prepare(dict(prepare.DEFAULTS, dataset=src, tokenizer=c['tokenizer'],
                                    data_root=root, num_proc=c['num_proc'], force=True))
        wall = time.perf_counter() - t0
    total = meta['train_tokens'] + meta['val_tokens']
    assert total == n, (total, n)
    result = dict(mode='prepare', tokenizer=c['tokenizer'], tokens=total, documents=len(docs),
                  num_proc=c['num_proc'], tokenizer_tokens_per_s=single,
                  prepare_tokens_per_s=total / wall,
                  fraction_of_ideal=total / wall / (single * c['num_proc']))
    print(f"\npydocs x {c['repeat']} as JSONL, {len(docs):,} documents, {total:,} tokens "
          f"({c['tokenizer']}):")
    print(f"  tokenizer alone, 1 process: {single:12,.0f} tokens/s")
    print(f"  prepare.py, num_proc={c['num_proc']}:     "
          f"{result['prepare_tokens_per_s']:12,.0f} tokens/s "
          f"({100 * result['fraction_of_ideal']:.0f}% of {c['num_proc']} x the tokenizer alone, "
          f"end to end)")
    print('json: ' + json.dumps(result))
    return result


def bench_diagnostics(c, dev):
    """The cost of the attention diagnostics train.py logs with --probe=lab.probes (one call per
    evaluation, on up to 4 windows) against the training steps between two evaluations, both
    timed here alternately, medians."""
    torch.manual_seed(c['seed'])
    model = GPT(variant_config(c['variants'].split(',')[0], c), verbose=False).to(dev.device)
    opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), dev.type)
    run = dict(name='', model=model, opt=opt, fn=model, times=[], peak=0)
    x, y = batches(c, dev.device)
    diag = []
    for i in range(c['warmup'] + c['steps']):
        timed_step(run, x, y, dev)
        t0 = time.perf_counter()
        with dev.ctx:
            model.eval()
            probes.diagnostics(model, x[:4])
            model.train()
        sync(dev.device)
        diag.append(time.perf_counter() - t0)
    step = statistics.median(run['times'][c['warmup']:])
    call = statistics.median(diag[c['warmup']:])
    result = dict(mode='diagnostics', step_ms=step * 1000, diagnostics_ms=call * 1000,
                  eval_interval=c['eval_interval'],
                  overhead=call / (call + c['eval_interval'] * step))
    print(f"\ndiagnostics: {result['diagnostics_ms']:.1f} ms per evaluation; a training step "
          f"{result['step_ms']:.1f} ms; at eval_interval {c['eval_interval']}: "
          f"{100 * result['overhead']:.3f}% of training time")
    print('json: ' + json.dumps(result))
    return result


def bench_runs(c):
    """A study's own run command (its baseline arm at LR 2e-3 on seeds 301..), shortened to
    run_steps steps, for each dtype and each layout of jobs x threads: the jobs start together,
    as the study runner starts them. A full run is projected from the parts its log times:
    startup, steps, evaluations on the way and the final one over the whole val split."""
    import subprocess
    from lab import plan
    s = plan.load_study(c['study'])
    base, steps = plan.base_config(s), c['run_steps']
    if steps < 10:
        raise UserError(f"run_steps must be at least 10 (two untimed steps, then timed ones), "
                        f"got {steps}")
    layouts = [tuple(int(n) for n in layout.split('x')) for layout in c['layouts'].split(',')]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in c['dtypes'].split(','):
            for jobs, threads in layouts:
                procs = []
                for j in range(jobs):
                    work = os.path.join(tmp, f'{dtype}_{jobs}x{threads}_{j}')
                    run = plan.Run('baseline', 2e-3, 0.1, 301 + j)
                    cmd = [sys.executable, 'train.py', *plan.train_args(s, run, base, work)]
                    cmd += [f'--max_iters={steps}', f'--eval_interval={steps // 2}',
                            f'--dtype={dtype}',
                            f"--log_interval={max(1, min(base['log_interval'], steps // 5))}",
                            f"--data_root={c['data_root']}"]
                    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
                    procs.append((work, time.time(), subprocess.Popen(
                        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                        text=True)))
                runs = [run_timing(work, t0, proc, base) for work, t0, proc in procs]
                results.append(runs_result(dtype, jobs, threads, runs, base))
    print_runs(results, base, steps)
    return results


def run_timing(work, t0, proc, base):
    """The parts of one short run's time, from its log, and a full run's time projected from
    them."""
    _, err = proc.communicate()
    wall = time.time() - t0
    if proc.returncode:
        why = err.strip().splitlines()[-1] if err.strip() else proc.returncode
        raise UserError(f"the timed run failed: {why}")
    log = read_jsonl(os.path.join(work, 'log.jsonl'))
    step_s = statistics.median(e['dt_ms'] for e in log if e.get('dt_ms')) / 1000
    evals = [e for e in log if 'eval_s' in e]
    mid = statistics.median(e['eval_s'] for e in evals if 'val_loss_full' not in e)
    final = next(e['eval_s'] for e in evals if 'val_loss_full' in e)
    startup = wall - max(e['iter'] for e in log) * step_s - sum(e['eval_s'] for e in evals)
    n_mid = len(range(0, base['max_iters'], base['eval_interval']))
    full = startup + base['max_iters'] * step_s + n_mid * mid + final
    return dict(step_ms=step_s * 1000, eval_mid_s=mid, eval_final_s=final, startup_s=startup,
                full_run_s=full)


def runs_result(dtype, jobs, threads, runs, base):
    mean = lambda key: statistics.mean(r[key] for r in runs)
    return dict(mode='runs', dtype=dtype, jobs=jobs, threads=threads, step_ms=mean('step_ms'),
                eval_mid_s=mean('eval_mid_s'), eval_final_s=mean('eval_final_s'),
                startup_s=mean('startup_s'), full_run_s=mean('full_run_s'),
                runs_per_hour=jobs * 3600 / mean('full_run_s'))


def print_runs(results, base, steps):
    print(f"\nthe study's run ({base['max_iters']} steps, an evaluation every "
          f"{base['eval_interval']}), projected from runs of {steps} steps; "
          f"{os.cpu_count()} cores")
    print(f"{'dtype':<10}{'jobs x threads':>15}{'ms/step':>9}{'eval s':>8}{'final eval s':>14}"
          f"{'startup s':>11}{'run s':>8}{'runs/hour':>11}")
    for r in results:
        print(f"{r['dtype']:<10}{r['jobs']:>9} x {r['threads']:<3}{r['step_ms']:>9.1f}"
              f"{r['eval_mid_s']:>8.2f}{r['eval_final_s']:>14.1f}{r['startup_s']:>11.1f}"
              f"{r['full_run_s']:>8.0f}{r['runs_per_hour']:>11.1f}")
    for r in results:
        print('json: ' + json.dumps(r))


def bench_attention(c, dev):
    """One layer's attention forward and backward, (batch, n_head, block, head size), through each
    SDPA backend and through plain matmuls and a softmax, in float32 and in bf16, alternated.
    model.py takes SDPA's default choice (the first row)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    shape = (c['batch_size'], c['n_head'], c['block_size'], c['n_embd'] // c['n_head'])
    kernels = dict(sdpa=None, sdpa_math=SDPBackend.MATH, matmul='matmul')
    if dev.type == 'cpu':
        kernels['sdpa_flash'] = SDPBackend.FLASH_ATTENTION
    cases = [(dtype, name) for dtype in (torch.float32, torch.bfloat16) for name in kernels]
    q, k, v = (torch.randn(shape, device=dev.device, requires_grad=True) for _ in range(3))
    times = {case: [] for case in cases}
    for step in range(c['warmup'] + c['steps']):
        for dtype, name in cases:
            sync(dev.device)
            t0 = time.perf_counter()
            with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
                y = attention_by(kernels[name], q, k, v, sdpa_kernel)
            y.float().sum().backward()
            sync(dev.device)
            if step >= c['warmup']:
                times[(dtype, name)].append(time.perf_counter() - t0)
    results = [dict(mode='attention', dtype=str(dtype).split('.')[-1], kernel=name,
                    ms=1000 * statistics.median(times[(dtype, name)])) for dtype, name in cases]
    print(f"\nattention fwd+bwd, {shape} (batch, heads, T, head size), {dev.device}, "
          f"median of {c['steps']} alternated")
    for r in results:
        print(f"{r['dtype']:<10}{r['kernel']:<12}{r['ms']:>8.2f} ms")
    return results


def attention_by(kernel, q, k, v, sdpa_kernel):
    """Causal attention through an SDPA backend (None: its default choice) or plain matmuls."""
    scale = q.size(-1) ** -0.5
    if kernel != 'matmul':
        with sdpa_kernel(kernel) if kernel else contextlib.nullcontext():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                    scale=scale)
    mask = causal_mask(q.size(-2), k.size(-2), q.device)
    scores = (q @ k.transpose(-2, -1) * scale).masked_fill(~mask, float('-inf'))
    # bf16 scores softmax in fp32, as the fused kernels do; fp64 stays fp64
    return scores.softmax(-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(v.dtype) @ v


def bench_summary(c):
    """results.json and results.md in the folder json_out from the JSON lines the other modes
    appended there (bench_train.jsonl, bench_muon.jsonl, bench_sample.jsonl) and the train.py run
    in run_dir."""
    folder = c['json_out']
    if not folder or not os.path.isdir(folder):
        raise UserError("summary mode needs --json_out=FOLDER holding the JSON lines of the other "
                        "modes")
    path = lambda name: os.path.join(folder, name)
    read = lambda name: read_jsonl(path(name)) if os.path.exists(path(name)) else []
    summary = dict(date=time.strftime('%Y-%m-%d'), train=read('bench_train.jsonl'),
                   muon=read('bench_muon.jsonl'), sample=read('bench_sample.jsonl'))
    run_log = os.path.join(c['run_dir'], 'log.jsonl') if c['run_dir'] else None
    if run_log and os.path.exists(run_log):  # absent when the run's part failed or was left out
        log = read_jsonl(run_log)
        timed = [e for e in log if e.get('dt_ms')]
        with_mfu = [e['mfu'] for e in timed if e.get('mfu') is not None]
        summary['run'] = dict(
            steps=max(e['iter'] for e in log),
            final_val_loss=[e for e in log if 'val_loss' in e][-1]['val_loss'],
            median_ms_per_step=statistics.median(e['dt_ms'] for e in timed) if timed else None,
            median_mfu=statistics.median(with_mfu) if with_mfu else None)
    write_json(os.path.join(folder, 'results.json'), summary)
    write_text(os.path.join(folder, 'results.md'), summary_markdown(summary))
    print(summary_markdown(summary))
    return summary


def summary_markdown(s):
    rows = [f"GPU check, {s['date']}", '',
            *md.head('variant', 'device', 'dtype', 'compile', 'ms/step', 'tokens/s', 'MFU',
                     'step time vs baseline', 'FLOP ratio', 'peak MB')]
    base = s['train'][0] if s['train'] else None
    for r in s['train']:
        mfu = f"{100 * r['mfu']:.1f}%" if r['mfu'] is not None else '-'
        peak = f"{r['step_peak_mb']:,.0f}" if r['step_peak_mb'] else '-'
        rows.append(f"| {r['variant']} | {r['device']} | {r['dtype']} | {r['compile']} "
                    f"| {r['ms_per_step']:.1f} | {r['tokens_per_s']:,.0f} | {mfu} "
                    f"| {r['ms_per_step'] / base['ms_per_step']:.3f} "
                    f"| {r['flops_per_token'] / base['flops_per_token']:.3f} | {peak} |")
    steps = {r['variant']: r['ms_per_step'] for r in s.get('muon', [])}
    for variant in dict.fromkeys(v.rsplit(' ', 1)[0] for v in steps):
        if f'{variant} adamw' in steps and f'{variant} muon' in steps:
            rows += ['', f"Muon against AdamW ({variant}): {steps[f'{variant} muon']:.1f} against "
                     f"{steps[f'{variant} adamw']:.1f} ms/step, "
                     f"{steps[f'{variant} muon'] / steps[f'{variant} adamw']:.3f}x"]
    for r in s['sample']:
        rows += ['', f"KV-cache decoding ({r['variant']}, {r['dtype']}, compile={r['compile']}, "
                 f"attention kernels {r.get('decoding_attention', 'kvgpt')}'s): "
                 f"{r['cached_tokens_per_s']:.1f} tokens/s against "
                 f"{r['uncached_tokens_per_s']:.1f} recomputing, {r['speedup']:.1f}x; "
                 f"max |logit difference| {r['max_logit_diff']:.2e}, "
                 f"identical greedy tokens: {r['same_tokens']}"]
    if 'run' in s:
        r = s['run']
        ms = f"{r['median_ms_per_step']:.1f}" if r['median_ms_per_step'] is not None else '-'
        mfu = f"{100 * r['median_mfu']:.1f}%" if r['median_mfu'] is not None else '-'
        rows += ['', f"torchrun training: {r['steps']} steps with a resume, final val loss "
                 f"{r['final_val_loss']:.4f}, median {ms} ms/step, median MFU {mfu}"]
    return '\n'.join(rows) + '\n'


MODES = dict(sample=bench_sample, diagnostics=bench_diagnostics, attention=bench_attention)


def main(argv=None):
    c = parse_config(KEYS, argv, usage=__doc__)
    if c['mode'] == 'prepare':
        return bench_prepare(c)
    if c['mode'] == 'summary':
        return bench_summary(c)
    if c['mode'] == 'runs':
        return write_results(c, bench_runs(c))
    if c['mode'] not in MODES:
        raise UserError("mode must be one of sample, diagnostics, attention, prepare, summary, "
                        f"runs; got {c['mode']!r}")
    dev = setup_device(c['device'], c['dtype'], c['compile'])
    return write_results(c, MODES[c['mode']](c, dev))


if __name__ == '__main__':
    run_main(main)
