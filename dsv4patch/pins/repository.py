"""A pin as a git repository.

Every pin, whatever its source, becomes a bare repository in the cache whose
``HEAD`` is one root commit made with a fixed identity and date over the
pin's files.  The same sdist therefore always gives the same tree id and the
same commit id, and because the tree is its own repository, ``git apply``
can never be fooled into ``Skipped patch`` by an enclosing work tree.

Sources:

* ``pypi-sdist``: the verified tarball from the store, checked against the
  lock's commit through ``vllm/_version.py``;
* ``git``: fetched at the exact commit from a remote (any URL git accepts);
* ``local``: an existing checkout that must be clean and at the commit (or, when
  it is the tree a command works on, at a descendant of it); vetted through
  :mod:`dsv4patch.guard` like every user checkout.

This is the only place a pin is fetched.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from dsv4patch import git, guard
from dsv4patch.errors import CacheError, FetchError, NotFetchedError, TreeError, writing
from dsv4patch.pins.lock import Pin
from dsv4patch.progress import Progress
from dsv4patch.store import Store

if TYPE_CHECKING:
    import tarfile

READY = "dsv4patch-ready"


@dataclass(frozen=True)
class PinRepo:
    """A materialized pin: a bare repo and its deterministic base commit."""

    pin: Pin
    repo: Path
    base_commit: str
    base_tree: str


def cache_key(pin: Pin) -> str:
    """Content identity of a pin's files: the sdist hash, or the git commit."""
    if pin.source.kind == "pypi-sdist":
        return f"sdist-{pin.source.sha256}"
    return f"git-{pin.commit}"


def is_materialized(pin: Pin, store: Store) -> bool:
    """Whether the pin's tree is in the cache already (materialize then costs one git call)."""
    return (store.root / "trees" / f"{cache_key(pin)}.git" / READY).exists()


def materialize(pin: Pin, store: Store, progress: Progress, checkout: Path | None = None) -> PinRepo:
    """``pin``'s tree as a cached bare repository with its base commit.

    ``checkout``: the tree a command works on; when it is a ``local`` pin's own
    checkout (a fork's, :mod:`dsv4patch.checkout.forkcheckout`), its HEAD may have moved on from
    the pinned commit (the series committed on top) and the caller checks it."""
    if pin.source.kind == "local":
        # Revalidated on every run, warm cache or not: a checkout that has moved
        # or has edits is refused the same way a cold cache refuses it.
        check_local_checkout(pin, own_tree=checkout)
    key = cache_key(pin)
    dest = store.root / "trees" / f"{key}.git"
    with store.lock(f"tree-{key}"):
        if not (dest / READY).exists():
            if dest.exists():
                shutil.rmtree(dest)  # left by a killed run: build it again
            advice = ("nothing was cached; free space in the cache (or point DSV4PATCH_CACHE / "
                      "--cache-dir at a larger disk) and run the command again")
            with writing(CacheError, str(store.root), advice):
                _build(pin, store, dest, progress, own_tree=checkout)
        base = (dest / READY).read_text().strip()
    tree = git.out(dest, "rev-parse", f"{base}^{{tree}}")
    if pin.source.kind != "pypi-sdist" and pin.base_tree and tree != pin.base_tree:
        raise FetchError(
            f"pin {pin.name}: source tree is {tree}, the lock says base_tree {pin.base_tree}"
        )
    return PinRepo(pin=pin, repo=dest, base_commit=base, base_tree=tree)


def _build(pin: Pin, store: Store, dest: Path, progress: Progress, own_tree: Path | None = None) -> None:
    work = store.tmpdir(f"tree-{pin.name}-")
    try:
        files = work / "files"
        files.mkdir()
        if pin.source.kind == "pypi-sdist":
            _extract_sdist(pin, store, files, progress)
        else:
            where = pin.source.path if pin.source.kind == "local" else pin.source.url
            with progress.task(f"fetch {pin.name} from {where}", None):
                _export_git(pin, store, files, own_tree)
        git.init(files)
        message = f"vLLM {pin.vllm_version} ({pin.source.kind}, upstream commit {pin.commit})\n"
        with guard.owned(files):  # the import directory dsv4patch just made
            with progress.task(f"import {pin.name} into git", None):
                base = git.add_all_and_commit_root(files, message)
            git.run(files, ["config", "core.bare", "true"])
        os.replace(files / ".git", work / "repo.git")
        (work / "repo.git" / READY).write_text(base + "\n")
        os.replace(work / "repo.git", dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _extract_sdist(pin: Pin, store: Store, dest: Path, progress: Progress) -> None:
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


def check_local_checkout(pin: Pin, own_tree: Path | None = None) -> None:
    """A ``local`` pin's checkout must exist and be a clean git checkout at the pinned commit;
    it is vetted first (:func:`guard.guarded`: no settings that run programs or rewrite files).

    ``own_tree``: the tree being worked on; when it is this checkout, HEAD may descend from the
    pinned commit (the fork's branch with the series, and the maintainer's commits, on top) and
    may be mid-work (the caller checks cleanliness)."""
    src = pin.source
    assert src.path is not None
    if not src.path.exists():
        raise FetchError(
            f"pin {pin.name}: local source {src.path} does not exist; a relative path in the "
            "lock is relative to the lock file's directory, so a copied lock needs it adjusted"
        )
    if not guard.is_checkout_root(src.path):
        raise FetchError(f"pin {pin.name}: {src.path} is not a git checkout")
    with guard.guarded(src.path, role=f"pin {pin.name}'s local checkout"):
        head = git.head(src.path)
        own = own_tree is not None and os.path.realpath(own_tree) == os.path.realpath(src.path)
        if own and head is not None and git.has_object(src.path, f"{pin.commit}^{{commit}}") \
                and git.is_ancestor(src.path, pin.commit, head):
            return
        if head != pin.commit:
            raise TreeError(
                f"pin {pin.name}: local checkout {src.path} is at {head}, the lock pins "
                f"{pin.commit}; check out that commit"
                + (f" (HEAD may descend from it only where {src.path} is itself the --tree)"
                   if head is not None else "")
            )
        dirty = git.dirty_paths(src.path)
        if dirty:
            raise TreeError(
                f"pin {pin.name}: local checkout {src.path} has uncommitted changes "
                f"({', '.join(dirty[:5])}); commit or stash them"
            )


def _export_git(pin: Pin, store: Store, dest: Path, own_tree: Path | None = None) -> None:
    """Check out the pinned commit's files from a git remote or a local checkout (``own_tree``:
    the tree the command works on, see :func:`check_local_checkout`)."""
    src = pin.source
    if src.kind == "local":
        assert src.path is not None
        check_local_checkout(pin, own_tree)
        url = str(src.path)
    else:
        url = src.url
    fetch_repo = dest.parent / "fetch.git"
    git.run(dest.parent, ["init", "-q", "--bare", str(fetch_repo)], repo=False)
    res = git.fetch_commit(fetch_repo, url, pin.commit)
    if not res.ok:
        res = git.fetch_all(fetch_repo, url)
        if not res.ok:
            raise NotFetchedError(f"pin {pin.name}: cannot fetch from {url}: {res.stderr.strip()}")
    if not git.has_object(fetch_repo, f"{pin.commit}^{{commit}}"):
        raise FetchError(f"pin {pin.name}: commit {pin.commit} is not in {url}")
    git.run(fetch_repo, ["--work-tree", str(dest), "checkout", "-f", pin.commit, "--", "."])
    shutil.rmtree(fetch_repo)
