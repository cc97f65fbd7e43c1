"""``dsv4patch lock --update``: recompute the lock's derived fields.

Derived fields are the sdist's URL and size (from the index), the pin's base
tree id and the tree id after its series.  The sha256 and commit are the
trust anchors and are never rewritten: a mismatch with the index is an error.
"""

from __future__ import annotations

import argparse
from typing import Any

from dsv4patch import index, report
from dsv4patch.commands import _common
from dsv4patch.commands.check import check_pin
from dsv4patch.errors import EXIT_OK, EXIT_UNEXPECTED, FetchError
from dsv4patch.lock import load, update_derived

HELP = "recompute derived lock fields (sdist url/size, base and patched tree ids)"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("lock", help=HELP, description=HELP)
    _common.add_lock(p, series=False)
    p.add_argument("--update", action="store_true", required=True, help="rewrite derived fields")
    _common.add_output(p)
    _common.add_cache(p)


def run(args: argparse.Namespace) -> int:
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
        repo, _series, result = check_pin(lock, pin, store, prog)
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
