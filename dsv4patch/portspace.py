"""The conflict workspace ``port --workspace DIR`` leaves, and how the next run reads it back.

A port that stops at a conflict otherwise writes nothing and leaves the
maintainer with the two sides of each hunk: resolving meant applying the
series by hand on the new pin and passing the results with
``--resolutions``.  With ``--workspace DIR`` the port instead leaves DIR as a
git tree of the new pin with

* the patches before the conflict committed, as the port carried them
  (kept, refreshed, merged or taken from ``--resolutions``);
* the conflicting patch merged into the work tree: the files that merged
  cleanly with their merged text, the others with diff3 conflict markers
  (``target`` / ``base`` / ``patch``);
* a state file in the tree's git directory (``.git/dsv4patch-port.json``)
  naming the lock, both pins, the new pin's base commit, the patch and the
  commit the resolution goes on.

Running the same ``port`` command again with the same ``--workspace`` turns
the edited tree into that patch's resolution (a ``format-patch`` of it on the
committed prefix, kept in ``.git/dsv4patch-port/``), and ports again with
those resolutions beside ``--resolutions``: the next conflict reopens the
workspace at that patch, or the port completes and writes its result as
usual (then the state file is removed; the tree stays for inspection).

DIR is a tree the user edits, so, as with ``resolve``, its state
(:class:`states.PortState`) is checked (full commit ids, paths inside the tree,
the invocation's own pins and lock) and never chooses where anything is written.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from dsv4patch import git, safeio, states, tree
from dsv4patch.errors import TreeError
from dsv4patch.series import Patch
from dsv4patch.states import PortState, inside_tree

STATE = "dsv4patch-port.json"
RESOLVED = "dsv4patch-port"  # under the git dir: the resolutions collected so far
_MARKER = re.compile(r"^(<{7} |>{7} |<{7}$|>{7}$)", re.M)


def marked(path: Path, names: list[str]) -> list[str]:
    """The files among ``names`` (under ``path``) that still hold conflict markers (also ``resolve``'s check)."""
    return [n for n in names if (path / n).is_file() and not (path / n).is_symlink()
            and _MARKER.search((path / n).read_text(encoding="utf-8", errors="replace"))]


def read_state(path: Path) -> PortState | None:
    """The workspace's state, None when DIR does not exist or is empty (a new workspace)."""
    if not path.exists() or not any(path.iterdir()):
        return None
    if not git.is_repo_root(path):
        raise TreeError(f"--workspace {path} is neither empty nor a workspace `port --workspace` made; "
                        "use a new directory")
    sp = git.git_dir(path) / STATE
    if not sp.exists():
        raise TreeError(f"--workspace {path} is a git tree without a port workspace ({sp} is missing); "
                        "use a new directory")
    try:
        return states.read(PortState, sp)
    except (OSError, ValueError) as exc:
        raise TreeError(f"{sp} (the port workspace's state) is unreadable ({exc}); use a new directory "
                        "for --workspace") from None


def check_matches(state: PortState, path: Path, lock: Path, src: str, dst: str, base_commit: str) -> None:
    """The workspace must have been opened by this very port (same lock, pins and new base commit)."""
    have = state.to_json()
    want = {"lock": os.path.abspath(lock), "from": src, "to": dst, "base_commit": base_commit}
    differ = [f"{k} {have[k]!r} (this run: {v!r})" for k, v in want.items() if have[k] != v]
    if differ:
        raise TreeError(f"--workspace {path} was opened by another port: {'; '.join(differ)}; run that "
                        "port again, or use a new directory")


def collect(path: Path, state: PortState, patch: Patch, number: int, total: int) -> Path:
    """Turn the edited work tree into ``patch``'s resolution; returns the directory of resolutions."""
    tree.check_target_tree(path)
    touched = sorted(set(state.conflicts) | set(patch.touched))
    left = marked(path, touched)
    if left:
        raise TreeError(f"{', '.join(left)} in {path} still hold conflict markers; edit them (keep the code "
                        "you want, remove the <<<<<<< ||||||| ======= >>>>>>> lines), then run the port again")
    text = resolution_patch(path, state.at, patch, number, total)
    if text is None:
        raise TreeError(f"the resolution of {patch.name} in {path} changes nothing; make the change the "
                        "patch must make on this pin, then run the port again")
    out = _resolved_dir(path)
    out.mkdir(exist_ok=True)
    safeio.atomic_write(out / patch.name, text)
    return out


def _resolved_dir(path: Path) -> Path:
    """``<git dir>/dsv4patch-port``: a real directory or nothing; a planted link is refused (exit 5)."""
    d = git.git_dir(path) / RESOLVED
    if os.path.islink(d) or (os.path.lexists(d) and not d.is_dir()):
        raise TreeError(f"{d} is a symbolic link or not a directory: dsv4patch did not make it, and does "
                        "not write through it; remove it, then run the port again")
    return d


def resolution_patch(path: Path, at: str, patch: Patch, number: int, total: int) -> str | None:
    """The edited work tree of ``path`` as ``patch`` on commit ``at``: format-patch text, None if it changes nothing.

    Stages everything (``git add -A``), commits it on ``at`` with the
    patch's message and author, numbered ``number``/``total``.  Shared by
    ``port --workspace`` and ``resolve --continue``.
    """
    git.add_all(path)
    resolved = git.write_tree(path, {})
    if resolved == git.out(path, "rev-parse", f"{at}^{{tree}}"):
        return None
    commit = git.commit_tree(path, resolved, at, patch.message or patch.subject + "\n", patch.author)
    return git.format_patch(path, commit, number, total)


def resolutions(path: Path) -> Path | None:
    """The directory of resolutions the workspace collected so far, if any."""
    d = _resolved_dir(path)
    return d if d.is_dir() else None


def combine(dest: Path, *dirs: Path | None) -> Path:
    """One resolutions directory: the files of ``dirs`` in order, later ones winning."""
    dest.mkdir(parents=True, exist_ok=True)
    for d in dirs:
        if d is None or not d.is_dir():
            continue
        for f in sorted(d.iterdir()):
            if f.is_file() and not f.is_symlink() and not f.name.startswith("."):
                shutil.copyfile(f, dest / f.name)
    return dest


def open_workspace(path: Path, new_base: str, prefix: list[tuple[Patch, str]], patch: Patch,
                   merged: dict[str, bytes], conflicts: list[str], *, lock: Path, src: str, dst: str) -> str:
    """Put ``path`` (a tree of the new pin) at the ported prefix, write ``patch``'s merge; the prefix's commit.

    ``prefix``: each carried patch before the conflict with its text, in
    order; ``merged``: file -> merged contents (conflict markers where the
    3-way merge could not decide); ``lock``, ``src``, ``dst``: the port's lock
    and pins, recorded in the state.  The tree's lock is held by the caller.
    """
    tree.check_target_tree(path)
    parent = new_base
    scratch = git.git_dir(path) / "dsv4patch-port-patch.tmp"
    try:
        for p, text in prefix:
            safeio.atomic_write(scratch, text, durable=False)  # a link planted at the name is replaced
            with git.scratch_index(path, parent) as env:
                res = git.apply(path, scratch, env=env)
                if not res.ok:
                    raise TreeError(f"{p.name}: the ported patch does not apply in {path}: {res.stderr.strip()}")
                parent = git.commit_tree(path, git.write_tree(path, env), parent, p.message or p.subject + "\n",
                                         p.author)
    finally:
        scratch.unlink(missing_ok=True)
    git.reset_hard(path, parent)
    root = path.resolve()
    for name, data in merged.items():
        target = path / name
        where = target.parent.resolve()
        if not inside_tree(name) or target.is_symlink() or (where != root and root not in where.parents):
            raise TreeError(f"{patch.name}: {name} is not a file inside {path}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    states.write(git.git_dir(path) / STATE, PortState(
        lock=os.path.abspath(lock), frm=src, to=dst, patch=patch.name, base_commit=new_base, at=parent,
        conflicts=sorted(conflicts)))
    return parent


def close(path: Path) -> None:
    """The port completed: the workspace has no conflict left."""
    (git.git_dir(path) / STATE).unlink(missing_ok=True)
