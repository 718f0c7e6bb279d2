"""
Checkpoints: ckpt.pt written atomically and read safely (weights_only), the model and optimizer
state restored from one, the resume policy (init_from 'auto', and no run started over another by
accident), and the out_dir lock (one run per out_dir).
"""

import errno
import os
import shutil
import socket

import torch
from filelock import FileLock, Timeout

from kvgpt.errors import UserError, fs_error, model_errors
from kvgpt.files import atomic_write


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


def write_failure(folder, free):
    """The errno behind a write torch reports only as a RuntimeError: a read-only filesystem, a
    folder this process may not write, a full disk, or else an I/O error."""
    if os.path.isdir(folder) and os.statvfs(folder).f_flag & os.ST_RDONLY:
        return errno.EROFS
    if os.path.isdir(folder) and not os.access(folder, os.W_OK):
        return errno.EACCES
    return errno.ENOSPC if free < 2 ** 30 else errno.EIO


def load_checkpoint(path, map_location='cpu', mmap=False):
    """weights_only=True: a checkpoint from someone else cannot run code on load. mmap=True
    reads tensors lazily (cheap when only model_args are wanted)."""
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}: train one first, or point --out_dir at a run "
                        "directory")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if 'Weights only load failed' in first:  # torch's advice to load it unsafely: not ours
            first = "it holds objects other than tensors and plain values"
        raise UserError(f"cannot read checkpoint {path}: {first[:200]} (corrupt, truncated, "
                        "or not a checkpoint)") from None
    if not isinstance(ckpt, dict) or 'model' not in ckpt or 'model_args' not in ckpt:
        raise UserError(f"{path} is not a kvgpt/nanoGPT checkpoint (it needs 'model' and "
                        "'model_args')")
    return ckpt


def model_from_checkpoint(path, verbose=True):
    """(model, checkpoint) of a checkpoint file: reading it is this module's, making the model
    model.py's (GPT.from_checkpoint); either failing is one line that names the file."""
    from model import GPT
    ckpt = load_checkpoint(path)
    with model_errors(path):
        return GPT.from_checkpoint(ckpt, verbose=verbose), ckpt


def load_optimizer_state(optimizer, model, state, path):
    """Load a checkpoint's AdamW state into optimizer, once it is checked to fit model: a state
    of another model would fail at the first step, deep in torch; here it is one line naming the
    parameter."""
    names = {id(p): n for n, p in model.named_parameters()}
    params = [p for group in optimizer.param_groups for p in group['params']]
    saved = [i for group in state.get('param_groups', []) for i in group['params']]
    advice = ("the checkpoint is damaged or its optimizer is another model's: resume from another "
              "checkpoint, or keep its weights with a fresh AdamW: export them (python -m "
              "tools.export) and start with --init_from=<the exported folder>")
    if len(saved) != len(params):
        raise UserError(f"{path}: its optimizer state holds {len(saved)} tensors for a model of "
                        f"{len(params)}: {advice}")
    for i, p in zip(saved, params):
        for key, value in state.get('state', {}).get(i, {}).items():
            if torch.is_tensor(value) and value.dim() > 0 and value.shape != p.shape:
                raise UserError(f"{path}: its optimizer state does not fit its model ({key} of "
                                f"{names.get(id(p), 'a parameter')} is {tuple(value.shape)}, the "
                                f"parameter {tuple(p.shape)}): {advice}")
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError) as e:
        raise UserError(f"{path}: its optimizer state cannot be loaded ({e}): {advice}") from None


# -----------------------------------------------------------------------------
# the resume policy, and one run per out_dir

def resolve_init(c, master):
    """init_from with 'auto' resolved. A run that would start from scratch, or branch off another
    run's checkpoint file, over an existing checkpoint is refused, so repeating a command never
    silently replaces a run."""
    path = os.path.join(c['out_dir'], 'ckpt.pt')
    exists = os.path.exists(path)
    if c['init_from'] == 'auto':
        if master:
            print("init_from=auto: " + (f"resuming from {path}" if exists else
                                        f"no checkpoint in {c['out_dir']}, starting from scratch"))
        return 'resume' if exists else 'scratch'
    # a fresh start (from scratch, or a branch off another run's checkpoint file)
    fresh = c['init_from'] == 'scratch' or os.path.isfile(c['init_from'])
    if fresh and exists and not c['overwrite'] and os.path.abspath(c['init_from']) != \
            os.path.abspath(path):
        try:
            step = f" at iter {load_checkpoint(path, mmap=True)['iter_num']}"
        except (UserError, KeyError):
            step = " (unreadable)"
        raise UserError(f"{c['out_dir']} already holds a checkpoint{step}: --init_from=resume "
                        "continues it, --overwrite=True starts over (its log and checkpoints are "
                        "replaced)")
    return c['init_from']


class OutDirLock:
    """One run per out_dir: an exclusive lock on out_dir/.lock (filelock: flock on POSIX, msvcrt
    on Windows), which the OS releases when the process ends however it ends, so a crash never
    leaves a stale lock. Held for the run; out_dir/.owner names its holder. A run that never
    started (never wrote its record) takes away what it made: those files, and the out_dir
    itself when it made that too."""

    def __init__(self, out_dir):
        self.dir, self.made_dir = out_dir, not os.path.isdir(out_dir)
        self.path, self.owner = os.path.join(out_dir, '.lock'), os.path.join(out_dir, '.owner')
        try:
            os.makedirs(out_dir, exist_ok=True)
            self.made_file = not os.path.exists(self.path)
            self.lock = FileLock(self.path, timeout=0)
            self.lock.acquire()
        except Timeout:
            holder = read_text(self.owner) or 'another process'
            raise UserError(f"{out_dir} is in use by {holder}: wait for that run, stop it, or "
                            "choose another --out_dir") from None
        except OSError as e:
            raise UserError(f"{fs_error(e, out_dir)} (the run's --out_dir)") from None
        try:
            with open(self.owner, 'w') as f:
                f.write(f"train.py (pid {os.getpid()} on {socket.gethostname()})")
        except OSError as e:
            self.lock.release()
            raise UserError(f"{fs_error(e, out_dir)} (the run's --out_dir)") from None

    def release(self, started):
        self.lock.release()
        if not started and self.made_file:
            for path in (self.path, self.owner):
                if os.path.exists(path):
                    os.remove(path)
            if self.made_dir and not os.listdir(self.dir):
                os.rmdir(self.dir)


def read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ''
