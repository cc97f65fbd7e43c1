"""fetching.py: seeding the cache from files the lock pins, then materializing the pins.

Real sdists (tar.gz written here, as in test_hostile.py) in a fresh cache; the
core function is called directly (the CLI's rendering is test_hostile.py's).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from dsv4patch.errors import FetchError, IntegrityError, NotFetchedError
from dsv4patch.pins import Context, fetching
from dsv4patch.pins.lock import load
from dsv4patch.progress import Progress
from dsv4patch.store import Store
from test_hostile import Sdist, sdist_lock


def test_seed_then_materialize(tmp_path: Path) -> None:
    data = Sdist().bytes()
    lock_path, cache, sdist = sdist_lock(tmp_path, data)
    digest = hashlib.sha256(data).hexdigest()
    (cache / "blobs" / "sha256" / digest).unlink()
    lock, store = load(lock_path), Store.open(cache)
    with pytest.raises(NotFetchedError):  # neither cached nor downloadable: the seed is what fetches it
        fetching.fetch(ctx=Context(lock=lock, store=store, progress=Progress(False)))
    res = fetching.fetch(ctx=Context(lock=lock, store=store, progress=Progress(False)), sdists=[sdist])
    assert [(s.kind, s.sha256, s.pins, s.added) for s in res.seeded] == [("sdist", digest, ("s",), True)]
    assert [m.pin for m in res.pins] == ["s"] and (res.pins[0].repo / "HEAD").exists()
    assert res.to_json()["seeded"] == {str(sdist): ["s"]}
    again = fetching.fetch(ctx=Context(lock=lock, store=store, progress=Progress(False)), sdists=[sdist], pins=["s"])
    assert again.seeded[0].added is False and "already in the cache" in again.seeded[0].note()
    assert again.pins == res.pins


def test_a_file_the_lock_does_not_pin_is_refused(tmp_path: Path) -> None:
    lock_path, cache, sdist = sdist_lock(tmp_path, Sdist().bytes())
    other = tmp_path / "other.tar.gz"
    other.write_bytes(sdist.read_bytes() + b"\0")
    lock, store = load(lock_path), Store.open(cache)
    with pytest.raises(IntegrityError, match="is not pinned by any selected pin"):
        fetching.fetch(ctx=Context(lock=lock, store=store, progress=Progress(False)), sdists=[other])
    with pytest.raises(IntegrityError, match="is not a stock wheel any selected pin locks"):
        fetching.fetch(ctx=Context(lock=lock, store=store, progress=Progress(False)), wheels=[sdist])
    with pytest.raises(FetchError, match="cannot read the sdist"):
        fetching.fetch(ctx=Context(lock=lock, store=store, progress=Progress(False)), sdists=[tmp_path / "missing"])
    assert not list((cache / "trees").glob("*.git"))


@pytest.mark.parametrize("case", ["fifo", "device", "sparse"])
def test_a_seeded_file_that_is_no_regular_file_or_too_large_is_refused_unread(tmp_path: Path, case: str) -> None:
    """The real lock: `fetch --sdist` of a FIFO or /dev/zero read for ever (hash_file had no bound), a 3 GiB
    sparse file was hashed whole; now a FIFO or device is refused unopened for reading and a file larger
    than the largest sdist the lock pins is refused at its size, unread (exit 4, the file named).  The CLI
    runs in a child under a 20 s deadline (conftest.cli_bounded)."""
    from conftest import LOCK, cli_bounded
    from dsv4patch.errors import EXIT_FETCH

    sdist = tmp_path / "vllm-0.27.1.tar.gz"
    if case == "fifo":
        os.mkfifo(sdist)
    elif case == "device":
        sdist = Path("/dev/zero")
    else:
        sdist.write_bytes(b"\x1f\x8b")
        os.truncate(sdist, 3 << 30)
    largest = max(p.source.size or 0 for p in load(LOCK).pins.values())
    res = cli_bounded("fetch", "--lock", LOCK, "--sdist", sdist, "--cache-dir", tmp_path / "c", timeout=20)
    needle = {"fifo": "is a FIFO, not a regular file", "device": "is a device, not a regular file",
              "sparse": f"is {3 << 30} bytes, more than any sdist the selected pins lock (at most {largest} bytes)"}[case]
    assert res.rc == EXIT_FETCH and f"{sdist}: the sdist {needle}" in res.err, (res.rc, res.err)
    assert not [p for p in (tmp_path / "c").rglob("*") if p.is_file() and p.parent.name == "sha256"]  # nothing cached
