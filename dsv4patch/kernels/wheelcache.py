"""A pin's kernel wheel kept per patched tree and toolchain, so a warm ``wheel`` neither vets nor scans a tree.

Why this exists: once its objects are cached, a warm ``wheel`` still spent about
a third of its own work on the kernel step: vetting the cache's patched tree
and its git state, the plan, probing nvcc twice, then writing a kernel wheel
whose bytes it had written before.  That wheel is a pure function of what
:func:`key` hashes: the patched tree (a git tree id, computed from the verified
sdist and the patch texts), the pin's lock entry and toolchain (its
requirements file's bytes), the torch the cache provisioned for it, the nvcc
the toolchain picks now (path, origin and full ``--version`` text: asked each
run, one child), the arch list asked for, the machine, and the code that
builds (every module of this package and ``zipcopy.py``, with dsv4patch's
version).  So it is kept under ``<cache>/kernel-wheels/<key>/`` with an entry
that names it and its sha256, and a run whose key matches reads that file
instead.  Only where the build takes the lock's toolchain (no ``--python``,
``--allow-torch`` or extra include directory: another interpreter's torch or
headers are not in the key); anything else builds as before.

An entry is read without following a link (at the entry, its wheel or the
directories above them in the cache) and within a size bound, and must have
exactly the entry's shape, name this key and a wheel file of exactly that
size and sha256; anything else is not used (the wheel is built and kept anew).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dsv4patch import safeio
from dsv4patch.errors import Dsv4Error
from dsv4patch.hashing import code_identity, sha256
from dsv4patch.records import frozen

if TYPE_CHECKING:
    from dsv4patch.pins import Pin
    from dsv4patch.progress import Progress
    from dsv4patch.store import Store

SCHEMA = "kernel-wheel-v1"
WHEELS = "kernel-wheels"  # the cache's directory of kept kernel wheels
ENTRY = "entry.json"
ENTRY_LIMIT = 4096  # bytes an entry may have
WHEEL_LIMIT = 1 << 30  # bytes a kept kernel wheel may have (its library is tens of MB)


@frozen
class Entry:
    """``<cache>/kernel-wheels/<key>/entry.json``: the kept wheel's file name, size and sha256."""

    schema: str
    key: str
    wheel: str
    size: int
    sha256: str

    @classmethod
    def parse(cls, data: object) -> Entry:
        """The entry ``data`` (parsed JSON) describes; ValueError unless it has exactly this shape."""
        names = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(data, dict) or sorted(data) != sorted(names):
            raise ValueError("not a kernel wheel entry")
        entry = cls(**data)
        if not (entry.schema == SCHEMA and isinstance(entry.key, str) and isinstance(entry.wheel, str)
                and isinstance(entry.size, int) and not isinstance(entry.size, bool)
                and isinstance(entry.sha256, str) and len(entry.sha256) == 64):
            raise ValueError("not a kernel wheel entry")
        if "/" in entry.wheel or entry.wheel in ("", ".", "..") or not entry.wheel.endswith(".whl"):
            raise ValueError(f"not a wheel file name: {entry.wheel!r}")
        return entry


def key(*, store: Store, pin: Pin, patched_tree: str, archs: Sequence[str] | None, nvcc: str | None,
        progress: Progress) -> str | None:
    """The key of ``pin``'s kernel wheel for the patched tree ``patched_tree``, built with the lock's
    toolchain (``nvcc``: the one ``--nvcc`` names); None when the pin has no toolchain in the lock or
    a part of it is not installed yet (the build installs it, and says why if it cannot)."""
    from dsv4patch.kernels import toolchain

    tdef = pin.toolchain
    found = toolchain.provisioned(store, tdef, nvcc, progress) if tdef is not None else None
    if tdef is None or found is None:
        return None
    torch, chosen = found
    facts = {
        "schema": SCHEMA, "code": code_identity(_deciding()), "machine": platform.machine(),
        "patched_tree": patched_tree, "archs": list(archs) if archs else None,
        "pin": repr(pin), "requirements": sha256(safeio.read_bytes(tdef.requirements, 1 << 20)),
        "torch": [torch.version, torch.cuda, torch.origin],
        "nvcc": [str(chosen.path), chosen.origin, chosen.version_text],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def _deciding() -> list[str]:
    """The code whose bytes decide the kernel wheel's (relative to dsv4patch/): this package's
    modules and the zip writer."""
    return [f"kernels/{p.name}" for p in sorted(Path(__file__).parent.glob("*.py"))] + ["zipcopy.py"]


def kept(store: Store, key: str) -> Path | None:
    """The kernel wheel kept under ``key``, or None (none, or an entry that is not exactly one)."""
    entry_dir = store.root / WHEELS / key
    try:
        if not (_real_dir(store.root / WHEELS) and _real_dir(entry_dir)):
            return None  # a link planted in the way: never read through
        entry = Entry.parse(json.loads(safeio.read_bytes(entry_dir / ENTRY, ENTRY_LIMIT)))
        if entry.key != key:
            return None
        path = entry_dir / entry.wheel
        if not safeio.is_regular(path) or path.stat().st_size != entry.size or entry.size > WHEEL_LIMIT:
            return None
        if sha256(safeio.read_bytes(path, WHEEL_LIMIT)) != entry.sha256:
            return None
    except (OSError, ValueError, TypeError, Dsv4Error):
        return None
    return path


def _real_dir(path: Path) -> bool:
    """Is ``path`` itself (not what a link points at) a directory?"""
    return stat.S_ISDIR(os.lstat(path).st_mode)


def keep(store: Store, key: str, wheel: Path) -> None:
    """Keep the kernel wheel ``wheel`` (just built) under ``key``: the wheel, then its entry (written
    last, so a half-kept one is never read).  A full or read-only cache only loses the shortcut."""
    try:
        data = safeio.read_bytes(wheel, WHEEL_LIMIT)
        entry_dir = store.subdir(WHEELS, key)
        safeio.atomic_write(entry_dir / wheel.name, data, durable=False)
        entry = Entry(schema=SCHEMA, key=key, wheel=wheel.name, size=len(data), sha256=sha256(data))
        safeio.atomic_write(entry_dir / ENTRY, json.dumps(dataclasses.asdict(entry), sort_keys=True) + "\n",
                            durable=False)
    except (OSError, Dsv4Error):
        pass
