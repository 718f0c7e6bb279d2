"""The trackers mirror the record across restarts: a resumed run continues its W&B run (its id
kept in the checkpoint) with no step logged twice, and TensorBoard's event files read back as
log.jsonl, a resume after a crash included. Both are optional, with a one-line message."""
import glob
import os
import shutil
import sys
import types

import numpy as np
import pytest

from kvgpt import tracking
from kvgpt.checkpoint import load_checkpoint
from test_train import argv, losses, read_log
import train

CLOCK = ('dt_ms', 'tokens_per_s', 'mfu', 'eta_s', 'eval_s')


def crash_after_a_checkpoint(data_root, out, **kw):
    """A run to iter 20 whose checkpoint is then put back to iter 10, as a crash after step 20
    leaves it (log.jsonl runs on past the checkpoint), and its resume to 20."""
    train.main(argv(data_root, out, max_iters=10, **kw))
    shutil.copy(out / 'ckpt.pt', out / 'ckpt_10.pt')
    train.main(argv(data_root, out, max_iters=20, init_from='resume', **kw))
    shutil.copy(out / 'ckpt_10.pt', out / 'ckpt.pt')
    train.main(argv(data_root, out, max_iters=20, init_from='resume', **kw))


class FakeWandb(types.ModuleType):
    """wandb as the W&B server sees it: runs by id, each with its rows and a summary that a
    resume gets back (offline mode cannot show that)."""

    def __init__(self):
        super().__init__('wandb')
        self.runs, self.inits = {}, []

    def init(self, project, name, config, id, resume):
        id = id or f'id{len(self.runs)}'
        self.inits.append(dict(project=project, name=name, id=id, resume=resume))
        run = self.runs.setdefault(id, types.SimpleNamespace(id=id, rows=[], summary={}))
        run.log = run.rows.append
        run.define_metric = lambda *a, **k: None
        run.finish = lambda: None
        return run


def test_a_resumed_run_continues_its_wandb_run_with_no_step_twice(data_root, tmp_path,
                                                                  monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, 'wandb', fake)
    out = tmp_path / 'my_run'
    crash_after_a_checkpoint(data_root, out, wandb_log=True)
    assert [i['id'] for i in fake.inits] == ['id0'] * 3 and len(fake.runs) == 1
    assert {i['name'] for i in fake.inits} == {'my_run'}  # the default name: the out_dir's
    assert load_checkpoint(out / 'ckpt.pt')['wandb_run_id'] == 'id0'
    rows = fake.runs['id0'].rows
    positions = [tracking.entry_position(e) for e in rows]
    assert positions == sorted(positions) and len({tuple(p) for p in positions}) == len(rows)
    # the run's rows are its record, but for the evaluation at iter 10: W&B keeps the first one,
    # with the full val loss of the run that ended there, which the record's rewrite has not
    first_end = [i for i, e in enumerate(rows) if 'val_loss_full' in e and e['iter'] == 10]
    assert len(first_end) == 1
    rows[first_end[0]].pop('val_loss_full')
    assert losses(rows) == losses(read_log(out))


def test_wandb_that_cannot_start_a_run_is_one_line_and_leaves_no_run(data_root, tmp_path,
                                                                    monkeypatch, command_line):
    """Not logged in, W&B's init raises its own UsageError: one line that says what to do, and
    the out_dir the run would have made is not left behind."""
    UsageError = type('UsageError', (Exception,), {'__module__': 'wandb.errors.errors'})
    fake = FakeWandb()

    def init(**kwargs):
        raise UsageError('No API key configured. Use `wandb login` to log in.')
    fake.init = init
    monkeypatch.setitem(sys.modules, 'wandb', fake)
    code, err = command_line(train, argv(data_root, tmp_path / 'out', wandb_log=True))
    assert code == 2 and err == (
        "error: W&B could not start the run (UsageError: No API key configured. Use `wandb login` "
        "to log in.): log in with `wandb login`, or set WANDB_MODE=offline, or "
        "--wandb_log=False\n")
    assert not (tmp_path / 'out').exists()


def test_wandb_offline_resumes_into_the_same_run_id(data_root, tmp_path, monkeypatch):
    pytest.importorskip('wandb', reason='wandb is in requirements-test.txt')
    for key, value in dict(WANDB_MODE='offline', WANDB_DIR=str(tmp_path), WANDB_SILENT='true',
                           WANDB_CONFIG_DIR=str(tmp_path / 'config')).items():
        monkeypatch.setenv(key, value)
    out = tmp_path / 'out'
    train.main(argv(data_root, out, max_iters=10, wandb_log=True))
    run_id = load_checkpoint(out / 'ckpt.pt')['wandb_run_id']
    train.main(argv(data_root, out, max_iters=20, init_from='resume', wandb_log=True))
    assert load_checkpoint(out / 'ckpt.pt')['wandb_run_id'] == run_id
    runs = sorted(glob.glob(str(tmp_path / 'wandb' / 'offline-run-*')))
    assert len(runs) == 2 and all(r.endswith(f'-{run_id}') for r in runs)
    assert all(os.path.exists(os.path.join(r, f'run-{run_id}.wandb')) for r in runs)


def tensorboard_scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(folder), size_guidance={'scalars': 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()['scalars']}


def test_tensorboard_reads_back_as_log_jsonl_across_a_crash_and_resume(data_root, tmp_path):
    pytest.importorskip('tensorboard', reason='tensorboard is in requirements-test.txt')
    out = tmp_path / 'out'
    crash_after_a_checkpoint(data_root, out, tensorboard_log=True)
    log, scalars = read_log(out), tensorboard_scalars(out / 'tensorboard')
    want = {}
    for e in log:
        for key, value in e.items():
            if key == 'tokens' and want.get(key) and want[key][-1][0] == e['iter']:
                continue  # a step's tokens once, though its log line and evaluation both say it
            if key != 'iter' and isinstance(value, (int, float)):
                want.setdefault(key, []).append((e['iter'], float(np.float32(value))))
    assert set(scalars) == set(want) and 'val_loss_full' in scalars
    steps = [step for step, _ in scalars['tokens']]
    assert len(steps) == len(set(steps))
    for key in want:
        got = [(step, float(np.float32(value))) for step, value in scalars[key]]
        assert got == want[key], key


def test_a_run_started_over_replaces_its_tensorboard_events(data_root, tmp_path):
    pytest.importorskip('tensorboard', reason='tensorboard is in requirements-test.txt')
    out = tmp_path / 'out'
    train.main(argv(data_root, out, tensorboard_log=True))
    train.main(argv(data_root, out, tensorboard_log=True, overwrite=True, learning_rate=3e-3,
                    max_iters=10))
    log, scalars = read_log(out), tensorboard_scalars(out / 'tensorboard')
    assert [step for step, _ in scalars['loss']] == [e['iter'] for e in log if 'loss' in e]
    assert [v for _, v in scalars['loss']] == [float(np.float32(e['loss'])) for e in log
                                               if 'loss' in e]


@pytest.mark.parametrize('setting, module', [('wandb_log', 'wandb'),
                                             ('tensorboard_log', 'torch.utils.tensorboard')])
def test_a_missing_tracker_is_one_line(data_root, tmp_path, monkeypatch, command_line, setting,
                                       module):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    code, err = command_line(train, argv(data_root, tmp_path, **{setting: True}))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f'{setting}=True needs' in err and f'--{setting}=False' in err
