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
import importlib
import math
import os
import shlex
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from evals import hellaswag
from kvgpt import checkpoint, distributed
from kvgpt.checkpoint import load_optimizer_state, model_from_checkpoint, save_checkpoint
from kvgpt.config import Kind, field_kinds, parse_config, print_overrides
from kvgpt.data import Dataset, check_fits, check_same_data, open_or_prepare
from kvgpt.device import DTYPES, device_peak_flops, setup_device
from kvgpt.errors import UserError, fs_error, model_errors, run_main
from kvgpt.tracking import Record, open_trackers, wandb_run_id
import model
from model import ACTIVATIONS, GPT, QUERY_MODES, GPTConfig, upgrade_query

# -----------------------------------------------------------------------------
# settings: GPT-2 small on OpenWebText, the authors' baseline; config/*.py and --key=value
DEFAULTS = dict(
    # run: where it goes, what it logs and keeps
    out_dir='out',  # checkpoints, log.jsonl and config.json of the run
    init_from='scratch',  # scratch, resume, auto (resume if a checkpoint), gpt2..gpt2-xl, a folder
    overwrite=False,  # True: init_from='scratch' may start over an out_dir holding a checkpoint
    eval_interval=1000,  # steps between evaluations (and checkpoints)
    eval_iters=200,  # batches per split in each evaluation
    eval_only=False,  # evaluate the checkpoint (with the full val loss) into eval.jsonl, and stop
    log_interval=10,  # steps between log lines (loss, gradient norm, step time)
    probe=None,  # a module whose probe(data, c, device) adds to each evaluation's log line
    hellaswag=None,  # a HellaSwag-format .jsonl, or 'download': scored at the end (evals/)
    hellaswag_interval=0,  # also score it at evaluations every this many steps; 0: the end only
    hellaswag_items=None,  # score its first this many items; None: all
    always_save_checkpoint=True,  # False: save only when val loss improves (nanoGPT's option)
    keep_checkpoints=(50000, 100000, 105000),  # steps whose ckpt_<step>.pt is kept (the authors')
    wandb_log=False,  # also log to Weights & Biases (pip install wandb); a resume continues it
    wandb_project='kvgpt',  # the W&B project
    wandb_run_name=None,  # the W&B run name; None: the out_dir's name
    tensorboard_log=False,  # also write TensorBoard scalars to out_dir/tensorboard
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
# GPTConfig's annotations, and the choices of a word
TYPES = dict(
    field_kinds(GPTConfig), query=Kind(str, QUERY_MODES), pos=Kind(str, ('learned', 'rope')),
    activation=Kind(str, tuple(ACTIVATIONS)), device=Kind('device'), dtype=Kind(str, DTYPES),
    compile=Kind(bool), backend=Kind(str, ('nccl', 'gloo')), probe=Kind(str),
    wandb_run_name=Kind(str), hellaswag=Kind(str), hellaswag_items=Kind(int, optional=True))


def settings(argv=None):
    """The run's config from defaults, config files and --key=value; `query` the one query key."""
    c = parse_config(DEFAULTS, argv, described_in=(__file__, model.__file__), types=TYPES)
    if c.pop('query_identity'):
        with model_errors('config'):
            c['query'] = upgrade_query({'query': c['query'], 'query_identity': True})['query']
    for key in ('batch_size', 'block_size', 'max_iters', 'eval_interval', 'eval_iters',
                'log_interval', 'gradient_accumulation_steps'):
        if c[key] < (0 if key == 'max_iters' else 1):
            raise UserError(f"{key} must be positive, got {c[key]}")
    if not all(isinstance(k, int) and k > 0 for k in c['keep_checkpoints']):
        raise UserError("keep_checkpoints must be a tuple of positive steps, "
                        f"got {c['keep_checkpoints']!r}")
    return c


# -----------------------------------------------------------------------------
# data: the windows of step k are drawn from (data_seed, k) alone

EVAL_KEY = 2 ** 31  # + split (0 train, 1 val): the evaluation windows' key, above every step's


def tokens_per_iter(c):
    return c['gradient_accumulation_steps'] * c['batch_size'] * c['block_size']


def step_starts(data, c, step):  # every variant, restart and world size: the same windows
    return data.starts('train', tokens_per_iter(c) // c['block_size'], c['data_seed'], step)


def get_batch(data, c, starts, micro, device):  # micro-batch `micro` of the step's windows
    n = c['batch_size']
    return data.batch('train', starts[micro * n:(micro + 1) * n], device)


# -----------------------------------------------------------------------------
# the model: from scratch, a checkpoint, or GPT-2

def model_args_from(c, meta):
    args = upgrade_query({k: c[k] for k in MODEL_KEYS})  # query None: the model's default, linear
    if args['vocab_size'] is None:
        args['vocab_size'] = -(-meta['vocab_size'] // 64) * 64  # round up: faster matmuls
    return args


def build_model(c, meta, master):
    """(model, checkpoint or None) for init_from = scratch | resume | gpt2* or a GPT-2 folder."""
    ckpt = None
    if c['init_from'] == 'scratch':
        with model_errors('bad model config'):
            model = GPT(GPTConfig(**model_args_from(c, meta)), verbose=master)
    elif c['init_from'] == 'resume':
        model, ckpt = model_from_checkpoint(os.path.join(c['out_dir'], 'ckpt.pt'), verbose=master)
        check_same_data(ckpt.get('meta'), meta, f"{c['out_dir']}/ckpt.pt",
                                f"{c['data_root']}/{c['dataset']}")
        changed = [k for k, v in ckpt['model_args'].items() if c.get(k) is not None and c[k] != v]
        if changed and master:
            print("resuming: the checkpoint's model settings win over "
                  + ', '.join(f'{k}={c[k]!r}' for k in changed))
    else:
        with model_errors():
            model = GPT.from_pretrained(c['init_from'], dropout=c['dropout'])
    check_fits(meta, model.config.vocab_size, model.config.block_size, c['block_size'])
    return model, ckpt


# -----------------------------------------------------------------------------
# the learning rate: linear warmup, then a cosine to min_lr

def get_lr(it, c):
    """The authors stop at step ~105k of a 600k cosine, so their runs end at 93.6% of the peak."""
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
# step times: what the log lines report

TIMING_WARMUP = 2  # steps after each (re)start left out of step times (compilation, caches)


class StepTimer:
    """Seconds per step since the last log line, leaving out the TIMING_WARMUP steps after each
    (re)start and every evaluation."""

    def __init__(self, start_iter):
        self.start_iter, self.mark = start_iter, None

    def tick(self, iter_num):
        if iter_num - self.start_iter == TIMING_WARMUP:
            self.mark = (iter_num, time.time())

    def pause(self, seconds):
        if self.mark is not None:
            self.mark = (self.mark[0], self.mark[1] + seconds)

    def step_time(self, iter_num):
        if self.mark is None or self.mark[0] == iter_num:
            return None
        now = time.time()
        dt, self.mark = (now - self.mark[1]) / (iter_num - self.mark[0]), (iter_num, now)
        return dt


def format_eta(seconds):
    m = int(seconds // 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{int(seconds % 60):02d}s"


# -----------------------------------------------------------------------------
# the loop

@dataclass
class Run:  # what the loop reads and changes, made by setup() below
    c: dict  # the settings
    d: distributed.Dist  # this process's place in the world
    dev: object  # kvgpt.device.DeviceSetup: device, dtype, autocast
    data: Dataset
    model: GPT  # the raw model: checkpoints, evaluation, probes
    step_model: torch.nn.Module  # the same, compiled and/or wrapped for DDP: the training steps
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    signals: distributed.Signals
    record: Record = None  # rank 0's config.json and log.jsonl
    probe: object = None  # the evaluation hook of the probe setting
    hellaswag: object = None  # scores the hellaswag setting's items (evals/hellaswag.py)
    iter_num: int = 0
    best_val_loss: float = math.inf


def train_loop(r):
    """nanoGPT's loop: evaluate and save, the micro-steps, clip and step, log, stop."""
    c, d, start_iter = r.c, r.d, r.iter_num
    accum = d.per_process(c['gradient_accumulation_steps'])  # this process's micro-steps
    # the step's loss and gradient norm stay on the device, read only at log steps
    loss_sum = torch.zeros((), device=d.device)
    nonfinite = torch.zeros((), dtype=torch.bool, device=d.device)
    grad_norm = torch.zeros((), device=d.device)
    timer = StepTimer(start_iter)
    while True:
        last = r.iter_num >= c['max_iters'] or c['eval_only']
        if r.iter_num % c['eval_interval'] == 0 or last:
            distributed.check_finite(d, nonfinite, r.iter_num, c['out_dir'])
            try:
                timer.pause(evaluate(r, trained=r.iter_num > start_iter))
            except distributed.Interrupted:  # the state is the last step's, whole: save, stop
                return stop(r, nonfinite)
        if last:
            return
        lr = get_lr(r.iter_num, c)
        for group in r.optimizer.param_groups:
            group['lr'] = lr
        # forward and backward over this process's share of the step's global batch
        loss_sum.zero_()
        starts = step_starts(r.data, c, r.iter_num)  # once a step, each micro-batch a slice
        for micro in range(accum):
            x, y = get_batch(r.data, c, starts, d.rank * accum + micro, d.device)
            # DDP averages over ranks; dividing by the local accumulation makes the global mean
            with r.step_model.no_sync() if d.ddp and micro < accum - 1 else nullcontext():
                with r.dev.ctx:
                    _, loss = r.step_model(x, y)
                r.scaler.scale(loss / accum).backward()
            loss = loss.detach()
            nonfinite |= ~torch.isfinite(loss)
            loss_sum += loss.float()
        log_now = (r.iter_num + 1) % c['log_interval'] == 0
        if c['grad_clip'] > 0:
            r.scaler.unscale_(r.optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(r.model.parameters(), c['grad_clip'])
        elif log_now:  # the gradient norm is logged even without clipping
            r.scaler.unscale_(r.optimizer)
            grad_norm = torch.nn.utils.get_total_norm(
                [p.grad for p in r.model.parameters() if p.grad is not None])
        r.scaler.step(r.optimizer)
        r.scaler.update()
        r.optimizer.zero_grad(set_to_none=True)
        r.iter_num += 1
        timer.tick(r.iter_num)
        if r.iter_num in c['keep_checkpoints']:
            distributed.check_finite(r.d, nonfinite, r.iter_num, r.c['out_dir'])
            save(r, 'kept', f'ckpt_{r.iter_num}.pt')
        if log_now:
            distributed.check_finite(r.d, nonfinite, r.iter_num, r.c['out_dir'])
            log_step(r, loss_sum / accum, grad_norm, lr, timer.step_time(r.iter_num))
        if r.signals.requested(r.iter_num, c['log_interval']):
            return stop(r, nonfinite)


def stop(r, nonfinite):
    distributed.check_finite(r.d, nonfinite, r.iter_num, r.c['out_dir'])
    save(r, 'signal')
    if r.d.master:
        print(f"stopped by a signal at iter {r.iter_num} ({r.signals.describe()}); continue with "
              "--init_from=resume (or auto)", flush=True)


def log_step(r, step_loss, grad_norm, lr, dt):
    c, tokens = r.c, tokens_per_iter(r.c)
    if r.d.ddp:  # the mean over the global batch, the same number at any world size
        dist.all_reduce(step_loss)
        step_loss /= r.d.world
    loss, grad_norm = step_loss.item(), float(grad_norm)
    peak = device_peak_flops(r.d.device)
    mfu = dt and r.model.estimate_mfu(tokens // r.d.world, dt, peak, c['block_size'])
    eta = dt and dt * (c['max_iters'] - r.iter_num)
    if not r.d.master:
        return
    timing = f", {dt * 1000:.1f} ms/iter, eta {format_eta(eta)}" if dt else ""
    print(f"iter {r.iter_num}: loss {loss:.4f}, grad norm {grad_norm:.3f}, lr {lr:.2e}{timing}"
          + (f", mfu {mfu * 100:.1f}%" if mfu else ""))
    r.record.log(iter=r.iter_num, tokens=r.iter_num * tokens, lr=lr, loss=loss,
                 grad_norm=grad_norm, dt_ms=dt and dt * 1000, tokens_per_s=dt and tokens / dt,
                 mfu=mfu, eta_s=eta)


# -----------------------------------------------------------------------------
# evaluation

def evaluate(r, trained):
    """The losses on both splits (and at the end the full val loss, the number verdicts use),
    the probes, the log line, then a checkpoint; the seconds it took."""
    c, t0, n, losses = r.c, time.time(), r.c['batch_size'], {}
    for k, split in enumerate(('train', 'val')):  # windows drawn once: the same at every step
        starts = r.data.starts(split, c['eval_iters'] * n, c['data_seed'], EVAL_KEY + k)
        losses[split] = mean_loss(r, r.step_model, split, [
            (starts[i * n:(i + 1) * n], None) for i in range(c['eval_iters'])])
    entry = dict(iter=r.iter_num, tokens=r.iter_num * tokens_per_iter(c),
                 train_loss=losses['train'], val_loss=losses['val'])
    if r.iter_num >= c['max_iters'] or c['eval_only']:  # every val token once, in order
        entry['val_loss_full'] = mean_loss(r, r.model, 'val', r.data.tiling('val', n), True)
    interval = c['hellaswag_interval']
    if r.hellaswag and ('val_loss_full' in entry or interval and r.iter_num % interval == 0):
        entry.update(r.hellaswag(r.model, r.signals.share))  # the ranks share the items
    if r.probe is not None:
        entry.update(r.probe(r.model))
    entry['eval_s'] = time.time() - t0
    if r.d.master:
        full = entry.get('val_loss_full')
        print(f"iter {r.iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
              + (f", full val loss {full:.4f}" if full is not None else '')
              + ''.join(f", {k} {entry[k]:.4f}" for k in ('hellaswag_acc', 'hellaswag_acc_norm')
                        if k in entry))
        r.record.log(**entry)
    distributed.check_finite(r.d, not math.isfinite(losses['val']), r.iter_num, c['out_dir'])
    improved = losses['val'] < r.best_val_loss
    r.best_val_loss = min(r.best_val_loss, losses['val'])
    # a checkpoint only of steps this process trained: a resume's first evaluation saves nothing
    if trained and not c['eval_only'] and (improved or c['always_save_checkpoint']):
        save(r, 'eval')
    return time.time() - t0


@torch.no_grad()
def mean_loss(r, model, split, batches, per_token=False):
    """The mean loss over batches, (window starts, length) each: of the batches' losses, or with
    per_token of every target. The ranks split the batches; a signal stops it within one."""
    total = torch.zeros(2, dtype=torch.float64, device=r.d.device)
    model.eval()
    for starts, length in (batches[i] for i in r.signals.share(range(len(batches)))):
        x, y = r.data.batch(split, starts, r.d.device, length)
        with r.dev.ctx:
            _, loss = model(x, y)
        weight = torch.tensor(float(y.numel()) if per_token else 1.0, device=total.device)
        total += torch.stack([loss.double() * weight, weight.double()])
    model.train()
    if r.d.ddp:
        dist.all_reduce(total)
    return (total[0] / total[1]).item()


def load_probe(c, data, dev):
    """The probe setting's hook, run at each evaluation on the model in eval mode, under the
    run's autocast: its dict joins the log line."""
    try:
        probe = importlib.import_module(c['probe']).probe(data, c, dev.device)
    except ImportError as e:
        raise UserError(f"probe={c['probe']!r} cannot be imported ({e}): run from the repository "
                        "root, or set --probe=None") from None

    def run(model):
        model.eval()
        with dev.ctx:
            values = probe(model)
        model.train()
        return values
    return run


# -----------------------------------------------------------------------------
# checkpoints: save and restore

def save(r, reason, name='ckpt.pt'):
    """Write a checkpoint atomically from rank 0, never from non-finite weights. The ranks agree on
    failure first, so a save that fails on rank 0 ends every rank with its message, not a hang.
    Once ckpt.pt is written, the run's record may describe it."""
    states = distributed.rng_states(r.d)  # a collective: every rank takes part
    path, error = os.path.join(r.c['out_dir'], name), None
    if r.d.master and not all(bool(torch.isfinite(p).all()) for p in r.model.parameters()):
        error = f"parameters are non-finite at iter {r.iter_num}; not saving, {path} is untouched"
    elif r.d.master:
        # the record is written before the new ckpt.pt replaces the old one: if it fails, both stay
        record = r.record.commit if name == 'ckpt.pt' else None
        try:
            save_checkpoint(dict(
                model=r.model.state_dict(), optimizer=r.optimizer.state_dict(),
                model_args=asdict(r.model.config), iter_num=r.iter_num,
                best_val_loss=r.best_val_loss, config=r.c, meta=r.data.meta, rng=states,
                tokens_seen=r.iter_num * tokens_per_iter(r.c),
                wandb_run_id=wandb_run_id(r.record),  # a resume continues the same W&B run
                scaler=r.scaler.state_dict() if r.scaler.is_enabled() else None), path, record)
        except OSError as e:
            error = f"{fs_error(e, path)}; the previous checkpoint there is untouched"
        except UserError as e:  # the record: the checkpoint and the record are as they were
            error = f"{e}; {path} and the run's record are as they were"
    if distributed.any_rank(r.d, error is not None):
        raise UserError(error or f"rank 0 could not save {path} at iter {r.iter_num} "
                                 "(see its error)")
    if r.d.master:
        print(f"saved {path} at iter {r.iter_num} ({reason})")


def restore(r, ckpt):
    if 'optimizer' in ckpt:
        load_optimizer_state(r.optimizer, r.model, ckpt['optimizer'],
                             os.path.join(r.c['out_dir'], 'ckpt.pt'))
    elif r.d.master:
        print("the checkpoint has no optimizer state (a converted model?): fine-tuning with a "
              "fresh AdamW")
    if ckpt.get('scaler'):
        r.scaler.load_state_dict(ckpt['scaler'])
    r.iter_num, r.best_val_loss = ckpt['iter_num'], float(ckpt['best_val_loss'])
    distributed.set_rng_state(r.d, ckpt.get('rng', []))


# -----------------------------------------------------------------------------
# the script

def setup(c, d, signals):
    """The run: data, model (from scratch, a checkpoint or GPT-2), optimizer, record."""
    d.per_process(c['gradient_accumulation_steps'])  # the global batch: the same at any world size
    dev = setup_device(d.device, c['dtype'], c['compile'])
    torch.manual_seed(c['seed'] + d.rank)
    data = open_or_prepare(c['data_root'], c['dataset'], c['block_size'], d.master,
                                   dist.barrier if d.ddp else None)
    if d.master:
        print_overrides(c, DEFAULTS)
    model, ckpt = build_model(c, data.meta, d.master)
    config = dict(c, model_args=asdict(model.config), params=model.get_num_params())
    if ckpt is not None:  # the checkpoint's model wins over a resume's model settings: record it
        config.update({k: v for k, v in ckpt['model_args'].items() if c.get(k) is not None})
    model.to(dev.device)
    scaler = torch.amp.GradScaler(dev.type, enabled=dev.dtype == 'float16')
    optimizer = model.configure_optimizers(c['weight_decay'], c['learning_rate'],
                                           (c['beta1'], c['beta2']), dev.type)
    step_model = torch.compile(model) if dev.compile else model
    if d.ddp:
        ids = [torch.device(dev.device).index] if dev.type == 'cuda' else None
        step_model = DDP(step_model, device_ids=ids)
    r = Run(c, d, dev, data, model, step_model, optimizer, scaler, signals)
    r.hellaswag = c['hellaswag'] and hellaswag.scorer(c, data.meta['tokenizer'], dev, d.ddp)
    if ckpt is not None:
        restore(r, ckpt)
    if d.master:  # eval_only writes no config.json or log.jsonl: those are the training run's
        r.record = Record(c['out_dir'], None if c['eval_only'] else config, r.iter_num,
                          open_trackers(c, r.iter_num, ckpt and ckpt.get('wandb_run_id')))
        r.probe = c['probe'] and load_probe(c, data, dev)
        print(f"tokens per iteration: {tokens_per_iter(c):,} ({c['gradient_accumulation_steps']}"
              f" x {c['batch_size']} x {c['block_size']}, {d.world} process(es)); starting at "
              f"iter {r.iter_num}")
    return r


def train(c):
    """One run, from the settings to its last checkpoint: returns the Run."""
    d = distributed.setup_distributed(c['device'], c['backend'])
    lock = checkpoint.OutDirLock(c['out_dir']) if d.master else None
    r, t0 = None, time.time()
    try:
        with distributed.Signals(d, c['out_dir']) as signals:
            # after the lock: the checkpoint cannot change under it
            c = dict(c, init_from=checkpoint.resolve_init(c, d.master))
            r = setup(c, d, signals)
            train_loop(r)
        if d.master and not c['eval_only'] and signals.stopped is None:
            # what this run added with no checkpoint after it (always_save_checkpoint=False, or
            # a final evaluation cut short before): a finished run resumed leaves its record be
            if r.iter_num > r.record.resume_iter or not r.record.holds_final(r.iter_num):
                r.record.commit()
            print(f"finished at iter {r.iter_num} in {format_eta(time.time() - t0)}; sample "
                  f"from it: python sample.py --out_dir={shlex.quote(c['out_dir'])}")
        r.step_model = None  # the DDP wrapper goes while the process group lives
        return r
    finally:
        if r is not None and r.record is not None:
            r.record.close()  # the trackers' last writes
        distributed.close(d, finished=r is not None and r.step_model is None)
        if lock is not None:
            lock.release(started=r is not None and r.record is not None and r.record.started)


def main(argv=None):
    r = train(settings(argv))
    if r.signals.stopped is not None:  # stopped early, on every rank: not taken as finished
        sys.exit(128 + r.signals.stopped[1])
    return r


if __name__ == '__main__':
    run_main(main)
