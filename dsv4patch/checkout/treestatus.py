"""Which patches a tree carries, decided by the tree's content (``dsv4patch status --tree``).

Commit trailers (``Dsv4patch-Patch``) only say what dsv4patch once committed:
after a ``git revert`` or a hand edit they lie.  So each patch of the pin's
series is looked for in the tree itself: the series is peeled off HEAD's tree
in reverse order (a patch is present when its reverse applies to what the
later patches left), and a patch whose reverse does not apply but whose
upstream markers are all there is reported by marker.  Commits dsv4patch did
not make are listed as foreign, but for a commit of the user's that is a patch
of the series (its subject and change, as ``refresh`` wrote the patch from it),
and the tree id is shown next to the one the lock expects.  Without ``--lock``, the default lock is used when one of its
pins has this tree's base.  A tree is compared only with a pin it is a tree of
(its root is the pin's base tree, or a fork's checkout descends from the pin's
commit): another pin named is refused (TreeError, as apply refuses it) naming
the tree's own; a tree compared with no pin says so in a note.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4patch import git, guard
from dsv4patch.checkout import forkcheckout, resolving, transaction
from dsv4patch.errors import FetchError, ParameterError, TreeError, param
from dsv4patch.nextstep import Step, mention
from dsv4patch.pins import find_lock, kind_of, load_lock
from dsv4patch.records import frozen
from dsv4patch.series import carried, has_offsets, series_for_pin

if TYPE_CHECKING:
    from dsv4patch.pins import Lock, Pin
    from dsv4patch.series import Patch, Series


@frozen
class Applied:
    """A commit dsv4patch made for a patch, as its trailers say."""

    patch: str
    sha256: str
    series: str
    commit: str

    def to_json(self) -> dict[str, str]:
        return {"patch": self.patch, "sha256": self.sha256, "series": self.series, "commit": self.commit}


@frozen
class Foreign:
    """A commit after the tree's root that dsv4patch did not make."""

    commit: str
    subject: str

    def to_json(self) -> dict[str, str]:
        return {"commit": self.commit, "subject": self.subject}


@frozen
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


@frozen
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
        rows += [[f"(foreign) {_shortened(f.subject)}", "foreign", f.commit[:12]] for f in self.foreign]
        return rows

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tree": str(self.tree), "base_commit": self.base_commit, "head": self.head,
            "tree_id": self.tree_id, "dirty": list(self.dirty),
            "patches": {n: v.to_json() for n, v in self.patches.items()}, "ok": self.ok,
            "foreign_commits": [f.to_json() for f in self.foreign],
        }
        out["compared"] = self.pin is not None  # False: no pin to compare with (a note says why)
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


def pins_with_base(lock: Lock, root_tree: str) -> list[Pin]:
    """The pins of ``lock`` a tree whose root commit holds ``root_tree`` belongs to: those whose
    base tree (the pin's pristine source, the root commit of every tree ``apply`` makes) it is;
    the lock's default pin first when it is one of them."""
    match = [p for p in lock.pins.values() if p.base_tree == root_tree]
    return sorted(match, key=lambda p: p.name != lock.default_pin)


@frozen
class Picked:
    """The lock and pin a tree is compared with (None: not compared), and a note: why it is not
    compared, or what could not be checked."""

    lock: Lock | None
    pin: Pin | None
    note: str | None = None


def pick_pin(path: Path, lock_path: Path | None, pin_name: str | None, root_tree: str,
             env_lock: Path | None = None) -> Picked:
    """The lock and pin to compare the tree at ``path`` with.

    ``pin_name`` given: that pin of the lock (given, else found); no lock found is a
    ParameterError, a tree that is not one of the pin's a TreeError naming the tree's pin.
    Else the pin whose base tree is the tree's root (``root_tree``); else, with a lock given,
    its default pin unless the tree is not one of its trees; else none, with a note saying why.
    ``env_lock`` (``$DSV4PATCH_LOCK``) is found, not given: used only when one of its pins
    has the tree's base, as the lock found here or above."""
    given = lock_path
    if lock_path is None:
        try:
            lock_path = find_lock(env_lock)  # $DSV4PATCH_LOCK, else locks/vllm.toml here or above
        except ParameterError as exc:
            if pin_name:
                raise  # a pin is looked up in a lock, as check and apply do
            return Picked(None, None, f"not compared with any pin: {exc}")
    lock = load_lock(lock_path)
    head = git.head(path)
    if pin_name:
        pin = lock.pin(pin_name)
        verdict = tree_of_pin(path, pin, root_tree, head)
        if verdict is False:
            raise TreeError(_not_its_tree(path, lock, pin, root_tree, head, given))
        return Picked(lock, pin, _unchecked(lock, pin) if verdict is None else None)
    match = pins_with_base(lock, root_tree)
    if match:
        return Picked(lock, match[0])
    default = lock.pin(None)
    verdict = tree_of_pin(path, default, root_tree, head) if given else False
    if verdict is not False:
        return Picked(lock, default, _unchecked(lock, default) if verdict is None else None)
    why = f"not compared with any pin: no pin of {lock.path} has this tree's base tree {root_tree[:12]}"
    if given:
        why += f", and it is not a tree of the lock's default pin {default.name}"
    none = f"name the pin it was made from ({param('pin')}) or pass the lock that has it ({param('lock')})"
    return Picked(lock, None, f"{why}; {_whose(path, lock, None, root_tree, head, given, none)}")


def tree_of_pin(path: Path, pin: Pin, root_tree: str, head: str | None) -> bool | None:
    """Whether the tree at ``path`` is one of ``pin``'s: made from its base (its root's tree is the
    lock's ``base_tree``, as in apply's trees) or a fork's checkout of it (HEAD descends from the
    pin's commit, as apply and refresh take it); None: cannot tell (the lock has no base_tree)."""
    if forkcheckout.descends_from_fork_pin(path, pin, head):
        return True
    if pin.base_tree is None:
        return None
    return root_tree == pin.base_tree


def _not_its_tree(path: Path, lock: Lock, pin: Pin, root_tree: str, head: str | None,
                  given: Path | None) -> str:
    """Why the tree at ``path`` is not one of ``pin``'s, and whose it is (the next step)."""
    why = f"its base tree {root_tree[:12]} is not the pin's base tree {(pin.base_tree or '')[:12]}"
    if kind_of(pin).fork:
        why += f" and its HEAD does not descend from the pin's commit {pin.commit[:12]}"
    none = (f"no pin of {lock.path} has its base tree (or, a fork's, its commit): pass the lock it was "
            f"made with ({param('lock')})")
    return f"{path} is not a tree of pin {pin.name}: {why}; " + _whose(path, lock, pin, root_tree, head, given, none)


def _whose(path: Path, lock: Lock, pin: Pin | None, root_tree: str, head: str | None, given: Path | None,
           otherwise: str) -> str:
    """Which pin of ``lock`` (other than ``pin``) the tree is one of, as the command that compares it
    with that pin; ``otherwise`` when none is."""
    others = [p.name for p in lock.pins.values() if p is not pin and tree_of_pin(path, p, root_tree, head)]
    if not others:
        return otherwise
    return f"it is a tree of pin {others[0]}: run `{mention(Step.of('status', lock=given, pin=others[0], tree=path))}`"


def _unchecked(lock: Lock, pin: Pin) -> str:
    """The note when it cannot be checked that the tree is one of ``pin``'s (the lock has no base_tree)."""
    update = Step.of("lock", update=True, lock=lock.path, pin=pin.name)
    return (f"pin {pin.name} has no base_tree in {lock.path}: that this tree was made from it was not "
            f"checked (`{mention(update)}` records it)")


def tree_pin(*, path: Path, lock: Lock, pin: str | None) -> Pin:
    """The pin of ``lock`` the tree at ``path`` belongs to, found as ``status --tree`` finds it
    (:func:`pins_with_base`: the pin whose base tree its root commit holds).

    ``pin`` named: that pin, unless the tree belongs to other pins only and is not a checkout of
    it (a git or local pin whose commit HEAD descends from): then TreeError (exit 5, as ``apply``
    refuses a tree of another pin), naming the tree's pin.  A tree no pin's base matches (a fork's
    own checkout, a pin without ``base_tree``): ``pin``, else the lock's default pin.  The tree is
    vetted and held through :func:`guard.guarded` while it is read."""
    _refuse_no_checkout(path)
    named = lock.pin(pin) if pin is not None else None
    with guard.guarded(path):
        head = git.head(path)
        if head is None:
            raise TreeError(f"{path} has no commits")
        root = git.out(path, "rev-list", "--max-parents=0", "HEAD").splitlines()[0]
        match = pins_with_base(lock, git.out(path, "rev-parse", f"{root}^{{tree}}"))
        checkout_of_named = named is not None and forkcheckout.descends_from_fork_pin(path, named, head)
    if named is None:
        return match[0] if match else lock.pin(None)
    if match and named not in match and named.base_tree is not None and not checkout_of_named:
        theirs = " or ".join(p.name for p in match)
        raise TreeError(
            f"{path} is not a tree of pin {named.name}: it is a tree of pin {theirs} (its root commit holds "
            f"that pin's base tree {str(match[0].base_tree)[:12]}, not pin {named.name}'s {named.base_tree[:12]}); "
            f"pass {param('pin')} {match[0].name}, or leave {param('pin')} out (the tree's own pin is then used)")
    return named


def _refuse_no_checkout(path: Path) -> None:
    """TreeError (exit 5) unless ``path`` is the root of a git checkout."""
    if not guard.is_checkout_root(path):
        raise TreeError(f"{path} does not exist" if not os.path.lexists(path) else
                        f"{path} is not a git repository made by dsv4patch apply (no .git{guard.inside_note(path)})")


def tree_status(*, path: Path, lock: Path | None = None, pin: str | None = None,
                env_lock: Path | None = None) -> TreeStatus:
    """The patches ``path`` carries, compared with ``pin`` of ``lock`` (see :func:`pick_pin`).

    The tree is vetted and held through :func:`guard.guarded` (TreeError, exit 5, when it
    is not a checkout, its settings name programs, or it is not a tree of ``pin``)."""
    _refuse_no_checkout(path)
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
    source = None
    picked = pick_pin(path, lock, pin, git.out(path, "rev-parse", f"{root}^{{tree}}"), env_lock)
    plock, ppin = picked.lock, picked.pin
    if ppin is not None and plock is not None:
        applied, foreign = _since_fork_pin(path, ppin, applied, foreign)
        series = series_for_pin(plock, ppin)
        patches = _against_series(path, series, ppin, applied)
        foreign = _series_commits_of_yours(path, series, foreign, patches)
        ok = not dirty and _as_expected(ppin, patches, tree_id)
        source = _source_state(ppin, path)
        if source is not None and source != "unchanged":
            ok = False
    notes = _notes(tree_id, plock if ppin else None, ppin, dirty, source, foreign, patches)
    if picked.note:
        notes.insert(1, picked.note)
    interrupted, workspace = _unfinished(co, notes)
    ok = ok and not interrupted and not workspace
    return TreeStatus(path, root, git.head(path), tree_id, dirty, patches, ok, foreign, notes, interrupted,
                      workspace, lock=plock.path if plock and ppin else None, pin=ppin.name if ppin else None,
                      expected_tree_id=ppin.patched_tree if ppin else None, source=source)


def _since_fork_pin(path: Path, pin: Pin, applied: list[Applied],
                    foreign: list[Foreign]) -> tuple[list[Applied], list[Foreign]]:
    """In a fork's own checkout, its history before the pin's commit is the fork's, not ours: the
    applied and foreign commits are counted from the pin's commit."""
    if forkcheckout.descends_from_fork_pin(path, pin, git.head(path)):
        _root, applied = tree_patches(path, since=pin.commit)
        foreign = foreign_commits(path, pin.commit)
    return applied, foreign


def makes_commit(path: Path, commit: str, tree_id: str, patch: Patch) -> bool:
    """Whether ``patch`` applied exactly (no offset) to ``commit``'s parent gives ``tree_id`` (the
    commit's tree): the commit makes the patch's change."""
    with git.scratch_index(path, f"{commit}^") as env:
        res = git.apply(path, patch.path, env=env)
        if not res.ok or has_offsets(res.stdout + res.stderr):
            return False
        return git.write_tree(path, env) == tree_id


def patch_of_commit(path: Path, commit: str, subject: str, tree_id: str, patches: Sequence[Patch],
                    taken: Collection[str] = ()) -> Patch | None:
    """The patch of ``patches`` (not one ``taken``) a commit of the user's own (no trailer of ours)
    is: the same subject and the same change (:func:`makes_commit`), as ``refresh`` wrote it from
    that commit before."""
    return next((p for p in patches if p.name not in taken and p.subject == subject
                 and makes_commit(path, commit, tree_id, p)), None)


def _series_commits_of_yours(path: Path, series: Series, foreign: list[Foreign],
                             patches: dict[str, PatchState]) -> list[Foreign]:
    """``foreign`` less the commits of the user's own that are a patch of the series (the same subject and
    change: ``refresh`` wrote the patch from that commit), each noted on its patch; a patch dsv4patch's
    trailers name a commit for is not looked for again."""
    taken = [n for n, v in patches.items() if v.applied is not None]
    kept = []
    for f in foreign:
        tree_id = git.out(path, "rev-parse", f"{f.commit}^{{tree}}")
        patch = patch_of_commit(path, f.commit, f.subject, tree_id, series.patches, taken)
        if patch is None:
            kept.append(f)
            continue
        taken.append(patch.name)
        state = patches[patch.name]
        if state.note is None:
            patches[patch.name] = dataclasses.replace(
                state, note=f"commit {f.commit[:12]} of yours is this patch (its subject and change)")
    return kept


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


def _shortened(subject: str, most: int = 60) -> str:
    """A commit's subject in a table cell: at most ``most`` characters, cut between words (``...`` marks the
    cut; the JSON keeps it whole)."""
    import textwrap

    if len(subject) <= most:
        return subject
    short = textwrap.shorten(subject, most, placeholder=" ...")
    return subject if short == "..." else short  # one word longer than that: whole, never split
