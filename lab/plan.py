"""
What a study names: a study file loaded and checked, its runs planned from the committed results
(tuning by the bracket rule, then each phase), each run's train.py arguments, and the committed
runs themselves. Pure: nothing here starts a run (lab/study.py does).
"""
import json
import math
import os
import shlex
from dataclasses import dataclass, field

from kvgpt.config import did_you_mean, parse_value, variant_settings
from kvgpt.errors import UserError
from kvgpt.files import read_json, read_jsonl, read_lines, write_gzip, write_text
from model import GPTConfig, upgrade_query
import train

# -----------------------------------------------------------------------------
# a study file: lowercase names are its declarations, UPPERCASE ones the file's own constants

STUDY_KEYS = dict(
    name=str,  # the folder of its committed runs, <root>/<name>/
    docs=str,  # the write-up whose generated blocks --report rewrites
    base=tuple,  # the config files every run starts from
    arms=dict,  # {arm: {variant, weight_decay, lr | grid, settings}}
    tuning=dict,  # how an arm without a fixed lr is tuned: seeds, step, extend (and wd_grid...)
    phases=list,  # [{name, kind: tune | at | climb, arms, seeds, ...}] in the order runs start
    reuse=tuple,  # studies whose committed runs count as this one's where the names match
    tables=dict,  # {docs block: {kind, ...}}: lab/tables.py
    figures=dict,  # {file in docs/assets/: {kind, ...}}
)
ARM_KEYS = {'variant', 'weight_decay', 'lr', 'grid', 'settings', 'tuning'}
PHASE_KEYS = {'name', 'kind', 'arms', 'seeds', 'budget', 'init_std', 'dtype', 'tag', 'lr_factors',
              'settings', 'above', 'steps', 'branches', 'lr'}
TUNING = dict(seeds=(), step=2 ** 0.5, extend=3, anchor=2e-3, wd_grid=None, wd_step=None,
              lr_start=None, keep=None, margin=0.0)


class Study:
    """A loaded study file: its declarations as attributes, checked."""

    def __init__(self, path, declared):
        self.path, self.about = path, (declared.get('__doc__') or '').strip()
        for key, kind in STUDY_KEYS.items():
            setattr(self, key, declared.get(key, kind()))
        self.base, self.reuse = tuple(self.base), tuple(self.reuse)
        self.tuning = dict(TUNING, **self.tuning)

    def arm(self, name):
        return self.arms[name]

    def variant(self, arm):
        return self.arms[arm].get('variant', arm)

    def tuning_of(self, arm):
        """The study's tuning settings with the arm's own over them."""
        return dict(self.tuning, **self.arms[arm].get('tuning', {}))


def load_study(path):
    if not os.path.isfile(path):
        raise UserError(f"study file '{path}' not found (a study is a file like "
                        "lab/studies/v4.py)")
    declared = {'__file__': path}
    try:
        with open(path) as f:
            exec(compile(f.read(), path, 'exec'), declared)
    except Exception as e:
        raise UserError(f"study file '{path}' failed: {type(e).__name__}: {e}") from None
    names = [k for k in declared if not k.startswith('_') and k.islower()
             and not callable(declared[k]) and not hasattr(declared[k], '__path__')]
    unknown = [k for k in names if k not in STUDY_KEYS]
    if unknown:
        raise UserError(f"{path}: unknown declaration(s) {', '.join(unknown)}: a study declares "
                        f"{', '.join(STUDY_KEYS)} (constants of its own are UPPERCASE)")
    study = Study(path, declared)
    check_study(study)
    return study


def check_study(s):
    where = s.path
    for key in ('name', 'base', 'arms'):
        if not getattr(s, key):
            raise UserError(f"{where}: the study declares no {key}")
    for arm, spec in s.arms.items():
        bad = set(spec) - ARM_KEYS
        if bad:
            raise UserError(f"{where}: arm {arm} has unknown key(s) {', '.join(sorted(bad))} "
                            f"(an arm has {', '.join(sorted(ARM_KEYS))})")
        around = spec.get('grid', {})
        if isinstance(around, dict) and around.get('around') not in (None, *arms_before(s, arm)):
            raise UserError(f"{where}: arm {arm} tunes around {around['around']!r}, which is not "
                            "an arm declared before it")
        check_arm(s, arm, spec)
    for phase in s.phases:
        bad = set(phase) - PHASE_KEYS
        missing = [a for a in phase.get('arms', ()) if a not in s.arms]
        if bad or missing or phase.get('kind') not in ('tune', 'at', 'climb', 'wsd'):
            raise UserError(f"{where}: phase {phase.get('name')!r}: kind must be tune, at, climb "
                            f"or wsd; unknown keys {sorted(bad)}; unknown arms {missing}")
        check_phase(s, phase)
    for path in s.base:
        if not os.path.isfile(path):
            raise UserError(f"{where}: base config '{path}' not found (run from the repository "
                            "root)")


def check_settings(where, settings):
    """A study's settings are train.py's keys: a misspelt one is found before any run starts."""
    for key in settings:
        if key not in train.KEYS:
            raise UserError(f"{where}: unknown train.py setting {key!r}"
                            f"{did_you_mean(key, train.KEYS)}")


def check_arm(s, arm, spec):
    """An arm's LR is fixed (lr, with its weight_decay) or tuned over a grid on the tuning seeds,
    at a fixed weight decay or one searched over the tuning's wd_grid."""
    where = f"{s.path}: arm {arm}"
    t = s.tuning_of(arm)
    if spec.get('weight_decay') is None and ('lr' in spec or (
            'grid' in spec and t['wd_grid'] is None)):
        raise UserError(f"{where} has no weight_decay: fix it (weight_decay=0.1), or search it "
                        "with a grid and tuning=dict(wd_grid=..., wd_step=..., lr_start=...)")
    if 'grid' in spec and 'lr' not in spec and not t['seeds']:
        raise UserError(f"{where} tunes its LR over a grid, on no seeds: declare "
                        "tuning=dict(seeds=(201, 202, 203))")
    check_settings(where, spec.get('settings', {}))


def check_phase(s, phase):
    where = f"{s.path}: phase {phase.get('name')!r}"
    seeds = phase.get('seeds')
    if phase['kind'] != 'tune' and not (isinstance(seeds, (tuple, list)) and seeds
                                        and all(isinstance(x, int) for x in seeds)):
        raise UserError(f"{where}: seeds must be a tuple of integers (seeds=(301, 302)), got "
                        f"{seeds!r}")
    for arm in phase.get('arms', ()):
        spec = s.arm(arm)
        if phase['kind'] == 'climb' and spec.get('weight_decay') is None:
            raise UserError(f"{where}: arm {arm} climbs at no weight_decay: fix it "
                            "(weight_decay=0.1)")
        if phase['kind'] != 'climb' and not phase.get('lr') and not {'lr', 'grid'} & set(spec):
            raise UserError(f"{where}: arm {arm} has neither lr nor grid: fix its LR (lr=2e-3) "
                            "or tune it (grid=(1e-3, 2e-3, 4e-3))")
    if phase['kind'] == 'climb' and not ('above' in phase and isinstance(phase.get('steps'), int)):
        raise UserError(f"{where}: a climb names the LR it starts above and its number of steps "
                        "(above=4e-3, steps=3)")
    check_settings(where, phase.get('settings', {}))
    if phase['kind'] == 'wsd':
        check_wsd(s, phase)


def check_wsd(s, phase):
    """A wsd phase: arms on lr_schedule='wsd', and branches shorter than its stable run."""
    where = f"{s.path}: phase {phase['name']!r}"
    if not isinstance(phase.get('steps'), int) or not all(
            isinstance(b, int) and 0 < b < phase['steps'] for b in phase.get('branches', ())):
        raise UserError(f"{where}: a wsd phase names its stable run's steps and the shorter "
                        "branches off it (steps=38400, branches=(2400, 4800))")
    plain = [a for a in phase['arms'] if s.arm(a).get('settings', {}).get('lr_schedule') != 'wsd']
    if plain:
        raise UserError(f"{where}: arm(s) {', '.join(plain)} do not set lr_schedule='wsd'")


def arms_before(s, arm):
    names = list(s.arms)
    return names[:names.index(arm)]


# -----------------------------------------------------------------------------
# runs and their names

@dataclass(frozen=True)
class Run:
    arm: str
    lr: float
    wd: float
    seed: int  # the init seed and the data seed: both arms of a pair see the same batches
    budget: float = 1.0  # a multiple of the steps, with the schedule's shape kept
    init_std: float = None  # None: the base's
    dtype: str = None  # None: the base's
    tag: str = None  # a repeat of a run under another name (a check on another machine)
    steps: int = None  # max_iters, every other setting the arm's (a wsd budget); None: the arm's
    # (the run's name, step) whose ckpt_<step>.pt this wsd run branches off; it computes the same
    # as the run made from scratch (train.py's test), so it is not part of the name
    source: tuple = field(default=None, compare=False)

    @property
    def name(self):
        extra = ((f"_b{self.budget:g}" if self.budget != 1 else "")
                 + (f"_i{self.steps}" if self.steps else "")
                 + (f"_std{self.init_std:g}" if self.init_std else "")
                 + (f"_{self.dtype}" if self.dtype else "")
                 + (f"_{self.tag}" if self.tag else ""))
        return f"{self.arm}_lr{self.lr:g}_wd{self.wd:g}_s{self.seed}{extra}"


def grid_value(x):
    """A grid value as runs are named: 3 significant digits (2e-3 * sqrt(2) -> 0.00283)."""
    return float(f"{x:.3g}")


def outward(x, grid, step):
    """The next grid value past x outward; None below 0's edge."""
    if x == max(grid):
        return grid_value(x * step)
    return grid_value(x / step) if x > 0 else None


def bracket(losses, step):
    """The value to try next so that the best one is interior, or None once it is (or when it sits
    on 0, the edge of weight decay's domain). losses: {value: final loss}, inf for a diverged
    run."""
    best = min(losses, key=losses.get)
    if min(losses) < best < max(losses):
        return None
    return outward(best, losses, step)


def search(runs_at, grid, step, results, extend, keep=None, margin=0.0):
    """(runs named so far, the value with the lowest mean loss over its runs, or None while one is
    missing); runs_at(value) is the runs at a value, one per selection seed. The grid grows by
    the bracket rule, at most `extend` values. keep: a value that stays selected unless another
    one's mean loss is lower than its own by more than margin (%), what one seed can resolve
    (v6's check of a selection at a longer budget)."""
    values = list(grid)
    while True:
        runs = [r for v in values for r in runs_at(v)]
        losses = {v: [results.get(r.name) for r in runs_at(v)] for v in values}
        if any(None in v for v in losses.values()):
            return runs, None
        means = {v: sum(x) / len(x) for v, x in losses.items()}
        nxt = bracket(means, step)
        if nxt is None or len(values) - len(grid) >= extend:
            return runs, kept(means, keep, margin)
        values.append(nxt)


def kept(means, keep, margin):
    """The value with the lowest mean, or `keep` unless that one beats it by more than margin %."""
    best = min(means, key=means.get)
    if keep is None or means[best] < means[keep] * (1 - margin / 100):
        return best
    return keep


def lr_grid(s, arm, chosen):
    """The arm's starting LR grid: declared, or the selected LR of another arm with its two
    neighbours ({'around': arm}) on the lattice anchor * step^k (so that 1.41e-3 * sqrt(2) is
    named 2e-3, not 1.99e-3); None while that arm is still tuning."""
    grid, t = s.arm(arm).get('grid'), s.tuning_of(arm)
    if not isinstance(grid, dict):
        return tuple(grid)
    if grid['around'] not in chosen:
        return None
    k = round(math.log(chosen[grid['around']][0] / t['anchor']) / math.log(t['step']))
    return tuple(grid_value(t['anchor'] * t['step'] ** (k + i)) for i in (-1, 0, 1))


def tuning_seeds(s, arm):
    return s.tuning_of(arm)['seeds']


def tune(s, arm, results, chosen):
    """(the arm's tuning runs named so far, its (lr, wd) or None while they are not all in). A
    fixed lr is not tuned; a weight decay of None is searched first, at lr_start (v2's design)."""
    spec, t = s.arm(arm), s.tuning_of(arm)
    wd, runs = spec.get('weight_decay'), []
    if spec.get('lr') is not None:
        return [], (spec['lr'], wd)
    if 'grid' not in spec:
        return [], None
    if wd is None:
        wd_runs = lambda v: [Run(arm, t['lr_start'], v, seed) for seed in t['seeds']]
        runs, wd = search(wd_runs, t['wd_grid'], t['wd_step'], results, t['extend'])
        if wd is None:
            return runs, None
    grid = lr_grid(s, arm, chosen)
    if grid is None:
        return runs, None
    lr_runs, lr = search(lambda v: [Run(arm, v, wd, seed) for seed in t['seeds']], grid,
                         t['step'], results, t['extend'], t['keep'], t['margin'])
    runs += [r for r in lr_runs if r not in runs]
    return runs, (None if lr is None else (lr, wd))


def climb_lrs(s, phase, arm, results):
    """A climb's LRs so far: from `above` up by the tuning step; the next one joins once every seed
    of the last has finished and none diverged, at most `steps` of them."""
    lrs, lr = [], phase['above']
    while len(lrs) < phase['steps']:
        lr = grid_value(lr * s.tuning['step'])
        lrs.append(lr)
        losses = [results.get(Run(arm, lr, s.arm(arm)['weight_decay'], seed).name)
                  for seed in phase['seeds']]
        if None in losses or any(math.isinf(x) for x in losses):
            break
    return lrs


@dataclass
class Plan:
    phases: dict  # {phase name: [runs]}, in the order the study declares them
    chosen: dict  # {arm: (lr, wd)} once tuned (or fixed)
    waiting: list  # the arms still tuning
    settings: dict  # {run name: the logging settings of the first phase naming it}
    order: list = ()  # every run named, in the order the study's phase entries name them


def phase_runs(s, phase, results, chosen, tuning):
    arms, kind = phase.get('arms', ()), phase['kind']
    if kind == 'tune':
        return [r for a in arms for r in tuning[a]]
    if kind == 'climb':
        return [Run(a, lr, s.arm(a)['weight_decay'], seed) for a in arms
                for lr in climb_lrs(s, phase, a, results) for seed in phase['seeds']]
    if kind == 'wsd':
        return wsd_runs(s, phase, chosen)
    extra = dict(budget=phase.get('budget', 1.0), init_std=phase.get('init_std'),
                 dtype=phase.get('dtype'), tag=phase.get('tag'))
    factors = phase.get('lr_factors', (1,))
    # seed by seed, so that a phase cut short stays paired
    return [Run(a, chosen[a][0] if f == 1 else grid_value(chosen[a][0] * f), chosen[a][1], seed,
                **extra) for seed in phase['seeds'] for a in arms if a in chosen for f in factors]


def wsd_runs(s, phase, chosen):
    """Seed by seed, each arm's stable run to `steps` and its branches, each off the stable run's
    checkpoint at the step its own cooldown starts (train.cooldown_start); at the phase's lr, or
    the arm's selection once it is tuned."""
    runs = []
    for seed in phase['seeds']:
        for a in (a for a in phase['arms'] if a in chosen or phase.get('lr')):
            lr, wd = phase.get('lr') or chosen[a][0], s.arm(a).get('weight_decay')
            stable = Run(a, lr, wd, seed, steps=steps_name(s, a, phase['steps']))
            runs.append(stable)
            settings = s.arm(a)['settings']
            for b in phase.get('branches', ()):
                start = train.cooldown_start(dict(settings, max_iters=b))
                runs.append(Run(a, stable.lr, stable.wd, seed, steps=steps_name(s, a, b),
                                source=(stable.name, start)))
    return runs


def steps_name(s, arm, steps):
    """steps as a Run names it: None at the arm's own max_iters (the same run as the arm's)."""
    settings = s.arm(arm).get('settings', {})
    own = settings['max_iters'] if 'max_iters' in settings else base_config(s)['max_iters']
    return None if own == steps else steps


def keep_steps(p, run):
    """The steps whose checkpoints the run keeps: where the branches off it start."""
    return tuple(sorted({r.source[1] for r in p.order if r.source and r.source[0] == run.name}))


def plan(s, results):
    """Every run the study names given the results so far."""
    chosen, tuning, waiting = {}, {}, []
    for arm in s.arms:
        tuning[arm], pick = tune(s, arm, results, chosen)
        if pick is not None:
            chosen[arm] = pick
        elif 'grid' in s.arm(arm):
            waiting.append(arm)
    phases, settings, order = {}, {}, []
    for phase in s.phases:
        runs = phase_runs(s, phase, results, chosen, tuning)
        phases.setdefault(phase['name'], []).extend(runs)
        order += runs
        for r in runs:
            settings.setdefault(r.name, phase.get('settings', {}))
    p = Plan({k: list(dict.fromkeys(v)) for k, v in phases.items()}, chosen, waiting, settings,
             list(dict.fromkeys(order)))
    for run in p.order:  # a wsd stable run keeps the checkpoints its branches start from
        keep = keep_steps(p, run)
        if keep:
            settings[run.name] = dict(settings[run.name], keep_checkpoints=keep)
    return p


# -----------------------------------------------------------------------------
# commands

def base_config(s):
    return train.settings(list(s.base))


def arm_args(s, run, base):
    """The arm's settings as --key=value: its variant's model settings at the base geometry (the
    one definition of a variant), then the arm's own."""
    made = variant_settings(s.variant(run.arm), base, train.MODEL_KEYS)
    made.update(s.arm(run.arm).get('settings', {}))
    return [f'--{k}={value_text(v)}' for k, v in made.items()]


def value_text(v):
    """v as --key=value text: a word as it is (--query=identity), anything else as Python."""
    return v if isinstance(v, str) and parse_value(v) == v else repr(v)


def train_args(s, run, base, work, logging=None, init_from='auto'):
    """train.py's arguments for a run: base files, arm, then what the run names (LR, weight decay,
    seed, budget, init std, dtype), then its phase's logging settings (which change what is
    logged, never what is computed: a run's name does not carry them)."""
    args = [*s.base, *arm_args(s, run, base), f'--learning_rate={run.lr!r}',
            f'--min_lr={run.lr / 10!r}', f'--weight_decay={run.wd!r}', f'--seed={run.seed}',
            f'--data_seed={run.seed}', f'--out_dir={work}']
    if run.budget != 1:  # the same schedule shape: warmup and horizon scale with the steps
        at = dict(base, **s.arm(run.arm).get('settings', {}))
        args += [f"--{k}={max(1, round(at[k] * run.budget))}"  # None: lr_decay_iters follows
                 for k in ('max_iters', 'warmup_iters', 'lr_decay_iters') if at[k] is not None]
    if run.steps:
        args.append(f'--max_iters={run.steps}')
    if run.init_std:
        args.append(f'--init_std={run.init_std!r}')
    if run.dtype:
        args.append(f'--dtype={run.dtype}')
    args += [f'--{k}={value_text(v)}' for k, v in (logging or {}).items()]
    return args + [f'--init_from={init_from}']


def work_dir(c, s, run):
    return work_of(c, s, run.name)


def work_of(c, s, name):
    return os.path.normpath(os.path.join(c['work_root'], f'out-{s.name}', name))


def init_from(c, s, run, results):
    """How the run starts now: 'auto' (from scratch, or its own checkpoint), a wsd branch's
    source checkpoint, or None while that checkpoint is still to come. A branch whose source has
    finished without leaving the checkpoint (another machine's) runs from scratch: the same run."""
    if run.source is None or os.path.exists(os.path.join(work_dir(c, s, run), 'ckpt.pt')):
        return 'auto'
    name, step = run.source
    kept = os.path.join(work_of(c, s, name), f'ckpt_{step}.pt')
    if os.path.exists(kept):
        return kept
    return 'auto' if name in results else None


def shell_line(c, s, run, base, logging, start='auto'):
    """One run as a line of shell, from the repository root: it resumes if it was stopped."""
    work = work_dir(c, s, run)
    args = ' '.join(shlex.quote(a) for a in train_args(s, run, base, work, logging, start))
    threads = f"OMP_NUM_THREADS={c['threads']} " if c['threads'] else ''
    w = shlex.quote(work)
    return f"mkdir -p {w} && {threads}python train.py {args} >> {w}/stdout.txt 2> {w}/stderr.txt"


# -----------------------------------------------------------------------------
# committed runs

# A run is committed with its log gzipped: the step lines the tables and figures read are tens of
# megabytes of text over all studies, which would bury the code for a reader (or a tool) that
# reads the tree. A plain log.jsonl reads the same: train.py's own, in a run's work folder, and
# one an older runner committed, until --collect=True compacts it.
PLAIN_LOG, LOG = 'log.jsonl', 'log.jsonl.gz'


def log_file(folder):
    """The path of the run's log in folder, plain or compact; None if it has neither. A plain
    one comes first: compacting writes the compact one before it removes the plain one."""
    paths = [os.path.join(folder, name) for name in (PLAIN_LOG, LOG)]
    return next((p for p in paths if os.path.exists(p)), None)


def commit_log(src, folder):
    """The log at src as folder's log.jsonl.gz, byte for byte once unzipped; a plain log.jsonl
    there is removed once the compact one is whole."""
    with open(src, 'rb') as f:
        write_gzip(os.path.join(folder, LOG), f.read())
    if os.path.exists(os.path.join(folder, PLAIN_LOG)):
        os.remove(os.path.join(folder, PLAIN_LOG))


def compact(root, name):
    """Compact every plain log committed in <root>/<name>/; the folders compacted."""
    plain = [f for f in run_folders(root, name) if os.path.exists(os.path.join(f, PLAIN_LOG))]
    for folder in plain:
        commit_log(os.path.join(folder, PLAIN_LOG), folder)
    return plain


# <root>/<name>/carry/<run>/: a stopped run's checkpoint and log, committed so that the run
# resumes on another machine (lab/study.py --carry=True); never a run of its own
CARRY = 'carry'


def run_folders(root, name):
    """The folders of a study's committed runs, in name order."""
    folder = os.path.join(root, name)
    return [os.path.join(folder, run) for run in sorted(os.listdir(folder)) if run != CARRY
            ] if os.path.isdir(folder) else []


def last_evaluation(folder):
    """The full val loss at max_iters of the run in folder; None unless it got there."""
    config_path, log_path = os.path.join(folder, 'config.json'), log_file(folder)
    if not (os.path.exists(config_path) and log_path):
        return None
    max_iters = read_json(config_path, 'config.json')['max_iters']
    # from the end, parsing only the evaluations: a 32x log has ~4,000 step lines before it
    for line in reversed(read_lines(log_path)):
        if b'"val_loss_full"' not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:  # cut short by a crash, or damaged: read_jsonl tells which
            return next((e['val_loss_full'] for e in reversed(read_jsonl(log_path))
                         if e.get('iter') == max_iters and 'val_loss_full' in e), None)
        if entry.get('iter') == max_iters:
            return entry['val_loss_full']
    return None


def run_finished(folder):
    """Whether folder holds a run that reached its final evaluation (max_iters, full val loss)."""
    return last_evaluation(folder) is not None


def final_loss(folder):
    """The full val loss of a committed run, inf for a diverged one, None if it is not there."""
    if os.path.exists(os.path.join(folder, 'diverged.txt')):
        return math.inf
    return last_evaluation(folder)


def tokens(config):
    """The training tokens of a run with these settings (one process)."""
    return (config['max_iters'] * config['batch_size'] * config['block_size']
            * config['gradient_accumulation_steps'])


def committed(root, name):
    """{run name: (final loss, folder)} of a study's committed runs."""
    found = {}
    for folder in run_folders(root, name):
        loss = final_loss(folder)
        if loss is not None:
            found[os.path.basename(folder)] = (loss, folder)
    return found


def results_of(s, root):
    """({run name: final loss}, {run name: its folder}): this study's committed runs and, where it
    has none of that name, those of the studies it reuses."""
    found = {}
    for name in reversed((s.name, *s.reuse)):
        found.update(committed(root, name))
    return {k: v[0] for k, v in found.items()}, {k: v[1] for k, v in found.items()}


def commit_run(work, dest, error):
    """Copy a finished run's config and its log (gzipped), with a divergence's one-line error,
    into the committed folder; 'finished', 'diverged', or None for a run that stopped early (it
    resumes next time)."""
    diverged = 'non-finite' in error
    if not (run_finished(work) or diverged):
        return None
    os.makedirs(dest, exist_ok=True)
    if os.path.exists(os.path.join(work, 'config.json')):
        with open(os.path.join(work, 'config.json')) as src:
            write_text(os.path.join(dest, 'config.json'), src.read())
    if os.path.exists(os.path.join(work, PLAIN_LOG)):
        commit_log(os.path.join(work, PLAIN_LOG), dest)
    if diverged:
        write_text(os.path.join(dest, 'diverged.txt'), error.strip().splitlines()[-1] + '\n')
    return 'diverged' if diverged else 'finished'


def reused(s, folder, root):
    """Whether a committed run's folder is another study's."""
    return os.path.abspath(os.path.dirname(folder)) != os.path.abspath(os.path.join(root, s.name))


def comparable(config):
    """A run's settings as JSON values, without what names its folder or its W&B run. Runs from
    before the probe setting logged the lab's probes with diagnostics=True, and had
    eval_windows='fixed', the one behaviour there is now: the same settings as today's. A model
    value the code derives (the softmax scale, the MLP width, the query rank, the KV heads, the
    init std) is compared as derived, and the choice it is derived from through it, so a run
    whose config file wrote the value out matches one whose file states the choice; so is the
    cosine's horizon, where lr_decay_iters None leaves it at max_iters."""
    config = json.loads(json.dumps(config))
    derived = derived_model(config)
    if 'lr_decay_iters' in config and config['lr_decay_iters'] is None:
        config['lr_decay_iters'] = config['max_iters']
    for key in ('out_dir', 'init_from', 'model_args', 'params', 'eval_windows', 'wandb_run_name',
                *DERIVED_FROM):
        config.pop(key, None)
    if config.pop('diagnostics', False):
        config.setdefault('probe', 'lab.probes')
    return dict(config, **derived)


# the choices of GPTConfig whose whole effect is a value derived_model returns
DERIVED_FROM = ('attn_scale_factor', 'mlp_ratio', 'query_ratio', 'init_width')


def derived_model(config):
    """The model values GPTConfig derives when they are left None, from the config's model keys
    (the vocabulary does not enter them)."""
    args = {k: config[k] for k in train.MODEL_KEYS if k in config}
    args = upgrade_query(dict(args, query_identity=config.get('query_identity', False)))
    try:
        model = GPTConfig(**dict(args, vocab_size=args.get('vocab_size') or 64))
    except (TypeError, ValueError):
        return {}
    return dict(attn_scale=model.scale, mlp_hidden=model.mlp_hidden,
                query_rank=model.query_rank, n_kv_head=model.n_kv_head, init_std=model.init_std)


def check_reused(s, p, folders, base, root, checked=None):
    """Every planned run found in a reused study must have been run with this study's command: its
    config.json equals the settings the command makes (a setting added to train.py since counts
    as equal when the command leaves it at its default). checked: names already checked."""
    checked = set() if checked is None else checked
    for run in (r for runs in p.phases.values() for r in runs):
        folder = folders.get(run.name)
        if folder is None or not reused(s, folder, root) or run.name in checked:
            continue
        saved = comparable(read_json(os.path.join(folder, 'config.json'), 'config.json'))
        made = comparable(train.settings(train_args(s, run, base, 'x', p.settings[run.name])[:-1]))
        default = comparable(train.DEFAULTS)
        differ = sorted(k for k in made if saved.get(k, default.get(k)) != made[k])
        if differ:
            raise UserError(f"{folder} is reused by {s.name} but was run with other settings "
                            f"({', '.join(differ)}): rename the arm or run it afresh")
        checked.add(run.name)
    return checked


