"""``dsv4patch lock``: ``--update`` recomputes the lock's derived fields, ``--build-args`` prints the image's.

The update is :func:`dsv4patch.series.lockupdate.update`, the build args
:mod:`dsv4patch.delivery.buildargs`; this command reads the options and renders.
"""

from __future__ import annotations

import argparse
import os

from dsv4patch import report
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK, EXIT_UNEXPECTED, UsageError

HELP = ("recompute derived lock fields (sdist url/size, base and patched tree ids); "
        "print or check the Docker image's build args")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("lock", help=HELP, description=HELP)
    _common.add_lock(p, series=False)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--update", action="store_true", help="rewrite derived fields")
    mode.add_argument("--build-args", action="store_true",
                      help="print the Docker image's build args for --pin (one `--build-arg K=V` per "
                           "line; JSON with --format json): docker build $(dsv4patch lock "
                           "--build-args --pin P) .")
    mode.add_argument("--check-build-args", action="store_true",
                      help="exit 1 unless the environment's build args (VLLM_PIN, ...) are the "
                           "lock's for --pin (default: $VLLM_PIN, else the lock's default pin)")
    _common.add_output(p)
    _common.add_cache(p)


def _build_args(args: argparse.Namespace) -> int:
    from dsv4patch.delivery import BUILD_ARGS, build_arg_mismatches, compute_build_args

    lock = _common.open_lock(args)
    if args.pin and len(args.pin) > 1:
        raise UsageError("--build-args / --check-build-args take one --pin")
    name = (args.pin or [None])[0] or (os.environ.get("VLLM_PIN") if args.check_build_args else None)
    pin = lock.pin(name)
    want = compute_build_args(lock, pin)
    if args.check_build_args:
        bad = build_arg_mismatches(want)
        out = {"pin": pin.name, "lock": str(lock.path), "build_args": want, "ok": not bad,
               "notes": (["build args do not match the lock:", *bad,
                          f"pass them with: docker build $(dsv4patch lock --build-args --pin "
                          f"{pin.name}) ..."] if bad else [f"build args match {lock.path}"])}
        report.emit(args.format, out, None, None)
        return EXIT_UNEXPECTED if bad else EXIT_OK
    if args.format == "json":
        report.emit("json", want, None, None)
    else:
        print("\n".join(f"--build-arg {k}={want[k]}" for k in BUILD_ARGS))
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    from dsv4patch.series import update_lock

    if args.build_args or args.check_build_args:
        return _build_args(args)
    ctx = _common.context(args)
    lock = ctx.lock
    res = update_lock(ctx=ctx, pins=args.pin)
    rows = [[p.pin, p.base_tree[:12], (p.patched_tree or "-")[:12], p.state] for p in res.pins]
    table, md = report.simple_table(
        f"dsv4patch lock --update: {lock.path}", ["pin", "base tree", "patched tree", "lock"], rows
    )
    report.emit(args.format, res.to_json(), table, md)
    return EXIT_OK if res.ok else EXIT_UNEXPECTED
