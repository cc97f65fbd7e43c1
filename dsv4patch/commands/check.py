"""``dsv4patch check``: every pin x every patch, compared with what the lock expects.

A pin's result comes from the check cache (checkcache.py) when its base tree,
patch bytes, variants, git and dsv4patch are all unchanged; pins that must be
materialized or checked run in parallel (threads: the work is git processes
and the sdist extraction).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from dsv4patch import checkcache, engine, hints, report, tree
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
    p.add_argument("--no-cache", action="store_true",
                   help="check every pin again even when a cached result has the same inputs")


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
    pins = lock.select(args.pin)
    ctx = _Cached(lock, store, use=not args.no_cache)
    results: dict[str, tuple[tree.PinRepo, engine.SeriesResult] | NotFetchedError] = {}
    todo = []
    for pin in pins:
        hit = ctx.lookup(pin)  # only for a pin whose tree is already materialized
        if hit is not None:
            results[pin.name] = hit
        else:
            todo.append(pin)
    cached = set(results)

    def compute(pin: Pin, progress: Progress) -> tuple[tree.PinRepo, engine.SeriesResult] | NotFetchedError:
        try:
            return ctx.compute(pin, progress)
        except NotFetchedError as exc:  # offline and not cached: reported below, the others go on
            return exc

    if len(todo) > 1:
        from concurrent.futures import ThreadPoolExecutor

        # One live progress display at a time: the workers run without bars.
        prog.note(f"checking {len(todo)} pins in parallel: {', '.join(p.name for p in todo)}")
        quiet = Progress(False)
        with ThreadPoolExecutor(max_workers=min(len(todo), max(2, os.cpu_count() or 2))) as pool:
            futures = [pool.submit(compute, pin, quiet) for pin in todo]
            for pin, fut in zip(todo, futures):
                results[pin.name] = fut.result()
    for pin in todo[:1] if len(todo) == 1 else []:
        results[pin.name] = compute(pin, prog)
    not_fetched: list[str] = []
    for pin in pins:
        res = results[pin.name]
        if isinstance(res, NotFetchedError):
            # Offline with this pin not cached: report the pins that are, mark this one.
            not_fetched.append(pin.name)
            nxt = (f"fetch it where the source is reachable: `dsv4patch fetch --pin {pin.name}`"
                   + (" (or `dsv4patch fetch --sdist FILE` with the sdist)"
                      if pin.source.kind == "pypi-sdist" else ""))
            out["pins"][pin.name] = {"status": "not-fetched", "ok": False, "error": str(res),
                                     "next": nxt, "vllm_version": pin.vllm_version,
                                     "source": pin.source.kind, "patches": {}}
            out["ok"] = False
            out["notes"].append(f"{pin.name}: not-fetched: {res}\n  next: {nxt}")
            continue
        repo, result = res
        pr = pin_report(pin, repo, result, lock.path)
        pr["cached"] = pin.name in cached  # the result came from the check cache
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


class _Cached:
    """check_pin through the check cache (checkcache.py)."""

    def __init__(self, lock: Lock, store: Store, use: bool) -> None:
        self.lock, self.store, self.use = lock, store, use
        self._ident: tuple[str, str] | None = None  # (git --version, dsv4patch identity)

    def _inputs(self, pin: Pin, repo: tree.PinRepo) -> checkcache.Inputs | None:
        # Pins are computed in threads: the pair is assigned in one step (two threads may
        # both compute it; they get the same values), never half set.
        ident = self._ident
        if ident is None:
            ident = (checkcache.git_version(self.store.root), checkcache.tool_identity())
            self._ident = ident
        return checkcache.inputs(self.lock, pin, repo.base_tree, repo.base_commit, *ident)

    def lookup(self, pin: Pin) -> tuple[tree.PinRepo, engine.SeriesResult] | None:
        if not self.use or not tree.is_materialized(pin, self.store):
            return None
        repo = tree.materialize(pin, self.store, Progress(False))
        inputs = self._inputs(pin, repo)
        hit = checkcache.load(self.store, inputs.key()) if inputs is not None else None
        return (repo, hit) if hit is not None else None

    def compute(self, pin: Pin, progress: Progress) -> tuple[tree.PinRepo, engine.SeriesResult]:
        # The key is taken before the check reads the patches: a file edited meanwhile
        # can only make the entry unreachable, never wrong.
        inputs = self._inputs(pin, tree.materialize(pin, self.store, progress))
        repo, _series, result = check_pin(self.lock, pin, self.store, progress)
        if inputs is not None:
            checkcache.save(self.store, inputs.key(), result)
        return repo, result
