"""The ``pypi-sdist`` source kind: vLLM's source distribution, pinned by sha256.

The verified tarball comes from the store (the configured index first, the lock's url
as a hint), is extracted refusing anything but plain data, and its
``vllm/_version.py`` must record the lock's commit.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from dsv4patch.errors import FetchError
from dsv4patch.pins.lock import HEX64, Source, download_url
from dsv4patch.pins.source import register

if TYPE_CHECKING:
    import tarfile

    from dsv4patch.pins.lock import LockTable, Pin
    from dsv4patch.progress import Progress
    from dsv4patch.store import Store


class SdistSource:
    kind = "pypi-sdist"
    keys = frozenset({"name", "version", "sha256", "size", "url"})
    fork = False
    checks_base_tree = False

    def parse(self, table: LockTable) -> Source:
        return Source(
            kind=self.kind,
            name=table.get("name", str),
            version=table.get("version", str),
            sha256=table.hexid("sha256", HEX64, "a 64-hex sha256"),
            size=table.byte_size("size"),
            url=download_url(table.lock_path, table.where, table.get("url", str, "")),
        )

    def cache_key(self, pin: Pin) -> str:
        return f"sdist-{pin.source.sha256}"

    def check_checkout(self, pin: Pin, own_tree: Path | None) -> None:
        return None  # no user checkout: the sha256 pins the files

    def fetch_files(self, pin: Pin, store: Store, dest: Path, progress: Progress, own_tree: Path | None) -> None:
        extract_sdist(pin, store, dest, progress)

    def describe(self, source: Source) -> str:
        return source.url or f"{source.name}-{source.version}.tar.gz"

    def checkout_path(self, source: Source) -> Path | None:
        return None

    def to_entry(self, source: Source, lock_dir: Path) -> dict[str, Any]:
        entry: dict[str, Any] = {"kind": self.kind, "name": "vllm", "version": source.version,
                                 "sha256": source.sha256, "url": source.url}
        if source.size is not None:
            entry["size"] = source.size
        return entry


def extract_sdist(pin: Pin, store: Store, dest: Path, progress: Progress) -> None:
    src = pin.source
    filename = f"{src.name}-{src.version}.tar.gz"
    what = f"pin {pin.name}: {filename}"
    blob = store.fetch_blob(src.url, src.sha256, src.size, what, progress)
    import tarfile  # only a cold materialization reads an sdist (a warm check never does)
    import zlib

    try:
        with tarfile.open(blob, "r:gz") as tar:
            members = tar.getmembers()
            extractor = _SdistExtractor(tar, dest, f"{src.name}-{src.version}", what)
            with progress.task(f"extract {filename}", len(members), unit="files") as task:
                for m in members:
                    extractor.extract(m)
                    task.advance(1)
            extractor.check_symlinks()
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise FetchError(
            f"{what}: cannot read the sdist ({exc}); it is not a complete gzip-compressed tar. "
            "Nothing was materialized; if the file in the cache is damaged, remove "
            f"{blob} and fetch again"
        ) from None
    check_version_file(pin, dest)


class _SdistExtractor:
    """Extracts an sdist's members into a directory, refusing anything but plain data.

    An sdist is untrusted content (only its sha256 is pinned): members must be
    directories, regular files, hard links to earlier regular files (copied)
    or symlinks that stay inside the tree, all under the one top directory.
    ``..``, absolute names, devices, fifos, and anything under a ``.git``
    path component (git would read it as a repository's config and hooks)
    make the whole sdist fail with the member named.
    """

    def __init__(self, tar: tarfile.TarFile, dest: Path, top: str, what: str) -> None:
        self.tar, self.dest, self.top, self.what = tar, dest, top, what
        self.files: dict[str, int] = {}  # regular files extracted so far, and their modes
        self.symlinks: list[tuple[str, str]] = []

    def refuse(self, name: str, why: str) -> FetchError:
        return FetchError(f"{self.what}: refusing sdist member {name!r}: {why}; nothing was "
                          "materialized (the sdist is not a plain source archive)")

    def relative(self, name: str, raw: str) -> str:
        """``name`` (an archive path) relative to the top directory, checked."""
        if name.startswith("/") or PurePosixPath(name).is_absolute():
            raise self.refuse(raw, "absolute path")
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if not parts or parts[0] != self.top:
            raise self.refuse(raw, f"not under the sdist's top directory {self.top}/")
        parts = parts[1:]
        if ".." in parts:
            raise self.refuse(raw, "'..' in its path leaves the tree")
        if any(p.casefold() == ".git" for p in parts):
            raise self.refuse(raw, "it is inside a .git directory, which git would read as "
                                   "repository configuration (and run its commands)")
        if any("\0" in p for p in parts):
            raise self.refuse(raw, "NUL in its path")
        return "/".join(parts)

    def parent_dir(self, rel: str, raw: str) -> Path:
        """Create the directories above ``rel``; none of them may be a symlink."""
        d = self.dest
        for part in rel.split("/")[:-1]:
            d = d / part
            if d.is_symlink() or (d.exists() and not d.is_dir()):
                raise self.refuse(raw, f"its parent {d.relative_to(self.dest)} is not a directory")
            if not d.exists():
                d.mkdir()
        return d

    def clear(self, target: Path, raw: str) -> None:
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.exists():
            raise self.refuse(raw, "it replaces a directory")

    def write(self, target: Path, data: Iterator[bytes], mode: int) -> None:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as fh:
            for chunk in data:
                fh.write(chunk)
        os.chmod(target, mode)

    def extract(self, m: tarfile.TarInfo) -> None:
        rel = self.relative(m.name, m.name)
        if not rel:
            if not m.isdir():
                raise self.refuse(m.name, "the top directory is not a directory")
            return
        if m.isdir():
            d = self.parent_dir(rel + "/x", m.name)
            if d.is_symlink() or (d.exists() and not d.is_dir()):
                raise self.refuse(m.name, "a directory replaces a file or symlink")
            return
        mode = 0o755 if m.mode & 0o100 else 0o644  # what git records: the owner x bit
        target = self.parent_dir(rel, m.name) / rel.rsplit("/", 1)[-1]
        if m.isreg():
            self.clear(target, m.name)
            fh = self.tar.extractfile(m)
            assert fh is not None
            self.write(target, iter(lambda: fh.read(1 << 20), b""), mode)
            self.files[rel] = mode
        elif m.islnk():
            other = self.relative(m.linkname, m.name)
            if other not in self.files:
                raise self.refuse(m.name, f"hard link to {m.linkname!r}, which is not an earlier "
                                          "regular file of the sdist")
            data = (self.dest / other).read_bytes()
            self.clear(target, m.name)
            self.write(target, iter([data]), self.files[other])  # one inode: one mode
            self.files[rel] = self.files[other]
        elif m.issym():
            link = m.linkname
            if not link or link.startswith("/"):
                raise self.refuse(m.name, f"symlink to absolute path {link!r}")
            inside = posixpath.normpath(posixpath.join(posixpath.dirname(rel), link))
            if inside == ".." or inside.startswith("../") or any(
                p.casefold() == ".git" for p in inside.split("/")
            ):
                raise self.refuse(m.name, f"symlink to {link!r} points outside the tree")
            self.clear(target, m.name)
            os.symlink(link, target)
            self.files.pop(rel, None)
            self.symlinks.append((rel, m.name))
        else:
            kind = "device" if (m.ischr() or m.isblk()) else "fifo" if m.isfifo() else "special file"
            raise self.refuse(m.name, f"it is a {kind}")

    def check_symlinks(self) -> None:
        """Every symlink, followed through the others, must still end inside the tree."""
        root = os.path.realpath(self.dest)
        for rel, raw in self.symlinks:
            real = os.path.realpath(self.dest / rel)
            if real != root and not real.startswith(root + os.sep):
                raise self.refuse(raw, "symlink resolves outside the tree")


def version_commit(data: bytes, what: str) -> str:
    """The commit prefix recorded in an sdist's ``vllm/_version.py`` (parsed, not grepped).

    setuptools-scm writes ``__commit_id__ = commit_id = 'g<hex>'``; only a
    module-level assignment of a string literal counts, never a comment or
    another string that happens to contain ``commit_id = '...'``.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FetchError(f"{what} is not UTF-8 text (byte {exc.start}); the sdist is damaged "
                         "or not a vLLM sdist") from None
    import ast

    try:
        module = ast.parse(text)
    except SyntaxError as exc:
        raise FetchError(f"{what} is not valid Python ({exc.msg}, line {exc.lineno})") from None
    names = {"commit_id", "__commit_id__"}
    value: object = None
    for node in module.body:
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if names & set(targets) and isinstance(node.value, ast.Constant):
                value = node.value.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id in names and isinstance(node.value, ast.Constant):
                value = node.value.value
    if not isinstance(value, str):
        raise FetchError(f"{what} records no commit id")
    m = re.fullmatch(r"g?([0-9a-f]{7,40})", value)
    if not m:
        raise FetchError(f"{what} records commit id {value!r}, which is not a git commit prefix")
    return m.group(1)


def check_version_file(pin: Pin, root: Path) -> None:
    """The sdist's vllm/_version.py records a commit prefix; it must be the lock's."""
    version_py = root / "vllm" / "_version.py"
    if not version_py.is_file():
        raise FetchError(f"pin {pin.name}: vllm/_version.py missing from the source")
    commit = version_commit(version_py.read_bytes(), f"pin {pin.name}: vllm/_version.py")
    if not pin.commit.startswith(commit):
        raise FetchError(
            f"pin {pin.name}: the sdist was built from commit {commit}, but the lock pins "
            f"{pin.commit}; the lock's commit or sha256 is wrong"
        )


register(SdistSource())
