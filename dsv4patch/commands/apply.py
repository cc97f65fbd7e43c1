"""``dsv4patch apply``: check, then commit each patch into the tree, atomically.

The series is first run through :func:`engine.run_series` in a scratch index
of the target repository (exactly what ``check`` does).  Only when every patch
has its expected status and the final tree id is the lock's does the work
tree move, in one step: the new commits are created as objects, a journal
records (from, to), the work tree and HEAD are switched, and the journal is
removed.  A run killed at any point leaves either the old state or a journal
that the next run finishes.  A second run on a patched tree changes nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from dsv4patch import engine, git, report, tree
from dsv4patch.commands import _common
from dsv4patch.commands.check import pin_report
from dsv4patch.errors import EXIT_OK, EXIT_UNEXPECTED, BuildError, TreeError
from dsv4patch.lock import Pin
from dsv4patch.series import Patch, Series, series_for_pin
from dsv4patch.store import Store, file_lock

HELP = "apply a pin's patch series to a tree as commits (creates the tree if absent)"
JOURNAL = "dsv4patch-apply.json"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("apply", help=HELP, description=HELP)
    _common.add_lock(p, many=False)
    p.add_argument("--tree", type=Path, required=True, help="the vLLM source tree to patch")
    p.add_argument(
        "--no-build", dest="build", action="store_false",
        help="do not rebuild the CUDA kernels the patches touch (then run `dsv4patch build` "
        "before shipping: without it the kernel fixes are not in effect)",
    )
    p.add_argument("--out", type=Path, default=None, help="where the kernel wheel goes (default: ./dist)")
    _common.add_output(p)
    _common.add_cache(p)


def tree_lock(store: Store, path: Path) -> Any:
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    return file_lock(store.root / "locks" / f"worktree-{key}.lock", f"tree {path}")


def prepare_tree(path: Path, pinrepo: tree.PinRepo) -> None:
    """Create ``path`` as a clone of the pin at its base commit."""
    if path.exists() and any(path.iterdir()):
        return
    tmp = path.with_name(f".{path.name}.dsv4patch-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    git.clone_local(pinrepo.repo, tmp)
    git.run(tmp, ["remote", "remove", "origin"])
    git.run(tmp, ["checkout", "-q", "-B", f"vllm-{pinrepo.pin.name}", pinrepo.base_commit])
    if path.exists():
        path.rmdir()
    os.replace(tmp, path)


def recover(path: Path) -> str | None:
    """Finish an apply that was killed after it started moving the work tree."""
    journal = Path(git.out(path, "rev-parse", "--absolute-git-dir")) / JOURNAL
    if not journal.exists():
        return None
    data = json.loads(journal.read_text())
    git.reset_hard(path, data["to"])
    journal.unlink()
    return f"finished an interrupted apply: {data['from'][:12]} -> {data['to'][:12]}"


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


def run(args: argparse.Namespace) -> int:
    lock = _common.open_lock(args)
    pin: Pin = lock.pin(args.pin)
    store = _common.open_store(args)
    prog = _common.progress(args)
    # Resolved once: every later git call names this absolute directory, so a
    # relative --tree can never be resolved against another cwd (or reach the
    # repository that encloses it).
    path = Path(os.path.abspath(args.tree))
    pinrepo = tree.materialize(pin, store, prog)
    series = series_for_pin(lock, pin)
    notes: list[str] = []
    with tree_lock(store, path):
        created = not (path.exists() and any(path.iterdir()))
        prepare_tree(path, pinrepo)
        if created:
            notes.append(f"created {path} from pin {pin.name} at {pinrepo.base_commit[:12]}")
        if not git.is_repo_root(path):
            raise TreeError(
                f"{path} is not the root of a git repository; point --tree at a new directory "
                "and dsv4patch creates the tree from the pin"
            )
        tree.check_target_tree(path)
        done = recover(path)
        if done:
            notes.append(done)
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
        result = engine.run_series(path, pinrepo.base_commit, series)
        rep = pin_report(pin, pinrepo, result)
        out: dict[str, Any] = {"lock": str(lock.path), "tree": str(path), "pins": {pin.name: rep}}
        if not rep["ok"] or result.final_tree is None:
            out["ok"] = False
            out["notes"] = notes + [
                f"{name}: {c['status']} (expected {c['expected']}): {c['message']}"
                for name, c in rep["patches"].items() if not c["ok"]
            ] + rep["notes"] + [f"{path} was left unchanged"]
            table, md = report.matrix_table(out)
            report.emit(args.format, out, table, md)
            return EXIT_UNEXPECTED
        commits = plan_commits(path, pinrepo.base_commit, series, result)
        final = commits[-1] if commits else pinrepo.base_commit
        if head == final:
            notes.append(f"{path} already has all patches of pin {pin.name}; nothing to do")
        elif head == pinrepo.base_commit or head in commits:
            gitdir = Path(git.out(path, "rev-parse", "--absolute-git-dir"))
            journal = gitdir / JOURNAL
            tmp = journal.with_suffix(".tmp")
            tmp.write_text(json.dumps({"from": head, "to": final}))
            os.replace(tmp, journal)
            git.checkout_to(path, head or "", final)
            journal.unlink()
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
