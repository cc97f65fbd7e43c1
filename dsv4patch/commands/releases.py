"""``dsv4patch releases``: vLLM releases on the index that the lock does not pin, each checked.

A command of its own rather than an option of ``check``: ``check`` answers for
the pins the lock has, works offline from the cache and never writes; this
one asks the index what exists, downloads releases nobody pinned, may write
the lock (``--write``), and exits 1 when a release needs a maintainer's
decision, which is what a scheduled job wants to fail on.  The work is
:func:`dsv4patch.series.releases.watch`; this command renders it and the next steps.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from dsv4patch import report
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK, EXIT_UNEXPECTED

if TYPE_CHECKING:
    from dsv4patch.series import ReleaseReport

HELP = ("list the vLLM releases on the package index that the lock does not pin, check the series "
        "against each and print the lock entry it would add")

SHORT = {"upstream": "up", "already-applied": "applied", "clean": "clean", "offset": "offset",
         "conflict": "CONFLICT", "missing-file": "missing", "not-checked": "-"}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("releases", help=HELP, description=HELP + " (never writes unless --write)")
    _common.add_lock(p, pins=False, series=False)
    _common.add_output(p, markdown=True)
    _common.add_cache(p)
    p.add_argument("--pre", action="store_true", help="check pre-releases too (default: listed, not checked)")
    p.add_argument("--release", action="append", metavar="VERSION",
                   help="check only this release (repeatable); a pinned one is checked as if it were new and "
                        "compared with its pin's entry (state `pinned`: exit 0 when they agree, 1 with what "
                        "differs)")
    p.add_argument("--write", action="store_true",
                   help="add the entry of every release whose patches are all upstream or clean (and that "
                        "has a toolchain where its patches change kernels) to the lock; the others are "
                        "left to `dsv4patch port --to VERSION`; a pinned release is never written (its "
                        "entry stays as it is), so running it again after adopting one changes nothing")


def _next(r: ReleaseReport, lock: str) -> str | None:
    from dsv4patch.series import RELEASE_ADOPT, RELEASE_INVESTIGATE, RELEASE_PORT, RELEASE_TOOLCHAIN

    v = r.version
    if r.decision == RELEASE_ADOPT:
        return (f"adopt it: `dsv4patch releases --lock {lock} --release {v} --write`, then "
                f"`dsv4patch check --lock {lock} --pin {v}` and `dsv4patch verify --lock {lock} --pin {v}`"
                f" (or record why not in [watch].ignore)")
    if r.decision == RELEASE_PORT:
        return (f"carry the series over: `dsv4patch port --lock {lock} --to {v}` (add --workspace DIR to "
                f"resolve a conflict by hand), or record why not in [watch].ignore")
    if r.decision == RELEASE_TOOLCHAIN:
        return (f"add a [toolchains.*] table of torch {r.torch} with its hashed requirements file "
                f"(docs/kernels.md, \"The toolchain\"), then run this again")
    if r.state == "pinned" and r.decision == RELEASE_INVESTIGATE:
        return (f"see how the lock's entry fares: `dsv4patch check --lock {lock} --pin {r.reference}`; "
                f"`dsv4patch lock --lock {lock} --update --pin {r.reference}` rewrites its derived fields "
                "(base_tree, patched_tree)")
    if r.decision == RELEASE_INVESTIGATE:
        return "look at the index before pinning or keeping it; do not edit a lock sha256 to match"
    return None


def _numbers(nums: list[int]) -> str:
    """[1, 2, 3, 5] -> ``1-3,5``."""
    out: list[str] = []
    for n in nums:
        if out and n == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ",".join(out)


def _summary(r: ReleaseReport) -> str:
    """Each status with the patch numbers that have it: ``up 1-8; clean* 9,10`` (fits 80 columns)."""
    groups: dict[str, list[int]] = {}
    for p in r.patches:
        word = SHORT.get(p.status, p.status) + ("*" if p.variant_of else "")
        num = p.patch.split("-", 1)[0]
        groups.setdefault(word, []).append(int(num) if num.isdigit() else 0)
    return "; ".join(f"{w} {_numbers(n)}" for w, n in groups.items()) or "-"


def run(args: argparse.Namespace) -> int:
    from dsv4patch.series import RELEASE_ADOPT, watch_releases, write_release_entry

    ctx = _common.context(args)
    lock = ctx.lock
    result = watch_releases(ctx=ctx, pre=args.pre, only=args.release)
    reports = list(result.releases)
    if args.write:
        reports = [write_release_entry(lock.path, r) if r.decision == RELEASE_ADOPT and r.entry else r
                   for r in reports]
    out: dict[str, Any] = {**result.to_json(), "releases": {r.version: r.to_json() for r in reports}}
    shown = str(args.lock) if args.lock else str(lock.path)
    notes: list[str] = []
    for r in reports:
        line = f"{r.version}: {r.state}" + (f" ({r.detail})" if r.detail else "")
        if r.sdist is not None and r.state == "new":
            line += f"\n  sdist: {r.sdist['filename']} sha256 {r.sdist['sha256']} (the index's, verified)"
        for p in r.patches:
            if p.variant_of:
                whose = (f"the variant written for {r.version}" if p.variant_of == r.version
                         else f"pin {p.variant_of}'s variant")
                line += f"\n  {p.patch}: {p.series_status} as in the series; {p.status} with {whose}"
        if r.written:
            line += f"\n  written to {lock.path}"
        elif args.write and r.state.startswith("pinned"):
            line += f"\n  not written: {lock.path} pins it already; its entry is left as it is"
        elif r.entry:
            line += "\n  lock entry it would add:\n    " + r.entry.rstrip().replace("\n", "\n    ")
        nxt = None if r.written else _next(r, shown)
        if nxt:
            line += f"\n  next: {nxt}"
        notes.append(line)
    if not reports:
        notes.append(f"nothing new: every release on {result.index} since the oldest pin is pinned")
    out["notes"] = notes
    names: list[str] = []
    for r in reports:
        names += [p.patch for p in r.patches if p.patch not in names]
    rows = [[r.version, r.state, _summary(r), r.decision + (" (written)" if r.written else "")]
            for r in reports]
    table, md = report.simple_table(f"dsv4patch releases: {result.index}", ["release", "state", "patches", "decision"],
                                    rows)
    if names:
        md += ("\n\nPatches by number: " + ", ".join(f"{n.split('-', 1)[0].lstrip('0')} = {n}" for n in names)
               + ". `up`: upstream by its markers; `*`: with a variant written for the release or a nearby pin "
               "(see the notes).")
    if not rows:  # nothing to tabulate: the note says so
        report.emit(args.format, out, None, f"No vLLM release on {result.index} needs a decision.")
    else:
        report.emit(args.format, out, table, md)
    pending = [r.version for r in reports if r.needs_decision and not r.written]
    return EXIT_UNEXPECTED if pending else EXIT_OK
