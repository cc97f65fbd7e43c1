"""``dsv4patch fetch``: fill the cache (download, verify, materialize) ahead of time.

``--sdist FILE`` (and ``--wheel FILE``, a stock vLLM wheel) seeds the cache
from a file obtained elsewhere (an offline build, a Docker context); it
enters the cache only if its sha256 is one the lock pins.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dsv4patch import report, tree
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK, FetchError, IntegrityError
from dsv4patch.store import hash_file

HELP = "download, verify and materialize pins into the cache (or seed it from a file)"


def add_parser(sub: Any) -> None:
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
    lock = _common.open_lock(args)
    store = _common.open_store(args)
    prog = _common.progress(args)
    pins = lock.select(args.pin)
    wanted: dict[str, list[str]] = {}
    for p in pins:
        if p.source.kind == "pypi-sdist":
            wanted.setdefault(p.source.sha256, []).append(p.name)
    notes: list[str] = []
    seeded: dict[str, list[str]] = {}
    wheels = {w.sha256: [f"{p.name} ({w.platform} wheel)"] for p in pins for w in p.wheels.values()}

    def seed(f: Path, what: str, known: dict[str, list[str]], unknown: str) -> tuple[str, list[str], bool]:
        """Copy F into the store if its sha256 is one a selected pin locks (else refuse)."""
        try:
            digest = hash_file(f)
        except OSError as exc:
            raise FetchError(f"{f}: cannot read the {what} ({exc.strerror})") from None
        if digest not in known:
            raise IntegrityError(f"{f}: sha256 {digest} is not {unknown}")
        seeded[str(f)] = known[digest]
        return digest, known[digest], store.seed_blob(f, digest)

    for f in args.wheel:
        _digest, names, added = seed(f, "wheel", wheels, "a stock wheel any selected pin locks")
        notes.append(f"{f}: pin {names[0]}; "
                     + ("copied into the cache" if added else "already in the cache"))
    for f in args.sdist:
        digest, names, added = seed(f, "sdist", wanted, "pinned by any selected pin")
        notes.append(
            f"{f}: the sdist of pin{'s' if len(names) > 1 else ''} {', '.join(names)} "
            f"(sha256 {digest[:12]}...); "
            + ("copied into the cache" if added else "already in the cache")
        )
    out: dict[str, Any] = {"pins": {}, "ok": True, "seeded": seeded, "notes": notes}
    rows = []
    for pin in pins:
        repo = tree.materialize(pin, store, prog)
        out["pins"][pin.name] = {"repo": str(repo.repo), "base_commit": repo.base_commit,
                                 "base_tree": repo.base_tree}
        rows.append([pin.name, repo.base_tree[:12], str(repo.repo)])
    table, md = report.simple_table("dsv4patch fetch", ["pin", "base tree", "cache"], rows)
    report.emit(args.format, out, table, md)
    return EXIT_OK
