"""hashing.py: the sha256 forms dsv4patch writes (hex, file in chunks, wheel RECORD), checked
against independent computations (hashlib, and the RECORD text pip's installer reads)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from pathlib import Path

from dsv4patch import hashing, zipcopy


def test_hash_file_reads_in_chunks_and_matches_the_bytes(tmp_path: Path) -> None:
    data = bytes(range(256)) * (3 * hashing.CHUNK // 256 + 7)  # spans several chunks, not a multiple
    f = tmp_path / "blob"
    f.write_bytes(data)
    assert hashing.hash_file(f) == hashing.sha256(data) == hashlib.sha256(data).hexdigest()
    f.write_bytes(data[:-1] + b"\x00")
    assert hashing.hash_file(f) != hashing.sha256(data)


def test_record_hash_is_the_wheel_spec_form() -> None:
    data = b"print('hi')\n"
    digest = hashlib.sha256(data).digest()
    assert hashing.record_hash(data) == "sha256=" + base64.urlsafe_b64encode(digest).decode().rstrip("=")
    assert "=" not in hashing.record_hash(data)[len("sha256="):]
    assert hashing.record_b64(digest) == hashing.record_hash(data)[len("sha256="):]


def test_one_writer_gives_a_wheel_whose_record_lists_every_member(tmp_path: Path) -> None:
    files = {"pkg/__init__.py": b"x = 1\n", "pkg/lib.so": b"\x7fELF" + b"\0" * 100, "pkg,odd name.txt": b"a"}
    record_name = "pkg-1.0.dist-info/RECORD"
    members = {**files, record_name: zipcopy.record((zipcopy.record_row(n, d) for n, d in files.items()),
                                                    record_name)}
    out = zipcopy.write(tmp_path / "pkg-1.0-py3-none-any.whl",
                        (zipcopy.deflate(n, d, 0o755 if n.endswith(".so") else 0o644) for n, d in members.items()))
    again = zipcopy.write(tmp_path / "again.whl", (zipcopy.deflate(n, d) for n, d in members.items()))
    with zipfile.ZipFile(out) as zf:
        assert zf.testzip() is None
        assert {n: zf.read(n) for n in files} == files
        assert (zf.getinfo("pkg/lib.so").external_attr >> 16) & 0o777 == 0o755
        rows = list(csv.reader(io.StringIO(zf.read(record_name).decode())))
    assert rows[-1] == [record_name, "", ""]
    assert {r[0]: (r[1], r[2]) for r in rows[:-1]} == {
        n: (hashing.record_hash(d), str(len(d))) for n, d in files.items()}
    # Deterministic: the same members give the same bytes (modes aside, the second copy is 0644).
    assert zipcopy.write(tmp_path / "third.whl", (zipcopy.deflate(n, d) for n, d in members.items())
                         ).read_bytes() == again.read_bytes()
    assert not list(tmp_path.glob(".*.tmp*"))


def test_deflate_reusing_takes_a_kept_stream_only_when_it_inflates_to_the_content(tmp_path: Path) -> None:
    """The kept deflated bytes are reused when they inflate to exactly the content; a kept file with
    other content, a truncated or overlong one, or a link planted there is never taken (nor followed)."""
    import os
    import zlib

    data = os.urandom(1 << 16) + b"\0" * (1 << 20)
    kept = tmp_path / "lib.so.deflate6"
    fresh = zipcopy.deflate("k/lib.so", data, 0o755)
    first = zipcopy.deflate_reusing("k/lib.so", data, kept, 0o755)
    assert first == fresh and kept.read_bytes() == fresh.data
    assert zipcopy.deflate_reusing("k/lib.so", data, kept, 0o755) == fresh
    other = b"\x7fELF planted" + data[12:]
    comp = zlib.compressobj(6, zlib.DEFLATED, -15)
    planted = comp.compress(other) + comp.flush()
    for bad in (planted, fresh.data[:-10], fresh.data + b"\0" * (len(data) // 2)):
        kept.write_bytes(bad)
        got = zipcopy.deflate_reusing("k/lib.so", data, kept, 0o755)
        assert got == fresh and b"".join(zipcopy.chunks(got)) == data
        assert kept.read_bytes() == fresh.data  # replaced by the right stream
    kept.unlink()
    target = tmp_path / "elsewhere"
    target.write_bytes(fresh.data)
    kept.symlink_to(target)
    assert zipcopy.deflate_reusing("k/lib.so", data, kept, 0o755) == fresh
    assert not kept.is_symlink() and target.read_bytes() == fresh.data  # the link replaced, not written through


def test_raw_in_is_read_raw_from_memory_and_refuses_the_same(tmp_path: Path) -> None:
    """A member viewed in an archive read whole is the member read from the file; a truncated archive
    or a symlink member is refused the same way."""
    import pytest

    from dsv4patch.errors import BuildError, IntegrityError

    path = tmp_path / "a.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("a/x.py", b"x = 1\n" * 1000)
        link = zipfile.ZipInfo("a/link")
        link.external_attr = 0o120777 << 16
        zf.writestr(link, "/etc/passwd")
    blob = path.read_bytes()
    infos = zipcopy.open_members(io.BytesIO(blob))
    with open(path, "rb") as fh:
        assert zipcopy.raw_in(memoryview(blob), infos[0]) == zipcopy.read_raw(fh, infos[0])
        with pytest.raises(IntegrityError, match="symbolic link"):
            zipcopy.read_raw(fh, infos[1])
    with pytest.raises(IntegrityError, match="symbolic link"):
        zipcopy.raw_in(memoryview(blob), infos[1])
    with pytest.raises(BuildError, match="truncated|bad local header"):
        zipcopy.raw_in(memoryview(blob)[:infos[0].header_offset + 40], infos[0])
    assert zipcopy.inflate(zipcopy.raw_in(memoryview(blob), infos[0])) == b"x = 1\n" * 1000
