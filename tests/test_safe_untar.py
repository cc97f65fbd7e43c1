"""tests/gpu/safe_untar.py: the GPU scripts' unpack, with tarfile's data filter and, as on a Python without
it (Debian 12's 3.11.2), with its refusals made by hand (``tarfile.data_filter`` removed for the test)."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import safe_untar  # noqa: E402


def _tar(*members: tuple[str, str, int]) -> tarfile.TarFile:
    """An in-memory tar of (name, kind, mode): kind f (file "x"), d (directory), l (symlink to
    /etc/passwd), h (hard link to /etc/passwd), c (character device)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, mode in members:
            ti = tarfile.TarInfo(name)
            ti.mode = mode
            if kind == "f":
                ti.size = 1
                tar.addfile(ti, io.BytesIO(b"x"))
                continue
            ti.type = {"d": tarfile.DIRTYPE, "l": tarfile.SYMTYPE, "h": tarfile.LNKTYPE, "c": tarfile.CHRTYPE}[kind]
            ti.linkname = "/etc/passwd" if kind in "lh" else ""
            tar.addfile(ti)
    buf.seek(0)
    return tarfile.open(fileobj=buf)


@pytest.fixture(params=["filter", "by hand"])
def way(request, monkeypatch) -> str:
    if request.param == "by hand":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python's tarfile has no data filter (the by-hand case runs)")
    return str(request.param)


def test_a_plain_tree_unpacks_the_same_both_ways(tmp_path: Path, way: str) -> None:
    tar = _tar(("pkg", "d", 0o755), ("pkg/mod.py", "f", 0o644), ("pkg/run.sh", "f", 0o775), ("top.txt", "f", 0o666))
    safe_untar.extract(tar, tmp_path / "out")
    got = {str(p.relative_to(tmp_path / "out")): p.stat().st_mode & 0o7777 for p in (tmp_path / "out").rglob("*")}
    # group and other write dropped, as the data filter does
    assert got == {"pkg": 0o755, "pkg/mod.py": 0o644, "pkg/run.sh": 0o755, "top.txt": 0o644}, (way, got)


@pytest.mark.parametrize("member", [("../evil", "f", 0o644), ("/tmp/abs-evil", "f", 0o644), ("a/../../evil", "f", 0o644),
                                    ("link", "l", 0o777), ("hard", "h", 0o644), ("dev", "c", 0o644)],
                         ids=["dotdot", "absolute", "inner-dotdot", "symlink", "hardlink", "device"])
def test_a_member_that_leaves_the_tree_or_is_not_plain_is_refused(tmp_path: Path, way: str, member) -> None:
    out = tmp_path / "deep" / "out"
    out.mkdir(parents=True)
    refusals = (safe_untar.UnsafeMember,) if way == "by hand" else (tarfile.FilterError,)
    try:
        safe_untar.extract(_tar(("ok.txt", "f", 0o644), member), out)
        refused = False
    except refusals:
        refused = True
    # The filter takes an absolute name's leading slash off (the member lands inside); by hand it is refused.
    assert refused or (way == "filter" and member[0] == "/tmp/abs-evil" and (out / "tmp" / "abs-evil").is_file())
    assert not (tmp_path / "deep" / "evil").exists() and not (tmp_path / "evil").exists()
    assert not Path("/tmp/abs-evil").exists()
    if way == "by hand":  # refused before anything is written
        assert list(out.iterdir()) == []


def test_setuid_and_sticky_bits_are_dropped(tmp_path: Path, way: str) -> None:
    safe_untar.extract(_tar(("s", "f", 0o4755), ("g", "f", 0o2755), ("t", "d", 0o1777)), tmp_path)
    assert {p.name: p.stat().st_mode & 0o7777 for p in tmp_path.iterdir()} == {"s": 0o755, "g": 0o755, "t": 0o755}
