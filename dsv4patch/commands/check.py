"""``dsv4patch check``: every pin x every patch, compared with what the lock expects.

The check itself (the check cache, pins in parallel) is :mod:`dsv4patch.series.pincheck`;
this command renders it, per pin and patch.
"""

from __future__ import annotations

import argparse
from typing import Any

from dsv4patch import report
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_FETCH, EXIT_OK, EXIT_TREE, EXIT_UNEXPECTED

HELP = "check that each pin's patch series applies as the lock expects (never touches a tree)"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("check", help=HELP, description=HELP)
    _common.add_lock(p)
    _common.add_output(p, markdown=True)
    _common.add_cache(p)
    p.add_argument("--no-cache", action="store_true",
                   help="check every pin again even when a cached result has the same inputs")


def run(args: argparse.Namespace) -> int:
    from dsv4patch.series import Status, check_pins

    ctx = _common.context(args)
    lock, prog = ctx.lock, ctx.progress
    out: dict[str, Any] = {"lock": str(lock.path), "ok": True, "pins": {}, "notes": []}
    pins = lock.select(args.pin)
    with prog.step(f"check {len(pins)} pin(s)"):  # the screen never stands still
        outcomes = check_pins(ctx=ctx, pins=pins, use_cache=not args.no_cache)
    not_fetched: list[str] = []
    moved: list[str] = []
    expected: dict[str, dict[str, list[str]]] = {}  # status -> pin -> patches, as the lock expects
    for o in outcomes:
        pin = o.pin
        if o.moved is not None:
            # A local pin's checkout the maintainer has moved on: report the others, mark this one.
            moved.append(pin.name)
            nxt = (f"check out {pin.commit} in {pin.source.path} (`git -C {pin.source.path} switch --detach "
                   f"{pin.commit[:12]}`), or pin what it holds now: its commit in {lock.path}")
            out["pins"][pin.name] = {"status": "source-moved", "ok": False, "error": str(o.moved), "next": nxt,
                                     "vllm_version": pin.vllm_version, "source": pin.source.kind, "patches": {}}
            out["ok"] = False
            out["notes"].append(f"{pin.name}: source-moved: {o.moved}\n  next: {nxt}")
            continue
        if o.report is None:
            # Offline with this pin not cached: report the pins that are, mark this one.
            not_fetched.append(pin.name)
            nxt = (f"fetch it where the source is reachable: `dsv4patch fetch --pin {pin.name}`"
                   + (" (or `dsv4patch fetch --sdist FILE` with the sdist)"
                      if pin.source.kind == "pypi-sdist" else ""))
            out["pins"][pin.name] = {"status": "not-fetched", "ok": False, "error": str(o.not_fetched),
                                     "next": nxt, "vllm_version": pin.vllm_version,
                                     "source": pin.source.kind, "patches": {}}
            out["ok"] = False
            out["notes"].append(f"{pin.name}: not-fetched: {o.not_fetched}\n  next: {nxt}")
            continue
        rep = o.report
        pr = rep.to_json()
        pr["cached"] = o.cached  # the result came from the check cache
        out["pins"][pin.name] = pr
        out["ok"] &= rep.ok
        for r in rep.result.patches:
            verdict = rep.patches[r.patch]
            if verdict.ok and r.status is not Status.CLEAN:
                expected.setdefault(r.status.value, {}).setdefault(pin.name, []).append(r.patch)
            elif not verdict.ok:
                out["notes"].append(f"{pin.name} {r.patch}: {r.status.value}: {r.message}"
                                    + (f"\n  next: {verdict.next}" if verdict.next is not None else ""))
        out["notes"] += [f"{pin.name}: {n}" for n in rep.notes]
    # What the lock expects needs no line per pin and patch: one per status (evidence: --format json).
    out["notes"][:0] = [report.folded(status, pins, evidence="--format json") for status, pins in expected.items()]
    table, md = report.matrix_table(out)
    report.emit(args.format, out, table, md)
    if not_fetched:
        return EXIT_FETCH
    if moved:
        return EXIT_TREE
    return EXIT_OK if out["ok"] else EXIT_UNEXPECTED
