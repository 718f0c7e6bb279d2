"""
What a run writes about itself: its record (config.json and log.jsonl, which always describe
the checkpoint on disk), the trackers that mirror it (W&B), the probes that add to its
evaluations' lines (the probe setting), and the step times it logs.
"""
import importlib
import json
import os
import time

from common import UserError, read_jsonl, write_json, write_text


class Record:
    """The run's record: config.json and log.jsonl (and W&B), which a resume from the checkpoint
    on disk finds consistent: lines past the checkpoint are cut back then. A new run writes both
    with its first entry. A run that starts where a
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

    def log(self, **entry):
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

    def commit(self):
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


def load_probe(c, data, device):
    """The probe setting's hook, run at each evaluation: its dict joins the log line."""
    try:
        return importlib.import_module(c['probe']).probe(data, c, device)
    except ImportError as e:
        raise UserError(f"probe={c['probe']!r} cannot be imported ({e}): run from the repository "
                        "root, or set --probe=None") from None
