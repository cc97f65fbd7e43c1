"""seriesfile.py: the patch files a series file lists, and each series file it cannot read named.

The real series files of this repository, then files made here: comments, blank lines, paths relative to
the series file, and the errors (missing, a directory, not UTF-8, nothing listed), each naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import ROOT, deadline
from dsv4patch.errors import PatchFileError
from dsv4patch.seriesfile import read_series_file, unlisted


def test_the_repositorys_series_files_list_patch_files_that_exist() -> None:
    for series in sorted((ROOT / "patches").rglob("series")):
        listed = read_series_file(series)
        assert listed and all(p.parent == series.parent and p.suffix == ".patch" for p in listed), series
        assert all(p.is_file() for p in listed), series


def test_comments_blank_lines_and_relative_paths(tmp_path: Path) -> None:
    series = tmp_path / "s" / "series"
    series.parent.mkdir()
    series.write_text("# the fixes\n\n0001-a.patch\n  0002-b.patch   # trailing comment\nsub/0003-c.patch\n#0004-off.patch\n")
    assert read_series_file(series) == [series.parent / "0001-a.patch", series.parent / "0002-b.patch",
                                        series.parent / "sub" / "0003-c.patch"]


@pytest.mark.parametrize("case", ["missing", "directory", "not-utf8", "empty", "comments-only"])
def test_a_series_file_it_cannot_use_is_named(tmp_path: Path, case: str) -> None:
    series = tmp_path / "series"
    if case == "directory":
        series.mkdir()
    elif case == "not-utf8":
        series.write_bytes(b"0001-a.patch\n\xff\xfe\n")
    elif case == "empty":
        series.write_text("")
    elif case == "comments-only":
        series.write_text("# nothing yet\n\n")
    with pytest.raises(PatchFileError) as info:
        read_series_file(series)
    message = str(info.value)
    assert str(series) in message
    expected = {"missing": "not found", "directory": "is a directory, not a regular file", "not-utf8": "is not UTF-8 text (byte 13)",
                "empty": "lists no patches", "comments-only": "lists no patches"}[case]
    assert expected in message, message


@pytest.mark.parametrize("case", ["fifo", "sparse"])
def test_a_series_file_that_would_hang_or_exhaust_memory_is_refused(tmp_path: Path, case: str) -> None:
    """A series file is read through safeio: a FIFO never blocks, /dev/zero is not read, and a file past
    the series bound (1 MiB) is refused, each naming the file (a FIFO hung; the 64 MiB file was read
    whole).  /dev/zero as a series file: tests/test_inputs.py, in a child process under a memory cap."""
    series = tmp_path / "series"
    if case == "fifo":
        os.mkfifo(series)
    else:
        series.write_text("0001-a.patch\n")
        os.truncate(series, 64 << 20)
    with deadline(20), pytest.raises(PatchFileError) as info:
        read_series_file(series)
    needle = {"fifo": "is a FIFO, not a regular file", "sparse": "is larger than 1048576 bytes"}[case]
    assert f"series file {series}" in str(info.value) and needle in str(info.value), str(info.value)


@pytest.mark.parametrize("entry", ["../../outside.patch", "/etc/passwd", "sub/../../outside.patch"])
def test_an_entry_outside_the_series_files_directory_is_an_unsafe_path(tmp_path: Path, entry: str) -> None:
    """A series lists patch files below its own directory: an absolute entry or one with a '..' component
    was read and applied (a patch from outside the project's reviewed files); now exit 3, named."""
    series = tmp_path / "patches" / "series"
    series.parent.mkdir()
    series.write_text(f"0001-a.patch\n{entry}\n")
    with pytest.raises(PatchFileError) as info:
        read_series_file(series)
    assert "unsafe path" in str(info.value) and repr(entry) in str(info.value) and str(series) in str(info.value)


@pytest.mark.parametrize("entry", ["a\x00b.patch", "0002-\x1b[31mred.patch"])
def test_an_entry_with_a_nul_or_control_character_is_refused(tmp_path: Path, entry: str) -> None:
    """A NUL in a series entry reached the file system as ValueError: embedded null byte (exit 70); now a
    PatchFileError (exit 3) naming the series file and the entry, escaped."""
    series = tmp_path / "series"
    series.write_bytes(b"0001-a.patch\n" + entry.encode() + b"\n")
    with pytest.raises(PatchFileError) as info:
        read_series_file(series)
    message = str(info.value)
    assert f"series file {series}: {entry!r}: the path contains a NUL/control character" in message, message


def test_unlisted_names_are_those_no_series_file_lists(tmp_path: Path) -> None:
    """What a pin's variants are checked against: the names its series list, whichever series a run uses."""
    (tmp_path / "a").write_text("0001-a.patch\nsub/0002-b.patch\n")
    (tmp_path / "b").write_text("0003-c.patch\n")
    names = {"0001-a.patch", "0002-b.patch", "0003-c.patch", "0003-cc.patch"}
    assert unlisted([tmp_path / "a", tmp_path / "b"], names) == {"0003-cc.patch"}
    assert unlisted([tmp_path / "a"], names) == {"0003-c.patch", "0003-cc.patch"}
    with pytest.raises(PatchFileError, match="not found"):
        unlisted([tmp_path / "a", tmp_path / "gone"], names)
