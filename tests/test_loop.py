"""train.py's loop: its collectives named at their call sites, a lone rank's call failing in one
line, and the loop's state saved and restored from one structure."""
import inspect
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
import torch
import torch.distributed as dist

from kvgpt import distributed
from kvgpt.checkpoint import load_checkpoint
from kvgpt.errors import UserError
from kvgpt.signals import Signals
import train
from test_hellaswag import write_items
from test_train import HERE, argv, free_port

# the keys sample.py, the tools and older runs read
CHECKPOINT_KEYS = {'model', 'optimizer', 'model_args', 'config', 'meta', 'wandb_run_id',
                   'iter_num', 'best_val_loss', 'tokens_seen', 'ckpt_is_best', 'rng', 'scaler'}


@dataclass
class Counter:  # loop state with a state_dict(), as the scaler and the RNG have
    count: int = 0

    def state_dict(self):
        return {'count': self.count}

    def load_state_dict(self, saved):
        self.count = saved['count']


def test_a_field_added_to_the_loop_state_alone_is_saved_and_resumed(data_root, tmp_path,
                                                                    monkeypatch):
    @dataclass
    class MoreState(train.LoopState):  # what a change adds: a number and an object
        spikes: int = 0
        ema: Counter = field(default_factory=Counter)
    monkeypatch.setattr(train, 'LoopState', MoreState)
    real_setup = train.setup

    def setup(*args):  # a fresh run sets them; a resume must find them in its checkpoint
        run = real_setup(*args)
        if run.state.iter_num == 0:
            run.state.spikes, run.state.ema.count = 7, 3
        return run
    monkeypatch.setattr(train, 'setup', setup)
    train.main(argv(data_root, tmp_path, max_iters=2, eval_interval=2))
    ckpt = load_checkpoint(str(tmp_path / 'ckpt.pt'))
    assert ckpt.keys() == CHECKPOINT_KEYS | {'spikes', 'ema'}
    assert (ckpt['spikes'], ckpt['ema']) == (7, {'count': 3})
    resumed = train.main(argv(data_root, tmp_path, init_from='resume', max_iters=4,
                              eval_interval=2))
    assert (resumed.state.iter_num, resumed.state.spikes, resumed.state.ema) == (4, 7, Counter(3))


def test_the_docstring_names_every_all_ranks_call_and_each_fails_clearly():
    """Each collective train.py's loop makes is an all_ranks_* call (or signals'), decorated so
    that a lone rank's call fails naming it, and train.py's docstring lists them all."""
    source = inspect.getsource(train)
    used = set(re.findall(r'\ball_ranks_\w+', source.replace(train.__doc__, '')))
    assert {'all_ranks_save', 'all_ranks_evaluate', 'all_ranks_agree_to_stop'} <= used
    assert set(re.findall(r'\ball_ranks_\w+', train.__doc__)) == used
    for name in used:
        function = next(getattr(owner, name) for owner in (train, train.LoopState, Signals)
                        if hasattr(owner, name))
        # @all_ranks; a generator's failures come while its caller iterates, and that caller's
        # @all_ranks names them (all_ranks_share's: all_ranks_evaluate)
        assert hasattr(function, '__wrapped__') or inspect.isgeneratorfunction(function), name


@pytest.mark.xdist_group('torchrun')
def test_every_collective_of_the_loop_is_inside_an_all_ranks_call(data_root, tmp_path,
                                                                   monkeypatch):
    """A run under a process group of one rank makes every collective a DDP run makes: each is
    made inside an all_ranks_* call, or in setup() or the process group's close (once each)."""
    made, outside, once = [], [], {('train.py', 'setup'), ('distributed.py', 'close')}

    def spy(op):
        def call(*args, **kwargs):
            frame, callers = sys._getframe(1), []
            while frame is not None:
                code = frame.f_code
                callers.append((os.path.basename(code.co_filename), code.co_name))
                frame = frame.f_back
            made.append(op.__name__)
            if not any(name.startswith('all_ranks_') or (file, name) in once
                       for file, name in callers):
                outside.append((op.__name__, callers[:3]))
            return op(*args, **kwargs)
        return call
    for name in ('all_reduce', 'all_gather_object'):
        monkeypatch.setattr(distributed, name, spy(getattr(distributed, name)))
    for name in ('all_reduce', 'all_gather_object', 'all_gather', 'broadcast', 'barrier',
                 'reduce', 'gather', 'scatter', 'broadcast_object_list'):
        monkeypatch.setattr(dist, name, spy(getattr(dist, name)))
    for key, value in dict(RANK='0', LOCAL_RANK='0', WORLD_SIZE='1', MASTER_ADDR='127.0.0.1',
                           MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(key, value)
    run = train.main(argv(data_root, tmp_path, max_iters=4, eval_interval=2, log_interval=2,
                          keep_checkpoints=(3,), hellaswag=write_items(tmp_path / 'items.jsonl'),
                          hellaswag_interval=2))
    assert run.process.ddp and not dist.is_initialized() and (tmp_path / 'ckpt_3.pt').exists()
    assert {'all_reduce', 'all_gather_object', 'barrier'} <= set(made) and outside == []


def test_a_collective_timeout_that_is_not_seconds_is_one_line(monkeypatch):
    for key, value in dict(RANK='0', WORLD_SIZE='1', KVGPT_COLLECTIVE_TIMEOUT='5m').items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UserError, match="KVGPT_COLLECTIVE_TIMEOUT must be a number of seconds, "
                                        "got '5m'"):
        distributed.setup_distributed('cpu')
    assert not dist.is_initialized()


def test_an_nccl_rank_binds_its_local_gpu_to_the_process_group(monkeypatch):
    # without device_id NCCL's barrier warns that it uses the current device (docs/gpu.md)
    calls = []
    monkeypatch.setattr(distributed, 'pick_device', lambda device: 'cuda')
    monkeypatch.setattr(torch.cuda, 'set_device', lambda device: calls.append(('set', device)))
    monkeypatch.setattr(distributed, 'restart_store', lambda world: None)
    monkeypatch.setattr(dist, 'init_process_group', lambda **kw: calls.append(('init', kw)))
    for key, value in dict(RANK='9', LOCAL_RANK='1', WORLD_SIZE='12').items():
        monkeypatch.setenv(key, value)
    process = distributed.setup_distributed('cuda')
    assert (process.rank, process.world, process.device) == (9, 12, 'cuda:1')
    assert calls == [('set', 'cuda:1'), ('init', dict(backend='nccl',
                                                      device_id=torch.device('cuda:1')))]
    calls.clear()  # gloo keeps no device
    monkeypatch.setattr(distributed, 'pick_device', lambda device: 'cpu')
    distributed.setup_distributed('cpu')
    assert calls == [('init', dict(backend='gloo'))]


# one rank of two: rank 0 makes the call alone, as under nanoGPT's `if master_process:`; rank 1
# waits in no collective until the test has rank 0's error
LONE_RANK = """
import os, sys
import train
from kvgpt.errors import run_main

def train_loop(run):
    if run.process.master:
        getattr(train, sys.argv[1])(run, *(['alone'] if sys.argv[1] == 'all_ranks_save' else []))
    else:
        sys.stdin.read()
        os._exit(0)

train.train_loop = train_loop
run_main(lambda: train.main(sys.argv[2:]))
"""


@pytest.mark.xdist_group('torchrun')
@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize('call', ['all_ranks_save', 'all_ranks_evaluate'])
def test_a_rank_that_saves_or_evaluates_alone_fails_in_one_line_naming_the_call(
        data_root, tmp_path, call):
    env = dict(os.environ, OMP_NUM_THREADS='1', WORLD_SIZE='2', MASTER_ADDR='127.0.0.1',
               MASTER_PORT=str(free_port()), KVGPT_COLLECTIVE_TIMEOUT='3')
    ranks = [subprocess.Popen([sys.executable, '-c', LONE_RANK, call,
                               *argv(data_root, tmp_path, max_iters=4, dropout=0.0)],
                              cwd=HERE, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    try:
        _, err = ranks[0].communicate(timeout=240)  # a hang guard: by default 30 min
    finally:
        ranks[0].kill()  # if it hung
        ranks[1].communicate(timeout=60)  # closes rank 1's stdin: it leaves
    op = 'all_gather_object' if call == 'all_ranks_save' else 'all_reduce'
    assert ranks[0].returncode == 2 and re.fullmatch(
        rf"error: {call} on rank 0: the other ranks did not join its {op} \(Timed out waiting "
        r"3000ms for \w+ operation to complete\): every rank must make this call, never rank 0 "
        r"alone \(train.py's docstring lists them\)\n", err), err[-3000:]
