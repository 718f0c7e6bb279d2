import errno
import hashlib
import json
import mmap
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from kvgpt.data import open_dataset
from kvgpt.errors import UserError
from kvgpt.tokenizer import get_tokenizer
import prepare

DOCS = [f"Document {i}: the quick brown fox, café ünïcode ✓ {'word ' * (i % 7)}<|endoftext|> "
        "stays text." for i in range(40)]
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root


def write_jsonl(path, docs, column='text'):
    with open(path, 'w') as f:
        for d in docs:
            f.write(json.dumps({column: d, 'other': 1}) + '\n')
    return str(path)


def run(tmp_path, **kw):
    cfg = dict(prepare.DEFAULTS, data_root=str(tmp_path / 'data'), num_proc=1)
    cfg.update(kw)
    return prepare.prepare(cfg)


def read_docs(out_dir, split, tok):
    meta = json.load(open(os.path.join(out_dir, 'meta.json')))
    ids = np.fromfile(os.path.join(out_dir, f'{split}.bin'), dtype=meta['dtype'])
    assert ids[-1] == tok.eot
    cuts = np.flatnonzero(ids == tok.eot)
    return [tok.decode_bytes(ids[a + 1 if a >= 0 else 0:b].tolist()).decode()
            for a, b in zip(np.r_[-1, cuts[:-1]], cuts)]


BPE = pytest.mark.gpt2_bpe  # skipped with its reason where tiktoken cannot load the GPT-2 BPE


@pytest.mark.parametrize('tokenizer', ['byte', pytest.param('gpt2', marks=BPE)])
def test_bins_decode_to_source_documents(tmp_path, tokenizer):
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS)
    meta = run(tmp_path, dataset=src, tokenizer=tokenizer, val_size=0.1)
    out = tmp_path / 'data' / 'docs'
    tok = get_tokenizer(tokenizer)
    train, val = read_docs(out, 'train', tok), read_docs(out, 'val', tok)
    assert sorted(train + val) == sorted(DOCS) and len(val) == 4
    assert meta['vocab_size'] == tok.vocab_size and meta['tokenizer'] == tokenizer
    on_disk = json.load(open(out / 'meta.json'))
    for s in ('train', 'val'):
        n = os.path.getsize(out / f'{s}.bin') // np.dtype(on_disk['dtype']).itemsize
        assert on_disk[f'{s}_tokens'] == n
        # the content too, so that a resume on other bins of the same size is refused
        digest = hashlib.blake2b((out / f'{s}.bin').read_bytes(), digest_size=16).hexdigest()
        assert on_disk['digests'][s] == digest
    # the BPE, not bytes: '<|endoftext|>' in text is ordinary text, never token 50256
    if tokenizer == 'gpt2':
        ids = np.fromfile(out / 'train.bin', dtype=np.uint16)
        assert (ids == 50256).sum() == len(train)
        assert len(ids) < 0.5 * sum(len(d.encode()) for d in train)


@pytest.mark.gpt2_bpe
def test_val_split_is_deterministic_and_follows_the_seed(tmp_path):
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS)
    run(tmp_path, dataset=src, out_name='a', val_size=0.2)
    run(tmp_path, dataset=src, out_name='b', val_size=0.2)
    run(tmp_path, dataset=src, out_name='c', val_size=0.2, seed=1)
    read = lambda n: (tmp_path / 'data' / n / 'val.bin').read_bytes()
    assert read('a') == read('b') and read('a') != read('c')


@pytest.mark.gpt2_bpe
def test_num_proc_does_not_change_the_bins(tmp_path):
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS * 5)
    run(tmp_path, dataset=src, out_name='one', num_proc=1)
    run(tmp_path, dataset=src, out_name='two', num_proc=2)
    for s in ('train.bin', 'val.bin'):
        data = tmp_path / 'data'
        assert (data / 'one' / s).read_bytes() == (data / 'two' / s).read_bytes()


@pytest.mark.gpt2_bpe
def test_rerun_is_a_noop_unless_forced(tmp_path, capsys):
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS)
    run(tmp_path, dataset=src)
    stamp = os.path.getmtime(tmp_path / 'data' / 'docs' / 'train.bin')
    run(tmp_path, dataset=src)
    assert 'up to date' in capsys.readouterr().out
    assert os.path.getmtime(tmp_path / 'data' / 'docs' / 'train.bin') == stamp
    run(tmp_path, dataset=src, force=True)
    assert 'wrote' in capsys.readouterr().out


def test_a_home_path_is_expanded(tmp_path, monkeypatch):
    """The shell leaves the ~ of --dataset=~/docs.jsonl alone: prepare.py expands it."""
    monkeypatch.setenv('HOME', str(tmp_path))
    write_jsonl(tmp_path / 'docs.jsonl', DOCS)
    meta = run(tmp_path, dataset='~/docs.jsonl', tokenizer='byte')  # offline: no BPE needed
    assert meta['train_tokens'] > 0 and (tmp_path / 'data' / 'docs' / 'meta.json').exists()


def test_a_meta_json_that_is_not_an_object_is_one_line(tmp_path):
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS)
    run(tmp_path, dataset=src, tokenizer='byte')
    (tmp_path / 'data' / 'docs' / 'meta.json').write_text('[]')
    with pytest.raises(UserError, match="meta.json is damaged .* not an object"):
        open_dataset(str(tmp_path / 'data'), 'docs', 8)
    run(tmp_path, dataset=src, tokenizer='byte')  # not up to date: written again
    assert json.load(open(tmp_path / 'data' / 'docs' / 'meta.json'))['train_tokens'] > 0


def test_the_advice_for_a_missing_dataset_names_its_data_root(tmp_path, monkeypatch):
    with pytest.raises(UserError, match=f"--dataset=docs --data_root={tmp_path}` first"):
        open_dataset(str(tmp_path), 'docs', 8)
    monkeypatch.chdir(tmp_path)  # the default data_root, data/, needs no --data_root
    with pytest.raises(UserError, match="--dataset=docs` first"):
        open_dataset('data/', 'docs', 8)


def test_a_misspelt_dataset_name_is_answered_with_the_name_it_is_close_to(tmp_path, monkeypatch):
    with pytest.raises(UserError, match=re.escape(
            f"no prepared dataset at {tmp_path / 'pydoc'}: did you mean --dataset=pydocs?")):
        open_dataset(str(tmp_path), 'pydoc', 8)
    (tmp_path / 'my_corpus').mkdir()
    (tmp_path / 'my_corpus' / 'meta.json').write_text('{}')  # one prepare.py wrote
    with pytest.raises(UserError, match="did you mean --dataset=my_corpus?"):
        open_dataset(str(tmp_path), 'my_corpos', 8)
    with pytest.raises(UserError) as e:
        open_dataset(str(tmp_path), 'nothing_like_it', 8)
    assert 'did you mean' not in str(e.value)
    assert 'prepare.py --dataset=nothing_like_it' in str(e.value)

    def hub(*a, **k):
        raise AssertionError('went to the tokenizer or the hub with a misspelt corpus')
    monkeypatch.setattr(prepare, 'get_tokenizer', hub)
    monkeypatch.setattr(prepare, 'load_source', hub)
    with pytest.raises(UserError, match=re.escape(
            "no file, folder or corpus named 'pysorce': did you mean --dataset=pysource? (a hub "
            "dataset is named owner/name)")):
        run(tmp_path, dataset='pysorce')


def test_the_advice_for_a_source_file_names_the_folder_prepare_writes(tmp_path, monkeypatch):
    """--dataset=input.txt names the source; prepare.py writes data/input, which train reads."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"run `python prepare.py --dataset=input.txt`, then "
                                        r"train with --dataset=input$"):
        open_dataset('data', 'input.txt', 8)
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS)
    run(tmp_path, dataset=src, tokenizer='byte')
    with pytest.raises(UserError, match=r"not the source: pass --dataset=docs$"):
        open_dataset('data', src, 8)
    assert open_dataset('data', 'docs', 8).meta['train_tokens'] > 0  # the advice works


@pytest.mark.gpt2_bpe
def test_failed_run_leaves_nothing_finished_looking(tmp_path, monkeypatch):
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS)
    out = tmp_path / 'data' / 'docs'
    calls = []

    def failing(*a, **k):
        calls.append(1)
        if len(calls) == 2:  # val.bin fails after train.bin's temporary file is complete
            raise OSError('disk full')
        return real(*a, **k)
    real = prepare.write_bin
    monkeypatch.setattr(prepare, 'write_bin', failing)
    with pytest.raises(UserError, match=f"cannot write {out} \\(disk full\\)"):
        run(tmp_path, dataset=src)
    assert os.listdir(out.parent) == ['.docs.lock']  # no dataset, nothing half-written
    # a finished run survives a failing forced re-run untouched
    monkeypatch.setattr(prepare, 'write_bin', real)
    run(tmp_path, dataset=src)
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    calls.clear()
    monkeypatch.setattr(prepare, 'write_bin', failing)
    with pytest.raises(UserError, match='cannot write'):
        run(tmp_path, dataset=src, force=True, seed=5)
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before


@pytest.mark.parametrize('data_root', ['a_file', 'a_file/deeper'])
def test_a_destination_that_cannot_be_a_folder_is_refused_before_the_source_is_read(
        tmp_path, monkeypatch, data_root):
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS)
    (tmp_path / 'a_file').write_text('in the way')

    def read(c):
        raise AssertionError('the source was read, and would have been tokenized, first')
    monkeypatch.setattr(prepare, 'load_source', read)
    out = tmp_path / data_root / 'docs'
    with pytest.raises(UserError, match=re.escape(
            f"cannot write {out} (Not a directory): a file is in the way where a folder should "
            "be")):
        run(tmp_path, dataset=src, data_root=str(tmp_path / data_root))
    assert sorted(os.listdir(tmp_path)) == ['a_file', 'docs.jsonl']


def no_space(*args):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), *args)


def full_disk_at(monkeypatch, point):
    """ENOSPC where the disk would raise it (the allocation of a bin, meta.json's write), or EIO
    where the swap renames: the one-step exchange, or either rename where the OS has none."""
    if point in ('train.bin', 'val.bin'):
        allocations, real = [], os.posix_fallocate

        def allocate(fd, offset, length):  # train.bin is allocated first
            allocations.append(fd)
            if len(allocations) == (1 if point == 'train.bin' else 2):
                raise no_space()
            return real(fd, offset, length)
        monkeypatch.setattr(os, 'posix_fallocate', allocate)
    elif point == 'meta.json':
        def write_json(path, obj):
            raise no_space()
        monkeypatch.setattr(prepare, 'write_json', write_json)
    elif point == 'exchange':
        def exchange(a, b):
            raise OSError(errno.EIO, os.strerror(errno.EIO), b)
        monkeypatch.setattr(prepare, 'exchange', exchange)
    else:  # without renameat2: the old folder aside, then the new one in
        monkeypatch.setattr(prepare, 'exchange', lambda a, b: False)
        real_rename = os.rename

        def rename(src, dst):  # the dataset aside, then the new one from .docs.new
            moved = os.path.basename(src)
            if moved == ('docs' if point == 'rename aside' else '.docs.new'):
                raise OSError(errno.EIO, os.strerror(errno.EIO), src)
            return real_rename(src, dst)
        monkeypatch.setattr(os, 'rename', rename)


@pytest.mark.skipif(not hasattr(os, 'posix_fallocate'), reason="no posix_fallocate here")
@pytest.mark.parametrize('point', ['train.bin', 'val.bin', 'meta.json', 'exchange',
                                   'rename aside', 'rename in'])
def test_a_failed_rewrite_leaves_the_old_dataset_whole(tmp_path, monkeypatch, point):
    """A full disk, simulated at each point where a rewrite takes space (and a failed rename at
    each of the swap's), on every machine; test_a_full_tmpfs_... has a real full disk."""
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS)
    run(tmp_path, dataset=src, tokenizer='byte')
    out = tmp_path / 'data' / 'docs'
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    full_disk_at(monkeypatch, point)
    with pytest.raises(UserError, match="^cannot write .*; the dataset there before is as it "
                                        "was$"):
        run(tmp_path, dataset=src, tokenizer='byte', seed=5, force=True)
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before
    assert sorted(os.listdir(out.parent)) == ['.docs.lock', 'docs']  # nothing half-written


PAGE = mmap.PAGESIZE  # a tmpfs allocates whole pages


@pytest.fixture
def tmpfs(tmp_path):
    """mount(pages): a new tmpfs of that many pages under tmp_path, unmounted after the test;
    the test is skipped, with the reason, where this process may not mount one."""
    mounted = []

    def mount(pages):
        if not hasattr(os, 'geteuid') or os.geteuid() != 0 or not shutil.which('mount'):
            pytest.skip("mounting a tmpfs needs root and mount(8); "
                        "test_a_failed_rewrite_leaves_... simulates the same points")
        folder = tmp_path / f'disk{len(mounted)}'
        folder.mkdir()
        r = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={pages * PAGE}', 'tmpfs',
                            str(folder)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); "
                        "test_a_failed_rewrite_leaves_... simulates the same points")
        mounted.append(folder)
        return folder
    yield mount
    for folder in mounted:
        subprocess.run(['umount', str(folder)], check=True)


@pytest.fixture(scope='module')
def old_and_new(tmp_path_factory):
    """(source, old dataset folder, new dataset folder): the same documents split two ways,
    byte-level, the new one's bins many pages each."""
    root = tmp_path_factory.mktemp('datasets')
    src = write_jsonl(root / 'docs.jsonl', DOCS * 10)
    kw = dict(prepare.DEFAULTS, dataset=src, tokenizer='byte', val_size=0.2, num_proc=1)
    for name, seed in (('old', 5), ('new', kw['seed'])):
        prepare.prepare(dict(kw, data_root=str(root / name), seed=seed))
    return src, root / 'old' / 'docs', root / 'new' / 'docs'


def pages(folder, *names):
    return sum(-(-os.path.getsize(folder / name) // PAGE) for name in names)


def contents(folder):  # {} where there is no folder
    return {f: (folder / f).read_bytes() for f in os.listdir(folder)} if folder.exists() else {}


@pytest.mark.parametrize('old', [False, True], ids=['fresh', 'over an old dataset'])
@pytest.mark.parametrize('point', ['train.bin', 'val.bin', 'meta.json', None],
                         ids=['in train.bin', 'in val.bin', 'after both bins', 'room for all'])
def test_a_full_tmpfs_leaves_the_old_dataset_whole_or_no_bins(tmpfs, old_and_new, point, old):
    """A real full disk: a tmpfs with room for the old dataset and the new one's pages up to
    the point (train.bin's are allocated first, then val.bin's, then meta.json's)."""
    src, old_dir, new_dir = old_and_new
    room = 1 + {'train.bin': pages(new_dir, 'train.bin') - 1,  # 1: the holder's .docs.owner
                'val.bin': pages(new_dir, 'train.bin', 'val.bin') - 1,
                'meta.json': pages(new_dir, 'train.bin', 'val.bin'),
                None: pages(new_dir, 'train.bin', 'val.bin', 'meta.json')}[point]
    disk = tmpfs(room + (pages(old_dir, *os.listdir(old_dir)) if old else 0))
    if old:
        shutil.copytree(old_dir, disk / 'docs')
    kw = dict(prepare.DEFAULTS, dataset=src, tokenizer='byte', val_size=0.2, num_proc=1,
              data_root=str(disk), force=True)
    if point is None:
        prepare.prepare(kw)
        assert contents(disk / 'docs') == contents(new_dir)
        return
    with pytest.raises(UserError, match="disk is full"):
        prepare.prepare(kw)
    assert contents(disk / 'docs') == (contents(old_dir) if old else {})


def test_a_read_only_filesystem_is_said_to_be_one(tmpfs, tmp_path, monkeypatch):
    """os.access says only 'no' on a read-only mount, as for a folder of another owner: the
    mount's flag tells them apart, before the source is read."""
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS)
    disk = tmpfs(16)
    subprocess.run(['mount', '-o', 'remount,ro', str(disk)], check=True)
    monkeypatch.setattr(prepare, 'load_source', lambda c: pytest.fail('the source was read'))
    with pytest.raises(UserError) as e:
        run(tmp_path, dataset=src, data_root=str(disk))
    assert str(e.value) == (f"cannot write {disk}/docs (Read-only file system): the filesystem "
                            "is read-only: choose a writable folder")


def test_openwebtext_path_on_local_files_with_its_schema(tmp_path):
    """The hub is unreachable here: the same code path, fed a local parquet copy with OpenWebText's
    schema."""
    import datasets
    folder = tmp_path / 'owt'
    folder.mkdir()
    datasets.Dataset.from_dict({'text': DOCS * 60}).to_parquet(str(folder / 'train-00000.parquet'))
    meta = run(tmp_path, hub_id=str(folder), tokenizer='byte')
    # nanoGPT's split, ceil'd
    assert meta['settings']['val_size'] == 0.0005 and meta['val_documents'] == 2
    assert meta['train_documents'] == 2398
    assert (tmp_path / 'data' / 'openwebtext' / 'train.bin').exists()


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.slow
def test_pydocs_is_deterministic_english_over_a_megabyte():
    docs = prepare.pydocs_documents()
    # made again from scratch, not the cached copy
    assert docs == prepare.pydocs_documents.__wrapped__()
    topics = prepare.pydocs_topics()  # the corpus's first documents, the tests' small datasets
    assert len(topics) > 60 and list(docs[:len(topics)]) == topics
    text = ''.join(docs)
    assert len(text.encode()) > 1_000_000 and text.count(' the ') > 10_000


@pytest.mark.long
@pytest.mark.slow
def test_pysource_is_the_standard_library_source_one_module_a_document():
    docs = prepare.pysource_documents()
    assert docs == prepare.pysource_documents.__wrapped__()
    heads = [d.split('\n', 1)[0] for d in docs]
    assert heads == sorted(heads) and '# os.py' in heads and not any('/test/' in h for h in heads)
    import os
    import sysconfig
    with open(os.path.join(sysconfig.get_paths()['stdlib'], 'os.py'), encoding='utf-8') as f:
        assert docs[heads.index('# os.py')] == '# os.py\n' + f.read()
    size = lambda documents: sum(len(d.encode()) for d in documents)
    assert size(docs) > 4 * size(prepare.pydocs_documents())
    assert prepare.resolve(dict(prepare.DEFAULTS, dataset='pysource'))['tokenizer'] == 'byte'


@pytest.mark.gpt2_bpe
def test_text_files_are_one_document_each(tmp_path):
    folder = tmp_path / 'texts'
    folder.mkdir()
    for i in range(5):
        (folder / f'{i}.txt').write_text(f"line one of {i}\nline two\n")
    run(tmp_path, dataset=str(folder), val_size=0.2)
    tok = get_tokenizer('gpt2')  # the default for anything but the embedded corpus
    out = tmp_path / 'data' / 'texts'
    docs = read_docs(out, 'train', tok) + read_docs(out, 'val', tok)
    assert sorted(docs) == sorted(f"line one of {i}\nline two\n" for i in range(5))


@pytest.mark.parametrize('kw,message', [
    (dict(dataset='missing/file.jsonl'), 'no such file'),
    pytest.param(dict(text_column='body'), "no column 'body'", marks=BPE),
    (dict(tokenizer='sentencepiece'), "unknown tokenizer 'sentencepiece'"),
    pytest.param(dict(tokenizer='gpt2', dtype='uint8'), 'does not fit uint8', marks=BPE),
    (dict(val_size=1.5), 'val_size must be a fraction'),
    pytest.param(dict(dataset='nobody/no-such-dataset-kvgpt'), 'pass local files instead',
                 marks=BPE),
    pytest.param(dict(dataset='EMPTY'), 'is empty', marks=BPE),
])
def test_bad_input_is_one_clear_error(tmp_path, kw, message):
    if kw.get('dataset') == 'EMPTY':
        kw['dataset'] = write_jsonl(tmp_path / 'empty.jsonl', ['', ''])
    kw.setdefault('dataset', write_jsonl(tmp_path / 'docs.jsonl', DOCS))
    with pytest.raises(UserError, match=message):
        run(tmp_path, **kw)
    written = [f for _, _, fs in os.walk(tmp_path / 'data') for f in fs]
    assert not any(f.endswith('.bin') for f in written)


@pytest.mark.slow
def test_cli_error_is_one_line_without_traceback(tmp_path, command_line):
    r = subprocess.run([sys.executable, 'prepare.py', f'--dataset={tmp_path}/nope.txt',
                        f'--data_root={tmp_path}'], capture_output=True, text=True, cwd=HERE)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"error: no such file or folder: {tmp_path}/nope.txt"]
    code, err = command_line(prepare, ['--nmu_proc=2'])
    assert code == 2 and "unknown config key 'nmu_proc' (did you mean 'num_proc'?)" in err


@pytest.mark.gpt2_bpe
def test_hub_dataset_with_a_loading_script_says_what_to_do(tmp_path, monkeypatch):
    import datasets

    def script_only(*a, **k):  # what datasets >= 4 raises for a script-based hub repository
        raise RuntimeError('Dataset scripts are no longer supported, but found openwebtext.py')
    monkeypatch.setattr(datasets, 'load_dataset', script_only)
    with pytest.raises(UserError,
                       match=r"'Skylion007/openwebtext' is loaded by a dataset script.*--hub_id"):
        run(tmp_path)


def test_batches_go_to_whatever_device_is_chosen(data_root):
    data = open_dataset(data_root, 'tiny', 32)
    x, y = data.batch('train', data.starts('train', 2, 1), 'meta')  # a device with no CUDA
    assert x.device.type == y.device.type == 'meta' and x.shape == (2, 32)


def test_the_core_imports_where_fcntl_does_not_exist():
    """Windows has no fcntl: the out_dir lock is filelock's, so nothing in the core needs it."""
    code = ("import sys; sys.modules['fcntl'] = None; "
            "import train, sample, prepare, bench, kvgpt.checkpoint, kvgpt.distributed, model")
    r = subprocess.run([sys.executable, '-W', 'ignore', '-c', code], cwd=HERE,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_prepare_without_the_datasets_package_says_so_in_one_line(tmp_path):
    """datasets is a requirement, but a machine may lack it (a GPU image did): one line, exit 2."""
    argv = ['--dataset=pydocs', f'--data_root={tmp_path}']
    code = ("import sys; sys.modules['datasets'] = None; import prepare; "
            f"prepare.run_main(lambda: prepare.main({argv!r}))")
    r = subprocess.run([sys.executable, '-W', 'ignore', '-c', code], cwd=HERE,
                       capture_output=True, text=True)
    assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith('error: prepare.py needs the datasets package')
    assert 'pip install datasets' in r.stderr and not (tmp_path / 'pydocs').exists()


# -----------------------------------------------------------------------------
# llm.c / modded-nanogpt shards, written here to the format's spec: 256 little-endian int32
# (magic 20240520, version 1, token count, zeros), then the tokens as uint16

def write_shard(path, tokens, magic=20240520, version=1, count=None):
    header = np.zeros(256, dtype='<i4')
    header[:3] = magic, version, len(tokens) if count is None else count
    with open(path, 'wb') as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype='<u2').tobytes())


def shard_folder(root, sizes=(3000, 2500), val=1500):
    folder = root / 'data' / 'fineweb10B'
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    tokens = {'train': [], 'val': []}
    for i, n in enumerate(sizes):
        tokens['train'].append(rng.integers(0, 50257, n))
        write_shard(folder / f'fineweb_train_{i + 1:06d}.bin', tokens['train'][-1])
    tokens['val'].append(rng.integers(0, 50257, val))
    write_shard(folder / 'fineweb_val_000000.bin', tokens['val'][-1])
    return folder, {s: np.concatenate(t) for s, t in tokens.items()}


def test_llmc_shards_read_as_one_sequence_per_split(tmp_path):
    folder, tokens = shard_folder(tmp_path)
    data = open_dataset(str(tmp_path / 'data'), 'fineweb10B', block_size=64)
    assert data.meta['train_tokens'] == 5500 and data.meta['val_tokens'] == 1500
    assert data.meta['tokenizer'] == 'gpt2' and data.meta['vocab_size'] == 50257
    # a window across the boundary of the two train shards reads both, in order
    x, y = data.batch('train', np.array([2990, 0, 5500 - 65]))
    assert x[0].tolist() == tokens['train'][2990:3054].tolist()
    assert y[0].tolist() == tokens['train'][2991:3055].tolist()
    assert y[2].tolist() == tokens['train'][-64:].tolist()
    assert data.read('val', 0, 1500).tolist() == tokens['val'].tolist()


def test_train_runs_on_llmc_shards(tmp_path):
    import train
    shard_folder(tmp_path)
    out = tmp_path / 'out'
    train.main([f'--data_root={tmp_path / "data"}', '--dataset=fineweb10B', f'--out_dir={out}',
                '--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=32', '--batch_size=2',
                '--gradient_accumulation_steps=1', '--max_iters=4', '--eval_interval=2',
                '--eval_iters=1', '--log_interval=1', '--device=cpu', '--compile=False',
                '--dtype=float32'])
    log = [json.loads(line) for line in open(out / 'log.jsonl')]
    assert log[-1]['iter'] == 4 and np.isfinite(log[-1]['val_loss_full'])
    assert json.load(open(out / 'config.json'))['model_args']['vocab_size'] == 50304


@pytest.mark.parametrize('damage, message', [
    (dict(magic=20240801), 'is not an llm.c token shard (magic 20240801, version 1'),
    (dict(version=7), 'is not an llm.c token shard (magic 20240520, version 7'),
    (dict(count=4000), 'but its header records 4,000 uint16 tokens'),
])
def test_a_bad_shard_header_is_one_line(tmp_path, command_line, damage, message):
    import train
    folder, _ = shard_folder(tmp_path)
    write_shard(folder / 'fineweb_train_000002.bin', np.zeros(2500), **damage)
    code, err = command_line(train, [f'--data_root={tmp_path / "data"}', '--dataset=fineweb10B',
                                     f'--out_dir={tmp_path / "out"}', '--device=cpu'])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert 'fineweb_train_000002.bin' in err and message in err


def test_a_shard_folder_without_val_shards_says_so(tmp_path):
    folder, _ = shard_folder(tmp_path)
    os.remove(folder / 'fineweb_val_000000.bin')
    with pytest.raises(UserError, match="holds .bin shards but none for val"):
        open_dataset(str(tmp_path / 'data'), 'fineweb10B', block_size=64)


# -----------------------------------------------------------------------------
# streaming (FineWeb's route): the same bins as the non-streamed path on the same documents

@pytest.mark.gpt2_bpe
@pytest.mark.parametrize('kind, num_proc', [('jsonl', 1), ('parquet', 2)])
def test_streamed_bins_equal_the_non_streamed_ones(tmp_path, kind, num_proc, monkeypatch):
    monkeypatch.setattr(prepare, 'STREAM_BATCH', 7)  # several batches, the last one short
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS)
    if kind == 'parquet':
        import datasets
        src = str(tmp_path / 'docs.parquet')
        datasets.Dataset.from_dict({'text': DOCS, 'other': [1] * len(DOCS)}).to_parquet(src)
    made = {}
    for streaming in (False, True):
        meta = run(tmp_path, dataset=src, tokenizer='gpt2', val_documents=5, num_proc=num_proc,
                   streaming=streaming, out_name=f'docs_{streaming}')
        made[streaming] = meta
    for s in ('train', 'val'):
        a, b = (open(tmp_path / 'data' / f'docs_{t}' / f'{s}.bin', 'rb').read()
                for t in (False, True))
        assert a == b and len(a) > 0
    tok = get_tokenizer('gpt2')
    assert read_docs(tmp_path / 'data' / 'docs_True', 'val', tok) == DOCS[:5]
    assert read_docs(tmp_path / 'data' / 'docs_True', 'train', tok) == DOCS[5:]
    for key in ('train_tokens', 'val_tokens', 'documents', 'characters', 'val_documents'):
        assert made[True][key] == made[False][key]


def test_a_hub_config_name_reaches_load_dataset(tmp_path, monkeypatch):
    import datasets
    calls = []
    local = datasets.Dataset.from_dict({'text': DOCS})

    def load_dataset(path, name=None, **kw):
        calls.append((path, name, kw))
        return local.to_iterable_dataset() if kw.get('streaming') else local
    monkeypatch.setattr(datasets, 'load_dataset', load_dataset)
    for streaming in (False, True):
        run(tmp_path, dataset='HuggingFaceFW/fineweb', hub_config='sample-10BT', tokenizer='byte',
            streaming=streaming, val_documents=4, out_name=f'fw{streaming}', progress=False)
    assert [c[:2] for c in calls] == [('HuggingFaceFW/fineweb', 'sample-10BT')] * 2
    assert calls[0][2] == dict(split='train', num_proc=1)
    assert calls[1][2] == dict(split='train', streaming=True)
    a, b = (open(tmp_path / 'data' / f'fw{t}' / 'train.bin', 'rb').read() for t in (False, True))
    assert a == b


@pytest.mark.parametrize('kw, message', [
    (dict(streaming=True), 'set --val_documents'),
    (dict(val_documents=40), 'has 40 documents: too few for val_documents=40'),
    (dict(val_documents=40, streaming=True), 'has 40 documents: too few for val_documents=40'),
])
def test_streaming_settings_fail_clearly(tmp_path, kw, message):
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS)
    with pytest.raises(UserError, match=message):
        run(tmp_path, dataset=src, tokenizer='byte', **kw)
    assert not os.path.exists(tmp_path / 'data' / 'docs' / 'meta.json')


@pytest.mark.parametrize('num_proc', [1, 2])
def test_a_bad_line_in_a_streamed_file_is_one_line_naming_it(tmp_path, num_proc):
    """A streamed source is read while it is tokenized, not when it is opened: its bad line is
    named then, as the non-streamed path names it."""
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS)
    with open(src, 'a') as f:
        f.write('{"text": "broken\n')
    with pytest.raises(UserError, match=f"{src} line {len(DOCS) + 1} is not valid JSON"):
        run(tmp_path, dataset=src, tokenizer='byte', streaming=True, val_documents=2,
            num_proc=num_proc)
    assert not os.path.exists(tmp_path / 'data' / 'docs' / 'meta.json')


@pytest.mark.parametrize('streaming', [False, True])
@pytest.mark.parametrize('num_proc', [1, 2])
def test_text_that_is_not_utf8_or_not_a_string_is_one_line_naming_it(tmp_path, streaming,
                                                                     num_proc):
    """Arrow decodes a .jsonl's text only when it is read, and keeps a number among strings: the
    tokenizer workers met both, with a traceback from their pool."""
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS)
    lines = open(src, 'rb').read().splitlines(keepends=True)
    lines[6] = '{"text": "café latin-1"}\n'.encode('latin-1')
    open(src, 'wb').write(b''.join(lines))
    kw = dict(tokenizer='byte', streaming=streaming, val_documents=2, num_proc=num_proc)
    at = sum(map(len, lines[:6])) + len(b'{"text": "caf')  # the latin-1 e-acute
    with pytest.raises(UserError, match=f"^{src} is not UTF-8 text at byte {at:,} \\(line 7\\): "
                                        "convert it to UTF-8"):
        run(tmp_path, dataset=src, **kw)
    lines[6] = b'{"text": 42}\n'
    open(src, 'wb').write(b''.join(lines))
    with pytest.raises(UserError, match=f"^{src}: document 7's 'text' is a int, not text: fix"):
        run(tmp_path, dataset=src, **kw)
    assert not os.path.exists(tmp_path / 'data' / 'docs' / 'meta.json')


def test_a_text_file_that_is_not_utf8_says_so_with_the_byte(tmp_path):
    """A .txt goes through datasets' text builder, which wraps the decoding error: the message
    is still the cause's, with the byte where the text stops being UTF-8."""
    src = tmp_path / 'blank.txt'
    src.write_bytes(b'plain text\nand then \xff\xfe binary')
    with pytest.raises(UserError) as e:
        run(tmp_path, dataset=str(src), tokenizer='byte')
    assert str(e.value) == (f"{src} is not UTF-8 text at byte 20 (line 2): convert it to UTF-8 "
                            "(e.g. iconv -f latin1 -t utf-8) or fix that text")


def test_a_source_folder_under_data_root_is_not_written_into(tmp_path, monkeypatch):
    """data/texts would otherwise gain train.bin and meta.json, which the next prepare reads."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'data' / 'docs').mkdir(parents=True)
    src = write_jsonl(tmp_path / 'data' / 'docs' / 'docs.jsonl', DOCS)
    for dataset in ('data/docs', 'data'):  # written into itself, or into a folder within it
        with pytest.raises(UserError, match=f"would write data/{dataset.split('/')[-1]} inside "
                                            f"the folder it reads, {dataset}: move"):
            prepare.prepare(dict(prepare.DEFAULTS, dataset=dataset, tokenizer='byte', num_proc=1))
    assert os.listdir(tmp_path / 'data' / 'docs') == ['docs.jsonl']
    meta = run(tmp_path, dataset='data/docs', tokenizer='byte', out_name='docs_prepared')
    assert meta['documents'] == len(DOCS) and open(src).read().count('\n') == len(DOCS)


def nanogpt_bins(folder, ids, dtype=np.uint16):
    """train.bin and val.bin as nanoGPT's prepare.py writes them: flat ids, no meta.json."""
    folder.mkdir(parents=True)
    np.asarray(ids[:-300], dtype=dtype).tofile(folder / 'train.bin')
    np.asarray(ids[-300:], dtype=dtype).tofile(folder / 'val.bin')
    return str(folder)


def test_bins_from_nanogpt_are_described_in_place_and_train_reads_them(tmp_path, capsys):
    tok = get_tokenizer('byte')
    ids = [i for doc in DOCS for i in tok.encode(doc) + [tok.eot]]
    folder = nanogpt_bins(tmp_path / 'elsewhere' / 'owt', ids)
    before = {s: open(f'{folder}/{s}.bin', 'rb').read() for s in ('train', 'val')}
    meta = run(tmp_path, dataset=folder, tokenizer='byte')
    assert (meta['tokenizer'], meta['dtype'], meta['described']) == ('byte', 'uint16', True)
    assert (meta['train_tokens'], meta['val_tokens']) == (len(ids) - 300, 300)
    assert {s: open(f'{folder}/{s}.bin', 'rb').read() for s in ('train', 'val')} == before
    assert sorted(os.listdir(folder)) == ['meta.json', 'train.bin', 'val.bin']
    said = capsys.readouterr().out
    assert f"train on it with --dataset=owt --data_root={tmp_path / 'elsewhere'}" in said
    data = open_dataset(str(tmp_path / 'elsewhere'), 'owt', 32)  # the advice works
    x, y = data.batch('train', np.array([0]))
    assert x[0].tolist() == ids[:32] and y[0].tolist() == ids[1:33]
    run(tmp_path, dataset=folder, tokenizer='byte')  # again: nothing to do
    said = capsys.readouterr().out
    assert ("is prepared already (byte, uint16); train on it with --dataset=owt --data_root="
            f"{tmp_path / 'elsewhere'}; --force=True describes it again") in said
    os.remove(f'{folder}/val.bin')
    np.asarray(ids[-200:], dtype=np.uint16).tofile(f'{folder}/val.bin')  # replaced: force redoes
    meta = run(tmp_path, dataset=folder, force=True)  # the tokenizer it was described with
    assert (meta['tokenizer'], meta['dtype'], meta['val_tokens']) == ('byte', 'uint16', 200)
    assert capsys.readouterr().out.startswith(f"described {folder}: {len(ids) - 300:,} train")


def test_force_on_bins_prepare_made_gives_the_command_that_makes_them(tmp_path, monkeypatch):
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS)
    first = run(tmp_path, dataset=src, tokenizer='byte', val_size=0.2)
    folder = tmp_path / 'data' / 'docs'
    with pytest.raises(UserError) as refused:
        run(tmp_path / 'elsewhere', dataset=str(folder), force=True)
    command = (f"python prepare.py --dataset={src} --tokenizer=byte --val_size=0.2 "
               f"--data_root={tmp_path / 'data'} --out_name=docs --force=True")
    assert str(refused.value) == (f"{folder} holds bins prepare.py made from {src}; to make them "
                                  f"again: {command}")
    monkeypatch.setattr(prepare, 'interrupts_stop_the_main_process', lambda: None)
    again = prepare.main(command.split()[2:])  # the command works, and makes the same bins
    assert again['digests'] == first['digests'] and again['settings'] == first['settings']


@pytest.mark.parametrize('make,message', [
    (lambda f: nanogpt_bins(f, [5, 300] * 400), "train.bin holds token id 300, outside byte's "
                                                "vocabulary of 257: pass the --tokenizer"),
    (lambda f: nanogpt_bins(f, [5] * 801, np.uint8), "train.bin holds 501 bytes, not a whole "
                                                     "number of uint16 tokens"),
    (lambda f: (nanogpt_bins(f, [5] * 800), (f / 'meta.pkl').write_bytes(b'x'))[0],
     "meta.pkl marks nanoGPT's character-level ids"),
])
def test_bins_that_do_not_fit_their_description_are_one_line(tmp_path, make, message):
    folder = make(tmp_path / 'bins')
    with pytest.raises(UserError, match=re.escape(message)):
        run(tmp_path, dataset=folder, tokenizer='byte')
    assert not os.path.exists(os.path.join(folder, 'meta.json'))


def interrupt_once_tokenizing(args, tmp_path, started):
    """Run prepare.py in a group of its own and, once its output matches `started` (the workers
    are tokenizing), send SIGINT to the whole group, as a terminal's Ctrl-C does. (returncode,
    output); a run that does not stop is killed and fails the test."""
    log = tmp_path / 'output.txt'
    env = {k: v for k, v in os.environ.items() if k != 'HF_DATASETS_DISABLE_PROGRESS_BARS'}
    with open(log, 'w') as out:
        proc = subprocess.Popen([sys.executable, 'prepare.py', *args], cwd=HERE, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        while proc.poll() is None and not re.search(started, log.read_text()):
            time.sleep(0.05)
        assert proc.poll() is None, f"finished before it could be interrupted: {log.read_text()}"
        os.killpg(proc.pid, signal.SIGINT)
        return proc.wait(timeout=60), log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize('streamed', [False, True], ids=['map', 'streamed'])
def test_ctrl_c_with_workers_is_one_line_and_leaves_no_files(tmp_path, streamed):
    # enough documents that two workers take seconds to tokenize them
    source = write_jsonl(tmp_path / 'docs.jsonl', [' '.join(['alpha beta gamma'] * 20)] * 300_000)
    args = [f'--dataset={source}', '--tokenizer=byte', '--num_proc=2', '--progress=True',
            f'--data_root={tmp_path}/data']
    started = (r'tokenizing \(streamed\): [1-9]\d* docs' if streamed
               else r'tokenizing train \(num_proc=2\): .*\| [1-9]\d*/')
    code, output = interrupt_once_tokenizing(
        args + (['--streaming=True', '--val_documents=10'] if streamed else []), tmp_path, started)
    assert code == 130, output[-3000:]
    # one line from the main process (among the progress bars), nothing from the workers
    assert 'Traceback' not in output and output.count('interrupted\n') == 1, output[-3000:]
    assert [f for _, _, fs in os.walk(tmp_path / 'data') for f in fs] == ['.docs.lock']


# -----------------------------------------------------------------------------
# one prepare per folder, the swap whole at every step, another source only with --force

def test_a_second_prepare_into_a_held_folder_is_refused_naming_the_holder(tmp_path):
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS)
    run(tmp_path, dataset=src, tokenizer='byte')
    out = tmp_path / 'data' / 'docs'
    before = contents(out)
    with prepare.preparing(str(out)):  # as a prepare.py running now holds it
        with pytest.raises(UserError) as refused:
            run(tmp_path, dataset=src, tokenizer='byte', seed=5, force=True)
    assert str(refused.value) == (f"{out} is being prepared by prepare.py (pid {os.getpid()} on "
                                  f"{socket.gethostname()}): wait for it to finish, or stop it")
    assert contents(out) == before
    run(tmp_path, dataset=src, tokenizer='byte', seed=5, force=True)  # released: it goes ahead
    assert contents(out) != before


def test_a_lock_taken_between_its_holders_moments_names_the_holder_or_is_taken(tmp_path):
    """A holder names itself just after it takes the lock and lets go just after it removes its
    name: a second process that looks in those moments waits for the name, or takes the lock
    once it is free, instead of blaming 'another process'."""
    import threading
    from filelock import FileLock
    from kvgpt.files import hold_lock
    path, owner = str(tmp_path / '.lock'), tmp_path / '.owner'
    in_use = 'held by {}'.format
    held = FileLock(path, timeout=0, thread_local=False)  # let go from the timer's thread
    held.acquire()  # taken, not yet named
    threading.Timer(0.3, owner.write_text, ['prepare.py (pid 1 on host)']).start()
    with pytest.raises(UserError, match=r'^held by prepare.py \(pid 1 on host\)$'):
        hold_lock(path, str(owner), 'prepare.py', in_use)
    owner.unlink()  # unnamed, about to let go
    threading.Timer(0.3, held.release).start()
    lock = hold_lock(path, str(owner), 'train.py', in_use)
    assert lock.is_locked and owner.read_text().startswith('train.py (pid ')
    lock.release()


@pytest.mark.slow
def test_two_prepares_started_together_leave_one_whole_dataset(tmp_path):
    """Two processes at once into one folder: each is refused in one line or writes its whole
    dataset; never a bus error, and the folder holds bins that match its meta.json."""
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS * 200)
    cmd = [sys.executable, 'prepare.py', f'--dataset={src}', '--tokenizer=byte', '--num_proc=1',
           f'--data_root={tmp_path}/data', '--progress=False', '--force=True']
    procs = [subprocess.Popen(cmd + [f'--seed={seed}'], cwd=HERE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    for code, err in results:
        assert code == 0 or (code == 2 and re.fullmatch(
            rf"error: {tmp_path}/data/docs is being prepared by prepare.py \(pid \d+ on .*\): "
            r"wait for it to finish, or stop it\n", err)), (code, err)
    out = tmp_path / 'data' / 'docs'
    meta = json.loads((out / 'meta.json').read_text())
    assert all(hashlib.blake2b((out / f'{s}.bin').read_bytes(), digest_size=16).hexdigest()
               == meta['digests'][s] for s in ('train', 'val'))
    assert sorted(os.listdir(out.parent)) == ['.docs.lock', 'docs']


def killed_at(step, signum, out_dir, kw):
    """Run prepare(kw) in a forked child that sends itself signum at `step` of the swap; return
    its exit status. Steps: 'staged' (the new dataset whole beside the old, before the swap),
    'exchanged' (before the old is removed), 'removing' (half of the old removed); without
    renameat2: 'aside' (the old moved aside, the new not yet in) and 'in' (the new in, the old
    still aside)."""
    pid = os.fork()
    if pid:
        return os.waitpid(pid, 0)[1]
    try:
        def hit():
            os.kill(os.getpid(), signum)

        real_replace, real_exchange, real_rename, real_rmtree = (
            prepare.replace_folder, prepare.exchange, os.rename, shutil.rmtree)
        if step == 'staged':
            prepare.replace_folder = lambda *a: (hit(), real_replace(*a))
        elif step in ('exchanged', 'removing'):
            prepare.exchange = lambda a, b: (real_exchange(a, b), hit())[0]
        else:
            def rename(a, b):
                real_rename(a, b)
                if os.path.basename(a) == ('docs' if step == 'aside' else '.docs.new'):
                    hit()
            prepare.exchange, os.rename = (lambda a, b: False), rename
        if step == 'removing':
            def rmtree(path, *a, **k):
                first = sorted(os.listdir(path))[0]
                os.remove(os.path.join(path, first))
                hit()
                real_rmtree(path, *a, **k)
            shutil.rmtree = rmtree
        sys.stdout = open(os.devnull, 'w')
        prepare.prepare(kw)
        os._exit(0)
    except KeyboardInterrupt:
        os._exit(130)
    except BaseException:
        os._exit(1)


STEPS = ['staged', 'exchanged', 'removing', 'aside', 'in']


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGKILL], ids=['SIGINT', 'SIGKILL'])
@pytest.mark.parametrize('step', STEPS)
def test_a_prepare_stopped_at_each_step_of_its_swap_leaves_the_old_or_the_new_whole(
        tmp_path, old_and_new, signum, step, capsys):
    src, old_dir, new_dir = old_and_new
    root = tmp_path / 'data'
    shutil.copytree(old_dir, root / 'docs')
    kw = dict(prepare.DEFAULTS, dataset=src, tokenizer='byte', val_size=0.2, num_proc=1,
              data_root=str(root), force=True)
    status = killed_at(step, signum, root / 'docs', kw)
    if signum == signal.SIGINT:  # held through the swap: the new dataset, then "interrupted"
        assert os.waitstatus_to_exitcode(status) == 130
        assert contents(root / 'docs') == contents(old_dir if step == 'staged' else new_dir)
        assert sorted(os.listdir(root)) == ['.docs.lock', 'docs']
        return
    assert os.waitstatus_to_exitcode(status) == -signal.SIGKILL
    found = contents(root / 'docs')
    if step == 'aside':  # renameat2's absence: the one step that leaves neither in place
        assert found == {} and contents(root / '.docs.old') == contents(old_dir)
    else:
        assert found in (contents(old_dir), contents(new_dir))
    capsys.readouterr()
    prepare.prepare(kw)  # the next run clears what the killed one left, says so, and goes on
    said = capsys.readouterr().out
    assert f"a killed prepare of {root / 'docs'} left files: " in said
    if step == 'aside':
        assert f"put back {root / 'docs'}, which a killed prepare had moved aside" in said
    assert contents(root / 'docs') == contents(new_dir)
    assert sorted(os.listdir(root)) == ['.docs.lock', 'docs']


def test_a_dataset_from_another_source_is_replaced_only_with_force(tmp_path, capsys):
    (tmp_path / 'blank.txt').write_text('plain text ' * 400)
    src = write_jsonl(tmp_path / 'blank.jsonl', DOCS)
    run(tmp_path, dataset=str(tmp_path / 'blank.txt'), tokenizer='byte')
    out = tmp_path / 'data' / 'blank'
    before = contents(out)
    with pytest.raises(UserError) as refused:
        run(tmp_path, dataset=src, tokenizer='byte')
    assert str(refused.value) == (f"{out} holds another dataset (made with dataset="
                                  f"'{tmp_path / 'blank.txt'}', val_size=0.1): --force=True "
                                  "replaces it, or choose another --out_name")
    assert contents(out) == before
    with pytest.raises(UserError, match=r"another dataset \(made with tokenizer='byte'\)"):
        run(tmp_path, dataset=str(tmp_path / 'blank.txt'), tokenizer='gpt2')  # before the BPE
    run(tmp_path, dataset=src, tokenizer='byte', force=True)
    assert json.loads((out / 'meta.json').read_text())['source'] == src


def test_a_folder_with_files_prepare_does_not_write_is_refused_before_reading(tmp_path,
                                                                             monkeypatch):
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS)
    (tmp_path / 'data' / 'docs').mkdir(parents=True)
    (tmp_path / 'data' / 'docs' / 'notes.txt').write_text('mine')
    monkeypatch.setattr(prepare, 'load_source', lambda c: pytest.fail('the source was read'))
    with pytest.raises(UserError, match=re.escape(
            f"{tmp_path}/data/docs holds files prepare.py does not write (notes.txt), and a "
            "prepare replaces the whole folder: move them out, or choose another --out_name")):
        run(tmp_path, dataset=src, tokenizer='byte')


def test_what_an_older_killed_prepare_left_in_the_folder_is_removed_and_said(tmp_path, capsys):
    src = write_jsonl(tmp_path / 'docs.jsonl', DOCS)
    run(tmp_path, dataset=src, tokenizer='byte')
    out = tmp_path / 'data' / 'docs'
    (out / 'train.bin.tmp').write_bytes(b'\0' * 2 ** 20)  # an earlier version staged here
    capsys.readouterr()
    run(tmp_path, dataset=src, tokenizer='byte')
    said = capsys.readouterr().out
    assert f"a killed prepare of {out} left files: removed train.bin.tmp (1.0 MiB) from {out}" \
        in said and 'is up to date' in said
    assert sorted(os.listdir(out)) == ['meta.json', 'train.bin', 'val.bin']
