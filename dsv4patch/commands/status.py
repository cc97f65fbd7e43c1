"""``dsv4patch status``: which patches a tree carries, decided by the tree's content.

Commit trailers (``Dsv4patch-Patch``) only say what dsv4patch once committed:
after a ``git revert`` or a hand edit they lie.  So each patch of the pin's
series is looked for in the tree itself: the series is peeled off HEAD's tree
in reverse order (a patch is present when its reverse applies to what the
later patches left), and a patch whose reverse does not apply but whose
upstream markers are all there is reported by marker.  Commits dsv4patch did
not make are listed as foreign, and the tree id is shown next to the one the
lock expects.  Without ``--lock``, the default lock is used when one of its
pins has this tree's base.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dsv4patch import engine, git, report, tree
from dsv4patch import lock as lockmod
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK, EXIT_UNEXPECTED, FetchError, TreeError, UsageError
from dsv4patch.lock import Lock, Pin, load
from dsv4patch.series import Series, series_for_pin
from dsv4patch.transaction import JOURNAL

HELP = ("show which patches a tree carries, or (--installed) an installed vLLM, and whether "
        "they match the lock's series")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("status", help=HELP, description=HELP)
    p.add_argument("--tree", type=Path, default=None, help="a tree made by dsv4patch apply")
    p.add_argument("--lock", type=Path, default=None,
                   help="compare with this lock's series (default: $DSV4PATCH_LOCK, else locks/vllm.toml "
                        "here or in a parent directory; for --tree only when one of its pins has "
                        "this tree's base)")
    p.add_argument("--pin", default=None, help="pin to compare with (default: the pin whose base tree is this tree's root, "
                   "else the lock's default; with --installed: the pin of the installed vLLM's version)")
    p.add_argument("--installed", action="store_true",
                   help="instead of a tree: check the vLLM installed in --python's environment "
                        "(per patch present/stock/missing/other, the kernel library); exit 0 only "
                        "when everything matches the lock")
    p.add_argument("--python", default=None,
                   help="with --installed: the interpreter of the vLLM environment (default: "
                        "$DSV4PATCH_VLLM_PYTHON, else the one running dsv4patch)")
    _common.add_output(p)
    _common.add_cache(p)


def tree_patches(path: Path) -> tuple[str, list[dict[str, str]]]:
    """(root commit, [{patch, sha256, series, commit}]) for a dsv4patch tree."""
    if not git.is_repo_root(path):
        raise TreeError(f"{path} is not a git repository made by dsv4patch apply")
    head = git.head(path)
    if head is None:
        raise TreeError(f"{path} has no commits")
    root = git.out(path, "rev-list", "--max-parents=0", "HEAD").splitlines()[0]
    applied = []
    for entry in git.log_trailers(path, f"{root}..HEAD"):
        sha, trailers = entry.commit, entry.trailers
        if "Dsv4patch-Patch" in trailers:
            applied.append(
                {
                    "patch": trailers["Dsv4patch-Patch"][0],
                    "sha256": trailers.get("Dsv4patch-Sha256", [""])[0],
                    "series": trailers.get("Dsv4patch-Series", [""])[0],
                    "commit": sha,
                }
            )
    return root, applied


def foreign_commits(path: Path, root: str) -> list[dict[str, str]]:
    """Commits after the root that dsv4patch did not make (no Dsv4patch-Patch trailer)."""
    ours = {e.commit for e in git.log_trailers(path, f"{root}..HEAD") if "Dsv4patch-Patch" in e.trailers}
    out = []
    for line in git.out(path, "log", "--reverse", "--format=%H %s", f"{root}..HEAD").splitlines():
        sha, _, subject = line.partition(" ")
        if sha and sha not in ours:
            out.append({"commit": sha, "subject": subject})
    return out


def content_evidence(path: Path, series: Series) -> dict[str, str | None]:
    """Per patch: ``reverse-apply``, ``markers`` or None, from HEAD's tree alone.

    The series is peeled off a scratch index of HEAD in reverse order, so a
    patch is judged against the tree the later patches left (fix 7 and extra
    2 touch the same line)."""
    found: dict[str, str | None] = {}
    with git.scratch_index(path, "HEAD") as env:
        for p in reversed(series.patches):
            rev = git.apply(path, p.path, env=env, reverse=True)
            if rev.ok and "Skipped patch" not in rev.stdout + rev.stderr:
                found[p.name] = "reverse-apply"
            elif engine.markers_present(path, env, p):
                found[p.name] = "markers"
            else:
                found[p.name] = None
    return found


def _pick_pin(args: argparse.Namespace, root_tree: str) -> tuple[Lock, Pin] | None:
    """The lock and pin to compare with, or None (no lock given, none matches)."""
    if args.lock:
        lock = load(args.lock)
        if args.pin:
            return lock, lock.pin(args.pin)
        match = [p for p in lock.pins.values() if p.base_tree == root_tree]
        return lock, (match[0] if match else lock.pin(None))
    try:
        found = lockmod.find_lock(None)  # $DSV4PATCH_LOCK, else locks/vllm.toml here or above
    except UsageError:
        return None
    lock = load(found)
    if args.pin:
        return lock, lock.pin(args.pin)
    match = [p for p in lock.pins.values() if p.base_tree == root_tree]
    return (lock, match[0]) if match else None


def run(args: argparse.Namespace) -> int:
    if args.installed:
        if args.tree is not None:
            raise UsageError("--installed checks an installed vLLM, --tree a source tree: give one")
        from dsv4patch import installed

        args.series = None
        return installed.run(args)
    if args.tree is None:
        raise UsageError("give --tree DIR (a tree made by dsv4patch apply) or --installed")
    if args.python is not None:
        raise UsageError("--python goes with --installed")
    path: Path = _common.tree_path(args)
    root, applied = tree_patches(path)
    dirty = git.dirty_paths(path)
    foreign = foreign_commits(path, root)
    out: dict[str, Any] = {
        "tree": str(path), "base_commit": root, "head": git.head(path),
        "tree_id": git.out(path, "rev-parse", "HEAD^{tree}"), "dirty": dirty,
        "patches": {a["patch"]: {**a, "state": "applied"} for a in applied}, "ok": not dirty,
        "foreign_commits": foreign,
    }
    picked = _pick_pin(args, git.out(path, "rev-parse", f"{root}^{{tree}}"))
    if picked:
        lock, pin = picked
        series = series_for_pin(lock, pin)
        have = {a["patch"]: a for a in applied}
        evidence = content_evidence(path, series)
        patches: dict[str, Any] = {}
        for p in series.patches:
            a = have.get(p.name)
            how = evidence[p.name]
            expected = pin.expected_status(p.name)
            if how == "reverse-apply":
                state = "applied"
            elif how == "markers":
                # The fix's code is there but not as this patch wrote it.
                state = "upstream" if expected == "upstream" else "changed"
            elif a is not None and a["sha256"] != p.sha256:
                state = "stale"  # applied from an older version of the patch file
            else:
                state = "missing"  # never applied, or reverted / edited away since
            entry = {**(a or {}), "patch": p.name, "state": state, "evidence": how}
            if a is not None and state in ("missing", "changed"):
                entry["note"] = f"commit {a['commit'][:12]} applied it; the tree no longer has it"
            patches[p.name] = entry
        for name, a in have.items():
            if name not in patches:
                patches[name] = {**a, "state": "not-in-series"}
        out["lock"] = str(lock.path)
        out["pin"] = pin.name
        out["patches"] = patches
        expected_missing = {
            p for p in patches
            if pin.expected_status(p) in ("upstream", "already-applied")
        }
        out["ok"] = not dirty and all(
            v["state"] == "applied"
            or (k in expected_missing and v["state"] in ("missing", "upstream"))
            for k, v in patches.items()
        )
        out["expected_tree_id"] = pin.patched_tree
        if pin.patched_tree and out["tree_id"] != pin.patched_tree:
            out["ok"] = False
        if pin.source.kind == "local":
            # The pin's own checkout, revalidated on every run (HEAD, cleanliness).
            try:
                tree.check_local_checkout(pin)
                out["source"] = "unchanged"
            except (TreeError, FetchError) as exc:
                out["source"] = f"changed: {exc}"
                out["ok"] = False
    rows = [[name, v["state"], v.get("commit", "")[:12]] for name, v in out["patches"].items()]
    rows += [[f"(foreign) {f['subject'][:60]}", "foreign", f["commit"][:12]] for f in foreign]
    table, md = report.simple_table(f"dsv4patch status: {path}", ["patch", "state", "commit"], rows)
    expected = out.get("expected_tree_id")
    tree_note = f"tree id {out['tree_id']}"
    if expected:
        tree_note += (f", the lock expects {expected}"
                      + (" (same)" if expected == out["tree_id"] else " (DIFFERS)"))
    if "pin" in out:
        tree_note += f" (pin {out['pin']} of {out['lock']})"
    out["notes"] = [tree_note] + ([f"dirty: {', '.join(dirty[:10])}"] if dirty else [])
    if str(out.get("source", "")).startswith("changed"):
        out["notes"].append(f"pin source {out['source']}")
    if foreign:
        out["notes"].append(f"{len(foreign)} commit(s) not made by dsv4patch: "
                            + ", ".join(f["commit"][:12] for f in foreign))
    out["notes"] += [f"{k}: {v['note']}" for k, v in out["patches"].items() if v.get("note")]
    journal = git.git_dir(path) / JOURNAL
    out["interrupted_apply"] = journal.exists()
    if journal.exists():
        out["ok"] = False
        out["notes"].append(
            "an apply was interrupted while moving this tree: run `dsv4patch apply` again to "
            "finish it (it refuses if the tree has changed since)"
        )
    workspace = journal.with_name("dsv4patch-resolve.json")
    out["conflict_workspace"] = workspace.exists()
    if workspace.exists():
        out["ok"] = False
        out["notes"].append(
            f"a conflict workspace is open (apply --3way): finish it with `dsv4patch resolve "
            f"--continue --tree {path}` or undo it with `dsv4patch resolve --abort --tree {path}`"
        )
    report.emit(args.format, out, table, md)
    return EXIT_OK if out["ok"] else EXIT_UNEXPECTED
