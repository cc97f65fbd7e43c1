"""The conflict workspace ``apply --3way`` opens in a tree, and how ``resolve`` closes it.

Without a workspace a conflict leaves the user with a precise diagnosis and
nothing else: resolving meant ``git am -3`` and ``format-patch`` by hand.
``apply --3way`` (:func:`open_workspace`) instead leaves the tree with

* the patches before the failing one committed (the same commits a plain
  ``apply`` makes), moved to under the transaction's journal;
* the failing patch applied with ``git apply --3way``: conflict markers in the
  files it could not merge, the rest staged.  3-way needs the file each hunk
  was made against (the patch's ``index`` line names its blob); a pin
  materialized from an sdist or a fork does not have it, so it is copied,
  by id, from another pin of the lock whose series produces it;
* a state file inside the tree's git directory (``.git/dsv4patch-resolve.json``,
  :class:`states.ResolveState`) naming the lock, pin, patch and the commits to
  return to.

The state file lives in the tree, which dsv4patch does not trust (see "What
dsv4patch trusts" in docs/trust.md): its commits must be commit ids, its paths
paths inside the tree, and it cannot choose where ``resolve`` writes.  The
lock is the one the command finds (``--lock``, ``$DSV4PATCH_LOCK``, the
checkout's ``locks/vllm.toml``) and must be the one the state names; the
cache, the kernel wheel's directory and the toolchain are the command's (the
state's values are only compared, never used): an option the apply's kernel
build was given (its wheel directory, interpreter, nvcc, accepted torch) that
``resolve --continue`` is not given is refused before anything is written,
with the command that gives it again (:func:`_finish_options`).

:func:`continue_workspace` turns the resolved tree into the refreshed patch (a
``format-patch`` of the resolution on top of the committed prefix), writes
it as the pin's variant (``patches/variants/PIN/NAME`` beside the series),
records it in the lock with the derived ``patched_tree`` and puts the tree
back at the prefix; the caller then applies again with ``three_way`` (the
next conflict opens the next workspace, or the series completes).
:func:`abort_workspace` puts the tree back at the commit it had before
``apply --3way``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from dsv4patch import git, safeio
from dsv4patch.checkout import conflicts, forkcheckout, states, transaction
from dsv4patch.checkout.states import ResolveState
from dsv4patch.errors import FetchError, ParameterError, TreeError, param
from dsv4patch.nextstep import Blank, Step, mention
from dsv4patch.pins import find_lock, materialize, open_lock, set_variant, update_derived
from dsv4patch.records import frozen
from dsv4patch.series import SeriesResult, Status, run_series, series_for_pin
from dsv4patch.seriesfile import read_patch_file

if TYPE_CHECKING:
    from dsv4patch.guard import Checkout
    from dsv4patch.pins import Context, Lock, Pin, PinRepo
    from dsv4patch.progress import Progress
    from dsv4patch.series import Patch, Series
    from dsv4patch.store import Store

STATE = "dsv4patch-resolve.json"
# The operation a workspace belongs to, as messages name it (``apply --3way``, ``resolve --continue``).
APPLY_3WAY = mention(Step.of("apply", three_way=True), bare=True)
GIT_APPLY_3WAY = ("git", "apply", "--3way")  # git's own option, not ours
_INDEX_LINE = re.compile(rb"^index ([0-9a-f]{7,64})\.\.[0-9a-f]{7,64}", re.M)


def variants_dir(lock: Lock, pin: Pin) -> Path:
    """Where a pin's variants live: ``variants/PIN`` beside its first series file."""
    return lock.series[pin.series[0]].path.parent / "variants" / pin.name


def state_path(gitdir: Path) -> Path:
    return gitdir / STATE


def has_workspace(gitdir: Path) -> bool:
    """Whether the tree of ``gitdir`` holds an open conflict workspace."""
    sp = state_path(gitdir)
    return sp.exists() or sp.is_symlink()


def read_state(gitdir: Path, path: Path) -> ResolveState:
    """The workspace's state; TreeError (exit 5) when there is none or it is not one dsv4patch wrote."""
    sp = state_path(gitdir)
    if not has_workspace(gitdir):
        opens = Step.of("apply", pin=Blank("P"), tree=path, three_way=True)
        raise TreeError(f"{path} has no conflict workspace (no {sp}); `{mention(opens)}` opens one when a "
                        "patch conflicts")
    try:
        state = states.read(ResolveState, sp)
    except (OSError, ValueError) as exc:
        raise TreeError(
            f"{sp} (the conflict workspace's state) is unreadable ({exc}); restore the tree "
            "yourself (`git reset --hard` to the commit you want) and delete the file"
        ) from None
    for key, oid in (("orig_head", state.orig_head), ("at", state.at)):
        if not git.has_object(path, f"{oid}^{{commit}}"):
            raise TreeError(
                f"{sp} names {key} {oid[:12]}, a commit {path} does not have: dsv4patch did not write "
                "this state. Restore the tree yourself (`git reset --hard` to the commit you want), "
                "then delete the file")
    return state


@frozen
class Invocation:
    """How ``apply --3way`` was run, recorded in the workspace for ``resolve --continue``.

    ``series``/``build`` are used again; ``cache_dir`` and the kernel build's options (``out``,
    ``python``, ``nvcc``, ``allow_torch``) are only shown (the command line to go on) and compared
    with ``resolve --continue``'s own, never used (:func:`_finish_options`)."""

    series: tuple[str, ...] | None = None
    cache_dir: Path | None = None
    build: bool = False
    out: Path | None = None
    python: str | None = None
    nvcc: str | None = None
    allow_torch: str | None = None


def _as_recorded(value: Path | str | None) -> str | None:
    """An option's value as a state records it: a directory absolute (the next command may run elsewhere)."""
    if isinstance(value, Path):
        return os.path.abspath(value)
    return value


@frozen
class Workspace:
    """An open conflict workspace: the patch, its conflicted files, the prefix commit, the state file."""

    patch: str
    conflicts: list[str]
    head: str
    state: Path
    notes: list[str]
    steps: tuple[Step, ...] = ()  # what to run next: finish it (resolve --continue), give it up (--abort)

    def to_json(self) -> dict[str, object]:
        return {"patch": self.patch, "conflicts": list(self.conflicts), "head": self.head,
                "state": str(self.state)}


def _seed_preimages(path: Path, pin: Pin, patch: Patch, *, ctx: Context) -> list[str]:
    """Copy the blobs the patch was made against into the tree's repository.

    ``git apply --3way`` merges only when it has the preimage blob named in
    each ``index`` line.  Objects are content-addressed, so the blob is looked
    up by id in the other pins of the lock (the default pin first), after
    running their series (which writes every intermediate blob); returns
    the ids still missing.
    """
    lock, store, progress = ctx.lock, ctx.store, ctx.progress
    wanted = {m.group(1).decode() for m in _INDEX_LINE.finditer(read_patch_file(patch.path, patch.name))}
    missing = sorted(a for a in wanted if set(a) != {"0"} and git.resolve_blob(path, a) is None)
    others = sorted((p for p in lock.pins.values() if p.name != pin.name),
                    key=lambda p: p.name != lock.default_pin)
    for other in others:
        if not missing:
            break
        try:
            repo = materialize(other, store, progress)
        except FetchError:  # a pin that cannot be fetched or verified now: try the next one
            continue
        for ran in (False, True):
            if ran:
                run_series(repo.repo, repo.base_commit, series_for_pin(lock, other))
            for abbrev in list(missing):
                full = git.resolve_blob(repo.repo, abbrev)
                if full:
                    git.hash_object(path, git.cat_blob(repo.repo, full))
                    missing.remove(abbrev)
            if not missing:
                break
    return missing


def open_workspace(
    *,
    ctx: Context,
    co: Checkout,
    pin: Pin,
    pinrepo: PinRepo,
    series: Series,
    result: SeriesResult,
    head: str | None,
    invocation: Invocation,
    orig_head: str | None = None,
    branch: str | None = None,
) -> Workspace | None:
    """Open a conflict workspace for the first patch that blocks; None if it is not a conflict.

    Called with the tree lock held (the checkout vetted: no merge driver a 3-way merge
    would run).  ``orig_head``: where ``--abort`` returns (through ``resolve --continue``,
    still the commit before the first ``apply --3way``).  ``branch``: ``apply --branch``: the
    new branch is made at ``head`` once every check passed (:func:`forkcheckout.start_branch`), and
    the workspace commits onto it.
    """
    path, lock = co.path, ctx.lock
    k = next(i for i, r in enumerate(result.patches) if r.status.blocks)
    failing, patch = result.patches[k], series.patches[k]
    if failing.status is not Status.CONFLICT:
        return None
    prefix = SeriesResult(result.pin, result.base_commit, result.base_tree, result.patches[:k])
    commits = transaction.plan_commits(path, pinrepo.base_commit, series, prefix)
    at = commits[-1] if commits else pinrepo.base_commit
    head = _workspace_head(path, pin, pinrepo, head, commits)
    _seed_or_refuse(path, pin, patch, ctx=ctx)
    # Nothing the user did not commit is overwritten: not by the prefix, not by the files the
    # 3-way merge creates.
    co.refuse_in_the_way(at, APPLY_3WAY, extra=[f.path for f in patch.files if f.source_path is None])
    made = forkcheckout.start_branch(co, branch, head) if branch is not None else None
    conflicted = _apply_3way(co, pin, patch, head, at)
    orig = orig_head or head
    _write_resolve_state(co.gitdir, lock, pin, pinrepo, invocation, patch=patch.name, patch_index=k,
                         orig_head=orig, at=at, conflicts=conflicted)
    steps = _workspace_steps(path, lock, invocation)
    notes = ([made] if made else []) + _workspace_notes(
        path, lock, pin, steps, patch=patch.name, why=failing.message, earlier=len(commits), at=at,
        orig=orig, conflicted=conflicted)
    return Workspace(patch.name, conflicted, at, state_path(co.gitdir), notes, steps)


def _workspace_head(path: Path, pin: Pin, pinrepo: PinRepo, head: str | None, commits: list[str]) -> str:
    """``head``, which must be the pin's base commit or a state dsv4patch made on it."""
    if head is None or (head != pinrepo.base_commit and head not in commits):
        raise TreeError(
            f"{path} is at {head}, which is neither pin {pin.name}'s base commit "
            f"{pinrepo.base_commit[:12]} nor a state dsv4patch made; check out the base commit "
            "or use a new directory"
        )
    return head


def _seed_or_refuse(path: Path, pin: Pin, patch: Patch, *, ctx: Context) -> None:
    """The files the patch was made against, into the checkout's objects (a 3-way merge needs
    them); refused, the tree unchanged, when no pin of the lock has them."""
    missing = _seed_preimages(path, pin, patch, ctx=ctx)
    lock = ctx.lock
    if missing:
        raise TreeError(
            f"{patch.name} conflicts on pin {pin.name}, and a 3-way merge needs the files the "
            f"patch was made against (blobs {', '.join(missing)}), which no pin of {lock.path} "
            f"has; add the pin the patch was made for to the lock (or regenerate the patch with "
            f"`git format-patch` against a pin of the lock), then run {APPLY_3WAY} again. "
            f"{path} was left unchanged"
        )


def _apply_3way(co: Checkout, pin: Pin, patch: Patch, head: str, at: str) -> list[str]:
    """Move the tree to ``at`` (the earlier patches committed) and merge ``patch`` 3-way: the
    conflicted paths; a merge git cannot even start puts the tree back at ``head``."""
    path = co.path
    if head != at:
        transaction.move_tree(co, head, at, APPLY_3WAY)
    res = git.apply_3way(path, patch.path)
    conflicted = git.unmerged_paths(path)
    if not res.ok and not conflicted:
        if head != at:
            transaction.move_tree(co, at, head, APPLY_3WAY)
        raise TreeError(
            f"{patch.name}: `{' '.join(GIT_APPLY_3WAY)}` could not merge it into pin {pin.name}:\n"
            f"{res.stderr.strip()}\n{path} was left unchanged; port it with "
            f"`{mention(Step.of('port', to=pin.name))}` or edit the patch by hand"
        )
    return conflicted


def _write_resolve_state(gitdir: Path, lock: Lock, pin: Pin, pinrepo: PinRepo, inv: Invocation, *, patch: str,
                         patch_index: int, orig_head: str, at: str, conflicts: list[str]) -> None:
    """The workspace's state file: what ``resolve --continue`` and ``--abort`` need, and the
    apply's own options to finish with."""
    states.write(state_path(gitdir), ResolveState(
        lock=os.path.abspath(lock.path), pin=pin.name,
        series=list(inv.series) if inv.series else None,
        patch=patch, patch_index=patch_index, orig_head=orig_head, at=at, base_commit=pinrepo.base_commit,
        cache_dir=_as_recorded(inv.cache_dir), build=inv.build, out=_as_recorded(inv.out), conflicts=conflicts,
        python=inv.python, nvcc=inv.nvcc, allow_torch=inv.allow_torch,
    ))


def _workspace_steps(path: Path, lock: Lock, inv: Invocation) -> tuple[Step, Step]:
    """What to run once the workspace is edited (``resolve --continue`` with the apply's lock, cache,
    and the kernel build's wheel directory and toolchain), and what gives it up (``resolve --abort``)."""
    return (_continue_step(path, lock.path, inv.cache_dir, inv if inv.build else Invocation()),
            Step.of("resolve", abort=True, tree=path))


def _continue_step(path: Path, lock_path: Path, cache_dir: Path | str | None, build: Invocation | ResolveState) -> Step:
    """``resolve --continue`` on ``path`` with the lock, the cache and ``build``'s kernel build options."""
    return Step.of("resolve", cont=True, tree=path, lock=lock_path, cache_dir=_as_recorded(cache_dir),
                   out=_as_recorded(build.out), python=build.python, nvcc=build.nvcc,
                   allow_torch=build.allow_torch)


def _workspace_notes(path: Path, lock: Lock, pin: Pin, steps: tuple[Step, Step], *, patch: str, why: str,
                     earlier: int, at: str, orig: str, conflicted: list[str]) -> list[str]:
    """What was done, and what to do next (edit or review, then continue or abort)."""
    cont, abort = steps
    if conflicted:
        where = f"conflicts in {', '.join(conflicted)} (conflict markers)"
        todo = "edit the files"
    else:
        where = "it merged cleanly (staged, not committed)"
        todo = f"review the merge (`git -C {path} diff --cached`)"
    return [
        f"{patch} conflicts on pin {pin.name}: {why}",
        f"committed {earlier} earlier patch(es) (HEAD {at[:12]}) and applied {patch} "
        f"3-way: {where}",
        f"next: {todo}, then `{mention(cont)}` (writes the "
        f"resolution as pin {pin.name}'s variant of {patch}, updates {lock.path.name}, "
        f"applies the rest); `{mention(abort)}` puts the tree back at "
        f"{orig[:12]}",
    ]


def _state_lock(given: Path | None, state: ResolveState, path: Path) -> Path:
    """The lock to use: found as every command finds it, and the one the state names."""
    named = Path(state.lock)
    try:
        found = find_lock(given)
    except ParameterError:
        again = Step.of("resolve", tree=path, lock=named)
        raise TreeError(
            f"the conflict workspace in {path} was opened with the lock {named}; pass it: "
            f"`{mention(again)} ...`") from None
    if os.path.abspath(found) != os.path.abspath(named):
        raise TreeError(
            f"the conflict workspace in {path} names the lock {named}, this command uses {found} "
            f"(from {param('lock')}, $DSV4PATCH_LOCK or the current directory); resolve writes the variant "
            f"into the lock it uses, so run it with `{param('lock')} {named}` if that is the lock you "
            "opened the workspace with"
        )
    return found


@frozen
class Continued:
    """A resolution written as a variant; what the caller needs to apply the rest."""

    lock: Lock  # the lock with the variant recorded (and ``series`` chosen, if the apply had it)
    pin: Pin
    state: ResolveState
    notes: list[str]


def _finish_options(path: Path, lock_path: Path, state: ResolveState, given: Invocation) -> list[str]:
    """The kernel build options the workspace's apply was given (``out``, ``python``, ``nvcc``,
    ``allow_torch``), against the command's own ``given``: one the command lacks is refused
    (ParameterError, exit 2, nothing changed) with the command that gives them all again; one it
    gives otherwise is its choice (a note).  Nothing when the apply did not build."""
    if not state.build:
        return []
    # (the parameter as a message names it, the apply's value, the command's)
    options = ((param("out"), state.out, _as_recorded(given.out)), (param("python"), state.python, given.python),
               (param("nvcc"), state.nvcc, given.nvcc), (param("allow_torch"), state.allow_torch, given.allow_torch))
    missing = [f"{name} {was}" for name, was, now in options if was is not None and now is None]
    if missing:
        both = dataclasses.replace(given, out=Path(state.out) if given.out is None and state.out else given.out,
                                   python=given.python or state.python, nvcc=given.nvcc or state.nvcc,
                                   allow_torch=given.allow_torch or state.allow_torch)
        again = _continue_step(path, lock_path, given.cache_dir or state.cache_dir, both)
        raise ParameterError(
            f"the conflict workspace in {path} was opened by {APPLY_3WAY} with {', '.join(missing)}, which this "
            f"command was not given: resolve builds the kernels with its own options, never with the tree's "
            f"state file's; run `{mention(again)}` (or give other values to choose them). Nothing was changed")
    return [f"the kernel build uses {name} {now} (the workspace was opened with {was})"
            for name, was, now in options if was is not None and now != was]


def continue_workspace(*, path: Path, lock_path: Path | None, store: Store, progress: Progress,
                       given: Invocation | None = None) -> Continued:
    """Write the resolution in ``path`` as the pin's variant and put the tree back at the prefix.

    ``lock_path``: the lock file the command was given (else found), which must be the
    one the state names; ``given``: the command's own cache and kernel build options, compared
    with the ones the workspace was opened with (:func:`_finish_options`: one missing is refused
    before anything is written).
    """
    with transaction.exclusive_checkout(path) as co:
        gitdir = co.gitdir
        state = read_state(gitdir, path)
        lock_path = _state_lock(lock_path, state, path)
        chosen = _finish_options(path, lock_path, state, given or Invocation())
        opened = open_lock(lock_path, state.series)
        pin = opened.pin(state.pin, given_as=None)
        series = series_for_pin(opened, pin)
        patch = next((p for p in series.patches if p.name == state.patch), None)
        if patch is None:
            raise TreeError(
                f"{state.patch} is no longer in pin {pin.name}'s series in {opened.path}; run "
                f"`{mention(Step.of('resolve', abort=True, tree=path))}`"
            )
        touched = sorted(set(state.conflicts) | set(patch.touched))
        left = conflicts.marked(path, touched) + [u for u in git.unmerged_paths(path) if u not in touched]
        if left:
            raise TreeError(
                f"{', '.join(left)} in {path} still hold conflict markers; edit them (keep the "
                "code you want, remove the <<<<<<< ======= >>>>>>> lines), then run "
                f"`{mention(Step.of('resolve', cont=True, tree=path))}` again (or {param('abort')})"
            )
        text = conflicts.resolution_patch(path, state.at, patch, series.patches.index(patch) + 1,
                                          len(series.patches))
        if text is None:
            raise TreeError(
                f"the resolution of {patch.name} changes nothing in {path}; if the pin does not "
                f"need it, set expect_patches.\"{patch.name}\" for pin {pin.name} in {opened.path} "
                f"and run `{mention(Step.of('resolve', abort=True, tree=path))}`"
            )
        target = variants_dir(opened, pin) / patch.name
        target.parent.mkdir(parents=True, exist_ok=True)
        safeio.atomic_write(target, text)
        set_variant(opened.path, pin.name, patch.name, target)
        notes = [f"wrote {target}: pin {pin.name}'s variant of {patch.name}, recorded in {opened.path}", *chosen]
        transaction.reset_tree(co, state.at, mention(Step.of("resolve", cont=True), bare=True))
        state_path(gitdir).unlink()
        opened = open_lock(lock_path, state.series)
        pin = opened.pin(pin.name, given_as=None)
        if not state.series:
            repo = materialize(pin, store, progress, checkout=path)
            res = run_series(repo.repo, repo.base_commit, series_for_pin(opened, pin))
            update_derived(opened.path, pin.name,
                           {"base_tree": repo.base_tree, "patched_tree": res.final_tree}, {})
            if res.final_tree:
                notes.append(f"pin {pin.name}: patched_tree {res.final_tree} in {opened.path}")
            opened = open_lock(lock_path, state.series)
            pin = opened.pin(pin.name, given_as=None)
    return Continued(opened, pin, state, notes)


def abort_workspace(path: Path) -> ResolveState:
    """Put ``path`` back at the commit it had before ``apply --3way``; the state that was closed."""
    with transaction.exclusive_checkout(path) as co:
        state = read_state(co.gitdir, path)
        transaction.reset_tree(co, state.orig_head, mention(Step.of("resolve", abort=True), bare=True))
        state_path(co.gitdir).unlink()
    return state
