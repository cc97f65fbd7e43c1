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
* ``local``: an existing checkout that must be clean and at the commit.

This is the only place a pin is fetched.
"""

from __future__ import annotations

import os
import re
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

from dsv4patch import git
from dsv4patch.errors import CacheError, FetchError, TreeError, writing
from dsv4patch.lock import Pin
from dsv4patch.progress import Progress
from dsv4patch.store import Store

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


def materialize(pin: Pin, store: Store, progress: Progress) -> PinRepo:
    key = cache_key(pin)
    dest = store.root / "trees" / f"{key}.git"
    with store.lock(f"tree-{key}"):
        if not (dest / READY).exists():
            if dest.exists():
                shutil.rmtree(dest)  # left by a killed run: build it again
            advice = ("nothing was cached; free space in the cache (or point DSV4PATCH_CACHE / "
                      "--cache-dir at a larger disk) and run the command again")
            with writing(CacheError, str(store.root), advice):
                _build(pin, store, dest, progress)
        base = (dest / READY).read_text().strip()
    tree = git.out(dest, "rev-parse", f"{base}^{{tree}}")
    if pin.source.kind != "pypi-sdist" and pin.base_tree and tree != pin.base_tree:
        raise FetchError(
            f"pin {pin.name}: source tree is {tree}, the lock says base_tree {pin.base_tree}"
        )
    return PinRepo(pin=pin, repo=dest, base_commit=base, base_tree=tree)


def _build(pin: Pin, store: Store, dest: Path, progress: Progress) -> None:
    work = store.tmpdir(f"tree-{pin.name}-")
    try:
        files = work / "files"
        files.mkdir()
        if pin.source.kind == "pypi-sdist":
            _extract_sdist(pin, store, files, progress)
        else:
            _export_git(pin, store, files)
        git.init(files)
        message = f"vLLM {pin.vllm_version} ({pin.source.kind}, upstream commit {pin.commit})\n"
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
    blob = store.fetch_blob(src.url, src.sha256, src.size, f"pin {pin.name}: {filename}", progress)
    with tarfile.open(blob, "r:gz") as tar:
        members = tar.getmembers()
        prefix = f"{src.name}-{src.version}/"
        with progress.task(f"extract {filename}", len(members)) as task:
            for m in members:
                if not m.name.startswith(prefix) and m.name != prefix.rstrip("/"):
                    raise FetchError(f"pin {pin.name}: {filename} has unexpected member {m.name}")
                m.name = m.name[len(prefix):]
                if m.name:
                    _extract_member(tar, m, dest)
                task.advance(1)
    check_version_file(pin, dest)


def _extract_member(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path) -> None:
    """Extract refusing links and paths outside ``dest`` (the "data" filter).

    Python < 3.11.4 (e.g. Debian bookworm's 3.11.2) has no extraction filters,
    so the same checks are made by hand there.
    """
    if hasattr(tarfile, "data_filter"):
        tar.extract(member, dest, filter="data")
        return
    target = (dest / member.name).resolve()
    if not str(target).startswith(str(dest.resolve()) + os.sep) or member.issym() or member.islnk():
        raise FetchError(f"refusing unsafe sdist member {member.name}")
    if not (member.isfile() or member.isdir()):
        return
    member.mode = (member.mode | 0o644) & 0o755
    tar.extract(member, dest)


def check_version_file(pin: Pin, root: Path) -> None:
    """The sdist's vllm/_version.py records a commit prefix; it must be the lock's."""
    version_py = root / "vllm" / "_version.py"
    if not version_py.exists():
        raise FetchError(f"pin {pin.name}: vllm/_version.py missing from the source")
    m = re.search(r"commit_id\s*=\s*['\"]g?([0-9a-f]+)['\"]", version_py.read_text())
    if not m:
        raise FetchError(f"pin {pin.name}: vllm/_version.py records no commit id")
    if not pin.commit.startswith(m.group(1)):
        raise FetchError(
            f"pin {pin.name}: the sdist was built from commit {m.group(1)}, but the lock pins "
            f"{pin.commit}; the lock's commit or sha256 is wrong"
        )


def _export_git(pin: Pin, store: Store, dest: Path) -> None:
    """Check out the pinned commit's files from a git remote or a local checkout."""
    src = pin.source
    if src.kind == "local":
        assert src.path is not None
        if not git.is_repo_root(src.path):
            raise FetchError(f"pin {pin.name}: {src.path} is not a git checkout")
        head = git.head(src.path)
        if head != pin.commit:
            raise TreeError(
                f"pin {pin.name}: local checkout {src.path} is at {head}, the lock pins "
                f"{pin.commit}; check out that commit"
            )
        dirty = git.dirty_paths(src.path)
        if dirty:
            raise TreeError(
                f"pin {pin.name}: local checkout {src.path} has uncommitted changes "
                f"({', '.join(dirty[:5])}); commit or stash them"
            )
        url = str(src.path)
    else:
        url = src.url
    fetch_repo = dest.parent / "fetch.git"
    git.run(dest.parent, ["init", "-q", "--bare", str(fetch_repo)])
    res = git.fetch_commit(fetch_repo, url, pin.commit)
    if not res.ok:
        res = git.fetch_all(fetch_repo, url)
        if not res.ok:
            raise FetchError(f"pin {pin.name}: cannot fetch from {url}: {res.stderr.strip()}")
    if not git.has_object(fetch_repo, f"{pin.commit}^{{commit}}"):
        raise FetchError(f"pin {pin.name}: commit {pin.commit} is not in {url}")
    git.run(fetch_repo, ["--work-tree", str(dest), "checkout", "-f", pin.commit, "--", "."])
    shutil.rmtree(fetch_repo)
