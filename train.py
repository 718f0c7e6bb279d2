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
import gc
import json
import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, fields

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from common import (UserError, autocast, device_peak_flops, load_checkpoint, model_from_checkpoint, parse_config, pick_device,
                    pick_precision, print_config, read_json, read_jsonl, read_windows, run_main, save_checkpoint, write_json,
                    write_text)
from model import GPT, GPTConfig

# -----------------------------------------------------------------------------
# defaults: GPT-2 small on OpenWebText, the authors' baseline settings; config/*.py and
# --key=value change them
DEFAULTS = dict(
    # I/O
    out_dir='out',
    eval_interval=1000,
    eval_iters=200,
    log_interval=10,
    eval_only=False,
    always_save_checkpoint=True,  # False: save only when val loss improves (nanoGPT's option)
    init_from='scratch',  # 'scratch', 'resume', 'gpt2'..'gpt2-xl' or a local Hugging Face GPT-2 folder
    wandb_log=False,
    wandb_project='kvgpt',
    wandb_run_name='run',
    # data
    dataset='openwebtext',
    data_root='data',
    data_seed=1337,  # the batches of step k depend on (data_seed, k) only
    gradient_accumulation_steps=40,  # in total, over all processes
    batch_size=12,  # micro-batch per process
    block_size=1024,
    # the model: every GPTConfig field, with its default (see model.py); then:
    # AdamW and the learning-rate schedule
    learning_rate=6e-4,
    max_iters=100000,
    weight_decay=0.1,
    beta1=0.9,
    beta2=0.95,
    grad_clip=1.0,  # 0 disables
    decay_lr=True,
    warmup_iters=2000,
    lr_decay_iters=600000,
    min_lr=6e-5,
    # system
    device=None,  # None: cuda when available, else cpu
    dtype=None,  # None: bfloat16 where supported on cuda, else float32
    compile=None,  # None: on for cuda, off elsewhere
    backend=None,  # None: nccl on cuda, gloo on cpu
    seed=1337,  # model init and dropout
)
MODEL_KEYS = [f.name for f in fields(GPTConfig)]
# None for the fields GPTConfig derives (mlp_hidden, n_kv_head, ...): derived again from the final config
DEFAULTS.update({f.name: f.default for f in fields(GPTConfig) if f.name not in ('block_size',)})
DEFAULTS['vocab_size'] = None  # None: the dataset's vocabulary rounded up to a multiple of 64 (gpt2: 50304)


# -----------------------------------------------------------------------------
# setup

def setup_distributed(c):
    """(ddp, rank, local_rank, world_size, device); torchrun sets RANK/LOCAL_RANK/WORLD_SIZE."""
    ddp = int(os.environ.get('RANK', -1)) != -1
    device = pick_device(c['device'])
    if not ddp:
        return False, 0, 0, 1, device
    rank, local_rank, world = int(os.environ['RANK']), int(os.environ['LOCAL_RANK']), int(os.environ['WORLD_SIZE'])
    if device.startswith('cuda'):
        device = f'cuda:{local_rank}'
        torch.cuda.set_device(device)
    dist.init_process_group(backend=c['backend'] or ('nccl' if device.startswith('cuda') else 'gloo'))
    return True, rank, local_rank, world, device


def load_data_meta(c):
    """meta.json and both bins, checked against each other before step 0."""
    data_dir = os.path.join(c['data_root'], c['dataset'])
    meta_path = os.path.join(data_dir, 'meta.json')
    if not os.path.exists(meta_path):
        raise UserError(f"no prepared dataset at {data_dir}: run `python prepare.py --dataset={c['dataset']}` first")
    meta = read_json(meta_path, 'meta.json')
    for split in ('train', 'val'):
        path = os.path.join(data_dir, f'{split}.bin')
        size = os.path.getsize(path) if os.path.exists(path) else -1
        if size != meta[f'{split}_tokens'] * np.dtype(meta['dtype']).itemsize:
            raise UserError(f"{path} does not match meta.json (missing or truncated): re-run prepare.py with --force=True")
        if meta[f'{split}_tokens'] <= c['block_size'] + 1:
            raise UserError(f"{path} has {meta[f'{split}_tokens']} tokens, too few for block_size {c['block_size']}")
    meta['data_dir'] = data_dir
    return meta


def model_args_from(c, meta):
    args = {k: c[k] for k in MODEL_KEYS}
    if args['vocab_size'] is None:
        args['vocab_size'] = -(-meta['vocab_size'] // 64) * 64  # round up: faster matmuls
    return args


def check_model_fits_data(model_args, meta, c):
    if model_args['vocab_size'] < meta['vocab_size']:
        raise UserError(f"the model's vocab_size {model_args['vocab_size']} is smaller than the dataset's "
                        f"{meta['vocab_size']} ({meta['tokenizer']}): raise vocab_size or leave it None")
    if c['block_size'] > model_args['block_size']:
        raise UserError(f"block_size {c['block_size']} is longer than the model's {model_args['block_size']}")


def build_model(c, meta, master):
    """(model, checkpoint or None) for init_from = scratch | resume | gpt2*."""
    ckpt = None
    if c['init_from'] == 'scratch':
        args = model_args_from(c, meta)
        try:
            model = GPT(GPTConfig(**args), verbose=master)
        except ValueError as e:
            raise UserError(f"bad model config: {e}") from None
    elif c['init_from'] == 'resume':
        ckpt = load_checkpoint(os.path.join(c['out_dir'], 'ckpt.pt'))
        model = model_from_checkpoint(ckpt, verbose=master)
        changed = {k: (c[k], v) for k, v in ckpt['model_args'].items() if c.get(k) is not None and c[k] != v}
        if changed and master:
            print(f"resuming: the checkpoint's model settings win over {', '.join(f'{k}={a!r}' for k, (a, _) in changed.items())}")
    else:
        from convert import load_gpt2
        model = load_gpt2(c['init_from'], dropout=c['dropout'])
    check_model_fits_data(asdict(model.config), meta, c)
    return model, ckpt


# -----------------------------------------------------------------------------
# data: batch-matched by construction

def step_offsets(n_tokens, block_size, count, *key):
    """`count` window starts drawn from a generator seeded by key alone."""
    seed = int(np.random.SeedSequence(list(key)).generate_state(1)[0])
    g = torch.Generator().manual_seed(seed)
    return torch.randint(n_tokens - block_size - 1, (count,), generator=g).numpy()


def get_batch(meta, split, offsets, block_size, device):
    xy = read_windows(os.path.join(meta['data_dir'], f'{split}.bin'), meta['dtype'], offsets, block_size + 1)
    x, y = xy[:, :-1].contiguous(), xy[:, 1:].contiguous()
    if device.startswith('cuda'):
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x, y


def lr_at(it, c):
    """Linear warmup, then cosine decay to min_lr at lr_decay_iters (the authors stop at
    max_iters=100k on a 600k schedule, so their runs end well above min_lr)."""
    if not c['decay_lr']:
        return c['learning_rate']
    if it < c['warmup_iters']:
        return c['learning_rate'] * (it + 1) / (c['warmup_iters'] + 1)
    if it > c['lr_decay_iters']:
        return c['min_lr']
    ratio = (it - c['warmup_iters']) / max(1, c['lr_decay_iters'] - c['warmup_iters'])
    return c['min_lr'] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (c['learning_rate'] - c['min_lr'])


@torch.no_grad()
def estimate_loss(model, meta, c, ctx, device, rank, world):
    """Mean loss over the same eval_iters batches every time (a fixed set: eval curves of
    different variants are measured on identical tokens). Ranks split the batches."""
    model.eval()
    out = {}
    for split_id, split in enumerate(('train', 'val')):
        offsets = step_offsets(meta[f'{split}_tokens'], c['block_size'], c['eval_iters'] * c['batch_size'],
                               c['data_seed'], 2 ** 31 + split_id)
        total = torch.zeros(2, dtype=torch.float64, device=device)
        for i in range(rank, c['eval_iters'], world):
            x, y = get_batch(meta, split, offsets[i * c['batch_size']:(i + 1) * c['batch_size']], c['block_size'], device)
            with ctx:
                _, loss = model(x, y)
            total += torch.stack([loss.double(), torch.ones((), dtype=torch.float64, device=device)])
        if world > 1:
            dist.all_reduce(total)
        out[split] = (total[0] / total[1]).item()
    model.train()
    return out


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
    """Whether out_dir holds a run that reached its last evaluation (max_iters)."""
    config_path, log_path = os.path.join(out_dir, 'config.json'), os.path.join(out_dir, 'log.jsonl')
    if not (os.path.exists(config_path) and os.path.exists(log_path)):
        return False
    max_iters = read_json(config_path, 'config.json')['max_iters']
    return any(e.get('iter') == max_iters and 'val_loss' in e for e in read_jsonl(log_path))


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
        raise UserError("wandb_log=True needs wandb: `pip install wandb`, or set --wandb_log=False") from None
    return wandb.init(project=c['wandb_project'], name=c['wandb_run_name'], config=c)


# -----------------------------------------------------------------------------

def train(c):
    ddp, rank, local_rank, world, device = setup_distributed(c)
    master = rank == 0
    try:
        _train(c, ddp, rank, world, device, master)
        if ddp:
            # Free the DDP wrapper (its reducer holds gloo work) while the group is alive, and let
            # rank 0 finish writing: either torn down late aborts the process (SIGABRT) at exit.
            gc.collect()
            dist.barrier()
    finally:
        if ddp:
            dist.destroy_process_group()


def _train(c, ddp, rank, world, device, master):
    if c['gradient_accumulation_steps'] % world:
        raise UserError(f"gradient_accumulation_steps {c['gradient_accumulation_steps']} is not divisible by the "
                        f"world size {world}: the global batch must be the same at every world size")
    for key in ('batch_size', 'block_size', 'max_iters', 'eval_interval', 'eval_iters', 'log_interval'):
        if c[key] < (0 if key == 'max_iters' else 1):
            raise UserError(f"{key} must be positive, got {c[key]}")
    accum = c['gradient_accumulation_steps'] // world
    device_type = 'cuda' if device.startswith('cuda') else 'cpu'
    dtype = pick_precision(c['dtype'], device)
    compile_ = device_type == 'cuda' if c['compile'] is None else c['compile']
    torch.manual_seed(c['seed'] + rank)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    meta = load_data_meta(c)
    if master:
        print_config(c)
        os.makedirs(c['out_dir'], exist_ok=True)
        write_json(os.path.join(c['out_dir'], 'config.json'), c)
    tokens_per_iter = c['gradient_accumulation_steps'] * c['batch_size'] * c['block_size']
    model, ckpt = build_model(c, meta, master)
    model.to(device)
    scaler = torch.amp.GradScaler(device_type, enabled=dtype == 'float16')
    optimizer = model.configure_optimizers(c['weight_decay'], c['learning_rate'], (c['beta1'], c['beta2']), device_type)
    iter_num, best_val_loss = 0, float('inf')
    if ckpt is not None and 'optimizer' not in ckpt and master:
        print("the checkpoint has no optimizer state (a converted model?): fine-tuning with a fresh AdamW")
    if ckpt is not None:
        if 'optimizer' in ckpt:
            optimizer.load_state_dict(ckpt['optimizer'])
        if ckpt.get('scaler'):
            scaler.load_state_dict(ckpt['scaler'])
        iter_num, best_val_loss = ckpt['iter_num'], float(ckpt['best_val_loss'])
        set_rng_state(ckpt.get('rng', []), rank, device)
        ckpt = None  # free memory
    if master:
        print(f"tokens per iteration: {tokens_per_iter:,} ({c['gradient_accumulation_steps']} x {c['batch_size']} "
              f"x {c['block_size']}, {world} process(es)); starting at iter {iter_num}")
    raw_model = model
    if compile_:
        model = torch.compile(model)
    if ddp:
        model = DDP(model, device_ids=[int(device.split(':')[1])] if device_type == 'cuda' else None)
    ctx = autocast(device, dtype)
    log_path = os.path.join(c['out_dir'], 'log.jsonl')
    if master:
        truncate_log(log_path, iter_num)
    log = Logger(log_path, init_wandb(c) if master else None)
    ckpt_path = os.path.join(c['out_dir'], 'ckpt.pt')

    stop = {'signal': None}
    def on_signal(signum, frame):  # cluster preemption: finish the step, save, exit
        stop['signal'] = signum
    old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}

    def check_finite(nonfinite):
        flag = nonfinite.clone().float()
        if ddp:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            raise UserError(f"the loss became non-finite by iter {iter_num}; the last good checkpoint {ckpt_path} "
                            f"is untouched: lower learning_rate, use dtype=bfloat16, or resume from it")

    def save(reason):
        states = rng_state(device, ddp)  # a collective: every rank takes part
        if not master:
            return
        if not params_finite(raw_model):
            raise UserError(f"parameters are non-finite at iter {iter_num}; not saving, {ckpt_path} is untouched")
        save_checkpoint(dict(model=raw_model.state_dict(), optimizer=optimizer.state_dict(),
                             model_args=asdict(raw_model.config), iter_num=iter_num, best_val_loss=best_val_loss,
                             config=c, meta={k: v for k, v in meta.items() if k != 'data_dir'}, rng=states,
                             scaler=scaler.state_dict() if scaler.is_enabled() else None,
                             tokens_seen=iter_num * tokens_per_iter), ckpt_path)
        print(f"saved {ckpt_path} at iter {iter_num} ({reason})")

    nonfinite = torch.zeros((), dtype=torch.bool, device=device)
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    t_last, iters_since_log, start_iter = time.time(), 0, iter_num
    while True:
        if iter_num % c['eval_interval'] == 0 or iter_num >= c['max_iters'] or c['eval_only']:
            t_eval = time.time()
            check_finite(nonfinite)
            losses = estimate_loss(model, meta, c, ctx, device, rank, world)
            if master:
                print(f"iter {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
                log(iter=iter_num, tokens=iter_num * tokens_per_iter, train_loss=losses['train'], val_loss=losses['val'])
            improved = losses['val'] < best_val_loss
            best_val_loss = min(best_val_loss, losses['val'])
            if not math.isfinite(losses['val']):
                raise UserError(f"val loss is non-finite at iter {iter_num}; {ckpt_path} is untouched")
            if not c['eval_only'] and iter_num > start_iter and (improved or c['always_save_checkpoint']):
                save('eval')
            t_last += time.time() - t_eval  # step times exclude evaluation
        if iter_num >= c['max_iters'] or c['eval_only']:
            break

        loss_sum.zero_()
        lr = lr_at(iter_num, c)
        for group in optimizer.param_groups:
            group['lr'] = lr
        offsets = step_offsets(meta['train_tokens'], c['block_size'], c['gradient_accumulation_steps'] * c['batch_size'],
                               c['data_seed'], iter_num)
        for micro in range(accum):
            m = rank * accum + micro  # this micro-batch's index in the global batch
            x, y = get_batch(meta, 'train', offsets[m * c['batch_size']:(m + 1) * c['batch_size']], c['block_size'], device)
            # DDP averages over ranks; dividing by the local accumulation makes the global mean
            sync = model.no_sync() if ddp and micro < accum - 1 else nullcontext()
            with sync:
                with ctx:
                    _, loss = model(x, y)
                scaler.scale(loss / accum).backward()
            loss = loss.detach()
            nonfinite |= ~torch.isfinite(loss)
            loss_sum += loss.float()
        if c['grad_clip'] > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(raw_model.parameters(), c['grad_clip'])
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        iters_since_log += 1

        if iter_num % c['log_interval'] == 0:
            check_finite(nonfinite)
            mean_loss = loss_sum / accum  # this step's global-batch mean: the same after a resume
            if ddp:
                dist.all_reduce(mean_loss)
                mean_loss /= world
            dt = (time.time() - t_last) / iters_since_log
            mfu = raw_model.estimate_mfu(tokens_per_iter // world, dt, device_peak_flops(device), c['block_size'])
            if master:
                mfu_text = f", mfu {mfu * 100:.1f}%" if mfu is not None else ""
                print(f"iter {iter_num}: loss {mean_loss.item():.4f}, lr {lr:.2e}, {dt * 1000:.1f} ms/iter{mfu_text}")
                log(iter=iter_num, tokens=iter_num * tokens_per_iter, lr=lr, loss=mean_loss.item(),
                    dt_ms=dt * 1000, tokens_per_s=tokens_per_iter / dt, mfu=mfu)
            iters_since_log, t_last = 0, time.time()

        stop_now = stop['signal'] is not None
        if ddp:  # every rank must agree to stop at the same step, or the next collective hangs
            flag = torch.tensor(float(stop_now), device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            stop_now = flag.item() > 0
        if stop_now:
            check_finite(nonfinite)
            save('signal')
            if master:
                print(f"stopped by a signal at iter {iter_num}; resume with --init_from=resume")
            break
    for s, h in old_handlers.items():
        signal.signal(s, h)


def main(argv=None):
    c = parse_config(DEFAULTS, sys.argv[1:] if argv is None else argv)
    train(c)


if __name__ == '__main__':
    run_main(main)
