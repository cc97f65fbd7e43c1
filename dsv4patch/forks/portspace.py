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

DIR may also be the fork's own checkout when the port goes to that fork (its
HEAD has the new pin's content; the caller, :mod:`dsv4patch.forks.porting`, decides):
the ported patches then go on the fork's HEAD, not on a synthetic root commit,
and HEAD is detached while the workspace is open, so no branch of the fork
moves.  When the port completes, or ``port --abort`` gives it up
(:func:`restore`), HEAD goes back to that commit, on the branch it was on; the
state and the collected resolutions are removed.  The fork's commits,
branches, remotes and config are never rewritten (issue 28).

DIR is a tree the user edits, so, as with ``resolve``, its state
(:class:`states.PortState`) is checked (full commit ids, paths inside the tree,
a branch under ``refs/heads/``, the invocation's own pins and lock) and never
chooses where anything is written; it is read and written through
:mod:`safeio` (a link planted at its name is refused, never followed).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from dsv4patch import git, guard, safeio
from dsv4patch.checkout import (
    PortState,
    inside_tree,
    marked_files,
    move_tree,
    read_state_file,
    reset_tree,
    resolution_patch,
    write_state_file,
)
from dsv4patch.errors import TreeError, param
from dsv4patch.nextstep import Step, mention

if TYPE_CHECKING:
    from dsv4patch.guard import Checkout
    from dsv4patch.series import Patch

STATE = "dsv4patch-port.json"
RESOLVED = "dsv4patch-port"  # under the git dir: the resolutions collected so far
# The operations that move a workspace, as messages name them (``port --workspace``, ``port --abort``).
PORT_WORKSPACE = mention(Step.of("port", workspace=True), bare=True)
PORT_ABORT = mention(Step.of("port", abort=True), bare=True)


def state_path(path: Path) -> Path:
    """Where the workspace's state lives: in the git directory of ``path`` (held vetted)."""
    return git.git_dir(path) / STATE


def read_state(path: Path) -> PortState | None:
    """The workspace's state; None when DIR does not exist, is empty (a new workspace) or is a
    git tree without one (whether it may become one is the caller's to decide).  DIR is vetted
    (:func:`guard.guarded`) before git reads it."""
    if not path.exists() or not any(path.iterdir()):
        return None
    if not guard.is_checkout_root(path):
        raise TreeError(f"{param('workspace')} {path} is neither empty nor a workspace `{PORT_WORKSPACE}` "
                        "made; use a new directory")
    with guard.guarded(path, role=param("workspace")) as co:
        return _read_state(co.gitdir / STATE)


def _read_state(sp: Path) -> PortState | None:
    if not os.path.lexists(sp):
        return None
    try:
        return read_state_file(PortState, sp)
    except (OSError, ValueError) as exc:
        raise TreeError(f"{sp} (the port workspace's state) is unreadable ({exc}); use a new directory "
                        f"for {param('workspace')}") from None


def check_matches(state: PortState, path: Path, lock: Path, src: str, dst: str, base_commit: str) -> None:
    """The workspace must have been opened by this very port (same lock, pins and new base commit)."""
    have = state.to_json()
    want = {"lock": os.path.abspath(lock), "from": src, "to": dst, "base_commit": base_commit}
    differ = [f"{k} {have[k]!r} (this run: {v!r})" for k, v in want.items() if have[k] != v]
    if differ:
        raise TreeError(f"{param('workspace')} {path} was opened by another port: {'; '.join(differ)}; run "
                        "that port again, or use a new directory")


def collect(path: Path, state: PortState, patch: Patch, number: int, total: int) -> Path:
    """Turn the edited work tree into ``patch``'s resolution; returns the directory of resolutions
    (the tree held vetted by the caller)."""
    touched = sorted(set(state.conflicts) | set(patch.touched))
    left = marked_files(path, touched)
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


def open_workspace(co: Checkout, new_base: str, prefix: list[tuple[Patch, str]], patch: Patch,
                   merged: dict[str, bytes], conflicts: list[str], *, lock: Path, src: str, dst: str,
                   own: bool = False, orig_ref: str | None = None) -> str:
    """Put ``path`` (a tree of the new pin) at the ported prefix, write ``patch``'s merge; the prefix's commit.

    ``prefix``: each carried patch before the conflict with its text, in
    order; ``merged``: file -> merged contents (conflict markers where the
    3-way merge could not decide); ``lock``, ``src``, ``dst``: the port's lock
    and pins, recorded in the state.  ``own``: ``path`` is the fork's own
    checkout, ``new_base`` its HEAD when the port began, on branch ``orig_ref``:
    HEAD is detached first (no branch moves), the state written before the
    tree moves (so ``port --abort`` can put it back from any point), and the
    move made under the apply journal (:func:`transaction.move_tree`).  The
    tree's lock is held by the caller.  Nothing the user did not commit is overwritten:
    a path the prefix or the merge writes that holds an untracked or ignored file is
    refused before anything moves.
    """
    path = co.path
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
    co.refuse_in_the_way(parent, PORT_WORKSPACE, extra=sorted(merged))
    state = PortState(lock=os.path.abspath(lock), frm=src, to=dst, patch=patch.name, base_commit=new_base,
                      at=parent, conflicts=sorted(conflicts), own=own, orig_ref=orig_ref if own else None)
    if own:
        head = git.head(path)
        ref = git.current_ref(path)
        if head is None or (ref is not None and (ref != orig_ref or head != new_base)):
            raise TreeError(f"{path}: HEAD is on {ref or 'no commit'}, not where the port workspace left it; "
                            f"nothing was touched: run `{mention(Step.of('port', abort=True, workspace=path))}`")
        if ref is not None:
            git.detach_head(path, head, "dsv4patch port --workspace: the fork's branch stays where it is")
        write_state_file(state_path(path), state)
        # a reopened workspace: the last resolution is collected already
        reset_tree(co, head, PORT_WORKSPACE)
        if head != parent:
            move_tree(co, head, parent, PORT_WORKSPACE)
    else:
        reset_tree(co, parent, PORT_WORKSPACE)
    root = path.resolve()
    for name, data in merged.items():
        target = path / name
        where = target.parent.resolve()
        if not inside_tree(name) or target.is_symlink() or (where != root and root not in where.parents):
            raise TreeError(f"{patch.name}: {name} is not a file inside {path}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    if not own:
        write_state_file(state_path(path), state)
    return parent


def close(path: Path) -> None:
    """The port completed: the workspace has no conflict left."""
    state_path(path).unlink(missing_ok=True)


def restore(co: Checkout, state: PortState) -> str:
    """Close the workspace ``state`` describes (the port completed, or ``port --abort``); a note.

    The fork's own checkout goes back to the commit the port began at, on the
    branch it was on (only when that branch is still there, else HEAD stays
    detached there and the note says so); its state and the collected
    resolutions are removed.  A workspace dsv4patch made keeps its tree and
    resolutions: only the state is removed.  The tree's lock is held by the caller.
    """
    path = co.path
    if not state.own:
        close(path)
        return f"{path} is no longer a port workspace (the directory can be deleted)"
    if not git.has_object(path, f"{state.base_commit}^{{commit}}"):
        raise TreeError(f"{state_path(path)} names base_commit {state.base_commit[:12]}, a commit {path} does "
                        "not have: dsv4patch did not write this state; nothing was touched. Put the checkout "
                        "back yourself (`git switch` to your branch) and delete the file")
    ref = git.current_ref(path)
    if ref is not None and (ref != state.orig_ref or git.ref_commit(path, ref) != state.base_commit):
        raise TreeError(f"{path}: HEAD is on {ref}, where the port workspace did not leave it; nothing "
                        f"was touched (dsv4patch does not move your branch): `git -C {path} switch "
                        f"--detach {state.at}`, then run this again")
    git.add_all(path)  # so files the workspace added go too (the checkout was clean when it opened)
    reset_tree(co, state.base_commit, PORT_ABORT)  # HEAD is detached: no branch moves
    where = f"HEAD detached at {state.base_commit[:12]}"
    if state.orig_ref is not None:
        branch = state.orig_ref.removeprefix("refs/heads/")
        now = git.ref_commit(path, state.orig_ref)
        elsewhere = co.branch_elsewhere(state.orig_ref)
        if now == state.base_commit and elsewhere is not None:
            where += (f" (branch {branch} is checked out in your worktree {elsewhere} now; "
                      f"`git -C {path} switch {branch}` once it is not)")
        elif now == state.base_commit:
            git.attach_head(path, state.orig_ref, "dsv4patch port: the workspace is closed")
            where = f"on branch {branch} at {state.base_commit[:12]}"
        else:
            where += (f" (branch {branch} {'is gone' if now is None else 'moved to ' + now[:12]} since; "
                      f"`git -C {path} switch {branch}` when you want it)")
    resolved = _resolved_dir(path)
    if resolved.is_dir():
        shutil.rmtree(resolved)
    close(path)
    return f"{path} is back where the port found it: {where}"
