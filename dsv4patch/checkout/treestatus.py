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

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4patch import git, guard
from dsv4patch.checkout import resolving, transaction
from dsv4patch.errors import FetchError, ParameterError, TreeError
from dsv4patch.nextstep import Step, mention
from dsv4patch.pins import find_lock, kind_of, load_lock
from dsv4patch.series import carried, series_for_pin

if TYPE_CHECKING:
    from dsv4patch.pins import Lock, Pin
    from dsv4patch.series import Series


@dataclass(frozen=True)
class Applied:
    """A commit dsv4patch made for a patch, as its trailers say."""

    patch: str
    sha256: str
    series: str
    commit: str

    def to_json(self) -> dict[str, str]:
        return {"patch": self.patch, "sha256": self.sha256, "series": self.series, "commit": self.commit}


@dataclass(frozen=True)
class Foreign:
    """A commit after the tree's root that dsv4patch did not make."""

    commit: str
    subject: str

    def to_json(self) -> dict[str, str]:
        return {"commit": self.commit, "subject": self.subject}


@dataclass(frozen=True)
class PatchState:
    """One patch's state in the tree: applied, upstream, changed, stale, missing, not-in-series."""

    patch: str
    state: str
    applied: Applied | None = None  # the commit that applied it, if its trailers say so
    checked: bool = False  # looked for in the tree's content (then ``evidence`` is shown)
    evidence: str | None = None  # reverse-apply | markers | None (not found)
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = self.applied.to_json() if self.applied else {"patch": self.patch}
        out["patch"] = self.patch
        out["state"] = self.state
        if self.checked:
            out["evidence"] = self.evidence
        if self.note is not None:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class TreeStatus:
    """A tree's status, and whether everything matches the lock."""

    tree: Path
    base_commit: str
    head: str | None
    tree_id: str
    dirty: list[str]
    patches: dict[str, PatchState]
    ok: bool
    foreign: list[Foreign]
    notes: list[str]
    interrupted_apply: bool
    conflict_workspace: bool
    lock: Path | None = None  # the lock and pin compared with (None: none)
    pin: str | None = None
    expected_tree_id: str | None = None
    source: str | None = None  # a local pin's checkout: "unchanged" or "changed: why"

    def rows(self) -> list[list[str]]:
        """patch, state, commit per patch, then the foreign commits."""
        rows = [[name, v.state, v.applied.commit[:12] if v.applied else ""] for name, v in self.patches.items()]
        rows += [[f"(foreign) {f.subject[:60]}", "foreign", f.commit[:12]] for f in self.foreign]
        return rows

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tree": str(self.tree), "base_commit": self.base_commit, "head": self.head,
            "tree_id": self.tree_id, "dirty": list(self.dirty),
            "patches": {n: v.to_json() for n, v in self.patches.items()}, "ok": self.ok,
            "foreign_commits": [f.to_json() for f in self.foreign],
        }
        if self.pin is not None:
            out["lock"] = str(self.lock)
            out["pin"] = self.pin
            out["expected_tree_id"] = self.expected_tree_id
        if self.source is not None:
            out["source"] = self.source
        out["notes"] = list(self.notes)
        out["interrupted_apply"] = self.interrupted_apply
        out["conflict_workspace"] = self.conflict_workspace
        return out


def tree_patches(path: Path, since: str | None = None) -> tuple[str, list[Applied]]:
    """(root commit, the patches dsv4patch's commits say they applied) for a dsv4patch tree
    (held by :func:`guard.guarded`); ``since``: only the commits after it (a fork's pin)."""
    head = git.head(path)
    if head is None:
        raise TreeError(f"{path} has no commits")
    root = since or git.out(path, "rev-list", "--max-parents=0", "HEAD").splitlines()[0]
    applied = []
    for entry in git.log_trailers(path, f"{root}..HEAD"):
        trailers = entry.trailers
        if "Dsv4patch-Patch" in trailers:
            applied.append(Applied(trailers["Dsv4patch-Patch"][0], trailers.get("Dsv4patch-Sha256", [""])[0],
                                   trailers.get("Dsv4patch-Series", [""])[0], entry.commit))
    return root, applied


def foreign_commits(path: Path, root: str) -> list[Foreign]:
    """Commits after the root that dsv4patch did not make (no Dsv4patch-Patch trailer)."""
    ours = {e.commit for e in git.log_trailers(path, f"{root}..HEAD") if "Dsv4patch-Patch" in e.trailers}
    out = []
    for line in git.out(path, "log", "--reverse", "--format=%H %s", f"{root}..HEAD").splitlines():
        sha, _, subject = line.partition(" ")
        if sha and sha not in ours:
            out.append(Foreign(sha, subject))
    return out


def content_evidence(path: Path, series: Series) -> dict[str, str | None]:
    """Per patch: ``reverse-apply``, ``markers`` or None, from HEAD's tree alone (:func:`engine.carried`)."""
    with git.scratch_index(path, "HEAD") as env:
        return carried(path, env, series)


def pick_pin(lock_path: Path | None, pin_name: str | None, root_tree: str,
             env_lock: Path | None = None) -> tuple[Lock, Pin] | None:
    """The lock and pin to compare with, or None (no lock given, none matches).

    ``env_lock`` (``$DSV4PATCH_LOCK``) is found, not given: used only when one of its pins
    has the tree's base, as the lock found here or above."""
    if lock_path:
        lock = load_lock(lock_path)
        if pin_name:
            return lock, lock.pin(pin_name)
        match = [p for p in lock.pins.values() if p.base_tree == root_tree]
        return lock, (match[0] if match else lock.pin(None))
    try:
        found = find_lock(env_lock)  # $DSV4PATCH_LOCK, else locks/vllm.toml here or above
    except ParameterError:
        return None
    lock = load_lock(found)
    if pin_name:
        return lock, lock.pin(pin_name)
    match = [p for p in lock.pins.values() if p.base_tree == root_tree]
    return (lock, match[0]) if match else None


def tree_status(*, path: Path, lock: Path | None = None, pin: str | None = None,
                env_lock: Path | None = None) -> TreeStatus:
    """The patches ``path`` carries, compared with ``pin`` of ``lock`` (see :func:`pick_pin`).

    The tree is vetted and held through :func:`guard.guarded` (TreeError, exit 5, when it
    is not a checkout or its settings name programs)."""
    if not guard.is_checkout_root(path):
        raise TreeError(f"{path} does not exist" if not os.path.lexists(path) else
                        f"{path} is not a git repository made by dsv4patch apply")
    with guard.guarded(path) as co:
        return _tree_status(co, lock, pin, env_lock)


def _tree_status(co: guard.Checkout, lock: Path | None, pin: str | None, env_lock: Path | None) -> TreeStatus:
    path = co.path
    root, applied = tree_patches(path)
    dirty = git.dirty_paths(path)
    foreign = foreign_commits(path, root)
    tree_id = git.out(path, "rev-parse", "HEAD^{tree}")
    patches = {a.patch: PatchState(a.patch, "applied", a) for a in applied}
    ok = not dirty
    plock: Lock | None = None
    ppin: Pin | None = None
    source = None
    picked = pick_pin(lock, pin, git.out(path, "rev-parse", f"{root}^{{tree}}"), env_lock)
    if picked:
        plock, ppin = picked
        applied, foreign = _since_fork_pin(path, ppin, applied, foreign)
        patches = _against_series(path, series_for_pin(plock, ppin), ppin, applied)
        ok = not dirty and _as_expected(ppin, patches, tree_id)
        source = _source_state(ppin, path)
        if source is not None and source != "unchanged":
            ok = False
    notes = _notes(tree_id, plock, ppin, dirty, source, foreign, patches)
    interrupted, workspace = _unfinished(co, notes)
    ok = ok and not interrupted and not workspace
    return TreeStatus(path, root, git.head(path), tree_id, dirty, patches, ok, foreign, notes, interrupted,
                      workspace, lock=plock.path if plock else None, pin=ppin.name if ppin else None,
                      expected_tree_id=ppin.patched_tree if ppin else None, source=source)


def _since_fork_pin(path: Path, pin: Pin, applied: list[Applied],
                    foreign: list[Foreign]) -> tuple[list[Applied], list[Foreign]]:
    """In a fork's own checkout, its history before the pin's commit is the fork's, not ours: the
    applied and foreign commits are counted from the pin's commit."""
    if (kind_of(pin).fork and git.has_object(path, f"{pin.commit}^{{commit}}")
            and git.is_ancestor(path, pin.commit, "HEAD")):
        _root, applied = tree_patches(path, since=pin.commit)
        foreign = foreign_commits(path, pin.commit)
    return applied, foreign


def _against_series(path: Path, series: Series, pin: Pin, applied: list[Applied]) -> dict[str, PatchState]:
    """Each patch of the pin's series as the tree's content shows it, then the applied patches
    the series does not have."""
    have = {a.patch: a for a in applied}
    evidence = content_evidence(path, series)
    patches = {p.name: _patch_state(p.name, p.sha256, have.get(p.name), evidence[p.name],
                                    pin.expected_status(p.name))
               for p in series.patches}
    for name, a in have.items():
        if name not in patches:
            patches[name] = PatchState(name, "not-in-series", a)
    return patches


def _patch_state(name: str, sha256: str, a: Applied | None, how: str | None, expected: str) -> PatchState:
    """One patch's state from the content evidence ``how`` and the commit ``a`` that applied it."""
    if how == "reverse-apply":
        state = "applied"
    elif how == "markers":
        # The fix's code is there but not as this patch wrote it.
        state = "upstream" if expected == "upstream" else "changed"
    elif a is not None and a.sha256 != sha256:
        state = "stale"  # applied from an older version of the patch file
    else:
        state = "missing"  # never applied, or reverted / edited away since
    note = None
    if a is not None and state in ("missing", "changed"):
        note = f"commit {a.commit[:12]} applied it; the tree no longer has it"
    return PatchState(name, state, a, checked=True, evidence=how, note=note)


def _as_expected(pin: Pin, patches: dict[str, PatchState], tree_id: str) -> bool:
    """Every patch applied (or missing where the lock expects it upstream), and the tree the
    lock expects, if it names one."""
    expected_missing = {p for p in patches if pin.expected_status(p) in ("upstream", "already-applied")}
    if pin.patched_tree and tree_id != pin.patched_tree:
        return False
    return all(v.state == "applied" or (k in expected_missing and v.state in ("missing", "upstream"))
               for k, v in patches.items())


def _source_state(pin: Pin, path: Path) -> str | None:
    """For a pin whose source is this checkout: ``unchanged``, or ``changed: why`` (HEAD and
    cleanliness, revalidated on every run); None for any other pin."""
    if kind_of(pin).checkout_path(pin.source) is None:
        return None
    try:
        kind_of(pin).check_checkout(pin, path)
        return "unchanged"
    except (TreeError, FetchError) as exc:
        return f"changed: {exc}"


def _notes(tree_id: str, lock: Lock | None, pin: Pin | None, dirty: list[str], source: str | None,
           foreign: list[Foreign], patches: dict[str, PatchState]) -> list[str]:
    """What the status says besides the patches: the tree id against the lock's, dirt, the
    pin's source, foreign commits, each patch's note."""
    expected_tree = pin.patched_tree if pin else None
    tree_note = f"tree id {tree_id}"
    if expected_tree:
        tree_note += (f", the lock expects {expected_tree}"
                      + (" (same)" if expected_tree == tree_id else " (DIFFERS)"))
    if pin is not None and lock is not None:
        tree_note += f" (pin {pin.name} of {lock.path})"
    notes = [tree_note] + ([f"dirty: {', '.join(dirty[:10])}"] if dirty else [])
    if source is not None and source.startswith("changed"):
        notes.append(f"pin source {source}")
    if foreign:
        notes.append(f"{len(foreign)} commit(s) not made by dsv4patch: "
                     + ", ".join(f.commit[:12] for f in foreign))
    return notes + [f"{k}: {v.note}" for k, v in patches.items() if v.note]


def _unfinished(co: guard.Checkout, notes: list[str]) -> tuple[bool, bool]:
    """An interrupted apply and an open conflict workspace (each noted with what to run)."""
    interrupted = transaction.interrupted(co.gitdir)
    if interrupted:
        notes.append(
            "an apply was interrupted while moving this tree: run `dsv4patch apply` again to "
            "finish it (it refuses if the tree has changed since)"
        )
    workspace = resolving.has_workspace(co.gitdir)
    if workspace:
        notes.append(
            f"a conflict workspace is open ({mention(Step.of('apply', three_way=True), bare=True)}): finish it "
            f"with `{mention(Step.of('resolve', cont=True, tree=co.path))}` or undo it with "
            f"`{mention(Step.of('resolve', abort=True, tree=co.path))}`"
        )
    return interrupted, workspace

