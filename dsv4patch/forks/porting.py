"""Porting a pin's series to a new vLLM pin, as one reviewable change.

For each patch, in order, against the new pin (scratch index, nothing else
touched), :func:`port_series` decides:

1. found upstream (markers, reverse-apply): dropped, with the evidence;
2. applies exactly (zero offset): kept as is, no variant;
3. applies with offsets: refreshed, written as a variant so it is ``clean``;
4. does not apply: a 3-way merge per file, with the old pin's pre- and
   post-patch contents as base and "theirs" (both pins' objects are read
   through one repository with alternates, so every blob is at hand).  A clean
   merge becomes a variant; a conflict is reported per hunk with both sides.

A maintainer's earlier port (``resolutions``, same file names) wins where it
has a patch that applies exactly, and the result says whether the automatic
port gives the same tree (and if not, which files differ).

:func:`port` runs the whole port for ``dsv4patch port``: the new pin
(:func:`new_pin`), the series, and only when every patch is settled the
variants, the report and the new lock entry (:func:`write_result`, all or
nothing); a conflict with a ``workspace`` leaves it as a tree of the new pin
to edit (:mod:`dsv4patch.forks.portspace`): a new directory, or the fork's own
checkout when the port goes to that fork (:func:`own_workspace`), whose
branches stay where they are.  :func:`abort` gives a workspace up.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tarfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomlkit

from dsv4patch import childproc, git, guard, index, report, safeio
from dsv4patch.checkout import (
    committed_series,
    content_tree,
    exclusive_checkout,
    has_workspace,
    interrupted,
    is_empty,
    is_fork_checkout,
    open_tree,
    recover_tree,
)
from dsv4patch.errors import FetchError, LockFileError, ParameterError, PatchFileError, TreeError, param
from dsv4patch.forks import portspace
from dsv4patch.nextstep import Blank, Step, mention
from dsv4patch.pins import (
    Pin,
    Source,
    git_url_problem,
    kind_of,
    load_lock,
    materialize,
    read_lock_text,
    valid_pin_name,
    version_commit,
)
from dsv4patch.records import frozen
from dsv4patch.series import (
    Status,
    carried,
    carried_result,
    check_one,
    load_patch,
    run_series,
    series_for_pin,
)
from dsv4patch.seriesfile import read_patch_file, read_series_file
from dsv4patch.urls import redact

if TYPE_CHECKING:
    from dsv4patch.checkout import (
        Committed,
        PortState,
    )
    from dsv4patch.pins import (
        Context,
        Lock,
        PinRepo,
    )
    from dsv4patch.series import (
        Patch,
        PatchResult,
        Series,
    )


@frozen
class Conflict:
    """One hunk (or a whole file, ``hunk`` 0) that the port could not carry, with both sides."""

    file: str
    hunk: int
    target: str  # what the new pin has there
    patch: str  # what the patch wants
    line: int | None = None  # where the conflict starts in the merged file

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "hunk": self.hunk}
        if self.line is not None:
            out["line"] = self.line
        out.update(target=self.target, patch=self.patch)
        return out


@frozen
class Ported:
    """What the port did with one patch."""

    patch: Patch
    action: str  # keep | refresh | merge | resolved | drop | conflict | not-ported
    detail: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    conflicts: list[Conflict] = field(default_factory=list)
    text: str | None = None  # the variant's format-patch text
    status: str = "upstream"  # a drop: the status check gives it on the new pin (upstream, already-applied)
    # a conflict: each file of the patch as the 3-way merge left it (markers where it could not decide)
    merged: dict[str, bytes] = field(default_factory=dict)


def new_pin(*, ctx: Context, src: Pin, to: str | None,
            git_url: str | None = None, local: Path | None = None, name: str | None = None,
            dry_run: bool = False) -> Pin:
    """The pin to port to: vLLM ``to`` on PyPI, commit ``to`` of ``git_url``, or the checkout ``local``.

    ``name``: the new pin's name (default: the version, or ``fork-<commit>``).  A name that
    is already a pin of the lock is refused, except with ``dry_run`` when that pin is ``to``
    (its version or commit): then that pin itself is returned, to compare the port with."""
    if git_url and local:
        raise ParameterError(f"{param('git')} and {param('local')} both name the new pin's source; pass one")
    if local is not None:
        local = Path(os.path.abspath(local))
        to = _local_commit(local, to)
    to = _checked_to(to, git_url, local)
    name = _new_pin_name(name, to, git_url, local)
    existing = _existing_pin(ctx.lock, name, to, dry_run)
    if existing is not None:
        return existing
    if local is not None:
        return Pin(name=name, vllm_version=name, commit=to,
                   source=Source(kind="local", path=local),
                   cuda_arch_list=src.cuda_arch_list, series=src.series, expect="clean")
    if git_url:
        return _git_pin(name, to, git_url, src)
    return _pypi_pin(name, to, src, ctx=ctx)


def _local_commit(local: Path, to: str | None) -> str:
    """The commit a ``local`` checkout is at (the port's base where it is the port's own
    workspace), which ``to``, if given, must be."""
    if not guard.is_checkout_root(local):
        raise ParameterError(f"{param('local')} {local}: not the root of a git checkout")
    with guard.guarded(local, role=param("local")):
        head = git.head(local)
    opened = portspace.read_state(local)
    if opened is not None and opened.own:
        # The checkout is this port's workspace: HEAD is detached at the ported patches;
        # the pin is still the commit the port began at.
        head = opened.base_commit
    to = to or head
    if not to or not re.fullmatch(r"[0-9a-f]{40}", to):
        raise ParameterError(f"{param('local')} needs {param('to')} to be a full 40-hex commit id (or "
                             f"nothing: HEAD), got {to!r}")
    if to != head:
        raise ParameterError(f"{param('local')} {local} is at {head}, not {param('to')} {to}; check out {to} "
                             "there first")
    return to


def _checked_to(to: str | None, git_url: str | None, local: Path | None) -> str:
    """``to`` is given, and is a commit only where a remote or a checkout says where it lives."""
    if to is None:
        raise ParameterError(f"{param('to')} is required (a vLLM version on PyPI, or a commit with {param('git')} or "
                             f"{param('local')})")
    if re.fullmatch(r"[0-9a-f]{7,40}", to) and not git_url and local is None:
        raise ParameterError(
            f"{param('to')} {to} looks like a commit id, not a vLLM release: name where to fetch it with "
            f"{param('git')} URL (a remote) or {param('local')} PATH (a checkout of a fork)"
        )
    return to


def _new_pin_name(name: str | None, to: str, git_url: str | None, local: Path | None) -> str:
    """The new pin's name: the one given, else the version, else ``fork-<commit>``; checked."""
    name = name or (to if local is None and not git_url else f"fork-{to[:12]}")
    if not valid_pin_name(name):
        raise ParameterError(
            f"pin name {name!r} is not allowed ({param('name')}, or {param('to')}); use letters, digits, '.', "
            "'_', '+' and '-' (no '/', spaces or '..')"
        )
    return name


def _existing_pin(lock: Lock, name: str, to: str, dry_run: bool) -> Pin | None:
    """The lock's pin ``name`` when a dry run ports to that very pin (to compare with); a name
    already taken is refused otherwise."""
    if name not in lock.pins:
        return None
    have = lock.pins[name]
    if dry_run and to in (have.vllm_version, have.commit, name):
        return have
    hint = (f"; `{param('dry_run')}` compares the port with it" if to in (have.vllm_version, have.commit, name)
            else "")
    raise LockFileError(f"{lock.path}: pin {name!r} already exists; pass {param('name')} NEW to add "
                        f"another pin{hint}")


def _git_pin(name: str, to: str, git_url: str, src: Pin) -> Pin:
    """Commit ``to`` of the remote ``git_url`` (a full commit id, a URL we may fetch)."""
    if not re.fullmatch(r"[0-9a-f]{40}", to):
        raise LockFileError(f"{param('git')} needs {param('to')} to be a full 40-hex commit id")
    problem = git_url_problem(git_url)
    if problem:
        raise LockFileError(f"{param('git')} {redact(git_url)!r} is refused: {problem}")
    return Pin(name=name, vllm_version=name, commit=to, source=Source(kind="git", url=git_url),
               cuda_arch_list=src.cuda_arch_list, series=src.series, expect="clean")


def _pypi_pin(name: str, to: str, src: Pin, *, ctx: Context) -> Pin:
    """vLLM ``to`` on PyPI: its sdist fetched and pinned by hash, the commit read from its
    ``vllm/_version.py``."""
    info = index.find_sdist("vllm", to)
    blob = ctx.store.fetch_blob(info.url, info.sha256, info.size, f"vllm {to} sdist", ctx.progress)
    what = f"vllm {to} sdist"
    try:
        with tarfile.open(blob, "r:gz") as tar:
            member = tar.extractfile(f"vllm-{to}/vllm/_version.py")
            data = member.read() if member else b""
    except (tarfile.TarError, EOFError, OSError, KeyError) as exc:
        raise FetchError(f"{what}: cannot read vllm/_version.py ({exc})") from None
    commit = version_commit(data, f"{what}: vllm/_version.py")
    source = Source(kind="pypi-sdist", name="vllm", version=to, sha256=info.sha256,
                    size=info.size, url=info.url)
    return Pin(name=name, vllm_version=to, commit=commit, source=source,
               cuda_arch_list=src.cuda_arch_list, series=src.series, expect="clean")


_VERSION_ASSIGN = re.compile(r"^(?:__version__|version)\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", re.M)


@frozen
class ForkVersion:
    """The vLLM version of a git/local pin's tree, and where it was read."""

    version: str
    whence: str


def fork_version(repo: PinRepo, src: Pin) -> ForkVersion:
    """The vLLM version of a git/local pin's tree.

    From ``vllm/_version.py`` when the tree has one, else ``git describe
    --tags`` of a local checkout, else the source pin's version with the
    commit as local part (``0.27.1+g6e448d0ea9bf``).
    """
    entry = git.ls_tree_entry(repo.repo, repo.base_commit, "vllm/_version.py")
    if entry:
        m = _VERSION_ASSIGN.search(git.cat_blob(repo.repo, entry.oid).decode("utf-8", "replace"))
        if m:
            return ForkVersion(m.group(1), "vllm/_version.py")
    pin = repo.pin
    own = kind_of(pin).checkout_path(pin.source)
    if own is not None:
        with guard.guarded(own, role=f"pin {pin.name}'s local checkout"):
            tag = git.describe(own, pin.commit)
        if tag and tag != pin.commit[: len(tag)]:
            return ForkVersion(tag.lstrip("v"), "git describe --tags")
    base = src.vllm_version.split("+", 1)[0]
    return ForkVersion(f"{base}+g{pin.commit[:12]}", f"no version in the tree; {src.name}'s version and the commit")


@dataclass
class _Porting:
    """What the steps of :func:`port_series` share: the scratch index on the new pin, the old
    pin's trees around each patch, and the commit the next ported patch goes on."""

    work_repo: Path
    env: dict[str, str]
    new: PinRepo
    series: Series
    new_name: str
    resolutions: Path | None
    committed: dict[str, Committed]
    before_tree: dict[str, str]  # the old pin's tree before each patch (the merge's base)
    after_tree: dict[str, str | None]  # ... and after it ("theirs")
    parent: str
    peeled: dict[str, str | None] | None = None  # the series peeled off the new pin, on first need


def port_series(
    work_repo: Path,
    old: PinRepo,
    new: PinRepo,
    series: Series,
    new_name: str,
    resolutions: Path | None = None,
    committed: dict[str, Committed] | None = None,
) -> list[Ported]:
    """Port each patch of ``series`` from ``old`` to ``new`` (see the module docstring).

    ``committed``: the patches dsv4patch committed in the new pin's history (a fork that
    carries the series as dsv4patch's commits, :func:`forkcheckout.committed_series`): a patch the
    new pin's content carries is dropped with its commit as evidence, also where later
    patches of the series changed its lines (:func:`engine.carried`)."""
    before_tree, after_tree = _old_trees(work_repo, old, series)
    out: list[Ported] = []
    with git.scratch_index(work_repo, new.base_commit) as env:
        state = _Porting(work_repo, env, new, series, new_name, resolutions, committed or {},
                         before_tree, after_tree, parent=new.base_commit)
        for number, patch in enumerate(series.patches, start=1):
            ported = _port_one(state, patch)
            out.append(ported)
            if ported.action == "conflict":
                return out + [Ported(p, "not-ported", "after a conflict") for p in series.patches[number:]]
    return out


def _old_trees(work_repo: Path, old: PinRepo, series: Series) -> tuple[dict[str, str], dict[str, str | None]]:
    """The old pin's tree before and after each patch: the base and "theirs" of a 3-way merge."""
    old_result = run_series(work_repo, old.base_commit, series)
    if old_result.final_tree is None:
        raise LockFileError(f"the series does not apply to its own pin {old.pin.name}; run check")
    before_tree = {}
    prev = old.base_tree
    for r in old_result.patches:
        before_tree[r.patch] = prev
        if r.status.applies and r.tree:
            prev = r.tree
    return before_tree, {r.patch: r.tree for r in old_result.patches}


def _port_one(state: _Porting, patch: Patch) -> Ported:
    """One patch against the index the earlier patches left: drop, keep, refresh, merge, resolved
    or conflict (a ported patch is committed on ``state.parent``)."""
    tree_before = git.write_tree(state.work_repo, state.env)
    res = _check_on_new(state, patch)
    if res.status in (Status.UPSTREAM, Status.ALREADY_APPLIED):
        return _dropped(patch, res, state.committed.get(patch.name))
    merged: dict[str, bytes] = {}
    auto, conflicts = _automatic(state, patch, res, merged)
    auto_tree = None if conflicts else git.write_tree(state.work_repo, state.env)
    hand = _resolution(state.resolutions, patch)
    if hand is not None:
        resolved = _apply_resolution(state, patch, hand, tree_before, auto, auto_tree, conflicts)
        if resolved is not None:
            return resolved
    if conflicts:
        return Ported(patch, "conflict", res.message, conflicts=conflicts, merged=merged)
    return _commit_automatic(state, patch, auto, auto_tree or "")


def _check_on_new(state: _Porting, patch: Patch) -> PatchResult:
    """The patch's status on the new pin; a conflict where the new pin carries the series (the
    reverse applies once the later patches are peeled off) is ``already-applied``."""
    res = check_one(state.work_repo, state.env, patch)
    if res.status is Status.CONFLICT:
        if state.peeled is None:
            with git.scratch_index(state.work_repo, state.new.base_commit) as peel_env:
                state.peeled = carried(state.work_repo, peel_env, state.series)
        if state.peeled.get(patch.name) == "reverse-apply":
            res = carried_result(patch)
    return res


def _dropped(patch: Patch, res: PatchResult, made: Committed | None) -> Ported:
    """A patch the new pin already has: dropped, with the evidence (and the fork's commit of it)."""
    evidence = dict(res.evidence)
    detail = res.message
    if made is not None:
        same_sha = made.sha256 == patch.sha256
        evidence["committed_by_dsv4patch"] = made.commit
        detail = (f"committed by dsv4patch in {made.commit[:12]} (its Dsv4patch-Sha256 "
                  + ("is the series' patch" if same_sha else f"{made.sha256[:12]} is another "
                     f"version of it, the series has {patch.sha256[:12]}")
                  + f"); {res.message}")
    return Ported(patch, "drop", detail, evidence, status=res.status.value)


def _automatic(state: _Porting, patch: Patch, res: PatchResult,
               merged: dict[str, bytes]) -> tuple[Ported, list[Conflict]]:
    """What the port does by itself: keep, refresh, or a 3-way merge (its conflicts, and each
    merged file into ``merged``)."""
    if res.status is Status.CLEAN:
        return Ported(patch, "keep", "applies with zero offset"), []
    if res.status is Status.OFFSET:
        return Ported(patch, "refresh", res.message), []
    conflicts = _merge(state.work_repo, state.env, patch, state.before_tree[patch.name],
                       state.after_tree[patch.name] or "", merged)
    return Ported(patch, "merge", f"3-way merge ({res.status.value}: {res.message})"), conflicts


def _resolution(resolutions: Path | None, patch: Patch) -> Path | None:
    """The maintainer's resolution of ``patch`` (same file name), if there is one; a link or a
    non-file there is refused, never followed."""
    hand = resolutions / patch.name if resolutions else None
    if hand is not None and os.path.lexists(hand) and not safeio.is_regular(hand):
        kind = "a symbolic link" if hand.is_symlink() else "not a regular file"
        raise PatchFileError(f"{param('resolutions')} {hand} is {kind}; a resolution must be a file in the "
                             "directory itself (copy it there), dsv4patch does not follow links")
    return hand if hand is not None and hand.exists() else None


def _apply_resolution(state: _Porting, patch: Patch, hand: Path, tree_before: str, auto: Ported,
                      auto_tree: str | None, conflicts: list[Conflict]) -> Ported | None:
    """A maintainer's resolution wins; say whether the automatic port agrees.  One that does not
    apply is added to ``conflicts`` (None returned)."""
    git.read_tree(state.work_repo, tree_before, state.env)
    res2 = check_one(state.work_repo, state.env, load_patch(hand, patch.series, patch.name))
    if res2.status is not Status.CLEAN:
        conflicts.append(Conflict(str(hand), 0, "", f"the resolution does not apply: {res2.status.value}"))
        return None
    hand_tree = git.write_tree(state.work_repo, state.env)
    if auto_tree is None:
        verdict = f"automatic 3-way merge conflicted ({len(conflicts)} hunk(s))"
    elif auto_tree == hand_tree:
        verdict = f"automatic {auto.action} gives the same tree"
    else:
        differ = git.out(state.work_repo, "diff", "--name-only", auto_tree, hand_tree)
        verdict = f"automatic {auto.action} differs in {', '.join(differ.split())}"
    text = safeio.read_text(hand, error=PatchFileError)
    state.parent = git.commit_tree(state.work_repo, hand_tree, state.parent, patch.message, patch.author)
    return Ported(patch, "resolved", f"{hand} ({verdict})", text=text)


def _commit_automatic(state: _Porting, patch: Patch, auto: Ported, auto_tree: str) -> Ported:
    """Commit the automatic port on ``state.parent``; a patch that changed gets a note in its
    message and its variant's text."""
    message = patch.message
    if auto.action != "keep":
        message = _note(message, f"Ported to vLLM {state.new_name} by dsv4patch port: "
                                 f"{auto.action} ({auto.detail}).")
    commit = git.commit_tree(state.work_repo, auto_tree, state.parent, message, patch.author)
    if auto.action != "keep":
        # Numbered within its own series: [PATCH n/7] for the seven
        # fixes, the extra series on its own ([PATCH n/2]).
        same = [p for p in state.series.patches if p.series == patch.series]
        auto = dataclasses.replace(auto, text=git.format_patch(
            state.work_repo, commit, same.index(patch) + 1, len(same)
        ))
    state.parent = commit
    return auto


def _note(message: str, line: str) -> str:
    paras = message.rstrip("\n").split("\n\n")
    if len(paras) > 1:
        return "\n\n".join(paras[:-1] + [line, paras[-1]]) + "\n"
    return message.rstrip("\n") + "\n\n" + line + "\n"


def _merge(repo: Path, env: dict[str, str], patch: Patch, base_tree: str, theirs_tree: str,
           merged_out: dict[str, bytes] | None = None) -> list[Conflict]:
    """3-way merge each file of ``patch`` into the scratch index; conflicts per hunk.

    ``merged_out`` receives each merged file's text, conflict markers included
    (what ``port --workspace`` writes into the work tree).
    """
    conflicts: list[Conflict] = []
    staged: list[tuple[str, str]] = []
    for f in patch.files:
        theirs = git.ls_tree_entry(repo, theirs_tree, f.path)
        base = git.ls_tree_entry(repo, base_tree, f.source_path) if f.source_path else None
        ours = git.index_blob(repo, env, f.source_path or f.path)
        if f.is_removed:
            conflicts.append(Conflict(f.path, 0, "", "(deletes the file)"))
            continue
        if ours is None and base is not None:
            conflicts.append(Conflict(f.path, 0, "(file missing in the new pin)", f"(modifies {f.source_path})"))
            continue
        base_data = git.cat_blob(repo, base.oid) if base else b""
        theirs_data = git.cat_blob(repo, theirs.oid) if theirs else b""
        merge = git.merge_file(repo, ours or b"", base_data, theirs_data)
        clean, merged = merge.clean, merge.text
        if merged_out is not None:
            merged_out[f.path] = merged
        if not clean:
            conflicts += _conflict_hunks(f.path, merged)
            continue
        staged.append((f.path, git.hash_object(repo, merged)))
    if not conflicts:
        for path, oid in staged:
            git.update_index_blob(repo, env, path, oid)
    return conflicts


def _conflict_hunks(path: str, merged: bytes) -> list[Conflict]:
    hunks: list[Conflict] = []
    state: str | None = None
    ours: list[str] = []
    theirs: list[str] = []
    start = 0
    for n, line in enumerate(merged.decode("utf-8", errors="replace").splitlines(), start=1):
        if line.startswith("<<<<<<< "):
            state, ours, theirs, start = "ours", [], [], n
        elif line.startswith("||||||| ") and state:
            state = "base"
        elif line.startswith("=======") and state:
            state = "theirs"
        elif line.startswith(">>>>>>> ") and state:
            hunks.append(Conflict(path, len(hunks) + 1, "\n".join(ours), "\n".join(theirs), line=start))
            state = None
        elif state == "ours":
            ours.append(line)
        elif state == "theirs":
            theirs.append(line)
    return hunks


def write_result(lock: Lock, pin: Pin, ported: list[Ported], new: PinRepo, final_tree: str) -> list[Path]:
    """Variants, report and lock entry, staged then moved into place: all of them or none (an interrupt
    waits for the whole write; a failed one leaves no stage behind)."""
    vdir = lock.path.parent.parent / "patches" / "variants" / pin.name
    stage = vdir.with_name(f".{pin.name}.port-tmp")
    with childproc.uninterrupted():
        shutil.rmtree(stage, ignore_errors=True)  # what a killed port left
        stage.mkdir(parents=True)
        try:
            return _write_staged(lock, pin, ported, new, final_tree, vdir, stage)
        finally:
            shutil.rmtree(stage, ignore_errors=True)  # moved into place already, unless the write failed


def _write_staged(lock: Lock, pin: Pin, ported: list[Ported], new: PinRepo, final_tree: str, vdir: Path,
                  stage: Path) -> list[Path]:
    written: list[Path] = []
    variants = {}
    own = {f.resolve() for sname in pin.series
           for f in read_series_file(lock.series[sname].path, below=lock.project)}
    for p in ported:
        if p.text:
            (stage / p.patch.name).write_text(p.text)
            variants[p.patch.name] = os.path.relpath(vdir / p.patch.name, lock.path.parent)
            written.append(vdir / p.patch.name)
        elif p.action == "keep" and p.patch.path.resolve() not in own:
            # The source pin's variant, applying exactly here: the new pin takes the same file (the
            # series' own one is not what was checked, and may not apply).
            variants[p.patch.name] = os.path.relpath(p.patch.path, lock.path.parent)
    (stage / "PORT.md").write_text(port_report(lock, pin, ported))
    written.append(vdir / "PORT.md")
    doc = tomlkit.parse(read_lock_text(lock.path))
    entry = tomlkit.table()
    entry["vllm_version"] = pin.vllm_version
    entry["commit" if len(pin.commit) == 40 else "commit_abbrev"] = pin.commit
    if pin.cuda_arch_list is not None:
        entry["cuda_arch_list"] = list(pin.cuda_arch_list)
    entry["series"] = list(pin.series)
    dropped = {p.patch.name: p.status for p in ported if p.action == "drop"}
    all_dropped = len(dropped) == len(ported) and set(dropped.values()) == {"upstream"}
    entry["expect"] = "upstream" if all_dropped else "clean"
    if dropped and not all_dropped:
        entry["expect_patches"] = dropped
    if variants:
        entry["variants"] = variants
    entry["base_tree"] = new.base_tree
    entry["patched_tree"] = final_tree
    src = tomlkit.table()
    src.update(kind_of(pin).to_entry(pin.source, lock.path.parent))
    entry["source"] = src
    doc["pins"][pin.name] = entry
    text = tomlkit.dumps(doc)
    if vdir.exists():
        shutil.rmtree(vdir)
    os.replace(stage, vdir)
    safeio.atomic_write(lock.path, text)
    return written


def port_report(lock: Lock, pin: Pin, ported: list[Ported]) -> str:
    lines = [f"# Port of the series to vLLM {pin.vllm_version} (pin {pin.name})", "",
             f"Source: {pin.source.kind} {kind_of(pin).describe(pin.source)}, commit {pin.commit}.", "",
             "| patch | action | detail |", "|---|---|---|"]
    for p in ported:
        lines.append(f"| {p.patch.name} | {p.action} | {p.detail.replace('|', '/')} |")
    for p in ported:
        if p.evidence:
            lines += ["", f"## {p.patch.name}: dropped, evidence", ""] + evidence_lines(p.evidence)
    lines += ["", f"Re-check with `{mention(Step.of('check', pin=pin.name))}`; prove with "
              f"`{mention(Step.of('verify', pin=pin.name))}`.", ""]
    return report.words("\n".join(lines))  # a document the user reads: in the command line's words


def evidence_lines(evidence: dict[str, Any]) -> list[str]:
    """Why a patch was found upstream, as Markdown list items."""
    lines = []
    if evidence.get("decided_by"):
        lines.append(f"- decided by: {', '.join(evidence['decided_by'])}")
    for m in evidence.get("markers", []):
        lines.append(f"- marker: `{m['path']}` contains `{m['text']}`")
    if "forward_apply" in evidence:
        lines.append(f"- forward apply (what a naive tool would conclude from): {evidence['forward_apply']}")
    for key, value in evidence.items():
        if key not in ("decided_by", "markers", "forward_apply"):
            lines.append(f"- {key}: {value}")
    return lines


def _compare_with_pin(pin: Pin, ported: list[Ported], notes: list[str]) -> bool:
    """Whether each ported patch's action agrees with what ``pin`` (already locked) expects of it:
    ``drop`` where it expects ``upstream``, a carried patch where it expects ``clean``."""
    differ = []
    for p in ported:
        want = pin.expected_status(p.patch.name)
        got = (p.status if p.action == "drop" else
               "clean" if p.action in ("keep", "refresh", "merge", "resolved") else p.action)
        if got != want:
            differ.append(f"{p.patch.name}: the port gives {p.action}, pin {pin.name} expects {want}")
    if differ:
        notes.append(f"differs from the locked pin {pin.name}: " + "; ".join(differ))
    else:
        notes.append(f"agrees with the locked pin {pin.name}: every patch as its lock entry expects")
    return not differ


def unmatched_resolutions(resolutions: Path, series: Series) -> list[str]:
    """Files of ``--resolutions DIR`` that name no patch of the series (PORT.md aside)."""
    names = {p.name for p in series.patches}
    if not resolutions.is_dir():
        return [str(resolutions)]
    return sorted(str(f) for f in resolutions.iterdir()
                  if f.is_file() and f.name != "PORT.md" and f.name not in names)


@frozen
class OwnWorkspace:
    """The fork's own checkout as the port's workspace: the commit the port starts on, its branch."""

    base: str  # HEAD when the port opened it: the ported patches go on it, and it goes back there
    ref: str | None  # the branch HEAD was on (None: detached)


def own_workspace(ws: Path, new: PinRepo) -> OwnWorkspace:
    """``ws``, a git checkout without a port workspace, as the fork's own checkout for a port to it.

    It must be a checkout of the new (``git``/``local``) pin whose HEAD has the pin's
    content (:func:`forkcheckout.is_fork_checkout`; the port's patches are made on that content),
    clean, with no apply or ``--3way`` workspace open; else TreeError (exit 5), nothing touched."""
    pin = new.pin
    with exclusive_checkout(ws, role=param("workspace")) as co:
        if git.has_object(ws, f"{new.base_commit}^{{commit}}"):
            raise TreeError(f"{param('workspace')} {ws} is a tree dsv4patch made without a port workspace "
                            f"({portspace.state_path(ws)} is missing); use a new directory")
        head = git.head(ws)
        if not is_fork_checkout(ws, new, head) or head is None or content_tree(ws, head) != new.base_tree:
            raise TreeError(
                f"{param('workspace')} {ws} is a git checkout, but not one of pin {pin.name} at its content "
                f"(HEAD {(head or 'none')[:12]}; the pin is commit {pin.commit[:12]} of "
                f"{pin.source.path or pin.source.url}); nothing was touched: give a new directory, or "
                f"the fork's own checkout when you port to its HEAD (`{param('local')}` that checkout)")
        gitdir = co.gitdir
        if interrupted(gitdir) or has_workspace(gitdir):
            three_way = mention(Step.of("apply", three_way=True), bare=True)
            raise TreeError(f"{param('workspace')} {ws} has an interrupted apply or an `{three_way}` workspace "
                            f"open; finish it (`{mention(Step.of('apply'))}` / "
                            f"`{mention(Step.of('resolve', tree=ws))}`) first")
        dirty = git.dirty_paths(ws)
        if dirty:
            raise TreeError(f"{param('workspace')} {ws} has uncommitted changes ({', '.join(dirty[:5])}"
                            f"{', ...' if len(dirty) > 5 else ''}); commit, stash or remove them first")
        return OwnWorkspace(head, git.current_ref(ws))


def open_port_workspace(ws: Path, lock: Lock, src: Pin, pin: Pin, new: PinRepo, ported: list[Ported],
                        notes: list[str], own: OwnWorkspace | None = None) -> dict[str, Any]:
    """Leave ``ws`` at the ported prefix with the conflicting patch merged into its work tree.

    ``own``: ``ws`` is the fork's own checkout (:func:`own_workspace`): the prefix goes on its
    HEAD's commit, with HEAD detached."""
    k = next(i for i, p in enumerate(ported) if p.action == "conflict")
    conflict = ported[k]
    prefix = [(p.patch, p.text or read_patch_file(p.patch.path, p.patch.name).decode("utf-8"))
              for p in ported[:k] if p.action != "drop"]
    marked = sorted({c.file for c in conflict.conflicts if c.file in conflict.merged
                     or c.file in conflict.patch.touched})
    with open_tree(ws, new, role=param("workspace")) as (co, created):
        if created:
            notes.append(created)
        if own is None and not git.has_object(ws, f"{new.base_commit}^{{commit}}"):
            raise TreeError(f"{param('workspace')} {ws} is a git tree without pin {pin.name}'s base commit "
                            f"{new.base_commit[:12]}; nothing was touched: give a new directory")
        at = portspace.open_workspace(co, own.base if own else new.base_commit, prefix, conflict.patch,
                                      conflict.merged, marked, lock=lock.path, src=src.name, dst=pin.name,
                                      own=own is not None, orig_ref=own.ref if own else None)
        state = portspace.state_path(ws)
    where = (f"pin {pin.name} with" if own is None else
             "your checkout, HEAD detached (no branch moves), with")
    notes.append(f"{ws}: {where} {len(prefix)} ported patch(es) committed (HEAD {at[:12]}) and "
                 f"{conflict.patch.name} merged into the work tree: conflict markers in "
                 f"{', '.join(marked) or '(none: see the conflicts above)'}")
    notes.append(f"next: edit those files in {ws} (keep the code you want, remove the markers), then run "
                 f"the same `{mention(Step.of('port'))}` command again: it takes the resolution and goes on"
                 + (f"; `{mention(Step.of('port', abort=True, workspace=ws))}` gives up and puts {ws} back "
                    f"{'on ' + own.ref.removeprefix('refs/heads/') if own.ref else 'detached'} at "
                    f"{own.base[:12]}" if own else ""))
    out: dict[str, Any] = {"path": str(ws), "patch": conflict.patch.name, "head": at, "conflicts": marked,
                           "state": str(state)}
    if own is not None:
        out["own_checkout"] = {"base": own.base, "branch": own.ref}
    return out


def _final_tree(repo: Path, new: PinRepo, ported: list[Ported]) -> str:
    """Tree after the ported series, recomputed from the written patch texts."""
    with git.scratch_index(repo, new.base_commit) as env:
        for p in ported:
            if p.action == "drop":
                continue
            path = p.patch.path
            if p.text:
                tmp = repo / f"port-{p.patch.name}"
                tmp.write_text(p.text)
                path = tmp
            res = git.apply(repo, path, env=env)
            if not res.ok:
                raise LockFileError(f"{p.patch.name}: the ported patch does not apply: {res.stderr}")
        return git.write_tree(repo, env)


@frozen
class PortResult:
    """What :func:`port` did: per patch, what was written, the workspace a conflict opened."""

    src: Pin
    pin: Pin  # the new pin
    ok: bool
    ported: list[Ported]
    notes: list[str]
    dry_run: bool = False
    check: dict[str, str] | None = None  # the written series as check sees it, per patch
    written: list[Path] | None = None
    workspace: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"from": self.src.name, "to": self.pin.name, "ok": self.ok, "patches": {
            p.patch.name: {"action": p.action, "detail": p.detail, "evidence": p.evidence,
                           "conflicts": [c.to_json() for c in p.conflicts]} for p in self.ported}}
        if self.dry_run:
            out["dry_run"] = True
        if self.check is not None:
            out["check"] = dict(self.check)
        if self.written is not None:
            out["written"] = [str(f) for f in self.written]
        if self.workspace is not None:
            out["workspace"] = self.workspace
        out["notes"] = list(self.notes)
        return out


def port(*, ctx: Context, src: Pin, to: str | None,
         git_url: str | None = None, local: Path | None = None, name: str | None = None,
         resolutions: Path | None = None, workspace: Path | None = None,
         dry_run: bool = False) -> PortResult:
    """Port ``src``'s series to the new pin (see :func:`new_pin` for ``to``/``git_url``/``local``/``name``).

    ``resolutions``: a maintainer's earlier port; ``workspace``: on a conflict,
    leave this directory as a tree of the new pin to edit (and, run again,
    take its edit as the resolution); ``dry_run``: write nothing.  Relative paths are the
    caller's (resolved against the current directory here, before git runs anywhere else).
    """
    resolutions = Path(os.path.abspath(resolutions)) if resolutions is not None else None
    ws = Path(os.path.abspath(workspace)) if workspace is not None else None
    lock, store, progress = ctx.lock, ctx.store, ctx.progress
    pin = new_pin(ctx=ctx, src=src, to=to, git_url=git_url, local=local, name=name, dry_run=dry_run)
    existing = lock.pins.get(pin.name) is pin  # dry run against a pin the lock already has
    old = materialize(src, store, progress)
    # A local pin's checkout that is the workspace may be mid-port (HEAD detached above the commit).
    new = materialize(pin, store, progress, checkout=ws)
    series = series_for_pin(lock, src)
    notes: list[str] = []
    pin, new = _name_the_new_pin(pin, new, src, series, existing, resolutions, notes)
    ws_state = portspace.read_state(ws) if ws is not None else None
    own = _own_workspace_of(ws, ws_state, new)
    committed = _committed_in_fork(pin)
    stack = ExitStack()
    if ws is not None and guard.is_checkout_root(ws):
        stack.enter_context(guard.guarded(ws, role=param("workspace")))  # vetted once for the whole port
    work = store.tmpdir(f"port-{pin.name}-")
    try:
        used = resolutions
        if ws is not None and ws_state is not None:
            used = _take_workspace_resolution(lock, src, pin, new, series, ws, ws_state, own, resolutions,
                                              work, notes)
        if existing and pin.variants:
            used = _with_pin_variants(pin, used, work)
        repo = work / "port.git"
        git.init_with_alternates(repo, [old.repo, new.repo])
        ported = port_series(repo, old, new, series, pin.name, used, committed)
        ported = _name_resolutions(ported, pin, used, ws if ws_state is not None else None, own, existing,
                                   lock.path)
        ok = all(p.action in ("keep", "refresh", "merge", "resolved", "drop") for p in ported)
        if existing:
            ok = _compare_with_pin(pin, ported, notes) and ok
        if ok and dry_run:
            if not existing:
                notes.append(f"dry run: nothing was written; `{mention(Step.of('port'))}` without "
                             f"{param('dry_run')} writes the variants, {pin.name}'s PORT.md and the lock entry")
            return PortResult(src, pin, ok, ported, notes, dry_run=True)
        if ok:
            return _write_port(lock, src, pin, new, repo, ported, ws, ws_state, own, notes)
        return _stopped_at_conflicts(lock, src, pin, new, ported, ws, own, dry_run, notes)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        stack.close()


def _name_the_new_pin(pin: Pin, new: PinRepo, src: Pin, series: Series, existing: bool,
                      resolutions: Path | None, notes: list[str]) -> tuple[Pin, PinRepo]:
    """A fork's new pin gets the version its tree says; resolutions that match no patch are named."""
    if existing:
        notes.append(f"pin {pin.name} is already in the lock: the port is compared with it (its "
                     f"variants taken as resolutions, its expected statuses checked); nothing is written")
    elif kind_of(pin).fork:
        found = fork_version(new, src)
        pin = dataclasses.replace(pin, vllm_version=found.version)
        new = dataclasses.replace(new, pin=pin)
        notes.append(f"pin {pin.name}: vllm_version {found.version} (from {found.whence})")
    if resolutions is not None:
        for f in unmatched_resolutions(resolutions, series):
            notes.append(f"warning: {param('resolutions')} {f} matches no patch of the series "
                         f"(file names must equal the series' patch names); it was not used")
    return pin, new


def _own_workspace_of(ws: Path | None, ws_state: PortState | None, new: PinRepo) -> OwnWorkspace | None:
    """The fork's own checkout as the workspace (refused before anything runs if it cannot be), if it is."""
    if ws is not None and ws_state is None and not is_empty(ws):
        return own_workspace(ws, new)
    if ws is not None and ws_state is not None and ws_state.own:
        return OwnWorkspace(ws_state.base_commit, ws_state.orig_ref)
    return None


def _committed_in_fork(pin: Pin) -> dict[str, Committed]:
    """The series dsv4patch committed in the fork's checkout (its trailers): the evidence of a drop."""
    fork_checkout = kind_of(pin).checkout_path(pin.source)
    if fork_checkout is None:
        return {}
    with guard.guarded(fork_checkout, role=f"pin {pin.name}'s local checkout"):
        return committed_series(fork_checkout, pin.commit)


def _take_workspace_resolution(lock: Lock, src: Pin, pin: Pin, new: PinRepo, series: Series, ws: Path,
                               ws_state: PortState, own: OwnWorkspace | None, resolutions: Path | None,
                               work: Path, notes: list[str]) -> Path:
    """The edited workspace turned into its patch's resolution; every resolution the port uses."""
    with exclusive_checkout(ws, role=param("workspace")) as co:
        base = new.base_commit
        if own is not None:
            done = recover_tree(co)  # a move killed while the workspace opened
            if done:
                notes.append(done)
            if git.has_object(ws, f"{own.base}^{{commit}}") and content_tree(ws, own.base) == new.base_tree:
                base = own.base  # the fork's commit with the new pin's content
        portspace.check_matches(ws_state, ws, lock.path, src.name, pin.name, base)
        patch = next((p for p in series.patches if p.name == ws_state.patch), None)
        if patch is None:
            raise TreeError(f"{param('workspace')} {ws} holds {ws_state.patch}, which is not in pin "
                            f"{src.name}'s series; use a new directory")
        same = [p for p in series.patches if p.series == patch.series]
        got = portspace.collect(ws, ws_state, patch, same.index(patch) + 1, len(same))
        notes.append(f"took {patch.name}'s resolution from {param('workspace')} {ws} (kept in {got})")
    return portspace.combine(work / "resolutions", resolutions, portspace.resolutions(ws))


def _with_pin_variants(pin: Pin, used: Path | None, work: Path) -> Path:
    """The lock's variants for this pin are the maintainer's port: used like --resolutions (an
    explicit --resolutions file wins)."""
    theirs = work / "pin-variants"
    theirs.mkdir()
    for vname, vpath in pin.variants.items():
        shutil.copyfile(vpath, theirs / vname)
    return portspace.combine(work / "with-variants", theirs, used)


def _name_resolutions(ported: list[Ported], pin: Pin, used: Path | None, ws: Path | None,
                      own: OwnWorkspace | None, existing: bool, lock_path: Path) -> list[Ported]:
    """Each detail names the resolution where the maintainer keeps it, not the temporary copy."""
    kept = portspace.resolutions(ws) if ws is not None else None
    if kept is not None and used is not None:  # name the workspace's resolution, not the copy
        # (the fork's own checkout drops its copy when the port completes: named by the workspace)
        ported = [dataclasses.replace(p, detail=p.detail.replace(
            str(used / p.patch.name),
            f"the resolution edited in {param('workspace')} {ws}" if own else str(kept / p.patch.name)))
            if (kept / p.patch.name).is_file() else p for p in ported]
    if existing and used is not None:  # name the lock's variant, not the temporary copy
        ported = [dataclasses.replace(p, detail=p.detail.replace(
            str(used / p.patch.name), f"pin {pin.name}'s variant (the same file name in "
            f"{_in_project(lock_path, pin.variants[p.patch.name].parent)}/)"))
            if p.patch.name in pin.variants else p for p in ported]
    return ported


def _write_port(lock: Lock, src: Pin, pin: Pin, new: PinRepo, repo: Path, ported: list[Ported],
                ws: Path | None, ws_state: PortState | None, own: OwnWorkspace | None,
                notes: list[str]) -> PortResult:
    """Write the variants, PORT.md and the lock entry, close the workspace, and check the written
    series exactly as check would: it must give the statuses the new entry expects."""
    final = _final_tree(repo, new, ported)
    files = write_result(lock, pin, ported, new, final)
    written_lock = load_lock(lock.path)
    if ws is not None and ws_state is not None and own is not None:
        with exclusive_checkout(ws, role=param("workspace")) as co:
            notes.append(portspace.restore(co, ws_state))
        commit = Step.of("apply", pin=pin.name, tree=ws, branch=Blank("NAME"), no_build=True)
        notes.append(f"the port used the resolutions of {param('workspace')} {ws} and is complete; next: "
                     f"`{mention(commit)}` commits the ported series on a new branch of it")
    elif ws is not None and ws_state is not None:
        portspace.close(ws)
        notes.append(f"the port used the resolutions of {param('workspace')} {ws} and is complete; the "
                     "workspace can be deleted")
    wpin = written_lock.pin(pin.name, given_as=None)
    res = run_series(new.repo, new.base_commit, series_for_pin(written_lock, wpin))
    bad = [r for r in res.patches if r.status.value != wpin.expected_status(r.patch)]
    notes.append(f"wrote {len(files)} file(s) and pin {pin.name} in {lock.path}")
    if bad:
        notes.append("the written series does not check as expected: " +
                     ", ".join(f"{r.patch}: {r.status.value}" for r in bad))
    return PortResult(src, pin, not bad, ported, notes,
                      check={r.patch: r.status.value for r in res.patches}, written=files)


def _stopped_at_conflicts(lock: Lock, src: Pin, pin: Pin, new: PinRepo, ported: list[Ported], ws: Path | None,
                          own: OwnWorkspace | None, dry_run: bool, notes: list[str]) -> PortResult:
    """Nothing written: each conflicting hunk, and the workspace to resolve it in (or how to get one)."""
    for p in ported:
        for c in p.conflicts:
            notes.append(f"{p.patch.name}: {c.file} hunk #{c.hunk}: target has "
                         f"{c.target!r}, the patch wants {c.patch!r}")
    notes.append("nothing was written")
    opened = None
    if ws is not None and dry_run:
        notes.append(f"dry run: {param('workspace')} {ws} was not opened (run without {param('dry_run')} to "
                     "get it)")
    elif ws is not None:
        opened = open_port_workspace(ws, lock, src, pin, new, ported, notes, own)
    else:
        by_hand = Step.of("apply", pin=src.name, tree=Blank("DIR"))
        notes.append(f"next: rerun with {param('workspace')} DIR to get a tree of the new pin with the "
                     "conflict to edit (then run the same command again), or resolve the conflicts "
                     f"by hand in a tree (`{mention(by_hand)}`, port the "
                     f"commit, `{mention(Step.of('refresh'))}`) and pass the resolved patches with "
                     f"{param('resolutions')} DIR")
    return PortResult(src, pin, False, ported, notes, workspace=opened)


@frozen
class PortAborted:
    """What :func:`abort` did: the port whose workspace was given up, and where the tree is now."""

    src: str
    dst: str
    workspace: Path
    head: str | None  # the workspace's HEAD afterwards
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"from": self.src, "to": self.dst, "ok": True, "aborted": True, "patches": {},
                "tree": str(self.workspace), "head": self.head, "notes": list(self.notes)}


def abort(*, workspace: Path) -> PortAborted:
    """Give up the port workspace ``workspace`` (``port --abort``): the fork's own checkout goes
    back where the port found it (:func:`portspace.restore`); nothing is written to the lock."""
    workspace = Path(os.path.abspath(workspace))
    state = portspace.read_state(workspace)
    if state is None:
        where = "git tree"
        if guard.is_checkout_root(workspace):
            with guard.guarded(workspace, role=param("workspace")):
                where = str(portspace.state_path(workspace))
        raise TreeError(f"{param('workspace')} {workspace} holds no port workspace (no {where}); nothing to "
                        "abort")
    with exclusive_checkout(workspace, role=param("workspace")) as co:
        notes = []
        if state.own:
            done = recover_tree(co)
            if done:
                notes.append(done)
        notes.append(f"aborted the port workspace of {state.patch} (port {state.frm} -> {state.to}); "
                     + portspace.restore(co, state))
        head = git.head(workspace)
    return PortAborted(state.frm, state.to, workspace, head, notes)


def _in_project(lock_path: Path, path: Path) -> str:
    """PATH as the project's own relative path (``patches/variants/...``) when it is in the lock's
    project, else as it is: short enough to read whole in a table."""
    from dsv4patch.pins import project_root

    root = project_root(lock_path)
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
