"""``python -m dsv4patch`` and the ``dsv4patch`` console script.

The interrupt signals are recorded from the first instant this module runs,
before ``dsv4patch.main`` and the commands are imported: a SIGINT or SIGTERM
that arrives while the program starts is then the same clean exit 130 as one
that arrives later (``childproc.interrupts``), not a traceback or a death by
signal.

The cyclic garbage collector is off while the program starts (its imports and
the command line's parse): the ~40 record classes and ~300 modules a start-up
makes are garbage-free and live as long as the process, yet they set off ~20
collections that walk them, ~4 ms of a quiet warm ``check`` and more under load
(issue 39). Once the command is about to run they are frozen out of the
collector's generations (``gc.freeze``: no later collection walks them again,
which also helps the long commands) and the collector is back on for the run.
"""

from __future__ import annotations

import gc
import signal
import sys

EARLY: list[int] = []


def _record(signum: int, frame: object) -> None:
    EARLY.append(signum)


for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(_sig, _record)


def entry() -> int:
    if sys.argv[1:] == ["--version"] and not EARLY:
        return _version()
    gc.disable()
    from dsv4patch.main import main

    code = main(early=EARLY, started=_collect_from_now)
    # The command is over (its result printed, children ended): a signal that arrives while the
    # interpreter shuts down changes nothing (the interpreter would restore the default action).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    return code


def _collect_from_now() -> None:
    """The start-up is over (``main`` calls this before the command runs): its objects frozen, the collector on."""
    gc.freeze()
    gc.enable()


def _version() -> int:
    """``dsv4patch --version`` alone: what the parser's version action prints, with nothing more imported.

    The parser, the settings and the child-process layer ``dsv4patch.main`` imports are ~20 ms of a quiet
    start-up and 60-85 ms of one at load 6 on two cores (issue 39's benchmark); a version is asked for by
    scripts and CI steps before anything else, on busy machines.  A reader that closed stdout gets what
    ``main`` gives one: exit 141 and no traceback."""
    from dsv4patch import __version__

    try:
        sys.stdout.write(f"dsv4patch {__version__}\n")
        sys.stdout.flush()
    except BrokenPipeError:
        from dsv4patch.errors import EXIT_BROKEN_PIPE
        from dsv4patch.main import _silence_stdout

        _silence_stdout()
        return EXIT_BROKEN_PIPE
    return 0


if __name__ == "__main__":
    raise SystemExit(entry())
