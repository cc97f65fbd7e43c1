"""``dsv4patch status``: which patches a tree carries (read from commit trailers)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dsv4patch import git, report
from dsv4patch.commands import _common
from dsv4patch.commands.apply import JOURNAL
from dsv4patch.errors import EXIT_OK, EXIT_UNEXPECTED, TreeError, UsageError
from dsv4patch.lock import load
from dsv4patch.series import series_for_pin

HELP = ("show which patches a tree carries, or (--installed) an installed vLLM, and whether "
        "they match the lock's series")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("status", help=HELP, description=HELP)
    p.add_argument("--tree", type=Path, default=None, help="a tree made by dsv4patch apply")
    p.add_argument("--lock", type=Path, default=None,
                   help="compare with this lock's series (with --installed, default: $DSV4PATCH_LOCK, "
                        "else locks/vllm.toml here or in a parent directory)")
    p.add_argument("--pin", default=None, help="pin to compare with (default: the lock's default; "
                   "with --installed: the pin of the installed vLLM's version)")
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
    for sha, trailers in git.log_trailers(path, f"{root}..HEAD"):
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
    out: dict[str, Any] = {
        "tree": str(path), "base_commit": root, "head": git.head(path),
        "tree_id": git.out(path, "rev-parse", "HEAD^{tree}"), "dirty": dirty,
        "patches": {a["patch"]: {**a, "state": "applied"} for a in applied}, "ok": not dirty,
    }
    if args.lock:
        lock = load(args.lock)
        pin = lock.pin(args.pin)
        series = series_for_pin(lock, pin)
        have = {a["patch"]: a for a in applied}
        patches: dict[str, Any] = {}
        for p in series.patches:
            a = have.get(p.name)
            if a is None:
                state = "missing"
            elif a["sha256"] != p.sha256:
                state = "stale"  # applied from an older version of the patch file
            else:
                state = "applied"
            patches[p.name] = {**(a or {}), "patch": p.name, "state": state}
        for name, a in have.items():
            if name not in patches:
                patches[name] = {**a, "state": "not-in-series"}
        out["pin"] = pin.name
        out["patches"] = patches
        expected_missing = {
            p for p in patches
            if pin.expected_status(p) in ("upstream", "already-applied")
        }
        out["ok"] = not dirty and all(
            v["state"] == "applied" or (k in expected_missing and v["state"] == "missing")
            for k, v in patches.items()
        )
        out["expected_tree_id"] = pin.patched_tree
        if pin.patched_tree and out["tree_id"] != pin.patched_tree:
            out["ok"] = False
    rows = [[name, v["state"], v.get("commit", "")[:12]] for name, v in out["patches"].items()]
    table, md = report.simple_table(f"dsv4patch status: {path}", ["patch", "state", "commit"], rows)
    out["notes"] = [f"tree id {out['tree_id']}"] + ([f"dirty: {', '.join(dirty[:10])}"] if dirty else [])
    journal = Path(git.out(path, "rev-parse", "--absolute-git-dir")) / JOURNAL
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
