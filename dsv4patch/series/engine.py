"""Run a patch series against a pin: the one code path behind check and apply.

The series is applied patch by patch to a *scratch index* loaded with the
pin's base commit (``git apply --cached``), never to a work tree.  Each patch
gets a status; git's exit code is never trusted alone: the verbose output is
parsed for offsets and ``Skipped patch``, and the index must really change.

``check`` reports the statuses.  ``apply`` (dsv4patch.checkout.applying) takes the same
:class:`SeriesResult` and turns each patch's resulting tree into a commit, so
the two can never disagree.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from dsv4patch import git
from dsv4patch.errors import GitError, disk_trouble
from dsv4patch.series.results import HunkNote, PatchResult, SeriesResult, Status

if TYPE_CHECKING:
    from dsv4patch.series.patches import Patch, Series

__all__ = ["HunkNote", "PatchResult", "SeriesResult", "Status", "carried", "carried_result", "check_one",
           "has_offsets", "markers_present", "run_series"]


_OFFSET = re.compile(r"^Hunk #(\d+) succeeded at (\d+)(?: \(offset (-?\d+) lines?\))?\.", re.M)


def has_offsets(text: str) -> bool:
    """Whether ``git apply -v`` output reports a hunk that applied at an offset."""
    return any(int(m.group(3) or 0) for m in _OFFSET.finditer(text))
_CHECKING = re.compile(r"^Checking patch (.+)\.\.\.$", re.M)
_FAILED_AT = re.compile(r"^error: patch failed: (.+):(\d+)$", re.M)


def run_series(repo: Path, base_commit: str, series: Series) -> SeriesResult:
    """Check every patch of ``series`` in order on a scratch index of ``base_commit``.

    A patch that does not apply blocks only the patches that depend on it:
    those touching a file it (or a patch it blocked) touches, and those that
    declare it in a ``Depends-On:`` trailer (a patch name or its number,
    e.g. ``0003``).  They are ``not-checked``; independent later patches are
    still checked, on the index without the failed patch.

    A patch that conflicts although the tree carries the whole series (a fork that has
    it committed, with later patches changing lines of earlier ones) is
    ``already-applied`` when :func:`carried`, peeling the series off the base from the
    end, finds it: check, ``status --tree`` and ``port`` then agree on such a tree.
    """
    base_tree = git.out(repo, "rev-parse", f"{base_commit}^{{tree}}")
    results: list[PatchResult] = []
    peeled: dict[str, str | None] | None = None
    with git.scratch_index(repo, base_commit) as env:
        blocked_files: dict[str, str] = {}  # path -> the failed patch it waits for
        failed: list[str] = []  # names of patches that block
        symlinks = git.symlinks_in_index(repo, env)
        current = base_tree
        for patch in series.patches:
            files = _files(patch)
            shared = sorted(f for f in files if f in blocked_files)
            declared = [n for n in failed if _declares(patch, n)]
            if shared or declared:
                cause = declared[0] if declared else blocked_files[shared[0]]
                why = (f"it declares Depends-On: {cause}" if declared
                       else f"it changes {', '.join(shared[:3])}, which {cause} changes")
                results.append(
                    PatchResult(
                        patch.name, patch.series, patch.sha256, Status.NOT_CHECKED,
                        f"{cause} does not apply and {why}",
                    )
                )
                failed.append(patch.name)
                for f in files:
                    blocked_files.setdefault(f, cause)
                continue
            res = check_one(repo, env, patch, symlinks, current)
            if res.status is Status.CONFLICT:
                if peeled is None:
                    with git.scratch_index(repo, base_commit) as peel_env:
                        peeled = carried(repo, peel_env, series)
                if peeled.get(patch.name) == "reverse-apply":
                    res = carried_result(patch)
            results.append(res)
            current = res.tree or current
            if res.status.blocks:
                failed.append(patch.name)
                for f in files:
                    blocked_files.setdefault(f, patch.name)
            if patch.adds_symlink:
                symlinks = git.symlinks_in_index(repo, env)
    return SeriesResult(series.pin, base_commit, base_tree, results)


def carried_result(patch: Patch) -> PatchResult:
    """``already-applied`` for a patch :func:`carried` finds in a tree that carries the series."""
    return PatchResult(
        patch.name, patch.series, patch.sha256, Status.ALREADY_APPLIED,
        "the tree carries the series: the reverse of the patch applies once the later patches are "
        "taken off", evidence={"decided_by": ["reverse-apply (the later patches taken off first)"]})


def carried(repo: Path, env: dict[str, str], series: Series) -> dict[str, str | None]:
    """Per patch of ``series``: ``reverse-apply``, ``markers`` or None, for the tree in the scratch
    index ``env``.

    The series is peeled off in reverse order (each patch that is there is taken off the
    index), so a patch is judged against the tree the later patches left: fix 7 and
    extra 2 touch the same line, so fix 7's reverse applies only once extra 2's is off.
    This is how ``status --tree`` reads a tree, and how ``apply`` and ``check`` recognise a
    tree that already carries the series."""
    found: dict[str, str | None] = {}
    for p in reversed(series.patches):
        rev = git.apply(repo, p.path, env=env, reverse=True)
        if rev.ok and "Skipped patch" not in rev.stdout + rev.stderr:
            found[p.name] = "reverse-apply"
        elif markers_present(repo, env, p):
            found[p.name] = "markers"
        else:
            found[p.name] = None
    return found


def _files(patch: Patch) -> set[str]:
    return {f.path for f in patch.files} | {f.source_path for f in patch.files if f.source_path}


def _declares(patch: Patch, name: str) -> bool:
    """Does ``patch`` name ``name`` (or its number) in a ``Depends-On:`` trailer?"""
    for dep in patch.trailers.get("Depends-On", []):
        for item in re.split(r"[\s,]+", dep.strip()):
            if item and (item == name or name.startswith(item + "-")):
                return True
    return False


def check_one(
    repo: Path,
    env: dict[str, str],
    patch: Patch,
    symlinks: set[str] | None = None,
    tree: str | None = None,
) -> PatchResult:
    """Apply one patch to the scratch index in ``env`` and classify the outcome.

    ``symlinks`` (paths of symlinks in the index) and ``tree`` (the index's
    tree id) may be passed in when the caller knows them, saving git calls.
    """
    # Imported here: a warm check reads its results from the cache and never parses a patch (issue 39); a
    # caller that has ``patch`` has imported its module already.
    from dsv4patch.series.patches import check_paths

    check_paths(patch, git.symlinks_in_index(repo, env) if symlinks is None else symlinks)
    result = PatchResult(patch.name, patch.series, patch.sha256, Status.CLEAN)
    markers = markers_present(repo, env, patch)
    if markers:
        return _upstream(repo, env, patch, markers, result)
    before = tree or git.write_tree(repo, env)
    fwd = git.apply(repo, patch.path, env=env)
    text = fwd.stdout + fwd.stderr
    if "Skipped patch" in text:
        raise AssertionError(f"git skipped {patch.name} in {repo}; refusing to trust it")
    if not fwd.ok and disk_trouble(fwd.stderr):
        # Not a patch that fails to apply: git could not write objects or the index.
        raise GitError(f"git apply {patch.name} could not write in {repo}:\n{fwd.stderr.strip()}")
    if fwd.ok:
        return _applied(repo, env, before, text, result)
    return _not_applied(repo, env, patch, text, result)


def _upstream(repo: Path, env: dict[str, str], patch: Patch, markers: list[dict[str, str]],
              result: PatchResult) -> PatchResult:
    """The code the fix adds is already there: a forward apply could still "succeed" (an
    addition-only hunk re-adds it), so markers win; the evidence says what each apply says."""
    rev = git.apply(repo, patch.path, env=env, reverse=True, check_only=True)
    fwd = git.apply(repo, patch.path, env=env, check_only=True)
    result.status = Status.UPSTREAM
    result.evidence = {
        "decided_by": ["markers"] + (["reverse-apply"] if rev.ok else []),
        "markers": markers,
        # What a naive tool would have concluded from the forward apply alone.
        "forward_apply": "applies" if fwd.ok else _first_error(fwd.stderr),
    }
    result.message = "fix already in the tree: " + "; ".join(
        f"{m['path']} has {m['text']!r}" for m in markers
    )
    return result


def _applied(repo: Path, env: dict[str, str], before: str, text: str, result: PatchResult) -> PatchResult:
    """It applied forward: clean, with offsets (each hunk's, from git's output ``text``), or a
    conflict when the tree did not change at all."""
    after = git.write_tree(repo, env)
    if after == before:
        result.status = Status.CONFLICT
        result.message = "git apply reported success but changed nothing"
        return result
    result.tree = after
    for m in _OFFSET.finditer(text):
        off = int(m.group(3) or 0)
        if off:
            starts = [c for c in _CHECKING.finditer(text) if c.start() < m.start()]
            name = starts[-1].group(1) if starts else "?"
            result.hunks.append(
                HunkNote(name, int(m.group(1)), f"offset {off:+d} lines", line=int(m.group(2)))
            )
    if result.hunks:
        result.status = Status.OFFSET
        result.message = "; ".join(f"{h.file} hunk #{h.hunk}: {h.detail}" for h in result.hunks)
    return result


def _not_applied(repo: Path, env: dict[str, str], patch: Patch, text: str, result: PatchResult) -> PatchResult:
    """It does not apply forward: already applied (the reverse applies), a file missing, or a
    conflict with the first line that differs per hunk."""
    rev = git.apply(repo, patch.path, env=env, reverse=True, check_only=True)
    if rev.ok and "Skipped patch" not in rev.stdout + rev.stderr:
        result.status = Status.ALREADY_APPLIED
        result.message = "the reverse of the patch applies: its change is already in the tree"
        result.evidence = {"decided_by": ["reverse-apply"]}
        return result
    missing = [
        f.source_path
        for f in patch.files
        if f.source_path and git.index_blob(repo, env, f.source_path) is None
    ]
    if missing:
        result.status = Status.MISSING_FILE
        result.message = f"file(s) not in the tree: {', '.join(missing)}"
        result.hunks = [HunkNote(m, 0, "file does not exist") for m in missing]
        return result
    result.status = Status.CONFLICT
    result.hunks = _conflicts(repo, env, patch, text)
    first = result.hunks[0] if result.hunks else None
    result.message = (
        f"{first.file} hunk #{first.hunk}: {first.detail}" if first else text.strip()[-400:]
    )
    return result


def _conflicts(repo: Path, env: dict[str, str], patch: Patch, git_text: str) -> list[HunkNote]:
    """For each hunk that does not match its file, the first line that differs."""
    notes: list[HunkNote] = []
    failed_files = {m.group(1) for m in _FAILED_AT.finditer(git_text)}
    for f in patch.files:
        if f.source_path is None:
            if git.index_blob(repo, env, f.path) is not None:
                notes.append(HunkNote(f.path, 0, "the patch creates this file but it exists"))
            continue
        if failed_files and f.source_path not in failed_files:
            continue
        blob = git.index_blob(repo, env, f.source_path)
        lines = (blob or b"").decode("utf-8", errors="replace").split("\n")
        for h in f.hunks:
            note = _first_difference(f.source_path, h.index, h.source_start, h.source_lines, lines)
            if note:
                notes.append(note)
    return notes


def _first_difference(
    path: str, index: int, start: int, expected: tuple[str, ...], lines: list[str]
) -> HunkNote | None:
    """Where the hunk's context/removed lines stop matching, searching near ``start``."""
    n = len(expected)
    if not n:
        return None
    # Exact match anywhere means the hunk itself is fine (an offset at most).
    for s in range(0, max(0, len(lines) - n) + 1):
        if tuple(lines[s : s + n]) == expected:
            return None
    # Report against the best-aligned position: longest matching prefix near start.
    best_pos, best_len = start - 1, -1
    for s in range(max(0, start - 1 - 200), min(len(lines), start - 1 + 200) + 1):
        k = 0
        while k < n and s + k < len(lines) and lines[s + k] == expected[k]:
            k += 1
        if k > best_len or (k == best_len and abs(s - (start - 1)) < abs(best_pos - (start - 1))):
            best_pos, best_len = s, k
    k = max(best_len, 0)
    lineno = best_pos + k + 1
    actual = lines[best_pos + k] if best_pos + k < len(lines) else "<end of file>"
    return HunkNote(
        path,
        index,
        f"line {lineno}: expected {expected[k]!r}, found {actual!r}",
        line=lineno,
        expected=expected[k],
        actual=actual,
    )


def markers_present(repo: Path, env: dict[str, str], patch: Patch) -> list[dict[str, str]]:
    """The patch's declared upstream markers, if *all* of them are in the tree.

    A marker is ``path: text``; the path may be a glob-free file path or a
    directory prefix ending in ``/`` (searched with ``git grep``), so a marker
    survives upstream moving a file (e.g. csrc/libtorch_stable/ -> csrc/).
    """
    found: list[dict[str, str]] = []
    if not patch.markers:
        return found
    for path, text in patch.markers:
        hit = git.grep_index(repo, env, text, path)
        if not hit:
            return []
        found.append({"path": hit, "text": text})
    return found


def _first_error(stderr: str) -> str:
    errors = [
        line for line in stderr.splitlines()
        if line.startswith("error:") and not line.startswith("error: while searching")
    ]
    return errors[0] if errors else "fails"
