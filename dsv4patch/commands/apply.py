"""``dsv4patch apply``: check, then commit each patch into the tree, atomically.

The series is first run through :func:`engine.run_series` in a scratch index
of the target repository (exactly what ``check`` does).  Only when every patch
has its expected status and the final tree id is the lock's does the work
tree move, in one step: the new commits are created as objects, a journal
records (from, to), the work tree and HEAD are switched, and the journal is
removed.

Why a run killed at any point is safe:

* The tree lock lives in the tree (``.git/dsv4patch.lock``, an flock), so two
  runs on one tree exclude each other whatever cache they use.  Its file
  descriptor is inherited by every git that writes the tree (``git.run(...,
  tied=True)``), which also dies with its parent: the lock is free only once
  no git started by the holder can still be writing the tree.
* Before the journal exists nothing but objects and dsv4patch's own scratch
  files are written into the repository (``git status`` runs with
  ``--no-optional-locks``), so a run killed there leaves the tree as it was.
* With a journal, the next run (holding the tree lock) removes the lock files
  git left behind (``index.lock``, ref locks) when no process has them open,
  then *recovers*: it finishes the move to the journal's target only if HEAD,
  the index and every file are in one of the two states the journal names
  (or partly moved between them).  Anything else, a commit or an edit made
  since, is the user's: recovery refuses (exit 5) and touches nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dsv4patch import engine, git, report, tree
from dsv4patch.commands import _common, resolve
from dsv4patch.commands.check import pin_report
from dsv4patch.errors import EXIT_OK, EXIT_UNEXPECTED, BuildError, TreeError, writing
from dsv4patch.lock import Pin
from dsv4patch.series import Patch, Series, series_for_pin
from dsv4patch.store import file_lock

HELP = "apply a pin's patch series to a tree as commits (creates the tree if absent)"
JOURNAL = "dsv4patch-apply.json"
TREE_LOCK = "dsv4patch.lock"
SCRATCH_PREFIX = "dsv4patch-index-"  # git.scratch_index's temporary index files
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
DEFAULT_TREE_DIR = "vllm-src"  # without --tree: ./vllm-src/<pin> under the current directory


def add_parser(sub: Any) -> None:
    p = sub.add_parser("apply", help=HELP, description=HELP)
    _common.add_lock(p, many=False)
    p.add_argument("--tree", type=Path, default=None,
                   help=f"the vLLM source tree to patch (default: ./{DEFAULT_TREE_DIR}/<pin>)")
    p.add_argument(
        "--no-build", dest="build", action="store_false",
        help="do not rebuild the CUDA kernels the patches touch (then run `dsv4patch build` "
        "before shipping: without it the kernel fixes are not in effect)",
    )
    p.add_argument("--out", type=Path, default=None, help="where the kernel wheel goes (default: ./dist)")
    p.add_argument("--python", default=None,
                   help="kernel build: interpreter whose torch the kernels are built against "
                        "(default: $DSV4PATCH_TORCH_PYTHON, else this one)")
    p.add_argument("--nvcc", default=None, help="kernel build: nvcc to use (default: $CUDA_HOME/bin/nvcc or PATH)")
    p.add_argument(
        "--3way", dest="three_way", action="store_true",
        help="on a conflict, commit the patches before it, apply the failing one 3-way with "
        "conflict markers and stop; then `dsv4patch resolve --continue` or `--abort`",
    )
    _common.add_output(p)
    _common.add_cache(p)


def _is_empty(path: Path) -> bool:
    return not (path.exists() and any(path.iterdir()))


def _git_dir(path: Path) -> Path:
    if not git.is_repo_root(path):
        raise TreeError(
            f"{path} is not the root of a git repository; point --tree at a new directory "
            "and dsv4patch creates the tree from the pin"
        )
    return git.git_dir(path)


def _lock_file(lock: Path, where: Path) -> Path:
    """``lock``, created if needed; a tree we cannot write is the tree's problem (exit 5)."""
    with writing(TreeError, str(where), f"dsv4patch needs to write in {where}; fix it, then run apply again"):
        lock.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(lock, os.O_RDWR | os.O_CREAT, 0o644))
    return lock


@contextmanager
def tree_lock(path: Path) -> Iterator[None]:
    """Hold ``path``'s tree lock (``<git dir>/dsv4patch.lock``) for an existing tree."""
    with file_lock(_lock_file(_git_dir(path) / TREE_LOCK, path), f"tree {path}", inherit=True):
        yield


@contextmanager
def open_tree(path: Path, pinrepo: tree.PinRepo, notes: list[str]) -> Iterator[None]:
    """Hold the tree lock of ``path``, creating the tree from the pin first if absent.

    A new tree is cloned next to ``path`` and renamed into place with its
    lock already held; a lock file beside it (``.NAME.dsv4patch-create.lock``,
    removed once the tree exists) keeps two creators apart.
    """
    if not _is_empty(path):
        with tree_lock(path):
            yield
        return
    create_lock = path.with_name(f".{path.name}.dsv4patch-create.lock")
    with file_lock(_lock_file(create_lock, path.parent), f"tree {path}", inherit=True):
        if not _is_empty(path):  # another run created it while we waited
            with tree_lock(path):
                yield
            return
        tmp = path.with_name(f".{path.name}.dsv4patch-tmp")
        advice = f"free space or fix permissions under {path.parent}, then run apply again"
        shutil.rmtree(tmp, ignore_errors=True)  # left by a killed creator
        try:
            with writing(TreeError, str(path.parent), advice):
                tmp.parent.mkdir(parents=True, exist_ok=True)
                git.clone_local(pinrepo.repo, tmp)
                git.run(tmp, ["remote", "remove", "origin"], tied=True)
                git.run(tmp, ["checkout", "-q", "-B", f"vllm-{pinrepo.pin.name}",
                              pinrepo.base_commit], tied=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # never leave a half-made tree
            raise
        with file_lock(tmp / ".git" / TREE_LOCK, f"tree {path}", timeout=0, inherit=True):
            try:
                os.rename(tmp, path)  # atomic; replaces an empty directory
            except OSError as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                raise TreeError(f"cannot create {path}: {exc.strerror or exc}") from None
            create_lock.unlink(missing_ok=True)
            notes.append(f"created {path} from pin {pinrepo.pin.name} at {pinrepo.base_commit[:12]}")
            yield


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


def _stale_git_locks(path: Path, gitdir: Path, ref: str | None) -> list[Path]:
    """Lock files a killed git left (index, HEAD, the branch); refuse live ones."""
    candidates = [gitdir / "index.lock", gitdir / "HEAD.lock"]
    if ref:
        candidates.append(gitdir / f"{ref}.lock")
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


def _entries(path: Path, commit: str) -> dict[str, tuple[str, str]]:
    """{path: (mode, blob id)} of every file in ``commit``."""
    res = git.run(path, ["ls-tree", "-r", "-z", "--full-tree", commit])
    out: dict[str, tuple[str, str]] = {}
    for item in res.stdout.split("\0"):
        if not item:
            continue
        meta, name = item.split("\t", 1)
        mode, _typ, oid = meta.split()
        out[name] = (mode, oid)
    return out


def _worktree_entries(path: Path, names: list[str]) -> dict[str, tuple[str, str] | None]:
    """(mode, blob id) of each path as it is in the work tree now (None: absent or a directory)."""
    state: dict[str, tuple[str, str] | None] = {}
    regular: list[str] = []
    for name in names:
        full = path / name
        if full.is_symlink():
            data = os.fsencode(os.readlink(full))
            oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            state[name] = ("120000", oid)
        elif full.is_file():
            regular.append(name)
        else:
            state[name] = None
    if regular:
        oids = git.run(path, ["hash-object", "--stdin-paths"], input="\n".join(regular) + "\n")
        for name, oid in zip(regular, oids.stdout.split()):
            mode = "100755" if os.access(path / name, os.X_OK) else "100644"
            state[name] = (mode, oid)
    return state


def _half_written(path: Path, name: str, now: tuple[str, str] | None, target: tuple[str, str] | None) -> bool:
    """What a killed ``read-tree -m -u`` leaves of a file it was writing.

    git removes the old file, then creates and writes the new one: the file
    is absent, or a regular file holding the first bytes of its new content.
    """
    if now is None:
        return True
    if target is None or now[0] == "120000" or target[0] == "120000":
        return False
    data = (path / name).read_bytes()
    return git.cat_blob(path, target[1]).startswith(data)


def _status_paths(path: Path) -> list[str]:
    res = git.run(path, ["--no-optional-locks", "status", "--porcelain=v1", "-z", "--no-renames",
                         "--untracked-files=all"])
    return [item[3:] for item in res.stdout.split("\0") if item]


def _read_journal(journal: Path) -> dict[str, Any]:
    try:
        data = json.loads(journal.read_text(encoding="utf-8"))
        ok = isinstance(data, dict) and all(
            isinstance(data.get(k), str) and _HEX40.match(data[k]) for k in ("from", "to"))
    except (OSError, ValueError):
        ok = False
    if not ok:
        raise TreeError(
            f"{journal} (the journal of an interrupted apply) is unreadable; dsv4patch cannot tell "
            "which states it may move the tree between. Inspect the tree with `git status`, "
            "restore it yourself (e.g. `git reset --hard` to the commit you want), then delete "
            "the journal"
        )
    return data


def recover(path: Path, gitdir: Path | None = None) -> str | None:
    """Finish an apply that was killed after it started moving the work tree.

    Called with the tree lock held.  Returns a note, None if there was nothing
    to recover; raises TreeError (exit 5) without touching anything when the
    tree holds a state the interrupted apply did not make.
    """
    gitdir = gitdir or _git_dir(path)
    journal = gitdir / JOURNAL
    if not journal.exists():
        return None
    data = _read_journal(journal)
    frm, to, ref = data["from"], data["to"], data.get("ref")
    for oid in (frm, to):
        if not git.has_object(path, f"{oid}^{{commit}}"):
            raise TreeError(
                f"{journal} names commit {oid[:12]}, which is not in {path}; delete the journal "
                "and restore the tree yourself"
            )
    stale = _stale_git_locks(path, gitdir, ref)
    move = f"{frm[:12]} -> {to[:12]}"
    problems: list[str] = []
    cur_ref = git.run(path, ["symbolic-ref", "-q", "HEAD"], check=False).stdout.strip() or None
    if ref is not None and cur_ref != ref:
        problems.append(f"HEAD is now on {cur_ref or 'a detached commit'}, not on {ref}")
    head = git.head(path)
    if head not in (frm, to):
        problems.append(f"HEAD is at {(head or 'nothing')[:12]}, a commit the apply did not make")
    index_at = [c for c in (frm, to)
                if git.run(path, ["diff-index", "--cached", "--quiet", "--no-renames", c, "--"],
                           check=False).ok]
    if not index_at:
        staged = git.run(path, ["diff-index", "--cached", "--name-only", "--no-renames", to, "--"],
                         check=False).stdout.split()
        problems.append(f"the index has staged changes ({', '.join(staged[:5]) or '?'})")
    old, new = _entries(path, frm), _entries(path, to)
    moved = sorted(n for n in set(old) | set(new) if old.get(n) != new.get(n))
    now = _worktree_entries(path, moved)
    edited = [n for n in moved if now[n] not in (old.get(n), new.get(n))
              and not (index_at == [frm] and _half_written(path, n, now[n], new.get(n)))]
    if edited:
        problems.append(f"files the apply moves were edited: {', '.join(edited[:5])}"
                        f"{', ...' if len(edited) > 5 else ''}")
    moved_set = set(moved)
    other = [n for n in _status_paths(path) if n not in moved_set]
    if other:
        problems.append(f"files the apply does not touch were changed or added: "
                        f"{', '.join(other[:5])}{', ...' if len(other) > 5 else ''}")
    if problems:
        raise TreeError(
            f"{path}: an apply was interrupted while moving the tree {move}, and the tree has "
            f"changed since in ways dsv4patch did not make: {'; '.join(problems)}. Nothing was "
            f"touched. To keep your changes, commit or stash them elsewhere, then either delete "
            f"{journal} and start again from a clean checkout of {frm[:12]} (or use a new "
            f"--tree), or run `git reset --hard {to[:12]}` (discards your changes) and delete "
            "the journal"
        )
    for lock in stale:  # no process has them open: left by a killed git
        lock.unlink(missing_ok=True)
    with writing(TreeError, str(path), "free space, then run apply again to finish the move"):
        git.reset_hard(path, to)
    journal.unlink()
    lock_note = f" (removed stale {', '.join(p.name for p in stale)})" if stale else ""
    return f"finished an interrupted apply: {move}{lock_note}"


def _clean_scratch(gitdir: Path) -> None:
    """Scratch indexes and journal temp files a killed run left (ours by name; lock held)."""
    for leftover in gitdir.glob(f"{SCRATCH_PREFIX}*"):
        leftover.unlink(missing_ok=True)
    (gitdir / JOURNAL).with_suffix(".tmp").unlink(missing_ok=True)


def plan_commits(path: Path, base: str, series: Series, result: engine.SeriesResult) -> list[str]:
    """Deterministic commits for the patches that apply, in order."""
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


def commit_message(patch: Patch) -> str:
    msg = patch.message.rstrip("\n") or patch.subject
    extra = f"Dsv4patch-Patch: {patch.name}\nDsv4patch-Series: {patch.series}\nDsv4patch-Sha256: {patch.sha256}\n"
    sep = "\n" if patch.trailers else "\n\n"
    return msg + sep + extra


def move_tree(path: Path, gitdir: Path, head: str, final: str) -> None:
    """Move HEAD, index and work tree from ``head`` to ``final`` under a journal."""
    journal = gitdir / JOURNAL
    tmp = journal.with_suffix(".tmp")
    ref = git.run(path, ["symbolic-ref", "-q", "HEAD"], check=False).stdout.strip() or None
    record = {"from": head, "to": final, "ref": ref, "pid": os.getpid()}
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(record))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, journal)
    git.checkout_to(path, head, final)
    journal.unlink()


def run(args: argparse.Namespace) -> int:
    lock = _common.open_lock(args)
    pin: Pin = lock.pin(args.pin)
    default_tree = args.tree is None
    if default_tree:
        args.tree = Path(DEFAULT_TREE_DIR) / pin.name
    path: Path = _common.tree_path(args)
    store = _common.open_store(args)
    prog = _common.progress(args)
    pinrepo = tree.materialize(pin, store, prog)
    series = series_for_pin(lock, pin)
    notes: list[str] = list(getattr(args, "pre_notes", None) or [])
    if default_tree:
        notes.append(f"tree: {path} (the default for pin {pin.name}: ./{DEFAULT_TREE_DIR}/"
                     f"{pin.name}; --tree to choose)")
    advice = (f"free space or fix permissions under {path}, then run apply again "
              "(it finishes or refuses an interrupted move)")
    with open_tree(path, pinrepo, notes):
        gitdir = _git_dir(path)
        _clean_scratch(gitdir)
        tree.check_target_tree(path)
        done = recover(path, gitdir)
        if done:
            notes.append(done)
        elif (gitdir / "index.lock").exists():
            raise TreeError(
                f"{gitdir / 'index.lock'} exists and no dsv4patch apply was interrupted in {path}: "
                "another git command is running there, or one was killed. Wait for it; if no git "
                "process is running, delete the file"
            )
        if (gitdir / resolve.STATE).exists():
            st = resolve.read_state(gitdir, path)
            raise TreeError(
                f"{path} holds the conflict workspace of {st['patch']} (pin {st['pin']}); finish it "
                f"with `dsv4patch resolve --continue --tree {path}` or undo it with "
                f"`dsv4patch resolve --abort --tree {path}`"
            )
        dirty = git.dirty_paths(path)
        if dirty:
            raise TreeError(
                f"{path} has uncommitted changes ({', '.join(dirty[:5])}"
                f"{', ...' if len(dirty) > 5 else ''}); commit, stash or remove them first"
            )
        head = git.head(path)
        if not git.has_object(path, f"{pinrepo.base_commit}^{{commit}}"):
            raise TreeError(
                f"{path} is not a tree of pin {pin.name}: its history lacks the pin's base "
                f"commit {pinrepo.base_commit[:12]}; use a new directory for --tree"
            )
        with writing(TreeError, str(path), advice):
            result = engine.run_series(path, pinrepo.base_commit, series)
        rep = pin_report(pin, pinrepo, result, lock.path)
        out: dict[str, Any] = {"lock": str(lock.path), "tree": str(path), "pins": {pin.name: rep}}
        if getattr(args, "three_way", False) and result.final_tree is None:
            with writing(TreeError, str(path), advice):
                ws = resolve.start(args, path, gitdir, lock, pin, pinrepo, series, result, head, notes)
            if ws is not None:
                out.update(ok=False, workspace=ws, head=ws["head"], notes=notes + rep["notes"])
                table, md = report.matrix_table(out)
                report.emit(args.format, out, table, md)
                return EXIT_UNEXPECTED
        # With --3way a patch that applies with an offset is committed too (the tree is the
        # same); `refresh --as-variant` then writes the exact variant.
        offsets = [n for n, c in rep["patches"].items() if not c["ok"] and c["status"] == "offset"]
        accept_offsets = (getattr(args, "three_way", False) and result.final_tree is not None
                          and not rep["notes"]
                          and all(c["ok"] or n in offsets for n, c in rep["patches"].items()))
        if accept_offsets and offsets:
            notes.append(f"applied with offsets: {', '.join(offsets)}; next: `dsv4patch refresh "
                         f"--pin {pin.name} --tree {path} --as-variant` writes them as exact variants")
        if (not rep["ok"] and not accept_offsets) or result.final_tree is None:
            out["ok"] = False
            out["notes"] = notes + [
                f"{name}: {c['status']} (expected {c['expected']}): {c['message']}\n  next: {c['next']}"
                for name, c in rep["patches"].items() if not c["ok"]
            ] + rep["notes"] + [f"{path} was left unchanged"]
            table, md = report.matrix_table(out)
            report.emit(args.format, out, table, md)
            return EXIT_UNEXPECTED
        with writing(TreeError, str(path), advice):
            commits = plan_commits(path, pinrepo.base_commit, series, result)
        final = commits[-1] if commits else pinrepo.base_commit
        if head == final:
            notes.append(f"{path} already has all patches of pin {pin.name}; nothing to do")
        elif head is not None and (head == pinrepo.base_commit or head in commits):
            with writing(TreeError, str(path), advice):
                move_tree(path, gitdir, head, final)
            notes.append(
                f"applied {len(commits)} patch(es) to {path}: HEAD {final[:12]}, "
                f"tree {result.final_tree}"
            )
        else:
            raise TreeError(
                f"{path} is at {head}, which is neither pin {pin.name}'s base commit "
                f"{pinrepo.base_commit[:12]} nor a state dsv4patch made; check out the base "
                "commit or use a new directory"
            )
        out["ok"] = True
        out["head"] = final
        out["notes"] = notes
    rc = EXIT_OK
    if args.build:
        # The last step of apply: kernels the patches touch are rebuilt, or the
        # command fails (a patched tree with stale kernels is half-patched).
        from dsv4patch.commands import build
        from dsv4patch.kernels import sources

        changed = git.changed_paths(path, pinrepo.base_commit)
        if any(sources.is_kernel_source(p) for p in changed) and sources.plan(path).units:
            try:
                rc, out["build"] = build.build_tree(path, pin, store, args, emit=False)
            except BuildError as exc:
                raise BuildError(
                    f"{path} is patched (HEAD {out['head'][:12]}), but the CUDA kernels the "
                    f"patches change were not rebuilt: {exc}\nRun `dsv4patch build --tree {path}` "
                    "on a machine with nvcc and torch, or pass --no-build to apply without it "
                    "(the kernel fixes are then not in effect)"
                ) from None
            out["notes"] += out["build"].get("notes", [])
        else:
            out["notes"].append("no kernel sources changed: nothing to build")
    table, md = report.matrix_table(out)
    report.emit(args.format, out, table, md)
    return rc
