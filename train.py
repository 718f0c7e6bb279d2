"""
Train a kvgpt model, on one device or many:

    python train.py config/cpu/demo.py                      # CPU, the embedded corpus, ~3 minutes
    python train.py config/reduced.py --batch_size=8    # config files, then --key=value overrides
    torchrun --standalone --nproc_per_node=8 train.py config/reduced.py

The batches of step k depend on (data_seed, k) alone: every variant, restart and world size
sees the same tokens at the same step, so runs compare side by side. Checkpoints are written
atomically, never from a non-finite state, and a resume continues bit for bit. Ctrl-C or
SIGTERM saves and stops (exit code 128 + the signal's number); --init_from=auto continues.

Under torchrun every rank runs all of this. Some calls are collectives, which every rank must
make, in the same order; they are named so: all_ranks_evaluate, all_ranks_save,
all_ranks_check_finite, all_ranks_log_step, all_ranks_stop, and within them
run.state.all_ranks_state_dict (it gathers every rank's RNG), run.signals.all_ranks_agree_to_stop
and run.signals.all_ranks_share (an evaluation's batches). The others are the step's backward
(DDP averages the gradients), and the run's start and end. Rank 0 alone writes, inside them, so
nanoGPT's `if master_process: save()` is not wanted here: rank 0 would wait for the others in
vain, and fail after the process group's timeout (KVGPT_COLLECTIVE_TIMEOUT seconds; torch's
default is 30 minutes for gloo) with one line naming the call.
"""
from kvgpt.errors import quiet_imports  # first: Ctrl-C in the imports below is one line
quiet_imports(__name__)

import glob
import importlib
import math
import os
import shlex
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields
from typing import get_args

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from evals import hellaswag
from kvgpt import checkpoint, distributed
from kvgpt.checkpoint import (best_checkpoint, drop_best, keep_best, load_optimizer_state,
                              model_from_checkpoint, save_checkpoint)
from kvgpt.config import (BELOW_ONE, FRACTION, NOT_NEGATIVE, POSITIVE, STEPS, Key, Kind,
                          defaults, keys, parse_config, print_overrides)
from kvgpt.data import Dataset, check_fits, check_same_data, open_or_prepare
from kvgpt.distributed import all_ranks
from kvgpt.device import DTYPES, device_peak_flops, setup_device
from kvgpt.errors import (SameOnEveryRank, UserError, fs_error, model_errors, quiet_hub,
                          run_main)
from kvgpt.optimizer import (MUON_SCALES, OPTIMIZERS, STATE_SETTINGS, build_optimizer,
                             muon_lr_scale)
from kvgpt.signals import Interrupted, Signals
from kvgpt.tracking import Record, StepTimer, format_eta, open_trackers, wandb_run_id
from model import GPT, QUERY_MODES, GPTConfig, upgrade_query

# -----------------------------------------------------------------------------
# settings: GPT-2 small on OpenWebText, the authors' baseline; config/*.py and --key=value.
# Each key: (its default, its --help line[, its type where the default's type is not it]).
KEYS = {**keys(
    'run',
    out_dir=('out', "checkpoints, log.jsonl and config.json of the run"),
    init_from=('scratch', "scratch, resume, auto (resume if a checkpoint), gpt2..gpt2-xl, a GPT-2 "
               "folder, or a run's ckpt_<step>.pt file: a branch that continues it here"),
    finetune=(False, "True: only init_from's weights (a checkpoint file): step 0, a fresh "
              "optimizer, this run's schedule and dropout, any data in its tokenizer (as gpt2* "
              "always does)"),
    overwrite=(False, "True: a fresh start (scratch, GPT-2, a branch) may replace out_dir's run"),
    eval_interval=(1000, "steps between evaluations (and checkpoints)",
                   Kind(int, within=POSITIVE)),
    eval_iters=(200, "batches per split in each evaluation", Kind(int, within=POSITIVE)),
    eval_only=(False, "evaluate the checkpoint (and the full val loss) into eval.jsonl; stop"),
    log_interval=(10, "steps between log lines (loss, gradient norm, step time)",
                  Kind(int, within=POSITIVE)),
    probe=(None, "a module whose probe(data, c, device) adds to each evaluation", Kind(str)),
    hellaswag=(None, "a HellaSwag .jsonl, or 'download': scored at the end (evals/)", Kind(str)),
    hellaswag_interval=(0, "also score it at evaluations every this many steps; 0: the end only"),
    hellaswag_items=(None, "score its first this many items; None: all", Kind(int, optional=True)),
    always_save_checkpoint=(True, "False: save only when val loss improves (nanoGPT's option); "
                            "a signal still saves the resume point, keeping the best as "
                            "ckpt_best.pt"),
    keep_checkpoints=((50000, 100000, 105000), "steps whose ckpt_<step>.pt is kept (authors')",
                      Kind(tuple, within=STEPS)),
    wandb_log=(False, "also log to Weights & Biases (pip install wandb); a resume continues it"),
    wandb_project=('kvgpt', "the W&B project"),
    wandb_run_name=(None, "the W&B run name; None: the out_dir's name", Kind(str)),
    tensorboard_log=(False, "also write TensorBoard scalars to out_dir/tensorboard"),
), **keys(
    'data',
    dataset=('openwebtext', "data_root/<dataset>/ by prepare.py (pydocs, pysource: made here)"),
    data_root=('data', "where prepared datasets live"),
    data_seed=(1337, "the batches of step k depend on (data_seed, k) only",
               Kind(int, within=NOT_NEGATIVE)),  # numpy's generator takes no negative seed
    gradient_accumulation_steps=(40, "in total, over all processes", Kind(int, within=POSITIVE)),
    batch_size=(12, "micro-batch per process", Kind(int, within=POSITIVE)),
    block_size=(1024, "tokens per window; from scratch the model's context (resumed: its own)",
                Kind(int, within=POSITIVE)),
), **keys(
    'model',  # every GPTConfig field (below); these three train.py resolves itself
    vocab_size=(None, "None: the dataset's, rounded up to 64s (gpt2: 50304)", Kind(int)),
    query=(None, "None: the model's default, 'linear'", Kind(str, QUERY_MODES)),
    query_identity=(False, "the old spelling of query='identity': read, then folded into query"),
), **keys(
    'optimiser',  # built by kvgpt/optimizer.py's build_optimizer
    optimizer=('adamw', "adamw; or muon: Muon on the blocks' matrices (W_Q, W_K, W_V, W_O, the "
               "MLP's: each on its own), AdamW on embeddings, head, norms, biases",
               Kind(str, OPTIMIZERS)),
    learning_rate=(6e-4, "the peak learning rate (AdamW's; Muon's too unless muon_lr)",
                   Kind(float, within=NOT_NEGATIVE)),
    weight_decay=(0.1, "decoupled (each step: x (1 - lr x this)), on matrices and embeddings "
                  "(none on norms and biases); under Muon too",
                  Kind(float, within=NOT_NEGATIVE)),
    beta1=(0.9, "AdamW's first-moment decay", Kind(float, within=BELOW_ONE)),
    beta2=(0.95, "AdamW's second-moment decay", Kind(float, within=BELOW_ONE)),
    grad_clip=(1.0, "clip the global gradient norm to this; 0 disables"),
    muon_lr=(None, "Muon's peak LR, on learning_rate's schedule; None: learning_rate (one LR "
             "for both, as muon_scale=match_rms_adamw means)", Kind(float, optional=True)),
    muon_scale=('match_rms_adamw', "Muon's LR per matrix: match_rms_adamw (x 0.2 sqrt(max "
                "side): AdamW's LR and decay carry over) or original (x sqrt(max(1, rows/cols)):"
                " Jordan's, muon_lr ~0.02)", Kind(str, MUON_SCALES)),
    muon_momentum=(0.95, "Muon's momentum (Nesterov)", Kind(float, within=BELOW_ONE)),
), **keys(
    'schedule',
    max_iters=(105002, "steps to train: the run stops when iter_num reaches it (the authors')",
               Kind(int, within=POSITIVE)),
    decay_lr=(True, "False: the peak learning rate throughout"),
    lr_schedule=('cosine', "cosine, or wsd (warmup-stable-decay)", Kind(str, ('cosine', 'wsd'))),
    warmup_iters=(2000, "linear warmup steps", Kind(int, within=NOT_NEGATIVE)),
    lr_decay_iters=(600000, "the cosine reaches min_lr here (past max_iters: it ends before); "
                    "None: at max_iters, whatever sets it", Kind(int, optional=True)),
    min_lr=(6e-5, "the floor: the cosine's, or where the wsd cooldown ends",
            Kind(float, within=NOT_NEGATIVE)),
    cooldown_frac=(0.2, "wsd: the last fraction of max_iters that cools down from the peak",
                   Kind(float, within=FRACTION)),
    cooldown_shape=('linear', "wsd: linear, or 1-sqrt", Kind(str, ('linear', '1-sqrt'))),
), **keys(
    'system',
    device=(None, "None: cuda when available, else cpu", Kind('device')),
    dtype=(None, "None: bfloat16 on cuda where native, else float16; float32 on cpu",
           Kind(str, DTYPES)),
    compile=(None, "None: on for cuda, off elsewhere", Kind(bool)),
    backend=(None, "None: nccl on cuda, gloo on cpu", Kind(str, ('nccl', 'gloo'))),
    seed=(1337, "model init and dropout"),
)}
MODEL_KEYS = [f.name for f in fields(GPTConfig)]


def model_key(field):
    """A GPTConfig field as a key: its default (None where GPTConfig derives it), the help line
    and choices model.py gives it, and the type its annotation says (Optional[int]: an int)."""
    kind = next(t for t in (*get_args(field.type), field.type) if t is not type(None))
    return Key(field.default, field.metadata['help'], Kind(kind, field.metadata['choices']),
               'model')


KEYS.update({f.name: model_key(f) for f in fields(GPTConfig) if f.name not in KEYS})
DEFAULTS = defaults(KEYS)


def settings(argv=None):
    """The run's config from defaults, config files and --key=value; `query` the one query key."""
    c = parse_config(KEYS, argv, usage=__doc__)
    if c.pop('query_identity'):
        with model_errors('config'):
            c['query'] = upgrade_query({'query': c['query'], 'query_identity': True})['query']
    if c['muon_lr'] is not None and not (c['muon_lr'] > 0 and c['learning_rate'] > 0):
        raise UserError(f"muon_lr and learning_rate must be positive (Muon's LR follows "
                        f"learning_rate's schedule), got {c['muon_lr']} and {c['learning_rate']}")
    if c['decay_lr'] and c['min_lr'] > c['learning_rate']:
        raise UserError(f"min_lr {c['min_lr']:g} is above learning_rate {c['learning_rate']:g}: "
                        "the schedule would climb to it; lower min_lr (the schedule's floor)")
    return c


# -----------------------------------------------------------------------------
# data: the windows of step k are drawn from (data_seed, k) alone

EVAL_KEY = 2 ** 31  # + split (0 train, 1 val): the evaluation windows' key, above every step's


def tokens_per_iter(c):
    return c['gradient_accumulation_steps'] * c['batch_size'] * c['block_size']


def step_starts(data, c, step):  # every variant, restart and world size: the same windows
    return data.starts('train', tokens_per_iter(c) // c['block_size'], c['data_seed'], step)


def get_batch(data, c, starts, index, device):
    """Micro-batch `index` of the step's windows, counted over every process: rank r takes
    r * accum up to (r + 1) * accum - 1, so the step's tokens do not depend on the world size."""
    n = c['batch_size']
    return data.batch('train', starts[index * n:(index + 1) * n], device)


# -----------------------------------------------------------------------------
# the model: from scratch, a checkpoint, or GPT-2

def model_args_from(c, meta):
    args = upgrade_query({k: c[k] for k in MODEL_KEYS})  # query None: the model's default, linear
    if args['vocab_size'] is None:
        args['vocab_size'] = -(-meta['vocab_size'] // 64) * 64  # round up: faster matmuls
    return args


def checkpoint_settings(ckpt, optimizer):
    """The checkpoint's settings that win over a resume's or a branch's: its model's, all but
    block_size (also train.py's window length: a resume may train on shorter windows), and those
    its optimizer state holds (torch's load_state_dict restores them with it: the betas, the weight
    decay, Muon's momentum). The LR is the run's own schedule's."""
    won = {k: v for k, v in ckpt['model_args'].items() if k != 'block_size'}
    trained = ckpt['config']
    if 'optimizer' in ckpt:
        won.update({k: trained[k] for k in STATE_SETTINGS[optimizer] if k in trained})
    return won


def pretrained_overrides(c, model):
    """The model settings a run named (away from their defaults) that pretrained weights (GPT-2's,
    or a fine-tune's checkpoint) override: the architecture is theirs, whatever the config says."""
    ours = asdict(model.config)
    return [k for k in MODEL_KEYS if k not in ('block_size', 'dropout', 'vocab_size')
            and c[k] != DEFAULTS[k] and c[k] is not None and c[k] != ours[k]]


def checkpoint_path(c):
    """The checkpoint a run continues: out_dir's on a resume, or the file it branches from."""
    return os.path.join(c['out_dir'], 'ckpt.pt') if c['init_from'] == 'resume' else c['init_from']


def build_model(c, meta, master):
    """(model, checkpoint or None): the start init_from names (init_mode), then the data's fit.
    c takes the settings the start imposes (a checkpoint's, GPT-2's): the record says what
    trains."""
    start = {'scratch': scratch_model, 'checkpoint': checkpoint_model,
             'finetune': finetuned_model, 'pretrained': pretrained_model}[init_mode(c)]
    model, ckpt = start(c, meta, master)
    check_fits(meta, model.config.vocab_size, model.config.block_size, c['block_size'])
    return model, ckpt


def init_mode(c):
    """How the run starts: 'scratch' (so too init_from=auto without a checkpoint), 'checkpoint'
    (resume, or a branch off a checkpoint file), 'finetune' (a checkpoint file's weights alone)
    or 'pretrained' (gpt2* or a GPT-2 folder). A finetune with no weights to take is refused."""
    if c['init_from'] == 'scratch':
        if c['finetune']:
            raise UserError("finetune=True takes its weights from init_from: name a checkpoint "
                            "file (such as out/ckpt.pt), gpt2..gpt2-xl or a GPT-2 folder")
        return 'scratch'
    if c['finetune'] and os.path.isfile(os.path.join(c['init_from'], 'ckpt.pt')):
        raise UserError(f"{c['init_from']} is a run folder: fine-tune its checkpoint with "
                        f"--init_from={os.path.join(c['init_from'], 'ckpt.pt')}")
    if c['finetune'] and os.path.isfile(c['init_from']):
        return 'finetune'
    if c['init_from'] == 'resume' or os.path.isfile(c['init_from']):
        return 'checkpoint'
    return 'pretrained'


def scratch_model(c, meta, master):
    with model_errors('bad model config'):
        return GPT(GPTConfig(**model_args_from(c, meta)), verbose=master), None


def checkpoint_model(c, meta, master):
    """A resume's or a branch's model, from its checkpoint; the loop state and the optimizer's
    come from the checkpoint too (restore)."""
    path = checkpoint_path(c)
    model, ckpt = model_from_checkpoint(path, verbose=master, resume=True)
    check_continues(c, ckpt, meta, path, master)
    return model, ckpt


def check_continues(c, ckpt, meta, path, master):
    """What a resume or a branch must fit: the data the checkpoint was trained on, a step below
    max_iters (a branch), and the schedule it was trained with (a note where it differs); the
    checkpoint's model and optimizer settings win over the run's, and a note names those that
    differ."""
    check_same_data(ckpt['meta'], meta, path, f"{c['data_root']}/{c['dataset']}")
    branch = c['init_from'] != 'resume' and not c['eval_only']
    if branch and ckpt['iter_num'] >= c['max_iters']:
        raise UserError(f"{path} is at iter {ckpt['iter_num']}, which a branch to "
                        f"--max_iters={c['max_iters']} would not train past: choose an "
                        "earlier checkpoint or a larger --max_iters")
    if master and not c['eval_only']:
        check_schedule(ckpt['config'], c, ckpt['iter_num'], path)
    won = {k: v for k, v in checkpoint_settings(ckpt, c['optimizer']).items()
           if c.get(k) is not None}
    changed = [k for k, v in won.items() if c[k] != v]
    if changed and master:
        print("resuming: the checkpoint's settings win over "
              + ', '.join(f'{k}={c[k]!r}' for k in changed))
    c.update(won)  # the record says what trains


def pretrained_model(c, meta, master):
    quiet_hub('transformers')  # its import resets the hub's logger
    with model_errors():
        model = GPT.from_pretrained(c['init_from'], dropout=c['dropout'])
    ignored = pretrained_overrides(c, model)
    if ignored and master:
        print(f"{c['init_from']}: GPT-2's weights set the model, not "
              + ', '.join(f'{k}={c[k]!r}' for k in ignored))
    c.update({k: getattr(model.config, k) for k in ignored})  # the record says what trains
    return model, None


def finetuned_model(c, meta, master):
    """A fine-tune's model: init_from's weights with this run's dropout. The step, optimizer and
    RNG start afresh, so the data may differ from the checkpoint's, but not its tokenizer: the ids
    must mean the tokens the model learned."""
    path = c['init_from']
    model, ckpt = model_from_checkpoint(path, verbose=master, dropout=c['dropout'])
    trained_on = ckpt['meta'].get('tokenizer')
    if trained_on is not None and trained_on != meta['tokenizer']:
        raise UserError(f"{path} was trained on {trained_on} tokens, and {c['data_root']}/"
                        f"{c['dataset']} holds {meta['tokenizer']} ones: prepare the data with "
                        f"--tokenizer={trained_on}")
    ignored = pretrained_overrides(c, model)
    if master:
        print(f"fine-tuning {path} (trained to iter {ckpt.get('iter_num', '?')}) from iter 0 with "
              f"a fresh {c['optimizer']}" + ("; its weights set the model, not "
                                 + ', '.join(f'{k}={c[k]!r}' for k in ignored) if ignored else ""))
    c.update({k: getattr(model.config, k) for k in ignored})
    return model, None


# -----------------------------------------------------------------------------
# the learning rate: linear warmup, then a cosine to min_lr, or flat and a cooldown (wsd)

def get_lr(it, c):
    """The authors stop at step ~105k of a 600k cosine, so their runs end at 93.6% of the peak.
    wsd holds the peak until cooldown_start(c), then cools to min_lr at max_iters: every step
    before the cooldown is the same whatever max_iters is, so a run to max_iters can branch off a
    longer run's checkpoint at cooldown_start (init_from=<its ckpt_<step>.pt>)."""
    if not c['decay_lr']:
        return c['learning_rate']
    if it < c['warmup_iters']:
        return c['learning_rate'] * (it + 1) / (c['warmup_iters'] + 1)
    if c.get('lr_schedule') == 'wsd':  # .get: an older run's settings have no such key
        start = cooldown_start(c)
        if it < start:
            return c['learning_rate']
        progress = min(1.0, (it - start) / max(1, c['max_iters'] - start))
        cool = progress if c['cooldown_shape'] == 'linear' else math.sqrt(progress)
        return c['learning_rate'] - cool * (c['learning_rate'] - c['min_lr'])
    horizon = c['max_iters'] if c['lr_decay_iters'] is None else c['lr_decay_iters']
    if it > horizon:
        return c['min_lr']
    ratio = (it - c['warmup_iters']) / max(1, horizon - c['warmup_iters'])
    cosine = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return c['min_lr'] + cosine * (c['learning_rate'] - c['min_lr'])


def cooldown_start(c):
    """The first step of wsd's cooldown: the last cooldown_frac of max_iters."""
    return c['max_iters'] - round(c['cooldown_frac'] * c['max_iters'])


def get_muon_lr(it, c):
    """Muon's LR: learning_rate's schedule, peaking at muon_lr where one is set."""
    return get_lr(it, c) * muon_lr_scale(c)


def check_schedule(source, c, step, path):
    """A branch or a resume continues a run as its own settings would have trained it from scratch
    only if both schedules agree on every step before the checkpoint: say so when they do not (a
    resume with a larger max_iters stretches a cosine whose horizon follows it)."""
    if 'learning_rate' not in source:  # nanoGPT's and converted checkpoints may record none
        return
    source = dict(DEFAULTS, **source)
    schedules = {'learning rate': get_lr}
    if c['optimizer'] == 'muon':  # its own peak, on the same schedule
        schedules['Muon learning rate'] = get_muon_lr
    for name, lr in schedules.items():
        differ = next((it for it in range(step) if lr(it, source) != lr(it, c)), None)
        if differ is not None:
            was, now = lr(differ, source), lr(differ, c)
            digits = next(d for d in range(3, 18) if f'{was:.{d}g}' != f'{now:.{d}g}')
            print(f"note: {path} was trained with another {name} at step {differ} "
                  f"({was:.{digits}g} against {now:.{digits}g} here): this "
                  f"{'resumed run' if c['init_from'] == 'resume' else 'branch'} is not the run "
                  "its settings would make from scratch")
            return


# -----------------------------------------------------------------------------
# the loop

@dataclass
class LoopState:
    """What a resume restores besides the weights and the optimizer's state: all_ranks_save()
    writes each field under its own name in the checkpoint and restore() reads each back, so state
    added here is saved and resumed with no other change (list it in checkpoint.RESUME_ENTRIES to
    have a damaged value named on load). A field with a state_dict() (the scaler, the RNG) is saved
    as that (None when empty) and loaded back with its load_state_dict()."""
    scaler: torch.amp.GradScaler  # float16's loss scale
    rng: distributed.RankRNG  # every rank's generators (dropout)
    iter_num: int = 0
    best_val_loss: float = math.inf
    tokens_seen: int = 0  # counted: a resume may change a step's tokens
    ckpt_is_best: bool = False  # ckpt.pt holds the best evaluation's state (checkpoint.keep_best)

    @all_ranks
    def all_ranks_state_dict(self):
        """The checkpoint's entries, on every rank: the RNG's gathers every rank's."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: (v.state_dict() or None) if hasattr(v, 'state_dict') else v
                for k, v in values.items()}

    def load_state_dict(self, ckpt):
        for f in fields(self):
            value, saved = getattr(self, f.name), ckpt.get(f.name)
            if hasattr(value, 'load_state_dict'):
                if saved:  # None: not saved (nanoGPT's have no rng), or empty (no scaler)
                    value.load_state_dict(saved)
            elif saved is not None:  # numbers as their type: nanoGPT's best_val_loss is a tensor
                setattr(self, f.name, f.type(saved) if f.type in (int, float) else saved)


@dataclass
class Run:  # what the loop reads and changes, made by setup() below
    settings: dict  # every key of DEFAULTS, as config files and --key=value made them
    process: distributed.Dist  # this process's place in the world: rank, world size, device
    device_setup: object  # kvgpt.device.DeviceSetup: the device, its dtype, autocast, compile
    data: Dataset
    model: GPT  # the raw model: checkpoints, evaluation, probes
    step_model: torch.nn.Module  # the same, compiled and/or wrapped for DDP: the training steps
    optimizer: torch.optim.Optimizer
    signals: Signals
    state: LoopState  # the step, the best val loss, the scaler, the RNG: what a resume restores
    record: Record = None  # rank 0's config.json and log.jsonl
    probe: object = None  # the evaluation hook of the probe setting
    hellaswag: object = None  # scores the hellaswag setting's items (evals/hellaswag.py)
    finished: bool = False  # the loop ended without an error (at max_iters, or by a signal)


def train_loop(run):
    """nanoGPT's loop: evaluate and save, the micro-steps, clip and step, log, stop. Every rank
    runs all of it: the all_ranks_* calls are collectives (the docstring at the top)."""
    c, process, state = run.settings, run.process, run.state
    start_iter = state.iter_num
    accum = process.micro_steps(c['gradient_accumulation_steps'])  # this process's share
    # the step's loss and gradient norm stay on the device, read only at log steps
    loss_sum = torch.zeros((), device=process.device)
    nonfinite = torch.zeros((), dtype=torch.bool, device=process.device)
    grad_norm = torch.zeros((), device=process.device)
    timer = StepTimer(start_iter)
    while True:
        last = state.iter_num >= c['max_iters'] or c['eval_only']
        if state.iter_num % c['eval_interval'] == 0 or last:
            all_ranks_check_finite(run, nonfinite)
            t0 = time.time()
            try:
                losses = all_ranks_evaluate(run)
            except Interrupted:  # the state is the last step's, whole: save, stop
                return all_ranks_stop(run, nonfinite)
            improved = losses['val'] < state.best_val_loss
            state.best_val_loss = min(state.best_val_loss, losses['val'])
            # a checkpoint only of steps this process trained: a resume's first evaluation
            # saves nothing, and eval_only never does
            trained = state.iter_num > start_iter and not c['eval_only']
            if trained and (improved or c['always_save_checkpoint']):
                state.ckpt_is_best = improved
                all_ranks_save(run, 'eval')
            timer.pause(time.time() - t0)  # step times leave out evaluations and their saves
        if last:
            return
        lr = get_lr(state.iter_num, c)
        for group in run.optimizer.param_groups:
            group['lr'] = lr
        # forward and backward over this process's share of the step's global batch
        loss_sum.zero_()
        starts = step_starts(run.data, c, state.iter_num)  # once a step, each micro-batch a slice
        for micro in range(accum):
            x, y = get_batch(run.data, c, starts, process.rank * accum + micro, process.device)
            # DDP averages over ranks; dividing by the local accumulation makes the global mean
            with run.step_model.no_sync() if process.ddp and micro < accum - 1 else nullcontext():
                with run.device_setup.ctx:
                    _, loss = run.step_model(x, y)
                state.scaler.scale(loss / accum).backward()
            loss = loss.detach()
            nonfinite |= ~torch.isfinite(loss)
            loss_sum += loss.float()
        log_now = (state.iter_num + 1) % c['log_interval'] == 0
        if c['grad_clip'] > 0:
            state.scaler.unscale_(run.optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), c['grad_clip'])
        elif log_now:  # the gradient norm is logged even without clipping
            state.scaler.unscale_(run.optimizer)
            grad_norm = torch.nn.utils.get_total_norm(
                [p.grad for p in run.model.parameters() if p.grad is not None])
        state.scaler.step(run.optimizer)
        state.scaler.update()
        run.optimizer.zero_grad(set_to_none=True)
        state.iter_num += 1
        state.tokens_seen += tokens_per_iter(c)
        timer.tick(state.iter_num)
        if state.iter_num in c['keep_checkpoints']:
            all_ranks_check_finite(run, nonfinite)
            t0 = time.time()
            all_ranks_save(run, 'kept', f'ckpt_{state.iter_num}.pt')
            timer.pause(time.time() - t0)
        if log_now:
            all_ranks_check_finite(run, nonfinite)
            step_time = timer.step_time(state.iter_num)
            all_ranks_log_step(run, loss_sum / accum, grad_norm, lr, step_time)
        if run.signals.all_ranks_agree_to_stop(state.iter_num, c['log_interval']):
            return all_ranks_stop(run, nonfinite)


@all_ranks
def all_ranks_check_finite(run, nonfinite):
    """The ranks agree that no loss since the last check was non-finite, or all stop with it."""
    if distributed.any_rank(run.process, nonfinite):
        path = os.path.join(run.settings['out_dir'], 'ckpt.pt')
        advice = "lower learning_rate or use dtype=bfloat16"
        kept = (f"the last good checkpoint, {path}, is untouched: {advice}, or resume from it"
                if os.path.exists(path) else f"no checkpoint was saved before it: {advice}")
        raise UserError(f"the loss became non-finite by iter {run.state.iter_num}; {kept}")


@all_ranks
def all_ranks_stop(run, nonfinite):
    all_ranks_check_finite(run, nonfinite)
    c, master = run.settings, run.process.master
    if not c['eval_only']:  # eval_only trains nothing, and never saves
        # the resume point replaces ckpt.pt: with always_save_checkpoint=False that may be the
        # best evaluation's state, which is kept first, or nothing is saved
        problem = (keep_best(c['out_dir'], run.state) if master and not c['always_save_checkpoint']
                   else None)
        if distributed.any_rank(run.process, problem is not None):
            if master:
                print(f"{problem}: not saving, so that ckpt.pt stays the best evaluation's; "
                      "a resume repeats the steps since", flush=True)
        else:
            run.state.ckpt_is_best = False
            all_ranks_save(run, 'signal')
    if master:
        print(f"stopped by a signal at iter {run.state.iter_num} ({run.signals.describe()}); "
              "continue with --init_from=resume (or auto)", flush=True)


@all_ranks
def all_ranks_log_step(run, step_loss, grad_norm, lr, dt):
    """The step's loss averaged over the ranks (an all-reduce), logged by rank 0."""
    c, tokens, iter_num = run.settings, tokens_per_iter(run.settings), run.state.iter_num
    if run.process.ddp:  # the mean over the global batch, the same number at any world size
        distributed.all_reduce(step_loss)
        step_loss /= run.process.world
    loss, grad_norm = step_loss.item(), float(grad_norm)
    peak = device_peak_flops(run.process.device)
    mfu = dt and run.model.estimate_mfu(tokens // run.process.world, dt, peak, c['block_size'])
    eta = dt and dt * (c['max_iters'] - iter_num)
    if not run.process.master:
        return
    timing = f", {dt * 1000:.1f} ms/iter, eta {format_eta(eta)}" if dt else ""
    print(f"iter {iter_num}: loss {loss:.4f}, grad norm {grad_norm:.3g}, lr {lr:.2e}{timing}"
          + (f", mfu {mfu * 100:.1f}%" if mfu else ""))
    run.record.log(iter=iter_num, tokens=run.state.tokens_seen, lr=lr, loss=loss,
                   grad_norm=grad_norm, dt_ms=dt and dt * 1000, tokens_per_s=dt and tokens / dt,
                   mfu=mfu, eta_s=eta)


# -----------------------------------------------------------------------------
# evaluation

@all_ranks
def all_ranks_evaluate(run):
    """The losses on both splits (and at the end the full val loss, the number verdicts use),
    the probes and HellaSwag, logged; returns {'train': loss, 'val': loss}. The ranks share the
    batches and the HellaSwag items, and sum their losses and counts."""
    c, t0, n, losses = run.settings, time.time(), run.settings['batch_size'], {}
    iter_num = run.state.iter_num
    for k, split in enumerate(('train', 'val')):  # windows drawn once: the same at every step
        starts = run.data.starts(split, c['eval_iters'] * n, c['data_seed'], EVAL_KEY + k)
        losses[split] = mean_loss(run, run.step_model, split, [
            (starts[i * n:(i + 1) * n], None) for i in range(c['eval_iters'])])
    entry = dict(iter=iter_num, tokens=run.state.tokens_seen,
                 train_loss=losses['train'], val_loss=losses['val'])
    # every val token once, in order, at the end; on the plain model: the tiling's shorter last
    # window would make a compiled one compile again
    if iter_num >= c['max_iters'] or c['eval_only']:
        entry['val_loss_full'] = mean_loss(run, run.model, 'val', run.data.tiling('val', n), True)
    interval = c['hellaswag_interval']
    if run.hellaswag and ('val_loss_full' in entry or interval and iter_num % interval == 0):
        entry.update(run.hellaswag(run.model, run.signals.all_ranks_share))  # the items shared
    if run.probe is not None:
        entry.update(run.probe(run.model))
    entry['eval_s'] = time.time() - t0
    if run.process.master:
        full = entry.get('val_loss_full')
        print(f"iter {iter_num}: train loss {losses['train']:.4f}, "
              f"val loss {losses['val']:.4f}"
              + (f", full val loss {full:.4f}" if full is not None else '')
              + ''.join(f", {k} {entry[k]:.4f}" for k in ('hellaswag_acc', 'hellaswag_acc_norm')
                        if k in entry))
        run.record.log(**entry)
    all_ranks_check_finite(run, not math.isfinite(losses['val']))
    return losses


@torch.no_grad()
def mean_loss(run, model, split, batches, per_token=False):
    """The mean loss over batches, (window starts, length) each: of the batches' losses, or with
    per_token of every target. The ranks split the batches; a signal stops it within one."""
    total = torch.zeros(2, dtype=torch.float64, device=run.process.device)
    model.eval()
    shared = run.signals.all_ranks_share(range(len(batches)))  # an all-reduce before each round
    for starts, length in (batches[i] for i in shared):
        x, y = run.data.batch(split, starts, run.process.device, length)
        with run.device_setup.ctx:
            _, loss = model(x, y)
        weight = torch.tensor(float(y.numel()) if per_token else 1.0, device=total.device)
        total += torch.stack([loss.double() * weight, weight.double()])
    model.train()
    if run.process.ddp:
        distributed.all_reduce(total)
    return (total[0] / total[1]).item()


def load_probe(c, data, dev):
    """The probe setting's hook, run at each evaluation on the model in eval mode, under the
    run's autocast: its dict joins the log line."""
    try:
        probe = importlib.import_module(c['probe']).probe(data, c, dev.device)
    except ImportError as e:
        raise UserError(f"probe={c['probe']!r} cannot be imported ({e}): run from the repository "
                        "root, or set --probe=None") from None

    def hook(model):
        model.eval()
        with dev.ctx:
            values = probe(model)
        model.train()
        return values
    return hook


# -----------------------------------------------------------------------------
# checkpoints: save and restore

@all_ranks
def all_ranks_save(run, reason, name='ckpt.pt'):
    """Write a checkpoint atomically from rank 0, never from non-finite weights. Every rank takes
    part: the loop state's RNG gathers every rank's, and the ranks agree on failure, so a save that
    fails on rank 0 ends every rank with its message, not a hang. Once ckpt.pt is written, the
    run's record may describe it."""
    loop_state, iter_num = run.state.all_ranks_state_dict(), run.state.iter_num
    path, master = os.path.join(run.settings['out_dir'], name), run.process.master
    kept = (f"the previous {path} is untouched" if os.path.exists(path) else
            f"{path} is not written")
    error = run.data.changed()  # every rank's files: a model of two datasets is never saved
    if error is None and master and not all(bool(torch.isfinite(p).all())
                                            for p in run.model.parameters()):
        error = f"parameters are non-finite at iter {iter_num}; not saving: {kept}"
    elif error is None and master:
        # the record is written before the new ckpt.pt replaces the old one: if it fails, both stay
        commit_record = run.record.commit if name == 'ckpt.pt' else None
        try:
            save_checkpoint(dict(
                model=run.model.state_dict(), optimizer=run.optimizer.state_dict(),
                model_args=asdict(run.model.config), config=run.settings, meta=run.data.meta,
                wandb_run_id=wandb_run_id(run.record),  # a resume continues the same W&B run
                **loop_state), path, before_replace=commit_record)
            run.record.stale.discard(os.path.abspath(path))  # this run's own now
        except OSError as e:
            error = f"{fs_error(e, path)}; {kept}"
        except UserError as e:  # the record: the checkpoint and the record are as they were
            error = f"{e}; {path} and the run's record are as they were"
    if distributed.any_rank(run.process, error is not None):
        raise UserError(error or f"rank 0 could not save {path} at iter {iter_num} "
                                 "(see its error)")
    if master:
        print(f"saved {path} at iter {iter_num} ({reason})")
        if name == 'ckpt.pt' and run.state.ckpt_is_best:
            drop_best(run.settings['out_dir'])


def restore(run, ckpt):
    """The optimizer's state and the loop's (the model is built from the checkpoint before)."""
    if 'optimizer' in ckpt:
        load_optimizer_state(run.optimizer, run.model, ckpt, checkpoint_path(run.settings),
                             run.settings['optimizer'])
    elif run.process.master:
        print("the checkpoint has no optimizer state (a converted model?): fine-tuning with a "
              f"fresh {run.settings['optimizer']}")
    run.state.load_state_dict(ckpt)
    if ckpt.get('tokens_seen') is None:  # nanoGPT's checkpoints: a constant step size
        run.state.tokens_seen = run.state.iter_num * tokens_per_iter(run.settings)


# -----------------------------------------------------------------------------
# the script

def setup(c, process, signals):
    """The run: data, model (from scratch, a checkpoint or GPT-2), optimizer, record."""
    # a world size that does not divide the accumulation is refused here, before data or model
    process.micro_steps(c['gradient_accumulation_steps'])
    dev = setup_device(process.device, c['dtype'], c['compile'])
    torch.manual_seed(c['seed'] + process.rank)
    data = open_or_prepare(c['data_root'], c['dataset'], c['block_size'], process.master,
                           dist.barrier if process.ddp else None)
    if process.master:
        print_overrides(c, DEFAULTS)
        if c['decay_lr'] and c['warmup_iters'] >= c['max_iters']:  # a short trial run, say
            print(f"note: warmup_iters {c['warmup_iters']} is not below max_iters "
                  f"{c['max_iters']}: this run ends in its warmup, at a learning rate of "
                  f"{get_lr(c['max_iters'] - 1, c):.3g}, not its peak {c['learning_rate']:g}")
    model, ckpt = build_model(c, data.meta, process.master)
    config = dict(c, model_args=asdict(model.config), params=model.get_num_params())
    model.to(dev.device)
    state = LoopState(torch.amp.GradScaler(dev.type, enabled=dev.dtype == 'float16'),
                      distributed.RankRNG(process))
    optimizer = build_optimizer(model, c, dev.type)
    step_model = torch.compile(model) if dev.compile else model
    if process.ddp:
        ids = [torch.device(dev.device).index] if dev.type == 'cuda' else None
        step_model = DDP(step_model, device_ids=ids)
    run = Run(c, process, dev, data, model, step_model, optimizer, signals, state)
    run.hellaswag = c['hellaswag'] and hellaswag.scorer(c, data.meta['tokenizer'], dev,
                                                        process.ddp)
    if ckpt is not None:
        restore(run, ckpt)
    if process.master:  # eval_only writes no config.json or log.jsonl: the training run's
        run.record = Record(c['out_dir'], None if c['eval_only'] else config, state.iter_num,
                            open_trackers(c, state.iter_num, ckpt and ckpt.get('wandb_run_id')),
                            stale=replaced_files(c))
        run.probe = c['probe'] and load_probe(c, data, dev)
        print(f"tokens per iteration: {tokens_per_iter(c):,} ({c['gradient_accumulation_steps']}"
              f" x {c['batch_size']} x {c['block_size']}, {process.world} process(es)); starting "
              f"at iter {state.iter_num}")
    return run


def replaced_files(c):
    """A fresh start over a run (--overwrite=True): what the old run left besides its record, the
    kept checkpoints (but the one this run starts from) and the evaluations of its checkpoint."""
    if c['init_from'] == 'resume' or c['eval_only']:
        return []
    start = c['init_from'] if os.path.exists(c['init_from']) else None
    kept = [p for p in glob.glob(os.path.join(glob.escape(c['out_dir']), 'ckpt_*.pt'))
            if not (start and os.path.samefile(p, start))]
    evaluations = [os.path.join(c['out_dir'], f) for f in ('eval.jsonl', 'hellaswag.json')]
    return [os.path.abspath(p) for p in kept + evaluations if os.path.exists(p)]


def train(c):
    """One run, from the settings to its last checkpoint: returns the Run."""
    process = distributed.setup_distributed(c['device'], c['backend'])
    lock = checkpoint.OutDirLock(c['out_dir']) if process.master else None
    run, t0 = None, time.time()
    try:
        with Signals(process, c['out_dir']) as signals:
            # after the lock: the checkpoint cannot change under it
            c = dict(c, init_from=checkpoint.resolve_init(c, process.master))
            run = setup(c, process, signals)
            train_loop(run)
        if process.master and not c['eval_only'] and signals.stopped is None:
            run.record.finish(run.state.iter_num)
            saved = os.path.exists(os.path.join(c['out_dir'], 'ckpt.pt'))
            best = os.path.exists(best_checkpoint(c['out_dir']))  # a signal's save took ckpt.pt
            print(f"finished at iter {run.state.iter_num} in {format_eta(time.time() - t0)}; "
                  + (f"sample from the best evaluation's: python sample.py --init_from="
                     f"{shlex.quote(best_checkpoint(c['out_dir']))}" if best else
                     f"sample from it: python sample.py --out_dir={shlex.quote(c['out_dir'])}"
                     if saved else "no checkpoint was saved (nothing trained, or "
                     "always_save_checkpoint=False and no evaluation improved)"))
        run.finished = True
        run.step_model = None  # the DDP wrapper goes while the process group lives
        return run
    finally:
        if run is not None:
            run.data.close()
        if run is not None and run.record is not None:
            run.record.close()  # the trackers' last writes
        distributed.close(process, finished=run is not None and run.finished)
        if lock is not None:
            lock.release(started=run is not None and run.record is not None and run.record.started)


def out_of_memory(e, c):
    """The one line for a batch or model the device's memory cannot hold, else None."""
    if not (isinstance(e, (torch.OutOfMemoryError, MemoryError))
            or "DefaultCPUAllocator: can't allocate memory" in str(e)):
        return None
    return (f"out of memory on {c['device']} at batch_size {c['batch_size']} and block_size "
            f"{c['block_size']}: lower batch_size and raise gradient_accumulation_steps by the "
            "same factor (the tokens per step stay), or train a smaller model")


def main(argv=None):
    try:
        c = settings(argv)
    except UserError as e:  # under torchrun every rank reads the same settings: said once
        raise SameOnEveryRank(str(e)) from None
    try:
        run = train(c)
    except (RuntimeError, MemoryError) as e:
        message = out_of_memory(e, c)
        if message is None:
            raise
        raise UserError(message) from None
    if run.signals.stopped is not None:  # stopped early, on every rank: not taken as finished
        sys.exit(128 + run.signals.stopped[1])
    return run


if __name__ == '__main__':
    run_main(main)
