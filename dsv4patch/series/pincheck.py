"""The pin check: run a pin's series in the cache and compare every result with the lock.

``check`` reports it for every pin, ``apply`` refuses to move a tree unless
it passes, ``lock --update`` and ``refresh`` take the tree ids it computes,
and the wheel builder (:mod:`dsv4patch.delivery.vllm_wheel`) ships only a series that
gives the lock's patched tree, so all of them run this one check
(:func:`check_pin`) and read the same verdict (:class:`PinReport`).

:func:`check_pins` checks many pins at once: a pin's result comes from the
check cache (checkcache.py) when its base tree, patch bytes, variants, git and
dsv4patch are all unchanged; pins that must be materialized or checked run in
parallel (threads: the work is git processes and the sdist extraction).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4patch import git
from dsv4patch.errors import CacheError, NotFetchedError, SourceMovedError, writing
from dsv4patch.pins import is_materialized, materialize
from dsv4patch.progress import Progress
from dsv4patch.records import frozen
from dsv4patch.series import checkcache, engine, hints

if TYPE_CHECKING:
    from dsv4patch.pins import Context, Pin, PinRepo
    from dsv4patch.series.patchedtree import PatchedTree
    from dsv4patch.series.patches import Series


@frozen
class PinCheck:
    """A pin's series run against its base: the pin's repository, the series, the result."""

    repo: PinRepo
    series: Series
    result: engine.SeriesResult


def check_pin(*, ctx: Context, pin: Pin) -> PinCheck:
    """Materialize ``pin`` and run its series in a scratch index (never touches a tree)."""
    from dsv4patch.series.patches import series_for_pin  # not on a warm check's way (issue 39: its start-up)

    repo = materialize(pin, ctx.store, ctx.progress)
    series = series_for_pin(ctx.lock, pin)
    with writing(CacheError, str(ctx.store.root), "free space in the cache or point DSV4PATCH_CACHE elsewhere"), \
            ctx.progress.step(f"check pin {pin.name}: {len(series.patches)} patch(es) with git apply --check"):
        return PinCheck(repo, series, engine.run_series(repo.repo, repo.base_commit, series))


@frozen
class PatchVerdict:
    """One patch's result next to what the lock expects of it."""

    result: engine.PatchResult
    expected: str
    next: str | None  # what to do when it differs

    @property
    def ok(self) -> bool:
        return self.result.status.value == self.expected

    @property
    def status(self) -> str:
        return self.result.status.value

    def to_json(self) -> dict[str, Any]:
        cell = self.result.to_json()
        cell.pop("patch")
        cell["expected"] = self.expected
        cell["ok"] = self.ok
        if self.next is not None:
            cell["next"] = self.next
        return cell


@frozen
class PinReport:
    """A pin's check compared with the lock: per patch, and the base and patched tree ids."""

    pin: Pin
    repo: PinRepo
    result: engine.SeriesResult
    patches: dict[str, PatchVerdict]
    notes: list[str]  # the tree ids that differ from the lock's

    @property
    def ok(self) -> bool:
        return not self.notes and all(v.ok for v in self.patches.values())

    def failures(self) -> list[str]:
        """``name: status (expected X)`` for each patch that differs, then the notes."""
        return [f"{n}: {v.status} (expected {v.expected})" for n, v in self.patches.items()
                if not v.ok] + list(self.notes)

    def to_json(self) -> dict[str, Any]:
        pin = self.pin
        return {
            "vllm_version": pin.vllm_version,
            "commit": pin.commit,
            "source": pin.source.kind,
            "series": list(pin.series),
            "base_commit": self.repo.base_commit,
            "base_tree": self.repo.base_tree,
            "patched_tree": self.result.final_tree,
            "expected_patched_tree": pin.patched_tree,
            "ok": self.ok,
            "notes": list(self.notes),
            "patches": {n: v.to_json() for n, v in self.patches.items()},
        }


def pin_report(pin: Pin, repo: PinRepo, result: engine.SeriesResult,
               lock: Path | str = "the lock") -> PinReport:
    """Compare ``result`` with what the lock expects of ``pin`` (``lock`` names it in the hints)."""
    patches: dict[str, PatchVerdict] = {}
    for r in result.patches:
        expected = pin.expected_status(r.patch)
        nxt = (None if r.status.value == expected
               else hints.next_step(r.status.value, expected, pin.name, r.patch, lock))
        patches[r.patch] = PatchVerdict(r, expected, nxt)
    notes = []
    final = result.final_tree
    if pin.base_tree and repo.base_tree != pin.base_tree:
        notes.append(f"base tree {repo.base_tree} differs from the lock's {pin.base_tree}; "
                     + hints.drift(pin.name, "source"))
    if pin.patched_tree and final and final != pin.patched_tree:
        notes.append(f"patched tree {final} differs from the lock's {pin.patched_tree}; "
                     + hints.drift(pin.name, "series"))
    return PinReport(pin, repo, result, patches, notes)


# --- many pins, through the check cache --------------------------------------------------


@frozen
class PinOutcome:
    """One pin of :func:`check_pins`: its report, or why it could not be checked (offline)."""

    pin: Pin
    report: PinReport | None
    not_fetched: NotFetchedError | None = None
    cached: bool = False  # the result came from the check cache
    moved: SourceMovedError | None = None  # a local pin's checkout is not at its commit (or not clean)


class CachedCheck:
    """:func:`check_pin` through the check cache (checkcache.py)."""

    def __init__(self, ctx: Context, use: bool) -> None:
        self.ctx, self.lock, self.store, self.use = ctx, ctx.lock, ctx.store, use
        self._ident: tuple[str, str] | None = None  # (git --version, dsv4patch identity)

    def _inputs(self, pin: Pin, repo: PinRepo) -> checkcache.Inputs | None:
        # Pins are computed in threads: the pair is assigned in one step (two threads may
        # both compute it; they get the same values), never half set.
        ident = self._ident
        if ident is None:
            ident = (checkcache.git_version(self.store.root), checkcache.tool_identity())
            self._ident = ident
        return checkcache.inputs(self.lock, pin, repo.base_tree, repo.base_commit, *ident)

    def lookup(self, pin: Pin) -> tuple[PinRepo, engine.SeriesResult] | None:
        """The cached result of a pin whose tree is already materialized, if its inputs are unchanged."""
        if not self.use or not is_materialized(pin, self.store):
            return None
        repo = materialize(pin, self.store, Progress(False))
        inputs = self._inputs(pin, repo)
        hit = checkcache.load(self.store, inputs.key()) if inputs is not None else None
        return (repo, hit) if hit is not None else None

    def compute(self, pin: Pin, progress: Progress) -> tuple[PinRepo, engine.SeriesResult]:
        # The key is taken before the check reads the patches: a file edited meanwhile
        # can only make the entry unreachable, never wrong.
        inputs = self._inputs(pin, materialize(pin, self.store, progress))
        checked = check_pin(ctx=self.ctx.reporting_to(progress), pin=pin)
        if inputs is not None:
            checkcache.save(self.store, inputs.key(), checked.result)
        return checked.repo, checked.result


def check_pins(*, ctx: Context, pins: list[Pin], use_cache: bool = True) -> list[PinOutcome]:
    """Check ``pins`` (cached results where the inputs are unchanged, the rest in parallel), in order.

    A pin that is not fetched while offline is reported (``not_fetched``), and so is a local pin whose
    checkout has moved on (``moved``: the maintainer works in it); the others go on."""
    cache = CachedCheck(ctx, use=use_cache)
    progress = ctx.progress
    results: dict[str, tuple[PinRepo, engine.SeriesResult] | NotFetchedError | SourceMovedError] = {}
    todo = []
    moved: set[str] = set()
    for pin in pins:
        try:
            hit = cache.lookup(pin)  # only for a pin whose tree is already materialized
        except SourceMovedError as exc:
            results[pin.name] = exc
            moved.add(pin.name)
            continue
        if hit is not None:
            results[pin.name] = hit
        else:
            todo.append(pin)
    cached = set(results) - moved

    def compute(pin: Pin, prog: Progress) -> tuple[PinRepo, engine.SeriesResult] | NotFetchedError | SourceMovedError:
        try:
            return cache.compute(pin, prog)
        except (NotFetchedError, SourceMovedError) as exc:  # reported, the others go on
            return exc

    if len(todo) > 1:
        # One live display: the workers run without their own bars; this one counts the pins done
        # (a pin not in the cache yet is downloaded and extracted first: the first check takes longer).
        quiet = Progress(False)
        from concurrent.futures import ThreadPoolExecutor  # pins to check: a cache hit needs no threads

        what = f"checking {', '.join(p.name for p in todo)} (fetched first where not cached)"
        with progress.task(what, len(todo), unit="pins") as task, \
                ThreadPoolExecutor(max_workers=min(len(todo), max(2, os.cpu_count() or 2))) as pool:
            futures = [pool.submit(compute, pin, quiet) for pin in todo]
            for pin, fut in zip(todo, futures, strict=True):
                results[pin.name] = fut.result()
                task.advance(1)
    elif todo:
        results[todo[0].name] = compute(todo[0], progress)
    outcomes = []
    for pin in pins:
        res = results[pin.name]
        if isinstance(res, NotFetchedError):
            outcomes.append(PinOutcome(pin, None, res))
        elif isinstance(res, SourceMovedError):
            outcomes.append(PinOutcome(pin, None, moved=res))
        else:
            outcomes.append(PinOutcome(pin, pin_report(pin, res[0], res[1], ctx.lock.path),
                                       cached=pin.name in cached))
    return outcomes


def patched_tree(*, ctx: Context, pin: Pin) -> PatchedTree:
    """The series' result in the cache (what ``check`` reads: the check cache's entry for these very
    inputs, else the series run and its result kept there) and every changed file read
    (:func:`dsv4patch.series.patchedtree.read_patched_tree`: refused unless the result is the lock's)."""
    from dsv4patch.series.patchedtree import read_patched_tree  # the deliveries' need: check never loads it
    from dsv4patch.series.patches import series_for_pin

    cache = CachedCheck(ctx, use=True)
    hit = cache.lookup(pin)
    if hit is not None and not _objects_present(*hit):
        hit = None  # the result's trees are gone from the pin's repository (pruned): run the series again
    repo, result = hit if hit is not None else cache.compute(pin, ctx.progress)
    report = pin_report(pin, repo, result)
    return read_patched_tree(pin, repo, series_for_pin(ctx.lock, pin), result, report)


def _objects_present(repo: PinRepo, result: engine.SeriesResult) -> bool:
    """The patched tree a cached result names is an object of the pin's repository (a cached verdict
    is only a shortcut: the files are read from there; the base tree is the materialized pin's)."""
    return result.final_tree is None or git.has_object(repo.repo, f"{result.final_tree}^{{tree}}")
