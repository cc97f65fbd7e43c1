"""The pin's patched tree as the lock fixes it, file by file: what every delivery ships.

Why its own module: the wheel builder, ``status --installed`` and the self-test all
compare against it; it is the series' result on the pin (the pin check run in the
cache, refused unless every patch has the status the lock expects), so it lives with
the series and not with any one of its readers.  The check itself is
:func:`dsv4patch.series.pincheck.patched_tree`'s; this module only reads its result, so
it needs git and nothing else of ours.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dsv4patch import git
from dsv4patch.errors import EXIT_UNEXPECTED, BuildError
from dsv4patch.nextstep import Step, mention
from dsv4patch.records import frozen

if TYPE_CHECKING:
    from dsv4patch.pins import Pin, PinRepo
    from dsv4patch.series.patches import Series
    from dsv4patch.series.pincheck import PinReport
    from dsv4patch.series.results import SeriesResult


@frozen
class ChangedFile:
    path: str
    base: bytes | None  # None: the patches add it
    patched: bytes | None  # None: the patches delete it
    patches: tuple[str, ...]  # patches of the series that touch it


@dataclass
class PatchedTree:
    """The pin's patched tree as the lock fixes it, file by file."""

    pin: Pin
    series: Series
    base_tree: str
    patched_tree: str
    files: list[ChangedFile]
    patch_files: dict[str, list[str]]  # patch -> paths it touches (applied patches only)

    def by_path(self) -> dict[str, ChangedFile]:
        return {f.path: f for f in self.files}


def read_patched_tree(pin: Pin, repo: PinRepo, series: Series, result: SeriesResult,
                      report: PinReport) -> PatchedTree:
    """Every file the series changes on the pin, read from the cache's repository after its check.

    Refuses (exit 1: a result differs from the lock) unless every patch has the
    status the lock expects and the result is the lock's patched_tree.
    """
    final = result.final_tree
    if not report.ok or final is None:
        bad = report.failures()
        raise PatchSetError(
            f"pin {pin.name}: the series does not give the locked patched tree "
            f"({'; '.join(bad) or 'no final tree'}); run `{mention(Step.of('check', pin=pin.name))}`"
        )
    touched: dict[str, list[str]] = {}
    patch_files: dict[str, list[str]] = {}
    applied = {r.patch for r in result.patches if r.status.applies}
    for p in series.patches:
        if p.name in applied:
            patch_files[p.name] = list(p.touched)
            for path in p.touched:
                touched.setdefault(path, []).append(p.name)
    paths = git.changed_paths(repo.repo, repo.base_tree, final)
    old, new = (_blobs(repo.repo, tree, paths) for tree in (repo.base_tree, final))
    files = [ChangedFile(path, old.get(path), new.get(path), tuple(touched.get(path, ()))) for path in paths]
    return PatchedTree(pin, series, repo.base_tree, final, files, patch_files)


class PatchSetError(BuildError):
    """The series does not reach the lock's patched tree (a result differs from the lock)."""

    exit_code = EXIT_UNEXPECTED
    kind = "build"


def _blobs(repo: Path, treeish: str, paths: list[str]) -> dict[str, bytes]:
    """The content of each of ``paths`` that is a file (a blob) in ``treeish``: two git calls for
    all of them (a warm wheel reads some 30 paths of each side)."""
    entries = {p: e for p, e in git.tree_entries(repo, treeish, paths).items() if e.is_blob}
    blobs = git.cat_blobs(repo, [e.oid for e in entries.values()])
    return {p: blobs[e.oid] for p, e in entries.items()}
