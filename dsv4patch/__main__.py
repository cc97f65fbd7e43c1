"""``python -m dsv4patch`` and the ``dsv4patch`` console script.

The interrupt signals are recorded from the first instant this module runs,
before ``dsv4patch.main`` and the commands are imported: a SIGINT or SIGTERM
that arrives while the program starts is then the same clean exit 130 as one
that arrives later (``childproc.interrupts``), not a traceback or a death by
signal.
"""

from __future__ import annotations

import signal

EARLY: list[int] = []


def _record(signum: int, frame: object) -> None:
    EARLY.append(signum)


for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(_sig, _record)


def entry() -> int:
    from dsv4patch.main import main

    code = main(early=EARLY)
    # The command is over (its result printed, children ended): a signal that arrives while the
    # interpreter shuts down changes nothing (the interpreter would restore the default action).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    return code


if __name__ == "__main__":
    raise SystemExit(entry())
