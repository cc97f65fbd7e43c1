"""Which patches a tree carries, decided by the tree's content (``dsv4patch status --tree``).

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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsv4patch import engine, git, resolving, transaction, tree
from dsv4patch import lock as lockmod
from dsv4patch.errors import FetchError, TreeError, UsageError
from dsv4patch.lock import Lock, Pin, load
from dsv4patch.series import Series, series_for_pin


@dataclass(frozen=True)
class TreeStatus:
    """A tree's status: its JSON (``out``) and whether everything matches the lock."""

    tree: Path
    ok: bool
    out: dict[str, Any]

    def rows(self) -> list[list[str]]:
        """patch, state, commit per patch, then the foreign commits."""
        rows = [[name, v["state"], v.get("commit", "")[:12]] for name, v in self.out["patches"].items()]
        rows += [[f"(foreign) {f['subject'][:60]}", "foreign", f["commit"][:12]]
                 for f in self.out["foreign_commits"]]
        return rows

    def to_json(self) -> dict[str, Any]:
        return self.out


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


def pick_pin(lock_path: Path | None, pin_name: str | None, root_tree: str) -> tuple[Lock, Pin] | None:
    """The lock and pin to compare with, or None (no lock given, none matches)."""
    if lock_path:
        lock = load(lock_path)
        if pin_name:
            return lock, lock.pin(pin_name)
        match = [p for p in lock.pins.values() if p.base_tree == root_tree]
        return lock, (match[0] if match else lock.pin(None))
    try:
        found = lockmod.find_lock(None)  # $DSV4PATCH_LOCK, else locks/vllm.toml here or above
    except UsageError:
        return None
    lock = load(found)
    if pin_name:
        return lock, lock.pin(pin_name)
    match = [p for p in lock.pins.values() if p.base_tree == root_tree]
    return (lock, match[0]) if match else None


def tree_status(*, path: Path, lock: Path | None = None, pin: str | None = None) -> TreeStatus:
    """The patches ``path`` carries, compared with ``pin`` of ``lock`` (see :func:`pick_pin`)."""
    root, applied = tree_patches(path)
    dirty = git.dirty_paths(path)
    foreign = foreign_commits(path, root)
    out: dict[str, Any] = {
        "tree": str(path), "base_commit": root, "head": git.head(path),
        "tree_id": git.out(path, "rev-parse", "HEAD^{tree}"), "dirty": dirty,
        "patches": {a["patch"]: {**a, "state": "applied"} for a in applied}, "ok": not dirty,
        "foreign_commits": foreign,
    }
    picked = pick_pin(lock, pin, git.out(path, "rev-parse", f"{root}^{{tree}}"))
    if picked:
        plock, ppin = picked
        series = series_for_pin(plock, ppin)
        have = {a["patch"]: a for a in applied}
        evidence = content_evidence(path, series)
        patches: dict[str, Any] = {}
        for p in series.patches:
            a = have.get(p.name)
            how = evidence[p.name]
            expected = ppin.expected_status(p.name)
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
        out["lock"] = str(plock.path)
        out["pin"] = ppin.name
        out["patches"] = patches
        expected_missing = {
            p for p in patches
            if ppin.expected_status(p) in ("upstream", "already-applied")
        }
        out["ok"] = not dirty and all(
            v["state"] == "applied"
            or (k in expected_missing and v["state"] in ("missing", "upstream"))
            for k, v in patches.items()
        )
        out["expected_tree_id"] = ppin.patched_tree
        if ppin.patched_tree and out["tree_id"] != ppin.patched_tree:
            out["ok"] = False
        if ppin.source.kind == "local":
            # The pin's own checkout, revalidated on every run (HEAD, cleanliness).
            try:
                tree.check_local_checkout(ppin)
                out["source"] = "unchanged"
            except (TreeError, FetchError) as exc:
                out["source"] = f"changed: {exc}"
                out["ok"] = False
    expected_tree = out.get("expected_tree_id")
    tree_note = f"tree id {out['tree_id']}"
    if expected_tree:
        tree_note += (f", the lock expects {expected_tree}"
                      + (" (same)" if expected_tree == out["tree_id"] else " (DIFFERS)"))
    if "pin" in out:
        tree_note += f" (pin {out['pin']} of {out['lock']})"
    out["notes"] = [tree_note] + ([f"dirty: {', '.join(dirty[:10])}"] if dirty else [])
    if str(out.get("source", "")).startswith("changed"):
        out["notes"].append(f"pin source {out['source']}")
    if foreign:
        out["notes"].append(f"{len(foreign)} commit(s) not made by dsv4patch: "
                            + ", ".join(f["commit"][:12] for f in foreign))
    out["notes"] += [f"{k}: {v['note']}" for k, v in out["patches"].items() if v.get("note")]
    gitdir = git.git_dir(path)
    out["interrupted_apply"] = transaction.interrupted(gitdir)
    if out["interrupted_apply"]:
        out["ok"] = False
        out["notes"].append(
            "an apply was interrupted while moving this tree: run `dsv4patch apply` again to "
            "finish it (it refuses if the tree has changed since)"
        )
    out["conflict_workspace"] = resolving.has_workspace(gitdir)
    if out["conflict_workspace"]:
        out["ok"] = False
        out["notes"].append(
            f"a conflict workspace is open (apply --3way): finish it with `dsv4patch resolve "
            f"--continue --tree {path}` or undo it with `dsv4patch resolve --abort --tree {path}`"
        )
    return TreeStatus(path, bool(out["ok"]), out)
