"""store.py: the cache's temporary entries are owned by their run; what a killed run left is swept.

Downloads are in tests/test_index.py and tests/test_hostile_delivery.py; bad cache input in
tests/test_inputs.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dsv4patch import safeio, store
from dsv4patch.store import Store

ROOT = Path(__file__).resolve().parent.parent

_HOLDER = """
import sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from dsv4patch.store import Store
s = Store.open(Path({cache!r}))
d = s.tmpdir("kernels-wheel-")
(d / "vllm_kernels.whl").write_bytes(b"x" * 1000)
print(d, flush=True)
time.sleep(300)
"""


def test_a_work_directory_is_swept_once_its_run_was_killed(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER.format(root=str(ROOT), cache=str(cache))],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    work = Path(proc.stdout.readline().strip())
    try:
        assert work.parent == cache / "tmp" and work.name.startswith("kernels-wheel-")
        Store.open(cache)  # another run opens the cache meanwhile: the live run's directory stays
        assert work.is_dir() and store.stale_tmp(Store(cache)) == []
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert store.stale_tmp(Store(cache)) == [work]
    Store.open(cache)  # the next run
    assert not work.exists() and list((cache / "tmp").iterdir()) == []


def test_an_unowned_entry_goes_only_once_it_is_old(tmp_path: Path) -> None:
    """What an older dsv4patch left (no owner): swept after safeio.STALE_AGE, kept while young."""
    s = Store.open(tmp_path / "cache")
    legacy = s.root / "tmp" / "kernels-wheel-abc123"
    legacy.mkdir()
    (legacy / "w.whl").write_bytes(b"x")
    dl = s.root / "tmp" / "dl-xyz"
    dl.write_bytes(b"partial")
    assert store.stale_tmp(s) == []
    old = time.time() - safeio.STALE_AGE - 10
    for p in (legacy, dl):
        os.utime(p, (old, old))
    assert sorted(store.stale_tmp(s)) == sorted([legacy, dl])
    Store.open(s.root)
    assert list((s.root / "tmp").iterdir()) == []


def test_own_work_directories_are_removed_with_their_lock(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "cache")
    d = s.tmpdir("toolchain-torch-")
    assert safeio.owned_by_a_live_writer(d) and store.stale_tmp(s) == []
    s.remove_tmp(d)
    assert not d.exists() and str(d) not in store._OWNERS


def test_a_link_planted_for_a_cache_directory_is_removed_never_followed(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "cache")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("x")
    (s.root / "toolchains").symlink_to(elsewhere)
    made = s.subdir("toolchains")
    assert made == s.root / "toolchains" and made.is_dir() and not made.is_symlink()
    assert (elsewhere / "keep").read_text() == "x"


def test_a_blob_that_is_a_link_is_not_a_cache_hit(tmp_path: Path) -> None:
    """A link planted at blobs/sha256/<hex> (even to a file with the right bytes) is removed and fetched again."""
    import hashlib

    import pytest

    from dsv4patch.errors import NotFetchedError
    from dsv4patch.progress import Progress

    s = Store.open(tmp_path / "cache")
    data = b"the pinned bytes"
    sha = hashlib.sha256(data).hexdigest()
    target = tmp_path / "planted"
    target.write_bytes(data)
    s.blob_path(sha).symlink_to(target)
    with pytest.raises(NotFetchedError):  # no url: it must be fetched again, the link is not used
        s.fetch_blob("", sha, len(data), "x", Progress(False))
    assert not os.path.lexists(s.blob_path(sha)) and target.read_bytes() == data


_EXITING = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from dsv4patch import safeio
from dsv4patch.store import Store
from dsv4patch.main import main
s = Store.open(Path({cache!r}))
left = s.tmpdir("kernels-wheel-")  # as an interrupt between a directory's creation and its try leaves it
kept = s.tmpdir("verify-x-")
s.keep_tmp(kept)  # verify --keep
fd, partial = safeio.create_owned(s.root / "tmp", "dl")  # a download's partial file, likewise
print(left, kept, partial, flush=True)
raise SystemExit(main(["--version"]))
"""


def test_a_run_removes_the_work_directories_it_still_owns_as_it_exits(tmp_path: Path) -> None:
    """main's exit removes what no finally did (directories and partial files) (the random interrupts of tests/test_recovery.py once
    left a kernels-wheel- directory: SIGINT between its creation and the try that removes it); a
    directory the user asked to keep stays until a later run sweeps it."""
    cache = tmp_path / "cache"
    done = subprocess.run([sys.executable, "-c", _EXITING.format(root=str(ROOT), cache=str(cache))],
                          capture_output=True, text=True, check=True)
    left, kept, partial = (Path(p) for p in done.stdout.split("\n")[0].split())
    assert not left.exists() and not partial.exists() and kept.is_dir()
    assert store.stale_tmp(Store(cache)) == [kept]  # its run is over: the next run sweeps it
    Store.open(cache)
    assert list((cache / "tmp").iterdir()) == []


def test_remove_owned_removes_only_this_runs_directories(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "cache")
    other = s.root / "tmp" / "kernels-wheel-other"  # another run's (no owner, young: never touched)
    other.mkdir()
    mine = [s.tmpdir("port-a-"), s.tmpdir("tree-a-")]
    assert sorted(store.remove_owned()) == sorted(mine)
    assert not any(p.exists() for p in mine) and other.is_dir() and store._OWNERS == {}
    assert store.remove_owned() == []


def test_a_file_in_the_way_of_the_cache_is_named_not_called_unwritable(tmp_path: Path) -> None:
    """``--cache-dir`` naming a file, or a directory below one: the message says which file is in the way
    (it read "is not writable (File exists)" and "(Not a directory)"); the CLI exits with the cache's code."""
    from dsv4patch.errors import EXIT_FETCH, CacheError
    from dsv4patch.main import main

    plain = tmp_path / "notes.txt"
    plain.write_text("x")
    for root, said in [(plain, f"cache directory {plain} is a file, not a directory"),
                       (plain / "cache", f"cache directory {plain / 'cache'} cannot be made: {plain} is a file, "
                                         "not a directory")]:
        try:
            Store.open(root)
        except CacheError as exc:
            assert str(exc).startswith(said + "; point DSV4PATCH_CACHE"), str(exc)
        else:
            raise AssertionError(f"{root}: opened")
        assert plain.read_text() == "x"
    lock = Path(__file__).resolve().parent.parent / "locks" / "vllm.toml"
    assert main(["check", "--lock", str(lock), "--pin", "0.27.1", "--cache-dir", str(plain)]) == EXIT_FETCH
