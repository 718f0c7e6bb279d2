"""
Run a study: the train.py runs a study file declares (arms, tuning, seeds, budgets), run so
that they can stop and continue anywhere, each finished run committed to experiments/<name>/.

    python -m lab.study lab/studies/v4.py --jobs=2 --threads=1   # run what is left
    python -m lab.study lab/studies/v4.py --status=True          # what is done, left, waiting
    python -m lab.study lab/studies/v4.py --print=True           # the runs to start, one a line
    python -m lab.study lab/studies/v4.py --collect=True         # commit what finished, gzipped
    python -m lab.study lab/studies/v4.py --carry=True           # stopped runs, to go elsewhere
    python -m lab.study lab/studies/*.py --report=True           # the docs' tables and figures

A study file is plain Python that only declares (lab/studies/v4.py is an example; its
docstring is the study's one-line summary). A run trains in <work_root>/out-<name>/<run>/
(checkpoints, stdout.txt, stderr.txt; never committed); once it has finished, its config.json
and its log.jsonl, gzipped to log.jsonl.gz, are copied to <root>/<name>/<run>/, what every table
is computed from. A run that is committed is never run again, and a run that stopped resumes
from its checkpoint.

A machine that goes away takes its work folders with it. Before it does, stop the runner (SIGTERM:
each run saves its checkpoint) and run --carry=True: each stopped run's checkpoint, config and log
go to <root>/<name>/carry/<run>/, with the checkpoints its branches still start from. Commit that
folder; the runner (and --print=True) on the next machine copies it into the work folders and the
runs resume (bit for bit on the same CPU; another CPU's float32 rounds differently from there).

--print=True writes each run that can start now as one shell line, for any scheduler (a Slurm
array, GNU parallel, another machine): `python -m lab.study S --print=True | parallel -j 8`,
then `--collect=True`. Tuning names later runs as its results come in, so repeat the two until
--print writes nothing.
"""

import fcntl
import gzip
import os
import shutil
import signal
import subprocess
import sys
import time

if not __package__:  # run as a file, not with -m: import from the repository root all the same
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from kvgpt.errors import quiet_imports  # first: Ctrl-C in the imports below is one line
quiet_imports(__name__)

from kvgpt.config import Kind, defaults, keys, parse_config
from kvgpt.errors import UserError, run_main
from kvgpt.files import atomic_write
from lab import docs
from lab.plan import (CARRY, LOG, PLAIN_LOG, base_config, check_reused, commit_log, commit_run,
                      compact, init_from, load_study, plan, results_of, reused as plan_reused,
                      shell_line, train_args, work_dir, work_of)

KEYS = keys(
    jobs=(1, "runs at a time on this machine"),
    threads=(None, "threads per run (OMP_NUM_THREADS); None: cores // jobs",
             Kind(int, optional=True)),
    status=(False, "list what is done, what can start now and what waits, then stop"),
    print=(False, "write the runs that can start now as shell lines, one a line, then stop"),
    collect=(False, "commit the runs finished in the work folders, gzip any plain log, stop"),
    carry=(False, "copy the stopped runs' checkpoints into <root>/<name>/carry/ to commit, stop"),
    report=(False, "rewrite the study's blocks of its docs and its figures from committed logs"),
    root=('experiments', "committed runs: <root>/<name>/<run>/{log.jsonl.gz,config.json}"),
    work_root=('.', "runs train in <work_root>/out-<name>/<run>/ (checkpoints; not committed)"),
)
DEFAULTS = defaults(KEYS)

# -----------------------------------------------------------------------------
# the runner

def pending(s, root):
    """(runs to start now, in the order the study's phase entries name them; the plan; results;
    folders)."""
    results, folders = results_of(s, root)
    p = plan(s, results)
    return [r for r in p.order if r.name not in results], p, results, folders


def check_reuse(s, root):
    """Before planning runs: a misspelt reused study would have its runs planned again."""
    for name in s.reuse:
        if not os.path.isdir(os.path.join(root, name)):
            raise UserError(f"{s.path}: reuse names {name!r}, but {os.path.join(root, name)}/ "
                            "does not exist: check the name, or point --root at the committed "
                            "runs")


def start(run, c, s, base, logging, init='auto'):
    work = work_dir(c, s, run)
    os.makedirs(work, exist_ok=True)
    print(f"{time.strftime('%H:%M:%S')} start {run.name}", flush=True)
    threads = c['threads'] or max(1, (os.cpu_count() or 1) // c['jobs'])
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    with open(os.path.join(work, 'stdout.txt'), 'a') as out, \
            open(os.path.join(work, 'stderr.txt'), 'w') as err:
        return subprocess.Popen([sys.executable, 'train.py',
                                 *train_args(s, run, base, work, logging, init)],
                                stdout=out, stderr=err, env=env)


def commit(run, c, s):
    """(commit_run's state word for the run's work folder, the run's stderr)."""
    work = work_dir(c, s, run)
    err = os.path.join(work, 'stderr.txt')
    error = open(err).read() if os.path.exists(err) else ''
    return commit_run(work, os.path.join(c['root'], s.name, run.name), error), error


def finish(run, c, s):
    """Commit a run whose process ended; its state word, None for a run that stopped."""
    state, error = commit(run, c, s)
    tail = error.strip().splitlines()[-1] if error.strip() else "no error"
    print(f"{time.strftime('%H:%M:%S')} {state or 'stopped'} {run.name}"
          + ("" if state == 'finished' else f": {tail}"), flush=True)
    return state


def run_all(c, s):
    """Start runs as slots free up, planning again after each one ends (a finished tuning run can
    name the next); a run that stops without finishing is not retried in this invocation. A wsd
    branch starts as soon as its source run has written the checkpoint it starts from, beside the
    `jobs` runs (it is short, and its budget's result comes early). SIGTERM or SIGINT stops the
    runner cleanly: each running train.py gets SIGTERM, saves its checkpoint and exits, and the
    next invocation resumes it."""
    base, running, stopped, signals, checked = base_config(s), {}, set(), [], set()
    failed = []  # runs that ended with an error, not a signal: running again will not help
    uncarry(c, s)
    handlers = {n: signal.signal(n, lambda signum, frame: signals.append(signum))
                for n in (signal.SIGTERM, signal.SIGINT)}
    replan = True  # planning reads every committed log: only when a run has ended
    try:
        while True:
            if replan:
                todo, p, results, folders = pending(s, c['root'])
                check_reused(s, p, folders, base, c['root'], checked)
                todo = [r for r in todo if r not in running and r not in stopped]
                replan = False
            for run in list(todo):
                if signals:
                    break
                init = init_from(c, s, run, results)
                branching = init not in (None, 'auto')
                jobs = sum(not branched for _, branched in running.values())
                if init is None or (not branching and jobs >= c['jobs']):
                    continue
                todo.remove(run)
                running[run] = (start(run, c, s, base, p.settings[run.name], init), branching)
            if signals:
                return stop_runs(running, c, s)
            if not running and failed:
                raise UserError(f"{len(failed)} run(s) failed, {failed[0].name} first (its "
                                f"error is above, and in {work_dir(c, s, failed[0])}/stderr.txt): "
                                "fix the cause and run again")
            if not running:
                print("nothing left to run" if not p.waiting and not stopped and not todo else
                      f"stopped: {len(stopped)} run(s) did not finish, {len(todo)} wait for "
                      "them; run again to resume them")
                return
            time.sleep(2)
            for run, (proc, _) in list(running.items()):
                if proc.poll() is not None:
                    del running[run]
                    replan = True
                    if finish(run, c, s) is None:
                        stopped.add(run)
                        if 0 < proc.returncode < 128:  # 128 + n: stopped by signal n
                            failed.append(run)
    finally:
        for n, h in handlers.items():
            signal.signal(n, h)


def stop_runs(running, c, s):
    """SIGTERM to every running train.py, then wait while each saves its checkpoint and exits."""
    for proc, _ in running.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for run, (proc, _) in running.items():
        proc.wait()
        finish(run, c, s)
    print(f"stopped by a signal: {len(running)} run(s) saved their checkpoints; the same command "
          "resumes them")


def status(c, s):
    todo, p, results, folders = pending(s, c['root'])
    print(f"study {s.name} ({s.path}): {' '.join(s.about.split(chr(10) * 2)[0].split())}")
    reused = sum(plan_reused(s, folders[r.name], c['root']) for r in p.order if r.name in folders)
    for phase, runs in p.phases.items():
        print(f"{phase}: {sum(r.name in results for r in runs)} of {len(runs)} named runs done")
    if reused:
        print(f"reused from {', '.join(s.reuse)}: {reused} committed runs of the names it plans")
    if p.waiting:
        print(f"still tuning: {', '.join(p.waiting)} (their later phases are named once it ends)")
    ready = [r for r in todo if init_from(c, s, r, results) is not None]
    print(f"to run now: {len(ready)}" + ("" if todo or p.waiting else " (nothing left to run)"))
    for run in ready:
        print(f"  {run.name}")
    for run in (r for r in todo if r not in ready):
        print(f"  waiting: {run.name} (branches off {run.source[0]} at step {run.source[1]})")
    return ready


def print_runs(c, s):
    uncarry(c, s)
    todo, p, results, folders = pending(s, c['root'])
    base = base_config(s)
    check_reused(s, p, folders, base, c['root'])
    ready = [(r, init_from(c, s, r, results)) for r in todo]
    ready = [(r, init) for r, init in ready if init is not None]  # a branch waits for its source
    for run, init in ready:
        print(shell_line(c, s, run, base, p.settings[run.name], init))
    return [r for r, _ in ready]


def collect(c, s):
    """Commit each pending run that finished (or diverged) in its work folder, then gzip each
    plain log.jsonl committed in the study's folder (a runner from before the compact logs)."""
    states = {}
    for run in pending(s, c['root'])[0]:
        if os.path.isdir(work_dir(c, s, run)):
            states[run.name] = commit(run, c, s)[0]
            if states[run.name]:
                print(f"{states[run.name]} {run.name}")
    print(f"collected {sum(map(bool, states.values()))} run(s) into {c['root']}/{s.name}/")
    plain = compact(c['root'], s.name)
    if plain:
        print(f"compacted {len(plain)} plain log(s) into log.jsonl.gz")
    return states


# -----------------------------------------------------------------------------
# carrying stopped runs to another machine

def carried_files(c, s):
    """{run name: [file names]}: what resuming the study's unfinished runs needs from the work
    folders: each stopped run's checkpoint, config and log, and the kept checkpoint of each
    branch that has not started."""
    todo = pending(s, c['root'])[0]
    files = {}
    for run in todo:
        if os.path.exists(os.path.join(work_dir(c, s, run), 'ckpt.pt')):
            files.setdefault(run.name, []).extend(['config.json', PLAIN_LOG, 'ckpt.pt'])
        elif run.source is not None:
            name, step = run.source
            if os.path.exists(os.path.join(work_of(c, s, name), f'ckpt_{step}.pt')):
                files.setdefault(name, []).append(f'ckpt_{step}.pt')
    return {name: sorted(set(f)) for name, f in files.items()}


def copy_file(src, dest, unzip=False):
    def write(tmp):
        with (gzip.open if unzip else open)(src, 'rb') as f, open(tmp, 'wb') as out:
            shutil.copyfileobj(f, out)
    atomic_write(dest, write)


def carry(c, s):
    """Rewrite <root>/<name>/carry/ to hold what the work folders need to resume on another
    machine (carried_files), logs gzipped as committed ones; a run committed since is left out."""
    with lock(c, s):
        files = carried_files(c, s)
        folder = os.path.join(c['root'], s.name, CARRY)
        for name in (os.listdir(folder) if os.path.isdir(folder) else []):
            if name not in files:
                shutil.rmtree(os.path.join(folder, name))
        size = 0
        for name, names in files.items():
            dest, kept = os.path.join(folder, name), {LOG if f == PLAIN_LOG else f for f in names}
            os.makedirs(dest, exist_ok=True)
            for old in set(os.listdir(dest)) - kept:
                os.remove(os.path.join(dest, old))
            for f in names:
                src = os.path.join(work_of(c, s, name), f)
                if f == PLAIN_LOG:
                    commit_log(src, dest)
                else:
                    copy_file(src, os.path.join(dest, f))
            size += sum(os.path.getsize(os.path.join(dest, f)) for f in kept)
        if os.path.isdir(folder) and not os.listdir(folder):
            os.rmdir(folder)
    if not files:
        print(f"nothing to carry: no run of {s.name} is stopped part-way in the work folders")
        return files
    print(f"carried {len(files)} run(s) into {folder}/ ({size / 2 ** 20:.1f} MiB): commit it, and "
          "the runner resumes them from it on any machine")
    return files


def uncarry(c, s):
    """Copy <root>/<name>/carry/ into the work folders where they lack it: a carried checkpoint
    comes with its config and log, and never replaces a checkpoint already there; a kept
    checkpoint (a branch's start) is copied where it is missing."""
    folder = os.path.join(c['root'], s.name, CARRY)
    committed = results_of(s, c['root'])[0]
    for name in (sorted(os.listdir(folder)) if os.path.isdir(folder) else []):
        src, work = os.path.join(folder, name), work_of(c, s, name)
        os.makedirs(work, exist_ok=True)
        names = sorted(os.listdir(src))
        resume = ('ckpt.pt' in names and name not in committed
                  and not os.path.exists(os.path.join(work, 'ckpt.pt')))
        for f in names:
            target = os.path.join(work, PLAIN_LOG if f == LOG else f)
            if resume if f in ('ckpt.pt', 'config.json', LOG) else not os.path.exists(target):
                copy_file(os.path.join(src, f), target, unzip=f == LOG)
        if resume:
            print(f"{time.strftime('%H:%M:%S')} carried in {name}", flush=True)


def lock(c, s):
    folder = os.path.join(c['work_root'], f'out-{s.name}')
    os.makedirs(folder, exist_ok=True)
    f = open(os.path.join(folder, '.runner.lock'), 'a')
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise UserError(f"another runner is running study {s.name} in {folder}: wait for it or "
                        "stop it") from None
    return f


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    files = [a for a in argv if not a.startswith('-')]
    c = parse_config(KEYS, [a for a in argv if a.startswith('-')], usage=__doc__,
                     arguments='Arguments are study files (lab/studies/v7.py) and --key=value.')
    if not files:
        raise UserError("give a study file: python -m lab.study lab/studies/v4.py [--status=True]")
    if c['jobs'] < 1:
        raise UserError(f"jobs must be at least 1, got {c['jobs']}")
    studies = [load_study(f) for f in files]
    planning = c['status'] or c['print'] or not (c['collect'] or c['carry'] or c['report'])
    for s in studies if planning else ():
        check_reuse(s, c['root'])
    if c['report']:
        return [docs.write_report(s, c['root']) for s in studies]
    for word, act in (('status', status), ('print', print_runs), ('collect', collect),
                      ('carry', carry)):
        if c[word]:
            return [act(c, s) for s in studies]
    if len(studies) > 1:
        raise UserError("the runner runs one study at a time: give one study file")
    with lock(c, studies[0]):
        run_all(c, studies[0])


if __name__ == '__main__':
    run_main(main)
