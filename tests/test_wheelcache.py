"""wheelcache.py: a pin's kernel wheel kept per patched tree and toolchain.

Kept and read back byte for byte; an entry of another shape, of another key, a wheel of
another size or sha256, or a link planted at the entry or the wheel is never taken (None:
the caller builds and keeps anew, never through the link).  The key is the lock's
toolchain as the cache holds it: None while a part of it is not installed (nothing is
installed to make the key), and another key for another patched tree, arch list or nvcc.
The `wheel` command's use of it (a warm wheel reads the kept wheel and neither reads nor
vets the cache's tree; a damaged one is built anew) is in tests/test_vllm_wheel.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import LOCK
from dsv4patch.kernels import toolchain, wheelcache
from dsv4patch.pins.lock import load
from dsv4patch.progress import Progress
from dsv4patch.store import Store

KEY = "ab" * 32
NAME = "dsv4patch_kernels_0_27_1-0.27.1+treeabc.b123-py3-none-linux_x86_64.whl"


def _built(tmp_path: Path, data: bytes = b"PK\x05\x06" + bytes(18)) -> Path:
    wheel = tmp_path / "built" / NAME
    wheel.parent.mkdir(parents=True, exist_ok=True)
    wheel.write_bytes(data)
    return wheel


def test_a_kept_wheel_is_read_back_byte_for_byte_and_only_under_its_key(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    assert wheelcache.kept(store, KEY) is None  # nothing kept yet
    wheel = _built(tmp_path, os.urandom(4096))
    wheelcache.keep(store, KEY, wheel)
    got = wheelcache.kept(store, KEY)
    assert got is not None and got.name == NAME and got.read_bytes() == wheel.read_bytes()
    assert got.parent == store.root / wheelcache.WHEELS / KEY  # the cache's copy, not the build's file
    assert wheelcache.kept(store, "cd" * 32) is None
    entry = json.loads((got.parent / wheelcache.ENTRY).read_text())
    assert entry == {"schema": wheelcache.SCHEMA, "key": KEY, "wheel": NAME, "size": 4096,
                     "sha256": entry["sha256"]}


@pytest.mark.parametrize("damage", ["bytes", "size", "entry-key", "entry-extra", "entry-name", "entry-json",
                                    "entry-link", "wheel-link", "dir-link", "wheels-link"])
def test_a_damaged_or_planted_entry_is_never_taken(tmp_path: Path, damage: str) -> None:
    store = Store.open(tmp_path / "cache")
    wheelcache.keep(store, KEY, _built(tmp_path, os.urandom(4096)))
    d = store.root / wheelcache.WHEELS / KEY
    entry_path, wheel = d / wheelcache.ENTRY, d / NAME
    entry = json.loads(entry_path.read_text())
    outside = tmp_path / "outside"
    outside.mkdir()
    if damage == "bytes":  # same size, other bytes
        data = bytearray(wheel.read_bytes())
        data[100] ^= 0xFF
        wheel.write_bytes(bytes(data))
    elif damage == "size":
        wheel.write_bytes(wheel.read_bytes() + b"x")
    elif damage == "entry-key":
        entry_path.write_text(json.dumps({**entry, "key": "cd" * 32}))
    elif damage == "entry-extra":
        entry_path.write_text(json.dumps({**entry, "run": "sh -c id"}))
    elif damage == "entry-name":  # a name that leaves the entry's directory
        shutil.copyfile(wheel, outside / NAME)
        entry_path.write_text(json.dumps({**entry, "wheel": f"../../../outside/{NAME}"}))
    elif damage == "entry-json":
        entry_path.write_text("{")
    elif damage == "entry-link":  # a good entry elsewhere, linked in
        (outside / "entry.json").write_text(json.dumps(entry))
        entry_path.unlink()
        entry_path.symlink_to(outside / "entry.json")
    elif damage == "wheel-link":  # the wheel a link to a file with the right bytes
        shutil.copyfile(wheel, outside / NAME)
        wheel.unlink()
        wheel.symlink_to(outside / NAME)
    elif damage == "dir-link":  # the entry's directory a link to a good entry elsewhere
        moved = outside / "entry"
        shutil.move(str(d), moved)
        d.symlink_to(moved)
    else:  # the cache's directory of kept wheels a link to good entries elsewhere
        moved = outside / "wheels"
        shutil.move(str(d.parent), moved)
        d.parent.symlink_to(moved)
    assert wheelcache.kept(store, KEY) is None
    # Kept anew over it: the link replaced (never written through), the files outside untouched.
    before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file() and not p.is_symlink()}
    fresh = _built(tmp_path, os.urandom(2048))
    wheelcache.keep(store, KEY, fresh)
    got = wheelcache.kept(store, KEY)
    assert got is not None and got.read_bytes() == fresh.read_bytes()
    assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file() and not p.is_symlink()} == before


def test_the_key_is_the_lock_toolchain_as_the_cache_holds_it(tmp_path: Path, shared_cache: Path) -> None:
    """No key while the pin's torch is not in the cache (and nothing installed to make one); with
    the pin's torch installed (the card command's, in the shared cache): a key, the same each time, another one for another
    patched tree, arch list or nvcc; none for a pin without a toolchain in the lock."""
    lock = load(LOCK)
    pin = lock.pin("0.27.1")
    assert pin.toolchain is not None and pin.patched_tree
    empty = Store.open(tmp_path / "empty")
    args = {"pin": pin, "patched_tree": pin.patched_tree, "archs": None, "nvcc": None, "progress": Progress(False)}
    assert wheelcache.key(store=empty, **args) is None
    assert not (empty.root / "toolchains").exists() or not any((empty.root / "toolchains").iterdir())
    no_toolchain = next((p for p in lock.pins.values() if p.toolchain is None), None)
    if no_toolchain is not None:
        assert wheelcache.key(store=empty, **{**args, "pin": no_toolchain}) is None
    store = Store.open(shared_cache)
    toolchain.ensure_torch(store, pin.toolchain, Progress(False))  # the card command's, installed if missing
    first = wheelcache.key(store=store, **args)
    assert first is not None
    assert wheelcache.key(store=store, **args) == first
    others = {wheelcache.key(store=store, **{**args, "patched_tree": "0" * 40}),
              wheelcache.key(store=store, **{**args, "archs": ["9.0"]})}
    nvcc = shutil.which("nvcc")
    if nvcc:  # the same nvcc through another path: another key (the path is part of it)
        link = tmp_path / "bin" / "nvcc"
        link.parent.mkdir()
        link.symlink_to(os.path.realpath(nvcc))
        others.add(wheelcache.key(store=store, **{**args, "nvcc": str(link)}))
    assert first not in others and None not in others and len(others) == (3 if nvcc else 2)
