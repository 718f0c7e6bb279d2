"""
Files that are never half-written: each is written to a temporary name, then renamed over the old
one; the JSON and JSON-lines files (plain or gzipped) a run and a dataset keep; and the lock that
lets one process at a time write a run's folder or a dataset's.
"""

import gzip
import json
import os
import pathlib
import socket
import time
import zlib

from filelock import FileLock, Timeout

from kvgpt.errors import UserError


def atomic_write(path, write, before_replace=None):
    """write(tmp_path) produces the file; it appears at path only once complete. before_replace:
    called once the new file is whole and before it replaces the old one; if it raises, the old
    file stays (a checkpoint's record is written there, so it never lags the checkpoint)."""
    tmp = f"{path}.tmp"
    try:
        write(tmp)
        with open(tmp, 'rb+') as f:
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def hold_lock(path, owner, script, in_use):
    """An exclusive lock on the file path (filelock's: flock on POSIX, msvcrt on Windows), which
    the OS releases when the process ends however it ends, so a crash never leaves a stale lock;
    the file owner names its holder (script, pid, host). Held elsewhere: UserError(in_use(holder)).
    Returns the held FileLock; an OSError (a folder it cannot write) is the caller's to name."""
    lock = FileLock(path, timeout=0)
    for _ in range(20):
        try:
            lock.acquire()
            break
        except Timeout:
            try:
                holder = pathlib.Path(owner).read_text().strip()
            except OSError:
                holder = ''
            if holder:
                raise UserError(in_use(holder)) from None
            time.sleep(0.05)  # a holder not yet named, or letting go: look again
    else:
        raise UserError(in_use('another process'))
    try:
        pathlib.Path(owner).write_text(f"{script} (pid {os.getpid()} on {socket.gethostname()})")
    except OSError:
        lock.release()
        raise
    return lock


def read_only(folder):
    """Whether folder is on a filesystem mounted read-only (os.access cannot tell that from a
    folder this process may not write)."""
    return hasattr(os, 'statvfs') and bool(os.statvfs(folder).f_flag & os.ST_RDONLY)


def write_text(path, text):
    atomic_write(path, lambda tmp: pathlib.Path(tmp).write_text(text))


def write_gzip(path, data):
    """data (bytes) gzipped at path. The same data gives the same bytes (the header holds no time
    and no file name), so writing a file again leaves git nothing to commit."""
    atomic_write(path, lambda tmp: pathlib.Path(tmp).write_bytes(gzip.compress(data, mtime=0)))


def write_json(path, obj):
    write_text(path, json.dumps(obj, indent=2) + '\n')


def read_json(path, what):
    try:
        return json.loads(pathlib.Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"{what} not found at {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{what} at {path} is not valid JSON ({e}); delete it and regenerate it"
                        ) from None


def read_lines(path):
    """A file's lines as bytes, through gzip where its name ends in .gz."""
    data = pathlib.Path(path).read_bytes()
    if str(path).endswith('.gz'):
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as e:  # cut short, or not gzip at all
            raise UserError(f"{path} is not a whole gzip file ({e}): restore it from git"
                            ) from None
    return data.splitlines()


def read_jsonl(path):
    """The entries of a JSON-lines log, without a last line cut short by a crash (or ending in
    bytes that are not text); a damaged line before the last is one line of error. A path ending
    in .gz is read through gzip (the lab commits a finished run's log compressed)."""
    lines = read_lines(path)
    entries = []
    for n, line in enumerate(lines, 1):
        try:
            entries.append(json.loads(line.decode('utf-8')))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            if n < len(lines):
                raise UserError(f"{path} is damaged at line {n} of {len(lines)} "
                                f"({type(e).__name__}): repair or remove that line, then run "
                                "again") from None
    return entries
