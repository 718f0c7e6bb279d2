"""
Failures a user can fix, and how every script reports them: one line on stderr, exit code 2, no
traceback (KVGPT_DEBUG=1 shows it); a filesystem failure names the path and what to do.
"""

import errno
import importlib
import logging
import os
import signal
import sys
import traceback
from contextlib import contextmanager


class UserError(Exception):
    """A failure the user can fix: printed as one line, no traceback, exit code 2."""


class SameOnEveryRank(UserError):
    """A UserError that every process of a torchrun meets alike (the settings, the world size):
    rank 0 alone prints it, so it is said once; the others exit with the same code."""


@contextmanager
def model_errors(source=None):
    """model.py imports nothing from this project (copy it anywhere), so it raises ValueError,
    TypeError or ImportError with a clear message; around a call into it, this makes them the
    one-line error."""
    try:
        yield
    except (ValueError, TypeError, ImportError) as e:
        raise UserError(f"{source}: {e}" if source else str(e)) from None


def quiet_hub(*then):
    """Offline, huggingface_hub logs a warning line for each retry of a download before the
    error that says it once. Its import sets its logger's level, and so does the import of the
    libraries that use it (transformers, datasets), so this imports it and those named in then
    first; HF_HUB_VERBOSITY, if set, still rules."""
    if 'HF_HUB_VERBOSITY' in os.environ:
        return
    for name in ('huggingface_hub', *then):
        try:
            importlib.import_module(name)
        except ImportError:  # the caller says what is missing, when it needs it
            if name == 'huggingface_hub':
                return
    logging.getLogger('huggingface_hub').setLevel(logging.ERROR)


ELSEWHERE = "free space, or choose a folder on another disk"


PERMISSIONS = "fix its permissions, or choose another path"


IN_THE_WAY = "a file is in the way where a folder should be: move it, or choose another folder"


FS_ADVICE = {  # what to do about a filesystem failure, by its errno
    errno.ENOSPC: f"the disk is full: {ELSEWHERE}",
    errno.EDQUOT: f"the disk quota is used up: {ELSEWHERE}",
    errno.EROFS: "the filesystem is read-only: choose a writable folder",
    errno.EACCES: f"permission denied: {PERMISSIONS}",
    errno.EPERM: f"not permitted: {PERMISSIONS}",
    errno.EEXIST: IN_THE_WAY, errno.ENOTDIR: IN_THE_WAY,
    errno.EIO: "the disk reported an I/O error: check its health and free space",
}


WRITES_ONLY = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}  # failures no read can have


def fs_error(e, path=None, doing='write'):
    """The one line for an OSError at the filesystem boundary: the path, what went wrong and what
    to do about it."""
    advice = FS_ADVICE.get(e.errno, "check the path and the disk")
    return f"cannot {doing} {path or e.filename or 'a file'} ({e.strerror or e}): {advice}"


def quiet_imports(name):
    """Called first by each script, with its __name__: when it runs as the script (not imported),
    Ctrl-C during its imports (torch's take seconds) is the one line "interrupted" and exit code
    130, as during main(), not a traceback from deep in an import. run_main puts Python's own
    handler back before main()."""
    if name == '__main__':
        signal.signal(signal.SIGINT, lambda signum, frame: interrupted())


def run_main(main):
    """Run a script's main(): a user error, or a filesystem failure no caller explained more
    closely, is one line on stderr and exit code 2 (KVGPT_DEBUG=1 prints the traceback instead,
    with the same exit code); Ctrl-C is "interrupted" and exit code 130; anything else is a bug,
    and Python's traceback and exit code 1 say so."""
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # quiet_imports' no longer
    except ValueError:  # not the main thread: its handler was never replaced
        pass
    try:
        main()
    except BrokenPipeError:  # `python sample.py ... | head`: the reader has gone, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush works
        sys.exit(141)
    except KeyboardInterrupt:
        interrupted()
    except Exception as e:
        debug = os.environ.get('KVGPT_DEBUG') == '1'
        if during_interrupt(e) and not debug:  # a library's cleanup, failing on the way out
            interrupted()
        if not isinstance(e, (UserError, OSError)):
            raise
        if debug:
            traceback.print_exc()
            sys.exit(2)
        if not isinstance(e, UserError):  # from a read or a write: only some errors tell which
            e = fs_error(e, doing='write' if e.errno in WRITES_ONLY else 'read or write')
        if not (isinstance(e, SameOnEveryRank) and os.environ.get('RANK', '0') != '0'):
            print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def interrupted():
    print("interrupted", file=sys.stderr)
    sys.exit(130)


def during_interrupt(e):
    """Whether e was raised while a KeyboardInterrupt was being handled."""
    while e is not None:
        if isinstance(e, KeyboardInterrupt):
            return True
        e = e.__context__
    return False
