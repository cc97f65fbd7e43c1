"""Reading and writing files an attacker may have planted: no links, no FIFOs, no unbounded reads.

A state file in a tree's ``.git`` (the tree lock, the apply journal, the
resolve and port states), the lock, a series or patch file, a file of an
installed vLLM, a wheel member or an index page is input dsv4patch does not
trust (docs/trust.md).  Opening one
with ``open()`` follows a planted symlink (a write then truncates whatever it
points at), blocks forever on a FIFO, and ``read()`` takes a 3 GiB sparse
file or ``/dev/zero`` into memory.  Every such open and read goes through
here instead:

* :func:`open_regular` opens with ``O_NOFOLLOW | O_NONBLOCK`` (a symlink as the
  last component is refused, a FIFO never blocks), then ``fstat``: anything
  but a regular file is refused;
* :func:`read_bytes` / :func:`read_text` read at most ``limit`` bytes and
  refuse a file past it; :func:`read_stream` does the same for a stream;
* :func:`loads_json` / :func:`read_json` parse JSON under a size and a nesting
  cap (100,000 nested arrays are an error, not a crash);
* :func:`atomic_write` writes a file in a directory through a temporary file
  created ``O_EXCL | O_NOFOLLOW``, fsyncs it and renames it over the name (a
  planted link at the name is replaced, never written through).

Each refusal is an :class:`UnsafeFileError` naming the path, or the error
class the caller passes as ``error`` (``TreeError`` for a tree's state files,
``FetchError`` for downloads...), so the exit code is the caller's to choose.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, Protocol

from dsv4patch.errors import EXIT_INPUT, Dsv4Error

# Default caps (docs/trust.md "Bounds").
STATE_LIMIT = 16 << 20  # a state file / journal / small JSON file: 16 MiB
JSON_DEPTH = 64  # nesting of any JSON dsv4patch reads (its own files nest < 6)


class UnsafeFileError(Dsv4Error):
    """A file that is a link, a FIFO, a device, a directory, too large, or not what it should be."""

    exit_code = EXIT_INPUT
    kind = "unsafe-file"


def token() -> str:
    """12 random hex digits for a temporary name: ``secrets.token_hex(6)`` is ``os.urandom(6).hex()``;
    taken from ``os`` directly, a run that writes a file does not import ``secrets`` (and ``random``,
    ``hmac``, ``base64`` with it) at start-up (issue 39)."""
    return os.urandom(6).hex()


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def open_regular(
    path: Path | str, flags: int = os.O_RDONLY, mode: int = 0o644, *,
    error: type[Dsv4Error] = UnsafeFileError, what: str = "", dir_fd: int | None = None,
    follow: bool = False, advice: str = "remove it",
) -> int:
    """A file descriptor on ``path``, a regular file; never follows a final symlink, never blocks.

    ``flags`` may add ``O_RDWR`` / ``O_WRONLY`` / ``O_CREAT`` / ``O_TRUNC`` ...
    (``O_TRUNC`` is applied only after the file is known to be regular).  A
    missing file raises ``FileNotFoundError`` as ``os.open`` does (the caller
    decides what absence means); a symlink, FIFO, device, directory or socket
    raises ``error`` naming the path.  The descriptor is returned blocking.
    ``follow``: a final symlink is followed (files of an environment the user
    named, which may be links); what it reaches must still be a regular file.  ``advice`` ends the
    message of a refusal (what the user does about it).
    """
    label = what or str(path)
    trunc = flags & os.O_TRUNC
    open_flags = ((flags & ~os.O_TRUNC) | (0 if follow else os.O_NOFOLLOW) | os.O_NONBLOCK | os.O_CLOEXEC
                  | os.O_NOCTTY)
    try:
        fd = os.open(path, open_flags, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise error(f"{label} is a symbolic link; refusing to follow it "
                        f"({advice}, dsv4patch never opens a planted link)") from None
        if exc.errno in (errno.ENXIO, errno.EISDIR, errno.ENODEV, errno.EOPNOTSUPP):
            try:
                kind = _kind(os.lstat(path, dir_fd=dir_fd).st_mode)
            except OSError:
                kind = "not a regular file"
            raise error(f"{label} is {kind}, not a regular file; {advice}") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{label} is {_kind(st.st_mode)}, not a regular file; {advice}")
        os.set_blocking(fd, True)
        if trunc:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_beneath(base: Path | str, path: Path | str, *, error: type[Dsv4Error] = UnsafeFileError,
                 what: str = "", advice: str = "remove it") -> int:
    """:func:`open_regular` for a file that must lie below the directory ``base``: ``path`` (absolute, or
    relative to the working directory) is taken relative to ``base`` lexically, and every component
    below ``base`` is opened without following a link (``O_NOFOLLOW``, directory by directory through
    ``dir_fd``): a link anywhere below ``base``, as a directory or as the file, is ``error``; so is a
    ``path`` outside ``base``.  ``base`` itself is opened as it is: the caller names it."""
    label = what or str(path)
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(base))
    parts = Path(rel).parts
    if not parts or rel == os.curdir or parts[0] == os.pardir:
        raise error(f"{label} is not below {base}; refused ({advice})")
    dfd = _open_dir(base)
    try:
        walked = Path(base)
        for part in parts[:-1]:
            walked = walked / part
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    with contextlib.suppress(OSError):
                        if stat.S_ISLNK(os.lstat(part, dir_fd=dfd).st_mode):
                            raise error(f"{label}: {walked} is a symbolic link; refusing to follow it "
                                        f"({advice}, dsv4patch never opens a planted link)") from None
                raise
            os.close(dfd)
            dfd = nfd
        return open_regular(parts[-1], error=error, what=label, dir_fd=dfd, advice=advice)
    finally:
        os.close(dfd)


def read_beneath(base: Path | str, path: Path | str, limit: int = STATE_LIMIT, *,
                 error: type[Dsv4Error] = UnsafeFileError, what: str = "", advice: str = "remove it") -> bytes:
    """:func:`read_bytes` of a file below ``base`` (:func:`open_beneath`: no link anywhere below ``base``)."""
    fd = open_beneath(base, path, error=error, what=what, advice=advice)
    try:
        return read_fd(fd, limit, label=what or str(path), error=error)
    finally:
        os.close(fd)


def read_fd(fd: int, limit: int, *, label: str, error: type[Dsv4Error] = UnsafeFileError) -> bytes:
    """At most ``limit`` bytes from ``fd`` (read from its current offset); more is ``error``."""
    return _read_bounded(lambda n: os.read(fd, n), limit, label, error)


def chunks(fd: int, limit: int, *, label: str, error: type[Dsv4Error] = UnsafeFileError) -> Iterator[bytes]:
    """``fd``'s bytes from its offset, 1 MiB at a time, never more than ``limit`` in all: a file longer
    than ``limit`` (or one that grows past it while it is read) is ``error`` once ``limit`` + 1 bytes
    were read.  For a file too large to hold (a seeded sdist) that is hashed or copied as it is read."""
    got = 0
    while True:
        chunk = os.read(fd, min(1 << 20, limit + 1 - got))
        if not chunk:
            return
        got += len(chunk)
        if got > limit:
            raise error(f"{label} is larger than {limit} bytes, the most dsv4patch reads from it; refused")
        yield chunk


def _read_bounded(read: Callable[[int], bytes], limit: int, label: str, error: type[Dsv4Error]) -> bytes:
    """Calls ``read(n)`` until it returns b"", asking for at most one byte past ``limit`` in all;
    more than ``limit`` bytes is ``error``."""
    chunks: list[bytes] = []
    got = 0
    while True:
        chunk = read(min(1 << 20, limit + 1 - got))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        got += len(chunk)
        if got > limit:
            raise error(f"{label} is larger than {limit} bytes, the most dsv4patch reads from it; refused")


def read_bytes(path: Path | str, limit: int = STATE_LIMIT, *, error: type[Dsv4Error] = UnsafeFileError,
               what: str = "", follow: bool = False, advice: str = "remove it") -> bytes:
    """The content of the regular file ``path`` (no link, no FIFO), at most ``limit`` bytes."""
    fd = open_regular(path, error=error, what=what, follow=follow, advice=advice)
    try:
        return read_fd(fd, limit, label=what or str(path), error=error)
    finally:
        os.close(fd)


MAPPED_FROM = 2 << 20  # read_whole reads a file this large or larger into an anonymous mapping of its own
# The most one write() hands the kernel.  One call with a large buffer makes the page cache take large
# folios, blocks of 2 MiB and up; in a virtual machine that reports free memory to its host those are the
# blocks the host no longer backs, and filling them cost a warm `wheel` 1.6-2.3 s of system time in one
# run of two (docs/benchmarks.md).  Pieces of 1 MiB cost the same every run.  Every writer here and
# zipcopy's use it.
WRITE_PIECE = 1 << 20


def _write_all(fd: int, payload: bytes) -> None:
    """All of ``payload`` to ``fd``, at most :data:`WRITE_PIECE` per ``write()``."""
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view[:WRITE_PIECE]):]


def read_whole(path: Path | str, limit: int, *, error: type[Dsv4Error] = UnsafeFileError,
               what: str = "") -> bytes | mmap.mmap:
    """:func:`read_bytes` for a large file: the regular file ``path`` (no link, no FIFO), at most ``limit``
    bytes, read into one buffer of the size it has (no joining of pieces: one copy in memory, not two);
    a file larger than ``limit``, or one that grows past it while it is read, is ``error``.

    A file of :data:`MAPPED_FROM` bytes or more is read into a private anonymous mapping of exactly
    its size (no buffer of size + 1 to trim, no second copy).  It is a copy like the other (the
    file changing afterwards changes nothing in it) and nothing writes to it after the read; a
    file that changed size while it was read is read again the plain way.  No huge pages are
    advised: in a virtual machine that hands free memory back to its host (free page reporting
    reports free blocks of 2 MiB and up), every huge page is one the host must back anew, and a
    read of the stock wheel took 2.1 s of system time instead of 0.3 s after a minute idle (docs/benchmarks.md)."""
    label = what or str(path)
    fd = open_regular(path, error=error, what=what)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise error(f"{label} is {size} bytes, more than the {limit} dsv4patch reads from it; refused")
        if size >= MAPPED_FROM:
            mapped = _read_mapped(fd, size)
            if mapped is not None:
                return mapped
            os.lseek(fd, 0, os.SEEK_SET)
        first = os.read(fd, size + 1)  # the whole file in one buffer (Linux reads up to 2 GiB at once)
        if len(first) > limit:
            raise error(f"{label} is larger than {limit} bytes, the most dsv4patch reads from it; refused")
        rest = _read_bounded(lambda n: os.read(fd, n), limit - len(first), label, error)
        return first + rest if rest else first
    finally:
        os.close(fd)


def _read_mapped(fd: int, size: int) -> mmap.mmap | None:
    """Exactly ``size`` bytes of ``fd`` in a fresh anonymous mapping; None when the file turned out
    shorter or longer than ``size``, or when no such mapping can be made here (the plain read then
    takes its place)."""
    try:
        buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError, AttributeError):
        return None
    view = memoryview(buf)
    try:
        got = 0
        while got < size:
            n = os.readv(fd, [view[got:]])
            if n == 0:
                break
            got += n
        whole = got == size and os.read(fd, 1) == b""
    finally:
        view.release()
    if not whole:
        buf.close()
        return None
    return buf


def read_text(path: Path | str, limit: int = STATE_LIMIT, *, error: type[Dsv4Error] = UnsafeFileError,
              what: str = "") -> str:
    """:func:`read_bytes` decoded as UTF-8; a file that is not UTF-8 is ``error``."""
    data = read_bytes(path, limit, error=error, what=what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what or path} is not UTF-8 (byte {exc.start}); refused") from None


class _Readable(Protocol):
    def read(self, n: int = ..., /) -> bytes: ...


def read_stream(stream: _Readable | BinaryIO, limit: int, *, label: str,
                error: type[Dsv4Error] = UnsafeFileError) -> bytes:
    """At most ``limit`` bytes from a stream (a response, a zip member); more is ``error``."""
    return _read_bounded(stream.read, limit, label, error)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_depth_ok(value: Any, max_depth: int) -> bool:
    """Is ``value`` nested at most ``max_depth`` arrays/objects deep? (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth > max_depth:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((c, depth + 1) for c in children if isinstance(c, (list, dict)))
    return True


def loads_json(data: bytes | str, *, label: str, limit: int = STATE_LIMIT, max_depth: int = JSON_DEPTH,
               error: type[Dsv4Error] = UnsafeFileError) -> Any:
    """Parse JSON of at most ``limit`` bytes nested at most ``max_depth`` deep; anything else is ``error``.

    ``NaN`` / ``Infinity`` are refused (not JSON); so are numbers Python will
    not convert (over 4,300 digits) and nesting deep enough to exhaust the
    parser's recursion (the cap is checked after parsing, iteratively).
    """
    if len(data) > limit:
        raise error(f"{label} is larger than {limit} bytes, the most dsv4patch reads from it; refused")
    try:
        value = json.loads(data, parse_constant=_refuse_constant)
    except RecursionError:
        raise error(f"{label} is nested deeper than {max_depth} levels; refused") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(f"{label} is not valid JSON ({exc}); refused") from None
    if not json_depth_ok(value, max_depth):
        raise error(f"{label} is nested deeper than {max_depth} levels; refused")
    return value


def read_json(path: Path | str, limit: int = STATE_LIMIT, *, max_depth: int = JSON_DEPTH,
              error: type[Dsv4Error] = UnsafeFileError, what: str = "") -> Any:
    """:func:`read_bytes` then :func:`loads_json` (a regular file, bounded, shallow JSON)."""
    label = what or str(path)
    return loads_json(read_bytes(path, limit, error=error, what=what), label=label, limit=limit,
                      max_depth=max_depth, error=error)


def _open_dir(directory: Path | str) -> int:
    return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def atomic_write(path: Path | str, data: bytes | str, mode: int = 0o644, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically; a link planted at ``path`` is replaced, not followed.

    The temporary file ``.<name>.<random>.dsv4patch-tmp`` is created in the
    same directory with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (it cannot be a
    planted name), written, fsynced (``durable``), then renamed over
    ``path``: a reader sees the old file or the new one, never half of it.
    OSErrors (a full or read-only disk) propagate for ``errors.writing``.
    """
    p = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    dfd = _open_dir(p.parent)
    try:
        tmp = f".{p.name}.{token()}.dsv4patch-tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                     dir_fd=dfd)
        try:
            try:
                _write_all(fd, payload)
                os.fchmod(fd, mode)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, p.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
        if durable:
            try:
                os.fsync(dfd)
            except OSError:
                pass
    finally:
        os.close(dfd)


def create_exclusive(path: Path | str, data: bytes | str, mode: int = 0o644) -> None:
    """Write a new file at ``path`` that must not exist (``O_EXCL | O_NOFOLLOW``: no planted name)."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        _write_all(fd, payload)
    finally:
        os.close(fd)


class InTheWay(NamedTuple):
    """What stands where a directory is to be: ``path`` is ``what`` (``a file, not a directory``, or
    ``not a directory``: a link to none, a FIFO...); ``itself``: it is the directory's own path, not a
    parent of it."""

    path: Path
    what: str
    itself: bool


def in_the_way(directory: Path | str) -> InTheWay | None:
    """What stops ``directory`` from being made or used as one: the first of it and its parents that
    exists and is not a directory; None when nothing does.  Names only: nothing is opened or created."""
    path = Path(os.path.abspath(directory))
    for p in (path, *path.parents):
        if os.path.lexists(p) and not p.is_dir():
            return InTheWay(p, "a file, not a directory" if p.is_file() else "not a directory", p == path)
    return None


def is_regular(path: Path | str) -> bool:
    """Is ``path`` itself (not what a link points at) a regular file?"""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def remove_file(path: Path | str) -> None:
    """Remove ``path`` if it is there, link or file (a link is removed, its target untouched)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# ---------------------------------------------------------------------------
# Files being written: owned while their writer lives, swept when it died.

PARTIAL = ".dsv4patch-partial"  # suffix of a file being written (renamed over its name when complete)
_NEW = ".dsv4patch-new"  # the name it is created under, before it is locked (never swept young)
STALE_AGE = 3600.0  # seconds after which an unlocked ``-new`` file (a writer killed in the microseconds
#                     between creating and locking it) or an unowned legacy temporary is swept


def _mutex_fd(fd: int) -> bool:
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def create_owned(directory: Path | str, stem: str, suffix: str = PARTIAL, mode: int = 0o644) -> tuple[int, Path]:
    """A new file ``<directory>/.<stem>.<random><suffix>``, flocked for as long as ``fd`` is open.

    Created ``O_EXCL | O_NOFOLLOW`` under a ``-new`` name, locked, then renamed to
    its final temporary name, so :func:`sweep_owned` never takes a file whose
    writer is alive: the lock ends only with the writer (even killed with SIGKILL).
    """
    d = Path(directory)
    mark = token()
    new = d / f".{stem}.{mark}{_NEW}"
    path = d / f".{stem}.{mark}{suffix}"
    fd = os.open(new, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        st = os.fstat(fd)
        _MADE.append((str(path), st.st_dev, st.st_ino))  # before the rename: remove_partials finds it
        if not _mutex_fd(fd):  # nobody else has this random name: cannot happen
            raise OSError(errno.EAGAIN, f"cannot lock {new}")
        os.rename(new, path)
    except BaseException:
        os.close(fd)
        for p in (new, path):
            with contextlib.suppress(OSError):
                os.unlink(p)
        raise
    return fd, path


# The partial files this process made (path, device, inode): what :func:`remove_partials` checks.
_MADE: list[tuple[str, int, int]] = []


def remove_partials() -> list[Path]:
    """Remove the partial files this process made that are still there under their partial name (never
    renamed into place nor removed: an interrupt landed between their creation and the ``try`` that
    removes them); the removed paths.  Called by ``main`` as the run exits."""
    removed: list[Path] = []
    while _MADE:
        name, dev, ino = _MADE.pop()
        try:
            st = os.lstat(name)
        except OSError:
            continue  # renamed into place, or removed
        if (st.st_dev, st.st_ino) == (dev, ino) and stat.S_ISREG(st.st_mode):  # ours, not a later file
            with contextlib.suppress(OSError):
                os.unlink(name)
                removed.append(Path(name))
    return removed


def owned_by_a_live_writer(path: Path | str) -> bool:
    """Is the file ``path`` (or a directory's ``.owner`` file) flocked by a live process?"""
    p = Path(path)
    target = p / ".owner" if p.is_dir() and not p.is_symlink() else p
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if _mutex_fd(fd):
            return False
        return True
    finally:
        os.close(fd)  # releases a lock taken just to look


def sweep_owned(directory: Path | str, *, suffix: str = PARTIAL) -> list[Path]:
    """Remove the files ``.<stem>.<random><suffix>`` in ``directory`` whose writer died; the removed paths.

    A file whose lock is free was left by a killed run (its writer held the lock
    until it died); a ``-new`` file older than :data:`STALE_AGE` too.
    """
    import time

    d = Path(directory)
    removed: list[Path] = []
    try:
        names = os.listdir(d)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        if not name.startswith("."):
            continue
        p = d / name
        if name.endswith(suffix):
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and not owned_by_a_live_writer(p):
                remove_file(p)
                removed.append(p)
        elif name.endswith(_NEW):
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if now - st.st_mtime > STALE_AGE and not owned_by_a_live_writer(p):
                remove_file(p)
                removed.append(p)
    return removed


@contextlib.contextmanager
def replacing(path: Path | str, mode: int = 0o644, *, final: bool = False) -> Iterator[BinaryIO]:
    """Write ``path`` through an owned partial file next to it (:func:`create_owned`).

    On success the partial file is renamed over ``path`` (a link planted at
    ``path`` is replaced, never written through); on any exception, an
    interrupt included, it is removed; if the process is killed, the next
    :func:`sweep_owned` of the directory removes it.  ``final``: ``path`` is the
    run's result (a wheel in ``--out``): renamed inside
    :func:`dsv4patch.childproc.finishing`, so an interrupt that comes once it is
    in place no longer ends the run, which reports it.
    """
    p = Path(path)
    fd, tmp = create_owned(p.parent, p.name, mode=mode)
    try:
        fh = os.fdopen(fd, "w+b")
    except BaseException:
        os.close(fd)
        remove_file(tmp)
        raise
    try:
        yield fh
        fh.flush()
        if final:  # the run's result: once in place, an interrupt no longer ends the run
            from dsv4patch import childproc

            with childproc.finishing():
                os.replace(tmp, p)
        else:
            os.replace(tmp, p)
    finally:
        fh.close()  # releases the lock
        remove_file(tmp)  # gone already when it was renamed
