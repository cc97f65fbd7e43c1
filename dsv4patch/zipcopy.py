"""The one wheel writer: deterministic zips, copied member by member where unchanged.

Both wheels dsv4patch makes are written here: the kernel plugin wheel
(:func:`write`, from :mod:`dsv4patch.kernels.build`) and the patched vLLM
wheel (:class:`Writer` fed by the repacker, :mod:`dsv4patch.delivery.vllm_wheel`); their
``RECORD`` files come from :func:`record`.

The stock vLLM wheel is about 300 MB of compressed shared libraries; the
patched wheel differs from it in a few Python files and its metadata.
Python's :mod:`zipfile` can only write members it compresses itself, which
would inflate and deflate all of it (minutes on a small CI machine, and the
output would then depend on the local zlib).  This module reads a member's
raw compressed bytes from the source archive and writes them, with the
source's CRC, sizes, timestamp and attributes, into a new archive; new or
changed members are deflated here with fixed settings.  The writer emits no
timestamps of its own and no extra fields, so the same inputs always give
the same bytes.

Only what wheels need is supported: stored or deflated members, no
encryption, no archive above 4 GiB or 65535 members (no ZIP64); anything
else is refused, never written wrongly.

A member's content is never trusted to be the size its headers declare: it
is inflated piece by piece (:func:`chunks`) and refused the moment it goes
past that size, so a small wheel whose member inflates to gigabytes costs a
megabyte of memory, not the gigabytes (issue 29).  A member inflated whole
into memory (a file the series changes, RECORD, METADATA) must declare at
most :data:`INFLATE_LIMIT`.  Symlink members are refused (:func:`read_raw`).
"""

from __future__ import annotations

import csv
import hashlib
import io
import stat
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from dsv4patch import safeio
from dsv4patch.errors import BuildError, IntegrityError
from dsv4patch.hashing import record_hash
from dsv4patch.records import frozen

_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_END = struct.Struct("<4sHHHHIIH")
_LIMIT = 0xFFFFFFFF
ARCHIVE_LIMIT = _LIMIT  # the largest archive without ZIP64: the most read of a wheel whose size is not locked
FIXED_DATE = (1980, 1, 1, 0, 0, 0)
INFLATE_LIMIT = 256 << 20  # the most a member read whole into memory may declare (docs/trust.md)
_PIECE = 1 << 20
# The most one write() of a member's bytes hands the kernel (safeio.WRITE_PIECE says why): the stock
# wheel's shared libraries are up to ~100 MB compressed, and one call for each cost a warm `wheel`
# 1.6-2.3 s of system time in one run of two.
WRITE_PIECE = safeio.WRITE_PIECE


@frozen
class Raw:
    """One member as stored: compressed bytes plus what the headers say about them."""

    name: str
    data: bytes | memoryview  # compressed (a view of an archive read whole: :func:`raw_in`)
    method: int
    crc: int
    size: int
    date_time: tuple[int, int, int, int, int, int]
    external_attr: int


def read_raw(fh: BinaryIO, info: zipfile.ZipInfo) -> Raw:
    """The raw member ``info`` of the archive open as ``fh`` (validated, not inflated)."""

    def read_at(offset: int, n: int) -> bytes:
        fh.seek(offset)
        return fh.read(n)

    return _raw(info, read_at)


def raw_in(archive: memoryview, info: zipfile.ZipInfo) -> Raw:
    """:func:`read_raw` from an archive already in memory: the member's bytes are a view of
    ``archive`` (no copy; the very bytes that were read, and hashed, once)."""
    return _raw(info, lambda offset, n: archive[offset:offset + n])


def _raw(info: zipfile.ZipInfo, read_at: Callable[[int, int], bytes | memoryview]) -> Raw:
    """The member ``info`` checked (:func:`_check_member`, its local header) and its stored bytes,
    ``read_at(offset, n)`` giving at most ``n`` bytes of the archive from ``offset``."""
    _check_member(info)
    head = read_at(info.header_offset, _LOCAL.size)
    fields = _LOCAL.unpack(head) if len(head) == _LOCAL.size else (b"",) * 11
    if fields[0] != b"PK\x03\x04":
        raise BuildError(f"{info.filename}: bad local header in the zip")
    data = read_at(info.header_offset + _LOCAL.size + fields[9] + fields[10], info.compress_size)
    if len(data) != info.compress_size:
        raise BuildError(f"{info.filename}: the zip is truncated")
    return Raw(info.filename, data, info.compress_type, info.CRC, info.file_size,
               info.date_time, info.external_attr)


def _check_member(info: zipfile.ZipInfo) -> None:
    """A member dsv4patch copies: not encrypted, stored or deflated, a regular file or a directory."""
    if info.flag_bits & 0x1:
        raise BuildError(f"{info.filename}: encrypted zip members are not supported")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise BuildError(f"{info.filename}: compression method {info.compress_type} is not supported")
    kind = stat.S_IFMT(info.external_attr >> 16)
    if kind not in (0, stat.S_IFREG) and not (kind == stat.S_IFDIR and info.filename.endswith("/")):
        what = "a symbolic link" if kind == stat.S_IFLNK else f"not a regular file (mode {kind:o})"
        raise IntegrityError(f"{info.filename}: the zip member is {what}; refused (an installer "
                             "would create it where it points)")


def deflate(name: str, data: bytes, mode: int = 0o644,
            date_time: tuple[int, int, int, int, int, int] = FIXED_DATE) -> Raw:
    """A new member: ``data`` deflated with fixed settings (same bytes in, same bytes out)."""
    comp = zlib.compressobj(6, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY)
    packed = comp.compress(data) + comp.flush()
    return Raw(name, packed, zipfile.ZIP_DEFLATED, zlib.crc32(data) & 0xFFFFFFFF, len(data),
               date_time, (0o100000 | mode) << 16)


def deflate_reusing(name: str, data: bytes, stored: Path, mode: int = 0o644) -> Raw:
    """:func:`deflate`, reusing the deflated bytes kept at ``stored`` (a cache file) when they inflate
    to exactly ``data``; else deflated here and kept there for the next time.

    Deflating the kernel library takes about a second, inflating it a small part of that: a warm
    kernel wheel reuses the stream.  What is reused is checked, never trusted: read without
    following a link and within deflate's bound for ``data``, inflated (at most one byte past
    ``data``'s size), compared byte for byte, one whole deflate stream with nothing after it; the
    member written is made of those very bytes.  A cache that cannot be written only loses the copy.
    """
    crc = zlib.crc32(data) & 0xFFFFFFFF
    try:
        packed = safeio.read_bytes(stored, len(data) + (len(data) >> 8) + 1024, error=IntegrityError)
        d = zlib.decompressobj(-15)
        if (d.decompress(packed, len(data) + 1) == data and d.eof and not d.unused_data
                and not d.unconsumed_tail):
            return Raw(name, packed, zipfile.ZIP_DEFLATED, crc, len(data), FIXED_DATE, (0o100000 | mode) << 16)
    except (OSError, IntegrityError, zlib.error):
        pass  # absent, a link, too long, not one whole stream of this content: made again
    raw = deflate(name, data, mode)
    try:
        safeio.atomic_write(stored, bytes(raw.data), durable=False)
    except OSError:
        pass
    return raw


class _Tally:
    """Size and CRC of a member's content as it comes: past the declared size is refused at once."""

    def __init__(self, raw: Raw) -> None:
        self.raw = raw
        self.got = 0
        self.crc = 0

    def count(self, piece: bytes) -> bytes:
        self.got += len(piece)
        if self.got > self.raw.size:
            raise IntegrityError(f"{self.raw.name}: the zip member inflates past the {self.raw.size} bytes its "
                                 "header declares; refused")
        self.crc = zlib.crc32(piece, self.crc)
        return piece

    def check(self) -> None:
        if self.got != self.raw.size or self.crc & 0xFFFFFFFF != self.raw.crc:
            raise IntegrityError(f"{self.raw.name}: CRC or size mismatch in the zip")


def chunks(raw: Raw) -> Iterator[bytes]:
    """The member's content piece by piece (1 MiB), never past its declared size, CRC-checked at the end.

    IntegrityError the moment the content goes past ``raw.size``, or when it
    ends short of it, is not a complete deflate stream, or fails its CRC.
    """
    tally = _Tally(raw)
    for piece in _stored(raw) if raw.method == zipfile.ZIP_STORED else _inflated(raw):
        yield tally.count(piece)
    tally.check()


def _stored(raw: Raw) -> Iterator[bytes]:
    """A stored member's bytes in pieces (counted as they go, like inflated ones)."""
    for i in range(0, len(raw.data), _PIECE):
        yield bytes(raw.data[i:i + _PIECE])


def _inflated(raw: Raw) -> Iterator[bytes]:
    """Raw deflate, never more than 1 MiB out per call; a stream that ends early is refused."""
    d = zlib.decompressobj(-15)
    pos = 0
    feed: bytes | memoryview
    try:
        while not d.eof:
            if d.unconsumed_tail:
                feed = d.unconsumed_tail
            elif pos < len(raw.data):
                feed, pos = raw.data[pos:pos + _PIECE], pos + _PIECE
            else:
                feed = b""
            piece = d.decompress(feed, _PIECE)  # never more than 1 MiB out per call
            if piece:
                yield piece
            elif not feed:
                break
    except zlib.error as exc:
        raise IntegrityError(f"{raw.name}: the zip member is not valid deflate data ({exc})") from None
    if not d.eof:
        raise IntegrityError(f"{raw.name}: the zip member's deflate data is truncated")


def inflate(raw: Raw, limit: int = INFLATE_LIMIT) -> bytes:
    """The member's content, CRC-checked; at most ``limit`` bytes (the declared size is checked first)."""
    if raw.size > limit:
        raise IntegrityError(f"{raw.name}: the zip member declares {raw.size} bytes, more than the "
                             f"{limit} dsv4patch reads into memory; refused")
    return b"".join(chunks(raw))


def digest(raw: Raw, algorithm: str = "sha256") -> tuple[bytes, int]:
    """(hash digest, size) of the member's content, inflated piece by piece (bounded memory)."""
    h = hashlib.new(algorithm)
    size = 0
    for piece in chunks(raw):
        h.update(piece)
        size += len(piece)
    return h.digest(), size


def _dos(dt: tuple[int, int, int, int, int, int]) -> tuple[int, int]:
    y, mo, d, h, mi, s = dt
    return (h << 11) | (mi << 5) | (s // 2), ((max(y, 1980) - 1980) << 9) | (mo << 5) | d


class Writer:
    """Writes :class:`Raw` members in the order given, then the central directory."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.central: list[bytes] = []
        self.names: set[str] = set()

    def add(self, raw: Raw) -> None:
        if raw.name in self.names:
            raise BuildError(f"{raw.name}: duplicate zip member")
        self.names.add(raw.name)
        offset = self.fh.tell()
        if offset > _LIMIT or len(raw.data) > _LIMIT or raw.size > _LIMIT:
            raise BuildError(f"{raw.name}: the wheel would need ZIP64 (over 4 GiB), not supported")
        name = raw.name.encode("utf-8")
        flags = 0x800 if not raw.name.isascii() else 0
        time, date = _dos(raw.date_time)
        self.fh.write(_LOCAL.pack(b"PK\x03\x04", 20, flags, raw.method, time, date, raw.crc,
                                  len(raw.data), raw.size, len(name), 0))
        self.fh.write(name)
        data = memoryview(raw.data)
        for start in range(0, len(data), WRITE_PIECE):
            self.fh.write(data[start:start + WRITE_PIECE])
        self.central.append(_CENTRAL.pack(
            b"PK\x01\x02", (3 << 8) | 20, 20, flags, raw.method, time, date, raw.crc,
            len(raw.data), raw.size, len(name), 0, 0, 0, 0, raw.external_attr, offset) + name)

    def close(self) -> None:
        if len(self.central) > 0xFFFF:
            raise BuildError("the wheel would have more than 65535 members (ZIP64), not supported")
        start = self.fh.tell()
        for entry in self.central:
            self.fh.write(entry)
        size = self.fh.tell() - start
        if start > _LIMIT:
            raise BuildError("the wheel would need ZIP64 (over 4 GiB), not supported")
        n = len(self.central)
        self.fh.write(_END.pack(b"PK\x05\x06", 0, 0, n, n, size, start, 0))


def open_members(path: Path | BinaryIO, label: str = "") -> list[zipfile.ZipInfo]:
    """The members of the zip ``path`` (a file, or the bytes of one already read)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return zf.infolist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise BuildError(f"{label or path}: not a readable zip ({exc})") from None


def record_row(name: str, data: bytes) -> tuple[str, str, str]:
    """The RECORD row of member ``name`` with content ``data``."""
    return name, record_hash(data), str(len(data))


def record(rows: Iterable[tuple[str, str, str]], record_name: str) -> bytes:
    """A wheel's RECORD: ``rows`` in order, then the RECORD's own row (no hash, no size)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    for row in rows:
        w.writerow(row)
    w.writerow((record_name, "", ""))
    return out.getvalue().encode()


def write(path: Path, members: Iterable[Raw], *, final: bool = False) -> Path:
    """Write ``members`` in order as the zip ``path`` (atomically: an owned partial file, then renamed;
    :func:`dsv4patch.safeio.replacing`, ``final`` as there)."""
    safeio.sweep_owned(path.parent)  # partial files of runs that were killed
    with safeio.replacing(path, final=final) as fh:
        writer = Writer(fh)
        for raw in members:
            writer.add(raw)
        writer.close()
    return path
