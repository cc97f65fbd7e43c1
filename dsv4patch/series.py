"""Patch files and series: reading, headers, hunks, and path safety.

A series file lists patch files (one per line, ``#`` comments), relative to
the series file.  Each patch is a ``git format-patch`` file whose commit
message ends in trailers (``Fix:``, ``Origin:``, ``Applied-Upstream:``,
``Test:``, ``Upstream-Marker:``) that the rest of the tool reads: ``verify``
runs the ``Test:`` node ids, upstream detection looks for the markers.

Before git ever sees a patch, :func:`check_paths` refuses one that would
write outside the tree: absolute paths, ``..`` components, or a path that
goes through a symlink in the tree.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from dsv4patch.errors import PatchFileError
from dsv4patch.lock import Lock, Pin


@dataclass(frozen=True)
class Hunk:
    index: int  # 1-based within its file
    source_start: int
    source_lines: tuple[str, ...]  # context and removed lines, without newline


@dataclass(frozen=True)
class FileDiff:
    path: str  # path in the tree after the patch (or before, for deletions)
    source_path: str | None  # None for added files
    is_added: bool
    is_removed: bool
    hunks: tuple[Hunk, ...]


@dataclass(frozen=True)
class Patch:
    name: str  # file name, e.g. 0001-...patch; the key used in the lock
    path: Path
    sha256: str
    series: str
    subject: str
    message: str
    author: dict[str, str]
    trailers: dict[str, list[str]]
    files: tuple[FileDiff, ...]
    adds_symlink: bool = False

    @property
    def tests(self) -> list[str]:
        return self.trailers.get("Test", [])

    @property
    def markers(self) -> list[tuple[str, str]]:
        out = []
        for m in self.trailers.get("Upstream-Marker", []):
            path, _, text = m.partition(":")
            text = text.strip().strip('"')
            if path and text:
                out.append((path.strip(), text))
        return out

    @property
    def touched(self) -> list[str]:
        return [f.path for f in self.files]


@dataclass(frozen=True)
class Series:
    pin: str
    patches: tuple[Patch, ...] = field(default_factory=tuple)

    def hash(self) -> str:
        h = hashlib.sha256()
        for p in self.patches:
            h.update(f"{p.name} {p.sha256}\n".encode())
        return h.hexdigest()


def series_for_pin(lock: Lock, pin: Pin) -> Series:
    """The pin's patches in order: its series concatenated, variants substituted."""
    patches: list[Patch] = []
    for sname in pin.series:
        sdef = lock.series[sname]
        for ppath in read_series_file(sdef.path):
            path = pin.variants.get(ppath.name, ppath)
            patches.append(load_patch(path, sname, name=ppath.name))
    unused = set(pin.variants) - {p.name for p in patches}
    if unused:
        raise PatchFileError(
            f"{lock.path}: pin {pin.name} has variants for {', '.join(sorted(unused))}, "
            "which no series of that pin contains"
        )
    return Series(pin=pin.name, patches=tuple(patches))


def read_series_file(path: Path) -> list[Path]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise PatchFileError(f"series file {path} not found") from None
    except UnicodeDecodeError as exc:
        raise PatchFileError(
            f"series file {path} is not UTF-8 text (byte {exc.start}); it lists patch files, "
            "one per line"
        ) from None
    except OSError as exc:
        raise PatchFileError(
            f"series file {path} cannot be read ({exc.strerror or exc}); the lock's "
            "[series.*] path must name a file listing patch files"
        ) from None
    out = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(path.parent / line)
    if not out:
        raise PatchFileError(f"series file {path} lists no patches")
    return out


_TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):\s*(.*)$")


def load_patch(path: Path, series: str = "", name: str | None = None) -> Patch:
    name = name or path.name
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise PatchFileError(
            f"patch {name}: file {path} not found; restore it or remove it from the series"
        ) from None
    except OSError as exc:
        raise PatchFileError(
            f"patch {name}: {path} cannot be read ({exc.strerror or exc}); a series lists "
            "patch files"
        ) from None
    if not raw.strip():
        raise PatchFileError(f"patch {name}: {path} is empty; regenerate it with git format-patch")
    text = raw.decode("utf-8", errors="replace")
    try:
        ps = PatchSet(text)
    except UnidiffParseError as exc:
        raise PatchFileError(f"patch {name}: {path} is not a valid diff: {exc}") from None
    if not len(ps):
        raise PatchFileError(f"patch {name}: {path} contains no diff (no 'diff --git' sections)")
    files = []
    for pf in ps:
        if not pf.is_added_file and not pf.is_removed_file and not len(pf) and not pf.is_rename:
            # Mode-only changes are fine; an empty text diff for a modified file is not.
            if not pf.is_binary_file and "mode" not in str(pf.patch_info):
                raise PatchFileError(f"patch {name}: {pf.path} has a header but no hunks")
        hunks = tuple(
            Hunk(
                index=i + 1,
                source_start=h.source_start,
                source_lines=tuple(
                    line.value.rstrip("\n") for line in h if line.is_context or line.is_removed
                ),
            )
            for i, h in enumerate(pf)
        )
        src = None if pf.is_added_file else _strip(pf.source_file)
        files.append(
            FileDiff(
                path=_strip(pf.target_file) if not pf.is_removed_file else _strip(pf.source_file),
                source_path=src,
                is_added=pf.is_added_file,
                is_removed=pf.is_removed_file,
                hunks=hunks,
            )
        )
    message, author = _message(text)
    return Patch(
        name=name,
        path=path,
        sha256=hashlib.sha256(raw).hexdigest(),
        series=series,
        subject=message.splitlines()[0] if message else name,
        message=message,
        author=author,
        trailers=_trailers(message),
        files=tuple(files),
        adds_symlink="\nnew file mode 120000" in text or "\nnew mode 120000" in text,
    )


def _strip(p: str) -> str:
    if p.startswith(("a/", "b/")):
        return p[2:]
    return p


def _message(text: str) -> tuple[str, dict[str, str]]:
    """Commit message and author of a format-patch file (empty for a plain diff)."""
    head, sep, _ = text.partition("\n---\n")
    if not sep or not text.startswith("From "):
        return "", {}
    lines = head.splitlines()
    author: dict[str, str] = {}
    subject = ""
    i = 1
    while i < len(lines) and lines[i].strip():
        line = lines[i]
        if line.startswith("From: "):
            m = re.match(r"From: (.*) <(.*)>", line)
            if m:
                author["GIT_AUTHOR_NAME"], author["GIT_AUTHOR_EMAIL"] = m.group(1), m.group(2)
        elif line.startswith("Date: "):
            author["GIT_AUTHOR_DATE"] = line[6:].strip()
        elif line.startswith("Subject: "):
            subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", line[9:].strip())
            while i + 1 < len(lines) and lines[i + 1].startswith(" "):
                i += 1
                subject += lines[i]
        i += 1
    body = "\n".join(lines[i + 1 :]).strip("\n")
    return (subject + "\n\n" + body).strip() + "\n", author


def _trailers(message: str) -> dict[str, list[str]]:
    paragraphs = [p for p in message.strip().split("\n\n") if p.strip()]
    if len(paragraphs) < 2:
        return {}
    out: dict[str, list[str]] = {}
    for line in paragraphs[-1].splitlines():
        m = _TRAILER.match(line.strip())
        if m:
            out.setdefault(m.group(1), []).append(m.group(2).strip())
    return out


def check_paths(patch: Patch, symlinks: set[str]) -> None:
    """Refuse a patch that writes outside the tree, before git runs.

    ``symlinks`` holds the paths of symlinks in the tree the patch targets.
    """
    for f in patch.files:
        for p in filter(None, (f.path, f.source_path)):
            pp = PurePosixPath(p)
            if p.startswith("/") or pp.is_absolute():
                raise PatchFileError(
                    f"patch {patch.name}: refuses absolute path {p!r}; patches must use "
                    "paths relative to the vLLM tree"
                )
            if ".." in pp.parts or p.startswith("~"):
                raise PatchFileError(
                    f"patch {patch.name}: refuses path {p!r}, which leaves the tree through '..'"
                )
            for i in range(1, len(pp.parts) + 1):
                prefix = str(PurePosixPath(*pp.parts[:i]))
                if prefix in symlinks:
                    raise PatchFileError(
                        f"patch {patch.name}: refuses path {p!r}: {prefix!r} is a symlink in "
                        "the tree, so the write could land outside it"
                    )
