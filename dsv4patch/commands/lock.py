"""``dsv4patch lock --update``: recompute the lock's derived fields.

Derived fields are the sdist's URL and size (from the index), the pin's base
tree id and the tree id after its series.  The sha256 and commit are the
trust anchors and are never rewritten: a mismatch with the index is an error.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from dsv4patch import buildargs, index, pincheck, report
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK, EXIT_UNEXPECTED, FetchError, UsageError
from dsv4patch.lock import load, update_derived

HELP = ("recompute derived lock fields (sdist url/size, base and patched tree ids); "
        "print or check the Docker image's build args")


def add_parser(sub: Any) -> None:
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
    lock = _common.open_lock(args)
    if args.pin and len(args.pin) > 1:
        raise UsageError("--build-args / --check-build-args take one --pin")
    name = (args.pin or [None])[0] or (os.environ.get("VLLM_PIN") if args.check_build_args else None)
    pin = lock.pin(name)
    want = buildargs.compute(lock, pin)
    if args.check_build_args:
        bad = buildargs.mismatches(want)
        out = {"pin": pin.name, "lock": str(lock.path), "build_args": want, "ok": not bad,
               "notes": (["build args do not match the lock:", *bad,
                          f"pass them with: docker build $(dsv4patch lock --build-args --pin "
                          f"{pin.name}) ..."] if bad else [f"build args match {lock.path}"])}
        report.emit(args.format, out, None, None)
        return EXIT_UNEXPECTED if bad else EXIT_OK
    if args.format == "json":
        report.emit("json", want, None, None)
    else:
        print("\n".join(f"--build-arg {k}={want[k]}" for k in buildargs.BUILD_ARGS))
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    if args.build_args or args.check_build_args:
        return _build_args(args)
    lock = _common.open_lock(args)
    store = _common.open_store(args)
    prog = _common.progress(args)
    rows = []
    out: dict[str, Any] = {"lock": str(lock.path), "pins": {}, "ok": True}
    for pin in lock.select(args.pin):
        src_values: dict[str, Any] = {}
        if pin.source.kind == "pypi-sdist" and (not pin.source.url or pin.source.size is None):
            info = index.find_sdist(pin.source.name, pin.source.version)
            if info.sha256 != pin.source.sha256:
                raise FetchError(
                    f"pin {pin.name}: the index's {info.filename} has sha256 {info.sha256}, the "
                    f"lock pins {pin.source.sha256}; refusing to update"
                )
            src_values = {"url": info.url, "size": info.size}
            lock = load(lock.path) if update_derived(lock.path, pin.name, {}, src_values) else lock
            pin = lock.pin(pin.name)
        checked = pincheck.check_pin(lock, pin, store, prog)
        repo, result = checked.repo, checked.result
        final = result.final_tree
        values = {"base_tree": repo.base_tree, "patched_tree": final}
        changed = update_derived(lock.path, pin.name, values, {})
        out["pins"][pin.name] = {**values, **src_values, "changed": changed}
        state = "updated" if changed else "unchanged"
        if final is None:
            out["ok"] = False
            blocked = "; ".join(
                f"{r.patch}: {r.status.value}" for r in result.patches if r.status.blocks
            )
            state += f", patched_tree not set: the series does not apply ({blocked})"
        rows.append([pin.name, repo.base_tree[:12], (final or "-")[:12], state])
    table, md = report.simple_table(
        f"dsv4patch lock --update: {lock.path}", ["pin", "base tree", "patched tree", "lock"], rows
    )
    report.emit(args.format, out, table, md)
    return EXIT_OK if out["ok"] else EXIT_UNEXPECTED
