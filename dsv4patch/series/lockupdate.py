"""``lock --update``: recompute the lock's derived fields from the index and the pin check.

Derived fields are the sdist's URL and size (from the index), the pin's base
tree id and the tree id after its series (from :func:`pincheck.check_pin`).
The sha256 and commit are the trust anchors and are never rewritten: a
mismatch with the index is an error.  Fields are written back through
:func:`lock.update_derived`, which keeps the file's comments and layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4patch import index
from dsv4patch.errors import FetchError
from dsv4patch.pins import load_lock, update_derived
from dsv4patch.records import frozen
from dsv4patch.series import pincheck

if TYPE_CHECKING:
    from dsv4patch.pins import Context


@frozen
class PinUpdate:
    """One pin's derived fields as recomputed, and whether the lock changed."""

    pin: str
    base_tree: str
    patched_tree: str | None  # None: the series does not apply (then not set)
    source: dict[str, Any]  # the sdist's url and size, when they were looked up
    changed: bool
    blocked: str = ""  # "patch: status; ..." of the patches that stop the series

    def to_json(self) -> dict[str, Any]:
        return {"base_tree": self.base_tree, "patched_tree": self.patched_tree, **self.source,
                "changed": self.changed}

    @property
    def state(self) -> str:
        state = "updated" if self.changed else "unchanged"
        if self.patched_tree is None:
            state += f", patched_tree not set: the series does not apply ({self.blocked})"
        return state


@frozen
class LockUpdate:
    lock: Path
    pins: list[PinUpdate]

    @property
    def ok(self) -> bool:
        return all(p.patched_tree is not None for p in self.pins)

    def to_json(self) -> dict[str, Any]:
        return {"lock": str(self.lock), "pins": {p.pin: p.to_json() for p in self.pins}, "ok": self.ok}


def update(*, ctx: Context, pins: list[str] | None) -> LockUpdate:
    """Recompute and write the derived fields of ``pins`` (default: all) in the lock's file."""
    lock = ctx.lock
    done = []
    for pin in lock.select(pins):
        src_values: dict[str, Any] = {}
        if pin.source.kind == "pypi-sdist" and (not pin.source.url or pin.source.size is None):
            info = index.find_sdist(pin.source.name, pin.source.version)
            if info.sha256 != pin.source.sha256:
                raise FetchError(
                    f"pin {pin.name}: the index's {info.filename} has sha256 {info.sha256}, the "
                    f"lock pins {pin.source.sha256}; refusing to update"
                )
            src_values = {"url": info.url, "size": info.size}
            lock = load_lock(lock.path) if update_derived(lock.path, pin.name, {}, src_values) else lock
            pin = lock.pin(pin.name, given_as=None)
        checked = pincheck.check_pin(ctx=ctx.on(lock), pin=pin)
        repo, result = checked.repo, checked.result
        final = result.final_tree
        changed = update_derived(lock.path, pin.name, {"base_tree": repo.base_tree, "patched_tree": final}, {})
        blocked = "; ".join(f"{r.patch}: {r.status.value}" for r in result.patches if r.status.blocks)
        done.append(PinUpdate(pin.name, repo.base_tree, final, src_values, changed, blocked))
    return LockUpdate(lock.path, done)
