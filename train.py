"""
Train a kvgpt model, on one device or many:

    python train.py config/demo.py                      # CPU, the embedded corpus, ~3 minutes
    python train.py config/reduced.py --batch_size=8    # config files, then --key=value overrides
    torchrun --standalone --nproc_per_node=8 train.py config/reduced.py

The batches of step k depend on (data_seed, k) alone: every variant, restart and world size
sees the same tokens at the same step, so runs compare side by side. Checkpoints are written
atomically, never from a non-finite state, and a resume continues bit for bit. Ctrl-C or
SIGTERM saves and stops (exit code 128 + the signal's number); --init_from=auto continues.
"""
from __future__ import annotations  # the Run below names types defined further down

import fcntl
import gc
import importlib
import json
import math
import os
import signal
import socket
import sys
import time
import typing
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from common import (DTYPES, Dataset, DeviceSetup, Kind, UserError, device_peak_flops,
                    fs_error, load_checkpoint, model_errors, model_from_checkpoint, open_dataset,
                    parse_config, pick_device, print_overrides, read_jsonl, run_main,
                    save_checkpoint, setup_device, write_json, write_text)
import model
from model import ACTIVATIONS, GPT, QUERY_MODES, GPTConfig, upgrade_query

# -----------------------------------------------------------------------------
# defaults: GPT-2 small on OpenWebText, the authors' baseline settings; config/*.py and
# --key=value change them
DEFAULTS = dict(
    # run: where it goes, what it logs and keeps
    out_dir='out',  # checkpoints, log.jsonl and config.json of the run
    init_from='scratch',  # scratch, resume, auto (resume if a checkpoint), gpt2*, a GPT-2 folder
    #                       ('auto' is for launchers that restart; gpt2, gpt2-medium .. gpt2-xl)
    overwrite=False,  # True: init_from='scratch' may start over an out_dir holding a checkpoint
    eval_interval=1000,  # steps between evaluations (and checkpoints)
    eval_iters=200,  # batches per split in each evaluation
    eval_windows='fixed',  # 'fixed': one set of windows for the run; 'fresh': new ones each time
    #                        (the authors' protocol), the same for every variant at the same step
    eval_only=False,  # evaluate the checkpoint (with the full val loss) into eval.jsonl, and stop
    log_interval=10,  # steps between log lines (loss, gradient norm, step time)
    diagnostics=False,  # True: the lab's attention probes at each evaluation (lab/probes.py)
    always_save_checkpoint=True,  # False: save only when val loss improves (nanoGPT's option)
    keep_checkpoints=(50000, 100000, 105000),  # steps whose ckpt_<step>.pt is kept (the authors')
    wandb_log=False,  # also log to Weights & Biases (pip install wandb)
    wandb_project='kvgpt',  # the W&B project
    wandb_run_name='run',  # the W&B run name
    # data
    dataset='openwebtext',  # data_root/<dataset>/ of prepare.py (pydocs, pysource: made if absent)
    data_root='data',  # where prepared datasets live
    data_seed=1337,  # the batches of step k depend on (data_seed, k) only
    gradient_accumulation_steps=40,  # in total, over all processes
    batch_size=12,  # micro-batch per process
    block_size=1024,  # tokens per training window (at most the model's block_size)
    # model: every GPTConfig field of model.py, with its default; these three are train.py's
    vocab_size=None,  # None: the dataset's vocabulary rounded up to a multiple of 64 (gpt2: 50304)
    query=None,  # None: the model's default, 'linear' (so a resume does not report it as a change)
    query_identity=False,  # the old spelling of query='identity': read, then folded into query
    # optimiser: AdamW
    learning_rate=6e-4,  # the peak learning rate
    weight_decay=0.1,  # decoupled, on matrices and embeddings (none on norms and biases)
    beta1=0.9,  # AdamW's first-moment decay
    beta2=0.95,  # AdamW's second-moment decay
    grad_clip=1.0,  # clip the global gradient norm to this; 0 disables
    # schedule
    max_iters=105002,  # steps to train: the run stops when iter_num reaches it (the authors')
    decay_lr=True,  # False: the peak learning rate throughout
    warmup_iters=2000,  # linear warmup steps
    lr_decay_iters=600000,  # the cosine reaches min_lr here (past max_iters: the run ends before)
    min_lr=6e-5,  # the cosine's floor
    # system
    device=None,  # None: cuda when available, else cpu
    dtype=None,  # None: bfloat16 on cuda where native, float16 on older GPUs, float32 on cpu
    compile=None,  # None: on for cuda, off elsewhere
    backend=None,  # None: nccl on cuda, gloo on cpu
    seed=1337,  # model init and dropout
)
MODEL_KEYS = [f.name for f in fields(GPTConfig)]
# every model field is a key, with GPTConfig's default (None where GPTConfig derives it)
DEFAULTS.update({f.name: f.default for f in fields(GPTConfig) if f.name not in DEFAULTS})
# the type of each key whose default does not say it (--help shows them): the model's from
# GPTConfig's annotations (Optional[int] is an int or None), and the choices of a word
TYPES = dict(
    {f.name: Kind(next(a for a in (*typing.get_args(f.type), f.type) if a is not type(None)))
     for f in fields(GPTConfig)},
    query=Kind(str, QUERY_MODES), pos=Kind(str, ('learned', 'rope')),
    activation=Kind(str, tuple(ACTIVATIONS)), eval_windows=Kind(str, ('fixed', 'fresh')),
    device=Kind('device'), dtype=Kind(str, DTYPES), compile=Kind(bool),
    backend=Kind(str, ('nccl', 'gloo')))
TIMING_WARMUP = 2  # steps after each (re)start left out of step times, tokens/s, MFU, ETA
# The key of the evaluation windows, next to the (data_seed, step) keys of the training batches:
# above 2**31, so no training step can draw the same windows.
EVAL_KEY = 2 ** 31  # + split index (0 train, 1 val)
PROBES = 'lab.probes'  # the module diagnostics=True runs each evaluation: probe(data, c, device)


# -----------------------------------------------------------------------------
# the run: what setup() makes, and the loop that changes it

@dataclass
class Run:
    c: dict  # the settings
    d: Dist  # this process's place in the world
    dev: DeviceSetup  # device, dtype, autocast
    data: Dataset
    model: GPT  # the raw model: checkpoints, evaluation, probes
    step_model: torch.nn.Module  # the same, compiled and/or wrapped for DDP: the training steps
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    log: Logger  # rank 0's; None elsewhere
    probe: object  # the evaluation hook (evaluation_probe); None without diagnostics
    iter_num: int = 0
    best_val_loss: float = math.inf
    signal: int = None  # set by SIGTERM or SIGINT: save at the next step and stop

    @property
    def accum(self):  # micro-steps per process
        return self.c['gradient_accumulation_steps'] // self.d.world

    @property
    def tokens_per_iter(self):
        c = self.c
        return c['gradient_accumulation_steps'] * c['batch_size'] * c['block_size']


def setup(c, d):
    """The run: data, model (from scratch, a checkpoint or GPT-2), optimizer, log."""
    check_settings(c, d.world)
    dev = setup_device(d.device, c['dtype'], c['compile'])
    torch.manual_seed(c['seed'] + d.rank)
    data = open_data(c, d.master, d.ddp)
    if d.master:
        print_overrides(c, DEFAULTS)
    model, ckpt = build_model(c, data.meta, d.master)
    config = dict(c, model_args=asdict(model.config), params=model.get_num_params())
    model.to(dev.device)
    scaler = torch.amp.GradScaler(dev.type, enabled=dev.dtype == 'float16')
    optimizer = model.configure_optimizers(c['weight_decay'], c['learning_rate'],
                                           (c['beta1'], c['beta2']), dev.type)
    step_model = torch.compile(model) if dev.compile else model
    if d.ddp:
        ids = [torch.device(dev.device).index] if dev.type == 'cuda' else None
        step_model = DDP(step_model, device_ids=ids)
    r = Run(c, d, dev, data, model, step_model, optimizer, scaler, None, None)
    if ckpt is not None:
        restore(r, ckpt)
    if d.master:  # eval_only writes no config.json: that is the training run's
        r.log = Logger(c['out_dir'], None if c['eval_only'] else config, r.iter_num,
                       init_wandb(c))
        r.probe = evaluation_probe(c, data, dev.device)
        print(f"tokens per iteration: {r.tokens_per_iter:,} "
              f"({c['gradient_accumulation_steps']} x {c['batch_size']} x {c['block_size']}, "
              f"{d.world} process(es)); starting at iter {r.iter_num}")
    return r


def train_loop(r):
    """nanoGPT's loop: the learning rate, evaluate and save, the micro-steps, clip and step,
    log, stop. The batches of step k are drawn from (data_seed, k) alone."""
    c, start_iter, keep = r.c, r.iter_num, set(r.c['keep_checkpoints'])
    clock, step = Clock(start_iter), StepStats(r.dev.device)
    while True:
        lr = lr_at(r.iter_num, c)
        last = r.iter_num >= c['max_iters'] or c['eval_only']
        if r.iter_num % c['eval_interval'] == 0 or last:
            try:
                clock.pause(evaluate(r, step, moved=r.iter_num > start_iter))
            except Interrupted:  # the state is the last step's, whole: save it and stop
                return stop(r, step)
        if last:
            return
        for group in r.optimizer.param_groups:
            group['lr'] = lr
        micro_steps(r, step)
        if c['grad_clip'] > 0:
            r.scaler.unscale_(r.optimizer)
            step.grad_norm = torch.nn.utils.clip_grad_norm_(r.model.parameters(), c['grad_clip'])
        elif r.iter_num % c['log_interval'] == c['log_interval'] - 1:  # the step logged next
            r.scaler.unscale_(r.optimizer)
            grads = [p.grad for p in r.model.parameters() if p.grad is not None]
            step.grad_norm = torch.nn.utils.get_total_norm(grads)
        r.scaler.step(r.optimizer)
        r.scaler.update()
        r.optimizer.zero_grad(set_to_none=True)
        r.iter_num += 1
        clock.tick(r.iter_num)
        if r.iter_num in keep:
            check_finite(r, step)
            save(r, 'kept', f'ckpt_{r.iter_num}.pt')
        if r.iter_num % c['log_interval'] == 0:
            log_step(r, step, lr, clock.step_time(r.iter_num))
        if stop_requested(r):
            return stop(r, step)


def stop(r, step):
    check_finite(r, step)
    save(r, 'signal')
    if r.d.master:
        print(f"stopped by a signal at iter {r.iter_num}; continue with --init_from=resume "
              "(or auto)", flush=True)


class StepStats:
    """The last step's loss sum and gradient norm, and whether any loss was non-finite: kept on
    the device, read only at log steps (no host sync per step)."""

    def __init__(self, device):
        self.nonfinite = torch.zeros((), dtype=torch.bool, device=device)
        self.loss_sum = torch.zeros((), dtype=torch.float32, device=device)
        self.grad_norm = torch.zeros((), dtype=torch.float32, device=device)


def micro_steps(r, step):
    """Forward and backward over this process's share of the step's global batch."""
    c, batch = r.c, r.c['batch_size']
    starts = r.data.starts('train', c['gradient_accumulation_steps'] * batch, c['data_seed'],
                           r.iter_num)
    step.loss_sum.zero_()
    for micro in range(r.accum):
        m = r.d.rank * r.accum + micro  # this micro-batch's index in the global batch
        x, y = r.data.batch('train', starts[m * batch:(m + 1) * batch], r.dev.device)
        # DDP averages over ranks; dividing by the local accumulation makes the global mean
        last = micro == r.accum - 1
        with r.step_model.no_sync() if r.d.ddp and not last else nullcontext():
            with r.dev.ctx:
                _, loss = r.step_model(x, y)
            r.scaler.scale(loss / r.accum).backward()
        loss = loss.detach()
        step.nonfinite |= ~torch.isfinite(loss)
        step.loss_sum += loss.float()


def log_step(r, step, lr, dt):
    c = r.c
    check_finite(r, step)
    mean_loss = step.loss_sum / r.accum  # the step's global-batch mean, as after a resume
    if r.d.ddp:
        dist.all_reduce(mean_loss)
        mean_loss /= r.d.world
    loss, grad_norm = mean_loss.item(), step.grad_norm.item()
    peak = device_peak_flops(r.dev.device)
    mfu = dt and r.model.estimate_mfu(r.tokens_per_iter // r.d.world, dt, peak, c['block_size'])
    eta = dt and dt * (c['max_iters'] - r.iter_num)
    if not r.d.master:
        return
    timing = f", {dt * 1000:.1f} ms/iter, eta {format_eta(eta)}" if dt else ""
    mfu_text = f", mfu {mfu * 100:.1f}%" if mfu else ""
    print(f"iter {r.iter_num}: loss {loss:.4f}, grad norm {grad_norm:.3f}, lr {lr:.2e}{timing}"
          f"{mfu_text}")
    r.log(iter=r.iter_num, tokens=r.iter_num * r.tokens_per_iter, lr=lr, loss=loss,
          grad_norm=grad_norm, dt_ms=dt and dt * 1000, tokens_per_s=dt and r.tokens_per_iter / dt,
          mfu=mfu, eta_s=eta)


# -----------------------------------------------------------------------------
# evaluation

def evaluate(r, step, moved):
    """The losses on both splits (and the full val loss at the end), the probes, the log line,
    then a checkpoint; the seconds it took (the step times leave them out)."""
    c, t0 = r.c, time.time()
    check_finite(r, step)
    losses = estimate_loss(r)
    entry = dict(iter=r.iter_num, tokens=r.iter_num * r.tokens_per_iter,
                 train_loss=losses['train'], val_loss=losses['val'])
    if r.iter_num >= c['max_iters'] or c['eval_only']:
        entry['val_loss_full'] = full_val_loss(r)
    if r.probe is not None:
        r.model.eval()
        with r.dev.ctx:
            entry.update(r.probe(r.model))
        r.model.train()
    entry['eval_s'] = time.time() - t0  # what evaluating costs
    if r.d.master:
        full = entry.get('val_loss_full')
        full = f", full val loss {full:.4f}" if full is not None else ''
        print(f"iter {r.iter_num}: train loss {losses['train']:.4f}, "
              f"val loss {losses['val']:.4f}{full}")
        r.log(**entry)
    if not math.isfinite(losses['val']):
        raise UserError(f"val loss is non-finite at iter {r.iter_num}; the checkpoints in "
                        f"{c['out_dir']} are untouched")
    improved = losses['val'] < r.best_val_loss
    r.best_val_loss = min(r.best_val_loss, losses['val'])
    if moved and not c['eval_only'] and (improved or c['always_save_checkpoint']):
        save(r, 'eval')
    return time.time() - t0


@torch.no_grad()
def estimate_loss(r):
    """Mean loss over eval_iters batches per split, the ranks splitting them. 'fixed' windows are
    one set for the whole run; 'fresh' ones are drawn anew at every evaluation step. Either way
    they depend on (data_seed, step) alone: every variant is measured on identical tokens."""
    c, batch, out = r.c, r.c['batch_size'], {}
    r.step_model.eval()
    for split_id, split in enumerate(('train', 'val')):
        key = (c['data_seed'], EVAL_KEY + split_id)
        key += (r.iter_num,) if c['eval_windows'] == 'fresh' else ()
        starts = r.data.starts(split, c['eval_iters'] * batch, *key)
        total = torch.zeros(2, dtype=torch.float64, device=r.dev.device)
        for i in rank_share(r, range(c['eval_iters'])):
            x, y = r.data.batch(split, starts[i * batch:(i + 1) * batch], r.dev.device)
            with r.dev.ctx:
                _, loss = r.step_model(x, y)
            total += torch.stack([loss.double(), torch.ones_like(total[0])])
        if r.d.ddp:
            dist.all_reduce(total)
        out[split] = (total[0] / total[1]).item()
    r.step_model.train()
    return out


class Interrupted(Exception):
    """A signal arrived during an evaluation: it is left unfinished, and the run saves."""


def rank_share(r, items):
    """This rank's items (every world-th, from its rank), asking before each round whether a
    signal arrived on any rank: an evaluation stops within one batch of it (every rank asks
    equally often, so none waits in a collective the others skip)."""
    for first in range(0, len(items), r.d.world):
        if any_rank(r, r.signal is not None):
            raise Interrupted
        if first + r.d.rank < len(items):
            yield items[first + r.d.rank]


@torch.no_grad()
def full_val_loss(r):
    """The mean loss over every token of the val split once, in order (common.Dataset.tiling):
    no sampling noise, and the same tokens for every run, seed and world size. The number a
    verdict between variants uses; computed at the final evaluation only."""
    r.model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=r.dev.device)
    tiling = r.data.tiling('val', r.c['batch_size'])
    for starts, length in (tiling[i] for i in rank_share(r, range(len(tiling)))):
        x, y = r.data.batch('val', starts, r.dev.device, length)
        with r.dev.ctx:
            _, loss = r.model(x, y)
        count = torch.tensor(float(y.numel()), device=total.device)
        total += torch.stack([loss.double() * y.numel(), count])
    if r.d.ddp:
        dist.all_reduce(total)
    r.model.train()
    return (total[0] / total[1]).item()


# -----------------------------------------------------------------------------
# checkpoints, and what every rank must agree on

def save(r, reason, name='ckpt.pt'):
    """Write a checkpoint atomically from rank 0. The ranks agree on failure first, so a save that
    fails on rank 0 ends every rank with its message instead of a hang."""
    states = rng_state(r.dev.device, r.d.ddp)  # a collective: every rank takes part
    path = os.path.join(r.c['out_dir'], name)
    error = write_checkpoint(r, states, path) if r.d.master else None
    if any_rank(r, error is not None):
        raise UserError(error or f"rank 0 could not save {path} at iter {r.iter_num} "
                                 "(see its error)")
    if r.d.master:
        print(f"saved {path} at iter {r.iter_num} ({reason})")
        if name == 'ckpt.pt':
            r.log.flush()  # the record may now describe this checkpoint


def write_checkpoint(r, states, path):
    """None once written, else why not; the file at path stays as it was either way."""
    if not params_finite(r.model):
        return (f"parameters are non-finite at iter {r.iter_num}; not saving, {path} is "
                "untouched")
    try:
        save_checkpoint(dict(
            model=r.model.state_dict(), optimizer=r.optimizer.state_dict(),
            model_args=asdict(r.model.config), iter_num=r.iter_num,
            best_val_loss=r.best_val_loss, config=r.c, meta=r.data.meta, rng=states,
            tokens_seen=r.iter_num * r.tokens_per_iter,
            scaler=r.scaler.state_dict() if r.scaler.is_enabled() else None), path)
    except OSError as e:
        return f"{fs_error(e, path)}; the previous checkpoint there is untouched"
    return None


def restore(r, ckpt):
    if 'optimizer' in ckpt:
        r.optimizer.load_state_dict(ckpt['optimizer'])
    elif r.d.master:
        print("the checkpoint has no optimizer state (a converted model?): fine-tuning with a "
              "fresh AdamW")
    if ckpt.get('scaler'):
        r.scaler.load_state_dict(ckpt['scaler'])
    r.iter_num, r.best_val_loss = ckpt['iter_num'], float(ckpt['best_val_loss'])
    set_rng_state(ckpt.get('rng', []), r.d.rank, r.dev.device)


def any_rank(r, flag):
    """True when flag is set on any rank: every rank takes the same branch, so none is left
    waiting in a collective the others never reach. Outside DDP, no sync for a Python bool."""
    if not r.d.ddp:
        return bool(flag)
    t = flag.float().reshape(1) if torch.is_tensor(flag) else \
        torch.tensor([float(flag)], device=r.dev.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item() > 0


def check_finite(r, step):
    if any_rank(r, step.nonfinite):
        raise UserError(f"the loss became non-finite by iter {r.iter_num}; the last good "
                        f"checkpoint in {r.c['out_dir']} is untouched: lower learning_rate, "
                        "use dtype=bfloat16, or resume from it")


def stop_requested(r):
    """A signal arrived on any rank. Under DDP that is one all-reduce, so it is asked only at log
    steps: still well inside torchrun's grace period, and no per-step host sync."""
    if not r.d.ddp:
        return r.signal is not None
    at_log_step = r.iter_num % r.c['log_interval'] == 0
    return at_log_step and any_rank(r, r.signal is not None)


# -----------------------------------------------------------------------------
# setup: the world, the out_dir, the data, the model, the schedule

def check_settings(c, world):
    if c['gradient_accumulation_steps'] % world:
        raise UserError(f"gradient_accumulation_steps {c['gradient_accumulation_steps']} is not "
                        f"divisible by the world size {world}: the global batch must be the same "
                        "at every world size")
    for key in ('batch_size', 'block_size', 'max_iters', 'eval_interval', 'eval_iters',
                'log_interval'):
        if c[key] < (0 if key == 'max_iters' else 1):
            raise UserError(f"{key} must be positive, got {c[key]}")
    if c['eval_windows'] not in ('fixed', 'fresh'):
        raise UserError(f"eval_windows must be 'fixed' or 'fresh', got {c['eval_windows']!r}")
    if not all(isinstance(k, int) and k > 0 for k in c['keep_checkpoints']):
        raise UserError("keep_checkpoints must be a tuple of positive steps, "
                        f"got {c['keep_checkpoints']!r}")


class Dist(NamedTuple):
    ddp: bool  # under torchrun
    rank: int
    world: int  # processes in all
    device: str  # this process's

    @property
    def master(self):  # rank 0 logs, checkpoints and probes
        return self.rank == 0


def setup_distributed(c):
    """This process's Dist; torchrun sets RANK, LOCAL_RANK and WORLD_SIZE."""
    device = pick_device(c['device'])
    if int(os.environ.get('RANK', -1)) == -1:
        return Dist(False, 0, 1, device)
    rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
    if device.startswith('cuda'):
        device = f"cuda:{os.environ['LOCAL_RANK']}"
        torch.cuda.set_device(device)
    backend = c['backend'] or ('nccl' if device.startswith('cuda') else 'gloo')
    store = restart_store(world)
    if store is None:
        dist.init_process_group(backend=backend)
    else:
        dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world)
    return Dist(True, rank, world, device)


def restart_store(world):
    """The store for the process group's handshake, or None for torchrun's own. torchrun's agent
    keeps one store for all restarts, so a restarted round's gloo or NCCL handshake can read the
    previous round's addresses and fail with 'Connection refused' (pytorch/pytorch#135712): each
    round gets keys of its own. On one node every worker's restart count names the round. Across
    nodes the agents' counts can differ (pytorch/pytorch#108158), so there the round is counted in
    the store itself: every rank of a round adds 1 to one key as it starts, so the first round's
    ranks read 1..world, the next round's world+1..2 world, and so on, on every node alike."""
    if os.environ.get('TORCHELASTIC_USE_AGENT_STORE') != 'True':
        return None  # torchrun's store is fresh for every round (or there is no torchrun)
    store = dist.TCPStore(os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']), world,
                          is_master=False)
    if os.environ.get('GROUP_WORLD_SIZE', '1') == '1':
        generation = os.environ['TORCHELASTIC_RESTART_COUNT']
    else:
        generation = (store.add('kvgpt/ranks_started', 1) - 1) // world
    return dist.PrefixStore(f"kvgpt/restart_{generation}", store)


class OutDirLock:
    """One run per out_dir: an exclusive flock on out_dir/.lock, which the OS releases when the
    process ends however it ends, so a crash never leaves a stale lock. Held for the run. A run
    that never started (never wrote its log) takes away what it made: the lock file, and the
    out_dir itself when it made that too."""

    def __init__(self, out_dir):
        self.made_dir = not os.path.isdir(out_dir)
        self.path = os.path.join(out_dir, '.lock')
        try:
            os.makedirs(out_dir, exist_ok=True)
            self.made_file = not os.path.exists(self.path)
            self.file = open(self.path, 'a+')
        except OSError as e:
            raise UserError(f"{fs_error(e, out_dir)} (the run's --out_dir)") from None
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.seek(0)
            holder = self.file.read().strip() or 'another process'
            self.file.close()
            raise UserError(f"{out_dir} is in use by {holder}: wait for that run, stop it, or "
                            "choose another --out_dir") from None
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"train.py (pid {os.getpid()} on {socket.gethostname()})")
        self.file.flush()

    def release(self, started):
        if not started and self.made_file:
            os.remove(self.path)
            if self.made_dir and not os.listdir(os.path.dirname(self.path)):
                os.rmdir(os.path.dirname(self.path))
        self.file.close()


def open_data(c, master, ddp):
    """The prepared dataset; an embedded corpus (pydocs, pysource) is prepared here if missing."""
    import prepare
    meta_path = os.path.join(c['data_root'], c['dataset'], 'meta.json')
    if c['dataset'] in prepare.EMBEDDED and not os.path.exists(meta_path):
        if master:
            os.makedirs(c['data_root'], exist_ok=True)
            with open(os.path.join(c['data_root'], '.prepare.lock'), 'a') as lock:
                # runs started together: one prepares, the others wait
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not os.path.exists(meta_path):
                    print(f"no prepared {c['dataset']} in {c['data_root']}/: preparing the "
                          "embedded corpus first (offline, ~10 s)")
                    prepare.prepare(dict(prepare.DEFAULTS, dataset=c['dataset'],
                                         data_root=c['data_root'], progress=False))
        if ddp:
            dist.barrier()
    return open_dataset(c['data_root'], c['dataset'], c['block_size'])


def resolve_init(c, master):
    """init_from with 'auto' resolved. A run that would start from scratch over an existing
    checkpoint is refused, so repeating a command never silently replaces a finished or
    interrupted run."""
    path = os.path.join(c['out_dir'], 'ckpt.pt')
    exists = os.path.exists(path)
    if c['init_from'] == 'auto':
        if master:
            found = f"resuming from {path}" if exists else \
                f"no checkpoint in {c['out_dir']}, starting from scratch"
            print(f"init_from=auto: {found}")
        return 'resume' if exists else 'scratch'
    if c['init_from'] == 'scratch' and exists and not c['overwrite']:
        try:
            step = f" at iter {load_checkpoint(path, mmap=True)['iter_num']}"
        except (UserError, KeyError):
            step = " (unreadable)"
        raise UserError(f"{c['out_dir']} already holds a checkpoint{step}: --init_from=resume "
                        "continues it, --overwrite=True starts over (its log and checkpoints are "
                        "replaced)")
    return c['init_from']


def check_same_data(ckpt, meta, c):
    """A resume continues on the data its checkpoint was trained on: the tokenizer and the token
    counts must agree with the dataset's meta.json (nanoGPT's and converted checkpoints carry
    none)."""
    saved = ckpt.get('meta')
    if not saved:
        return
    keys = ('tokenizer', 'vocab_size', 'dtype', 'train_tokens', 'val_tokens')
    differ = [f"{k} {saved.get(k)!r} != {meta.get(k)!r}" for k in keys
              if saved.get(k) != meta.get(k)]
    if differ:
        raise UserError(f"{c['out_dir']}/ckpt.pt was trained on other data than "
                        f"{c['data_root']}/{c['dataset']} ({', '.join(differ)}): resume on the "
                        "data it was trained on, or start a new out_dir")


def model_args_from(c, meta):
    args = upgrade_query({k: c[k] for k in MODEL_KEYS})  # query None: the model's default, linear
    if args['vocab_size'] is None:
        args['vocab_size'] = -(-meta['vocab_size'] // 64) * 64  # round up: faster matmuls
    return args


def build_model(c, meta, master):
    """(model, checkpoint or None) for init_from = scratch | resume | gpt2* or a GPT-2 folder."""
    ckpt = None
    if c['init_from'] == 'scratch':
        try:
            model = GPT(GPTConfig(**model_args_from(c, meta)), verbose=master)
        except ValueError as e:
            raise UserError(f"bad model config: {e}") from None
    elif c['init_from'] == 'resume':
        model, ckpt = model_from_checkpoint(os.path.join(c['out_dir'], 'ckpt.pt'), verbose=master)
        check_same_data(ckpt, meta, c)
        changed = [k for k, v in ckpt['model_args'].items() if c.get(k) is not None and c[k] != v]
        if changed and master:
            overridden = ', '.join(f'{k}={c[k]!r}' for k in changed)
            print(f"resuming: the checkpoint's model settings win over {overridden}")
    else:
        with model_errors():
            model = GPT.from_pretrained(c['init_from'], dropout=c['dropout'])
    if model.config.vocab_size < meta['vocab_size']:
        raise UserError(f"the model's vocab_size {model.config.vocab_size} is smaller than the "
                        f"dataset's {meta['vocab_size']} ({meta['tokenizer']}): raise vocab_size "
                        "or leave it None")
    if c['block_size'] > model.config.block_size:
        raise UserError(f"block_size {c['block_size']} is longer than the model's "
                        f"{model.config.block_size}")
    return model, ckpt


def lr_at(it, c):
    """Linear warmup, then cosine decay to min_lr at lr_decay_iters (the authors stop at step
    ~105k of a 600k schedule, so their runs end at 93.6% of the peak rate)."""
    if not c['decay_lr']:
        return c['learning_rate']
    if it < c['warmup_iters']:
        return c['learning_rate'] * (it + 1) / (c['warmup_iters'] + 1)
    if it > c['lr_decay_iters']:
        return c['min_lr']
    ratio = (it - c['warmup_iters']) / max(1, c['lr_decay_iters'] - c['warmup_iters'])
    cosine = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return c['min_lr'] + cosine * (c['learning_rate'] - c['min_lr'])


# -----------------------------------------------------------------------------
# checkpoints and logs

def rng_state(device, ddp):
    """Every rank's torch (and cuda) RNG state, as tensors: loads under weights_only=True."""
    state = {'torch': torch.get_rng_state()}
    if device.startswith('cuda'):
        state['cuda'] = torch.cuda.get_rng_state(device)
    if not ddp:
        return [state]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {k: v.cpu() for k, v in state.items()})
    return gathered


def set_rng_state(states, rank, device):
    if rank < len(states):
        torch.set_rng_state(states[rank]['torch'])
        if 'cuda' in states[rank] and device.startswith('cuda'):
            torch.cuda.set_rng_state(states[rank]['cuda'], device)


def params_finite(model):
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


class Logger:
    """The run's record: config.json and log.jsonl (and W&B). The record always describes the
    checkpoint on disk. A new run writes both with its first entry. A run that starts where a
    record already is (a resume, or --overwrite=True) holds its entries until it has saved its
    first checkpoint: only then does it write config.json and the log, cut back to where it
    started (the lines it writes again), so a resume that fails before then leaves both files
    byte-identical. eval_only (config None) touches neither: its evaluation goes to
    eval.jsonl."""

    def __init__(self, out_dir, config, resume_iter, wandb_run=None):
        self.path, self.config, self.resume_iter = os.path.join(out_dir, 'log.jsonl'), config, \
            resume_iter
        self.out_dir, self.wandb_run, self.started = out_dir, wandb_run, False
        record = [os.path.join(out_dir, f) for f in ('log.jsonl', 'config.json')]
        self.held = [] if any(map(os.path.exists, record)) and config is not None else None

    def __call__(self, **entry):
        if self.wandb_run is not None:
            self.wandb_run.log(entry, step=entry['iter'])
        if self.config is None:
            path = os.path.join(self.out_dir, 'eval.jsonl')
            return self.append(path, dict(entry, eval_only=True))
        if self.held is not None:
            return self.held.append(entry)
        if not self.started:
            self.start([])
        self.append(self.path, entry)

    def start(self, entries):
        """config.json, then the log cut back to resume_iter with entries after it."""
        write_json(os.path.join(self.out_dir, 'config.json'), self.config)
        keep = [e for e in read_jsonl(self.path) if e['iter'] < self.resume_iter or (
            e['iter'] == self.resume_iter and 'val_loss' not in e)] \
            if os.path.exists(self.path) else []
        write_text(self.path, ''.join(json.dumps(e) + '\n' for e in keep + entries))
        self.started = True

    def flush(self):
        """A checkpoint was saved (or the run finished): the held entries join the record, which
        is written now if it was not yet (a checkpoint without a config.json beside it is not)."""
        if self.config is not None and (self.held is not None or not self.started):
            entries, self.held = self.held or [], None
            self.start(entries)

    @staticmethod
    def append(path, entry):
        with open(path, 'a') as f:
            f.write(json.dumps(entry) + '\n')


def init_wandb(c):
    if not c['wandb_log']:
        return None
    try:
        import wandb
    except ImportError:
        raise UserError("wandb_log=True needs wandb: `pip install wandb`, "
                        "or set --wandb_log=False") from None
    return wandb.init(project=c['wandb_project'], name=c['wandb_run_name'], config=c)


def evaluation_probe(c, data, device):
    """The function run at each evaluation whose dict joins its log line: the lab's attention
    probes with diagnostics=True (lab/probes.py, found beside this file), none with False."""
    if not c['diagnostics']:
        return None
    try:
        probes = importlib.import_module(PROBES)
    except ImportError as e:
        raise UserError(f"diagnostics=True needs {PROBES} ({e}): run from the repository root, "
                        "or set --diagnostics=False") from None
    return probes.probe(data, c, device)


def format_eta(seconds):
    m = int(seconds // 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{int(seconds % 60):02d}s"


class Clock:
    """Seconds per step since the last log line, with the first TIMING_WARMUP steps after a
    (re)start and every evaluation left out."""

    def __init__(self, start_iter):
        self.start_iter, self.mark = start_iter, None

    def tick(self, iter_num):
        if iter_num - self.start_iter == TIMING_WARMUP:
            self.mark = (iter_num, time.time())

    def pause(self, seconds):  # an evaluation took this long: not a step's time
        if self.mark is not None:
            self.mark = (self.mark[0], self.mark[1] + seconds)

    def step_time(self, iter_num):
        if self.mark is None or self.mark[0] == iter_num:
            return None
        now = time.time()
        dt = (now - self.mark[1]) / (iter_num - self.mark[0])
        self.mark = (iter_num, now)
        return dt


# -----------------------------------------------------------------------------
# the script

def train(c):
    """One run, from the settings to its last checkpoint: returns the Run."""
    d = setup_distributed(c)
    lock = OutDirLock(c['out_dir']) if d.master else None
    handlers, r, t0 = {}, None, time.time()
    try:
        # after the lock: the checkpoint cannot change under it
        c = dict(c, init_from=resolve_init(c, d.master))
        r = setup(c, d)
        handlers = {s: signal.signal(s, lambda signum, frame: on_signal(r, signum))
                    for s in (signal.SIGTERM, signal.SIGINT)}
        train_loop(r)
        if d.master and not c['eval_only'] and r.signal is None:
            r.log.flush()  # finished without a last checkpoint (always_save_checkpoint=False)
            print(f"finished at iter {r.iter_num} in {format_eta(time.time() - t0)}; sample "
                  f"from it: python sample.py --out_dir={c['out_dir']}")
        if d.ddp:
            # Free the DDP wrapper (its reducer holds gloo work) while the group is alive, and let
            # rank 0 finish writing: either torn down late aborts the process (SIGABRT) at exit.
            r.step_model = None
            gc.collect()
            dist.barrier()
        return r
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
        if d.ddp:
            dist.destroy_process_group()
        if lock is not None:
            lock.release(started=r is not None and r.log is not None and r.log.started)


def on_signal(r, signum):
    """The first SIGTERM or SIGINT: save at the next safe point (within a step or an evaluation
    batch) and stop. A second: stop at once; the checkpoint on disk stays whole, since every
    write of one is a rename."""
    name = signal.Signals(signum).name
    if r.signal is not None:
        print(f"{name} again: stopping now, without saving; the last checkpoint in "
              f"{r.c['out_dir']} is kept", file=sys.stderr, flush=True)
        return os._exit(128 + signum)
    r.signal = signum
    if r.d.master:
        print(f"{name}: saving a checkpoint and stopping (a second one stops at once)",
              file=sys.stderr, flush=True)


def settings(argv=None):
    """The run's config from defaults, config files and --key=value, with `query` the one query
    setting."""
    c = parse_config(DEFAULTS, argv, described_in=(__file__, model.__file__), types=TYPES)
    if c.pop('query_identity'):
        with model_errors('config'):
            c['query'] = upgrade_query({'query': c['query'], 'query_identity': True})['query']
    return c


def main(argv=None):
    r = train(settings(argv))
    if r.signal is not None:  # stopped early: a launcher or script must not take it as finished
        sys.exit(128 + r.signal)
    return r


if __name__ == '__main__':
    run_main(main)
