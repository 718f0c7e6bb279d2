import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from kvgpt import distributed, files, tracking
from kvgpt.checkpoint import load_checkpoint
from kvgpt.data import Dataset, file_digest, open_dataset
from kvgpt.errors import UserError
from kvgpt.signals import Interrupted
from model import GPT, GPTConfig
import train

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=4,
            gradient_accumulation_steps=2, max_iters=20, eval_interval=10, eval_iters=2,
            log_interval=1, device='cpu', compile=False, dtype='float32', learning_rate=1e-2,
            warmup_iters=2, lr_decay_iters=20, min_lr=1e-3, dropout=0.1)
TORCHRUN = [sys.executable, '-m', 'torch.distributed.run']


def argv(data_root, out_dir, **kw):
    cfg = dict(TINY, dataset='tiny', data_root=data_root, out_dir=str(out_dir))
    cfg.update(kw)
    return [f'--{k}={v}' for k, v in cfg.items()]


def run(data_root, out_dir, **kw):
    train.main(argv(data_root, out_dir, **kw))
    return read_log(out_dir)


def read_log(out_dir):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [json.loads(line) for line in f]


def losses(log):
    """Everything in the log but the wall-clock fields."""
    clock = ('dt_ms', 'tokens_per_s', 'mfu', 'eta_s', 'eval_s')
    return [{k: v for k, v in e.items() if k not in clock} for e in log]


def spy_batches(monkeypatch):
    """The (split, window starts) of every batch the runs in this test read, in order."""
    seen = []
    real = Dataset.batch

    def batch(self, split, starts, *a):
        seen.append((split, starts.tolist()))
        return real(self, split, starts, *a)
    monkeypatch.setattr(Dataset, 'batch', batch)
    return seen


def wait_for_lines(path, n, timeout=120):
    """Until the file at path has n lines (a running train.py's log), or the timeout."""
    deadline = time.time() + timeout
    while time.time() < deadline and (not path.exists() or len(path.read_text().splitlines()) < n):
        time.sleep(0.2)


def final_state(out_dir):
    return load_checkpoint(os.path.join(out_dir, 'ckpt.pt'))['model']


def assert_same_state(a, b, exact=True):
    assert a.keys() == b.keys()
    for k in a:
        if exact:
            assert torch.equal(a[k], b[k]), k
        else:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=2e-5, msg=k)


def test_loss_falls_and_run_dir_has_everything(data_root, tmp_path):
    log = run(data_root, tmp_path, max_iters=40, lr_decay_iters=40, dropout=0.0)
    evals = [e for e in log if 'val_loss' in e]
    assert [e['iter'] for e in evals] == [0, 10, 20, 30, 40]
    assert evals[0]['val_loss'] > 5.0 and evals[-1]['val_loss'] < evals[0]['val_loss'] - 2.0
    steps = [e for e in log if 'loss' in e]
    assert [e['iter'] for e in steps] == list(range(1, 41))
    assert steps[-1]['tokens'] == 40 * 2 * 4 * 32
    assert all(e['mfu'] is None for e in steps)  # no peak on CPU
    ckpt = load_checkpoint(os.path.join(tmp_path, 'ckpt.pt'))  # weights_only=True
    assert ckpt['iter_num'] == 40 and ckpt['config']['n_embd'] == 32
    assert ckpt['meta']['tokenizer'] == 'byte'
    assert json.load(open(tmp_path / 'config.json'))['learning_rate'] == 1e-2


# float16: the GradScaler's state must resume too (CPU float16 takes seconds: not the inner loop)
@pytest.mark.parametrize('dtype', ['float32', pytest.param('float16', marks=pytest.mark.slow)])
def test_resume_is_bit_exact(data_root, tmp_path, dtype):
    full = run(data_root, tmp_path / 'full', dtype=dtype)
    first = run(data_root, tmp_path / 'resumed', max_iters=10, dtype=dtype)
    assert first[-1]['iter'] == 10
    resumed = run(data_root, tmp_path / 'resumed', init_from='resume', dtype=dtype)
    assert losses(resumed) == losses(full)  # every logged loss, bit for bit, with dropout on
    # a scaler restarted from scratch would count 10 steps since growth, not 20
    if dtype == 'float16':
        scalers = [load_checkpoint(str(tmp_path / d / 'ckpt.pt'))['scaler']
                   for d in ('full', 'resumed')]
        assert scalers[0] == scalers[1] and scalers[0]['_growth_tracker'] == 20
    assert_same_state(final_state(tmp_path / 'full'), final_state(tmp_path / 'resumed'))


def test_batches_are_matched_across_variants(data_root, tmp_path, monkeypatch):
    seen = spy_batches(monkeypatch)
    run(data_root, tmp_path / 'a', max_iters=6)
    base, seen[:] = list(seen), []
    run(data_root, tmp_path / 'b', max_iters=6, query='identity', weight_decay=2 ** -5, n_layer=1,
        seed=7)
    # 6 steps x 2 micro-batches, plus the 2 fixed eval batches drawn from the train split
    assert seen == base and len({tuple(o) for s, o in base if s == 'train'}) == 6 * 2 + 2
    seen[:] = []
    run(data_root, tmp_path / 'c', max_iters=6, data_seed=2)
    assert [o for s, o in seen if s == 'train'] != [o for s, o in base if s == 'train']


@pytest.mark.xdist_group('torchrun')
@pytest.mark.long
@pytest.mark.slow
def test_ddp_two_processes_match_one_with_double_accumulation(data_root, tmp_path):
    from test_hellaswag import write_items  # the ranks share HellaSwag's items too
    common = dict(dropout=0.0, max_iters=8, eval_interval=4, lr_decay_iters=8, probe=None,
                  hellaswag=write_items(tmp_path / 'items.jsonl', n=7), hellaswag_interval=4)
    single = run(data_root, tmp_path / 'one', gradient_accumulation_steps=2, **common)
    env = dict(os.environ, OMP_NUM_THREADS='1')
    cmd = [*TORCHRUN, '--standalone', '--nproc_per_node=2', 'train.py',
           *argv(data_root, tmp_path / 'two', gradient_accumulation_steps=2, **common)]
    r = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'tokens per iteration: 256 (2 x 4 x 32, 2 process(es))' in r.stdout
    double = read_log(tmp_path / 'two')
    assert sum('hellaswag_acc' in e for e in double) == 3
    for a, b in zip(losses(single), losses(double), strict=True):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-5) for k in a)
    assert_same_state(final_state(tmp_path / 'one'), final_state(tmp_path / 'two'), exact=False)


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_that_resumes_exactly(data_root, tmp_path):
    long = dict(max_iters=100000, lr_decay_iters=1000, eval_interval=1000, log_interval=1)
    cmd = [sys.executable, 'train.py', *argv(data_root, tmp_path / 'sig', **long)]
    proc = subprocess.Popen(cmd, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    wait_for_lines(tmp_path / 'sig' / 'log.jsonl', 5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]  # not finished: launchers see it
    assert 'stopped by a signal' in out
    stopped_at = load_checkpoint(str(tmp_path / 'sig' / 'ckpt.pt'))['iter_num']
    assert stopped_at >= 4
    end = dict(long, max_iters=stopped_at + 5)
    run(data_root, tmp_path / 'sig', init_from='resume', **end)
    run(data_root, tmp_path / 'straight', **end)
    assert_same_state(final_state(tmp_path / 'sig'), final_state(tmp_path / 'straight'))
    assert losses(read_log(tmp_path / 'sig')) == losses(read_log(tmp_path / 'straight'))


def test_nonfinite_loss_stops_and_keeps_the_good_checkpoint(data_root, tmp_path, monkeypatch):
    run(data_root, tmp_path, max_iters=10)
    good = (tmp_path / 'ckpt.pt').read_bytes()
    real_forward = GPT.forward
    calls = []

    def poisoned(self, idx, targets=None, cache=None):
        logits, loss = real_forward(self, idx, targets, cache)
        calls.append(1)
        return logits, (loss * float('nan') if self.training and len(calls) > 3 else loss)
    monkeypatch.setattr(GPT, 'forward', poisoned)
    with pytest.raises(UserError, match=f"non-finite by iter .*; the last good checkpoint, "
                                        f"{tmp_path}/ckpt.pt, is untouched: .*, or resume"):
        run(data_root, tmp_path, init_from='resume', max_iters=20, log_interval=100)
    assert (tmp_path / 'ckpt.pt').read_bytes() == good
    calls.clear()  # a new run that diverges before its first save has no checkpoint to resume
    with pytest.raises(UserError, match="no checkpoint was saved before it: lower learning_rate "
                                        "or use dtype=bfloat16$"):
        run(data_root, tmp_path / 'new', max_iters=20, log_interval=100)
    assert not (tmp_path / 'new' / 'ckpt.pt').exists()


def test_compiled_checkpoint_loads_into_an_uncompiled_model(data_root, tmp_path, monkeypatch):
    # the eager backend wraps the model exactly as inductor does (an OptimizedModule, whose state
    # dict would carry _orig_mod.) without generating kernels: seconds instead of half a minute on
    # a CPU
    compile_ = torch.compile
    monkeypatch.setattr(torch, 'compile',
                        lambda model, **kw: compile_(model, backend='eager', **kw))
    run(data_root, tmp_path, compile=True, max_iters=2, eval_interval=2, dropout=0.0, n_layer=1)
    ckpt = load_checkpoint(str(tmp_path / 'ckpt.pt'))
    assert not any(k.startswith('_orig_mod.') for k in ckpt['model'])
    model = GPT.from_checkpoint(ckpt, verbose=False)  # strict load into a plain GPT
    fresh = GPT(GPTConfig(**ckpt['model_args']), verbose=False)
    assert model.get_num_params() == fresh.get_num_params()


@pytest.mark.parametrize('kw,message', [
    (dict(learning_rat=1e-3), "unknown config key 'learning_rat' (did you mean 'learning_rate'?)"),
    (dict(batch_size='big'), 'batch_size must be int'),
    (dict(gradient_accumulation_steps=0), 'gradient_accumulation_steps must be positive, got 0'),
    (dict(dataset='nope'), 'no prepared dataset at'),
    (dict(vocab_size=128), "vocab_size 128 is smaller than the dataset's 257"),
    (dict(query='identity', key_identity=True), 'at most one of'),
    (dict(block_size=10 ** 9), 'too few for block_size'),
    (dict(init_from='resume'), 'no checkpoint at'),
    (dict(dtype='float8'), 'dtype must be'),
    (dict(learning_rate=-1), 'learning_rate must not be negative, got -1'),
    (dict(weight_decay=-0.1), 'weight_decay must not be negative, got -0.1'),
    (dict(data_seed=-1), 'data_seed must not be negative, got -1'),
    (dict(beta2=1.5), 'beta2 must be at least 0 and below 1, got 1.5'),
    (dict(max_iters=0), 'max_iters must be positive, got 0'),
    (dict(max_iters=-1), 'max_iters must be positive, got -1'),
    (dict(warmup_iters=-5), 'warmup_iters must not be negative, got -5'),
    (dict(keep_checkpoints='(10,0)'), 'keep_checkpoints must be a tuple of positive steps, got '
                                      '(10, 0)'),
    (dict(min_lr=0.02), 'min_lr 0.02 is above learning_rate 0.01: the schedule would climb to '
                        "it; lower min_lr (the schedule's floor)"),
])
def test_bad_config_fails_clearly(data_root, tmp_path, kw, message):
    with pytest.raises(UserError, match=re.escape(message)):
        run(data_root, tmp_path, **kw)
    assert not os.path.exists(tmp_path / 'config.json')  # nothing written


def test_a_bound_is_checked_where_the_value_is_set_and_names_it(tmp_path):
    """A key's bounds sit in its entry of KEYS (Kind's within): a config file that sets a value
    out of them is named, as a wrong type is."""
    bad = tmp_path / 'bad.py'
    bad.write_text('batch_size = 0\n')
    with pytest.raises(UserError, match=re.escape(f"{bad}: batch_size must be positive, got 0")):
        train.settings([str(bad)])


def test_a_run_that_ends_in_its_warmup_says_so(data_root, tmp_path, capsys):
    """A trial run shorter than the warmup (the default config's 2,000 steps, say) is not
    refused: it is said, with the learning rate it ends at."""
    run(data_root, tmp_path, max_iters=2, eval_interval=2)
    assert ("note: warmup_iters 2 is not below max_iters 2: this run ends in its warmup, at a "
            "learning rate of 0.00667, not its peak 0.01") in capsys.readouterr().out
    run(data_root, tmp_path / 'full', max_iters=3, eval_interval=3)
    assert 'ends in its warmup' not in capsys.readouterr().out


def test_resume_rejects_a_dataset_the_model_cannot_read(data_root, tmp_path):
    run(data_root, tmp_path, max_iters=2, eval_interval=2)
    with pytest.raises(UserError, match="block_size 64 is longer than the model's 32"):
        run(data_root, tmp_path, init_from='resume', block_size=64, max_iters=4)


@pytest.mark.slow
def test_cli_errors_are_one_line(data_root, tmp_path, command_line):
    r = subprocess.run([sys.executable, 'train.py', 'config/nope.py'], cwd=HERE,
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: config file 'config/nope.py' not found (arguments are config files and "
        "--key=value)"]
    code, err = command_line(train, argv(data_root, tmp_path, dataset='missing'))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert 'prepare.py --dataset=missing' in err


# config file: (total params, attention scale, weight decay); the follow-up's: test_experiment
PAPER_CONFIGS = {
    'baseline': (124_373_760, 1 / 8, 0.1),
    'reduced': (117_295_872, 1 / 16, 0.03125),
    'reduced_mlp': (124_373_760, 1 / 16, 0.03125),
    'baseline_small_mlp': (117_295_872, 1 / 8, 0.1),
    'baseline_small': (117_915_816, 62 ** -0.5, 0.1),
    'residual': (124_373_760, 1 / 8, 0.1),
    'residual_gelu': (124_373_760, 1 / 8, 0.1),
    'key_identity': (117_295_872, 1 / 16, 0.03125),
    'value_identity': (117_295_872, 1 / 8, 0.03125),
}


@pytest.mark.parametrize('name', PAPER_CONFIGS)
def test_paper_configs(name):
    c = train.settings([os.path.join(HERE, 'config', f'{name}.py')])
    params, scale, wd = PAPER_CONFIGS[name]
    with torch.device('meta'):
        model = GPT(GPTConfig(**train.model_args_from(c, {'vocab_size': 50257})), verbose=False)
    assert model.get_num_params() == params and model.config.scale == pytest.approx(scale)
    # its comment says so
    assert f'{params:,} parameters' in open(os.path.join(HERE, 'config', f'{name}.py')).read()
    assert c['keep_checkpoints'] == (50000, 100000, 105000)
    assert c['weight_decay'] == wd
    assert c['batch_size'] * c['block_size'] * c['gradient_accumulation_steps'] == 491_520
    schedule = ('learning_rate', 'min_lr', 'warmup_iters', 'lr_decay_iters', 'max_iters')
    assert tuple(c[k] for k in schedule) == (6e-4, 6e-5, 2000, 600_000, 105_002)
    assert c['dtype'] in (None, 'bfloat16')
    assert c['eval_interval'] == 1000 and c['eval_iters'] == 200


def test_demo_config_parses():
    c = train.settings([os.path.join(HERE, 'config', 'cpu', 'demo.py')])
    assert c['dataset'] == 'pydocs' and c['device'] == 'cpu' and c['query'] == 'identity'


def test_lr_schedule():
    c = dict(learning_rate=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=110, decay_lr=True)
    lr = lambda it: train.get_lr(it, c)
    assert lr(0) == pytest.approx(1 / 11) and lr(10) == pytest.approx(1.0)
    assert lr(60) == pytest.approx(0.55) and lr(110) == pytest.approx(0.1)
    assert train.get_lr(500, c) == 0.1


def test_a_cosine_with_lr_decay_iters_none_ends_at_max_iters_wherever_that_is_set():
    """config/cpu/small.py leaves the horizon to max_iters: a later --max_iters moves the cosine's
    end with it, where a number copied from max_iters would leave it behind, at the floor."""
    c = dict(learning_rate=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=None, decay_lr=True,
             max_iters=110)
    assert [train.get_lr(it, c) for it in (10, 60, 110)] == pytest.approx([1.0, 0.55, 0.1])
    longer = train.settings([os.path.join(HERE, 'config', 'cpu', 'small.py'), '--max_iters=4800'])
    assert longer['lr_decay_iters'] is None
    assert train.get_lr(2450, longer) == pytest.approx((longer['learning_rate']
                                                        + longer['min_lr']) / 2)
    assert train.get_lr(4800, longer) == pytest.approx(longer['min_lr'])
    small = train.settings([os.path.join(HERE, 'config', 'cpu', 'small.py')])  # its own 1200 steps
    peak, floor = small['learning_rate'], small['min_lr']
    assert [train.get_lr(it, small) for it in (650, 1200)] == pytest.approx([(peak + floor) / 2,
                                                                            floor])


WSD = dict(learning_rate=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=7, decay_lr=True,
           lr_schedule='wsd', max_iters=100, cooldown_frac=0.2, cooldown_shape='linear')


def test_wsd_schedule_warms_up_holds_the_peak_then_cools_to_min_lr_by_max_iters():
    lr = [train.get_lr(it, WSD) for it in range(100)]
    assert lr[:10] == pytest.approx([(it + 1) / 11 for it in range(10)])  # cosine's warmup
    assert lr[10:80] == [1.0] * 70  # lr_decay_iters plays no part
    assert lr[80:] == pytest.approx([1.0 - 0.9 * k / 20 for k in range(20)])
    assert train.get_lr(100, WSD) == pytest.approx(0.1)  # the end of the cooldown: min_lr
    root = [train.get_lr(it, dict(WSD, cooldown_shape='1-sqrt')) for it in range(80, 100)]
    assert root == pytest.approx([1.0 - 0.9 * (k / 20) ** 0.5 for k in range(20)])
    assert train.get_lr(5000, dict(WSD, decay_lr=False)) == 1.0


def test_a_wsd_branch_has_the_longer_runs_lr_at_every_step_before_its_cooldown():
    """A branch to 2x with a 20% cooldown starts cooling at step 1920: each step before it has the
    32x run's LR, each after it its own, falling linearly from the peak to min_lr."""
    stable, branch = dict(WSD, max_iters=38400), dict(WSD, max_iters=2400)
    assert train.cooldown_start(branch) == 1920 and train.cooldown_start(stable) == 30720
    assert all(train.get_lr(it, branch) == train.get_lr(it, stable) for it in range(1920))
    assert [train.get_lr(it, branch) for it in range(1920, 2400)] == pytest.approx(
        [1.0 - 0.9 * k / 480 for k in range(480)])
    assert train.get_lr(1920, stable) == 1.0 and train.get_lr(2399, branch) < 0.102


def test_a_branch_off_a_kept_checkpoint_equals_the_same_schedule_run_straight_through(
        data_root, tmp_path, capsys):
    """The stable run to 40 steps keeps ckpt_10.pt; a branch from it to 20 steps (its cooldown
    from step 10) matches, bit for bit, the 20-step run made from scratch, dropout on."""
    wsd = dict(lr_schedule='wsd', cooldown_frac=0.5, eval_interval=5)
    run(data_root, tmp_path / 'stable', max_iters=40, keep_checkpoints=(10, 20), **wsd)
    assert sorted(p.name for p in (tmp_path / 'stable').glob('ckpt_*.pt')) == [
        'ckpt_10.pt', 'ckpt_20.pt']
    straight = run(data_root, tmp_path / 'straight', max_iters=20, **wsd)
    kept = str(tmp_path / 'stable' / 'ckpt_10.pt')
    branch = run(data_root, tmp_path / 'branch', max_iters=20, init_from=kept, **wsd)
    assert branch[0]['iter'] == 10  # the branch's log starts at its checkpoint's step
    # every line of the straight run from the evaluation at step 10 on (step 10's own log line is
    # the stable run's), bit for bit
    assert losses(branch) == [e for e in losses(straight) if e['iter'] > 10 or 'val_loss' in e
                              and e['iter'] == 10]
    assert [e['lr'] for e in branch if 'lr' in e][-1] < 1e-2 * 0.2  # it cooled down
    assert_same_state(final_state(tmp_path / 'straight'), final_state(tmp_path / 'branch'))
    assert 'note:' not in capsys.readouterr().out  # the schedules agree before step 10
    with pytest.raises(UserError, match='already holds a checkpoint at iter 20'):
        run(data_root, tmp_path / 'branch', max_iters=20, init_from=kept, **wsd)
    # a branch whose peak differs from its source's before the checkpoint says so
    run(data_root, tmp_path / 'other', max_iters=20, init_from=kept, learning_rate=5e-3, **wsd)
    assert 'was trained with another learning rate at step 0' in capsys.readouterr().out
    # a branch that would start at or past its max_iters would train nothing: refused, out_dir
    # left as it was (not made)
    with pytest.raises(UserError, match=r'ckpt_20.pt is at iter 20, which a branch to '
                       r'--max_iters=20 would not train past: choose an earlier checkpoint'):
        run(data_root, tmp_path / 'none', max_iters=20,
            init_from=str(tmp_path / 'stable' / 'ckpt_20.pt'), **wsd)
    assert not (tmp_path / 'none').exists()


def test_wsd_settings_are_checked_and_documented(capsys):
    with pytest.raises(UserError, match='cooldown_frac must be between 0 and 1, got 1.5'):
        train.settings(['--cooldown_frac=1.5'])
    with pytest.raises(UserError, match="lr_schedule must be one of cosine, wsd, got 'wsdd'"):
        train.settings(['--lr_schedule=wsdd'])
    with pytest.raises(SystemExit):
        train.settings(['--help'])
    text = capsys.readouterr().out
    assert 'warmup-stable-decay' in text and 'cooldown_frac' in text and '1-sqrt' in text


def test_a_signal_during_eval_only_saves_nothing(data_root, tmp_path, monkeypatch):
    run(data_root, tmp_path, max_iters=4, eval_interval=2)
    before = (tmp_path / 'ckpt.pt').read_bytes()

    def interrupted(run):  # SIGTERM in the middle of the evaluation
        os.kill(os.getpid(), signal.SIGTERM)  # the run's handler records it
        raise Interrupted()
    monkeypatch.setattr(train, 'all_ranks_evaluate', interrupted)
    with pytest.raises(SystemExit) as stopped:
        train.main(argv(data_root, tmp_path, max_iters=4, eval_interval=2, init_from='resume',
                        eval_only=True))
    assert stopped.value.code == 128 + signal.SIGTERM
    assert (tmp_path / 'ckpt.pt').read_bytes() == before


def steer(monkeypatch, signal_at=None, worse_at=()):
    """SIGTERM while step signal_at's batches are read; the evaluations at worse_at report a val
    loss 10 higher than measured, so that they do not improve. It replaces the last steer."""
    monkeypatch.undo()
    real_starts, real_evaluate = train.step_starts, train.all_ranks_evaluate

    def step_starts(run_data, c, step):
        if step == signal_at:
            os.kill(os.getpid(), signal.SIGTERM)  # the run's handler records it
        return real_starts(run_data, c, step)

    def evaluate(run):
        losses = real_evaluate(run)
        return dict(losses, val=losses['val'] + 10 * (run.state.iter_num in worse_at))
    monkeypatch.setattr(train, 'step_starts', step_starts)
    monkeypatch.setattr(train, 'all_ranks_evaluate', evaluate)


def test_a_signal_keeps_the_best_checkpoint_when_only_improvements_are_saved(
        data_root, tmp_path, monkeypatch, capsys):
    """always_save_checkpoint=False: ckpt.pt holds the best evaluation's state, and the resume
    point a signal saves must not take it away. It is kept as ckpt_best.pt until an evaluation
    beats it, when ckpt.pt is the best again."""
    keys = dict(max_iters=9, eval_interval=3, always_save_checkpoint=False)
    steer(monkeypatch, signal_at=4)
    with pytest.raises(SystemExit):  # step 3's evaluation is saved, then the signal at step 5
        run(data_root, tmp_path, **keys)
    best, ckpt = tmp_path / 'ckpt_best.pt', tmp_path / 'ckpt.pt'
    assert load_checkpoint(str(best))['iter_num'] == 3
    assert load_checkpoint(str(ckpt))['iter_num'] == 5
    assert f"kept ckpt.pt as {best}: the best evaluation's" in capsys.readouterr().out
    best_bytes = best.read_bytes()
    steer(monkeypatch, worse_at=(6, 9))  # no better evaluation: ckpt.pt stays the resume point
    run(data_root, tmp_path, init_from='resume', **keys)
    assert best.read_bytes() == best_bytes and load_checkpoint(str(ckpt))['iter_num'] == 5
    assert f"sample from the best evaluation's: python sample.py --init_from={best}" in \
        capsys.readouterr().out
    steer(monkeypatch, worse_at=(6,))  # steps 9's and 12's evaluations beat step 3's
    run(data_root, tmp_path, init_from='resume', **dict(keys, max_iters=12))
    assert not best.exists() and load_checkpoint(str(ckpt))['iter_num'] == 12
    steer(monkeypatch, signal_at=4)  # with every evaluation saved, nothing is kept aside
    with pytest.raises(SystemExit):
        run(data_root, tmp_path / 'always', **dict(keys, always_save_checkpoint=True))
    assert not (tmp_path / 'always' / 'ckpt_best.pt').exists()


def test_eval_only_evaluates_and_writes_nothing(data_root, tmp_path, capsys):
    run(data_root, tmp_path, max_iters=10)
    good = (tmp_path / 'ckpt.pt').read_bytes()
    log = run(data_root, tmp_path, init_from='resume', eval_only=True)
    assert 'iter 10: train loss' in capsys.readouterr().out
    assert (tmp_path / 'ckpt.pt').read_bytes() == good
    assert log[-1]['iter'] == 10 and 'val_loss' in log[-1]


def test_resume_survives_a_log_line_cut_short(data_root, tmp_path):
    run(data_root, tmp_path, max_iters=10)
    with open(tmp_path / 'log.jsonl', 'a') as f:
        f.write('{"iter": 11, "lo')  # a crash in the middle of a write
    log = run(data_root, tmp_path, init_from='resume', max_iters=12)
    assert [e['iter'] for e in log][-4:] == [10, 11, 12, 12]


def start_two_ranks(data_root, out):
    """A long two-process run under torchrun, once it has logged a few steps."""
    env = dict(os.environ, OMP_NUM_THREADS='1')
    proc = subprocess.Popen([*TORCHRUN, '--standalone', '--nproc_per_node=2',
                             'train.py', *argv(data_root, out, max_iters=100000,
                                               lr_decay_iters=1000, eval_interval=1000,
                                               dropout=0.0)],
                            cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    wait_for_lines(out / 'log.jsonl', 5)
    return proc


@pytest.mark.xdist_group('torchrun')
@pytest.mark.long
@pytest.mark.slow
def test_sigterm_under_torchrun_saves_once_for_all_ranks(data_root, tmp_path):
    """torchrun forwards SIGTERM to every worker; the ranks agree on one step and rank 0 saves."""
    out = tmp_path / 'ddp'
    proc = start_two_ranks(data_root, out)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=90)
    assert stdout.count('stopped by a signal') == 1 and stdout.count('(signal)') == 1
    ckpt = load_checkpoint(str(out / 'ckpt.pt'))
    assert ckpt['iter_num'] >= 4 and len(ckpt['rng']) == 2
    log = run(data_root, out, init_from='resume', max_iters=ckpt['iter_num'] + 2, dropout=0.0,
              lr_decay_iters=1000, eval_interval=1000)
    assert log[-1]['iter'] == ckpt['iter_num'] + 2


def worker_pid(launcher_pid, rank):
    """The pid of torchrun's worker of this rank (its environment's RANK), from /proc."""
    for entry in os.listdir('/proc'):
        try:
            env = open(f'/proc/{entry}/environ', 'rb').read().split(b'\0')
            stat = open(f'/proc/{entry}/stat').read()
        except (OSError, ValueError):
            continue
        if f'RANK={rank}'.encode() in env and b'TORCHELASTIC_RUN_ID=' in b' '.join(env) \
                and str(launcher_pid) in stat.split(')')[-1].split()[1:2]:
            return int(entry)
    return None


@pytest.mark.xdist_group('torchrun')
@pytest.mark.long
@pytest.mark.slow
def test_sigterm_to_one_worker_stops_every_rank_and_says_which_got_it(data_root, tmp_path):
    """A scheduler that signals one worker: every rank saves and stops, none reports finishing,
    rank 0 names the signal's rank, and the workers exit 128 + the signal."""
    out = tmp_path / 'ddp'
    proc = start_two_ranks(data_root, out)
    os.kill(worker_pid(proc.pid, 1), signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=90)
    assert '(SIGTERM on rank 1); continue with' in stdout, stdout[-2000:]
    assert 'finished at iter' not in stdout and 'SIGTERM on rank 1: saving' in stderr
    assert proc.returncode != 0  # torchrun reports its workers' 143 as a failure
    assert load_checkpoint(str(out / 'ckpt.pt'))['iter_num'] >= 4


@pytest.mark.slow
def test_init_from_a_gpt2_folder(data_root, tmp_path, capsys):
    """GPT-2's weights set the model: settings of another model (config/reduced.py's W_Q = I) are
    named as overridden, and config.json records the model that trained."""
    transformers = pytest.importorskip(
        'transformers', reason='transformers is the optional GPT-2 import dependency')
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=32, vocab_size=50257)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / 'gpt2-tiny')
    run(data_root, tmp_path / 'run', init_from=str(tmp_path / 'gpt2-tiny'), max_iters=2,
        eval_interval=2, dropout=0.0, query='identity')
    args = load_checkpoint(str(tmp_path / 'run' / 'ckpt.pt'))['model_args']
    assert args['activation'] == 'gelu_tanh' and args['bias'] and args['vocab_size'] == 50257
    assert args['query'] == 'linear'
    assert "gpt2-tiny: GPT-2's weights set the model, not n_layer=2, query='identity'\n" in \
        capsys.readouterr().out  # n_head and n_embd are the tiny GPT-2's own
    saved = json.load(open(tmp_path / 'run' / 'config.json'))
    assert (saved['query'], saved['n_layer'], saved['n_embd']) == ('linear', 1, 32)
    with pytest.raises(UserError, match="block_size 64 is longer than the model's 32"):
        run(data_root, tmp_path / 'run2', init_from=str(tmp_path / 'gpt2-tiny'), block_size=64)


# -----------------------------------------------------------------------------
# run management: kept checkpoints, one run per out_dir, ETA, timing, eval windows, diagnostics

def test_keep_checkpoints_writes_exactly_the_steps_asked_for(data_root, tmp_path):
    run(data_root, tmp_path, max_iters=6, eval_interval=3, keep_checkpoints=(2, 5, 99))
    kept = sorted(p.name for p in tmp_path.glob('ckpt_*.pt'))
    assert kept == ['ckpt_2.pt', 'ckpt_5.pt']
    assert [load_checkpoint(str(tmp_path / k))['iter_num'] for k in kept] == [2, 5]
    assert load_checkpoint(str(tmp_path / 'ckpt.pt'))['iter_num'] == 6


def test_step_times_leave_out_a_kept_checkpoints_save(data_root, tmp_path, monkeypatch):
    """A kept checkpoint's save is not a step's time: with a save that takes 100 s on a clock
    that jumps, no logged step time comes near it."""
    offset, real_time, real_save = [0.0], time.time, train.all_ranks_save
    monkeypatch.setattr(time, 'time', lambda: real_time() + offset[0])

    def slow_save(run, reason, name='ckpt.pt'):
        real_save(run, reason, name)
        if reason == 'kept':
            offset[0] += 100

    monkeypatch.setattr(train, 'all_ranks_save', slow_save)
    log = run(data_root, tmp_path, max_iters=12, eval_interval=100, keep_checkpoints=(6,))
    times = [e['dt_ms'] for e in log if e.get('dt_ms')]
    assert len(times) >= 8 and max(times) < 50_000


@pytest.mark.slow
def test_second_run_on_an_out_dir_fails_and_a_killed_run_resumes_at_once(data_root, tmp_path):
    out = tmp_path / 'run'
    long = dict(max_iters=10 ** 5, lr_decay_iters=1000, eval_interval=20)
    first = subprocess.Popen([sys.executable, 'train.py', *argv(data_root, out, **long)],
                             cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (out / 'log.jsonl').exists():
        time.sleep(0.1)
    second = subprocess.run([sys.executable, 'train.py', *argv(data_root, out)], cwd=HERE,
                            capture_output=True, text=True, timeout=120)
    assert first.poll() is None  # still running: the second run met a live lock
    assert second.returncode == 2 and second.stderr.strip().splitlines() == [
        f"error: {out} is in use by train.py (pid {first.pid} on {os.uname().nodename}): "
        "wait for that run, stop it, or choose another --out_dir"]
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=120) == 128 + signal.SIGTERM  # stopped early, not finished
    log = read_log(out)  # clean: each step and evaluation once, in order
    last = log[-1]['iter']
    assert [e['iter'] for e in log if 'loss' in e] == list(range(1, last + 1))
    # a stop after step `last` skips its eval
    assert [e['iter'] for e in log if 'val_loss' in e] == list(range(0, last, 20))
    again = argv(data_root, out, init_from='resume', eval_interval=2, max_iters=10 ** 5,
                 lr_decay_iters=1000)
    killed = subprocess.Popen([sys.executable, 'train.py', *again],
                              cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while time.time() < deadline + 60 and 'saved' not in (killed.stdout.readline() or 'saved'):
        pass
    killed.kill()
    killed.wait()
    saved = load_checkpoint(str(out / 'ckpt.pt'))['iter_num']
    log = run(data_root, out, init_from='resume', max_iters=saved + 1)
    assert 'val_loss' in log[-1]


def test_a_run_removes_what_a_killed_run_left_half_written_under_its_lock(data_root, tmp_path,
                                                                        capsys, command_line):
    from kvgpt.checkpoint import OutDirLock
    run(data_root, tmp_path, max_iters=2, eval_interval=2)
    leftovers = {'ckpt.pt.tmp': 2 ** 20, 'ckpt_4.pt.tmp': 10, 'ckpt_best.pt.tmp': 10,
                 'log.jsonl.tmp': 10}
    theirs = ['notes.tmp', 'ckpt.pt.tmp.bak']  # not a run's: the user's
    lock = OutDirLock(str(tmp_path))  # a live run, writing its temporaries
    for name in [*leftovers, *theirs]:
        (tmp_path / name).write_bytes(b'x' * leftovers.get(name, 1))
    code, err = command_line(train, argv(data_root, tmp_path, init_from='resume', max_iters=4))
    lock.release(started=True)
    assert code == 2 and 'is in use by' in err  # refused, touching none of them
    assert all((tmp_path / name).exists() for name in leftovers)
    capsys.readouterr()
    run(data_root, tmp_path, init_from='resume', max_iters=4)
    said = [line for line in capsys.readouterr().out.splitlines() if 'half-written' in line]
    assert said == [f"removed what a killed run left half-written in {tmp_path}: ckpt.pt.tmp "
                    "(1.0 MiB), ckpt_4.pt.tmp (0.0 MiB), ckpt_best.pt.tmp (0.0 MiB), "
                    "log.jsonl.tmp (0.0 MiB)"]
    assert sorted(f for f in os.listdir(tmp_path) if 'tmp' in f) == sorted(theirs)


class Clock:
    """time for train.py alone: one second per reading, so step times are the same on any
    machine."""
    now = 0.0

    @classmethod
    def time(cls):
        cls.now += 1.0
        return cls.now


def test_eta_is_logged_and_falls_and_warmup_steps_are_not_timed(data_root, tmp_path, capsys,
                                                                monkeypatch):
    monkeypatch.setattr(train, 'time', Clock)  # the step times, and the evaluations' seconds
    log = [e for e in run(data_root, tmp_path, max_iters=10, eval_interval=5) if 'loss' in e]
    warm = tracking.TIMING_WARMUP
    assert [e['dt_ms'] is None for e in log] == [True] * warm + [False] * (10 - warm)
    etas = [e['eta_s'] for e in log[tracking.TIMING_WARMUP:]]
    assert etas[0] > 0 and etas[-1] == 0 and etas[-1] < etas[len(etas) // 2] < etas[0] * 2
    assert ' eta 0m00s' in capsys.readouterr().out
    resumed = [e for e in run(data_root, tmp_path, init_from='resume', max_iters=14)
               if 'loss' in e and e['iter'] > 10]
    # the restart warms up again
    assert [e['dt_ms'] is None for e in resumed] == [True, True, False, False]


def test_eval_windows_are_one_set_for_the_run_and_the_same_across_variants(data_root, tmp_path,
                                                                         monkeypatch):
    seen = spy_batches(monkeypatch)

    def val_windows(**kw):
        seen.clear()
        run(data_root, tmp_path / str(len(os.listdir(tmp_path))), max_iters=4, eval_interval=2,
            probe='lab.probes', **kw)
        # the first is the probes' batch, drawn once
        return [s for split, s in seen if split == 'val'][1:]
    fixed = val_windows()
    assert fixed[0] == fixed[2] == fixed[4]
    assert val_windows(query='nonlinear', seed=3) == fixed


def test_the_probes_hook_logs_them_and_trains_the_same(data_root, tmp_path):
    """probe='lab.probes' runs lab/probes.py at each evaluation (off by default): the probes join
    the log lines and change nothing the run computes."""
    on = run(data_root, tmp_path / 'on', max_iters=10, eval_interval=5, probe='lab.probes')
    off = run(data_root, tmp_path / 'off', max_iters=10, eval_interval=5)
    probes = ('diagnostics', 'induction', 'repeat_loss')
    assert all(k not in e for e in off for k in probes)
    evals = [e for e in on if 'val_loss' in e]
    assert len(evals) == 3
    assert all(len(e['diagnostics']['entropy']) == TINY['n_layer'] for e in evals)
    assert all(len(e['induction']) == TINY['n_layer'] for e in evals)
    strip = lambda log: [{k: v for k, v in e.items() if k not in probes} for e in losses(log)]
    assert strip(on) == strip(off)
    assert_same_state(final_state(tmp_path / 'on'), final_state(tmp_path / 'off'))


@pytest.mark.xdist_group('torchrun')
@pytest.mark.long
@pytest.mark.slow
def test_a_save_failure_on_rank_0_ends_both_ranks(data_root, tmp_path):
    out = tmp_path / 'ddp'
    (out / 'ckpt.pt.tmp').mkdir(parents=True)  # rank 0 cannot write the checkpoint's temp file
    env = dict(os.environ, OMP_NUM_THREADS='1')
    r = subprocess.run([*TORCHRUN, '--standalone', '--nproc_per_node=2', 'train.py',
                        *argv(data_root, out, max_iters=4, eval_interval=2, dropout=0.0)],
                       cwd=HERE, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode != 0
    assert f"error: cannot write {out}/ckpt.pt" in r.stderr
    assert "error: rank 0 could not save" in r.stderr


@pytest.mark.long
@pytest.mark.slow
def test_pydocs_is_prepared_by_the_first_run_that_needs_it(tmp_path):
    """Two runs started together on a data_root without pydocs: one prepares it, once, in one
    line."""
    # few, large batches for the full val loss
    args = lambda name: [sys.executable, 'train.py',
                         *argv(str(tmp_path / 'data'), tmp_path / name, dataset='pydocs',
                               max_iters=1, eval_interval=1, n_layer=1, block_size=128,
                               batch_size=32)]
    procs = [subprocess.Popen(args(n), cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for n in 'ab']
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    said = [line for out, _ in outs for line in out.splitlines()
            if line.startswith('no prepared pydocs')]
    assert said == [f"no prepared pydocs in {tmp_path / 'data'}/: preparing the embedded corpus "
                    "first (offline, ~10 s)"]
    meta = json.loads((tmp_path / 'data' / 'pydocs' / 'meta.json').read_text())
    assert meta['tokenizer'] == 'byte' and meta['train_tokens'] > 2_000_000


# -----------------------------------------------------------------------------
# never lose a finished run: no silent overwrite, init_from='auto', elastic restarts

def run_files(out_dir):
    return {p.name: p.read_bytes() for p in sorted(out_dir.iterdir()) if p.name != '.lock'}


def test_repeating_a_command_is_refused_and_touches_nothing(data_root, tmp_path):
    run(data_root, tmp_path, max_iters=4, eval_interval=2)
    before = run_files(tmp_path)
    with pytest.raises(UserError) as e:
        run(data_root, tmp_path, max_iters=4, eval_interval=2)
    assert str(e.value) == (f"{tmp_path} already holds a checkpoint at iter 4: --init_from=resume "
                            "continues it, --overwrite=True starts over (its log, checkpoints "
                            "and evaluations are replaced)")
    assert run_files(tmp_path) == before


def test_a_start_from_gpt2s_weights_over_a_run_is_refused_too(tmp_path):
    """gpt2..gpt2-xl and a GPT-2 folder are fresh starts like scratch: over a checkpoint they are
    refused before any download or load, and the checkpoint is left as it was."""
    from kvgpt.checkpoint import resolve_init
    (tmp_path / 'ckpt.pt').write_bytes(b'a run')
    (tmp_path / 'gpt2-folder').mkdir()
    for init in ('gpt2', 'gpt2-xl', str(tmp_path / 'gpt2-folder'), 'scratch'):
        c = dict(out_dir=str(tmp_path), init_from=init, overwrite=False)
        with pytest.raises(UserError, match=rf"^{tmp_path} already holds a checkpoint"):
            resolve_init(c, True)
        assert resolve_init(dict(c, overwrite=True), True) == init
    assert resolve_init(dict(c, init_from='resume'), True) == 'resume'
    assert (tmp_path / 'ckpt.pt').read_bytes() == b'a run'


def test_overwrite_starts_over(data_root, tmp_path):
    run(data_root, tmp_path / 'a', max_iters=6, eval_interval=3, learning_rate=3e-2)
    log = run(data_root, tmp_path / 'a', max_iters=4, eval_interval=2, overwrite=True)
    fresh = run(data_root, tmp_path / 'b', max_iters=4, eval_interval=2)
    assert losses(log) == losses(fresh)  # no line of the first run is left
    assert_same_state(final_state(tmp_path / 'a'), final_state(tmp_path / 'b'))


def test_overwrite_leaves_no_kept_checkpoint_of_the_run_it_replaces(data_root, tmp_path):
    """A branch started off a kept checkpoint would otherwise start from the old run, and its
    evaluation (eval.jsonl, hellaswag.json) would sit beside the new run's record."""
    out = tmp_path / 'a'
    run(data_root, out, max_iters=6, eval_interval=3, keep_checkpoints=(2, 4, 5))
    assert sorted(os.listdir(out)).count('ckpt_5.pt') == 1
    run(data_root, out, init_from='resume', eval_only=True)
    (out / 'hellaswag.json').write_text('{"acc": 0.25}')
    # a fresh start that fails before its first checkpoint leaves the old run whole
    with pytest.raises(UserError):
        train.main(argv(data_root, out, max_iters=3, overwrite=True, dataset='no_such_data'))
    assert {'ckpt_2.pt', 'ckpt_4.pt', 'ckpt_5.pt', 'eval.jsonl', 'hellaswag.json'} <= set(
        os.listdir(out))
    run(data_root, out, max_iters=3, eval_interval=3, keep_checkpoints=(2,), overwrite=True)
    assert sorted(f for f in os.listdir(out) if f.startswith('ckpt')) == ['ckpt.pt', 'ckpt_2.pt']
    assert not {'eval.jsonl', 'hellaswag.json'} & set(os.listdir(out))
    assert torch.load(out / 'ckpt_2.pt', weights_only=False)['config']['max_iters'] == 3
    # a branch that starts over its own source's folder keeps the checkpoint it started from
    run(data_root, out, max_iters=6, eval_interval=3, keep_checkpoints=(2, 4), overwrite=True)
    run(data_root, out, max_iters=6, eval_interval=3, keep_checkpoints=(), overwrite=True,
        init_from=str(out / 'ckpt_4.pt'))
    assert sorted(f for f in os.listdir(out) if f.startswith('ckpt')) == ['ckpt.pt', 'ckpt_4.pt']


def test_a_run_that_saved_nothing_does_not_point_to_sample_py(data_root, tmp_path, capsys):
    # only improvements are saved, and at LR 0 the last evaluation equals the first
    log = run(data_root, tmp_path / 'zero', max_iters=2, eval_interval=2, learning_rate=0.0,
              min_lr=0.0, always_save_checkpoint=False)
    assert [e['iter'] for e in log if 'val_loss' in e] == [0, 2]
    assert not (tmp_path / 'zero' / 'ckpt.pt').exists()
    out = capsys.readouterr().out
    assert 'no checkpoint was saved' in out and 'sample.py' not in out
    run(data_root, tmp_path / 'two', max_iters=2, eval_interval=2)
    assert 'sample from it: python sample.py' in capsys.readouterr().out


def test_auto_starts_from_scratch_then_resumes_exactly(data_root, tmp_path, capsys):
    log = run(data_root, tmp_path / 'auto', init_from='auto', max_iters=10)
    assert log[0]['iter'] == 0 and 'no checkpoint in' in capsys.readouterr().out
    log = run(data_root, tmp_path / 'auto', init_from='auto', max_iters=20)
    out = capsys.readouterr().out
    assert 'resuming from' in out and 'note:' not in out  # lr_decay_iters fixes the schedule
    straight = run(data_root, tmp_path / 'straight', max_iters=20)
    assert losses(log) == losses(straight)
    assert_same_state(final_state(tmp_path / 'auto'), final_state(tmp_path / 'straight'))


def test_a_resume_that_stretches_the_cosine_says_so(data_root, tmp_path, capsys):
    """With the cosine's horizon at max_iters, a resume with a larger max_iters changes the LR of
    steps already trained: the run goes on, saying from which step the schedules part."""
    run(data_root, tmp_path / 'run', max_iters=4, eval_interval=2, lr_decay_iters=None)
    capsys.readouterr()
    log = run(data_root, tmp_path / 'run', init_from='resume', max_iters=8, eval_interval=2,
              lr_decay_iters=None)
    assert log[-1]['iter'] == 8
    assert ('was trained with another learning rate at step 3 (0.0055 against 0.0094 here): '
            'this resumed run is not the run its settings would make from scratch'
            in capsys.readouterr().out)
    # an evaluation trains nothing, so it has no schedule to warn of
    run(data_root, tmp_path / 'run', init_from='resume', max_iters=16, eval_only=True,
        eval_interval=2, lr_decay_iters=None)
    assert 'note:' not in capsys.readouterr().out


def test_the_schedule_note_prints_the_learning_rates_as_far_as_they_differ(capsys):
    """Stretched from 300 to 350 steps, the cosine's step 26 differs in the fifth digit."""
    c = dict(train.DEFAULTS, learning_rate=2e-3, min_lr=2e-4, warmup_iters=25,
             lr_decay_iters=None, init_from='resume')
    train.check_schedule(dict(c, max_iters=300), dict(c, max_iters=350), 300, 'out/ckpt.pt')
    assert 'at step 26 (0.0019999 against 0.002 here)' in capsys.readouterr().out


@pytest.mark.parametrize('how', ['fewer tokens', 'the same size'])
def test_resume_on_other_data_is_refused(data_root, tmp_path, how):
    run(data_root, tmp_path / 'run', max_iters=2, eval_interval=2)
    other = tmp_path / 'data' / 'tiny'
    shutil.copytree(os.path.join(data_root, 'tiny'), other)
    meta = json.loads((other / 'meta.json').read_text())
    tokens, n = np.fromfile(other / 'train.bin', dtype=meta['dtype']), meta['train_tokens']
    if how == 'fewer tokens':  # re-prepared from less text
        tokens, why = tokens[:n // 2], rf"train_tokens {n} != {n // 2}"
    else:  # the same tokens in another order: only the content tells
        tokens, why = tokens[::-1], rf"train.bin's content differs \(the same {n:,} tokens\)"
    tokens.tofile(other / 'train.bin')  # re-prepared: meta.json records the new bin
    meta.update(train_tokens=len(tokens),
                digests=dict(meta['digests'], train=file_digest(other / 'train.bin')))
    (other / 'meta.json').write_text(json.dumps(meta))
    with pytest.raises(UserError, match=rf"ckpt.pt was trained on other data than "
                                        rf"{tmp_path / 'data'}/tiny \({why}\)"):
        run(str(tmp_path / 'data'), tmp_path / 'run', init_from='auto', max_iters=4)
    if how == 'the same size':  # a meta.json written before digests were recorded: counts alone
        shutil.copy(os.path.join(data_root, 'tiny', 'train.bin'), other / 'train.bin')
        del meta['digests']
        (other / 'meta.json').write_text(json.dumps(meta))
        assert run(str(tmp_path / 'data'), tmp_path / 'run', init_from='auto', max_iters=4)


def prepare_other(root, text):
    """A byte-level dataset 'other' under root, of other text than 'tiny'."""
    import prepare
    root.mkdir(parents=True, exist_ok=True)
    source = root / 'other.jsonl'
    source.write_text(''.join(json.dumps({'text': text[i:i + 500]}) + '\n'
                              for i in range(0, len(text), 500)))
    prepare.prepare(dict(prepare.DEFAULTS, dataset=str(source), tokenizer='byte', num_proc=1,
                         data_root=str(root), progress=False))
    return str(root)


def test_finetune_takes_only_the_weights_onto_other_data(data_root, tmp_path, capsys):
    """A fine-tune starts at iter 0 with a fresh AdamW and its own dropout on data the checkpoint
    was not trained on; a branch (finetune=False) there is refused with advice that applies."""
    run(data_root, tmp_path / 'pre', max_iters=6, eval_interval=6)
    other = prepare_other(tmp_path / 'data', "Fine-tuning text, unlike the stdlib's docs. " * 400)
    pre = str(tmp_path / 'pre' / 'ckpt.pt')
    with pytest.raises(UserError, match=re.escape(
            f"resume on the data it was trained on; to train its weights on this data, "
            f"--init_from={pre} --finetune=True with a new out_dir")):
        run(other, tmp_path / 'branch', dataset='other', init_from=pre, max_iters=8)
    capsys.readouterr()
    # learning rate 0: AdamW moves nothing, so the weights that come out are the ones that went in
    log = run(other, tmp_path / 'ft', dataset='other', init_from=pre, finetune=True, max_iters=4,
              eval_interval=2, dropout=0.0, n_layer=3, learning_rate=0.0, min_lr=0.0)
    assert f"fine-tuning {pre} (trained to iter 6) from iter 0 with a fresh adamw; its weights " \
           "set the model, not n_layer=3\n" in capsys.readouterr().out
    assert [e['iter'] for e in log if 'val_loss' in e] == [0, 2, 4]
    ft = load_checkpoint(str(tmp_path / 'ft' / 'ckpt.pt'))
    assert ft['iter_num'] == 4 and ft['tokens_seen'] == 4 * 2 * 4 * 32
    assert {s['step'].item() for s in ft['optimizer']['state'].values()} == {4}  # not 6 + 4
    assert (ft['model_args']['n_layer'], ft['model_args']['dropout']) == (2, 0.0)
    assert ft['meta']['train_tokens'] != load_checkpoint(pre)['meta']['train_tokens']
    assert_same_state(ft['model'], final_state(tmp_path / 'pre'))
    saved = json.load(open(tmp_path / 'ft' / 'config.json'))
    assert (saved['finetune'], saved['init_from'], saved['n_layer']) == (True, pre, 2)


def test_finetune_refuses_another_tokenizer_and_a_start_from_scratch(data_root, tmp_path):
    run(data_root, tmp_path / 'pre', max_iters=2, eval_interval=2)
    ckpt = load_checkpoint(str(tmp_path / 'pre' / 'ckpt.pt'))
    ckpt['meta'] = dict(ckpt['meta'], tokenizer='gpt2')  # as if trained on GPT-2 BPE ids
    torch.save(ckpt, tmp_path / 'bpe.pt')
    with pytest.raises(UserError, match=re.escape(
            f"bpe.pt was trained on gpt2 tokens, and {data_root}/tiny holds byte ones: prepare "
            "the data with --tokenizer=gpt2")):
        run(data_root, tmp_path / 'ft', init_from=str(tmp_path / 'bpe.pt'), finetune=True)
    for init_from in ('scratch', 'auto'):  # auto: no checkpoint in out_dir to resume
        with pytest.raises(UserError, match="finetune=True takes its weights from init_from"):
            run(data_root, tmp_path / 'ft', finetune=True, init_from=init_from)
    with pytest.raises(UserError, match=re.escape(
            f"{tmp_path / 'pre'} is a run folder: fine-tune its checkpoint with "
            f"--init_from={tmp_path / 'pre' / 'ckpt.pt'}")):
        run(data_root, tmp_path / 'ft', finetune=True, init_from=str(tmp_path / 'pre'))


def test_a_finetune_into_its_own_runs_folder_is_refused_like_any_fresh_start(data_root,
                                                                              tmp_path):
    """A branch off out_dir's own ckpt.pt continues the run; a fine-tune of it would start over
    and drop its record and kept checkpoints."""
    run(data_root, tmp_path, max_iters=4, eval_interval=2, keep_checkpoints=(2,))
    before = run_files(tmp_path)
    with pytest.raises(UserError, match="already holds a checkpoint at iter 4: --init_from=res"):
        run(data_root, tmp_path, init_from=str(tmp_path / 'ckpt.pt'), finetune=True, max_iters=6)
    assert run_files(tmp_path) == before


def change_in_place(path, offset=100):
    """One token of the bin at path changed where it is (its low byte, so still an id of the byte
    vocabulary), and the modification time put back, as `cp -p` or `rsync -a --inplace` leave a
    file: the size and mtime are as before."""
    info = os.stat(path)
    with open(path, 'r+b') as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([(byte + 1) % 256]))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == info.st_mtime_ns and os.path.getsize(path) == info.st_size


def change_data(data_dir, source, how):
    """Truncate train.bin in place, change it in place keeping its size and mtime, or prepare
    another corpus (the same one twice over, so every window the run draws is still there to
    read) into the same folder, as a user might while a run reads it."""
    import prepare
    if how == 'truncated':
        return os.truncate(data_dir / 'train.bin', os.path.getsize(data_dir / 'train.bin') // 2)
    if how == 'in place, mtime kept':
        return change_in_place(data_dir / 'train.bin')
    more = data_dir.parent / 'more.jsonl'
    more.write_text(open(source).read() * 2)
    prepare.prepare(dict(prepare.DEFAULTS, dataset=str(more), tokenizer='byte', num_proc=1,
                         data_root=str(data_dir.parent), out_name=data_dir.name, force=True,
                         progress=False))


@pytest.mark.parametrize('how,change', [
    ('truncated', r'train.bin now has [\d,]+ bytes, not [\d,]+'),
    ('in place, mtime kept', 'train.bin was written to'),
    ('re-prepared', 'train.bin was replaced by another file')],
    ids=['truncated', 'in place', 're-prepared'])
def test_a_run_whose_data_changes_under_it_stops_in_one_line(data_root, tmp_path, monkeypatch,
                                                            command_line, how, change):
    data = tmp_path / 'data' / 'tiny'
    shutil.copytree(os.path.join(data_root, 'tiny'), data)
    real_starts = train.step_starts

    def step_starts(run_data, c, step):  # the data changes before step 6's batches are read
        if step == 6:
            change_data(data, os.path.join(data_root, 'docs.jsonl'), how)
        return real_starts(run_data, c, step)
    monkeypatch.setattr(train, 'step_starts', step_starts)
    out = tmp_path / 'run'
    code, err = command_line(train, argv(str(tmp_path / 'data'), out, max_iters=8,
                                         eval_interval=4))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert re.match(rf"error: {data} changed under this run \({change}\): stopped", err)
    # nothing from the changed data is saved: the checkpoint is step 4's, and step 8's save,
    # the first after the change, stopped the run
    assert load_checkpoint(str(out / 'ckpt.pt'))['iter_num'] == 4
    assert max(e['iter'] for e in read_log(out)) <= 8


@pytest.mark.xdist_group('torchrun')
@pytest.mark.long
@pytest.mark.slow
def test_data_changed_under_a_ddp_run_stops_every_rank_at_its_next_save(data_root, tmp_path):
    """Every rank asks its own files before a save, and the ranks agree: both stop with the one
    line, none waits for the other, and the checkpoint stays the last one before the change."""
    data = tmp_path / 'data' / 'tiny'
    shutil.copytree(os.path.join(data_root, 'tiny'), data)
    # a probe (rank 0's evaluation hook) that changes train.bin in place at the third evaluation
    (tmp_path / 'changer.py').write_text(
        "import os\n"
        "calls = []\n"
        "def probe(data, c, device):\n"
        "    def hook(model):\n"
        "        calls.append(1)\n"
        "        if len(calls) == 3:\n"
        f"            with open({str(data / 'train.bin')!r}, 'r+b') as f:\n"
        "                f.seek(100); b = f.read(1)[0]; f.seek(100); f.write(bytes([b ^ 1]))\n"
        "        return {}\n"
        "    return hook\n")
    out = tmp_path / 'ddp'
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(tmp_path))
    r = subprocess.run([*TORCHRUN, '--standalone', '--nproc_per_node=2', 'train.py',
                        *argv(str(data.parent), out, max_iters=8, eval_interval=2, dropout=0.0,
                              probe='changer')],
                       cwd=HERE, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode != 0
    said = [line for line in r.stderr.splitlines() if line.startswith('error: ')]
    assert len(said) == 2 and all(re.match(
        rf"error: {data} changed under this run \(train.bin was written to\): stopped", line)
        for line in said), r.stderr[-2000:]
    assert load_checkpoint(str(out / 'ckpt.pt'))['iter_num'] == 2


def test_a_resume_after_a_change_in_place_is_refused_in_one_line(data_root, tmp_path,
                                                                 command_line):
    """The bins are read whole at a resume and compared with the digests meta.json (and the
    checkpoint) record: a change that kept the size and the mtime is caught there too."""
    data = tmp_path / 'data' / 'tiny'
    shutil.copytree(os.path.join(data_root, 'tiny'), data)
    out = tmp_path / 'run'
    run(str(data.parent), out, max_iters=2, eval_interval=2)
    change_in_place(data / 'val.bin', offset=10)
    code, err = command_line(train, argv(str(data.parent), out, init_from='resume', max_iters=4))
    assert code == 2 and err == (
        f"error: {data}/val.bin is not the file its meta.json records (its bytes were changed in "
        f"place since it was prepared), so not the data {out}/ckpt.pt was trained on: put back "
        "that data and resume, or prepare again with --force=True and train in a new out_dir\n")
    assert load_checkpoint(str(out / 'ckpt.pt'))['iter_num'] == 2


def test_a_truncated_checkpoint_is_one_line_and_not_replaced_by_scratch(data_root, tmp_path):
    run(data_root, tmp_path, max_iters=2, eval_interval=2)
    good = (tmp_path / 'ckpt.pt').read_bytes()
    (tmp_path / 'ckpt.pt').write_bytes(good[:len(good) // 2])
    for init in ('auto', 'resume'):
        with pytest.raises(UserError, match=rf"^cannot read checkpoint {tmp_path}/ckpt.pt \(.*"
                                            r"\): it is damaged, cut short or not a checkpoint; "
                                            r"use another"):
            run(data_root, tmp_path, init_from=init, max_iters=4)
    with pytest.raises(UserError, match='already holds a checkpoint \\(unreadable\\)'):
        run(data_root, tmp_path, max_iters=4)
    assert (tmp_path / 'ckpt.pt').read_bytes() == good[:len(good) // 2]


def test_a_file_cut_short_under_a_run_stops_its_next_read_in_one_line(data_root, tmp_path):
    shutil.copytree(os.path.join(data_root, 'tiny'), tmp_path / 'tiny')
    data = open_dataset(str(tmp_path), 'tiny', 32)
    n = data.tokens('train')
    data.read('train', n - 100, n)
    os.truncate(tmp_path / 'tiny' / 'train.bin', n)  # half its bytes, as uint16
    with pytest.raises(UserError, match=rf"^{tmp_path / 'tiny'} changed under this run "
                                        rf"\(train.bin now has {n:,} bytes, not {2 * n:,}\)"):
        data.read('train', n - 100, n)


def test_a_prepare_under_a_run_leaves_its_batches_as_they_were(data_root, tmp_path):
    """The files stay open: the swapped-out dataset is still what the run reads, and changed()
    (which every save asks first) names the replacement."""
    shutil.copytree(os.path.join(data_root, 'tiny'), tmp_path / 'tiny')
    data = open_dataset(str(tmp_path), 'tiny', 32)
    starts = data.starts('train', 4, 0, 1)
    before = data.batch('train', starts)
    assert data.changed() is None
    change_data(tmp_path / 'tiny', os.path.join(data_root, 'docs.jsonl'), 're-prepared')
    assert all(torch.equal(a, b) for a, b in zip(before, data.batch('train', starts)))
    assert "(train.bin was replaced by another file)" in data.changed()
    data.close()


DAMAGES = [  # (key, value, None: removed, what the one line says)
    ('iter_num', None, "has no 'iter_num'"),
    ('best_val_loss', None, "has no 'best_val_loss'"),
    ('iter_num', '2', r"is damaged: its 'iter_num' is a str \('2'\), not an int"),
    ('best_val_loss', 'low', "its 'best_val_loss' is a str .*, not a number"),
    ('optimizer', [], "its 'optimizer' is a list .*, not a dict"),
    ('rng', 'seed', "its 'rng' is a str .*, not a list of RNG states"),
    ('tokens_seen', 1.5, "its 'tokens_seen' is a float .*, not an int or None"),
    ('ckpt_is_best', 'yes', "its 'ckpt_is_best' is a str .*, not True or False"),
    ('meta', 'byte', "its 'meta' is a str .*, not a dict or None"),
]


def test_a_damaged_checkpoint_key_is_one_line_naming_it(data_root, tmp_path, command_line):
    """Every key a resume reads, checked on load; sample.py needs fewer and still loads."""
    import sample
    run(data_root, tmp_path, max_iters=2, eval_interval=2)
    path = tmp_path / 'ckpt.pt'
    good = torch.load(path, weights_only=True)
    for key, value, message in DAMAGES:
        ckpt = dict(good)
        if value is None:
            del ckpt[key]
        else:
            ckpt[key] = value
        torch.save(ckpt, path)
        code, err = command_line(train, argv(data_root, tmp_path, init_from='resume',
                                             max_iters=4))
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert re.match(rf"error: {path} (is damaged: .*)?{message}", err), err
        if key != 'meta':  # the tokenizer sample.py decodes with
            sample.load_model(dict(sample.DEFAULTS, out_dir=str(tmp_path)))


def children(pid):
    """The pids whose parent is pid (the workers torchrun starts)."""
    found = []
    for entry in os.listdir('/proc'):
        try:
            with open(f'/proc/{entry}/stat') as f:
                if entry.isdigit() and int(f.read().rsplit(')', 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.mark.xdist_group('torchrun')
@pytest.mark.long
@pytest.mark.slow
def test_a_killed_worker_is_restarted_by_torchrun_and_costs_nothing(data_root, tmp_path):
    """torchrun --max-restarts reruns the same command after a worker is SIGKILLed;
    init_from='auto' resumes from the last checkpoint and the run ends bit-identical to an
    uninterrupted one. One restart is all it may take: the restarted round must reconnect at once
    (distributed.restart_store)."""
    env = dict(os.environ, OMP_NUM_THREADS='1')
    settings = dict(dropout=0.0, max_iters=120, lr_decay_iters=120, eval_interval=40,
                    probe=None, init_from='auto', log_interval=10)

    def torchrun(out):
        return subprocess.Popen([*TORCHRUN, '--standalone', '--nproc_per_node=2',
                                 '--max-restarts=1', 'train.py',
                                 *argv(data_root, out, **settings)],
                                cwd=HERE, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    killed = torchrun(tmp_path / 'killed')
    deadline = time.time() + 120
    while time.time() < deadline and not (tmp_path / 'killed' / 'ckpt.pt').exists():
        time.sleep(0.05)
    workers = children(killed.pid)
    assert len(workers) == 2 and killed.poll() is None
    os.kill(workers[1], signal.SIGKILL)
    out, err = killed.communicate(timeout=240)
    assert killed.returncode == 0, err[-3000:]
    # the restart came from a checkpoint
    assert 'resuming from' in out and re.search(r'starting at iter (40|80)\b', out)
    straight = torchrun(tmp_path / 'straight')
    assert straight.wait(timeout=240) == 0
    a, b = read_log(tmp_path / 'killed'), read_log(tmp_path / 'straight')
    assert losses(a) == losses(b)  # every step and evaluation once, in order, and the same numbers
    assert [e['iter'] for e in a if 'loss' in e] == list(range(10, 121, 10))
    assert_same_state(final_state(tmp_path / 'killed'), final_state(tmp_path / 'straight'))


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def two_nodes(data_root, out, port, env, **kw):
    """Two torchrun agents on this machine, one gloo process each, meeting by c10d rendezvous at
    127.0.0.1:port: the code path of two hosts."""
    cmd = [*TORCHRUN, '--nnodes=2', '--nproc_per_node=1',
           '--rdzv-backend=c10d', f'--rdzv-endpoint=127.0.0.1:{port}', '--max-restarts=1',
           'train.py', *argv(data_root, out, **kw)]
    return [subprocess.Popen(cmd, cwd=HERE, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
            for _ in range(2)]


def finish(agents, timeout=240):
    results = [a.communicate(timeout=timeout) for a in agents]
    assert [a.returncode for a in agents] == [0, 0], [e[-2000:] for _, e in results]
    return ''.join(o for o, _ in results)


MULTI = dict(dropout=0.0, max_iters=60, lr_decay_iters=60, eval_interval=20, probe=None,
             init_from='auto', log_interval=10, gradient_accumulation_steps=2)
LONG_MULTI = dict(MULTI, max_iters=120, lr_decay_iters=120, eval_interval=40)


ONE_THREAD = dict(os.environ, OMP_NUM_THREADS='1')


@pytest.fixture
def one_thread():
    """The workers run on one thread each, and so must the one-process reference: BLAS kernels on
    two threads round differently, while one process and two nodes on one thread agree bit for
    bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.long
@pytest.mark.slow
def test_two_nodes_train_like_one_process_and_a_resume_on_one_process_continues_them(
        data_root, tmp_path, one_thread):
    finish(two_nodes(data_root, tmp_path / 'two', free_port(), ONE_THREAD, **MULTI))
    one = run(data_root, tmp_path / 'one', **MULTI)
    assert losses(read_log(tmp_path / 'two')) == losses(one)  # gradient norms included
    assert_same_state(final_state(tmp_path / 'two'), final_state(tmp_path / 'one'))
    # two nodes stop at step 40; one process resumes their checkpoint and ends as if it had run
    # alone
    finish(two_nodes(data_root, tmp_path / 'moved', free_port(), ONE_THREAD,
                     **dict(MULTI, max_iters=40)))
    run(data_root, tmp_path / 'moved', **dict(MULTI, init_from='resume'))
    assert losses(read_log(tmp_path / 'moved')) == losses(one)
    assert_same_state(final_state(tmp_path / 'moved'), final_state(tmp_path / 'one'))


def kill_one_node_and_finish(data_root, out, env):
    """Two nodes; the worker of the second is SIGKILLed after the first checkpoint. Returns their
    output."""
    agents = two_nodes(data_root, out, free_port(), env, **LONG_MULTI)
    deadline = time.time() + 120
    while time.time() < deadline and not (out / 'ckpt.pt').exists():
        time.sleep(0.05)
    workers = children(agents[1].pid)
    assert len(workers) == 1 and agents[1].poll() is None
    os.kill(workers[0], signal.SIGKILL)
    return finish(agents)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize('fresh_store', [False, True],
                         ids=['shared_store', 'TORCH_DISABLE_SHARE_RDZV_TCP_STORE'])
def test_a_killed_worker_on_one_node_is_restarted_and_costs_nothing(data_root, tmp_path,
                                                                    fresh_store, one_thread):
    """With torchrun's shared store (the default) the ranks count their rounds in it
    (distributed.restart_store); with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 each round has a fresh
    one."""
    env = {k: v for k, v in ONE_THREAD.items() if k != 'TORCH_DISABLE_SHARE_RDZV_TCP_STORE'}
    if fresh_store:
        env['TORCH_DISABLE_SHARE_RDZV_TCP_STORE'] = '1'
    out = kill_one_node_and_finish(data_root, tmp_path / 'killed', env)
    assert 'resuming from' in out and re.search(r'starting at iter (40|80)\b', out)
    straight = run(data_root, tmp_path / 'straight', **LONG_MULTI)
    a = read_log(tmp_path / 'killed')
    # every step and evaluation once, in order, the same numbers
    assert losses(a) == losses(straight)
    assert [e['iter'] for e in a if 'loss' in e] == list(range(10, 121, 10))
    assert_same_state(final_state(tmp_path / 'killed'), final_state(tmp_path / 'straight'))


def test_each_torchrun_restart_gets_keys_of_its_own(monkeypatch, capsys):
    """The agent's store outlives a restart; the process group's keys must not (pytorch#135712)."""
    import torch.distributed as dist
    server = dist.TCPStore('127.0.0.1', 0, 1, is_master=True)
    monkeypatch.setenv('MASTER_ADDR', '127.0.0.1')
    monkeypatch.setenv('MASTER_PORT', str(server.port))
    monkeypatch.setenv('TORCHELASTIC_USE_AGENT_STORE', 'True')
    monkeypatch.setenv('TORCHELASTIC_RESTART_COUNT', '2')
    monkeypatch.setenv('TORCHELASTIC_MAX_RESTARTS', '3')
    monkeypatch.setenv('RANK', '0')
    distributed.restart_store(2).set('rank_0', 'addr')
    assert server.get('kvgpt/restart_2/rank_0') == b'addr' and not server.check(['rank_0'])
    # across nodes the agents' restart counts can differ: the ranks count their rounds in the store
    monkeypatch.setenv('GROUP_WORLD_SIZE', '2')
    # two rounds of world 2, whatever the counts say
    rounds = [distributed.restart_store(2) for _ in range(4)]
    for i, store in enumerate(rounds):
        store.set(f'rank_{i % 2}', f'round {i // 2}')
    assert [server.get(f'kvgpt/restart_{r}/rank_{i}') for r in (0, 1) for i in (0, 1)] == [
        b'round 0', b'round 0', b'round 1', b'round 1']
    assert capsys.readouterr().out == ''  # nothing to warn about
    # a fresh store per restart already
    monkeypatch.setenv('TORCHELASTIC_USE_AGENT_STORE', 'False')
    assert distributed.restart_store(2) is None


def test_an_old_config_with_query_identity_means_query_identity(tmp_path):
    old = tmp_path / 'old.py'
    old.write_text("query_identity = True\nweight_decay = 2 ** -5\n")
    c = train.settings([str(old)])
    assert c['query'] == 'identity' and 'query_identity' not in c
    assert train.model_args_from(train.settings([]), {'vocab_size': 257})['query'] == 'linear'
    with pytest.raises(UserError,
                       match="config: query_identity=True contradicts query='nonlinear'"):
        train.settings([str(old), '--query=nonlinear'])


# The first losses of a fixed seed, recorded before the attention-path choice, the gradient norm,
# the induction probe and the named seed keys were added (Muon's when it was added): a change that
# alters what a run computes (an experiment's runs continue across such changes) fails here.
# Relative 1e-6 under AdamW, not bit-exactness, since another CPU's BLAS may round differently;
# 1e-4 under Muon, whose Newton-Schulz steps run in bfloat16, a rounding another CPU may flip.
PINNED = {
    ('adamw', 'linear'): (
        [5.73024845123291, 5.633757591247559, 5.318981647491455, 4.933065414428711,
         4.523777961730957, 4.20756196975708, 4.049297332763672, 3.706636905670166],
        [5.738879919052124, 4.571904182434082, 3.6129207611083984]),
    ('adamw', 'identity'): (
        [5.728924751281738, 5.6579790115356445, 5.3271484375, 5.002840042114258,
         4.592550277709961, 4.291025161743164, 4.11499547958374, 3.7795636653900146],
        [5.740425109863281, 4.6377317905426025, 3.6685067415237427]),
    ('muon', 'linear'): (
        [5.73024845123291, 5.668735504150391, 5.424828052520752, 4.993191719055176,
         4.546959400177002, 4.223764419555664, 4.046681880950928, 3.70066499710083],
        [5.738879919052124, 4.610587120056152, 3.6054153442382812]),
    ('muon', 'identity'): (
        [5.728924751281738, 5.691920280456543, 5.462279319763184, 5.069342613220215,
         4.62494421005249, 4.303101539611816, 4.1160407066345215, 3.7766594886779785],
        [5.740425109863281, 4.673910617828369, 3.6675933599472046]),
}
PINNED_REL = {'adamw': 1e-6, 'muon': 1e-4}


@pytest.mark.parametrize('optimizer,query', PINNED)
def test_a_fixed_seed_trains_as_it_did(data_root, tmp_path, optimizer, query):
    log = run(data_root, tmp_path, max_iters=8, eval_interval=4, dropout=0.0, query=query,
              optimizer=optimizer)
    steps, evals = PINNED[optimizer, query]
    rel = PINNED_REL[optimizer]
    assert [e['loss'] for e in log if 'loss' in e] == pytest.approx(steps, rel=rel)
    assert [e['val_loss'] for e in log if 'val_loss' in e] == pytest.approx(evals, rel=rel)


def test_every_log_step_has_the_gradient_norm_and_every_evaluation_its_probes(data_root, tmp_path):
    short = dict(max_iters=4, eval_interval=2, dropout=0.0)
    clipped = run(data_root, tmp_path / 'clip', grad_clip=1e-3, probe='lab.probes', **short)
    free = run(data_root, tmp_path / 'free', grad_clip=0.0, **short)
    norms = [[e['grad_norm'] for e in log if 'loss' in e] for log in (clipped, free)]
    assert len(norms[0]) == len(norms[1]) == 4 and all(n > 1e-3 for n in norms[0])
    # the norm before clipping: at step 1 both runs hold the same weights and batch
    assert norms[0][0] == pytest.approx(norms[1][0], rel=1e-6)
    # then the clipped run has moved less
    assert norms[0][1] != pytest.approx(norms[1][1], rel=1e-3)
    for e in (e for e in clipped if 'val_loss' in e):
        assert e['eval_s'] > 0 and e['repeat_loss'] > 0
        assert len(e['induction']) == TINY['n_layer'] and all(len(h) == 2 for h in e['induction'])
        assert all(0 <= s <= 1 for layer in e['induction'] for s in layer)


def test_the_induction_probe_repeats_random_tokens_never_the_end_of_document(data_root):
    from lab.probes import INDUCTION_KEY, repeated_tokens
    data = open_dataset(data_root, 'tiny', 32)
    x = repeated_tokens(data, 4, 1337, INDUCTION_KEY)
    assert x.shape == (4, 32) and torch.equal(x[:, :16], x[:, 16:])
    path = os.path.join(data_root, 'tiny', 'train.bin')
    seen = set(np.memmap(path, dtype=data.meta['dtype'], mode='r').tolist())
    assert set(x.flatten().tolist()) <= seen - {data.meta['eot']}
    assert torch.equal(x, repeated_tokens(data, 4, 1337, INDUCTION_KEY))
    assert not torch.equal(x, repeated_tokens(data, 4, 1338, INDUCTION_KEY))


def test_followup_configs_state_its_protocol():
    for name, lr, wd, min_lr, params, scale in (
            ('nonlinear', 2.4e-3, 2 ** -5, 3e-5, 124_392_192, 1 / 16),
            ('baseline_followup', 6e-4, 0.1, 6e-5, 124_373_760, 1 / 8)):
        c = train.settings([f'config/{name}.py'])
        with torch.device('meta'):
            args = train.model_args_from(c, {'vocab_size': 50257})
            model = GPT(GPTConfig(**args), verbose=False)
        assert model.get_num_params() == params and model.config.scale == pytest.approx(scale)
        assert f'{params:,} parameters' in open(f'config/{name}.py').read()  # its comment says so
        # a full cosine, to min_lr at max_iters wherever that is set
        assert (c['max_iters'], c['lr_decay_iters'], c['warmup_iters']) == (60002, None, 2000)
        assert (c['learning_rate'], c['weight_decay'], c['min_lr']) == (lr, wd, min_lr)
        assert train.get_lr(60002, c) == pytest.approx(min_lr)
        assert 'beyond_query_linearity' in open(f'config/{name}.py').read()
    c = train.settings(['config/nonlinear.py'])
    cfg = GPTConfig(**train.model_args_from(c, {'vocab_size': 50257}))
    assert (cfg.query, cfg.query_mix, cfg.scale) == ('nonlinear', 1.0, 1 / 16)


def test_full_val_loss_is_every_val_token_once(data_root, tmp_path):
    out = tmp_path / 'run'
    train.main(['config/cpu/small.py', f'--data_root={data_root}', '--dataset=tiny',
                f'--out_dir={out}', '--max_iters=2', '--n_layer=1', '--block_size=32',
                '--batch_size=4',
                '--eval_interval=2', '--eval_iters=1'])
    final = [e for e in files.read_jsonl(out / 'log.jsonl') if 'val_loss' in e][-1]
    model = GPT.from_checkpoint(load_checkpoint(str(out / 'ckpt.pt')), verbose=False).eval()
    val = np.fromfile(os.path.join(data_root, 'tiny', 'val.bin'), dtype=np.uint16)
    tokens = torch.from_numpy(val.astype(np.int64))
    total = 0.0
    with torch.no_grad():  # one window at a time, by hand: every target once
        for i in range(0, len(tokens) - 1, 32):
            x, y = tokens[i:i + 32][None], tokens[i + 1:i + 33][None]
            x = x[:, :y.size(1)]
            logits, _ = model(x, y)
            total += torch.nn.functional.cross_entropy(logits[0].double(), y[0],
                                                       reduction='sum').item()
    assert final['val_loss_full'] == pytest.approx(total / (len(tokens) - 1), rel=1e-6)
    assert all('val_loss_full' not in e
               for e in files.read_jsonl(out / 'log.jsonl') if e['iter'] < 2)
    saved = json.loads((out / 'config.json').read_text())
    assert saved['params'] == model.get_num_params() and saved['model_args']['n_layer'] == 1


@pytest.mark.xdist_group('torchrun')
@pytest.mark.long
@pytest.mark.slow
def test_an_accumulation_the_world_size_does_not_divide_is_said_once_with_the_value(data_root,
                                                                                    tmp_path):
    cmd = [*TORCHRUN, '--standalone', '--nproc_per_node=2', 'train.py',
           *argv(data_root, tmp_path / 'two', gradient_accumulation_steps=3)]
    r = subprocess.run(cmd, cwd=HERE, env=dict(os.environ, OMP_NUM_THREADS='1'),
                       capture_output=True, text=True, timeout=300)
    ours = [line for line in r.stderr.splitlines() if line.startswith('error:')]
    assert ours == ["error: gradient_accumulation_steps 3 is not divisible by the world size 2: "
                    "use a multiple of it, such as --gradient_accumulation_steps=4 (the global "
                    "batch is the same at every world size)"], r.stderr[-3000:]
    assert not (tmp_path / 'two').exists()
