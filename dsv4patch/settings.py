"""The defaults dsv4patch takes from its environment, read once, at the edge.

Why one record: an option whose default comes from an environment variable
(``--python`` from ``$DSV4PATCH_TORCH_PYTHON``, ``--lock`` from ``$DSV4PATCH_LOCK``,
...) used to be read wherever the core needed it, each site with its own fallback.
Now ``commands/`` builds one :class:`Settings` from ``os.environ`` per run and hands
each value to the core with an explicit keyword: the precedence (option > environment >
built-in) is spelled once, in the command, and a library caller of the core says what
it wants instead of inheriting the process's environment.  ``tests/test_architecture.py``
refuses a core module that reads the environment for a setting.

The bounds (``$DSV4PATCH_GIT_TIMEOUT``, ``$DSV4PATCH_DOWNLOAD_TIMEOUT``,
``$DSV4PATCH_DOWNLOAD_MIN_RATE``, ``$DSV4PATCH_LOCK_TIMEOUT``) and ``$NO_COLOR`` are
settings too, validated here once (finite, in range, else exit 2 naming the
variable).  They are used at every git call, every transfer, every file lock and
every console, thousands of call sites deep and in worker threads, so they are not
passed as keywords: ``main`` puts the run's settings :func:`in_effect` and those
few readers ask :func:`active` (a plain module value, not a ContextVar: a worker
thread must see the same bounds).  The settings of a run are the record the
command's :class:`dsv4patch.context.Context` carries.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from dsv4patch.limits import parse_number
from dsv4patch.records import frozen

# The bounds' defaults and ceilings (docs/trust.md "Bounds"): every one finite, so no variable switches one off.
GIT_TIMEOUT_ENV = "DSV4PATCH_GIT_TIMEOUT"
GIT_TIMEOUT = 3600.0  # a clone of a large remote on a slow link included
GIT_TIMEOUT_MAX = 86400.0
DEFAULT_TRANSFER_TIMEOUT = 1800.0  # seconds a whole page or file transfer may take
MAX_TRANSFER_TIMEOUT = 7 * 86400.0  # DSV4PATCH_DOWNLOAD_TIMEOUT's ceiling (never inf)
DEFAULT_MIN_RATE = 1024.0  # bytes/s a transfer must average over any index.RATE_WINDOW
MAX_MIN_RATE = float(1 << 30)
DEFAULT_LOCK_WAIT = 600.0  # seconds a run waits for another run's file lock
MAX_LOCK_WAIT = 7 * 86400.0  # DSV4PATCH_LOCK_TIMEOUT's ceiling: a week, never "forever" (inf)


@frozen
class Settings:
    """What the environment sets; None where it sets nothing (the built-in default then applies)."""

    torch_python: str | None = None  # $DSV4PATCH_TORCH_PYTHON: --python of build, apply and wheel
    vllm_python: str | None = None  # $DSV4PATCH_VLLM_PYTHON: --python of status --installed and selftest
    lock: Path | None = None  # $DSV4PATCH_LOCK: the lock when --lock is not given
    cache: Path | None = None  # $DSV4PATCH_CACHE: the cache when --cache-dir is not given
    xdg_cache_home: Path | None = None  # $XDG_CACHE_HOME: where the default cache lives
    git_timeout: float = GIT_TIMEOUT  # $DSV4PATCH_GIT_TIMEOUT: seconds one git call may take
    download_timeout: float = DEFAULT_TRANSFER_TIMEOUT  # $DSV4PATCH_DOWNLOAD_TIMEOUT: one transfer, in all
    download_min_rate: float = DEFAULT_MIN_RATE  # $DSV4PATCH_DOWNLOAD_MIN_RATE: bytes/s (0: off)
    lock_timeout: float = DEFAULT_LOCK_WAIT  # $DSV4PATCH_LOCK_TIMEOUT: seconds a file-lock wait may take
    no_color: bool = False  # $NO_COLOR set and not empty (https://no-color.org)

    @classmethod
    def for_output(cls, environ: Mapping[str, str]) -> Settings:
        """Only what showing a result needs (``$NO_COLOR``): never fails, so even the error that a bad
        variable is reported in honours it."""
        return cls(no_color=bool(environ.get("NO_COLOR")))

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Settings:
        """The settings ``environ`` holds; an empty variable counts as unset (as it always did), except
        ``DSV4PATCH_LOCK_TIMEOUT``, where an empty value was always refused.  A bad number raises
        :class:`dsv4patch.errors.ParameterError` (exit 2) naming the variable, its range and an example."""

        def path(name: str) -> Path | None:
            value = environ.get(name)
            return Path(value) if value else None

        return cls(
            torch_python=environ.get("DSV4PATCH_TORCH_PYTHON") or None,
            vllm_python=environ.get("DSV4PATCH_VLLM_PYTHON") or None,
            lock=path("DSV4PATCH_LOCK"),
            cache=path("DSV4PATCH_CACHE"),
            xdg_cache_home=path("XDG_CACHE_HOME"),
            git_timeout=_number(environ, GIT_TIMEOUT_ENV, GIT_TIMEOUT, low=0, high=GIT_TIMEOUT_MAX,
                                example="3600"),
            download_timeout=_number(
                environ, "DSV4PATCH_DOWNLOAD_TIMEOUT", DEFAULT_TRANSFER_TIMEOUT, low=0, high=MAX_TRANSFER_TIMEOUT,
                example=f"{DEFAULT_TRANSFER_TIMEOUT:g}, the most one download may take in seconds"),
            download_min_rate=_number(environ, "DSV4PATCH_DOWNLOAD_MIN_RATE", DEFAULT_MIN_RATE, low=0,
                                      high=MAX_MIN_RATE, low_inclusive=True,
                                      example=f"{DEFAULT_MIN_RATE:g} bytes per second"),
            lock_timeout=parse_number(
                environ.get("DSV4PATCH_LOCK_TIMEOUT", f"{DEFAULT_LOCK_WAIT:g}"), what="DSV4PATCH_LOCK_TIMEOUT",
                low=0, high=MAX_LOCK_WAIT, low_inclusive=True,
                example="600 seconds, or 0 to fail at once when another run holds a lock"),
            no_color=bool(environ.get("NO_COLOR")),
        )

    def cache_root(self) -> Path:
        """The cache without ``--cache-dir``: ``$DSV4PATCH_CACHE``, else ``$XDG_CACHE_HOME/dsv4patch``,
        else ``~/.cache/dsv4patch``."""
        if self.cache is not None:
            return self.cache
        return (self.xdg_cache_home or Path.home() / ".cache") / "dsv4patch"


def _number(environ: Mapping[str, str], name: str, default: float, *, low: float, high: float,
            low_inclusive: bool = False, example: str = "") -> float:
    """The variable ``name`` through :func:`dsv4patch.limits.parse_number`; ``default`` when unset or empty."""
    raw = environ.get(name, "")
    if not raw.strip():
        return default
    return parse_number(raw, what=name, low=low, high=high, low_inclusive=low_inclusive, example=example)


_active = Settings()  # the built-in defaults until a run puts its own in effect


def active() -> Settings:
    """The settings of the run in progress (the built-in defaults outside one): for the readers the module
    docstring names (the bounds at each git call, transfer and file lock; colour at each console)."""
    return _active


@contextmanager
def in_effect(settings: Settings) -> Iterator[Settings]:
    """``settings`` are :func:`active` inside the block (``main`` puts each run's in effect); restored after."""
    global _active
    before, _active = _active, settings
    try:
        yield settings
    finally:
        _active = before
