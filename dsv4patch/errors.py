"""Error types, each carrying the exit code the CLI returns for it.

Every error a user can hit says what was wrong (which lock, pin, patch, file,
hunk) and what to do next; ``main`` prints ``str(error)`` and exits with
``error.exit_code`` (and, with ``--format json``, prints it as one JSON
object).  Anything else that escapes a command is a bug: ``main`` reports it
as an internal error with its own code.  The codes are documented in the
README and ``--help`` (``main.EPILOG``); keep the three in sync.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

# Exit codes (keep in sync with README "Exit codes" and main.EPILOG).
EXIT_OK = 0
EXIT_UNEXPECTED = 1  # a check/verify result differs from what the lock expects
EXIT_USAGE = 2  # bad command line (argparse, bad option values, bad environment values)
EXIT_INPUT = 3  # bad lock file or patch file
EXIT_FETCH = 4  # source could not be fetched or verified; cache unusable or full
EXIT_TREE = 5  # target tree is dirty, at another commit, not the pin's, not ours, or not writable / full
EXIT_BUSY = 6  # another dsv4patch holds the cache or tree lock
EXIT_BUILD = 7  # kernel build / test environment failed
EXIT_CHILD = 8  # a program dsv4patch ran hung past its deadline, flooded its output, or could not start
EXIT_INTERNAL = 70  # a bug in dsv4patch or a git failure it did not expect: please report
EXIT_INTERRUPTED = 130  # SIGINT, SIGTERM or SIGHUP (Ctrl-C, `timeout`, a CI runner's cancel)
EXIT_BROKEN_PIPE = 141  # stdout's reader went away (`| head`); 128 + SIGPIPE, as a shell reports it

# errno values that mean "the file system cannot take this write".
_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}


class Dsv4Error(Exception):
    exit_code = EXIT_INTERNAL
    kind = "internal"


def param(name: str) -> str:
    """A parameter named in a core message (``--lock``'s is ``lock``): the command line shows it
    in its own spelling (``commands/_words.py``), the core never spells an option."""
    return f"\u27e8{name}\u27e9"


class ParameterError(Dsv4Error):
    """A value given to the core (a parameter: an option, an environment variable) it cannot use.

    Raised below ``commands/``; the message names parameters with :func:`param`."""

    exit_code = EXIT_USAGE
    kind = "usage"


class UsageError(ParameterError):
    """A bad command line: argparse's own errors and a command's checks of its options
    (raised only in ``main.py`` and ``commands/``; ``tests/test_architecture.py`` checks it)."""


class LockFileError(Dsv4Error):
    """The lock file is unreadable, malformed or inconsistent."""

    exit_code = EXIT_INPUT
    kind = "lock-file"


class PatchFileError(Dsv4Error):
    """A patch or series file is missing, empty, malformed or unsafe."""

    exit_code = EXIT_INPUT
    kind = "patch-file"


class FetchError(Dsv4Error):
    """A pinned source could not be downloaded, fetched or verified."""

    exit_code = EXIT_FETCH
    kind = "fetch"


class NotFetchedError(FetchError):
    """A source that is not cached could not be reached (offline, remote gone).

    ``check`` reports the other pins and marks this one ``not-fetched``; every
    other command stops with it as a FetchError.
    """


class IntegrityError(FetchError):
    """Downloaded bytes do not match the lock's hash or size."""

    kind = "integrity"


class CacheError(Dsv4Error):
    """The cache directory cannot be used (read-only, not a directory, full)."""

    exit_code = EXIT_FETCH
    kind = "cache"


class TreeError(Dsv4Error):
    """The target tree is not in a state we may touch, or cannot be written."""

    exit_code = EXIT_TREE
    kind = "tree"


class SourceMovedError(TreeError):
    """A ``local`` pin's checkout is not at the pin's commit or has uncommitted changes (the maintainer
    works in it). ``check`` reports the other pins and marks this one ``source-moved``; every other
    command stops with it."""


class BusyError(Dsv4Error):
    """Another process holds a lock we need."""

    exit_code = EXIT_BUSY
    kind = "busy"


class BuildError(Dsv4Error):
    """Compiling kernels or creating the test environment failed."""

    exit_code = EXIT_BUILD
    kind = "build"


class ChildError(Dsv4Error):
    """A program dsv4patch ran (nvcc, a ``--python``, pip, pytest, an engine) misbehaved.

    It ran past its deadline, printed more than it may, or could not be started
    at all (``start_failed``); see :mod:`dsv4patch.childproc`.  dsv4patch ended
    it and every process it started before raising this.  Callers that know
    better (``--python X`` is not an interpreter: a usage error) convert it.
    """

    exit_code = EXIT_CHILD
    kind = "child"

    def __init__(self, message: str, *, start_failed: bool = False) -> None:
        super().__init__(message)
        self.start_failed = start_failed


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP arrived (``childproc.interrupts``); ``main`` exits 130 with "interrupted".

    A ``KeyboardInterrupt``, so no ``except Exception`` swallows it and the
    cleanup in every ``finally`` runs; never a result.
    """

    def __init__(self, signum: int | None = None) -> None:
        super().__init__(signum)
        self.signum = signum


class GitError(Dsv4Error):
    """git itself failed in a way we did not expect."""

    exit_code = EXIT_INTERNAL
    kind = "git"


class MissingObjectError(GitError):
    """A user's checkout lacks an object git needs (its object store is incomplete or damaged): the
    checkout's state to mend, not a bug (exit 5).  A GitError, so what catches git's failures still does."""

    exit_code = EXIT_TREE
    kind = "tree"


def disk_trouble(text: str) -> bool:
    """Does an error text (git's stderr, an OSError) say the file system refused a write?"""
    lowered = text.lower()
    return any(s in lowered for s in (
        "no space left", "out of diskspace", "disk quota", "file too large", "read-only file system",
        "permission denied", "unable to write", "unable to create", "short write",
        "failed to write", "unable to append", "not writable",
    ))


@contextmanager
def writing(cls: type[Dsv4Error], where: str, advice: str) -> Iterator[None]:
    """Turn a failed write under ``where`` (OSError, or git failing to write) into ``cls``.

    Used around the steps that write into the cache (``CacheError``, exit 4)
    and into a work tree (``TreeError``, exit 5), so a full or read-only disk
    is reported as the place the user must fix, not as a crash.  Other
    errors pass through unchanged.
    """
    try:
        yield
    except OSError as exc:
        if exc.errno not in _DISK_ERRNOS:
            raise
        raise cls(f"cannot write in {where}: {exc.strerror or exc}; {advice}") from None
    except GitError as exc:
        if not disk_trouble(str(exc)):
            raise
        raise cls(f"cannot write in {where}: {exc}\n{advice}") from None


def did_you_mean(typed: Sequence[str], choices: Sequence[str], *, most: int = 1, quote: bool = False,
                 sep: str = " or ") -> str:
    """``"; did you mean X?"``: the ``most`` nearest ``choices`` to each typed word that has any (difflib,
    cutoff 0.6), once each, shown with ``repr`` when ``quote``, joined by ``sep``; ``""`` when none is near.
    The one suggestion of a mistyped command, option, pin or release."""
    import difflib

    near = [m for word in typed for m in difflib.get_close_matches(word, list(choices), n=most, cutoff=0.6)]
    shown = [repr(n) if quote else n for n in dict.fromkeys(near)]
    return f"; did you mean {sep.join(shown)}?" if shown else ""
