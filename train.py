"""
Train a kvgpt model, on one device or many:

    python train.py config/demo.py                        # CPU, the embedded corpus, ~3 minutes
    python train.py config/reduced.py --batch_size=8      # config files, then --key=value overrides
    torchrun --standalone --nproc_per_node=8 train.py config/reduced.py

The micro-batches of global step k are a pure function of (data_seed, k): every
variant, every restart and every world size sees the same token windows at the same
step, which is what makes the paper's side-by-side comparisons fair. Checkpoints are
written atomically, never from a non-finite state, and resuming continues bit for bit.
"""
import fcntl
import gc
import json
import math
import os
import signal
import socket
import time
from contextlib import nullcontext
from dataclasses import asdict, fields

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from common import (UserError, device_peak_flops, pick_device, load_checkpoint, model_errors,
                    model_from_checkpoint, open_dataset, parse_config, print_config, read_json,
                    read_jsonl, run_main, save_checkpoint, setup_device, write_json, write_text)
import model
from model import GPT, GPTConfig, upgrade_query

# -----------------------------------------------------------------------------
# defaults: GPT-2 small on OpenWebText, the authors' baseline settings; config/*.py and
# --key=value change them
DEFAULTS = dict(
    # run: where it goes, what it logs and keeps
    out_dir='out',  # checkpoints, log.jsonl and config.json of the run
    init_from='scratch',  # 'scratch', 'resume', 'auto' (resume if there is a checkpoint), 'gpt2'..
    #                       'gpt2-xl' or a local GPT-2 folder; 'auto' is for launchers that restart
    overwrite=False,  # True: init_from='scratch' may start over an out_dir holding a checkpoint
    eval_interval=1000,  # steps between evaluations (and checkpoints)
    eval_iters=200,  # batches per split in each evaluation
    eval_windows='fixed',  # 'fixed': one set of windows for the run; 'fresh': new ones each time
    #                        (the authors' protocol), the same for every variant at the same step
    eval_only=False,  # evaluate the checkpoint (with the full val loss) and stop
    log_interval=10,  # steps between log lines (loss, gradient norm, step time)
    diagnostics=True,  # attention, weight and induction diagnostics at each evaluation (log.jsonl)
    always_save_checkpoint=True,  # False: save only when val loss improves (nanoGPT's option)
    keep_checkpoints=(50000, 100000, 105000),  # steps whose ckpt_<step>.pt is kept (the authors')
    wandb_log=False,  # also log to Weights & Biases (pip install wandb)
    wandb_project='kvgpt',  # the W&B project
    wandb_run_name='run',  # the W&B run name
    # data
    dataset='openwebtext',  # data_root/<dataset>/ of prepare.py (pydocs, pysource: made if missing)
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
    max_iters=105002,  # the authors': 105001 in a loop that stops after iter_num > max_iters
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
TIMING_WARMUP = 2  # steps after each (re)start left out of step times, tokens/s, MFU, ETA
# Keys of the fixed windows and probes, next to (data_seed, step) keys of the training batches:
# above 2**31, so no training step can draw the same windows.
EVAL_KEY = 2 ** 31  # + split index (0 train, 1 val): the evaluation windows
DIAGNOSTICS_KEY = 2 ** 31 + 7  # the val windows the attention diagnostics are measured on
INDUCTION_KEY = 2 ** 31 + 8  # the repeated random tokens of the induction probe


# -----------------------------------------------------------------------------
# setup

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


def setup_distributed(c):
    """(ddp, rank, world_size, device); torchrun sets RANK, LOCAL_RANK and WORLD_SIZE."""
    device = pick_device(c['device'])
    if int(os.environ.get('RANK', -1)) == -1:
        return False, 0, 1, device
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
    return True, rank, world, device


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


def lock_out_dir(out_dir):
    """One run per out_dir: an exclusive flock on out_dir/.lock, which the OS releases when the
    process ends however it ends, so a crash never leaves a stale lock. Held for the run."""
    os.makedirs(out_dir, exist_ok=True)
    f = open(os.path.join(out_dir, '.lock'), 'a+')
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or 'another process'
        f.close()
        raise UserError(f"{out_dir} is in use by {holder}: wait for that run, stop it, or choose "
                        "another --out_dir") from None
    f.seek(0)
    f.truncate()
    f.write(f"train.py (pid {os.getpid()} on {socket.gethostname()})")
    f.flush()
    return f


def open_data(c, master, ddp):
    """The prepared dataset; an embedded corpus (pydocs, pysource) is prepared here when missing."""
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
    args = upgrade_query({k: c[k] for k in MODEL_KEYS})  # query None: the model's default, 'linear'
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


def truncate_log(path, resume_iter):
    """On resume, drop the log lines the resumed run writes again: everything after the
    checkpoint, and the evaluation at its iteration (the step that reached it stays)."""
    if not os.path.exists(path):
        return
    keep = [e for e in read_jsonl(path)
            if e['iter'] < resume_iter or (e['iter'] == resume_iter and 'val_loss' not in e)]
    write_text(path, ''.join(json.dumps(e) + '\n' for e in keep))


def run_finished(out_dir):
    """Whether out_dir holds a run that reached its final evaluation (max_iters, full val loss)."""
    config_path, log_path = os.path.join(out_dir, 'config.json'), os.path.join(out_dir, 'log.jsonl')
    if not (os.path.exists(config_path) and os.path.exists(log_path)):
        return False
    max_iters = read_json(config_path, 'config.json')['max_iters']
    return any(e.get('iter') == max_iters and 'val_loss_full' in e for e in read_jsonl(log_path))


class Logger:
    def __init__(self, path, wandb_run=None):
        self.path, self.wandb_run = path, wandb_run

    def __call__(self, **entry):
        with open(self.path, 'a') as f:
            f.write(json.dumps(entry) + '\n')
        if self.wandb_run is not None:
            self.wandb_run.log(entry, step=entry['iter'])


def init_wandb(c):
    if not c['wandb_log']:
        return None
    try:
        import wandb
    except ImportError:
        raise UserError("wandb_log=True needs wandb: `pip install wandb`, "
                        "or set --wandb_log=False") from None
    return wandb.init(project=c['wandb_project'], name=c['wandb_run_name'], config=c)


def format_eta(seconds):
    m = int(seconds // 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{int(seconds % 60):02d}s"


# -----------------------------------------------------------------------------
# the run

class Trainer:
    """One training run: __init__ sets it up (restoring a checkpoint), run() is the loop. Below
    them: one step, the evaluation, checkpoints, and what every rank must agree on."""

    def __init__(self, c, ddp, rank, world, device):
        check_settings(c, world)
        self.c, self.ddp, self.rank, self.world = c, ddp, rank, world
        self.master = rank == 0
        self.dev = setup_device(device, c['dtype'], c['compile'])
        self.accum = c['gradient_accumulation_steps'] // world
        self.tokens_per_iter = c['gradient_accumulation_steps'] * c['batch_size'] * c['block_size']
        torch.manual_seed(c['seed'] + rank)
        self.data = open_data(c, self.master, ddp)
        if self.master:
            print_config(c)
        self.raw_model, ckpt = build_model(c, self.data.meta, self.master)
        if self.master and not c['eval_only']:  # with the model's resolved settings: the run's
            write_json(os.path.join(c['out_dir'], 'config.json'),  # log and config describe it
                       dict(c, model_args=asdict(self.raw_model.config),
                            params=self.raw_model.get_num_params()))
        self.raw_model.to(self.dev.device)
        self.scaler = torch.amp.GradScaler(self.dev.type, enabled=self.dev.dtype == 'float16')
        self.optimizer = self.raw_model.configure_optimizers(
            c['weight_decay'], c['learning_rate'], (c['beta1'], c['beta2']), self.dev.type)
        self.iter_num, self.best_val_loss = 0, float('inf')
        if ckpt is not None:
            self.restore(ckpt)
        self.start_iter = self.iter_num
        if self.master:
            print(f"tokens per iteration: {self.tokens_per_iter:,} "
                  f"({c['gradient_accumulation_steps']} x {c['batch_size']} x {c['block_size']}, "
                  f"{world} process(es)); starting at iter {self.iter_num}")
        self.model = torch.compile(self.raw_model) if self.dev.compile else self.raw_model
        if ddp:
            on_gpu = self.dev.type == 'cuda'
            self.model = DDP(self.model,
                             device_ids=[torch.device(self.dev.device).index] if on_gpu else None)
        log_path = os.path.join(c['out_dir'], 'log.jsonl')
        if self.master:
            truncate_log(log_path, self.iter_num)
        self.log = Logger(log_path, init_wandb(c) if self.master else None)
        probe = min(4, c['batch_size'])
        windows = self.data.starts('val', probe, c['data_seed'], DIAGNOSTICS_KEY)
        self.diag_x = self.data.batch('val', windows, self.dev.device)[0]
        self.induction_x = self.data.repeated_tokens(probe, c['data_seed'], INDUCTION_KEY)
        self.induction_x = self.induction_x.to(self.dev.device)
        self.nonfinite = torch.zeros((), dtype=torch.bool, device=self.dev.device)
        self.loss_sum = torch.zeros((), dtype=torch.float32, device=self.dev.device)
        self.grad_norm = torch.zeros((), dtype=torch.float32, device=self.dev.device)
        self.lr, self.signal, self.clock = None, None, None

    def run(self):
        c, keep = self.c, set(self.c['keep_checkpoints'])
        while True:
            last = self.iter_num >= c['max_iters'] or c['eval_only']
            if self.iter_num % c['eval_interval'] == 0 or last:
                self.evaluate()
            if last:
                return
            self.step()
            if self.iter_num in keep:
                self.check_finite()
                self.save('kept', f'ckpt_{self.iter_num}.pt')
            if self.iter_num % c['log_interval'] == 0:
                self.log_step()
            if self.stop_requested():
                self.check_finite()
                self.save('signal')
                if self.master:
                    print(f"stopped by a signal at iter {self.iter_num}; continue with "
                          "--init_from=resume (or auto)")
                return

    # -- one step --------------------------------------------------------------

    def step(self):
        """One optimizer step over the global batch of this iteration."""
        c, batch = self.c, self.c['batch_size']
        self.lr = lr_at(self.iter_num, c)
        for group in self.optimizer.param_groups:
            group['lr'] = self.lr
        starts = self.data.starts('train', c['gradient_accumulation_steps'] * batch, c['data_seed'],
                                  self.iter_num)
        self.loss_sum.zero_()
        for micro in range(self.accum):
            m = self.rank * self.accum + micro  # this micro-batch's index in the global batch
            x, y = self.data.batch('train', starts[m * batch:(m + 1) * batch], self.dev.device)
            # DDP averages over ranks; dividing by the local accumulation makes the global mean
            sync = self.model.no_sync() if self.ddp and micro < self.accum - 1 else nullcontext()
            with sync:
                with self.dev.ctx:
                    _, loss = self.model(x, y)
                self.scaler.scale(loss / self.accum).backward()
            loss = loss.detach()
            self.nonfinite |= ~torch.isfinite(loss)
            self.loss_sum += loss.float()
        if c['grad_clip'] > 0:
            self.scaler.unscale_(self.optimizer)
            self.grad_norm = torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(),
                                                            c['grad_clip'])
        elif self.iter_num % c['log_interval'] == c['log_interval'] - 1:  # the step logged next
            self.scaler.unscale_(self.optimizer)
            grads = [p.grad for p in self.raw_model.parameters() if p.grad is not None]
            self.grad_norm = torch.nn.utils.get_total_norm(grads)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.iter_num += 1
        if self.iter_num - self.start_iter == TIMING_WARMUP:
            self.clock = (self.iter_num, time.time())

    def step_time(self):
        """Seconds per step since the last log, warm-up and evaluations left out; None at first."""
        if self.clock is None or self.clock[0] == self.iter_num:
            return None
        now = time.time()
        dt = (now - self.clock[1]) / (self.iter_num - self.clock[0])
        self.clock = (self.iter_num, now)
        return dt

    def log_step(self):
        c = self.c
        self.check_finite()
        mean_loss = self.loss_sum / self.accum  # the step's global-batch mean, as after a resume
        if self.ddp:
            dist.all_reduce(mean_loss)
            mean_loss /= self.world
        loss, grad_norm, dt = mean_loss.item(), self.grad_norm.item(), self.step_time()
        peak = device_peak_flops(self.dev.device)
        mfu = dt and self.raw_model.estimate_mfu(self.tokens_per_iter // self.world, dt, peak,
                                                 c['block_size'])
        eta = dt and dt * (c['max_iters'] - self.iter_num)
        if not self.master:
            return
        timing = f", {dt * 1000:.1f} ms/iter, eta {format_eta(eta)}" if dt else ""
        mfu_text = f", mfu {mfu * 100:.1f}%" if mfu else ""
        print(f"iter {self.iter_num}: loss {loss:.4f}, grad norm {grad_norm:.3f}, "
              f"lr {self.lr:.2e}{timing}{mfu_text}")
        self.log(iter=self.iter_num, tokens=self.iter_num * self.tokens_per_iter, lr=self.lr,
                 loss=loss, grad_norm=grad_norm, dt_ms=dt and dt * 1000,
                 tokens_per_s=dt and self.tokens_per_iter / dt, mfu=mfu, eta_s=eta)

    # -- evaluation ------------------------------------------------------------

    def evaluate(self):
        c, t0 = self.c, time.time()
        self.check_finite()
        losses = self.estimate_loss()
        entry = dict(iter=self.iter_num, tokens=self.iter_num * self.tokens_per_iter,
                     train_loss=losses['train'], val_loss=losses['val'])
        if self.iter_num >= c['max_iters'] or c['eval_only']:
            entry['val_loss_full'] = self.full_val_loss()
        if self.master and c['diagnostics']:
            self.raw_model.eval()
            with self.dev.ctx:
                entry['diagnostics'] = self.raw_model.diagnostics(self.diag_x)
                entry.update(self.raw_model.induction(self.induction_x))
            self.raw_model.train()
        entry['eval_s'] = time.time() - t0  # what evaluating costs: the step times leave it out
        if self.master:
            full = entry.get('val_loss_full')
            full = f", full val loss {full:.4f}" if full is not None else ''
            print(f"iter {self.iter_num}: train loss {losses['train']:.4f}, "
                  f"val loss {losses['val']:.4f}{full}")
            self.log(**entry)
        if not math.isfinite(losses['val']):
            raise UserError(f"val loss is non-finite at iter {self.iter_num}; the checkpoints in "
                            f"{c['out_dir']} are untouched")
        improved = losses['val'] < self.best_val_loss
        self.best_val_loss = min(self.best_val_loss, losses['val'])
        moved = not c['eval_only'] and self.iter_num > self.start_iter
        if moved and (improved or c['always_save_checkpoint']):
            self.save('eval')
        if self.clock is not None:  # step times leave evaluations out
            self.clock = (self.clock[0], self.clock[1] + time.time() - t0)

    @torch.no_grad()
    def estimate_loss(self):
        """Mean loss over eval_iters batches per split, the ranks splitting them. 'fixed' windows
        are one set for the whole run; 'fresh' ones are drawn anew at every evaluation step. Either
        way they depend on (data_seed, step) alone: every variant is measured on identical
        tokens."""
        c, batch = self.c, self.c['batch_size']
        self.model.eval()
        out = {}
        for split_id, split in enumerate(('train', 'val')):
            key = (c['data_seed'], EVAL_KEY + split_id)
            key += (self.iter_num,) if c['eval_windows'] == 'fresh' else ()
            starts = self.data.starts(split, c['eval_iters'] * batch, *key)
            total = torch.zeros(2, dtype=torch.float64, device=self.dev.device)
            for i in range(self.rank, c['eval_iters'], self.world):
                x, y = self.data.batch(split, starts[i * batch:(i + 1) * batch], self.dev.device)
                with self.dev.ctx:
                    _, loss = self.model(x, y)
                total += torch.stack([loss.double(), torch.ones_like(total[0])])
            if self.ddp:
                dist.all_reduce(total)
            out[split] = (total[0] / total[1]).item()
        self.model.train()
        return out

    @torch.no_grad()
    def full_val_loss(self):
        """The mean loss over every token of the val split once, in order (common.Dataset.tiling):
        no sampling noise, and the same tokens for every run, seed and world size. The number a
        verdict between variants uses; computed at the final evaluation only."""
        self.raw_model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=self.dev.device)
        batches = self.data.tiling('val', self.c['batch_size'])
        for starts, length in batches[self.rank::self.world]:
            x, y = self.data.batch('val', starts, self.dev.device, length)
            with self.dev.ctx:
                _, loss = self.raw_model(x, y)
            count = torch.tensor(float(y.numel()), device=total.device)
            total += torch.stack([loss.double() * y.numel(), count])
        if self.ddp:
            dist.all_reduce(total)
        self.raw_model.train()
        return (total[0] / total[1]).item()

    # -- checkpoints -----------------------------------------------------------

    def save(self, reason, name='ckpt.pt'):
        """Write a checkpoint atomically from rank 0. The ranks agree on failure first, so a save
        that fails on rank 0 ends every rank with its message instead of a hang."""
        states = rng_state(self.dev.device, self.ddp)  # a collective: every rank takes part
        path = os.path.join(self.c['out_dir'], name)
        error = self.write_checkpoint(states, path) if self.master else None
        if self.any_rank(error is not None):
            raise UserError(error or f"rank 0 could not save {path} at iter {self.iter_num} "
                                     "(see its error)")
        if self.master:
            print(f"saved {path} at iter {self.iter_num} ({reason})")

    def write_checkpoint(self, states, path):
        """None once written, else why not; the file at path stays as it was either way."""
        if not params_finite(self.raw_model):
            return (f"parameters are non-finite at iter {self.iter_num}; not saving, {path} is "
                    "untouched")
        c = self.c
        try:
            save_checkpoint(dict(
                model=self.raw_model.state_dict(), optimizer=self.optimizer.state_dict(),
                model_args=asdict(self.raw_model.config), iter_num=self.iter_num,
                best_val_loss=self.best_val_loss, config=c, meta=self.data.meta, rng=states,
                tokens_seen=self.iter_num * self.tokens_per_iter,
                scaler=self.scaler.state_dict() if self.scaler.is_enabled() else None), path)
        except OSError as e:
            return f"cannot write {path} ({e.strerror or e}); the previous file there is untouched"
        return None

    def restore(self, ckpt):
        if 'optimizer' in ckpt:
            self.optimizer.load_state_dict(ckpt['optimizer'])
        elif self.master:
            print("the checkpoint has no optimizer state (a converted model?): fine-tuning with a "
                  "fresh AdamW")
        if ckpt.get('scaler'):
            self.scaler.load_state_dict(ckpt['scaler'])
        self.iter_num, self.best_val_loss = ckpt['iter_num'], float(ckpt['best_val_loss'])
        set_rng_state(ckpt.get('rng', []), self.rank, self.dev.device)

    # -- across ranks: failures and signals ------------------------------------

    def any_rank(self, flag):
        """True when flag is set on any rank: every rank takes the same branch, so none is left
        waiting in a collective the others never reach. Outside DDP, no sync for a Python bool."""
        if not self.ddp:
            return bool(flag)
        t = flag.float().reshape(1) if torch.is_tensor(flag) else \
            torch.tensor([float(flag)], device=self.dev.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item() > 0

    def check_finite(self):
        if self.any_rank(self.nonfinite):
            raise UserError(f"the loss became non-finite by iter {self.iter_num}; the last good "
                            f"checkpoint in {self.c['out_dir']} is untouched: lower learning_rate, "
                            "use dtype=bfloat16, or resume from it")

    def on_signal(self, signum, frame):  # cluster preemption: finish the step, save, exit
        self.signal = signum

    def stop_requested(self):
        """A signal arrived on any rank. Under DDP that is one all-reduce, so it is asked only
        at log steps: still well inside torchrun's grace period, and no per-step host sync."""
        if not self.ddp:
            return self.signal is not None
        at_log_step = self.iter_num % self.c['log_interval'] == 0
        return at_log_step and self.any_rank(self.signal is not None)


def train(c):
    ddp, rank, world, device = setup_distributed(c)
    lock = lock_out_dir(c['out_dir']) if rank == 0 else None
    handlers = {}
    try:
        # after the lock: the checkpoint cannot change under it
        c = dict(c, init_from=resolve_init(c, rank == 0))
        trainer = Trainer(c, ddp, rank, world, device)
        handlers = {s: signal.signal(s, trainer.on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        trainer.run()
        if ddp:
            # Free the DDP wrapper (its reducer holds gloo work) while the group is alive, and let
            # rank 0 finish writing: either torn down late aborts the process (SIGABRT) at exit.
            del trainer
            gc.collect()
            dist.barrier()
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
        if ddp:
            dist.destroy_process_group()
        if lock is not None:
            lock.close()


def settings(argv=None):
    """The run's config from defaults, config files and --key=value, with `query` the one query
    setting."""
    c = parse_config(DEFAULTS, argv, described_in=(__file__, model.__file__))
    if c.pop('query_identity'):
        with model_errors('config'):
            c['query'] = upgrade_query({'query': c['query'], 'query_identity': True})['query']
    return c


def main(argv=None):
    return train(settings(argv))


if __name__ == '__main__':
    run_main(main)
