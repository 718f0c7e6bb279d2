"""A run's record is never damaged: eval_only, a failed resume, a full disk, an unwritable out_dir,
damaged data and a signal mid-evaluation each end in one line (or 128 + the signal's number) with
the run's files as they were; and a single text file is a corpus."""
import contextlib
import glob
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

from kvgpt import checkpoint, distributed, errors
from kvgpt.checkpoint import load_checkpoint
from kvgpt.config import run_config_file
from kvgpt.data import Dataset
from kvgpt.errors import UserError
from kvgpt.files import read_jsonl
from kvgpt.signals import Signals
import prepare
from test_train import HERE, argv, losses, read_log, run
import train

RECORD = ('config.json', 'log.jsonl', 'ckpt.pt')


def record(out_dir):
    return {f: (out_dir / f).read_bytes() for f in RECORD if (out_dir / f).exists()}


def one_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: ') and 'Traceback' not in err, err
    return lines[0]


@contextlib.contextmanager
def tmpfs(path, size):
    """A tmpfs of size bytes mounted at path (root, where mount works), else None: the tests then
    inject the same failure at the write."""
    path.mkdir(parents=True)
    mounted = os.geteuid() == 0 and shutil.which('mount') and subprocess.run(
        ['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(path)],
        capture_output=True).returncode == 0
    try:
        yield path if mounted else None
    finally:
        if mounted:
            subprocess.run(['umount', '-l', str(path)], capture_output=True)


def disk_full_at_write(monkeypatch, nth):
    """Every checkpoint write from the nth on goes to /dev/full: torch's own writer meets ENOSPC
    there, as on a full disk."""
    real, calls = torch.save, []

    def save(obj, path, *a, **kw):
        calls.append(path)
        return real(obj, '/dev/full' if len(calls) >= nth else path, *a, **kw)
    monkeypatch.setattr(checkpoint.torch, 'save', save)


# -----------------------------------------------------------------------------
# the record describes the checkpoint on disk

def test_eval_only_leaves_the_record_byte_identical(data_root, tmp_path, capsys):
    run(data_root, tmp_path, max_iters=10)
    before = record(tmp_path)
    train.main(argv(data_root, tmp_path, init_from='resume', eval_only=True, max_iters=10))
    assert 'iter 10: train loss' in capsys.readouterr().out
    assert record(tmp_path) == before  # config.json was once replaced by `null` here
    evals = read_jsonl(tmp_path / 'eval.jsonl')
    assert len(evals) == 1 and evals[0]['iter'] == 10 and evals[0]['eval_only']
    assert evals[0]['val_loss_full'] == read_log(tmp_path)[-1]['val_loss_full']


def test_a_resume_that_fails_before_its_first_checkpoint_changes_nothing(data_root, tmp_path):
    run(data_root, tmp_path, max_iters=10)
    before = record(tmp_path)
    with pytest.raises(UserError, match='non-finite'):  # the case: a diverging resume
        run(data_root, tmp_path, init_from='resume', max_iters=30, learning_rate=1e12,
            grad_clip=0.0)
    assert record(tmp_path) == before


def test_a_resume_writes_its_record_with_its_first_checkpoint(data_root, tmp_path):
    run(data_root, tmp_path, max_iters=10)
    log = run(data_root, tmp_path, init_from='resume', max_iters=20, learning_rate=2e-2)
    config = json.loads((tmp_path / 'config.json').read_text())
    assert config['max_iters'] == 20 and config['learning_rate'] == 2e-2
    assert [e['iter'] for e in log if 'val_loss' in e] == [0, 10, 20]
    assert [e['iter'] for e in log if 'loss' in e] == list(range(1, 21))


def test_overwrite_keeps_the_old_record_until_the_new_run_saves(data_root, tmp_path):
    run(data_root, tmp_path, max_iters=10)
    before = record(tmp_path)
    with pytest.raises(UserError, match='non-finite'):
        run(data_root, tmp_path, overwrite=True, learning_rate=1e12, grad_clip=0.0)
    assert record(tmp_path) == before


# -----------------------------------------------------------------------------
# the filesystem boundary: one line, exit code 2, the previous checkpoint intact

@contextlib.contextmanager
def full_disk(tmp_path, monkeypatch, where, size, nth):
    """An out_dir whose disk is full at the nth checkpoint write: on a tmpfs of size bytes, or
    with the failure injected at that write."""
    with tmpfs(tmp_path / 'fs', size) as fs:
        if where == 'tmpfs' and fs is None:
            pytest.skip('mounting a tmpfs needs root: the injected case covers it')
        if where == 'injected':
            disk_full_at_write(monkeypatch, nth)
        yield tmp_path / 'fs' / 'run'


@pytest.mark.parametrize('where', ['tmpfs', 'injected'])
def test_a_full_disk_at_the_first_save_is_one_line(data_root, tmp_path, monkeypatch, command_line,
                                                   where):
    # config and log fit, a checkpoint does not
    with full_disk(tmp_path, monkeypatch, where, 96 * 1024, 1) as out:
        code, err = command_line(train, argv(data_root, out, max_iters=10))
    line = one_line(err)
    assert code == 2 and f"cannot write {out}/ckpt.pt" in line
    assert line.endswith(f"{out}/ckpt.pt is not written") and 'untouched' not in line  # none was
    if where == 'tmpfs':
        assert 'the disk is full' in line


@pytest.mark.parametrize('where', ['tmpfs', 'injected'])
def test_a_full_disk_at_a_later_save_keeps_the_previous_checkpoint(data_root, tmp_path,
                                                                    monkeypatch, command_line,
                                                                    where):
    run(data_root, tmp_path / 'probe', max_iters=10)
    size = (tmp_path / 'probe' / 'ckpt.pt').stat().st_size
    # room for one checkpoint and its record, not for a second one written beside it
    with full_disk(tmp_path, monkeypatch, where, size * 3 // 2 + 64 * 1024, 2) as out:
        code, err = command_line(train, argv(data_root, out, max_iters=20))
        assert code == 2 and f"cannot write {out}/ckpt.pt" in one_line(err)
        assert one_line(err).endswith(f"the previous {out}/ckpt.pt is untouched")
        assert load_checkpoint(str(out / 'ckpt.pt'))['iter_num'] == 10
        assert not (out / 'ckpt.pt.tmp').exists()


@pytest.mark.parametrize('exhaust', [
    lambda: torch.empty(10 ** 13),  # the CPU allocator's own failure, 40 TB: refused at once
    lambda: np.empty(10 ** 14),  # numpy's, where the batch is built
    lambda: (_ for _ in ()).throw(torch.OutOfMemoryError("CUDA out of memory. Tried to ...")),
])
def test_out_of_memory_is_one_line_that_says_what_to_lower(data_root, tmp_path, monkeypatch,
                                                           command_line, exhaust):
    run(data_root, tmp_path / 'run', max_iters=2, eval_interval=2)
    before = record(tmp_path / 'run')
    monkeypatch.setattr(train.GPT, 'forward', lambda *a, **kw: exhaust())
    code, err = command_line(train, argv(data_root, tmp_path / 'run', init_from='resume',
                                         max_iters=4))
    line = one_line(err)
    assert code == 2 and line.startswith("error: out of memory on cpu at batch_size 4 ")
    assert "lower batch_size and raise gradient_accumulation_steps by the same factor" in line
    assert record(tmp_path / 'run') == before
    monkeypatch.setattr(train.GPT, 'forward', lambda *a, **kw: torch.ones(2) @ torch.ones(3))
    with pytest.raises(RuntimeError, match='inconsistent tensor size'):  # any other: not called so
        command_line(train, argv(data_root, tmp_path / 'run', init_from='resume', max_iters=4))


def test_a_read_only_out_dir_is_one_line_for_a_new_run_and_a_resume(data_root, tmp_path,
                                                                     command_line):
    with tmpfs(tmp_path / 'fs', 4 * 2 ** 20) as fs:
        out = tmp_path / 'fs' / 'run'
        run(data_root, out, max_iters=10)
        before = record(out)
        if fs is not None:
            subprocess.run(['mount', '-o', 'remount,ro', str(fs)], check=True)
        else:  # not root: the permission bits say it
            for p in (out, *out.iterdir()):
                p.chmod(0o555 if p.is_dir() else 0o444)
            (tmp_path / 'fs').chmod(0o555)
        try:
            for out_dir, kw in ((out, dict(init_from='resume', max_iters=20)),
                                (tmp_path / 'fs' / 'new', {})):
                code, err = command_line(train, argv(data_root, out_dir, **kw))
                line = one_line(err)
                assert code == 2 and str(out_dir) in line and "--out_dir" in line
                assert ('read-only' if fs is not None else 'permission') in line
            assert record(out) == before
        finally:
            if fs is None:
                (tmp_path / 'fs').chmod(0o755)
                for p in (out, *out.iterdir()):
                    p.chmod(0o755)


def test_an_out_dir_that_is_a_file_is_one_line(data_root, tmp_path, command_line):
    (tmp_path / 'out').write_text('not a folder')
    code, err = command_line(train, argv(data_root, tmp_path / 'out'))
    line = one_line(err)
    assert code == 2 and str(tmp_path / 'out') in line and 'a file is in the way' in line
    assert (tmp_path / 'out').read_text() == 'not a folder'


def test_prepare_into_a_file_or_a_full_disk_is_one_line(tmp_path, command_line):
    docs = tmp_path / 'docs.txt'
    docs.write_text('some text to prepare ' * 2000)
    (tmp_path / 'root').write_text('a file')
    code, err = command_line(prepare, [f'--dataset={docs}', f'--data_root={tmp_path / "root"}',
                                       '--tokenizer=byte', '--num_proc=1', '--progress=False'])
    assert code == 2 and 'a file is in the way' in one_line(err)
    with tmpfs(tmp_path / 'fs', 16 * 1024) as fs:  # the bins do not fit
        if fs is not None:
            code, err = command_line(prepare, [f'--dataset={docs}', f'--data_root={fs}',
                                               '--tokenizer=byte', '--num_proc=1',
                                               '--progress=False'])
            assert code == 2 and 'the disk is full' in one_line(err)
            assert not any(fs.rglob('*.bin*')) and not any(fs.rglob('meta.json'))


# -----------------------------------------------------------------------------
# data is checked before it is trusted

@pytest.fixture
def data_copy(data_root, tmp_path):
    shutil.copytree(os.path.join(data_root, 'tiny'), tmp_path / 'data' / 'tiny')
    return tmp_path / 'data'


def test_token_ids_at_or_above_the_vocabulary_are_one_line(data_copy, tmp_path, command_line):
    ids = np.memmap(data_copy / 'tiny' / 'train.bin', dtype=np.uint16, mode='r+')
    ids[5] = 300  # the byte vocabulary is 257
    ids.flush()
    code, err = command_line(train, argv(str(data_copy), tmp_path / 'out'))
    line = one_line(err)
    assert code == 2 and f"{data_copy / 'tiny'}/train.bin holds token id 300" in line
    assert '--force=True' in line
    # past what opening looks at, the batch that reads it says the same
    meta = json.loads((data_copy / 'tiny' / 'meta.json').read_text())
    data = Dataset(str(data_copy / 'tiny'), meta, 32)
    data.batch('train', np.array([100]))
    with pytest.raises(UserError, match='holds token id 300'):
        data.batch('train', np.array([0]))


@pytest.mark.parametrize('change,problem', [
    (lambda m: m.pop('train_tokens'), "it has no 'train_tokens'"),
    (lambda m: m.update(vocab_size='257'), "its 'vocab_size' is '257', not a int"),
    (lambda m: m.update(dtype='float32'), "its dtype 'float32' is not one of"),
    (lambda m: m.update(tokenizer='llama'), "its tokenizer 'llama' is not one of byte, gpt2"),
    (lambda m: m.update(digests=[1]), "its 'digests' is [1], not an object of texts"),
])
def test_a_damaged_meta_json_is_one_line(data_copy, tmp_path, command_line, change, problem):
    path = data_copy / 'tiny' / 'meta.json'
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))
    code, err = command_line(train, argv(str(data_copy), tmp_path / 'out'))
    line = one_line(err)
    assert code == 2 and f"{path} is damaged ({problem}" in line and '--force=True' in line


def test_a_meta_json_of_the_wrong_shape_and_a_bin_of_the_wrong_size(data_copy, tmp_path,
                                                                     command_line):
    path = data_copy / 'tiny' / 'meta.json'
    good = path.read_text()
    path.write_text('[1, 2, 3]')
    code, err = command_line(train, argv(str(data_copy), tmp_path / 'out'))
    assert code == 2 and 'it holds a list, not an object' in one_line(err)
    path.write_text(good)
    with open(data_copy / 'tiny' / 'val.bin', 'ab') as f:
        f.write(b'\0')  # half a uint16 token
    code, err = command_line(train, argv(str(data_copy), tmp_path / 'out'))
    assert code == 2 and 'val.bin has' in one_line(err) and 'uint16 tokens' in err


# -----------------------------------------------------------------------------
# signals: honoured within seconds, also mid-evaluation; a run stopped early exits non-zero

def start_long_evaluation(data_root, out, **kw):
    """train.py whose evaluations take minutes (50,000 batches a split), once it is evaluating."""
    cmd = [sys.executable, 'train.py', *argv(data_root, out, eval_iters=50000, **kw)]
    proc = subprocess.Popen(cmd, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, OMP_NUM_THREADS='1'))
    for line in proc.stdout:  # the loop starts with an evaluation right after this line
        if 'starting at iter' in line:
            break
    time.sleep(1.0)
    return proc


@pytest.mark.slow
def test_ctrl_c_during_an_evaluation_saves_and_stops_within_seconds(data_root, tmp_path):
    proc = start_long_evaluation(data_root, tmp_path / 'run')
    t0 = time.time()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert time.time() - t0 < 10, "it waited for the evaluation to end"
    assert proc.returncode == 128 + signal.SIGINT, err[-2000:]
    assert err.strip().splitlines() == [
        "SIGINT: saving a checkpoint and stopping (a second one stops at once)"]
    assert 'stopped by a signal at iter 0' in out
    assert load_checkpoint(str(tmp_path / 'run' / 'ckpt.pt'))['iter_num'] == 0
    # it resumes, and only the finished evaluation is in the log
    log = run(data_root, tmp_path / 'run', init_from='auto', max_iters=4, eval_interval=4)
    assert [e['iter'] for e in log if 'val_loss' in e] == [0, 4]


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_and_keeps_the_checkpoint(data_root, tmp_path):
    run(data_root, tmp_path / 'run', max_iters=10)
    proc = start_long_evaluation(data_root, tmp_path / 'run', init_from='resume', max_iters=20)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, err[-2000:]
    assert 'Traceback' not in err
    assert load_checkpoint(str(tmp_path / 'run' / 'ckpt.pt'))['iter_num'] == 10


def test_the_first_signal_asks_for_a_save_and_a_second_exits_at_once(monkeypatch, capsys):
    exits = []
    monkeypatch.setattr(os, '_exit', exits.append)
    signals = Signals(distributed.Dist(False, 0, 1, 'cpu'), 'out')
    signals.arrived(signal.SIGINT)
    assert signals.number == signal.SIGINT and exits == []
    signals.arrived(signal.SIGINT)
    assert exits == [128 + signal.SIGINT]
    assert capsys.readouterr().err.splitlines() == [
        "SIGINT: saving a checkpoint and stopping (a second one stops at once)",
        "SIGINT again: stopping now, without saving; the last checkpoint in out is kept"]


def test_a_signal_during_the_full_validation_pass_saves_and_exits_128_plus_it(
        data_root, tmp_path, monkeypatch):
    real = Dataset.batch

    def batch(self, split, starts, device='cpu', length=None):
        if length is not None:  # the full val pass: a signal arrives in its middle
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, split, starts, device, length)
    monkeypatch.setattr(Dataset, 'batch', batch)
    with pytest.raises(SystemExit) as stop:
        run(data_root, tmp_path, max_iters=6, eval_interval=100)
    assert stop.value.code == 128 + signal.SIGTERM
    assert load_checkpoint(str(tmp_path / 'ckpt.pt'))['iter_num'] == 6
    assert 'val_loss_full' not in read_log(tmp_path)[-1]
    monkeypatch.undo()
    log = run(data_root, tmp_path, init_from='resume', max_iters=6, eval_interval=100)
    assert 'val_loss_full' in log[-1] and log[-1]['iter'] == 6


# -----------------------------------------------------------------------------
# corpora and smaller cases

def test_a_single_text_file_is_a_corpus_split_by_position(tmp_path, capsys):
    text = ''.join(f"line {i}: {'abcdefghij' * 5}\n" for i in range(3000))
    (tmp_path / 'input.txt').write_text(text)
    meta = prepare.prepare(dict(prepare.DEFAULTS, dataset=str(tmp_path / 'input.txt'),
                                tokenizer='byte', data_root=str(tmp_path / 'data'), num_proc=1,
                                progress=False))
    assert 'the first 90% of its' in capsys.readouterr().out
    cut = round(len(text) * 0.9)
    train_ids = np.memmap(tmp_path / 'data' / 'input' / 'train.bin', dtype=np.uint16, mode='r')
    val_ids = np.memmap(tmp_path / 'data' / 'input' / 'val.bin', dtype=np.uint16, mode='r')
    assert bytes(train_ids[:-1].astype(np.uint8)).decode() == text[:cut]  # then end-of-text
    assert bytes(val_ids[:-1].astype(np.uint8)).decode() == text[cut:]
    assert meta['split'] == 'by position' and meta['settings']['val_size'] == 0.1
    log = run(str(tmp_path / 'data'), tmp_path / 'out', dataset='input', max_iters=4,
              eval_interval=4)
    assert log[-1]['val_loss_full'] > 0


@pytest.mark.parametrize('content,message', [
    ('', 'docs.jsonl is empty: a .jsonl needs one JSON object per line'),
    ('{"text": "a"}\n\n{"text": oops}\n', 'docs.jsonl line 3 is not valid JSON'),
])
def test_an_empty_or_malformed_jsonl_is_one_line(tmp_path, command_line, content, message):
    (tmp_path / 'docs.jsonl').write_text(content)
    code, err = command_line(prepare, [f'--dataset={tmp_path / "docs.jsonl"}', '--tokenizer=byte',
                                       f'--data_root={tmp_path}', '--num_proc=1'])
    assert code == 2 and message in one_line(err)


def test_a_file_that_is_not_a_checkpoint_gets_no_unsafe_advice(tmp_path):
    torch.save({'model': {}, 'model_args': {}, 'extra': np.arange(3)}, tmp_path / 'x.pt')
    with pytest.raises(UserError) as e:
        load_checkpoint(str(tmp_path / 'x.pt'))
    assert 'weights_only' not in str(e.value) and 'objects other than tensors' in str(e.value)


def test_a_config_file_that_exits_is_one_line(tmp_path, command_line):
    (tmp_path / 'quits.py').write_text('import sys\nsys.exit(0)\n')
    code, err = command_line(train, [str(tmp_path / 'quits.py')])
    assert code == 2 and 'calls exit(): a config file only sets values' in one_line(err)


def test_train_help_reads_as_help_for_a_user(capsys):
    with pytest.raises(SystemExit):
        train.settings(['--help'])
    lines = capsys.readouterr().out.splitlines()
    assert not any('setup()' in line or 'Below the settings' in line for line in lines)
    key = {line.split('=')[0].strip(): line for line in lines if line.startswith('  --')}
    assert key['--init_from'].endswith("a branch that continues it here")  # not cut short
    assert 'the run stops when iter_num reaches it' in key['--max_iters']  # it stops at >=


EITHER = 'read or write'


@pytest.mark.parametrize('error,doing,advice', [
    (PermissionError(13, 'Permission denied', '/runs/x'), EITHER,
     'permission denied: fix its permissions, or choose another path'),
    (OSError(28, 'No space left on device', '/runs/x'), 'write', 'the disk is full: free space'),
    (OSError(30, 'Read-only file system', '/runs/x'), 'write', 'the filesystem is read-only'),
    (NotADirectoryError(20, 'Not a directory', '/runs/x'), EITHER, 'a file is in the way'),
    (FileNotFoundError(2, 'No such file or directory', '/runs/x'), EITHER, 'check the path'),
    (OSError(5, 'Input/output error', '/runs/x'), EITHER, 'the disk reported an I/O error'),
])
def test_each_filesystem_failure_says_what_to_do(error, doing, advice, capsys):
    """A failure no caller explained: only a full disk or a read-only one says it was a write."""
    def fails():
        raise error
    with pytest.raises(SystemExit) as stop:
        errors.run_main(fails)
    assert stop.value.code == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"error: cannot {doing} /runs/x ({error.strerror}): {advice}")


def test_kvgpt_debug_shows_the_traceback_with_the_same_exit_code(monkeypatch, capsys):
    """A user error is one line and exit code 2; KVGPT_DEBUG=1 prints its traceback instead, still
    exit code 2; an error that is not the user's (a bug) always raises, for Python to report."""
    def fails():
        raise errors.UserError("no such run: name one with --out_dir")
    for debug, lines in (('0', 1), ('1', 4)):
        monkeypatch.setenv('KVGPT_DEBUG', debug)
        with pytest.raises(SystemExit) as stop:
            errors.run_main(fails)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and len(err.splitlines()) >= lines
        assert ('Traceback (most recent call last)' in err) == (debug == '1')
        assert err.rstrip().endswith('no such run: name one with --out_dir')
    with pytest.raises(ZeroDivisionError):
        errors.run_main(lambda: 1 / 0)


def test_the_readme_greedy_example_draws_one_sample():
    readme = open(os.path.join(HERE, 'README.md')).read()
    greedy = [line for line in readme.splitlines() if '--temperature=0' in line]
    assert greedy and all('--num_samples=1' in line for line in greedy)


# -----------------------------------------------------------------------------
# the record never lags the checkpoint

def fail_config_writes(monkeypatch):
    """config.json cannot be replaced (as under `chattr +i`): every write of it fails."""
    from kvgpt import tracking as record_module
    real = record_module.write_json

    def write_json(path, obj):
        if os.path.basename(path) == 'config.json':
            raise PermissionError(1, 'Operation not permitted', f'{path}.tmp')
        return real(path, obj)
    monkeypatch.setattr(record_module, 'write_json', write_json)


def test_a_record_that_cannot_be_written_keeps_the_old_checkpoint_and_record(
        data_root, tmp_path, monkeypatch, command_line):
    run(data_root, tmp_path, max_iters=10)
    before = record(tmp_path)
    with monkeypatch.context() as m:
        fail_config_writes(m)
        code, err = command_line(train, argv(data_root, tmp_path, init_from='resume',
                                             max_iters=20))
    line = one_line(err)
    assert code == 2 and f"cannot write {tmp_path}/config.json" in line and 'not permitted' in line
    assert 'ckpt.pt and the run\'s record are as they were' in line
    assert record(tmp_path) == before  # not a checkpoint at 20 beside a record of 10
    log = run(data_root, tmp_path, init_from='resume', max_iters=20)  # fixed: resume again
    assert [e['iter'] for e in log if 'loss' in e] == list(range(1, 21))  # no lines lost
    assert [e['iter'] for e in log if 'val_loss' in e] == [0, 10, 20]


@pytest.mark.parametrize('bad,problem', [
    (b'\xff\xfe not text\n', 'log.jsonl is damaged at line 4'),
    (b'{"loss": 1.0}\n', "log.jsonl line 4 is not a log entry (no 'iter')"),
])
def test_a_damaged_log_is_one_line_before_training_and_changes_nothing(data_root, tmp_path,
                                                                         command_line, bad,
                                                                         problem):
    run(data_root, tmp_path, max_iters=10)
    log = tmp_path / 'log.jsonl'
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b''.join(lines[:3] + [bad] + lines[3:]))
    before = record(tmp_path)
    code, err = command_line(train, argv(data_root, tmp_path, init_from='resume', max_iters=20))
    line = one_line(err)
    assert code == 2 and f"{tmp_path}/{problem}" in line
    assert record(tmp_path) == before


def test_undecodable_bytes_at_the_end_of_the_log_are_a_line_cut_short(data_root, tmp_path):
    run(data_root, tmp_path, max_iters=10)
    with open(tmp_path / 'log.jsonl', 'ab') as f:
        f.write(b'{"iter": 11, "lo\xff\xfe')
    log = run(data_root, tmp_path, init_from='resume', max_iters=20)
    assert [e['iter'] for e in log if 'loss' in e] == list(range(1, 21))


def test_resuming_a_finished_run_leaves_its_record_byte_identical(data_root, tmp_path, capsys):
    run(data_root, tmp_path, max_iters=10)
    before = record(tmp_path)
    train.main(argv(data_root, tmp_path, init_from='resume', max_iters=10))
    assert 'finished at iter 10' in capsys.readouterr().out
    assert record(tmp_path) == before  # config.json's init_from and log.jsonl's eval_s stay


def test_an_optimizer_state_that_does_not_fit_its_model_is_one_line(data_root, tmp_path,
                                                                     command_line):
    run(data_root, tmp_path, max_iters=10)
    ckpt = torch.load(tmp_path / 'ckpt.pt', weights_only=True)
    first = ckpt['optimizer']['state'][0]
    first['exp_avg'] = first['exp_avg'][:3]  # another model's moments
    torch.save(ckpt, tmp_path / 'ckpt.pt')
    before = record(tmp_path)
    code, err = command_line(train, argv(data_root, tmp_path, init_from='resume', max_iters=20))
    line = one_line(err)
    assert code == 2 and f"{tmp_path}/ckpt.pt: its optimizer state does not fit its model" in line
    assert 'exp_avg of transformer.wte.weight' in line and "without its 'optimizer'" in line
    assert record(tmp_path) == before
    del ckpt['optimizer']  # the advice, followed: the weights go on with a fresh AdamW
    torch.save(ckpt, tmp_path / 'ckpt.pt')
    log = run(data_root, tmp_path, init_from='resume', max_iters=20)
    assert [e['iter'] for e in log if 'loss' in e][-1] == 20


def test_weights_of_the_wrong_shape_name_the_tensor(data_root, tmp_path, command_line):
    run(data_root, tmp_path, max_iters=10)
    ckpt = torch.load(tmp_path / 'ckpt.pt', weights_only=True)
    name = next(k for k in ckpt['model'] if k.endswith('mlp.c_fc.weight'))
    ckpt['model'][name] = ckpt['model'][name][:, :5]
    torch.save(ckpt, tmp_path / 'ckpt.pt')
    code, err = command_line(train, argv(data_root, tmp_path, init_from='resume', max_iters=20))
    line = one_line(err)
    assert code == 2 and f"size mismatch for {name}" in line and 'torch.Size' in line


def test_bins_without_meta_json_say_how_to_describe_them(data_copy, tmp_path, command_line):
    """nanoGPT's bins, or a prepare.py run killed mid-swap: not 'a malformed llm.c shard'."""
    os.remove(data_copy / 'tiny' / 'meta.json')
    code, err = command_line(train, argv(str(data_copy), tmp_path / 'out', max_iters=2))
    line = one_line(err)
    assert code == 2 and 'but no meta.json: if they are nanoGPT' in line and 'llm.c' not in line
    command = re.search(r'`python prepare.py (--dataset=\S+)`', line).group(1)
    prepare.main([command, '--tokenizer=byte'])  # the advice, for these byte-level ids
    run(str(data_copy), tmp_path / 'out', max_iters=2, eval_interval=2)


def test_a_full_disk_while_prepare_writes_names_the_folder(tmp_path, monkeypatch, command_line):
    docs = tmp_path / 'docs.txt'
    docs.write_text('some text to prepare ' * 2000)

    def full(*a, **kw):
        raise OSError(28, 'No space left on device')  # a write() on a full disk names no file
    monkeypatch.setattr(prepare, 'write_bin', full)
    code, err = command_line(prepare, [f'--dataset={docs}', f'--data_root={tmp_path / "d"}',
                                       '--tokenizer=byte', '--num_proc=1', '--progress=False'])
    line = one_line(err)
    assert code == 2 and f"cannot write {tmp_path / 'd' / 'docs'} (No space left" in line
    assert 'the disk is full' in line


def test_a_missing_file_is_said_before_the_tokenizer_is_loaded(tmp_path, monkeypatch,
                                                               command_line):
    def offline(name):
        raise UserError("cannot load the GPT-2 BPE (ConnectionError)")
    monkeypatch.setattr(prepare, 'get_tokenizer', offline)
    code, err = command_line(prepare, [f'--dataset={tmp_path / "missing.txt"}',
                                       f'--data_root={tmp_path}'])
    assert code == 2 and f"no such file or folder: {tmp_path / 'missing.txt'}" in one_line(err)


def test_a_read_only_filesystem_at_a_save_is_not_called_a_full_disk(tmp_path, monkeypatch):
    """torch reports any failed write as a RuntimeError: the errno is recovered from the folder."""
    def refuse(obj, path, *a, **kw):
        raise RuntimeError(f"File {path} cannot be opened.")

    class ReadOnly:  # a read-only mount with room to spare
        f_flag, f_frsize, f_blocks, f_bfree, f_bavail = os.ST_RDONLY, 4096, 2 ** 30, 0, 0
    monkeypatch.setattr(checkpoint.torch, 'save', refuse)
    monkeypatch.setattr(checkpoint.os, 'statvfs', lambda folder: ReadOnly())
    with pytest.raises(OSError) as failed:
        checkpoint.save_checkpoint({}, str(tmp_path / 'ckpt.pt'))
    line = errors.fs_error(failed.value, str(tmp_path / 'ckpt.pt'))
    assert 'the filesystem is read-only' in line and 'free space' not in line


def test_the_closing_hint_quotes_an_out_dir_with_spaces(data_root, tmp_path, capsys):
    out = tmp_path / 'my run'
    run(data_root, out, max_iters=4, eval_interval=4)
    assert f"python sample.py --out_dir='{out}'" in capsys.readouterr().out


def test_help_texts_keep_continued_comments_and_name_optional_types(capsys):
    with pytest.raises(SystemExit):
        prepare.main(['--help'])
    val = next(line for line in capsys.readouterr().out.splitlines()
               if '--val_documents' in line)
    assert val.rstrip().endswith("None: a random val_size share (nanoGPT's split)")
    from lab import study
    with pytest.raises(SystemExit):
        study.main(['--help'])
    threads = next(line for line in capsys.readouterr().out.splitlines()
                   if line.startswith('  --threads'))
    assert 'int|None' in threads and 'NoneType' not in threads


def test_advice_names_the_scripts_own_keys(tmp_path):
    from evals import hellaswag
    with pytest.raises(UserError, match='pass --hellaswag=path/to/file.jsonl'):
        hellaswag.load(str(tmp_path / 'none.jsonl'), key='--hellaswag')
    with pytest.raises(UserError, match='pass --data=path/to/file.jsonl'):
        hellaswag.load(str(tmp_path / 'none.jsonl'))
    c = dict(hellaswag=str(tmp_path / 'none.jsonl'), hellaswag_items=None)
    with pytest.raises(UserError, match='--hellaswag='):
        hellaswag.scorer(c, 'byte', None, False)


def test_a_resume_records_the_checkpoints_model_not_the_ignored_settings(data_root, tmp_path,
                                                                          capsys):
    run(data_root, tmp_path, max_iters=10)
    n_embd = json.loads((tmp_path / 'config.json').read_text())['n_embd']
    run(data_root, tmp_path, init_from='resume', max_iters=20, n_embd=2 * n_embd)
    assert "the checkpoint's settings win over n_embd=" in capsys.readouterr().out
    config = json.loads((tmp_path / 'config.json').read_text())
    assert config['n_embd'] == config['model_args']['n_embd'] == n_embd


@pytest.mark.parametrize('optimizer,changed', [
    ('adamw', dict(weight_decay=0.05, beta2=0.99)),
    ('muon', dict(weight_decay=0.05, muon_momentum=0.9, muon_scale='original'))])
def test_a_resume_goes_on_with_the_checkpoints_optimizer_settings_and_records_them(
        data_root, tmp_path, capsys, optimizer, changed):
    """The optimizer's state holds its hyperparameters (betas, weight decay, Muon's momentum), and
    torch's load_state_dict restores them: the resume trains on with the checkpoint's, says which
    on its command line it ignores, and config.json and the next checkpoint record what it trains
    with. The schedule's LR is the run's own (a note where it differs)."""
    straight = run(data_root, tmp_path / 'straight', max_iters=8, eval_interval=4,
                   optimizer=optimizer)
    run(data_root, tmp_path / 'run', max_iters=4, eval_interval=4, optimizer=optimizer)
    capsys.readouterr()
    resumed = run(data_root, tmp_path / 'run', init_from='resume', max_iters=8, eval_interval=4,
                  optimizer=optimizer, **changed)
    assert ("resuming: the checkpoint's settings win over "
            + ', '.join(f'{k}={v!r}' for k, v in changed.items()) in capsys.readouterr().out)
    assert losses(resumed) == losses(straight)  # the checkpoint's settings, bit for bit
    config = json.loads((tmp_path / 'run' / 'config.json').read_text())
    saved = load_checkpoint(str(tmp_path / 'run' / 'ckpt.pt'))['config']
    for k in changed:
        assert config[k] == saved[k] == train.DEFAULTS[k], k


def test_a_resume_with_another_muon_lr_says_its_schedule_differs(data_root, tmp_path, capsys):
    """muon_lr is the schedule's, as learning_rate is: a resume trains with the one it is given
    and, as for learning_rate, says it is not the run its settings would make from scratch."""
    run(data_root, tmp_path, max_iters=4, eval_interval=4, optimizer='muon', muon_lr=0.02)
    capsys.readouterr()
    run(data_root, tmp_path, init_from='resume', max_iters=8, eval_interval=4, optimizer='muon',
        muon_lr=0.02)
    assert 'note:' not in capsys.readouterr().out
    run(data_root, tmp_path, init_from='resume', max_iters=12, eval_interval=4, optimizer='muon',
        muon_lr=0.01)
    out = capsys.readouterr().out
    assert "was trained with another Muon learning rate at step 0" in out, out
    assert json.loads((tmp_path / 'config.json').read_text())['muon_lr'] == 0.01


def test_a_resume_on_shorter_windows_records_them(data_root, tmp_path, capsys):
    """block_size is also the window length: a resume may shorten it, and config.json says the
    windows it trains on, beside the model's context in model_args."""
    run(data_root, tmp_path, max_iters=10)
    log = run(data_root, tmp_path, init_from='resume', max_iters=20, block_size=16)
    assert "win over block_size" not in capsys.readouterr().out
    config = json.loads((tmp_path / 'config.json').read_text())
    assert config['block_size'] == 16 and config['model_args']['block_size'] == 32
    assert log[-1]['tokens'] == 10 * 2 * 4 * 32 + 10 * 2 * 4 * 16


def test_hellaswag_scores_reach_the_console_as_well_as_the_log(data_root, tmp_path, capsys):
    from test_hellaswag import write_items
    items = write_items(tmp_path / 'items.jsonl', n=4, seed=0)
    log = run(data_root, tmp_path / 'run', max_iters=4, eval_interval=4, hellaswag=str(items))
    acc = log[-1]['hellaswag_acc_norm']
    assert f"hellaswag_acc_norm {acc:.4f}" in capsys.readouterr().out


def test_the_w_and_b_run_name_defaults_to_the_out_dir_for_every_variant():
    """A variant file names no W&B run: two runs of config/reduced.py in two out_dirs are two
    W&B runs with two names, not two runs called 'reduced'."""
    for f in glob.glob(os.path.join(HERE, 'config', '**', '*.py'), recursive=True):
        made = run_config_file(f, dict(train.DEFAULTS))
        assert 'wandb_run_name' not in made, f
    assert 'wandb/' in open(os.path.join(HERE, '.gitignore')).read().split()


def test_a_log_line_that_cannot_be_appended_names_the_file(data_root, tmp_path, monkeypatch,
                                                           command_line):
    from kvgpt import tracking
    real = open

    def full(path, mode='r', *a, **kw):
        if str(path).endswith('log.jsonl') and mode == 'a':
            raise OSError(28, 'No space left on device')  # a full disk's write names no file
        return real(path, mode, *a, **kw)
    monkeypatch.setattr(tracking, 'open', full, raising=False)
    code, err = command_line(train, argv(data_root, tmp_path, max_iters=10))
    line = one_line(err)
    assert code == 2 and f"cannot write {tmp_path}/log.jsonl (No space left" in line
    assert 'the disk is full' in line


def test_the_bpe_advice_names_tokenizer_as_prepare_pys_key_only(monkeypatch):
    """sample.py has no --tokenizer: the advice says whose key it is."""
    import tiktoken
    from kvgpt import tokenizer

    def offline(name):
        raise ConnectionError('no network')
    monkeypatch.setattr(tiktoken, 'get_encoding', offline)
    tokenizer.get_tokenizer.cache_clear()
    try:
        with pytest.raises(UserError, match=r"\(prepare.py: or --tokenizer=byte\)$"):
            tokenizer.get_tokenizer('gpt2')
    finally:
        tokenizer.get_tokenizer.cache_clear()
