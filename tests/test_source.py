"""dsv4patch.pins.source: a new source kind is one class and its registration.

The kind here exists only in this test: a plain directory of files (no git, no sdist).
Registered, the lock accepts it and ``check``, ``apply`` and ``status --tree`` run with
it through the real code path (the cache's pin repository, the engine, the checkout
transaction); unregistered, the lock refuses it and names the kinds there are.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import MINI_FILES, pin_table, write_lock
from dsv4patch.errors import EXIT_INPUT, FetchError
from dsv4patch.pins import source
from dsv4patch.pins.lock import LockTable, Pin, Source
from dsv4patch.progress import Progress
from dsv4patch.store import Store


class DirectorySource:
    """A pin's files as a plain directory beside the lock; its content is its identity."""

    kind = "directory"
    keys = frozenset({"path"})
    fork = False
    checks_base_tree = True

    def parse(self, table: LockTable) -> Source:
        return Source(kind=self.kind, path=(table.lock_path.parent / table.get("path", str)).resolve())

    def cache_key(self, pin: Pin) -> str:
        return f"directory-{pin.commit}"

    def check_checkout(self, pin: Pin, own_tree: Path | None) -> None:
        assert pin.source.path is not None
        if not pin.source.path.is_dir():
            raise FetchError(f"pin {pin.name}: {pin.source.path} is not a directory")

    def fetch_files(self, pin: Pin, store: Store, dest: Path, progress: Progress, own_tree: Path | None) -> None:
        assert pin.source.path is not None
        shutil.copytree(pin.source.path, dest, dirs_exist_ok=True, symlinks=True)

    def describe(self, src: Source) -> str:
        return f"the directory {src.path}"

    def checkout_path(self, src: Source) -> Path | None:
        return None

    def to_entry(self, src: Source, lock_dir: Path) -> dict[str, Any]:
        return {"kind": self.kind, "path": str(src.path)}


@pytest.fixture
def directory_kind() -> Iterator[None]:
    source.register(DirectorySource())
    yield
    source.unregister("directory")


def _lock(tmp_path: Path, upstream) -> Path:
    files = tmp_path / "files"
    for rel, text in MINI_FILES.items():
        (files / rel).parent.mkdir(parents=True, exist_ok=True)
        (files / rel).write_text(text)
    d = tmp_path / "lock"
    d.mkdir()
    upstream.patch(d / "0001-a.patch", "a", {"vllm/envs.py": MINI_FILES["vllm/envs.py"] + "X = 1\n"}, "a")
    pin = pin_table("p", "d" * 40, {"kind": "directory", "path": "../files"})
    return write_lock(d / "l.toml", {"p": pin}, {"main": ["0001-a.patch"]})


def test_an_unregistered_kind_is_refused_with_the_kinds_there_are(tmp_path, upstream, cli):
    res = cli("check", "--lock", _lock(tmp_path, upstream), "--cache-dir", tmp_path / "cache")
    assert res.rc == EXIT_INPUT
    assert "kind = 'directory'; one of pypi-sdist, git, local" in res.err


def test_a_registered_kind_runs_check_apply_and_status(tmp_path, upstream, cli, directory_kind):
    lock, cache, tree = _lock(tmp_path, upstream), tmp_path / "cache", tmp_path / "tree"
    res = cli("check", "--lock", lock, "--cache-dir", cache, "--format", "json")
    assert res.rc == 0, res.err
    pin = json.loads(res.out)["pins"]["p"]
    assert pin["source"] == "directory" and pin["patches"]["0001-a.patch"]["status"] == "clean"
    assert (cache / "trees" / f"directory-{'d' * 40}.git").is_dir()  # the kind's cache key
    res = cli("apply", "--lock", lock, "--pin", "p", "--tree", tree, "--cache-dir", cache, "--no-build",
              "--format", "json")
    assert res.rc == 0, res.err
    assert (tree / "vllm/envs.py").read_text().endswith("X = 1\n")
    res = cli("status", "--lock", lock, "--tree", tree, "--format", "json")
    assert res.rc == 0, res.err
    assert json.loads(res.out)["patches"]["0001-a.patch"]["state"] == "applied"
    # The files are the kind's: a pin whose directory is gone is refused before anything runs.
    shutil.rmtree(tmp_path / "files")
    res = cli("check", "--lock", lock, "--cache-dir", cache, "--no-cache")
    assert res.rc != 0 and "is not a directory" in res.err


def test_a_kind_is_registered_once() -> None:
    source.register(DirectorySource())
    try:
        with pytest.raises(ValueError, match="registered already"):
            source.register(DirectorySource())
    finally:
        source.unregister("directory")
