"""
Prepare a corpus: tokenize it into data/<name>/train.bin, val.bin (flat token ids) and
meta.json (tokenizer, vocab, dtype, counts, source), the format kvgpt/data.py reads back.

    python prepare.py --dataset=pydocs                 # embedded corpus, offline, ~10 s
    python prepare.py --dataset=pysource               # the stdlib's source, offline, ~10x pydocs
    python prepare.py                                  # OpenWebText from the hub (54 GB)
    python prepare.py --dataset=my_docs.jsonl --text_column=body
    python prepare.py --dataset=input.txt              # one text file: split by position
    python prepare.py --dataset=some_user/some_hub_dataset --tokenizer=gpt2

Every source goes through the same `datasets` pipeline: load -> split -> tokenize
(num_proc workers) -> write shard by shard into a memmap -> meta.json, all in a folder of their
own beside the destination (.<name>.new), which then takes the destination's place in one step.
With --streaming=True the documents are read once, in order: the first val_documents go to
val.bin, the rest to train.bin, tokenized in batches by a pool of num_proc workers and appended
as they come. A reader of the destination sees the old dataset or the new one, whole, whatever
stops prepare (a full disk, Ctrl-C, a kill) and when; what a killed prepare left is removed by
the next. One prepare holds a destination at a time, and a dataset made from another source or
with other settings is replaced only with --force=True.
"""
from kvgpt.errors import quiet_imports  # first: Ctrl-C in the imports below is one line
quiet_imports(__name__)

import ast
import ctypes
import errno
import functools
import glob
import json
import os
import shlex
import shutil
import signal
import sysconfig
from contextlib import contextmanager

import numpy as np

from kvgpt.config import Kind, closest, defaults, keys, parse_config
from kvgpt.data import (BIN_NAMES, EMBEDDED_CORPORA, SPLITS, bins_match_meta, file_digest,
                        holds_bins, meta_problem)
from kvgpt.errors import UserError, fs_error, quiet_hub, run_main
from kvgpt.files import hold_lock, read_json, read_only, write_json
from kvgpt.tokenizer import TOKENIZERS, get_tokenizer

# -----------------------------------------------------------------------------
# settings


KEYS = keys(
    dataset=('openwebtext', "'openwebtext', 'pydocs', 'pysource' (embedded), a hub id, local "
             "files"),
    hub_id=('Skylion007/openwebtext', "where --dataset=openwebtext loads from"),
    hub_config=(None, "the hub dataset's config (subset) name, e.g. FineWeb's 'sample-10BT'",
                Kind(str)),
    streaming=(False, "tokenize while reading, with no raw copy on disk (needs val_documents)"),
    val_documents=(None, "the first this many documents are val, in order (llm.c's FineWeb "
                   "shard 0); None: a random val_size share (nanoGPT's split)", Kind(int)),
    text_column=('text', "the column (or JSON field) that holds each document's text"),
    tokenizer=(None, "'gpt2' or 'byte'; None: byte for the embedded corpora (offline), else gpt2",
               Kind(str, tuple(TOKENIZERS))),
    val_size=(None, "fraction held out; None: 0.0005 for openwebtext, 0.1 for one text, else 0.05",
              Kind(float)),
    seed=(2357, "nanoGPT's split seed"),
    num_proc=(max(1, (os.cpu_count() or 2) // 2), "tokenizer worker processes"),
    dtype=('auto', "uint16 when the vocabulary fits, else uint32",
           Kind(str, ('auto', 'uint8', 'uint16', 'uint32'))),
    data_root=('data', "the bins go to data_root/<out_name>/"),
    out_name=(None, "None: derived from the dataset", Kind(str)),
    force=(False, "re-run even if a run with the same settings finished (after editing the "
           "source)"),
    progress=(True, "datasets' progress bars (off when train.py prepares an embedded corpus)"),
)
DEFAULTS = defaults(KEYS)
LOCAL_BUILDERS = {'.txt': 'text', '.jsonl': 'json', '.json': 'json', '.parquet': 'parquet'}


# -----------------------------------------------------------------------------
# the embedded corpus: English text every Python installation carries

def stdlib_files():
    """(relative path, text) of every standard-library .py file outside the test suites and
    installed packages, in sorted order: the same bytes on every machine with the same Python."""
    root = sysconfig.get_paths()['stdlib']
    skip = {'site-packages', 'dist-packages', 'test', 'tests', 'idle_test'}
    for path in sorted(glob.glob(os.path.join(root, '**', '*.py'), recursive=True)):
        rel = os.path.relpath(path, root)
        if skip.intersection(rel.split(os.sep)):
            continue
        try:
            with open(path, encoding='utf-8') as f:
                yield rel, f.read()
        except (UnicodeDecodeError, OSError):
            continue


def pydocs_topics():
    """pydocs' first documents: the pydoc topic pages (the language reference behind
    help('if'), ...), one per topic in sorted order. Instant, where the whole corpus parses the
    standard library."""
    from pydoc_data.topics import topics
    return [f"{name}\n\n{text.strip()}\n" for name, text in sorted(topics.items())]


@functools.lru_cache(maxsize=1)
def pydocs_documents():
    """'pydocs': the pydoc topic pages plus the docstrings of every standard-library module, one
    document per topic / per module, in sorted order: the same bytes on every machine with the
    same Python build. A tuple, made once per process (parsing the standard library takes
    seconds)."""
    docs = pydocs_topics()
    for rel, source in stdlib_files():
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        parts = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    module = isinstance(node, ast.Module)
                    title = rel[:-3].replace(os.sep, '.') if module else node.name
                    parts.append(f"{title}\n\n{doc.strip()}\n")
        if parts:
            docs.append('\n'.join(parts))
    return tuple(docs)


@functools.lru_cache(maxsize=1)
def pysource_documents():
    """'pysource': the standard library's own source, one document per module file (its path
    as the first line), in sorted order: about ten times pydocs, for runs that need more
    tokens than pydocs holds without repeating them."""
    return tuple(f"# {rel}\n{source}" for rel, source in stdlib_files())


# the corpora every Python installation carries: offline, byte-level by default (kvgpt/data.py
# names them too: train.py runs this script for one that is not prepared yet)
EMBEDDED = {'pydocs': pydocs_documents, 'pysource': pysource_documents}
assert tuple(EMBEDDED) == EMBEDDED_CORPORA


# -----------------------------------------------------------------------------
# loading: every source becomes a `datasets.Dataset` with a text column

def source_of(c):
    """What the documents are read from: openwebtext loads from hub_id, which may also be a local
    copy with the same schema."""
    return c['hub_id'] if c['dataset'] == 'openwebtext' else c['dataset']


def is_local(name):
    return (os.path.exists(name) or os.path.splitext(name)[1] in LOCAL_BUILDERS
            or name.startswith(('.', '/', '~')))


def local_files(path):
    if not os.path.exists(path):
        raise UserError(f"no such file or folder: {path}")
    files = [path]
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, '**', '*'), recursive=True))
    files = [f for f in files if os.path.isfile(f) and os.path.splitext(f)[1] in LOCAL_BUILDERS]
    if not files:
        raise UserError(f"{path} holds no .txt, .jsonl, .json or .parquet files")
    builders = {LOCAL_BUILDERS[os.path.splitext(f)[1]] for f in files}
    if len(builders) > 1:
        raise UserError(f"{path} mixes file kinds ({', '.join(sorted(builders))}): prepare one "
                        "kind at a time")
    return builders.pop(), files


def check_jsonl(path):
    """The first problem of a JSON-lines file as one line naming the file and the line, or None:
    asked only after datasets failed to read it (or for an empty file), whose own message is a
    traceback's worth."""
    with open(path, encoding='utf-8', errors='replace') as f:
        lines = 0
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            lines += 1
            try:
                json.loads(line)
            except json.JSONDecodeError as e:
                return f"{path} line {number} is not valid JSON ({e.msg}): fix or remove that line"
    if not lines:
        return (f"{path} is empty: a .jsonl needs one JSON object per line, such as "
                '{"text": ...}')
    return None


def first_non_utf8(files):
    """'<path> is not UTF-8 text at byte <offset> (line <n>)' for the first such byte of local
    text files, or None."""
    for path in files:
        if not path.endswith(('.txt', '.jsonl', '.json')):
            continue
        with open(path, 'rb') as f:
            offset = 0
            for number, line in enumerate(f, 1):
                try:
                    line.decode('utf-8')
                except UnicodeDecodeError as e:
                    return f"{path} is not UTF-8 text at byte {offset + e.start:,} (line {number})"
                offset += len(line)
    return None


def not_utf8(source, e):
    """One line for text that is not UTF-8, naming the line of a local file where there is one."""
    where = None
    if is_local(source) and os.path.exists(os.path.expanduser(source)):
        where = first_non_utf8(local_files(os.path.expanduser(source))[1])
    return (f"{where or f'{source} holds text that is not UTF-8 ({e.reason})'}: convert it "
            "to UTF-8 (e.g. iconv -f latin1 -t utf-8) or fix that text")


def not_text(source, column, number, value):
    return (f"{source}: document {number}'s '{column}' is a {type(value).__name__}, not text: "
            "fix it, or name the text column with --text_column")


def check_text_column(ds, c):
    """Every document's text is a string (or empty): a number or a list in the column would
    otherwise fail in a tokenizer worker, with its traceback."""
    feature = ds.features[c['text_column']]
    if getattr(feature, 'dtype', None) in ('string', 'large_string'):
        return
    for number, value in enumerate(ds[c['text_column']], 1):
        if value is not None and not isinstance(value, str):
            raise UserError(not_text(c['dataset'], c['text_column'], number, value))


def import_datasets():
    """Hugging Face's datasets, which reads, splits and maps the documents (requirements.txt);
    missing, one line instead of a traceback."""
    try:
        import datasets
    except ImportError as e:
        raise UserError(f"prepare.py needs the datasets package ({e}): pip install datasets, or "
                        "pip install -r requirements.txt") from None
    quiet_hub()
    return datasets


def load_source(c):
    """The documents: a datasets.Dataset, or with streaming an IterableDataset read in order."""
    datasets = import_datasets()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its errors become ours, one line
    name = c['dataset']
    if name in EMBEDDED:
        ds = datasets.Dataset.from_dict({c['text_column']: list(EMBEDDED[name]())})
        return ds.to_iterable_dataset() if c['streaming'] else ds
    stream = dict(streaming=True) if c['streaming'] else {}
    source = source_of(c)
    if is_local(source):
        builder, files = local_files(os.path.expanduser(source))
        # .txt: one file is one document (the text builder would otherwise split lines)
        extra = {'sample_by': 'document'} if builder == 'text' else {}
        jsonl = [f for f in files if f.endswith('.jsonl')]
        for problem in (check_jsonl(f) for f in jsonl if os.path.getsize(f) == 0):
            raise UserError(problem)
        try:
            ds = datasets.load_dataset(builder, data_files=files, split='train', **extra,
                                       **stream)
        except Exception as e:
            raise UserError(unreadable(source, e, builder)) from None
        if builder == 'text' and c['text_column'] != 'text':
            ds = ds.rename_column('text', c['text_column'])
        return ds
    hub_id = source
    try:
        return datasets.load_dataset(hub_id, c['hub_config'], split='train', **(
            stream or dict(num_proc=c['num_proc'])))
    except Exception as e:
        if 'scripts are no longer supported' in str(e):
            # Skylion007/openwebtext shipped such a script until at least late 2025 (nanoGPT #633)
            raise UserError(f"'{hub_id}' is loaded by a dataset script, which datasets "
                            f"{datasets.__version__} no longer runs: point --hub_id at a parquet "
                            "copy of it, or pass downloaded files with --dataset=path/to/files"
                            ) from None
        raise UserError(f"cannot load '{hub_id}' from the Hugging Face hub ({short(e)}); "
                        "if offline, pass local files instead: --dataset=path/to/docs.jsonl "
                        "(or .txt, .parquet, a folder of them)") from None


def unreadable(source, e, builder=None):
    """One line for a source datasets failed to read, on load or while streaming: the line of a
    local JSON-lines file at fault where there is one, else datasets' own first line."""
    cause = e  # datasets wraps a decoding error (DatasetGenerationError, for a .txt)
    while cause is not None and not isinstance(cause, UnicodeDecodeError):
        cause = cause.__cause__ or cause.__context__
    if cause is not None:
        return not_utf8(source, cause)
    if is_local(source) and os.path.exists(os.path.expanduser(source)):
        _, files = local_files(os.path.expanduser(source))
        for problem in filter(None, map(check_jsonl, [f for f in files if f.endswith('.jsonl')])):
            return problem
    return f"cannot read {source}{f' as {builder}' if builder else ''}: {short(e)}"


def short(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


# -----------------------------------------------------------------------------
# tokenize and write

def tokenize_batch(batch, tokenizer, column):
    tok = get_tokenizer(tokenizer)  # per worker process, cached
    texts = [text or '' for text in batch[column]]
    ids = [tok.encode(text) + [tok.eot] for text in texts]
    return {'ids': ids, 'len': [len(x) for x in ids], 'chars': [len(t) for t in texts]}


def column_sum(ds, name):
    import pyarrow.compute as pc
    return int(pc.sum(ds.data.column(name)).as_py() or 0)


def write_bin(ds, path, dtype):
    """Straight from the Arrow chunks of the tokenized column into a memmap: memory stays
    bounded by one chunk for OpenWebText's 8M documents. (map() writes a fresh table in
    row order, so the chunks are the documents in order.)"""
    total = column_sum(ds, 'len')
    with open(path, 'wb') as f:
        # the disk space up front: a memmap's pages past a full disk would end the process with
        # SIGBUS, where this is an OSError (ENOSPC) and one line
        if hasattr(os, 'posix_fallocate') and total:
            os.posix_fallocate(f.fileno(), 0, total * np.dtype(dtype).itemsize)
    arr = np.memmap(path, dtype=dtype, mode='r+' if total else 'w+', shape=(total,))
    idx = 0
    for chunk in ds.data.column('ids').chunks:
        values = chunk.flatten().to_numpy()
        arr[idx:idx + len(values)] = values
        idx += len(values)
    assert idx == total, (idx, total)
    arr.flush()
    del arr
    with open(path, 'rb+') as f:
        os.fsync(f.fileno())
    return total


def resolve(c):
    c = dict(c)
    name = c['dataset']
    if not isinstance(name, str) or not name:
        raise UserError("--dataset must be a name, a hub id, or a path")
    if name.startswith('~'):  # the shell leaves a ~ after --dataset= as it is
        name = c['dataset'] = os.path.expanduser(name)
    c['tokenizer'] = c['tokenizer'] or ('byte' if name in EMBEDDED else 'gpt2')
    if c['val_size'] is None:
        one_text = is_local(name) and os.path.isfile(name) and name.endswith('.txt')
        c['val_size'] = 0.0005 if name == 'openwebtext' else 0.1 if one_text else 0.05
    if not 0 < c['val_size'] < 1:
        raise UserError(f"val_size must be a fraction in (0, 1), got {c['val_size']}")
    if c['out_name'] is None:
        base = os.path.basename(os.path.normpath(name)) if is_local(name) else name.split('/')[-1]
        c['out_name'] = os.path.splitext(base)[0] or 'corpus'
    if c['num_proc'] < 1:
        raise UserError(f"num_proc must be at least 1, got {c['num_proc']}")
    if c['val_documents'] is not None and c['val_documents'] < 1:
        raise UserError(f"val_documents must be at least 1, got {c['val_documents']}")
    if c['streaming'] and c['val_documents'] is None:
        raise UserError("--streaming=True reads the documents once, in order, so its val split "
                        "is the first documents: set --val_documents (e.g. 10000)")
    if is_local(name) and name not in EMBEDDED and not holds_bins(name):
        local_files(name)  # a missing file is said before the tokenizer is loaded (offline)
    if not is_local(name) and '/' not in name and name not in (*EMBEDDED, 'openwebtext'):
        close = closest(name, (*EMBEDDED, 'openwebtext'), cutoff=0.8)
        if close:  # a misspelt corpus would go to the hub, and fail there offline, slowly
            raise UserError(f"no file, folder or corpus named '{name}': did you mean "
                            f"--dataset={close}? (a hub dataset is named owner/name)")
    if c['streaming'] and is_local(name) and name.endswith('.txt') and os.path.isfile(name):
        raise UserError(f"{name} is one document, split by position: prepare it without "
                        "--streaming")
    return c


def check_outside_source(c, out_dir):
    """The bins and meta.json go outside a source folder: inside it, the next prepare would read
    them as documents."""
    source = source_of(c)
    if not (is_local(source) and os.path.isdir(source)):
        return
    folder, out = os.path.realpath(source), os.path.realpath(out_dir)
    if os.path.commonpath([folder, out]) == folder:
        raise UserError(f"prepare.py would write {out_dir} inside the folder it reads, {source}: "
                        "move the documents out of it, or pass --data_root or --out_name")


def check_destination(out_dir):
    """Refuse a folder that cannot be written before the tokenizing (hours, for a large corpus),
    not after it: the nearest folder on the path that exists must be one, and writable."""
    there = os.path.abspath(out_dir)
    while not os.path.lexists(there):
        there = os.path.dirname(there)
    problem = (errno.ENOTDIR if not os.path.isdir(there) else errno.EROFS if read_only(there)
               else None if os.access(there, os.W_OK | os.X_OK) else errno.EACCES)
    if problem:
        raise UserError(fs_error(OSError(problem, os.strerror(problem)), out_dir))


def pick_dtype(name, vocab_size):
    if name == 'auto':
        name = 'uint16' if vocab_size <= 2 ** 16 else 'uint32'
    if name not in ('uint8', 'uint16', 'uint32'):
        raise UserError(f"dtype must be auto, uint8, uint16 or uint32, got {name}")
    if vocab_size > np.iinfo(name).max + 1:
        raise UserError(f"a vocabulary of {vocab_size} does not fit {name}: use --dtype=auto")
    return name


def split_documents(ds, c):
    """A random val_size share of the documents is val (nanoGPT's split, by its seed)."""
    split = ds.train_test_split(test_size=c['val_size'], seed=c['seed'], shuffle=True)
    split['val'] = split.pop('test')
    return split


def split_head(ds, c):
    """The first val_documents documents are val, the rest train, each in order."""
    n = c['val_documents']
    if n >= len(ds):
        raise UserError(f"{c['dataset']} has {len(ds)} documents: too few for val_documents={n}")
    return {'val': ds.select(range(n)), 'train': ds.select(range(n, len(ds)))}


def split_by_position(ds, c):
    """One document (nanoGPT's input.txt): its last val_size of characters is val, the rest
    train, each a document of its own."""
    datasets = import_datasets()
    text = ds[0][c['text_column']] or ''
    cut = round(len(text) * (1 - c['val_size']))
    if not 0 < cut < len(text):
        raise UserError(f"{c['dataset']} is one document of {len(text)} characters: too short to "
                        f"hold out {c['val_size']:g} of it")
    print(f"{c['dataset']} is one document: the first {1 - c['val_size']:.0%} of its "
          f"{len(text):,} characters are train, the rest val (by position; --val_size sets it)")
    return {s: datasets.Dataset.from_dict({c['text_column']: [part]})
            for s, part in (('train', text[:cut]), ('val', text[cut:]))}


def prepare(c):
    asked, c = c, resolve(c)
    if holds_bins(c['dataset']):
        with preparing(c['dataset']):
            return describe_bins(c, asked)
    out_dir = os.path.join(c['data_root'], c['out_name'])
    check_outside_source(c, out_dir)
    check_destination(out_dir)
    with preparing(out_dir):
        return prepare_into(out_dir, c)


def prepare_into(out_dir, c):
    """The dataset of c written to out_dir, which this process holds."""
    check_replaceable(out_dir)
    settings = {k: c[k] for k in ('dataset', 'hub_id', 'text_column', 'tokenizer', 'val_size',
                                  'seed', 'dtype')}
    settings.update({k: c[k] for k in ('hub_config', 'val_documents') if c[k] is not None})
    meta_path = os.path.join(out_dir, 'meta.json')
    meta = read_json(meta_path, 'meta.json') if os.path.exists(meta_path) else None
    if meta and not c['force'] and not meta_problem(meta):  # a damaged one is made again
        made = meta.get('settings', {'dataset': meta.get('source')})  # older ones: the source
        if made == settings and bins_match_meta(out_dir, meta) is None:
            print(f"{out_dir} is up to date ({meta['train_tokens']:,} train tokens); "
                  "--force=True to redo it")
            return meta
        differ = [f"{k}={made[k]!r}" for k in settings if k in made and made[k] != settings[k]]
        if differ:  # another dataset: a run trained on it could no longer resume
            raise UserError(f"{out_dir} holds another dataset (made with {', '.join(differ)}): "
                            "--force=True replaces it, or choose another --out_name")
    tok = get_tokenizer(c['tokenizer'])  # offline, the GPT-2 BPE may be missing: after the above
    dtype = pick_dtype(c['dtype'], tok.vocab_size)

    if not c['progress']:
        import_datasets().disable_progress_bars()
    ds = load_source(c)
    if c['streaming']:
        return prepare_streamed(ds, c, tok, dtype, out_dir, settings)
    if c['text_column'] not in ds.column_names:
        raise UserError(f"no column '{c['text_column']}' in {c['dataset']} "
                        f"(columns: {', '.join(ds.column_names)}): set --text_column")
    if len(ds) == 0:
        raise UserError(f"{c['dataset']} has no documents")
    check_text_column(ds, c)
    by_position = len(ds) == 1 and c['val_documents'] is None  # one document, cut in two
    if c['val_documents'] is not None:
        split = split_head(ds, c)  # the first documents, as a streamed run takes them
    elif by_position:
        split = split_by_position(ds, c)
    else:
        split = split_documents(ds, c)
    try:  # arrow decodes the text only now, in the workers
        tokenized = {s: split[s].map(tokenize_batch, batched=True,
                                     num_proc=min(c['num_proc'], len(split[s])),
                                     remove_columns=split[s].column_names, desc=f"tokenizing {s}",
                                     fn_kwargs=dict(tokenizer=tok.name, column=c['text_column']))
                     for s in SPLITS}
    except UnicodeDecodeError as e:
        raise UserError(not_utf8(c['dataset'], e)) from None
    n_chars = sum(column_sum(tokenized[s], 'chars') for s in SPLITS)
    if n_chars == 0:
        raise UserError(f"{c['dataset']} is empty: every document's '{c['text_column']}' is blank")

    meta = dict(meta_head(c, tok, dtype, settings), documents=len(ds), characters=n_chars)
    if by_position:
        meta['split'] = 'by position'

    def write(paths):
        for s in SPLITS:
            meta[f'{s}_tokens'] = write_bin(tokenized[s], paths[s], dtype)
            meta[f'{s}_documents'] = len(split[s])
    return write_dataset(out_dir, meta, write)


def meta_head(c, tok, dtype, settings):
    """meta.json's first keys, the same for a streamed and a non-streamed run."""
    return dict(tokenizer=tok.name, vocab_size=tok.vocab_size, eot=tok.eot, dtype=dtype,
                source=c['dataset'], settings=settings)


STREAM_BATCH = 1000  # documents tokenized together (by one worker) when streaming


def stream_batches(ds, column, source):
    batch, documents, number = [], iter(ds), 0
    while True:
        try:
            document = next(documents)
        except StopIteration:
            break
        except Exception as e:  # a streamed source is read only now, so its errors come here
            raise UserError(unreadable(source, e)) from None
        if column not in document:
            raise UserError(f"no column '{column}' in the streamed documents (columns: "
                            f"{', '.join(document)}): set --text_column")
        text, number = document[column], number + 1
        if text is not None and not isinstance(text, str):
            raise UserError(not_text(source, column, number, text))
        batch.append(text)
        if len(batch) == STREAM_BATCH:
            yield {column: batch}
            batch = []
    if batch:
        yield {column: batch}


def prepare_streamed(ds, c, tok, dtype, out_dir, settings):
    """Tokenize while reading, in document order: the first val_documents to val.bin, the rest
    to train.bin, with the same bytes as the non-streamed path with the same val_documents."""
    import multiprocessing
    from tqdm import tqdm
    column, counts = c['text_column'], dict(documents=0, characters=0, val_documents=0)
    meta = meta_head(c, tok, dtype, settings)
    tokenize = functools.partial(tokenize_batch, tokenizer=tok.name, column=column)

    def write(paths):
        files = {s: open(paths[s], 'wb') for s in SPLITS}
        tokens = dict.fromkeys(SPLITS, 0)
        pool = multiprocessing.Pool(c['num_proc']) if c['num_proc'] > 1 else None
        try:
            batches = stream_batches(ds, column, source_of(c))
            out = pool.imap(tokenize, batches) if pool else map(tokenize, batches)
            bar = tqdm(desc='tokenizing (streamed)', unit=' docs', disable=not c['progress'])
            for result in out:
                for ids, chars in zip(result['ids'], result['chars']):
                    s = 'val' if counts['documents'] < c['val_documents'] else 'train'
                    files[s].write(np.asarray(ids, dtype=dtype).tobytes())
                    tokens[s] += len(ids)
                    counts['documents'] += 1
                    counts['characters'] += chars
                bar.update(len(result['ids']))
            bar.close()
        finally:
            if pool:
                pool.terminate()
            for f in files.values():
                f.flush()
                os.fsync(f.fileno())
                f.close()
        if counts['documents'] <= c['val_documents']:
            raise UserError(f"{c['dataset']} has {counts['documents']} documents: too few for "
                            f"val_documents={c['val_documents']}")
        if counts['characters'] == 0:
            raise UserError(f"{c['dataset']} is empty: every document's '{column}' is blank")
        meta.update(documents=counts['documents'], characters=counts['characters'],
                    train_documents=counts['documents'] - c['val_documents'],
                    val_documents=c['val_documents'], streamed=True,
                    **{f'{s}_tokens': tokens[s] for s in SPLITS})
    return write_dataset(out_dir, meta, write)


# -----------------------------------------------------------------------------
# bins tokenized elsewhere (nanoGPT's prepare.py): described in place by a meta.json

def describe_bins(c, asked):
    """A folder of train.bin and val.bin with no meta.json, such as nanoGPT's
    data/openwebtext: meta.json is written beside them (GPT-2 ids as uint16 unless --tokenizer
    and --dtype say otherwise), once every id is checked against the vocabulary. asked: the
    settings as given, before resolve(): --force=True keeps the recorded tokenizer and dtype
    that it does not name."""
    folder = c['dataset']
    meta_path = os.path.join(folder, 'meta.json')
    if os.path.exists(meta_path):
        meta = read_json(meta_path, 'meta.json')
        if not meta.get('described') and c['force']:  # prepare.py's: made again from its source
            raise UserError(f"{folder} holds bins prepare.py made from {meta.get('source')}; "
                            f"to make them again: {remake_command(meta, folder)}")
        if meta.get('described') and c['force']:
            c = dict(c, tokenizer=asked['tokenizer'] or meta['tokenizer'],
                     dtype=meta['dtype'] if asked['dtype'] == 'auto' else asked['dtype'])
        if not c['force']:
            problem = bins_match_meta(folder, meta)
            if problem:
                raise UserError(problem)
            print(f"{folder} is prepared already ({meta.get('tokenizer')}, {meta.get('dtype')}"
                  f"); train on it with {train_flags(c)}"
                  + ("; --force=True describes it again" if meta.get('described') else ""))
            return meta
    if os.path.exists(os.path.join(folder, 'meta.pkl')):
        raise UserError(f"{folder}/meta.pkl marks nanoGPT's character-level ids, which have no "
                        "kvgpt tokenizer: prepare the text itself, e.g. --dataset=input.txt "
                        "--tokenizer=byte")
    tok = get_tokenizer(c['tokenizer'])
    dtype = pick_dtype(c['dtype'], tok.vocab_size)
    settings = {k: c[k] for k in ('dataset', 'tokenizer', 'dtype')}
    meta = dict(meta_head(c, tok, dtype, settings), described=True, digests={})
    for split in SPLITS:
        path = os.path.join(folder, f'{split}.bin')
        size, width = os.path.getsize(path), np.dtype(dtype).itemsize
        if size % width or size == 0:
            raise UserError(f"{path} holds {size} bytes, not a whole number of {dtype} tokens: "
                            "pass the --dtype and --tokenizer it was written with")
        tops = []  # each chunk's largest id, from the digest's own read
        meta['digests'][split] = file_digest(
            path, lambda chunk: tops.append(int(np.frombuffer(chunk, dtype).max())))
        if max(tops) >= tok.vocab_size:
            raise UserError(f"{path} holds token id {max(tops)}, outside {tok.name}'s vocabulary "
                            f"of {tok.vocab_size}: pass the --tokenizer and --dtype it was "
                            "written with")
        meta[f'{split}_tokens'] = size // width
    try:
        write_json(meta_path, meta)
    except OSError as e:
        raise UserError(fs_error(e, meta_path)) from None
    print(f"described {folder}: {meta['train_tokens']:,} train and {meta['val_tokens']:,} val "
          f"tokens ({tok.name}, {dtype}); train on it with {train_flags(c)}")
    return meta


def remake_command(meta, folder):
    """The prepare.py command that writes folder's bins again from their source, by the settings
    its meta.json records."""
    settings = meta.get('settings') or {'dataset': meta.get('source')}
    flags = [f"--{k}={v}" for k, v in settings.items() if k == 'dataset' or v != DEFAULTS.get(k)]
    parent, name = parent_and_name(folder)
    return ' '.join(['python prepare.py', *(shlex.quote(f) for f in flags),
                     shlex.quote(f'--data_root={parent}'), shlex.quote(f'--out_name={name}'),
                     '--force=True'])


def train_flags(c):
    """train.py's flags for the folder c['dataset']: its name, and its parent unless data_root."""
    parent, name = parent_and_name(c['dataset'])
    same = os.path.realpath(parent) == os.path.realpath(c['data_root'])
    return f"--dataset={name}" + ('' if same else f" --data_root={parent}")


def parent_and_name(folder):
    """(the absolute folder holding folder, folder's own name): data_root and the dataset."""
    return os.path.split(os.path.normpath(os.path.abspath(folder)))


# -----------------------------------------------------------------------------
# writing a dataset whole: the new one beside the old, then swapped in, under a lock

def write_dataset(out_dir, meta, write):
    """write(paths) fills both bins (and meta's counts) in a folder of their own beside out_dir,
    then meta.json is written there, and that folder takes out_dir's place in one step
    (replace_folder): a reader of out_dir sees the old dataset or the new one, whole, and a
    failure before the swap leaves the old as it was. Under preparing(out_dir), which holds the
    folder and clears what a killed prepare left."""
    staging, target = beside(out_dir, 'new'), out_dir  # target: what a failure names
    try:
        os.makedirs(staging)
        paths = {s: os.path.join(staging, f'{s}.bin') for s in SPLITS}
        write(paths)
        meta['digests'] = {s: file_digest(paths[s]) for s in SPLITS}
        target = os.path.join(out_dir, 'meta.json')
        write_json(os.path.join(staging, 'meta.json'), meta)
        target = out_dir
        replace_folder(staging, os.path.realpath(out_dir), beside(out_dir, 'old'))
    except OSError as e:  # a full disk reports no file name, and a staged one means nothing
        state = ("the dataset there before is as it was" if os.path.exists(
            os.path.join(out_dir, 'meta.json')) else f"{out_dir} holds no dataset")
        raise UserError(f"{fs_error(e, target)}; {state}") from None
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging, ignore_errors=True)
    print(f"wrote {out_dir}: {meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens "
          f"({meta['tokenizer']}, {meta['dtype']})")
    return meta


def beside(out_dir, what):
    """<parent>/.<name>.<what>: the hidden files and folders a prepare of out_dir keeps next to it
    (its lock, its owner, the new dataset while it is written, the old one while swapped out),
    beside the real folder where out_dir is a link to it."""
    folder = os.path.realpath(out_dir)
    return os.path.join(os.path.dirname(folder), f'.{os.path.basename(folder)}.{what}')


DATASET_FILES = (*BIN_NAMES, 'meta.json')


@contextmanager
def preparing(out_dir):
    """One prepare per dataset folder: an exclusive lock beside it (filelock's; the OS releases it
    however its holder ends), its holder named in .<name>.owner; a second prepare is refused in
    one line that names the first (files.hold_lock). Under it, what a killed prepare left is
    cleared, and said."""
    try:
        os.makedirs(os.path.dirname(beside(out_dir, 'lock')), exist_ok=True)
        lock = hold_lock(beside(out_dir, 'lock'), beside(out_dir, 'owner'), 'prepare.py',
                         lambda holder: f"{out_dir} is being prepared by {holder}: wait for it "
                         "to finish, or stop it")
    except OSError as e:
        raise UserError(fs_error(e, out_dir)) from None
    try:
        clear_leftovers(out_dir)
        yield
    finally:
        if os.path.exists(beside(out_dir, 'owner')):  # while held: no other holder wrote it
            os.remove(beside(out_dir, 'owner'))
        lock.release()


def check_replaceable(out_dir):
    """A prepare replaces the whole folder: one that holds files prepare.py does not write (which
    the swap would take with it) is refused before anything is read."""
    others = sorted(set(os.listdir(out_dir)) - set(DATASET_FILES)) if os.path.isdir(out_dir) \
        else []
    if others:
        raise UserError(f"{out_dir} holds files prepare.py does not write ({', '.join(others)}), "
                        "and a prepare replaces the whole folder: move them out, or choose "
                        "another --out_name")


def clear_leftovers(out_dir):
    """What a prepare killed before it finished left (under its lock, no prepare is writing
    them): the new dataset half-written beside out_dir is removed; the old one, swapped aside
    where renameat2 is missing, is put back if out_dir is missing (a SIGKILL between the two
    renames), else removed; temporary files of earlier versions inside out_dir are removed."""
    said = []
    for what in ('new', 'old'):
        path = beside(out_dir, what)
        if not os.path.lexists(path):
            continue
        if what == 'old' and not os.path.lexists(out_dir):
            os.rename(path, os.path.realpath(out_dir))
            said.append(f"put back {out_dir}, which a killed prepare had moved aside")
            continue
        said.append(f"removed {os.path.basename(path)} ({tree_size(path) / 2 ** 20:.1f} MiB)")
        shutil.rmtree(path)
    for name in (f'{f}.tmp' for f in DATASET_FILES):
        path = os.path.join(out_dir, name)
        if os.path.isfile(path):
            said.append(f"removed {name} ({os.path.getsize(path) / 2 ** 20:.1f} MiB) from "
                        f"{out_dir}")
            os.remove(path)
    if said:
        print(f"a killed prepare of {out_dir} left files: {'; '.join(said)}")


def tree_size(path):
    return sum(os.path.getsize(os.path.join(folder, f))
               for folder, _, names in os.walk(path) for f in names)


def replace_folder(new, dest, aside):
    """Make the folder `new` the folder at dest, and remove the one there before. Where the OS
    can (Linux's renameat2), the two are exchanged in one step, so a reader of dest sees the old
    folder or the new one, never neither and never a mix; elsewhere dest goes to `aside` and new
    takes its place, two renames between which only a SIGKILL can stop this process (SIGINT and
    SIGTERM wait until the swap is done), leaving dest missing and the old folder at aside."""
    with signals_held():
        if not os.path.lexists(dest):
            os.rename(new, dest)
        elif exchange(new, dest):
            shutil.rmtree(new)  # the old folder, now under new's name
        else:
            os.rename(dest, aside)
            try:
                os.rename(new, dest)
            except OSError:
                os.rename(aside, dest)
                raise
            shutil.rmtree(aside)
        sync_folder(os.path.dirname(os.path.abspath(dest)))


def exchange(a, b):
    """Swap the paths a and b in one step (renameat2's RENAME_EXCHANGE, Linux 3.15 on); False
    where this OS or the filesystem cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), 'renameat2', None)
    if renameat2 is None:
        return False
    at_cwd, rename_exchange = -100, 2
    if renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), b)


@contextmanager
def signals_held():
    """SIGINT and SIGTERM held back until the block is done, then delivered (on POSIX)."""
    if not hasattr(signal, 'pthread_sigmask'):
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def sync_folder(path):
    """A folder's entries on disk (its renames survive a power cut), where the OS allows."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def interrupts_stop_the_main_process():
    """Ctrl-C signals every process in the terminal's group. The tokenizer workers are forked,
    so they inherit this handler: they ignore the signal, and the main process alone stops (its
    temporary files removed), shutting them down. Otherwise each worker prints a traceback, and
    the pool's own shutdown may fail or wait on them."""
    main_pid = os.getpid()

    def on_interrupt(signum, frame):
        if os.getpid() == main_pid:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_interrupt)


def main(argv=None):
    c = parse_config(KEYS, argv, show=True, usage=__doc__)
    interrupts_stop_the_main_process()
    return prepare(c)


if __name__ == '__main__':
    run_main(main)
