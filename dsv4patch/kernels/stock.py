"""A file of the pin's stock vLLM wheel from PyPI, fetched once and verified.

The rebuilt kernels are compared with what vLLM itself ships (which archs,
which PTX), and the GPU proof loads vLLM's own ``_C_stable_libtorch``.  The
wheel is about 300 MB: it is downloaded once into the store's blobs (checked
against the lock's ``[pins."X".wheels]`` sha256 and size, like an sdist), and
a member is extracted once into ``<store>/kernels/stock/<wheel sha256>/``.
"""

from __future__ import annotations

import platform
import shutil
import zipfile
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from dsv4patch import safeio
from dsv4patch.errors import BuildError, LockFileError
from dsv4patch.progress import Progress

if TYPE_CHECKING:
    from dsv4patch.pins import Pin, WheelFile
    from dsv4patch.store import Store

STABLE_LIBRARY = "vllm/_C_stable_libtorch.abi3.so"


def wheel_for(pin: Pin, machine: str | None = None) -> WheelFile:
    """The pin's stock wheel for ``machine`` (default: this host)."""
    machine = (machine or platform.machine()).lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    if machine not in pin.wheels:
        raise LockFileError(
            f'pin {pin.name}: the lock has no stock wheel for {machine} ([pins."{pin.name}".wheels] '
            f"has {', '.join(pin.wheels) or 'none'}); add its url, sha256 and size from PyPI"
        )
    return pin.wheels[machine]


def wheel_path(store: Store, wheel: WheelFile, progress: Progress | None = None) -> Path:
    """The verified wheel in the store (downloaded on first use)."""
    name = PurePosixPath(wheel.url).name or wheel.sha256
    return store.fetch_blob(wheel.url, wheel.sha256, wheel.size, name, progress or Progress(False))


def member(store: Store, wheel: WheelFile, name: str = STABLE_LIBRARY,
           progress: Progress | None = None) -> Path:
    """``name`` from the wheel, extracted once (read-only) into the store."""
    dest = store.root / "kernels" / "stock" / wheel.sha256 / PurePosixPath(name).name
    if safeio.is_regular(dest):
        return dest
    blob = wheel_path(store, wheel, progress)
    with store.mutex(f"stock-{wheel.sha256}"):
        if safeio.is_regular(dest):
            return dest
        store.subdir("kernels", "stock", wheel.sha256)
        try:  # an owned partial file: removed on any failure or interrupt, swept if killed
            with zipfile.ZipFile(blob) as zf, zf.open(name) as src, safeio.replacing(dest, mode=0o444) as out:
                shutil.copyfileobj(src, out, 1 << 20)
        except KeyError:
            raise BuildError(f"{PurePosixPath(wheel.url).name} has no member {name}") from None
    return dest
