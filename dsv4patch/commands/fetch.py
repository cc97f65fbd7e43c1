"""``dsv4patch fetch``: fill the cache (download, verify, materialize) ahead of time.

``--sdist FILE`` (and ``--wheel FILE``, a stock vLLM wheel) seeds the cache
from a file obtained elsewhere (an offline build, a Docker context); it
enters the cache only if its sha256 is one the lock pins.  The work is
:func:`dsv4patch.pins.fetching.fetch`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dsv4patch import report
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK

HELP = "download, verify and materialize pins into the cache (or seed it from a file)"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("fetch", help=HELP, description=HELP)
    _common.add_lock(p, series=False)
    p.add_argument("--sdist", type=Path, action="append", default=[], help="seed the cache from this sdist file (repeatable; it must be the sha256 a "
                   "selected pin locks, and the output names that pin)")
    p.add_argument("--wheel", type=Path, action="append", default=[],
                   help="seed the cache with a stock vLLM wheel (repeatable; it must be the sha256 of "
                        "a selected pin's [pins.P.wheels] entry), for an offline `dsv4patch wheel`")
    _common.add_output(p)
    _common.add_cache(p)


def run(args: argparse.Namespace) -> int:
    from dsv4patch.pins import fetch

    res = fetch(ctx=_common.context(args), pins=args.pin, sdists=args.sdist, wheels=args.wheel)
    report.emit(args.format, res.to_json(), *res.table())
    return EXIT_OK
