"""
The data format and its reading: data/<name>/{train,val}.bin (flat token ids) and meta.json,
which prepare.py writes; the Dataset that train.py draws its windows from (the windows of step k
depend on (data_seed, k) alone), reading files it holds open and checks before each save
(Dataset.changed); llm.c's token shards read as a dataset; and the checks that data is whole
before anything trusts it. Nothing here tokenizes or writes a dataset.
"""

import glob
import hashlib
import os
import subprocess
import sys

import numpy as np
import torch
from filelock import FileLock

from kvgpt.config import closest
from kvgpt.errors import UserError, fs_error
from kvgpt.files import read_json
from kvgpt.tokenizer import TOKENIZERS


# -----------------------------------------------------------------------------
# the format

SPLITS = ('train', 'val')


BIN_NAMES = tuple(f'{split}.bin' for split in SPLITS)


META_TYPES = dict(tokenizer=str, vocab_size=int, dtype=str, train_tokens=int, val_tokens=int)


BIN_DTYPES = ('uint8', 'uint16', 'uint32')


CHECKED_AT_OPEN = 2 ** 20  # tokens at each end of each split whose ids are checked when opened


def meta_problem(meta):
    """None when meta.json has every key train.py reads, of the right type, else what is not."""
    if not isinstance(meta, dict):
        return f"it holds a {type(meta).__name__}, not an object"
    for key, kind in META_TYPES.items():
        if key not in meta:
            return f"it has no '{key}'"
        if type(meta[key]) is not kind:
            return f"its '{key}' is {meta[key]!r}, not a {kind.__name__}"
    if meta['dtype'] not in BIN_DTYPES:
        return f"its dtype {meta['dtype']!r} is not one of {', '.join(BIN_DTYPES)}"
    if meta['tokenizer'] not in TOKENIZERS:  # else it trains, and sample.py cannot read it
        return f"its tokenizer {meta['tokenizer']!r} is not one of {', '.join(TOKENIZERS)}"
    digests = meta.get('digests', {})
    if not (isinstance(digests, dict) and all(isinstance(v, str) for v in digests.values())):
        return f"its 'digests' is {digests!r}, not an object of texts"
    return None


def bins_match_meta(data_dir, meta):
    """None when meta.json is whole and both bins have exactly the size it records (a whole
    number of its dtype's tokens), else what is wrong."""
    problem = meta_problem(meta)
    if problem:
        return (f"{os.path.join(data_dir, 'meta.json')} is damaged ({problem}): "
                "re-run prepare.py for this dataset with --force=True")
    for split in SPLITS:
        path = os.path.join(data_dir, f'{split}.bin')
        size = os.path.getsize(path) if os.path.exists(path) else -1
        want = meta[f'{split}_tokens'] * np.dtype(meta['dtype']).itemsize
        if size != want:
            found = "is missing" if size < 0 else f"has {size:,} bytes, not {want:,}"
            return (f"{path} {found} (meta.json records {meta[f'{split}_tokens']:,} "
                    f"{meta['dtype']} tokens): re-run prepare.py with --force=True")
    return None


# -----------------------------------------------------------------------------
# reading: the windows of a step

def key_generator(key):
    """A torch generator seeded by key (a tuple of ints) alone: the same draws on every machine,
    restart and world size."""
    seed = int(np.random.SeedSequence(list(key)).generate_state(1)[0])
    return torch.Generator().manual_seed(seed)


class Dataset:
    """A prepared dataset that gives (x, y) token windows, read from its files as the run opened
    them: they stay open, so a prepare that replaces them cannot change what a batch reads, and
    changed() tells whether they changed since (every save asks it first)."""

    def __init__(self, data_dir, meta, block_size, parts=None):
        self.dir, self.meta, self.block_size = data_dir, meta, block_size
        # each split is a list of (file, byte offset of its tokens, token count): one bin, or the
        # llm.c shards of open_shards, read as one sequence
        self.parts = parts or {split: [(os.path.join(data_dir, f'{split}.bin'), 0,
                                        meta[f'{split}_tokens'])] for split in SPLITS}
        self.files = {path: open(path, 'rb') for split in SPLITS
                      for path, _, _ in self.parts[split]}
        self.opened_as = {path: identity(f) for path, f in self.files.items()}

    def tokens(self, split):
        return self.meta[f'{split}_tokens']

    def starts(self, split, count, *key):
        """`count` window starts drawn from a generator seeded by key alone: the same windows for
        every model, restart and world size."""
        high = self.tokens(split) - self.block_size - 1
        return torch.randint(high, (count,), generator=key_generator(key)).numpy()

    def tiling(self, split, batch_size):
        """Batches of up to batch_size window starts, with their window length, in which every
        token of the split after the first is a target exactly once, in order: full windows end
        to end, then one shorter window for the remainder. Nothing random: the same tokens for
        every run."""
        targets, block = self.tokens(split) - 1, self.block_size
        starts = np.arange(targets // block) * block
        batches = [(starts[i:i + batch_size], block) for i in range(0, len(starts), batch_size)]
        if targets % block:
            batches.append((np.array([len(starts) * block]), targets % block))
        return batches

    def read(self, split, start, stop):
        """Tokens [start, stop) of the split, across its files. Read, not mapped: a file cut
        short under the run is a short read, stopped in one line, where a memory map's pages past
        its new end would end the process (SIGBUS)."""
        pieces, offset = [], 0
        for path, byte_offset, count in self.parts[split]:
            lo, hi = max(start - offset, 0), min(stop - offset, count)
            if lo < hi:
                tokens = np.empty(hi - lo, dtype=self.meta['dtype'])
                self.files[path].seek(byte_offset + lo * tokens.itemsize)
                if self.files[path].readinto(tokens) != tokens.nbytes:
                    raise UserError(self.changed() or f"{path} ended before its tokens")
                pieces.append(tokens)
            offset += count
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def check_ids(self, split, tokens):
        """Token ids at or above the vocabulary would index past the embedding (on CUDA, a
        device-side assert): a damaged bin, or one made with another tokenizer."""
        top = int(tokens.max()) if tokens.size else 0
        if top >= self.meta['vocab_size']:
            raise UserError(f"{self.dir}/{split}.bin holds token id {top}, at or above the "
                            f"vocabulary of {self.meta['vocab_size']} in meta.json: the file is "
                            "damaged or from another tokenizer; re-run prepare.py with "
                            "--force=True")

    def batch(self, split, starts, device='cpu', length=None):
        """Inputs and next-token targets (len(starts), length or block_size) as int64, on
        device; their ids checked against the vocabulary (on the host, before the copy: free)."""
        length = length or self.block_size
        windows = np.stack([self.read(split, s, s + length + 1) for s in starts])
        self.check_ids(split, windows)
        xy = torch.from_numpy(windows.astype(np.int64))
        x, y = xy[:, :-1].contiguous(), xy[:, 1:].contiguous()
        if str(device).startswith('cuda'):  # pinned, so the copy may overlap the GPU's work
            return (x.pin_memory().to(device, non_blocking=True),
                    y.pin_memory().to(device, non_blocking=True))
        return x.to(device), y.to(device)  # any other device (mps), synchronously

    def changed(self):
        """None while every file is as the run opened it, else the one line that stops the run:
        a file truncated, written in place or replaced (by another prepare.py) since. A run that
        went on would save a model of two datasets; a save asks this first, so none does."""
        for path, was in self.opened_as.items():
            change = what_changed(os.path.basename(path), was, identity(path))
            if change:
                return (f"{self.dir} changed under this run ({change}): stopped, with nothing "
                        "saved from the new data; put back the data it was trained on and resume "
                        "(--init_from=resume), or train on the new data in a new out_dir")
        return None

    def close(self):
        for f in self.files.values():
            f.close()


def open_dataset(data_root, name, block_size):
    """The dataset data_root/<name>: prepare.py's bins and meta.json, or else llm.c shards."""
    data_dir = os.path.join(data_root, name)
    meta_path = os.path.join(data_dir, 'meta.json')
    if not os.path.exists(meta_path):
        bins = glob.glob(os.path.join(glob.escape(data_dir), '*.bin'))
        if unfinished_prepare(data_dir):
            raise UserError(f"{data_dir} has train.bin and val.bin but no meta.json: if they "
                            "are nanoGPT's (GPT-2 ids, uint16), `python prepare.py "
                            f"--dataset={data_dir}` describes them; if a prepare.py run was "
                            "killed, run it again")
        if bins:
            return open_shards(data_dir, block_size)
        raise UserError(missing_dataset(data_root, name))
    meta = read_json(meta_path, 'meta.json')
    problem = bins_match_meta(data_dir, meta)
    if problem:
        raise UserError(problem)
    return checked(Dataset(data_dir, meta, block_size))


def missing_dataset(data_root, name):
    """What to do when data_root/<name> holds nothing to read. --dataset names the folder that
    prepare.py wrote, which a source file or path gives without its folders and extension."""
    root = '' if os.path.normpath(data_root) == 'data' else f" --data_root={data_root}"
    data_dir = os.path.join(data_root, name)
    prepared = os.path.splitext(os.path.basename(os.path.normpath(name)))[0]
    if not prepared or prepared == name:
        made = glob.glob(os.path.join(glob.escape(data_root), '*', 'meta.json'))
        names = {*EMBEDDED_CORPORA, *(os.path.basename(os.path.dirname(m)) for m in made)}
        close = closest(name, sorted(names), cutoff=0.8)
        if close:
            return (f"no prepared dataset at {data_dir}: did you mean --dataset={close}? "
                    f"(or run `python prepare.py --dataset={name}{root}` first)")
        return (f"no prepared dataset at {data_dir}: run "
                f"`python prepare.py --dataset={name}{root}` first")
    if os.path.exists(os.path.join(data_root, prepared, 'meta.json')):
        return (f"--dataset names a folder under {data_root}, not the source: pass "
                f"--dataset={prepared}")
    return (f"no prepared dataset at {data_dir}: --dataset names a folder under {data_root}, "
            f"not the source; run `python prepare.py --dataset={name}{root}`, then train with "
            f"--dataset={prepared}")


def holds_bins(folder):
    """Whether folder holds a train.bin and a val.bin, prepare.py's or nanoGPT's."""
    return os.path.isdir(folder) and all(os.path.isfile(os.path.join(folder, f'{s}.bin'))
                                         for s in SPLITS)


def unfinished_prepare(data_dir):
    """Whether data_dir holds prepare.py's own train.bin and val.bin with no meta.json (llm.c
    shards have none either, and begin with their magic number)."""
    if not holds_bins(data_dir):
        return False
    with open(os.path.join(data_dir, 'train.bin'), 'rb') as f:
        header = np.frombuffer(f.read(4), dtype='<i4')
    return len(header) < 1 or header[0] != SHARD_MAGIC


# -----------------------------------------------------------------------------
# what tells a file from its replacement or a change in place

def identity(file):
    """What tells a file (a path, or an open file) from its replacement or a change in place;
    None for a path where there is no file."""
    try:
        info = os.fstat(file.fileno()) if hasattr(file, 'fileno') else os.stat(file)
    except FileNotFoundError:
        return None
    # the change time too: a copy that keeps the modification time (cp -p, rsync -a --inplace)
    # sets it back, but nothing can set back the change time
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def what_changed(name, was, now):
    """How the file called name changed from the identity was to now, in words, or None."""
    if now is None:
        return f"{name} was removed"
    if now[:2] != was[:2]:
        return f"{name} was replaced by another file"
    if now[2] != was[2]:
        return f"{name} now has {now[2]:,} bytes, not {was[2]:,}"
    if now != was:
        return f"{name} was written to"
    return None


# -----------------------------------------------------------------------------
# llm.c's token shards

# llm.c's and modded-nanogpt's pre-tokenized shards (e.g. fineweb_train_000001.bin): a header of
# 256 int32 (magic, version, token count, zeros), then the GPT-2 token ids as uint16
SHARD_MAGIC, SHARD_VERSION, SHARD_HEADER = 20240520, 1, 256 * 4


def shard_tokens(path):
    """The token count of one shard, its header and size checked."""
    with open(path, 'rb') as f:
        header = np.frombuffer(f.read(SHARD_HEADER), dtype='<i4')
    size = os.path.getsize(path)
    if len(header) < 3 or header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION:
        found = f"magic {header[0]}, version {header[1]}" if len(header) >= 3 else "no header"
        raise UserError(f"{path} is not an llm.c token shard ({found}; expected magic "
                        f"{SHARD_MAGIC}, version {SHARD_VERSION}): remove it from the folder, "
                        "or prepare the corpus with prepare.py")
    if size != SHARD_HEADER + 2 * int(header[2]):
        raise UserError(f"{path} has {size:,} bytes, but its header records {int(header[2]):,} "
                        "uint16 tokens after 1,024 header bytes: the shard is truncated or "
                        "damaged; download it again")
    return int(header[2])


def open_shards(data_dir, block_size):
    """A folder of llm.c shards with no meta.json: every *.bin with 'val' in its name is the val
    split, the rest train, each split its shards in name order read as one sequence."""
    files = sorted(glob.glob(os.path.join(glob.escape(data_dir), '*.bin')))
    parts = {'val': [f for f in files if 'val' in os.path.basename(f)]}
    parts['train'] = [f for f in files if f not in parts['val']]
    for split in SPLITS:
        if not parts[split]:
            raise UserError(f"{data_dir} holds .bin shards but none for {split} (a shard is "
                            "val when its name has 'val' in it): add them, or run prepare.py")
        parts[split] = [(f, SHARD_HEADER, shard_tokens(f)) for f in parts[split]]
    meta = dict(tokenizer='gpt2', vocab_size=50257, dtype='uint16', source='llm.c shards',
                **{f'{s}_tokens': sum(p[2] for p in parts[s]) for s in SPLITS})
    return checked(Dataset(data_dir, meta, block_size, parts))


def checked(data):
    """A dataset just opened: each split holds a window, and its ids at both ends are in range (a
    cheap look; each batch is checked as it is read)."""
    for split in SPLITS:
        n = data.tokens(split)
        if n <= data.block_size + 1:
            raise UserError(f"{data.dir}'s {split} split has {n} tokens, too few for block_size "
                            f"{data.block_size}")
        data.check_ids(split, data.read(split, 0, CHECKED_AT_OPEN))
        data.check_ids(split, data.read(split, max(0, n - CHECKED_AT_OPEN), n))
    return data


# -----------------------------------------------------------------------------
# a dataset against a model and a checkpoint

def check_fits(meta, vocab_size, model_block, block_size):
    """The dataset's ids index into the model's vocabulary, and its windows fit the model."""
    if vocab_size < meta['vocab_size']:
        raise UserError(f"the model's vocab_size {vocab_size} is smaller than the dataset's "
                        f"{meta['vocab_size']} ({meta['tokenizer']}): raise vocab_size or leave "
                        "it None")
    if block_size > model_block:
        raise UserError(f"block_size {block_size} is longer than the model's {model_block}")


def check_same_data(saved, meta, checkpoint, data_dir):
    """A resume continues on the data its checkpoint was trained on: saved is the meta.json the
    checkpoint recorded (nanoGPT's and converted checkpoints record none). The bins' digests are
    compared where both record them (data prepared before they were recorded has none), and then
    the bins themselves with them: one read of each, paid once a resume (a 9 GB bin: seconds,
    docs/training.md), where a change in place that kept the file's size would otherwise pass."""
    if not saved:
        return
    differ = [f"{k} {saved.get(k)!r} != {meta.get(k)!r}" for k in META_TYPES
              if saved.get(k) != meta.get(k)]
    if not differ and 'digests' in saved and 'digests' in meta:
        differ = [f"{s}.bin's content differs (the same {meta[f'{s}_tokens']:,} tokens)"
                  for s in SPLITS if saved['digests'].get(s) != meta['digests'].get(s)]
    if differ:
        raise UserError(f"{checkpoint} was trained on other data than {data_dir} "
                        f"({', '.join(differ)}): resume on the data it was trained on; to train "
                        f"its weights on this data, --init_from={checkpoint} --finetune=True "
                        "with a new out_dir")
    changed = [s for s in SPLITS if s in saved.get('digests', {})
               and file_digest(os.path.join(data_dir, f'{s}.bin')) != saved['digests'][s]]
    if changed:
        raise UserError(f"{data_dir}/{changed[0]}.bin is not the file its meta.json records (its "
                        f"bytes were changed in place since it was prepared), so not the data "
                        f"{checkpoint} was trained on: put back that data and resume, or prepare "
                        "again with --force=True and train in a new out_dir")


# -----------------------------------------------------------------------------
# the bins' digests, which meta.json records

def file_digest(path, each_chunk=None):
    """A bin's BLAKE2b digest, in hex: meta.json records it, so that a resume on other data of
    the same size is refused (check_same_data). One sequential read, after the bin is written;
    each_chunk(bytes) sees every chunk of it (2**24 bytes, a whole number of any dtype's ids)."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(2 ** 24), b''):
            digest.update(chunk)
            if each_chunk is not None:
                each_chunk(chunk)
    return digest.hexdigest()


# -----------------------------------------------------------------------------
# the embedded corpora, prepared on first use

EMBEDDED_CORPORA = ('pydocs', 'pysource')  # prepare.py's corpora that every Python carries
PREPARE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'prepare.py')


def open_or_prepare(data_root, name, block_size, master=True, barrier=None):
    """open_dataset, after running prepare.py for an embedded corpus (pydocs, pysource) that is not
    there yet: runs started together wait on a lock while the first prepares it; under DDP rank 0
    prepares and every rank waits at barrier(). Data flows one way: prepare.py writes the bins,
    and a reader runs it as the script it is, never importing the writer."""
    meta_path = os.path.join(data_root, name, 'meta.json')
    if name in EMBEDDED_CORPORA and not os.path.exists(meta_path):
        if master:
            try:
                os.makedirs(data_root, exist_ok=True)
            except OSError as e:
                raise UserError(f"{fs_error(e, data_root)} (the run's --data_root)") from None
            with FileLock(os.path.join(data_root, '.prepare.lock')):
                if not os.path.exists(meta_path):
                    print(f"no prepared {name} in {data_root}/: preparing the embedded corpus "
                          "first (offline, ~10 s)", flush=True)
                    run_prepare(name, data_root)
        if barrier is not None:
            barrier()
    return open_dataset(data_root, name, block_size)


def run_prepare(name, data_root):
    """python prepare.py --dataset=name; its one-line error is this one's."""
    done = subprocess.run([sys.executable, PREPARE, f'--dataset={name}',
                           f'--data_root={data_root}', '--progress=False'],
                          capture_output=True, text=True)
    print(done.stdout, end='', flush=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        raise UserError(f"preparing {name} failed: {lines[-1].removeprefix('error: ')}")
