"""Applying a pin's series to a user's tree as commits: check first, then one atomic move.

The series is first run through :func:`engine.run_series` in a scratch index
of the target repository (exactly what ``check`` does).  Only when every patch
has its expected status and the final tree id is the lock's does the work
tree move, in one step (:func:`transaction.move_tree`: the new commits are
created as objects, a journal records (from, to), the work tree and HEAD are
switched, the journal is removed).  With ``three_way`` a conflict opens the
conflict workspace instead (:mod:`dsv4patch.checkout.resolving`).  Last, the CUDA
kernels the patches change are rebuilt by the ``build`` the caller passes,
or the call fails (a patched tree with stale kernels is half-patched).

``dsv4patch apply``, ``resolve --continue`` and ``wheel`` call
:func:`apply_pin`; it prints nothing and returns an :class:`ApplyResult`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from dsv4patch import git, guard
from dsv4patch.checkout import forkcheckout, resolving, transaction
from dsv4patch.checkout.resolving import Invocation
from dsv4patch.errors import BuildError, TreeError, param, writing
from dsv4patch.nextstep import Blank, Step, mention
from dsv4patch.pins import kind_of, materialize
from dsv4patch.records import frozen
from dsv4patch.series import carried, pin_report, run_series, series_for_pin

if TYPE_CHECKING:
    from dsv4patch.checkout.resolving import Workspace
    from dsv4patch.guard import Checkout
    from dsv4patch.kernels import TreeBuild
    from dsv4patch.pins import Context, Pin, PinRepo
    from dsv4patch.progress import Progress
    from dsv4patch.series import PinReport, Series, SeriesResult

# Rebuilds the kernels of a patched tree for a pin: returns the build's report (its "notes" are shown).
KernelBuild: TypeAlias = "Callable[[Path, Pin], TreeBuild]"  # the kernel build apply runs last, if any


@frozen
class ApplyResult:
    """What :func:`apply_pin` did to the tree (``ok`` False: nothing moved, or a workspace opened)."""

    lock: Path
    tree: Path
    pin: str
    report: PinReport
    ok: bool
    notes: list[str]
    head: str | None = None  # the tree's HEAD afterwards (None: left unchanged)
    workspace: Workspace | None = None
    build: TreeBuild | None = None  # the kernel build, when one ran

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"lock": str(self.lock), "tree": str(self.tree),
                               "pins": {self.pin: self.report.to_json()}, "ok": self.ok}
        if self.workspace is not None:
            out["workspace"] = self.workspace.to_json()
        if self.head is not None:
            out["head"] = self.head
        out["notes"] = list(self.notes)
        if self.build is not None:
            out["build"] = self.build.to_json()
        return out


def apply_pin(
    *,
    ctx: Context,
    pin: Pin,
    tree_path: Path,
    three_way: bool = False,
    build: KernelBuild | None = None,
    before_build: Callable[[ApplyResult], None] | None = None,
    notes: Sequence[str] = (),
    orig_head: str | None = None,
    invocation: Invocation | None = None,
    branch: str | None = None,
) -> ApplyResult:
    """Commit ``pin``'s series (of the context's lock) into the tree at ``tree_path`` (created from the pin if absent).

    ``three_way``: a conflict opens the conflict workspace, and a patch that
    applies with an offset is committed too.  ``build``: rebuild the kernels
    the patches change (None: do not), after ``before_build`` got the applied result.  ``notes`` come first in the result;
    ``orig_head`` and ``invocation`` are recorded in a workspace this opens
    (``resolve --continue`` passes the first apply's).  A ``git``/``local`` pin's tree may be
    the user's own checkout (HEAD at the pin's commit or a descendant, :mod:`dsv4patch.checkout.forkcheckout`):
    the series is checked against HEAD's content and committed on the current branch, or on
    a new ``branch`` made at HEAD.  Raises TreeError (exit
    5) for a tree it must not touch, BuildError when the kernels cannot be built.
    """
    path, lock, store, progress = tree_path, ctx.lock, ctx.store, ctx.progress
    pinrepo = materialize(pin, store, progress, checkout=tree_path)
    series = series_for_pin(lock, pin)
    out_notes = list(notes)
    with transaction.open_tree(path, pinrepo, progress=progress) as (co, created):
        out_notes += [created] if created else []
        _refuse_unfinished(co, path, out_notes)
        head = git.head(path)
        pin, pinrepo = _series_base(path, pin, pinrepo, head, branch, out_notes)
        result = _check_series(path, pin, pinrepo, series, progress)
        rep = pin_report(pin, pinrepo, result, lock.path)
        if three_way and result.final_tree is None:  # a conflict: the workspace to resolve it in
            with writing(TreeError, str(path), _ADVICE.format(path=path)):
                ws = resolving.open_workspace(
                    ctx=ctx, co=co, pin=pin, pinrepo=pinrepo, series=series, result=result, head=head,
                    invocation=invocation or Invocation(build=build is not None),
                    orig_head=orig_head, branch=branch)
            if ws is not None:
                return ApplyResult(lock.path, path, pin.name, rep, False, out_notes + ws.notes + rep.notes,
                                   head=ws.head, workspace=ws)
        final, problems = pinrepo.base_commit, _unappliable(path, pin, rep, result, three_way, out_notes)
        if problems is None:
            with progress.step(f"the series' commits for {path} ({len(series.patches)} patch(es))"):
                final, problems = _move(co, path, pin, pinrepo, series, result, head, branch, out_notes)
        if problems is not None:
            return ApplyResult(lock.path, path, pin.name, rep, False, out_notes + problems)  # nothing moved
    applied = ApplyResult(lock.path, path, pin.name, rep, True, out_notes, head=final)
    if build is None:
        return dataclasses.replace(applied, notes=out_notes + _not_built(path, pin, pinrepo))
    if before_build is not None:  # e.g. show the tree's result before a minutes-long build
        before_build(dataclasses.replace(applied, notes=list(out_notes)))
    built, build_notes = _build(path, pin, pinrepo, final, build)
    return dataclasses.replace(applied, notes=out_notes + build_notes, build=built)


_ADVICE = "free space or fix permissions under {path}, then run apply again (it finishes or refuses an interrupted move)"


def _refuse_unfinished(co: Checkout, path: Path, out_notes: list[str]) -> None:
    """Finish an interrupted apply (its journal), or refuse a tree another git command or an open
    conflict workspace holds, or one with uncommitted changes."""
    gitdir = co.gitdir
    transaction.clean_scratch(gitdir)
    done = transaction.recover(co)
    if done:
        out_notes.append(done)
    elif (gitdir / "index.lock").exists():
        raise TreeError(
            f"{gitdir / 'index.lock'} exists and no dsv4patch apply was interrupted in {path}: "
            "another git command is running there, or one was killed. Wait for it; if no git "
            "process is running, delete the file"
        )
    if resolving.has_workspace(gitdir):
        st = resolving.read_state(gitdir, path)
        raise TreeError(
            f"{path} holds the conflict workspace of {st.patch} (pin {st.pin}); finish it "
            f"with `{mention(Step.of('resolve', cont=True, tree=path))}` or undo it with "
            f"`{mention(Step.of('resolve', abort=True, tree=path))}`"
        )
    dirty = git.dirty_paths(path)
    if dirty:
        raise TreeError(
            f"{path} has uncommitted changes ({', '.join(dirty[:5])}"
            f"{', ...' if len(dirty) > 5 else ''}); commit, stash or remove them first"
        )


def _series_base(path: Path, pin: Pin, pinrepo: PinRepo, head: str | None, branch: str | None,
                 out_notes: list[str]) -> tuple[Pin, PinRepo]:
    """Where the series goes in the tree: the pin's base commit, or on a fork's own checkout the
    commit it sits on there (the lock's tree ids not compared when the fork's content differs)."""
    fork = forkcheckout.is_fork_checkout(path, pinrepo, head)
    if fork and head is not None:
        checked = forkcheckout.checkout_pinrepo(path, pinrepo, head)
        if checked.base_tree != pinrepo.base_tree:
            # The fork's own commits change the content: the lock's tree ids do not apply.
            out_notes.append(f"{path}: the series is checked against {checked.base_commit[:12]} "
                             f"(the fork's content on top of pin {pin.name}'s commit "
                             f"{pin.commit[:12]}); the lock's tree ids are not compared")
            pin = dataclasses.replace(pin, base_tree=None, patched_tree=None)
            checked = dataclasses.replace(checked, pin=pin)
        return pin, checked
    if branch is not None:
        raise TreeError(f"{param('branch')} goes with a checkout of a git or local pin (a fork); {path} "
                        f"is a tree dsv4patch made for pin {pin.name}")
    if not git.has_object(path, f"{pinrepo.base_commit}^{{commit}}"):
        raise TreeError(
            f"{path} is not a tree of pin {pin.name}: its history lacks the pin's base "
            f"commit {pinrepo.base_commit[:12]}"
            + (f" and its HEAD does not descend from the pin's commit {pin.commit[:12]}"
               if kind_of(pin).fork else "")
            + f"; use a new directory for {param('tree')}"
        )
    return pin, pinrepo


def _unappliable(path: Path, pin: Pin, rep: PinReport, result: SeriesResult, three_way: bool,
                 out_notes: list[str]) -> list[str] | None:
    """Why the series may not be committed (each patch that differs from the lock), or None.
    With --3way a patch that applies with an offset is committed too (the tree is the same);
    ``refresh --as-variant`` then writes the exact variant."""
    offsets = [n for n, v in rep.patches.items() if not v.ok and v.status == "offset"]
    accept_offsets = (three_way and result.final_tree is not None and not rep.notes
                      and all(v.ok or n in offsets for n, v in rep.patches.items()))
    if accept_offsets and offsets:
        exact = Step.of("refresh", pin=pin.name, tree=path, as_variant=True)
        out_notes.append(f"applied with offsets: {', '.join(offsets)}; next: `{mention(exact)}` writes them "
                         "as exact variants")
    if (not rep.ok and not accept_offsets) or result.final_tree is None:
        return [
            f"{name}: {v.status} (expected {v.expected}): {v.result.message}\n  next: {v.next}"
            for name, v in rep.patches.items() if not v.ok
        ] + rep.notes + [f"{path} was left unchanged"]
    return None


def _check_series(path: Path, pin: Pin, pinrepo: PinRepo, series: Series, progress: Progress) -> SeriesResult:
    """The series checked against the tree's base (one progress step)."""
    with writing(TreeError, str(path), _ADVICE.format(path=path)), \
            progress.step(f"check pin {pin.name}: {len(series.patches)} patch(es) against {path}"):
        return run_series(path, pinrepo.base_commit, series)


def _move(co: Checkout, path: Path, pin: Pin, pinrepo: PinRepo, series: Series, result: SeriesResult,
          head: str | None, branch: str | None, out_notes: list[str]) -> tuple[str, list[str] | None]:
    """Move the tree to the series' last commit (one journaled move): the final HEAD, and why
    nothing moved when the user's own commits above the series take out what a patch changed."""
    with writing(TreeError, str(path), _ADVICE.format(path=path)):
        commits = transaction.plan_commits(path, pinrepo.base_commit, series, result)
    final = commits[-1] if commits else pinrepo.base_commit
    if head == final:
        out_notes.append(f"{path} already has all patches of pin {pin.name}; nothing to do")
        return final, None
    if head is not None and (head == pinrepo.base_commit or head in commits):
        with writing(TreeError, str(path), _ADVICE.format(path=path)):
            co.refuse_in_the_way(final, "the apply")  # before a branch is made for it
            if branch is not None:
                out_notes.append(forkcheckout.start_branch(co, branch, head))
            transaction.move_tree(co, head, final)
        out_notes.append(
            f"applied {len(commits)} patch(es) to {path}: HEAD {final[:12]}, "
            f"tree {result.final_tree}"
        )
        return final, None
    if head is not None and git.is_ancestor(path, final, head):
        return head, _above_the_series(path, pin, series, result, head, final, out_notes)
    # HEAD may descend from the series' commits only part-way: the later patches are commits of the
    # user's own (`refresh` made them patches of the pin's series), found in HEAD's content as status does.
    below = next((c for c in reversed(commits[:-1]) if head is not None and git.is_ancestor(path, c, head)), None)
    if head is not None and below is not None:
        rest = [r.patch for r in result.patches if r.status.applies][commits.index(below) + 1:]
        return head, _above_the_series(path, pin, series, result, head, below, out_notes, rest)
    raise TreeError(
        f"{path} is at {head}, which is neither the commit pin {pin.name}'s series starts from "
        f"({pinrepo.base_commit[:12]}) nor a state dsv4patch made, nor a commit above the series "
        f"that carries it ({mention(Step.of('status', pin=pin.name, tree=path))} shows which patch it lacks); "
        f"apply the series to a new directory ({mention(Step.of('apply', pin=pin.name, tree=Blank('DIR')))}) "
        f"or check out {pinrepo.base_commit[:12]}"
    )


def _above_the_series(path: Path, pin: Pin, series: Series, result: SeriesResult, head: str, final: str,
                      out_notes: list[str], rest: Sequence[str] = ()) -> list[str] | None:
    """Commits of the user's own above the series dsv4patch made (``final``: the last commit of it HEAD
    descends from; ``rest``: the patches after that one, which only the user's commits can carry): apply
    agrees with ``status`` (the series, looked for in HEAD's content); None when they keep every patch."""
    above = git.rev_list(path, f"{final}..{head}")
    applied = [r.patch for r in result.patches if r.status.applies]
    with git.scratch_index(path, head) as env:
        found = carried(path, env, series)
    lost = [n for n in applied if found.get(n) is None]
    if rest:
        if lost:
            return [
                f"{path}: HEAD {head[:12]} has the series' commits up to {final[:12]} and {len(above)} commit(s) "
                f"of yours above them, which do not carry {', '.join(lost)}; nothing was changed. "
                f"`{mention(Step.of('status', pin=pin.name, tree=path))}` shows each patch; commit what they "
                f"change (or apply the series to a new directory: "
                f"`{mention(Step.of('apply', pin=pin.name, tree=Blank('DIR')))}`)"]
        out_notes.append(
            f"{path} has all patches of pin {pin.name}: the series' commits up to {final[:12]} and, in "
            f"{len(above)} commit(s) of yours above them, {', '.join(rest)} (found by content); nothing to do")
        return None
    if lost:
        return [
            f"{path}: HEAD {head[:12]} has the series (its last commit {final[:12]}) with "
            f"{len(above)} commit(s) of yours above it, and they take out what "
            f"{', '.join(lost)} changed; nothing was changed. `{mention(Step.of('status', tree=path))}` "
            "shows each patch; revert or fix those commits (or check out the series' last "
            "commit) to carry the whole series"]
    out_notes.append(
        f"{path} has all patches of pin {pin.name} (the series ends at {final[:12]}) and "
        f"{len(above)} commit(s) of yours above them, left as they are; nothing to do")
    return None


def _not_built(path: Path, pin: Pin, pinrepo: PinRepo) -> list[str]:
    """The note of an apply told not to build, where the series changed kernel sources: they are not rebuilt."""
    from dsv4patch.kernels import is_kernel_source

    with guard.guarded(path):
        changed = [p for p in git.changed_paths(path, pinrepo.base_commit) if is_kernel_source(p)]
    if not changed:
        return []
    return [f"the CUDA kernels the series changes ({len(changed)} file(s), e.g. {changed[0]}) were not rebuilt "
            f"(the build was skipped): the kernel fixes are not in effect until "
            f"`{mention(Step.of('build', tree=path, pin=pin.name))}` runs"]


def _build(path: Path, pin: Pin, pinrepo: PinRepo, head: str,
           build: KernelBuild) -> tuple[TreeBuild | None, list[str]]:
    """The last step of apply: kernels the patches touch are rebuilt, or the call fails."""
    from dsv4patch.kernels import is_kernel_source, plan_kernels

    with guard.guarded(path):
        changed = git.changed_paths(path, pinrepo.base_commit)
        if not (any(is_kernel_source(p) for p in changed) and plan_kernels(path).units):
            return None, ["no kernel sources changed: nothing to build"]
    try:
        report = build(path, pin)
    except BuildError as exc:
        raise BuildError(
            f"{path} is patched (HEAD {head[:12]}), but the CUDA kernels the "
            f"patches change were not rebuilt: {exc}\nRun `{mention(Step.of('build', tree=path, pin=pin.name))}` "
            f"on a machine with nvcc and torch, or pass {param('no_build')} to apply without it "
            "(the kernel fixes are then not in effect)"
        ) from None
    return report, list(report.notes)
