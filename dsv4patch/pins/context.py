"""What every operation of one run shares: the lock, the cache, progress, the environment's settings.

Why one record: the operations (check, apply, port, refresh, the wheel, verify,
selftest, ``status --installed``) each took the lock, the store and the progress
reporter side by side, and handed all three on to every step, so a new shared
thing (the run's settings, its interrupt state) meant a new parameter on dozens of
functions and a dozen call sites each.  Now ``commands/`` builds one
:class:`Context` at the edge, from the parsed options (``--lock``, ``--cache-dir``,
``--format``) and the run's :class:`dsv4patch.settings.Settings`, and passes it
down with the explicit keyword ``ctx=``; a step takes ``ctx`` and whatever is its
own (a pin, a tree, an option's value).  It lives with the pins because the lock
is theirs and every later package may import the pins.

The record is frozen: a step never swaps the cache or the lock of the run under
the others (a step that works on another lock, as ``port`` does once it wrote the
new pin, makes its own with :meth:`Context.on`).  ``tests/test_architecture.py``
refuses a core function that again takes two of lock, store and progress apart.
"""

from __future__ import annotations

from dataclasses import field, replace
from typing import TYPE_CHECKING

from dsv4patch import childproc
from dsv4patch.records import frozen
from dsv4patch.settings import Settings

if TYPE_CHECKING:
    from dsv4patch.pins.lock import Lock
    from dsv4patch.progress import Progress
    from dsv4patch.store import Store


@frozen
class Context:
    """One run's shared state; built once by a command, read by every step below it."""

    lock: Lock  # the lock file read (``--lock``, else ``$DSV4PATCH_LOCK``, else found), ``--series`` applied
    store: Store  # the cache (``--cache-dir``, else ``$DSV4PATCH_CACHE``, else the XDG cache)
    progress: Progress  # where progress goes (a terminal, a file, nowhere under --format json)
    settings: Settings = field(default_factory=Settings)  # the environment's settings of this run

    def on(self, lock: Lock) -> Context:
        """The same run on another lock (the cache, progress and settings shared)."""
        return replace(self, lock=lock)

    def reporting_to(self, progress: Progress) -> Context:
        """The same run reporting elsewhere (a worker thread's quiet progress under one live display)."""
        return replace(self, progress=progress)

    @staticmethod
    def interrupted() -> bool:
        """Has SIGINT, SIGTERM or SIGHUP arrived in this run (``childproc.interrupts``)?  The state is
        the process's (a signal reaches the process, not one step), so every context reads the same."""
        return childproc.interrupted()

    @staticmethod
    def raise_if_interrupted() -> None:
        """Stop here with :class:`dsv4patch.errors.Interrupted` if an interrupt arrived."""
        childproc.raise_if_interrupted()
