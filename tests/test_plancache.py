"""plancache.py: a clean tree's kernel plan kept per commit, on the real patched 0.27.1 tree.

The kept plan is the scan's, field for field; a second call does not scan; an entry of
another shape, of another commit, or a link planted in its place is never taken (the
tree is scanned again and the entry written anew, never through the link); a new commit
is another entry."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import applied_tree
from dsv4patch import guard
from dsv4patch.kernels import plancache, sources
from dsv4patch.store import Store

pytestmark = [pytest.mark.network]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Path:
    return applied_tree(tmp_path_factory, shared_cache, "pc")


def _kept(tree: Path, base: str | None, store: Store) -> sources.KernelPlan:
    with guard.guarded(tree):  # as build_tree holds it
        return plancache.plan(tree, base, store)


def _scan(tree: Path, base: str | None = None) -> sources.KernelPlan:
    with guard.guarded(tree):
        return sources.plan(tree, base)


def _scans(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []
    real = sources.plan

    def counted(tree: Path, base: str | None = None) -> sources.KernelPlan:
        calls.append(tree)
        return real(tree, base)

    monkeypatch.setattr(sources, "plan", counted)
    return calls


def test_the_kept_plan_is_the_scans_and_a_second_call_does_not_scan(tree: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store.open(tmp_path / "cache")
    scanned = _scan(tree)
    assert scanned.units and scanned.ops  # the series changes kernel units: something to keep
    calls = _scans(monkeypatch)
    first = _kept(tree, None, store)
    assert first == scanned and len(calls) == 1
    (entry,) = (store.root / plancache.PLANS).iterdir()
    again = _kept(tree, None, store)
    assert again == scanned and len(calls) == 1  # read, not scanned
    # The entry names the commit, never the path of the tree (it is re-rooted where it is read).
    assert json.loads(entry.read_text())["head"] == scanned.head and "tree" not in json.loads(entry.read_text())


@pytest.mark.parametrize("damage", ["shape", "other-commit", "link", "not-json"])
def test_an_entry_not_of_this_commit_and_shape_is_scanned_again(tree: Path, tmp_path: Path, damage: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store.open(tmp_path / "cache")
    scanned = _kept(tree, None, store)
    (entry,) = (store.root / plancache.PLANS).iterdir()
    data = json.loads(entry.read_text())
    outside = tmp_path / "outside.json"
    if damage == "shape":
        data["units"][0][2] = "csrc/not-a-list.cuh"
        entry.write_text(json.dumps(data))
    elif damage == "other-commit":
        data["head"] = "0" * 40
        data["units"] = []
        entry.write_text(json.dumps(data))
    elif damage == "link":
        data["units"] = []
        outside.write_text(json.dumps(data))
        entry.unlink()
        entry.symlink_to(outside)
    else:
        entry.write_text("{" * 10)
    calls = _scans(monkeypatch)
    assert _kept(tree, None, store) == scanned and len(calls) == 1
    assert not entry.is_symlink() and json.loads(entry.read_text())["units"]  # written anew, in the cache
    if damage == "link":
        assert json.loads(outside.read_text())["units"] == []  # never written through the link


def test_a_new_commit_is_another_entry(tree: Path, tmp_path: Path) -> None:
    store = Store.open(tmp_path / "cache")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(tree), str(clone)], check=True)
    before = _kept(clone, _scan(tree).base, store)
    unit = before.units[0].path
    (clone / unit).write_text((clone / unit).read_text() + "\n// another commit\n")
    subprocess.run(["git", "-C", str(clone), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "x"],
                   check=True)
    after = _kept(clone, before.base, store)
    assert after.head != before.head and after == _scan(clone, before.base)
    assert len(list((store.root / plancache.PLANS).iterdir())) == 2
