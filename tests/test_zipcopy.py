"""zipcopy.py: members copied as stored, new members deflated the same way every time, and a member's
content never trusted past the size its headers declare.  Checked against Python's own zipfile and, where
installed, Info-ZIP's ``unzip -t``."""

from __future__ import annotations

import hashlib
import io
import shutil
import stat
import subprocess
import zipfile
import zlib
from pathlib import Path

import pytest

from dsv4patch import zipcopy
from dsv4patch.errors import BuildError, IntegrityError


def _source_zip(path: Path) -> dict[str, bytes]:
    """A zip made by zipfile itself: stored and deflated members, a directory, a non-ASCII name."""
    files = {"pkg/__init__.py": b"x = 1\n" * 1000, "pkg/data.bin": bytes(range(256)) * 9000,
             "pkg/\u00fcber.txt": "gr\u00fc\u00df\n".encode()}
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(zipfile.ZipInfo("pkg/"), b"")
        zf.writestr("pkg/__init__.py", files["pkg/__init__.py"], compress_type=zipfile.ZIP_DEFLATED)
        zf.writestr("pkg/data.bin", files["pkg/data.bin"], compress_type=zipfile.ZIP_STORED)
        zf.writestr("pkg/\u00fcber.txt", files["pkg/\u00fcber.txt"], compress_type=zipfile.ZIP_DEFLATED)
    return files


def test_members_copied_raw_read_back_identically_and_the_output_is_deterministic(tmp_path: Path) -> None:
    src = tmp_path / "src.zip"
    files = _source_zip(src)
    infos = zipcopy.open_members(src)
    with src.open("rb") as fh:
        raws = [zipcopy.read_raw(fh, info) for info in infos]
    new = zipcopy.deflate("pkg/new.py", b"print('new')\n")
    out = zipcopy.write(tmp_path / "out.zip", [*raws, new])
    again = zipcopy.write(tmp_path / "again.zip", [*raws, new])
    assert out.read_bytes() == again.read_bytes()
    with zipfile.ZipFile(out) as zf:
        assert zf.testzip() is None
        for name, data in files.items():
            assert zf.read(name) == data
        assert zf.read("pkg/new.py") == b"print('new')\n"
        by_name = {i.filename: i for i in zf.infolist()}
    for info in infos:  # copied as stored: same method, CRC, compressed size, date
        got = by_name[info.filename]
        assert (got.compress_type, got.CRC, got.compress_size, got.date_time) == \
            (info.compress_type, info.CRC, info.compress_size, info.date_time)
    assert by_name["pkg/new.py"].date_time == zipcopy.FIXED_DATE
    if shutil.which("unzip"):
        subprocess.run(["unzip", "-tq", str(out)], check=True, capture_output=True)


def test_digest_and_inflate_match_the_content(tmp_path: Path) -> None:
    data = bytes(range(256)) * 20000  # several 1 MiB pieces once inflated
    raw = zipcopy.deflate("big.bin", data)
    assert zipcopy.inflate(raw) == data
    assert zipcopy.digest(raw) == (hashlib.sha256(data).digest(), len(data))
    with pytest.raises(IntegrityError, match="more than the 1000 dsv4patch reads"):
        zipcopy.inflate(raw, limit=1000)


def _lying(raw: zipcopy.Raw, **changes: object) -> zipcopy.Raw:
    fields = {**raw.__dict__, **changes}
    return zipcopy.Raw(**fields)  # type: ignore[arg-type]


def test_a_member_that_inflates_past_its_declared_size_is_refused_early() -> None:
    bomb = zipcopy.deflate("bomb", b"\0" * (64 << 20))
    liar = _lying(bomb, size=10)
    pieces = zipcopy.chunks(liar)
    with pytest.raises(IntegrityError, match="inflates past the 10 bytes"):
        next(pieces)  # refused on the first 1 MiB piece, not after 64 MiB


@pytest.mark.parametrize(("change", "message"), [
    ({"crc": 1}, "CRC or size mismatch"),
    ({"size": 10**6}, "CRC or size mismatch"),
    ({"data": b"\xff\xff\xff"}, "not valid deflate data"),
    ({"data": zlib.compressobj(6, zlib.DEFLATED, -15).compress(b"a" * 100)}, "truncated"),
])
def test_a_damaged_member_is_an_integrity_error(change: dict[str, object], message: str) -> None:
    good = zipcopy.deflate("m", b"a" * 100)
    with pytest.raises(IntegrityError, match=message):
        zipcopy.inflate(_lying(good, **change))


def test_links_other_file_types_and_encryption_are_refused(tmp_path: Path) -> None:
    src = tmp_path / "odd.zip"
    with zipfile.ZipFile(src, "w") as zf:
        link = zipfile.ZipInfo("pkg/link")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(link, "/etc/passwd")
        fifo = zipfile.ZipInfo("pkg/fifo")
        fifo.external_attr = (stat.S_IFIFO | 0o644) << 16
        zf.writestr(fifo, "")
        zf.writestr("pkg/secret", "x")
    data = bytearray(src.read_bytes())  # zipfile never writes the encryption bit: set it in the directory
    at = data.rindex(b"PK\x01\x02")  # the last central entry is pkg/secret's
    assert data[at + 46:at + 56] == b"pkg/secret"
    data[at + 8] |= 0x1
    src.write_bytes(bytes(data))
    infos = {i.filename: i for i in zipcopy.open_members(src)}
    with src.open("rb") as fh:
        with pytest.raises(IntegrityError, match="symbolic link"):
            zipcopy.read_raw(fh, infos["pkg/link"])
        with pytest.raises(IntegrityError, match="not a regular file"):
            zipcopy.read_raw(fh, infos["pkg/fifo"])
        with pytest.raises(BuildError, match="encrypted"):
            zipcopy.read_raw(fh, infos["pkg/secret"])


def test_duplicate_members_and_unreadable_zips_are_build_errors(tmp_path: Path) -> None:
    one = zipcopy.deflate("a", b"1")
    with pytest.raises(BuildError, match="duplicate zip member"):
        zipcopy.write(tmp_path / "dup.zip", [one, one])
    bad = tmp_path / "not.zip"
    bad.write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(BuildError, match="not a readable zip"):
        zipcopy.open_members(bad)


def test_record_lists_rows_then_itself() -> None:
    rows = [zipcopy.record_row("a.py", b"x"), zipcopy.record_row("b,c.py", b"")]
    text = zipcopy.record(rows, "p-1.dist-info/RECORD").decode()
    assert text.splitlines()[-1] == "p-1.dist-info/RECORD,,"
    assert '"b,c.py"' in text  # csv-quoted: a comma in a name stays one field
    assert rows[0][2] == "1"


class _CountingFile(io.BytesIO):
    """An in-memory output that records the size of every write it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def write(self, data) -> int:  # type: ignore[no-untyped-def,override]
        self.sizes.append(len(memoryview(data)))
        return super().write(data)


def test_a_large_member_is_written_in_pieces_of_at_most_write_piece_and_reads_back_whole() -> None:
    # One write() of a whole large member makes the page cache take large folios, which a virtual
    # machine that reports free memory to its host must back anew (seconds of system time in a warm
    # `wheel`); the writer hands the kernel at most WRITE_PIECE at a time, with the same bytes.
    payload = bytes(range(256)) * (3 * zipcopy.WRITE_PIECE // 256 + 1000)  # 3 pieces and a bit
    raw = zipcopy.Raw("pkg/big.bin", payload, zipfile.ZIP_STORED, zlib.crc32(payload) & 0xFFFFFFFF,
                      len(payload), zipcopy.FIXED_DATE, (0o100644) << 16)
    out = _CountingFile()
    writer = zipcopy.Writer(out)
    writer.add(raw)
    writer.close()
    assert max(out.sizes) == zipcopy.WRITE_PIECE and sum(s == zipcopy.WRITE_PIECE for s in out.sizes) == 3
    with zipfile.ZipFile(io.BytesIO(out.getvalue())) as zf:
        assert zf.read("pkg/big.bin") == payload and zf.testzip() is None
