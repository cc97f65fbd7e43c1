"""Moving a user's tree between states, atomically: the tree lock, the journal, recovery.

Everything that writes a vLLM source tree the user owns (``apply``,
``resolve``, ``refresh``, ``port --workspace``) goes through here, so a run
killed at any point is safe:

* The tree lock lives in the tree (``.git/dsv4patch.lock``, an flock), so two
  runs on one tree exclude each other whatever cache they use.  Its file
  descriptor is inherited by every git that writes the tree (``git.run(...,
  tied=True)``), which also dies with its parent: the lock is free only once
  no git started by the holder can still be writing the tree.
* The tree is a user's checkout: it is vetted and held through
  :mod:`dsv4patch.guard` (:func:`exclusive_checkout`, :func:`open_tree`), and no move
  overwrites a file the user did not commit (:func:`move_tree`, :func:`reset_tree`
  refuse untracked and ignored files on the paths they write).
* Before the journal exists nothing but objects and dsv4patch's own scratch
  files are written into the repository (``git status`` runs with
  ``--no-optional-locks``), so a run killed there leaves the tree as it was.
* :func:`move_tree` writes a journal (:class:`states.ApplyJournal`: from, to)
  before it moves HEAD, index and files, and removes it after.  With a
  journal, the next run (holding the tree lock) removes the lock files git
  left behind (``index.lock``, ref locks) when no process has them open,
  then :func:`recover` finishes the move to the journal's target only if
  HEAD, the index and every file are in one of the two states the journal
  names (or partly moved between them).  Anything else, a commit or an edit
  made since, is the user's: recovery refuses (exit 5) and touches nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from dsv4patch import git, guard, safeio
from dsv4patch.checkout import states
from dsv4patch.checkout.states import ApplyJournal
from dsv4patch.errors import TreeError, param, writing
from dsv4patch.progress import Progress
from dsv4patch.store import file_mutex

if TYPE_CHECKING:
    from dsv4patch.guard import Checkout
    from dsv4patch.pins import PinRepo
    from dsv4patch.series import Patch, Series, SeriesResult

JOURNAL = "dsv4patch-apply.json"
TREE_LOCK = "dsv4patch.lock"
SCRATCH_PREFIX = "dsv4patch-index-"  # git.scratch_index's temporary index files


def is_empty(path: Path) -> bool:
    """Whether ``path`` is absent or an empty directory (a tree :func:`open_tree` may create)."""
    return not (path.exists() and any(path.iterdir()))


def _mutex_file(lock: Path, where: Path) -> Path:
    """``lock``, created if needed; a tree we cannot write is the tree's problem (exit 5).

    A link or FIFO planted at the name is refused (:func:`safeio.open_regular`):
    taking the lock truncates the file and writes the holder's pid into it."""
    with writing(TreeError, str(where), f"dsv4patch needs to write in {where}; fix it, then run apply again"):
        lock.parent.mkdir(parents=True, exist_ok=True)
        os.close(safeio.open_regular(lock, os.O_RDWR | os.O_CREAT, 0o644, error=TreeError))
    return lock


@contextmanager
def exclusive_checkout(path: Path, role: str = "--tree", creatable: bool = False) -> Iterator[Checkout]:
    """Vet the existing tree ``path`` (:func:`guard.guarded`; ``creatable``: the caller creates absent
    trees) and hold its tree lock (``<git dir>/dsv4patch.lock``); yields the checkout."""
    with guard.guarded(path, role=role, creatable=creatable) as co:
        with file_mutex(_mutex_file(co.gitdir / TREE_LOCK, path), f"tree {path}", inherit=True):
            yield co


@contextmanager
def open_tree(path: Path, pinrepo: PinRepo, role: str = "--tree",
              progress: Progress | None = None) -> Iterator[tuple[Checkout, str | None]]:
    """Hold the tree lock of ``path``, creating the tree from the pin first if absent.

    Yields the vetted checkout and a note when the tree was created here (else None).
    A new tree is cloned next to ``path`` and renamed into place with its lock already
    held; a lock file beside it (``.NAME.dsv4patch-create.lock``, removed once the
    tree exists) keeps two creators apart.
    """
    if not is_empty(path):
        with exclusive_checkout(path, role, creatable=True) as co:
            yield co, None
        return
    create_lock = path.with_name(f".{path.name}.dsv4patch-create.lock")
    with file_mutex(_mutex_file(create_lock, path.parent), f"tree {path}", inherit=True):
        if not is_empty(path):  # another run created it while we waited
            with exclusive_checkout(path, role, creatable=True) as co:
                yield co, None
            return
        tmp = path.with_name(f".{path.name}.dsv4patch-tmp")
        advice = f"free space or fix permissions under {path.parent}, then run apply again"
        published = False
        # Until the rename, anything that ends the run (an error, an interrupt: also one that lands
        # while the lock below is taken) removes the half-made tree; only a kill leaves it, for the next run.
        try:
            shutil.rmtree(tmp, ignore_errors=True)  # left by a killed creator
            with writing(TreeError, str(path.parent), advice):
                tmp.parent.mkdir(parents=True, exist_ok=True)
                with (progress or Progress(False)).step(f"create {path}: vLLM {pinrepo.pin.vllm_version} "
                                                        f"checked out from the cache"):
                    git.clone_local(pinrepo.repo, tmp)
                    with guard.owned(tmp):  # dsv4patch's own clone: nothing of a user's in it yet
                        git.new_branch_checkout(tmp, f"vllm-{pinrepo.pin.name}", pinrepo.base_commit)
            with file_mutex(tmp / ".git" / TREE_LOCK, f"tree {path}", timeout=0, inherit=True):
                try:
                    os.rename(tmp, path)  # atomic; replaces an empty directory
                except OSError as exc:
                    raise TreeError(f"cannot create {path}: {exc.strerror or exc}") from None
                published = True
                create_lock.unlink(missing_ok=True)
                with guard.guarded(path, role=role) as co:
                    yield co, _created(path, pinrepo)
        except BaseException:
            if not published:  # once renamed, no tree is left at tmp (and what ends the caller is not ours)
                shutil.rmtree(tmp, ignore_errors=True)  # never leave a half-made tree
            raise


def _created(path: Path, pinrepo: PinRepo) -> str:
    """What ``apply`` says of a tree it made: the vLLM commit the lock pins (not the base commit
    dsv4patch made from the sdist, which no one else knows) and the tree's local branch."""
    pin = pinrepo.pin
    source = {"pypi-sdist": "its PyPI sdist", "git": "its git remote", "local": "its local checkout"}
    return (f"created {path}: vLLM {pin.vllm_version} (pin {pin.name}, vLLM commit {pin.commit[:12]}, "
            f"from {source.get(pin.source.kind, pin.source.kind)}) on branch vllm-{pin.name}")


# --- recovery -----------------------------------------------------------------------------


def _open_by(path: Path) -> int | None:
    """The pid of a process that has ``path`` open, if any (Linux /proc; else None)."""
    target = os.path.realpath(path)
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == target:
                    return int(entry.name)
            except OSError:
                continue
    return None


def _stale_git_locks(co: Checkout, ref: str | None) -> list[Path]:
    """Lock files a killed git left (index, HEAD, the branch); refuse live ones."""
    path = co.path
    candidates = [co.gitdir / "index.lock", co.gitdir / "HEAD.lock"]
    if ref:  # a branch (states.BRANCH): refs/heads/..., in the common directory (a linked worktree's too)
        candidates.append(co.commondir / f"{ref}.lock")
    stale = []
    for lock in candidates:
        if not lock.exists():
            continue
        pid = _open_by(lock)
        if pid is not None:
            raise TreeError(
                f"{lock} is held by a running process (pid {pid}); wait for that git command "
                f"to finish, then run apply again to finish the interrupted apply on {path}"
            )
        stale.append(lock)
    return stale


def _worktree_entries(path: Path, names: list[str]) -> dict[str, git.TreeEntry | None]:
    """Each path as it is in the work tree now, as a blob entry (None: absent or a directory)."""
    state: dict[str, git.TreeEntry | None] = {}
    regular: list[str] = []
    for name in names:
        full = path / name
        if full.is_symlink():
            data = os.fsencode(os.readlink(full))
            oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            state[name] = git.TreeEntry("120000", "blob", oid)
        elif full.is_file():
            regular.append(name)
        else:
            state[name] = None
    for name, oid in zip(regular, git.hash_paths(path, regular), strict=False):
        mode = "100755" if os.access(path / name, os.X_OK) else "100644"
        state[name] = git.TreeEntry(mode, "blob", oid)
    return state


def _half_written(path: Path, name: str, now: git.TreeEntry | None, target: git.TreeEntry | None) -> bool:
    """What a killed ``read-tree -m -u`` leaves of a file it was writing.

    git removes the old file, then creates and writes the new one: the file
    is absent, or a regular file holding the first bytes of its new content.
    """
    if now is None:
        return True
    if target is None or now.mode == "120000" or target.mode == "120000":
        return False
    data = (path / name).read_bytes()
    return git.cat_blob(path, target.oid).startswith(data)


def read_journal(journal: Path) -> ApplyJournal:
    """The journal of an interrupted move; TreeError (exit 5) when it is not one dsv4patch wrote."""
    try:
        return states.read(ApplyJournal, journal)
    except (OSError, ValueError):
        raise TreeError(
            f"{journal} (the journal of an interrupted apply) is unreadable; dsv4patch cannot tell "
            "which states it may move the tree between. Inspect the tree with `git status`, "
            "restore it yourself (e.g. `git reset --hard` to the commit you want), then delete "
            "the journal"
        ) from None


def interrupted(gitdir: Path) -> bool:
    """Whether a move of the tree was interrupted (a journal is there)."""
    return (gitdir / JOURNAL).exists()


def recover(co: Checkout) -> str | None:
    """Finish a move that was killed after it started moving the work tree.

    Called with the tree lock held.  Returns a note, None if there was nothing
    to recover; raises TreeError (exit 5) without touching anything when the
    tree holds a state the interrupted move did not make.  (The move refused
    untracked and ignored files on its paths before it started: what is there
    now is the move's.)
    """
    path, gitdir = co.path, co.gitdir
    journal = gitdir / JOURNAL
    if not journal.exists() and not journal.is_symlink():
        return None
    data = read_journal(journal)
    frm, to = data.frm, data.to
    for oid in (frm, to):
        if not git.has_object(path, f"{oid}^{{commit}}"):
            raise TreeError(
                f"{journal} names commit {oid[:12]}, which is not in {path}; delete the journal "
                "and restore the tree yourself"
            )
    stale = _stale_git_locks(co, data.ref)
    move = f"{frm[:12]} -> {to[:12]}"
    problems = _not_the_moves(path, frm, to, data.ref)
    if problems:
        raise TreeError(
            f"{path}: an apply was interrupted while moving the tree {move}, and the tree has "
            f"changed since in ways dsv4patch did not make: {'; '.join(problems)}. Nothing was "
            f"touched. To keep your changes, commit or stash them elsewhere, then either delete "
            f"{journal} and start again from a clean checkout of {frm[:12]} (or use a new "
            f"{param('tree')}), or run `git reset --hard {to[:12]}` (discards your changes) and delete "
            "the journal"
        )
    for lock in stale:  # no process has them open: left by a killed git
        lock.unlink(missing_ok=True)
    with writing(TreeError, str(path), "free space, then run apply again to finish the move"):
        git.reset_hard(path, to)
    journal.unlink()
    lock_note = f" (removed stale {', '.join(p.name for p in stale)})" if stale else ""
    return f"finished an interrupted apply: {move}{lock_note}"


def _not_the_moves(path: Path, frm: str, to: str, ref: str | None) -> list[str]:
    """What in the checkout the interrupted move from ``frm`` to ``to`` did not make: HEAD's
    branch and commit, the index, the files it moves and any others (empty: safe to finish)."""
    problems: list[str] = []
    cur_ref = git.current_ref(path)
    if ref is not None and cur_ref != ref:
        problems.append(f"HEAD is now on {cur_ref or 'a detached commit'}, not on {ref}")
    head = git.head(path)
    if head not in (frm, to):
        problems.append(f"HEAD is at {(head or 'nothing')[:12]}, a commit the apply did not make")
    index_at = [c for c in (frm, to) if git.index_is(path, c)]
    if not index_at:
        staged = git.staged_names(path, to)
        problems.append(f"the index has staged changes ({', '.join(staged[:5]) or '?'})")
    return problems + _files_not_the_moves(path, frm, to, index_at)


def _files_not_the_moves(path: Path, frm: str, to: str, index_at: list[str]) -> list[str]:
    """Files the move changes that hold neither side (nor a half-written new one while the index
    is still at ``frm``), and changed files the move does not touch."""
    problems: list[str] = []
    old, new = git.tree_files(path, frm), git.tree_files(path, to)
    moved = sorted(n for n in set(old) | set(new) if old.get(n) != new.get(n))
    now = _worktree_entries(path, moved)
    edited = [n for n in moved if now[n] not in (old.get(n), new.get(n))
              and not (index_at == [frm] and _half_written(path, n, now[n], new.get(n)))]
    if edited:
        problems.append(f"files the apply moves were edited: {', '.join(edited[:5])}"
                        f"{', ...' if len(edited) > 5 else ''}")
    moved_set = set(moved)
    other = [n for n in git.status_paths(path) if n not in moved_set]
    if other:
        problems.append(f"files the apply does not touch were changed or added: "
                        f"{', '.join(other[:5])}{', ...' if len(other) > 5 else ''}")
    return problems


def clean_scratch(gitdir: Path) -> None:
    """Scratch indexes and journal temp files a killed run left (ours by name; lock held)."""
    for leftover in gitdir.glob(f"{SCRATCH_PREFIX}*"):
        leftover.unlink(missing_ok=True)
    (gitdir / JOURNAL).with_suffix(".tmp").unlink(missing_ok=True)  # written by dsv4patch before safeio
    for leftover in gitdir.glob(f".{JOURNAL}.*.dsv4patch-tmp"):  # safeio.atomic_write's temporary files
        leftover.unlink(missing_ok=True)


# --- commits and the move ------------------------------------------------------------------


def commit_message(patch: Patch) -> str:
    """The message of the commit ``apply`` makes for ``patch``: its own, plus dsv4patch's trailers."""
    msg = patch.message.rstrip("\n") or patch.subject
    extra = f"Dsv4patch-Patch: {patch.name}\nDsv4patch-Series: {patch.series}\nDsv4patch-Sha256: {patch.sha256}\n"
    sep = "\n" if patch.trailers else "\n\n"
    return msg + sep + extra


def plan_commits(path: Path, base: str, series: Series, result: SeriesResult) -> list[str]:
    """Deterministic commits (objects only) for the patches that apply, in order."""
    by_name = {p.name: p for p in series.patches}
    commits: list[str] = []
    parent = base
    for r in result.patches:
        if not r.status.applies:
            continue
        patch = by_name[r.patch]
        parent = git.commit_tree(path, r.tree or "", parent, commit_message(patch), patch.author)
        commits.append(parent)
    return commits


def move_tree(co: Checkout, head: str, final: str, what: str = "the apply") -> None:
    """Move HEAD, index and work tree from ``head`` to ``final`` under a journal.

    Refused (TreeError, nothing touched) when a path ``final`` writes holds a file the
    user did not commit (untracked or ignored: :meth:`Checkout.in_the_way`)."""
    path, gitdir = co.path, co.gitdir
    co.refuse_in_the_way(final, what)
    journal = gitdir / JOURNAL
    record = ApplyJournal(frm=head, to=final, ref=git.current_ref(path), pid=os.getpid())
    states.write(journal, record, durable=True)
    # Under the journal: a run killed here leaves at most a stale index.lock, which recovery removes.
    git.refresh_index(path)
    git.checkout_to(path, head, final)
    journal.unlink()


def reset_tree(co: Checkout, commit: str, what: str) -> None:
    """``git reset --hard commit`` on the checkout, unless a path it writes holds a file the user
    did not commit (untracked or ignored; ``reset --hard`` would delete it): then TreeError."""
    co.refuse_in_the_way(commit, what)
    git.reset_hard(co.path, commit)
