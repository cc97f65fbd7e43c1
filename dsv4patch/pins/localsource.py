"""The ``local`` source kind: a user's existing git checkout (a fork's), clean and at the
pinned commit, vetted through :mod:`dsv4patch.guard` like every user checkout.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4patch import git
from dsv4patch.errors import FetchError, SourceMovedError, param
from dsv4patch.pins.gitsource import export_commit
from dsv4patch.pins.lock import Source
from dsv4patch.pins.source import register

if TYPE_CHECKING:
    from dsv4patch.pins.lock import LockTable, Pin
    from dsv4patch.progress import Progress
    from dsv4patch.store import Store


class LocalSource:
    kind = "local"
    keys = frozenset({"path"})
    fork = True
    checks_base_tree = True

    def parse(self, table: LockTable) -> Source:
        return Source(kind=self.kind, path=(table.lock_path.resolve().parent / table.path("path")).resolve())

    def cache_key(self, pin: Pin) -> str:
        return f"git-{pin.commit}"  # the same commit from a remote or a checkout: the same files

    def check_checkout(self, pin: Pin, own_tree: Path | None) -> None:
        check_local_checkout(pin, own_tree)

    def fetch_files(self, pin: Pin, store: Store, dest: Path, progress: Progress, own_tree: Path | None) -> None:
        assert pin.source.path is not None
        with progress.task(f"fetch {pin.name} from {pin.source.path}", None):
            check_local_checkout(pin, own_tree)
            export_commit(pin, str(pin.source.path), dest)

    def describe(self, source: Source) -> str:
        return str(source.path)

    def checkout_path(self, source: Source) -> Path | None:
        return source.path

    def to_entry(self, source: Source, lock_dir: Path) -> dict[str, Any]:
        assert source.path is not None
        return {"kind": self.kind, "path": os.path.relpath(source.path, lock_dir)}


def check_local_checkout(pin: Pin, own_tree: Path | None = None) -> None:
    """A ``local`` pin's checkout must exist and be a clean git checkout at the pinned commit;
    it is vetted first (:func:`guard.guarded`: no settings that run programs or rewrite files).

    ``own_tree``: the tree being worked on; when it is this checkout, HEAD may descend from the
    pinned commit (the fork's branch with the series, and the maintainer's commits, on top) and
    may be mid-work (the caller checks cleanliness)."""
    from dsv4patch import guard  # when a local pin is fetched: a warm check of another kind never is (issue 39)

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
            raise SourceMovedError(
                f"pin {pin.name}: local checkout {src.path} is at {head}, the lock pins "
                f"{pin.commit}; check out that commit"
                + (f" (HEAD may descend from it only where {src.path} is itself the {param('tree')})"
                   if head is not None else "")
            )
        dirty = git.dirty_paths(src.path)
        if dirty:
            raise SourceMovedError(
                f"pin {pin.name}: local checkout {src.path} has uncommitted changes "
                f"({', '.join(dirty[:5])}); commit or stash them"
            )


register(LocalSource())
