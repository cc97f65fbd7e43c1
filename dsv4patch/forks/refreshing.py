"""Refresh: the commits of a tree on top of its pin's base become the series (``dsv4patch refresh``).

This is the patch-package / ``quilt refresh`` step: edit a tree made by
``apply`` (amend a patch's commit, add commits with ``git commit``), then
``refresh`` writes each commit back as a ``git format-patch`` file:

* a commit that still is what its patch makes (the patch file, applied
  exactly to the commit's parent, gives the commit's tree, and the message is
  the one ``apply`` writes) is left alone, so an untouched patch gives no
  churn even when an earlier commit was amended and the later ones rebased;
* a changed commit of a known patch (its ``Dsv4patch-Patch`` trailer) is
  written where the pin reads that patch from (its variant, else the series
  file), or as the pin's variant with ``--as-variant``; the header fields
  (author, date, subject, trailers) are the commit's, which ``apply`` took
  from the patch file; dsv4patch's own ``Dsv4patch-*`` trailers are dropped;
* a new commit becomes a new patch ``NNNN-subject.patch`` beside the pin's
  last series file, listed after the patch before it, with a header
  template (``Fix:``, ``Origin:``) to fill in.  Where that series is shared
  with other pins and the commit is a fork's (the tree is the fork's own
  checkout) or ``--as-variant`` was asked, the commit never enters the shared
  series: it goes to a series of the pin's own (``[series."PIN"]``, the file
  ``variants/PIN/series``, added to the pin's ``series`` in the lock), so no
  other pin's check changes; otherwise the note names the pins that now read it.

Written patches are numbered within their own series (``[PATCH n/7]`` for
the seven fixes, the extra series on its own), as ``port`` numbers them.

The lock's derived fields (``base_tree``, ``patched_tree``) are then
recomputed from the written series, exactly as ``lock --update`` does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4patch import childproc, git, guard, safeio
from dsv4patch.checkout import (
    checkout_pinrepo,
    commit_message,
    exclusive_checkout,
    has_workspace,
    is_fork_checkout,
    makes_commit,
    patch_of_commit,
    plan_commits,
    variants_dir,
)
from dsv4patch.errors import TreeError, param
from dsv4patch.nextstep import Step, mention
from dsv4patch.pins import materialize, open_lock, read_lock_text, set_variant, update_derived
from dsv4patch.records import frozen
from dsv4patch.series import Status, check_pin, run_series, series_for_pin
from dsv4patch.seriesfile import read_series_file, read_series_text

if TYPE_CHECKING:
    from dsv4patch.pins import Context, Lock, Pin, PinRepo
    from dsv4patch.series import Patch, Series

TEMPLATE = (
    "Fix: TODO one line naming the bug this fixes\n"
    "Origin: TODO the upstream PR or commit it comes from, or local\n"
)
_NUMBER = re.compile(r"^(\d{4})-")


def _strip_ours(message: str) -> tuple[str, str | None]:
    """The message without dsv4patch's trailers, and the patch name they named."""
    name = None
    kept = []
    for line in message.rstrip("\n").split("\n"):
        if line.startswith("Dsv4patch-"):
            if line.startswith("Dsv4patch-Patch:"):
                name = line.split(":", 1)[1].strip()
            continue
        kept.append(line)
    return "\n".join(kept).rstrip("\n") + "\n", name


def _same_change(path: Path, commit: str, tree_id: str, message: str, patch: Patch) -> bool:
    """Whether ``commit`` is still what ``patch`` makes: the patch applied exactly (no offset)
    to the commit's parent gives the commit's tree, and the message is the one apply writes."""
    if message != commit_message(patch):
        return False
    return makes_commit(path, commit, tree_id, patch)


def _with_template(message: str) -> str:
    paras = message.rstrip("\n").split("\n\n")
    if len(paras) > 1 and re.search(r"^Fix:", paras[-1], re.M):
        return message
    return message.rstrip("\n") + "\n\n" + TEMPLATE


def _slug(subject: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "-", subject).strip("-")[:52] or "patch"


@frozen
class RefreshResult:
    """What :func:`refresh` wrote: per patch its action and file, the series' tree next to the tree's."""

    lock: Path
    tree: Path
    pin: str
    ok: bool  # the written series gives the tree's HEAD tree
    patched_tree: str | None
    patches: dict[str, dict[str, str]]  # name -> {"action": unchanged | refreshed | new, "file": path}
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"lock": str(self.lock), "tree": str(self.tree), "pin": self.pin, "ok": self.ok,
                "patched_tree": self.patched_tree, "patches": self.patches, "notes": list(self.notes)}


def refresh(*, ctx: Context, pin: Pin, tree_path: Path, as_variant: bool = False,
            chosen_series: Sequence[str] | None = None) -> RefreshResult:
    """Write the commits of ``tree_path`` on top of ``pin``'s base back as its series.

    The context's lock was opened with ``chosen_series`` (``--series``, if any: then
    the lock's derived tree ids are not rewritten); ``as_variant``: changed
    patches become the pin's variants instead of overwriting shared series files.
    The tree is vetted and held through :func:`guard.guarded` for the whole refresh.
    """
    with guard.guarded(tree_path):
        return _refresh(ctx=ctx, pin=pin, path=Path(os.path.abspath(tree_path)), as_variant=as_variant,
                        chosen_series=chosen_series)


@frozen
class _Tree:
    """The tree's commits on the series' base, as refresh reads them."""

    base: str  # the commit the series sits on (the pin's base, or the fork's own commit)
    fork: bool  # a fork's own checkout
    commits: list[str]  # base..HEAD, oldest first


@frozen
class _Where:
    """Where a new commit's patch goes: the pin's last series, unless other pins share it and the
    commit must stay the pin's (a fork's own commit, or --as-variant): then its own series."""

    last: str
    sharing: list[str]
    own_series: str | None

    @property
    def series(self) -> str:
        return self.own_series or self.last


@dataclass
class _Plan:
    """What refresh writes, gathered commit by commit before anything is written."""

    done: dict[str, dict[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    writes: list[tuple[Path, str]] = field(default_factory=list)  # (patch file, its text)
    new_entries: list[tuple[str, str | None, str]] = field(default_factory=list)  # (series, after, name)
    variants: list[tuple[str, Path]] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)


def _refresh(*, ctx: Context, pin: Pin, path: Path, as_variant: bool,
             chosen_series: Sequence[str] | None) -> RefreshResult:
    lock = ctx.lock
    pinrepo = materialize(pin, ctx.store, ctx.progress, checkout=path)
    series = series_for_pin(lock, pin)
    plan = _Plan()
    with exclusive_checkout(path) as co:
        tree = _read_tree(path, co.gitdir, pinrepo, pin)
        where = _where_new_commits_go(lock, pin, as_variant=as_variant, fork=tree.fork)
        _plan_commits(path, lock, pin, series, tree, where, as_variant, plan)
    with childproc.uninterrupted():  # the patches, series files and lock: all of them or none
        _write_patches(plan.writes)
        lock = _write_series_entries(lock, pin, where, plan, chosen_series)
        for name, dest in plan.variants:
            set_variant(lock.path, pin.name, name, dest)
    return _check_written(pin, path, tree, pinrepo, plan, chosen_series, ctx=ctx.on(lock))


def _read_tree(path: Path, gitdir: Path, pinrepo: PinRepo, pin: Pin) -> _Tree:
    """The tree's commits on the series' base; refused if it is mid-conflict, dirty, not a tree of
    the pin, or holds merges."""
    if has_workspace(gitdir):
        finish = Step.of("resolve", cont=True, tree=path)
        raise TreeError(f"{path} holds an open conflict workspace; finish it with `{mention(finish)}` "
                        f"(or {param('abort')}) before refresh")
    dirty = git.dirty_paths(path)
    if dirty:
        raise TreeError(f"{path} has uncommitted changes ({', '.join(dirty[:5])}); refresh "
                        "writes commits: `git commit` (or `git commit --amend`) them first")
    head = git.head(path)
    base = pinrepo.base_commit
    fork = is_fork_checkout(path, pinrepo, head) and head is not None
    if fork and head is not None:
        base = checkout_pinrepo(path, pinrepo, head).base_commit  # the fork's own checkout
    if head is None or not git.has_object(path, f"{base}^{{commit}}") or not git.is_ancestor(path, base, head):
        raise TreeError(f"{path} is not a tree of pin {pin.name}: its HEAD does not descend from "
                        f"the pin's base commit {base[:12]}; pass the pin the tree was made from")
    commits = git.rev_list(path, f"{base}..{head}")
    merges = [c[:12] for c in commits if len(git.parents(path, c)) != 1]
    if merges:
        raise TreeError(f"{path}: commits {', '.join(merges)} are merges; a series is a line of "
                        "commits (rebase them onto the base first)")
    return _Tree(base, fork, commits)


def _where_new_commits_go(lock: Lock, pin: Pin, *, as_variant: bool, fork: bool) -> _Where:
    last = pin.series[-1]
    sharing = sorted(p.name for p in lock.pins.values() if p.name != pin.name and last in p.series)
    own_series = _own_series_name(lock, pin) if sharing and (as_variant or fork) else None
    return _Where(last, sharing, own_series)


def _plan_commits(path: Path, lock: Lock, pin: Pin, series: Series, tree: _Tree, where: _Where,
                  as_variant: bool, plan: _Plan) -> None:
    """Each commit on the base: unchanged (its patch, or a patch refreshed from it before), a new
    patch, or its patch refreshed; the patch texts to write go into ``plan``."""
    by_name = {p.name: p for p in series.patches}
    result = run_series(path, tree.base, series)
    planned = plan_commits(path, tree.base, series, result) if result.final_tree else []
    statuses = {r.patch: r.status for r in result.patches}  # an offset patch is rewritten
    numbers = [int(m.group(1)) for n in by_name if (m := _NUMBER.match(n))]
    next_number = max(numbers, default=0) + 1
    # Each commit's series (its patch's; a new commit joins where new commits go), for numbering
    # within a series.
    commit_series = []
    for c in tree.commits:
        cname = _strip_ours(git.commit_info(path, c).message)[1]
        commit_series.append(by_name[cname].series if cname in by_name else where.series)
    parent = tree.base
    for i, c in enumerate(tree.commits):
        info = git.commit_info(path, c)
        if info.tree == git.out(path, "rev-parse", f"{c}^^{{tree}}"):
            raise TreeError(f"commit {c[:12]} in {path} changes nothing (an empty patch); drop "
                            "it (`git rebase -i`) or amend a change into it, then refresh again")
        message, name = _strip_ours(info.message)
        if name is not None and name not in by_name:
            raise TreeError(f"commit {c[:12]} in {path} carries patch {name}, which is not in "
                            f"pin {pin.name}'s series; remove its Dsv4patch-Patch trailer to "
                            "make it a new patch")
        unchanged = _unchanged_patch(path, c, info.tree, info.message, name, series, statuses, plan.seen,
                                     same_prefix=planned[: i + 1] == tree.commits[: i + 1])
        if unchanged is not None:
            plan.done[unchanged.name] = {"action": "unchanged", "file": str(unchanged.path)}
            parent = c
            plan.seen.append(unchanged.name)
            continue
        if name is None:
            subject = message.split("\n", 1)[0]
            name = f"{next_number:04d}-{_slug(subject)}.patch"
            next_number += 1
            message = _with_template(message)
            dest = _plan_new_patch(lock, pin, name, where, tree.fork, by_name, plan)
            action = "new"
        elif as_variant or name in pin.variants:
            dest = variants_dir(lock, pin) / name
            plan.variants.append((name, dest))
            action = "refreshed"
        else:
            dest = by_name[name].path
            action = "refreshed"
        parent = git.commit_tree(path, info.tree, parent, message, info.author)
        same = [j for j, sn in enumerate(commit_series) if sn == commit_series[i]]
        plan.writes.append((dest, git.format_patch(path, parent, same.index(i) + 1, len(same))))
        plan.done[name] = {"action": action, "file": str(dest)}
        plan.seen.append(name)
    for name in by_name:
        if name not in plan.seen:
            plan.notes.append(f"{name} is in the series but not among {path}'s commits; remove it "
                              f"from {lock.series[by_name[name].series].path} if you dropped it")


def _unchanged_patch(path: Path, commit: str, tree_id: str, full_message: str, name: str | None,
                     series: Series, statuses: dict[str, Status], seen: list[str], *,
                     same_prefix: bool) -> Patch | None:
    """The series' patch ``commit`` leaves as it is, if any: its own (named by its trailer, applied
    exactly and made the same change), or, for a commit of yours without our trailer, a patch
    refreshed from it before (found by subject and change)."""
    by_name = {p.name: p for p in series.patches}
    if name is not None:
        exact = statuses.get(name) is not Status.OFFSET
        if exact and (same_prefix or _same_change(path, commit, tree_id, full_message, by_name[name])):
            return by_name[name]
        return None
    subject = _strip_ours(full_message)[0].split("\n", 1)[0]
    return patch_of_commit(path, commit, subject, tree_id, series.patches, seen)


def _plan_new_patch(lock: Lock, pin: Pin, name: str, where: _Where, fork: bool, by_name: dict[str, Patch],
                    plan: _Plan) -> Path:
    """Where the new patch ``name`` is written and listed (after the last patch of its series seen so far)."""
    sname = where.series
    after = next((s for s in reversed(plan.seen) if s in by_name and by_name[s].series == sname), None)
    plan.new_entries.append((sname, after, name))
    if where.own_series is not None:
        dest = variants_dir(lock, pin) / name
        why = "your fork's commit" if fork else f"{param('as_variant')} leaves the shared series alone"
        plan.notes.append(f"{name}: in pin {pin.name}'s own series {where.own_series!r} "
                          f"({dest.parent / 'series'}, added to the lock): series {where.last!r} is also "
                          f"read by {', '.join(where.sharing)} ({why}); to give it to them, move its "
                          f"line into {lock.series[where.last].path}")
    else:
        dest = lock.series[sname].path.parent / name
        if where.sharing:
            plan.notes.append(f"{name}: added to series {sname!r}, which pins {', '.join(where.sharing)} "
                              "also read: their check includes it from now on")
    plan.notes.append(f"{name}: new patch; fill in its header (Fix, Origin, and `Test: "
                      "<node id>` / `Upstream-Marker: <path>: <text>` where they apply)")
    return dest


def _write_patches(writes: list[tuple[Path, str]]) -> None:
    for dest, text in writes:
        dest.parent.mkdir(parents=True, exist_ok=True)
        safeio.atomic_write(dest, text)


def _write_series_entries(lock: Lock, pin: Pin, where: _Where, plan: _Plan,
                          chosen_series: Sequence[str] | None) -> Lock:
    """The new patches listed in their series files (the pin's own series added to the lock first);
    the lock as it is then."""
    if where.own_series is not None and plan.new_entries:
        _add_own_series(lock.path, pin, where.own_series, variants_dir(lock, pin) / "series")
        lock = open_lock(lock.path, tuple(chosen_series) if chosen_series else None)
    for sname, after, name in plan.new_entries:
        sfile = lock.series[sname].path
        lines = read_series_text(sfile, below=lock.project).splitlines() if sfile.exists() else []
        at = _line_after(sfile, lines, after, lock.project)
        rel = os.path.relpath((variants_dir(lock, pin) if sname == where.own_series
                               else lock.series[sname].path.parent) / name, sfile.parent)
        lines.insert(at, rel)
        safeio.atomic_write(sfile, "\n".join(lines) + "\n")
    return lock


def _line_after(sfile: Path, lines: list[str], after: str | None, project: Path) -> int:
    """The index in the series file's ``lines`` just after the entry of patch ``after`` (the end
    when there is none)."""
    if after is None:
        return len(lines)
    listed = [p.name for p in read_series_file(sfile, below=project)]
    if after not in listed:
        return len(lines)
    idx = listed.index(after)
    count = -1
    for j, line in enumerate(lines):
        if line.split("#", 1)[0].strip():
            count += 1
            if count == idx:
                return j + 1
    return len(lines)


def _check_written(pin: Pin, path: Path, tree: _Tree, pinrepo: PinRepo, plan: _Plan,
                   chosen_series: Sequence[str] | None, *, ctx: Context) -> RefreshResult:
    """Run the written series: it must give the tree's HEAD; the lock's derived tree ids follow."""
    lock = ctx.lock
    notes = plan.notes
    fresh = open_lock(lock.path, tuple(chosen_series) if chosen_series else None)
    fpin = fresh.pin(pin.name, given_as=None)
    keep_ids = bool(chosen_series)  # the lock's derived tree ids stay as they are
    if tree.fork:
        # The fork's own checkout: the written series is run on the commit it sits on there; the
        # lock's tree ids are the pin's, rewritten only when that commit has the pin's content.
        res = run_series(path, tree.base, series_for_pin(fresh, fpin))
        if git.out(path, "rev-parse", f"{tree.base}^{{tree}}") != pinrepo.base_tree:
            keep_ids = True
            notes.append(f"{path}: the series sits on {tree.base[:12]}, the fork's content on top of pin "
                         f"{pin.name}'s commit; the lock's tree ids were left as they are")
        elif not keep_ids:
            update_derived(fresh.path, pin.name, {"patched_tree": res.final_tree}, {})
    else:
        checked = check_pin(ctx=ctx.on(fresh), pin=fpin)
        repo, res = checked.repo, checked.result
        if not chosen_series:
            update_derived(fresh.path, pin.name,
                           {"base_tree": repo.base_tree, "patched_tree": res.final_tree}, {})
    head_tree = git.out(path, "rev-parse", "HEAD^{tree}")
    ok = res.final_tree == head_tree
    if not ok:
        notes.append(f"the written series gives tree {res.final_tree}, {path} has {head_tree}; "
                     f"run `{mention(Step.of('check', pin=pin.name))}` to see which patch differs")
    else:
        notes.append(f"pin {pin.name}: the written series gives {path}'s tree {head_tree}"
                     + ("" if keep_ids else f" (patched_tree in {fresh.path})"))
    if plan.writes and not keep_ids:
        notes += _update_other_pins(pin.name, {d.resolve() for d, _t in plan.writes}, ctx=ctx.on(fresh))
    if plan.writes:
        notes.append(f"the commits in {path} carry the old patch hashes; `{mention(Step.of('apply'))}` makes "
                     f"the refreshed series' commits on a new {param('tree')}")
    return RefreshResult(fresh.path, path, pin.name, ok, res.final_tree, plan.done, notes)


def _own_series_name(lock: Lock, pin: Pin) -> str:
    """The name of the series of ``pin``'s own (its name, else ``NAME-own``, ``NAME-own2``...)."""
    for candidate in (pin.name, f"{pin.name}-own", *(f"{pin.name}-own{i}" for i in range(2, 100))):
        if candidate not in lock.series or candidate in pin.series:
            return candidate
    raise TreeError(f"pin {pin.name}: no free series name for its own series in {lock.path}")


def _add_own_series(lock_path: Path, pin: Pin, name: str, sfile: Path) -> None:
    """``[series.NAME]`` (``default = false``: no other pin takes it) at ``sfile``, appended to
    ``pin``'s ``series`` in the lock (layout and comments kept); an empty series file."""
    import tomlkit

    sfile.parent.mkdir(parents=True, exist_ok=True)
    if not sfile.exists():
        safeio.atomic_write(sfile, f"# pin {pin.name}'s own patches (dsv4patch refresh)\n")
    doc = tomlkit.parse(read_lock_text(lock_path))
    series = doc["series"]
    if name not in series:
        table = tomlkit.table()
        table["path"] = os.path.relpath(sfile.resolve(), lock_path.resolve().parent)
        table["description"] = f"Pin {pin.name}'s own patches (refresh: its commits no other pin takes)"
        table["default"] = False
        # The comments and blank lines that end the last series table belong to the table after it
        # (tomlkit keeps them in the one before): they move below the new table, which follows its kin.
        tail = series[list(series.keys())[-1]].value.body if len(series) else []
        moved: list[tuple[Any, Any]] = []  # (None, a tomlkit comment or blank line)
        while tail and tail[-1][0] is None:
            moved.insert(0, tail.pop())
        for _, item in moved:
            table.value.body.append((None, item))
        if not moved:
            table.add(tomlkit.nl())
        series[name] = table
    entry = doc["pins"][pin.name]
    if name not in list(entry.get("series", [])):
        entry["series"] = [*pin.series, name]
    safeio.atomic_write(lock_path, tomlkit.dumps(doc))


def _update_other_pins(done_pin: str, written: set[Path], *, ctx: Context) -> list[str]:
    """The other pins that read a rewritten patch file get their derived tree ids
    recomputed too (as ``lock --update`` would), so the lock stays true for all of them."""
    lock = ctx.lock
    notes = []
    for other in lock.pins.values():
        if other.name == done_pin:
            continue
        try:
            files = {p.path.resolve() for p in series_for_pin(lock, other).patches}
        except Exception:
            continue
        if not files & written:
            continue
        try:
            checked = check_pin(ctx=ctx, pin=other)
            repo, res = checked.repo, checked.result
        except Exception as exc:
            notes.append(f"pin {other.name} also reads a rewritten patch; its tree ids were not "
                         f"recomputed ({exc}): run `{mention(Step.of('lock', update=True, pin=other.name))}`")
            continue
        if res.final_tree is None:
            notes.append(f"pin {other.name} also reads a rewritten patch and its series no longer "
                         f"applies: `{mention(Step.of('check', pin=other.name))}`")
            continue
        if update_derived(lock.path, other.name,
                          {"base_tree": repo.base_tree, "patched_tree": res.final_tree}, {}):
            notes.append(f"pin {other.name} also reads a rewritten patch: its patched_tree is now "
                         f"{res.final_tree}")
    return notes
