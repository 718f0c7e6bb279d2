"""
Checkpoints: ckpt.pt written atomically and read safely (weights_only), the model and optimizer
state restored from one, the resume policy (init_from 'auto', and no run started over another by
accident), and the out_dir lock (one run per out_dir).
"""

import errno
import os
import re
import shutil

import torch

from kvgpt.errors import UserError, fs_error, model_errors
from kvgpt.files import atomic_write, hold_lock, read_only


# -----------------------------------------------------------------------------
# ckpt.pt: save and load

def save_checkpoint(ckpt, path, before_replace=None):
    """Atomically; a failed write is an OSError naming path (torch reports a full disk as a
    RuntimeError of its zip writer), and the file there before stays as it was, as it does when
    before_replace (atomic_write's) raises."""
    try:
        atomic_write(path, lambda tmp: torch.save(ckpt, tmp), before_replace)
    except RuntimeError as e:
        folder = os.path.dirname(os.path.abspath(path))
        free = shutil.disk_usage(folder).free if os.path.isdir(folder) else 0
        raise OSError(write_failure(folder, free),
                      f"{str(e).strip().splitlines()[0][:120]}; {free / 2 ** 20:.0f} MiB free",
                      path) from None


def load_checkpoint(path, map_location='cpu', mmap=False, resume=False):
    """weights_only=True: a checkpoint from someone else cannot run code on load. mmap=True
    reads tensors lazily (cheap when only model_args are wanted). Its keys are checked for the
    model, and with resume for everything a resume reads (RESUME_ENTRIES)."""
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}: train one first, or name a run directory "
                        "that holds one")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if 'Weights only load failed' in first:  # torch's advice to load it unsafely: not ours
            first = "it holds objects other than tensors and plain values"
        reason = first if len(first) <= 200 else first[:200].rsplit(' ', 1)[0] + ' ...'
        raise UserError(f"cannot read checkpoint {path} ({reason}): it is damaged, cut short or "
                        "not a checkpoint; use another (such as a kept ckpt_<step>.pt), or train "
                        "again") from None
    check_keys(ckpt, path, RESUME_ENTRIES if resume else MODEL_ENTRIES)
    for key in ('config', 'meta'):  # nanoGPT's and converted checkpoints may lack them
        ckpt[key] = ckpt.get(key) or {}
    return ckpt


def model_from_checkpoint(path, verbose=True, resume=False, dropout=None):
    """(model, checkpoint) of a checkpoint file: reading it is this module's, making the model
    model.py's (GPT.from_checkpoint); either failing is one line that names the file. resume:
    every key a resume reads is checked too. dropout: a fine-tune's, over the checkpoint's."""
    from model import GPT
    ckpt = load_checkpoint(path, resume=resume)
    if dropout is not None:
        ckpt['model_args'] = dict(ckpt['model_args'], dropout=dropout)
    bad = [k for k, v in ckpt['model'].items()
           if torch.is_tensor(v) and v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:  # a diverged run's weights (nanoGPT saves them): sampling would fail or print NULs
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise UserError(f"{path} holds non-finite weights ({bad[0]}{more}): the run diverged "
                        "before this was saved; use an earlier checkpoint")
    with model_errors(path):
        return GPT.from_checkpoint(ckpt, verbose=verbose), ckpt


def load_optimizer_state(optimizer, model, ckpt, path, name):
    """Load a checkpoint's optimizer state into optimizer (the settings' optimizer `name`), once
    it is checked to be that optimizer's (the checkpoint's config records it; one from before the
    key was AdamW's) and to fit model: a state of another model would fail at the first step, deep
    in torch; here it is one line naming the parameter."""
    trained = ckpt['config'].get('optimizer', 'adamw')
    if trained != name:
        raise UserError(f"{path} was trained with optimizer={trained!r}, not {name!r}: continue "
                        f"it with --optimizer={trained}, or start a run from its weights alone "
                        f"(--init_from={path} --finetune=True)")
    state = ckpt['optimizer']
    check_optimizer_fits(optimizer, model, state, path)
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError) as e:
        raise UserError(f"{path}: its optimizer state cannot be loaded ({e}): "
                        f"{OPTIMIZER_ADVICE}") from None


# -----------------------------------------------------------------------------
# ckpt_best.pt: with always_save_checkpoint=False, ckpt.pt holds the best evaluation's state,
# which a signal's save (the resume point) would replace

def best_checkpoint(out_dir):
    return os.path.join(out_dir, 'ckpt_best.pt')


def keep_best(out_dir, state):
    """ckpt.pt, when it holds the best evaluation's state (state.ckpt_is_best), hard-linked as
    ckpt_best.pt: the signal's save then replaces ckpt.pt by a rename, and the best stays whole.
    None, or what failed."""
    path, best = os.path.join(out_dir, 'ckpt.pt'), best_checkpoint(out_dir)
    if not state.ckpt_is_best or not os.path.exists(path):
        return None
    try:
        atomic_write(best, lambda staged: os.link(path, staged))
    except OSError as e:
        return f"could not keep the best checkpoint: {fs_error(e, best)}"
    print(f"kept ckpt.pt as {best}: the best evaluation's (val loss {state.best_val_loss:.4f})")
    return None


def drop_best(out_dir):
    """ckpt_best.pt, once ckpt.pt is better: it would name an older state as the best."""
    best = best_checkpoint(out_dir)
    try:
        if os.path.exists(best):
            os.remove(best)
    except OSError as e:
        print(f"note: {fs_error(e, best, 'remove')}; ckpt.pt is the best now")


# -----------------------------------------------------------------------------
# the resume policy, and one run per out_dir

def resolve_init(c, master):
    """init_from with 'auto' resolved. A run that would start afresh (from scratch, from GPT-2's
    weights, or as a branch off another run's checkpoint file) over an existing checkpoint is
    refused, so repeating a command never silently replaces a run."""
    path = os.path.join(c['out_dir'], 'ckpt.pt')
    exists = os.path.exists(path)
    if c['init_from'] == 'auto':
        if master:
            print("init_from=auto: " + (f"resuming from {path}" if exists else
                                        f"no checkpoint in {c['out_dir']}, starting from scratch"))
        return 'resume' if exists else 'scratch'
    # a fresh start: anything but a resume (scratch, gpt2..gpt2-xl, a GPT-2 folder, a branch);
    # a branch off out_dir's own ckpt.pt continues it, but a fine-tune of it would start over
    fresh = c['init_from'] != 'resume'
    own = os.path.abspath(c['init_from']) == os.path.abspath(path) and not c.get('finetune')
    if fresh and exists and not c['overwrite'] and not own:
        try:
            step = f" at iter {load_checkpoint(path, mmap=True)['iter_num']}"
        except (UserError, KeyError):
            step = " (unreadable)"
        raise UserError(f"{c['out_dir']} already holds a checkpoint{step}: --init_from=resume "
                        "continues it, --overwrite=True starts over (its log, checkpoints and "
                        "evaluations are replaced)")
    return c['init_from']


class OutDirLock:
    """One run per out_dir: files.hold_lock's on out_dir/.lock, held for the run; out_dir/.owner
    names its holder. A run that never started (never wrote its record) takes away what it made:
    those files, and the out_dir itself when it made that too."""

    def __init__(self, out_dir):
        self.dir, self.made_dir = out_dir, not os.path.isdir(out_dir)
        self.path, self.owner = os.path.join(out_dir, '.lock'), os.path.join(out_dir, '.owner')
        try:
            os.makedirs(out_dir, exist_ok=True)
            self.made_file = not os.path.exists(self.path)
            self.lock = hold_lock(self.path, self.owner, 'train.py', lambda holder: (
                f"{out_dir} is in use by {holder}: wait for that run, stop it, or choose another "
                "--out_dir"))
        except OSError as e:
            raise UserError(f"{fs_error(e, out_dir)} (the run's --out_dir)") from None
        remove_leftovers(out_dir)  # under the lock: no run of this out_dir is writing them

    def release(self, started):
        self.lock.release()
        if not started and self.made_file:
            for path in (self.path, self.owner):
                if os.path.exists(path):
                    os.remove(path)
            if self.made_dir and not os.listdir(self.dir):
                os.rmdir(self.dir)


# the temporary files (files.atomic_write's <name>.tmp) of what a run writes to its out_dir: a
# run killed while writing one leaves it, and ckpt.pt's is up to a whole checkpoint
LEFTOVER = re.compile(r'(ckpt(_\d+|_best)?\.pt|log\.jsonl|config\.json)\.tmp')


def remove_leftovers(out_dir):
    """Remove the temporary files an earlier run of out_dir left, saying so in one line."""
    removed = []
    for name in sorted(filter(LEFTOVER.fullmatch, os.listdir(out_dir))):
        path = os.path.join(out_dir, name)
        if not os.path.isfile(path):  # a run writes files: anything else there is not its own
            continue
        try:
            size = os.path.getsize(path)
            os.remove(path)
        except OSError as e:
            raise UserError(f"{fs_error(e, path, 'remove')} (left by a run that was killed)"
                            ) from None
        removed.append(f"{name} ({size / 2 ** 20:.1f} MiB)")
    if removed:
        print(f"removed what a killed run left half-written in {out_dir}: {', '.join(removed)}")


# -----------------------------------------------------------------------------
# what each reader takes from a checkpoint, checked before it is used

def is_dict(value):
    return isinstance(value, dict)


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value):  # nanoGPT saves best_val_loss as a one-element tensor
    return is_int(value) or isinstance(value, float) or (
        torch.is_tensor(value) and value.numel() == 1)


def is_rng(value):  # distributed.RankRNG's: one {'torch': state, ...} per rank
    return isinstance(value, list) and all(
        isinstance(state, dict) and torch.is_tensor(state.get('torch')) for state in value)


def is_str(value):
    return isinstance(value, str)


def optional(test):
    return lambda value: value is None or test(value)


# what a reader takes from a checkpoint: key: (required, what it must be, its test). Every reader
# makes the model (and sample.py decodes with meta's tokenizer); a resume, or a branch off a
# checkpoint, also takes where the run stood. Keys that are not required may be missing: nanoGPT's
# and converted checkpoints lack some.
MODEL_ENTRIES = dict(model=(True, 'a dict', is_dict), model_args=(True, 'a dict', is_dict),
                     meta=(False, 'a dict or None', optional(is_dict)),
                     config=(False, 'a dict or None', optional(is_dict)))
RESUME_ENTRIES = dict(
    MODEL_ENTRIES, iter_num=(True, 'an int', is_int), best_val_loss=(True, 'a number', is_number),
    optimizer=(False, 'a dict', is_dict), scaler=(False, 'a dict or None', optional(is_dict)),
    rng=(False, 'a list of RNG states', is_rng),
    tokens_seen=(False, 'an int or None', optional(is_int)),
    ckpt_is_best=(False, 'True or False', lambda value: isinstance(value, bool)),
    wandb_run_id=(False, 'a string or None', optional(is_str)))


def check_keys(ckpt, path, keys):
    """Every key of keys a reader takes, there (if required) and of its type, else one line that
    names the key and the file."""
    advice = "use another checkpoint (such as a kept ckpt_<step>.pt), or train again"
    if not isinstance(ckpt, dict):
        raise UserError(f"{path} holds a {type(ckpt).__name__}, not a kvgpt/nanoGPT checkpoint: "
                        f"{advice}")
    for key, (required, what, test) in keys.items():
        if key not in ckpt:
            if required:
                raise UserError(f"{path} has no '{key}': it is damaged or not a kvgpt/nanoGPT "
                                f"checkpoint; {advice}")
        elif not test(ckpt[key]):
            value = ckpt[key]
            raise UserError(f"{path} is damaged: its '{key}' is a {type(value).__name__} "
                            f"({repr(value)[:40]}), not {what}; {advice}")


def write_failure(folder, free):
    """The errno behind a write torch reports only as a RuntimeError: a read-only filesystem, a
    folder this process may not write, a full disk, or else an I/O error."""
    if os.path.isdir(folder) and read_only(folder):
        return errno.EROFS
    if os.path.isdir(folder) and not os.access(folder, os.W_OK):
        return errno.EACCES
    return errno.ENOSPC if free < 2 ** 30 else errno.EIO


OPTIMIZER_ADVICE = ("the checkpoint is damaged or its optimizer is another model's: resume from "
                    "another checkpoint (such as a kept ckpt_<step>.pt); a copy of it without its "
                    "'optimizer' entry resumes with its weights and a fresh optimizer")


def check_optimizer_fits(optimizer, model, state, path):
    """An optimizer state of as many tensors as optimizer's, each of its parameter's shape."""
    names = {id(p): n for n, p in model.named_parameters()}
    params = [p for group in optimizer.param_groups for p in group['params']]
    saved = saved_tensors(state)
    if len(saved) != len(params):
        raise UserError(f"{path}: its optimizer state holds {len(saved)} tensors for a model of "
                        f"{len(params)}: {OPTIMIZER_ADVICE}")
    for entry, p in zip(saved, params):
        for key, value in entry.items():
            if torch.is_tensor(value) and value.dim() > 0 and value.shape != p.shape:
                raise UserError(f"{path}: its optimizer state does not fit its model ({key} of "
                                f"{names.get(id(p), 'a parameter')} is {tuple(value.shape)}, the "
                                f"parameter {tuple(p.shape)}): {OPTIMIZER_ADVICE}")


def saved_tensors(state):
    """Each parameter's saved state, in the order of the optimizer's param groups: a torch
    optimizer's state dict, or one per part (kvgpt.optimizer.Optimizers: {name: state dict})."""
    parts = [state] if 'param_groups' in state else list(state.values())
    if not all(isinstance(part, dict) for part in parts):
        return []
    return [part.get('state', {}).get(i, {}) for part in parts
            for group in part.get('param_groups', []) for i in group['params']]
