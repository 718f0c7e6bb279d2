"""
What a run writes about itself: its record (config.json and log.jsonl, which a resume finds
consistent with the checkpoint on disk), the trackers that mirror it (W&B, TensorBoard), each
continuing across a resume, and the step times its log lines report.
"""

import json
import os
import time

from kvgpt.errors import UserError, fs_error
from kvgpt.files import atomic_write, read_jsonl, write_json, write_text


# -----------------------------------------------------------------------------
# the record: config.json and log.jsonl

def kept_lines(path, resume_iter):
    """The lines of the log at path that a run resuming at resume_iter keeps: every one before its
    checkpoint's step, and that step's own log line (its evaluation is made again)."""
    if not os.path.exists(path):
        return []
    entries = read_jsonl(path)
    for n, e in enumerate(entries, 1):
        if not (isinstance(e, dict) and isinstance(e.get('iter'), int)):
            raise UserError(f"{path} line {n} is not a log entry (no 'iter'): repair or remove "
                            "that line, then run again")
    return [e for e in entries if e['iter'] < resume_iter or (
        e['iter'] == resume_iter and 'val_loss' not in e)]


class Record:
    """The run's record: config.json and log.jsonl (and W&B), which a resume from the checkpoint
    on disk finds consistent: lines past the checkpoint are cut back then. A new run writes both
    with its first entry. A run that starts where a
    record already is (a resume, or --overwrite=True) holds its entries until it has saved its
    first checkpoint: only then does it write config.json and the log, cut back to where it
    started (the lines it writes again), so a resume that fails before then leaves both files
    byte-identical. eval_only (config None) touches neither: its evaluation goes to
    eval.jsonl. stale: what the run a fresh start replaces (--overwrite=True) left beside its
    record, its kept checkpoints (ckpt_<step>.pt) and evaluations (eval.jsonl, hellaswag.json);
    those this run has not written again go when the record becomes its."""

    def __init__(self, out_dir, config, resume_iter, trackers=(), stale=()):
        self.path, self.config, self.resume_iter = os.path.join(out_dir, 'log.jsonl'), config, \
            resume_iter
        self.out_dir, self.trackers, self.started = out_dir, list(trackers), False
        self.stale = set(stale)
        record = [os.path.join(out_dir, f) for f in ('log.jsonl', 'config.json')]
        # the entries waiting for this run's first checkpoint; None: each goes to the log at once
        self.held = [] if any(map(os.path.exists, record)) and config is not None else None
        if self.held is not None:
            kept_lines(self.path, resume_iter)  # a damaged log is one line now, not at the save

    def log(self, **entry):
        for tracker in self.trackers:
            tracker.log(entry)
        if self.config is None:
            path = os.path.join(self.out_dir, 'eval.jsonl')
            return self.append(path, dict(entry, eval_only=True))
        if self.held is not None:
            return self.held.append(entry)
        if not self.started:
            self.start([])
        self.append(self.path, entry)

    def start(self, entries):
        """The log cut back to resume_iter with entries after it, then config.json; each write
        atomic, and a failed config.json puts the old log back, so a failure leaves the record as
        it was (a one-line UserError naming the file)."""
        config_path = os.path.join(self.out_dir, 'config.json')
        keep = kept_lines(self.path, self.resume_iter)
        old = open(self.path, 'rb').read() if os.path.exists(self.path) else None
        path = self.path
        try:
            write_text(self.path, ''.join(json.dumps(e) + '\n' for e in keep + entries))
            path = config_path
            write_json(config_path, self.config)
        except OSError as e:
            if path == config_path:
                restore(self.path, old)
            raise UserError(fs_error(e, path)) from None
        self.started = True
        for stale in sorted(self.stale):  # the replaced run's: no branch may start from them now
            try:
                os.remove(stale)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise UserError(f"{fs_error(e, stale)}: remove it, it belongs to the run "
                                "--overwrite=True replaced") from None
        self.stale = set()

    def close(self):
        for tracker in self.trackers:
            tracker.close()

    def holds_final(self, iter_num):
        """Whether the record on disk already holds the final evaluation at iter_num (a finished
        run, resumed: nothing to add)."""
        return os.path.exists(self.path) and any(
            e['iter'] == iter_num and 'val_loss_full' in e for e in read_jsonl(self.path))

    def finish(self, iter_num):
        """The run ended at iter_num, not stopped by a signal: what it logged with no checkpoint
        after it (always_save_checkpoint=False, or a final evaluation cut short before) joins the
        record. A finished run resumed, which adds nothing, leaves the record be."""
        if iter_num > self.resume_iter or not self.holds_final(iter_num):
            self.commit()

    def commit(self):
        """A checkpoint was saved (or the run finished): the held entries join the record, which
        is written now if it was not yet (a checkpoint without a config.json beside it is not)."""
        if self.config is not None and (self.held is not None or not self.started):
            entries, self.held = self.held or [], None
            self.start(entries)

    @staticmethod
    def append(path, entry):
        try:
            with open(path, 'a') as f:
                f.write(json.dumps(entry) + '\n')
        except OSError as e:
            raise UserError(fs_error(e, path)) from None


def restore(path, old):
    """Put a file back as it was (old: its bytes, None: it did not exist)."""
    if old is None:
        os.remove(path)
    else:
        atomic_write(path, lambda tmp: open(tmp, 'wb').write(old))


# -----------------------------------------------------------------------------
# trackers: each mirrors the record's entries as they are logged, and continues across a resume

def entry_position(entry):  # a step's log line comes before its evaluation's
    return [entry['iter'], int('val_loss' in entry)]


class WandbTracker:
    """A W&B run whose id the checkpoint keeps: a resume (or a restart by torchrun) continues it.
    Its charts are against `iter`; the entries a resume logs again up to what the run already
    holds (the steps between the checkpoint and a crash, bit-identical) are left out."""

    def __init__(self, c, run_id=None):
        try:
            import wandb
        except ImportError:
            raise UserError("wandb_log=True needs wandb: `pip install wandb`, "
                            "or set --wandb_log=False") from None
        name = c['wandb_run_name'] or os.path.basename(os.path.normpath(c['out_dir']))
        try:
            self.run = wandb.init(project=c['wandb_project'], name=name, config=c,
                                  id=run_id, resume='allow')  # id None: W&B makes one
        except Exception as e:  # W&B's own: no login, no network, a bad project
            if not type(e).__module__.startswith('wandb'):
                raise
            why = (str(e).strip().splitlines() or [''])[0]
            raise UserError(f"W&B could not start the run ({type(e).__name__}: {why}): log in "
                            "with `wandb login`, or set WANDB_MODE=offline, or --wandb_log=False"
                            ) from None
        self.run.define_metric('iter')
        self.run.define_metric('*', step_metric='iter')
        self.logged = self.run.summary.get('logged_through')  # restored by W&B on a resume

    @property
    def run_id(self):
        return self.run.id

    def log(self, entry):
        if self.logged is not None and entry_position(entry) <= list(self.logged):
            return
        self.run.log(entry)
        self.logged = entry_position(entry)
        self.run.summary['logged_through'] = self.logged

    def close(self):
        self.run.finish()


class TensorBoardTracker:
    """The record's numbers as TensorBoard scalars in out_dir/tensorboard. A resume purges what
    the last run wrote from its checkpoint's step on (a run started over: all of it) and writes
    again the step lines log.jsonl keeps there, so the event files read back as log.jsonl."""

    def __init__(self, out_dir, resume_iter, kept=()):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError("tensorboard_log=True needs tensorboard: `pip install tensorboard`, "
                            "or set --tensorboard_log=False") from None
        # purge_step 0 too: a run started over (--overwrite=True) replaces the old run's events
        self.writer = SummaryWriter(os.path.join(out_dir, 'tensorboard'), purge_step=resume_iter)
        self.tokens_at = None  # the last step whose tokens were written
        for entry in kept:
            self.log(entry)

    def log(self, entry):
        for key, value in entry.items():
            if key == 'tokens' and 'val_loss' in entry and entry['iter'] == self.tokens_at:
                continue  # the step's log line wrote it: once a step
            if key != 'iter' and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, entry['iter'])
        if 'tokens' in entry:
            self.tokens_at = entry['iter']

    def close(self):
        self.writer.close()


def open_trackers(c, resume_iter, wandb_run_id=None):
    """The trackers the settings ask for; none for eval_only (its lines go to eval.jsonl)."""
    if c['eval_only']:
        return []
    trackers = [WandbTracker(c, wandb_run_id)] if c['wandb_log'] else []
    if c['tensorboard_log']:
        path = os.path.join(c['out_dir'], 'log.jsonl')
        kept = [e for e in kept_lines(path, resume_iter) if e['iter'] == resume_iter]
        trackers.append(TensorBoardTracker(c['out_dir'], resume_iter, kept))
    return trackers


def wandb_run_id(record):
    """The W&B run id to keep in the checkpoint, or None."""
    ids = [t.run_id for t in (record.trackers if record else []) if isinstance(t, WandbTracker)]
    return ids[0] if ids else None


# -----------------------------------------------------------------------------
# step times: what the log lines report

TIMING_WARMUP = 2  # steps after each (re)start left out of step times (compilation, caches)


class StepTimer:
    """Seconds per step since the last log line, leaving out the TIMING_WARMUP steps after each
    (re)start, every evaluation and every save."""

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
