"""A pin as a git repository.

Every pin, whatever its source, becomes a bare repository in the cache whose
``HEAD`` is one root commit made with a fixed identity and date over the
pin's files.  The same sdist therefore always gives the same tree id and the
same commit id, and because the tree is its own repository, ``git apply``
can never be fooled into ``Skipped patch`` by an enclosing work tree.

Where the files come from is the pin's source kind (:mod:`.source`):

* ``pypi-sdist`` (:mod:`.sdist`): the verified tarball from the store, checked
  against the lock's commit through ``vllm/_version.py``;
* ``git`` (:mod:`.gitsource`): fetched at the exact commit from a remote (any URL git accepts);
* ``local`` (:mod:`.localsource`): an existing checkout that must be clean and at the
  commit (or, when it is the tree a command works on, at a descendant of it); vetted
  through :mod:`dsv4patch.guard` like every user checkout.

This is the only place a pin is materialized.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from dsv4patch import git
from dsv4patch.errors import CacheError, FetchError, param, writing
from dsv4patch.pins.source import kind_of
from dsv4patch.records import frozen

if TYPE_CHECKING:
    from dsv4patch.pins.lock import Pin
    from dsv4patch.progress import Progress
    from dsv4patch.store import Store

READY = "dsv4patch-ready"


@frozen
class PinRepo:
    """A materialized pin: a bare repo and its deterministic base commit."""

    pin: Pin
    repo: Path
    base_commit: str
    base_tree: str


def cache_key(pin: Pin) -> str:
    """Content identity of a pin's files (its source kind's: the sdist hash, or the git commit)."""
    return kind_of(pin).cache_key(pin)


def is_materialized(pin: Pin, store: Store) -> bool:
    """Whether the pin's tree is in the cache already (materialize then costs one git call)."""
    return (store.root / "trees" / f"{cache_key(pin)}.git" / READY).exists()


def materialize(pin: Pin, store: Store, progress: Progress, checkout: Path | None = None) -> PinRepo:
    """``pin``'s tree as a cached bare repository with its base commit.

    ``checkout``: the tree a command works on; when it is a ``local`` pin's own
    checkout (a fork's, :mod:`dsv4patch.checkout.forkcheckout`), its HEAD may have moved on from
    the pinned commit (the series committed on top) and the caller checks it."""
    kind = kind_of(pin)
    # Revalidated on every run, warm cache or not: a checkout that has moved
    # or has edits is refused the same way a cold cache refuses it.
    kind.check_checkout(pin, checkout)
    key = kind.cache_key(pin)
    dest = store.root / "trees" / f"{key}.git"
    with store.mutex(f"tree-{key}"):
        if not (dest / READY).exists():
            if dest.exists():
                import shutil  # a cold path: not imported by a warm run (issue 39)

                shutil.rmtree(dest)  # left by a killed run: build it again
            advice = ("nothing was cached; free space in the cache (or point DSV4PATCH_CACHE / "
                      f"{param('cache_dir')} at a larger disk) and run the command again")
            with writing(CacheError, str(store.root), advice):
                _build(pin, store, dest, progress, own_tree=checkout)
        base = (dest / READY).read_text().strip()
    tree = git.out(dest, "rev-parse", f"{base}^{{tree}}")
    if kind.checks_base_tree and pin.base_tree and tree != pin.base_tree:
        raise FetchError(
            f"pin {pin.name}: source tree is {tree}, the lock says base_tree {pin.base_tree}"
        )
    return PinRepo(pin=pin, repo=dest, base_commit=base, base_tree=tree)


def _build(pin: Pin, store: Store, dest: Path, progress: Progress, own_tree: Path | None = None) -> None:
    work = store.tmpdir(f"tree-{pin.name}-")
    try:
        files = work / "files"
        files.mkdir()
        kind_of(pin).fetch_files(pin, store, files, progress, own_tree)
        git.init(files)
        message = f"vLLM {pin.vllm_version} ({pin.source.kind}, upstream commit {pin.commit})\n"
        from dsv4patch import guard  # only when a tree is built: not on a warm check's way (issue 39)

        with guard.owned(files):  # the import directory dsv4patch just made
            with progress.task(f"import {pin.name} into git", None):
                base = git.add_all_and_commit_root(files, message)
            git.run(files, ["config", "core.bare", "true"])
        os.replace(files / ".git", work / "repo.git")
        (work / "repo.git" / READY).write_text(base + "\n")
        os.replace(work / "repo.git", dest)
    finally:
        store.remove_tmp(work)


