"""``dsv4patch verify``: prove each patch's tests fail before and pass after.

The proof is :func:`dsv4patch.proofs.verifying.verify` (``--upstream-tests``:
:func:`dsv4patch.proofs.upstream_tests.run`); this module parses the options and
renders the result.
"""

from __future__ import annotations

import argparse

from dsv4patch import report
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK, EXIT_UNEXPECTED
from dsv4patch.proofs import UPSTREAM_DEFAULT_FROM

HELP = "prove each patch's regression tests fail on the unpatched pin and pass once patched"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("verify", help=HELP, description=HELP)
    _common.add_lock(p, many=False)
    p.add_argument("--patch", action="append", help="only these patches (file name or NNNN prefix)")
    p.add_argument("--torch", default=None, help="torch version for the test venv (default: the pin's)")
    p.add_argument("--keep", action="store_true", help="keep the before/after work trees")
    p.add_argument("--no-cache", action="store_true",
                   help="run the tests even when results for the same tree, tests and venv are cached")
    p.add_argument(
        "--upstream-tests", action="store_true",
        help="instead of the patches' own tests, run upstream's tests of each fix (the "
             "headers' Upstream-Test: lines, taken from the --from release's sdist) on the "
             "patched and the unpatched pin",
    )
    p.add_argument(
        "--from", dest="upstream_from", metavar="PIN", default=None,
        help="with --upstream-tests: the lock's pin whose tests are run "
             f"(default: {UPSTREAM_DEFAULT_FROM})",
    )
    _common.add_output(p, markdown=True)
    _common.add_cache(p)


def run(args: argparse.Namespace) -> int:
    from dsv4patch.proofs import run_upstream_tests, upstream_source_pin, verify

    lock = _common.open_lock(args)
    pin = lock.pin(args.pin)
    if args.upstream_tests:
        source = upstream_source_pin(lock, args.upstream_from)
        prog = _common.progress(args)
        with prog.step(f"verify --upstream-tests: pin {pin.name}, tests of {source.name}"):
            up = run_upstream_tests(ctx=_common.context(args, lock, prog), pin=pin, source=source,
                                    patches=args.patch, torch=args.torch)
        report.emit(args.format, up.to_json(), *up.table())
        return EXIT_OK if up.ok else EXIT_UNEXPECTED
    prog = _common.progress(args)
    with prog.step(f"verify pin {pin.name}"):  # the screen never stands still
        res = verify(ctx=_common.context(args, lock, prog), pin=pin,
                     patches=args.patch, torch=args.torch, keep=args.keep, use_cache=not args.no_cache)
    report.emit(args.format, res.to_json(), *res.table())
    return EXIT_OK if res.ok else EXIT_UNEXPECTED
