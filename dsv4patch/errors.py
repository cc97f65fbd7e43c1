"""Error types, each carrying the exit code the CLI returns for it.

Every error a user can hit says what was wrong (which lock, pin, patch, file,
hunk) and what to do next; ``main`` prints ``str(error)`` and exits with
``error.exit_code``.  The codes are documented in the README and ``--help``.
"""

from __future__ import annotations

# Exit codes (keep in sync with README "Exit codes" and main.EPILOG).
EXIT_OK = 0
EXIT_UNEXPECTED = 1  # a check/verify result differs from what the lock expects
EXIT_USAGE = 2  # bad command line (argparse)
EXIT_INPUT = 3  # bad lock file or patch file
EXIT_FETCH = 4  # source could not be fetched or verified
EXIT_TREE = 5  # target tree is dirty, at another commit, or not ours
EXIT_BUSY = 6  # another dsv4patch holds the cache or tree lock
EXIT_BUILD = 7  # kernel build / test environment failed
EXIT_INTERNAL = 70


class Dsv4Error(Exception):
    exit_code = EXIT_INTERNAL


class LockFileError(Dsv4Error):
    """The lock file is unreadable, malformed or inconsistent."""

    exit_code = EXIT_INPUT


class PatchFileError(Dsv4Error):
    """A patch or series file is missing, empty, malformed or unsafe."""

    exit_code = EXIT_INPUT


class FetchError(Dsv4Error):
    """A pinned source could not be downloaded, fetched or verified."""

    exit_code = EXIT_FETCH


class IntegrityError(FetchError):
    """Downloaded bytes do not match the lock's hash or size."""


class CacheError(Dsv4Error):
    """The cache directory cannot be used (read-only, not a directory)."""

    exit_code = EXIT_FETCH


class TreeError(Dsv4Error):
    """The target tree is not in a state we may touch."""

    exit_code = EXIT_TREE


class BusyError(Dsv4Error):
    """Another process holds a lock we need."""

    exit_code = EXIT_BUSY


class BuildError(Dsv4Error):
    """Compiling kernels or creating the test environment failed."""

    exit_code = EXIT_BUILD


class GitError(Dsv4Error):
    """git itself failed in a way we did not expect."""

    exit_code = EXIT_INTERNAL
