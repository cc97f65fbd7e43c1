"""Cache of ``check`` results: a pin's series result is a pure function of its inputs.

``check`` runs on every PR and in every image build, mostly on inputs that did
not change.  What ``engine.run_series`` decides for a pin depends only on:

* the pin's base tree (and the deterministic base commit made from it);
* the ordered patches: each one's series, name, and the sha256 of the file
  actually used (a pin's variant replaces the series' file);
* the git that applies them (``git --version``);
* dsv4patch itself: its version and the source of every module that decides a
  result (engine, git with its pinned settings and environment allow-list,
  series, tree, lock, this module), so a local edit invalidates too.

The result is stored under ``checks/<sha256 of all that>.json`` in the store,
written atomically, and reused only when every input matches; anything else
(a new patch byte, another git, an edited engine) recomputes.  The lock's
expectations (``expect``, tree ids) are not inputs: they are compared with the
result afterwards, every run.

On a hit nothing parses a patch and nothing imports unidiff, rich or tomlkit:
the key needs the series files, the patch bytes and one ``git --version``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4patch import git, safeio
from dsv4patch.errors import Dsv4Error, PatchFileError
from dsv4patch.hashing import code_identity
from dsv4patch.records import frozen
from dsv4patch.series import results
from dsv4patch.seriesfile import read_patch_file, read_series_file, unlisted

if TYPE_CHECKING:
    from dsv4patch.pins import Lock, Pin
    from dsv4patch.store import Store

SCHEMA = "check-v1"
# Modules (relative to the package) whose code decides a check result.
DECIDING = ("series/engine.py", "series/results.py", "git.py", "series/patches.py", "seriesfile.py",
            "pins/repository.py", "pins/lock.py", "pins/source.py", "pins/sdist.py", "pins/gitsource.py", "pins/localsource.py",
            "series/checkcache.py")  # relative to dsv4patch/


@frozen
class Inputs:
    """Everything a pin's check result depends on (see the module docstring)."""

    base_tree: str
    base_commit: str
    patches: tuple[tuple[str, str, str], ...]  # (series, patch name, sha256 of the file used)
    git_version: str
    tool: str

    def key(self) -> str:
        src = json.dumps({"schema": SCHEMA, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(src.encode()).hexdigest()


def tool_identity() -> str:
    """dsv4patch's version and the sha256 of the modules that decide a result."""
    return code_identity(DECIDING)


def git_version(cwd: Path) -> str:
    return git.run(cwd, ["--version"], repo=False).stdout.strip()


def patch_files(lock: Lock, pin: Pin) -> list[tuple[str, str, Path, Path]] | None:
    """(series, name, file, the directory it lies below) in series order, variants substituted, as
    ``series_for_pin`` resolves them; None when that would fail (it then reports why on the slow path)."""
    out = []
    try:
        for sname in pin.series:
            spath = lock.series[sname].path
            for ppath in read_series_file(spath, below=lock.project):
                variant = pin.variants.get(ppath.name)
                out.append((sname, ppath.name, *((variant, lock.project) if variant is not None
                                                 else (ppath, spath.parent))))
        if unlisted([lock.series[s].path for s in pin.lock_series], set(pin.variants), below=lock.project):
            return None
    except Exception:
        return None
    return out


def inputs(lock: Lock, pin: Pin, base_tree: str, base_commit: str, git_ver: str,
           tool: str) -> Inputs | None:
    files = patch_files(lock, pin)
    if files is None:
        return None
    try:
        hashed = tuple((s, n, hashlib.sha256(read_patch_file(Path(p), n, below=b)).hexdigest())
                       for s, n, p, b in files)
    except (OSError, PatchFileError):  # the slow path reports it
        return None
    return Inputs(base_tree, base_commit, hashed, git_ver, tool)


def load(store: Store, key: str) -> results.SeriesResult | None:
    """The entry ``key``, or None: absent, damaged, from another layout (recomputed and replaced), or
    not a regular file in a real ``checks`` directory (a planted link is never read through)."""
    entries = store.root / "checks"
    try:
        if not stat.S_ISDIR(os.lstat(entries).st_mode):
            return None
        data = safeio.read_json(entries / f"{key}.json")
    except (OSError, Dsv4Error):
        return None
    try:
        return from_json(data)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def save(store: Store, key: str, result: results.SeriesResult) -> None:
    """Write atomically (a reader sees the whole entry or none) in a real ``checks`` directory (a link
    planted there is replaced, never written through); a full or read-only cache only loses the entry,
    never the check."""
    try:
        safeio.atomic_write(store.subdir("checks") / f"{key}.json", json.dumps(to_json(result)), durable=False)
    except (OSError, Dsv4Error):
        pass


def to_json(result: results.SeriesResult) -> dict[str, Any]:
    d = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    d["patches"] = [p.to_json() for p in result.patches]
    return d


def from_json(d: dict[str, Any]) -> results.SeriesResult:
    patches = []
    for p in d["patches"]:
        p = dict(p)
        p["status"] = results.Status(p["status"])
        p["hunks"] = [results.HunkNote(**h) for h in p.get("hunks", [])]
        patches.append(results.PatchResult(**p))
    return results.SeriesResult(**{**d, "patches": patches})
