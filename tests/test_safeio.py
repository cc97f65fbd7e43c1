"""safeio: planted links, FIFOs, devices, oversized files and deep JSON are refused, never followed or read whole."""

from __future__ import annotations

import io
import mmap
import os
import threading
from pathlib import Path

import pytest

from dsv4patch import safeio
from dsv4patch.errors import TreeError
from dsv4patch.safeio import UnsafeFileError


def _watchdog(seconds: float = 10.0) -> threading.Timer:
    """Fail loudly (instead of hanging the suite) if a FIFO open blocks."""
    t = threading.Timer(seconds, lambda: os._exit(99))
    t.daemon = True
    t.start()
    return t


def test_read_regular_file(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"hello")
    assert safeio.read_bytes(f, 5) == b"hello"
    assert safeio.read_text(f) == "hello"


def test_symlink_is_refused_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "outside"
    target.write_text("secret")
    link = tmp_path / "state"
    link.symlink_to(target)
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        safeio.read_bytes(link)
    with pytest.raises(TreeError, match=str(link)):
        safeio.open_regular(link, os.O_RDWR | os.O_CREAT | os.O_TRUNC, error=TreeError)
    assert target.read_text() == "secret"


def test_symlink_loop_is_refused(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(UnsafeFileError):
        safeio.read_bytes(loop)


def test_fifo_never_blocks(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t = _watchdog()
    try:
        for flags in (os.O_RDONLY, os.O_RDWR | os.O_CREAT, os.O_WRONLY):
            with pytest.raises(UnsafeFileError, match="FIFO"):
                safeio.open_regular(fifo, flags)
        with pytest.raises(UnsafeFileError, match="FIFO"):
            safeio.read_json(fifo)
    finally:
        t.cancel()


def test_directory_and_device_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsafeFileError, match="directory"):
        safeio.read_bytes(tmp_path)
    with pytest.raises(UnsafeFileError, match="directory"):
        safeio.open_regular(tmp_path, os.O_WRONLY)
    with pytest.raises(UnsafeFileError, match="device"):
        safeio.read_bytes("/dev/zero")


def test_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        safeio.read_bytes(tmp_path / "nope")


def test_read_past_limit_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as fh:
        fh.truncate(3 << 30)  # 3 GiB, sparse: reading it whole would take 3 GiB of memory
    with pytest.raises(UnsafeFileError, match="larger than 1024 bytes"):
        safeio.read_bytes(sparse, 1024)
    exact = tmp_path / "exact"
    exact.write_bytes(b"x" * 1024)
    assert len(safeio.read_bytes(exact, 1024)) == 1024


def test_read_stream_stops_at_limit_plus_one() -> None:
    class Endless(io.RawIOBase):
        served = 0

        def read(self, n: int = -1) -> bytes:
            self.served += n
            return b"a" * n

    s = Endless()
    with pytest.raises(UnsafeFileError, match="larger than 100"):
        safeio.read_stream(s, 100, label="page")
    assert s.served == 101
    assert safeio.read_stream(io.BytesIO(b"abc"), 3, label="x") == b"abc"


def test_not_utf8(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"\xff\xfe")
    with pytest.raises(UnsafeFileError, match="not UTF-8"):
        safeio.read_text(f)


def test_deep_json_is_an_error_not_a_crash() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(UnsafeFileError, match="nested deeper"):
        safeio.loads_json(deep, label="state")
    medium = "[" * 100 + "]" * 100  # parses, but deeper than the cap
    with pytest.raises(UnsafeFileError, match="nested deeper than 64"):
        safeio.loads_json(medium, label="state")
    assert safeio.loads_json("[" * 64 + "]" * 64, label="state") is not None
    deep_obj = '{"a":' * 100_000 + "1" + "}" * 100_000
    with pytest.raises(UnsafeFileError):
        safeio.loads_json(deep_obj, label="state")


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", "{", "1" * 5000, b"\xff"])
def test_bad_json(text: str | bytes) -> None:
    with pytest.raises(UnsafeFileError, match="not valid JSON"):
        safeio.loads_json(text, label="state")


def test_json_size_cap() -> None:
    with pytest.raises(UnsafeFileError, match="larger than 10"):
        safeio.loads_json("[" + "1," * 10 + "1]", label="x", limit=10)


def test_atomic_write_replaces_a_planted_link(tmp_path: Path) -> None:
    target = tmp_path / "outside"
    target.write_text("keep")
    d = tmp_path / "d"
    d.mkdir()
    (d / "state").symlink_to(target)
    safeio.atomic_write(d / "state", "new", 0o600)
    assert target.read_text() == "keep"
    assert not (d / "state").is_symlink() and (d / "state").read_text() == "new"
    assert oct((d / "state").stat().st_mode & 0o777) == oct(0o600)
    assert sorted(p.name for p in d.iterdir()) == ["state"]


def test_atomic_write_failure_leaves_no_temp(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    (d / "state").mkdir()  # rename over a non-empty directory fails
    (d / "state" / "x").write_text("")
    with pytest.raises(OSError):
        safeio.atomic_write(d / "state", "new")
    assert sorted(p.name for p in d.iterdir()) == ["state"]


def test_create_exclusive_refuses_a_planted_name(tmp_path: Path) -> None:
    target = tmp_path / "outside"
    target.write_text("keep")
    (tmp_path / "new").symlink_to(target)
    with pytest.raises(FileExistsError):
        safeio.create_exclusive(tmp_path / "new", "x")
    assert target.read_text() == "keep"
    safeio.create_exclusive(tmp_path / "fresh", "x")
    assert (tmp_path / "fresh").read_text() == "x"


def test_is_regular_and_remove(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("")
    link = tmp_path / "l"
    link.symlink_to(f)
    assert safeio.is_regular(f) and not safeio.is_regular(link) and not safeio.is_regular(tmp_path / "x")
    safeio.remove_file(link)
    safeio.remove_file(link)
    assert f.exists() and not link.is_symlink()


def test_file_mutex_never_truncates_through_a_planted_link(tmp_path: Path) -> None:
    """store.file_mutex writes its pid into the lock file: a link there must be refused, not followed."""
    from dsv4patch.errors import CacheError
    from dsv4patch.store import file_mutex

    victim = tmp_path / "victim"
    victim.write_text("precious")
    lock = tmp_path / "locks" / "x.lock"
    lock.parent.mkdir()
    lock.symlink_to(victim)
    with pytest.raises(CacheError, match="symbolic link"):
        with file_mutex(lock, "x", timeout=0):
            pass
    assert victim.read_text() == "precious"
    os.unlink(lock)
    os.mkfifo(lock)
    t = _watchdog()
    try:
        with pytest.raises(CacheError, match="FIFO"):
            with file_mutex(lock, "x", timeout=0):
                pass
    finally:
        t.cancel()


# --- issue 36: files being written are owned while their writer lives ------------------------------

_HOLDER = """
import sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from dsv4patch import safeio
fd, path = safeio.create_owned(Path({d!r}), "vllm-1.whl")
print(path, flush=True)
time.sleep(300)
"""


def _holder(tmp_path: Path):
    """A real process that owns a partial file in ``tmp_path`` until it is killed."""
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER.format(root=root, d=str(tmp_path))],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_partial_file_is_swept_only_once_its_writer_is_dead(tmp_path: Path) -> None:
    import signal

    proc, path = _holder(tmp_path)
    try:
        assert path.name.startswith(".vllm-1.whl.") and path.name.endswith(safeio.PARTIAL)
        assert safeio.owned_by_a_live_writer(path)
        assert safeio.sweep_owned(tmp_path) == [] and path.exists()  # its writer lives
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not safeio.owned_by_a_live_writer(path)
    assert safeio.sweep_owned(tmp_path) == [path] and not path.exists()


def test_replacing_writes_through_an_owned_partial_and_never_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = tmp_path / "out.whl"
    target.symlink_to(victim)
    with safeio.replacing(target) as fh:
        fh.write(b"new")
        partial = [p for p in tmp_path.iterdir() if p.name.endswith(safeio.PARTIAL)]
        assert len(partial) == 1 and safeio.owned_by_a_live_writer(partial[0])
    assert target.read_bytes() == b"new" and not target.is_symlink() and victim.read_text() == "precious"
    with pytest.raises(KeyboardInterrupt):  # an interrupt while writing: nothing is left
        with safeio.replacing(tmp_path / "other.whl") as fh:
            fh.write(b"half")
            raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.whl", "victim"]


def test_read_whole_is_one_buffer_within_the_limit_and_never_a_link(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(os.urandom(3 << 20))
    got = safeio.read_whole(big, 3 << 20)
    assert isinstance(got, mmap.mmap) and got[:] == big.read_bytes()  # large: its own mapping
    small = tmp_path / "small"
    small.write_bytes(b"x" * (safeio.MAPPED_FROM - 1))
    assert safeio.read_whole(small, safeio.MAPPED_FROM) == small.read_bytes()
    with pytest.raises(UnsafeFileError, match="more than"):
        safeio.read_whole(big, (3 << 20) - 1)
    link = tmp_path / "link"
    link.symlink_to(big)
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        safeio.read_whole(link, 4 << 20)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeFileError, match="not a regular file|FIFO"):
        safeio.read_whole(fifo, 4 << 20)


def test_a_file_whose_size_changed_while_it_was_mapped_is_read_again_the_plain_way(tmp_path: Path) -> None:
    """The mapping holds exactly the size fstat gave: a file found shorter or longer than that (it
    changed while it was read) gives no mapping, and read_whole reads it again within its limit."""
    data = os.urandom(3 << 20)
    big = tmp_path / "big"
    big.write_bytes(data)
    fd = os.open(big, os.O_RDONLY)
    try:
        assert safeio._read_mapped(fd, len(data) - 1) is None  # more than fstat said: it grew
        os.lseek(fd, 0, os.SEEK_SET)
        assert safeio._read_mapped(fd, len(data) + 1) is None  # less: it shrank
        os.lseek(fd, 0, os.SEEK_SET)
        whole = safeio._read_mapped(fd, len(data))
        assert whole is not None and whole[:] == data
    finally:
        os.close(fd)


def test_read_whole_falls_back_to_a_plain_read_where_no_mapping_can_be_made(tmp_path: Path, monkeypatch) -> None:
    """A platform or limit that refuses the anonymous mapping (ENOMEM, no MAP_ANONYMOUS) costs the
    mapping only: the file is read the plain way, never an error of its own."""
    data = os.urandom(3 << 20)
    big = tmp_path / "big"
    big.write_bytes(data)

    def refused(*_args: object, **_kw: object) -> mmap.mmap:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(safeio.mmap, "mmap", refused)
    got = safeio.read_whole(big, 4 << 20)
    assert isinstance(got, bytes) and got == data


def test_remove_partials_removes_only_this_runs_unfinished_partial_files(tmp_path: Path) -> None:
    """What ``main`` calls as a run exits: a partial file still under its partial name is removed (an
    interrupt between its creation and its writer's try left it); one renamed into place, one
    already removed and a new file that took a removed one's name stay untouched."""
    safeio._MADE.clear()
    fd1, left = safeio.create_owned(tmp_path, "left.whl")
    fd2, done = safeio.create_owned(tmp_path, "done.whl")
    os.replace(done, tmp_path / "done.whl")
    fd3, gone = safeio.create_owned(tmp_path, "gone.whl")
    os.unlink(gone)
    gone.write_bytes(b"someone else's file")  # the same name, another inode
    for fd in (fd1, fd2, fd3):
        os.close(fd)
    assert safeio.remove_partials() == [left]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["done.whl", gone.name])
    assert safeio.remove_partials() == []


@pytest.mark.parametrize("writer", ["atomic_write", "create_exclusive"])
def test_a_large_payload_is_handed_to_the_kernel_in_pieces_of_at_most_write_piece(tmp_path, monkeypatch, writer):
    # One write() of a large buffer makes the page cache take large folios, which a virtual machine
    # that reports free memory to its host must back anew (docs/benchmarks.md); the real os.write is
    # called, its sizes recorded.
    sizes: list[int] = []
    real_write = os.write

    def recording(fd: int, data) -> int:  # type: ignore[no-untyped-def]
        sizes.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(safeio.os, "write", recording)
    payload = os.urandom(2 * safeio.WRITE_PIECE + 12345)
    getattr(safeio, writer)(tmp_path / "big.bin", payload)
    assert (tmp_path / "big.bin").read_bytes() == payload
    assert max(sizes) <= safeio.WRITE_PIECE and len(sizes) >= 3


def test_read_beneath_follows_no_link_below_its_base(tmp_path: Path) -> None:
    """open_beneath / read_beneath: a file below ``base`` is read; a link as the file or as any directory
    below ``base``, or a path outside ``base``, is refused naming it (what series entries and variants are
    read through)."""
    base = tmp_path / "patches"
    (base / "sub").mkdir(parents=True)
    (base / "sub" / "a.patch").write_text("ok\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.patch").write_text("not reviewed\n")
    assert safeio.read_beneath(base, base / "sub" / "a.patch") == b"ok\n"
    (base / "link.patch").symlink_to(outside / "a.patch")
    (base / "linked").symlink_to(outside)
    for path, needle in ((base / "link.patch", "is a symbolic link"),
                         (base / "linked" / "a.patch", "linked is a symbolic link"),
                         (outside / "a.patch", f"is not below {base}"),
                         (base / ".." / "outside" / "a.patch", "is not below")):
        with pytest.raises(UnsafeFileError, match=needle):
            safeio.read_beneath(base, path)
    with pytest.raises(FileNotFoundError):
        safeio.read_beneath(base, base / "sub" / "gone.patch")
