"""``dsv4patch check``: every pin x every patch, compared with what the lock expects."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dsv4patch import engine, hints, report, tree
from dsv4patch.commands import _common
from dsv4patch.errors import (
    EXIT_FETCH,
    EXIT_OK,
    EXIT_UNEXPECTED,
    CacheError,
    NotFetchedError,
    writing,
)
from dsv4patch.lock import Lock, Pin
from dsv4patch.series import Series, series_for_pin
from dsv4patch.store import Store
from dsv4patch.progress import Progress

HELP = "check that each pin's patch series applies as the lock expects (never touches a tree)"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("check", help=HELP, description=HELP)
    _common.add_lock(p)
    _common.add_output(p, markdown=True)
    _common.add_cache(p)


def check_pin(
    lock: Lock, pin: Pin, store: Store, progress: Progress
) -> tuple[tree.PinRepo, Series, engine.SeriesResult]:
    repo = tree.materialize(pin, store, progress)
    series = series_for_pin(lock, pin)
    with writing(CacheError, str(store.root), "free space in the cache or point DSV4PATCH_CACHE elsewhere"):
        return repo, series, engine.run_series(repo.repo, repo.base_commit, series)


def pin_report(pin: Pin, repo: tree.PinRepo, result: engine.SeriesResult,
               lock: Path | str = "the lock") -> dict[str, Any]:
    patches: dict[str, Any] = {}
    ok = True
    for r in result.patches:
        expected = pin.expected_status(r.patch)
        cell = r.to_json()
        cell.pop("patch")
        cell["expected"] = expected
        cell["ok"] = r.status.value == expected
        ok &= cell["ok"]
        if not cell["ok"]:
            cell["next"] = hints.next_step(r.status.value, expected, pin.name, r.patch, lock)
        patches[r.patch] = cell
    notes = []
    final = result.final_tree
    if pin.base_tree and repo.base_tree != pin.base_tree:
        ok = False
        notes.append(f"base tree {repo.base_tree} differs from the lock's {pin.base_tree}; "
                     + hints.drift(pin.name, "source"))
    if pin.patched_tree and final and final != pin.patched_tree:
        ok = False
        notes.append(f"patched tree {final} differs from the lock's {pin.patched_tree}; "
                     + hints.drift(pin.name, "series"))
    return {
        "vllm_version": pin.vllm_version,
        "commit": pin.commit,
        "source": pin.source.kind,
        "series": list(pin.series),
        "base_commit": repo.base_commit,
        "base_tree": repo.base_tree,
        "patched_tree": final,
        "expected_patched_tree": pin.patched_tree,
        "ok": ok,
        "notes": notes,
        "patches": patches,
    }


def run(args: argparse.Namespace) -> int:
    lock = _common.open_lock(args)
    store = _common.open_store(args)
    prog = _common.progress(args)
    out: dict[str, Any] = {"lock": str(lock.path), "ok": True, "pins": {}, "notes": []}
    not_fetched: list[str] = []
    for pin in lock.select(args.pin):
        try:
            repo, _series, result = check_pin(lock, pin, store, prog)
        except NotFetchedError as exc:
            # Offline with this pin not cached: report the pins that are, mark this one.
            not_fetched.append(pin.name)
            nxt = (f"fetch it where the source is reachable: `dsv4patch fetch --pin {pin.name}`"
                   + (" (or `dsv4patch fetch --sdist FILE` with the sdist)"
                      if pin.source.kind == "pypi-sdist" else ""))
            out["pins"][pin.name] = {"status": "not-fetched", "ok": False, "error": str(exc),
                                     "next": nxt, "vllm_version": pin.vllm_version,
                                     "source": pin.source.kind, "patches": {}}
            out["ok"] = False
            out["notes"].append(f"{pin.name}: not-fetched: {exc}\n  next: {nxt}")
            continue
        pr = pin_report(pin, repo, result, lock.path)
        out["pins"][pin.name] = pr
        out["ok"] &= pr["ok"]
        for r in result.patches:
            cell = pr["patches"][r.patch]
            if not cell["ok"] or r.status is not engine.Status.CLEAN:
                out["notes"].append(f"{pin.name} {r.patch}: {r.status.value}: {r.message}"
                                    + (f"\n  next: {cell['next']}" if "next" in cell else ""))
        out["notes"] += [f"{pin.name}: {n}" for n in pr["notes"]]
    table, md = report.matrix_table(out)
    report.emit(args.format, out, table, md)
    if not_fetched:
        return EXIT_FETCH
    return EXIT_OK if out["ok"] else EXIT_UNEXPECTED
