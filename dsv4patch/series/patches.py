"""Patch files and series: reading, headers, hunks, and path safety.

A series file lists patch files (one per line, ``#`` comments), relative to
the series file (read by :mod:`dsv4patch.seriesfile`).  Each patch is a ``git format-patch`` file whose commit
message ends in trailers (``Fix:``, ``Origin:``, ``Applied-Upstream:``,
``Test:``, ``Upstream-Marker:``) that the rest of the tool reads: ``verify``
runs the ``Test:`` node ids, upstream detection looks for the markers.

Before git ever sees a patch, :func:`check_paths` refuses one that would
write outside the tree: absolute paths, ``..`` components, or a path that
goes through a symlink in the tree.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from dsv4patch.errors import PatchFileError
from dsv4patch.records import frozen
from dsv4patch.seriesfile import read_patch_file, read_series_file, unlisted

if TYPE_CHECKING:
    from unidiff.patch import PatchedFile, PatchSet

    from dsv4patch.pins import Lock, Pin


@frozen
class Hunk:
    index: int  # 1-based within its file
    source_start: int
    source_lines: tuple[str, ...]  # context and removed lines, without newline


@frozen
class FileDiff:
    path: str  # path in the tree after the patch (or before, for deletions)
    source_path: str | None  # None for added files
    is_added: bool
    is_removed: bool
    hunks: tuple[Hunk, ...]


@frozen
class GitHeader:
    """One ``diff --git`` section as git apply reads it (names unquoted, -p1)."""

    paths: tuple[str, ...]  # every name git may use: diff --git, ---/+++, rename/copy from/to
    path: str  # the name after the patch
    new_mode: str | None  # from "new file mode" / "new mode", or the mode of an "index a..b MODE" line
    added: tuple[str, ...]  # "+" lines of its hunks, without the "+"
    unseen: str = ""  # why the file's content after the patch is not all in its lines (a rename, copy, binary)


@frozen
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
    headers: tuple[GitHeader, ...] = ()  # the same diff as git apply reads it

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


@frozen
class Series:
    pin: str
    patches: tuple[Patch, ...] = field(default_factory=tuple)

    def hash(self) -> str:
        h = hashlib.sha256()
        for p in self.patches:
            h.update(f"{p.name} {p.sha256}\n".encode())
        return h.hexdigest()


def series_for_pin(lock: Lock, pin: Pin) -> Series:
    """The pin's patches in order: its series concatenated, variants substituted.

    A variant that no series the lock gives the pin contains is the lock's error (a mistyped
    name), whichever series the run uses; where the run chose other series
    (:meth:`dsv4patch.pins.Lock.with_series`), a variant of a patch outside them is not used."""
    relative = (f"paths in a lock are relative to the lock file's directory ({lock.path.parent}); "
                "a copied lock needs them adjusted")
    unused = unlisted([_series_path(lock, s, relative) for s in pin.lock_series], set(pin.variants),
                      below=lock.project)
    if unused:
        raise PatchFileError(
            f"{lock.path}: pin {pin.name} has variants for {', '.join(sorted(unused))}, "
            f"which no series of that pin contains (its series: {', '.join(pin.lock_series)}); correct the "
            f"name or remove it from [pins.\"{pin.name}\"].variants"
        )
    patches: list[Patch] = []
    for sname in pin.series:
        spath = _series_path(lock, sname, relative)
        for ppath in read_series_file(spath, below=lock.project):
            path, below = patch_source(lock, pin, ppath, spath)
            if ppath.name in pin.variants and not path.exists():
                raise PatchFileError(
                    f"{lock.path}: pin {pin.name}'s variant of {ppath.name} names {path}, which does "
                    f"not exist; {relative}"
                )
            patches.append(load_patch(path, sname, name=ppath.name, below=below))
    return Series(pin=pin.name, patches=tuple(patches))


def patch_source(lock: Lock, pin: Pin, listed: Path, series_file: Path) -> tuple[Path, Path]:
    """The file patch ``listed`` (an entry of ``series_file``) is read from for ``pin`` (its variant, else
    the entry) and the directory it must lie below with no link: the series file's, the project's for a
    variant."""
    variant = pin.variants.get(listed.name)
    if variant is not None:
        return variant, lock.project
    return listed, series_file.parent


def _series_path(lock: Lock, sname: str, relative: str) -> Path:
    path = lock.series[sname].path
    if not path.exists():
        raise PatchFileError(f"{lock.path}: [series.{sname}] path names {path}, which does not exist; {relative}")
    return path


_TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):\s*(.*)$")


def load_patch(path: Path, series: str = "", name: str | None = None, *, below: Path | None = None) -> Patch:
    """The patch file ``path``; ``below``: the directory it must lie in, with no link anywhere below it
    (its series file's directory, the project for a variant: :func:`dsv4patch.seriesfile.read_patch_file`)."""
    name = name or path.name
    raw = _patch_bytes(path, name, below)
    text = raw.decode("utf-8", errors="replace")
    headers = tuple(git_headers(raw))
    check_patch_text(name, headers)
    files = tuple(_file_diff(name, pf) for pf in _patch_set(path, name, text))
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
        files=files,
        adds_symlink="\nnew file mode 120000" in text or "\nnew mode 120000" in text,
        headers=headers,
    )


def _patch_bytes(path: Path, name: str, below: Path | None) -> bytes:
    """The patch file's bytes (:func:`dsv4patch.seriesfile.read_patch_file`: bounded, a regular file);
    a missing, unreadable or empty file says what to do."""
    raw = read_patch_file(path, name, below=below)
    if not raw.strip():
        raise PatchFileError(f"patch {name}: {path} is empty; regenerate it with git format-patch")
    return raw


def _patch_set(path: Path, name: str, text: str) -> PatchSet:
    """The patch parsed by unidiff: at least one file section."""
    # unidiff is imported only to parse (check's cache hit never parses a patch).
    from unidiff.errors import UnidiffParseError
    from unidiff.patch import PatchSet

    try:
        ps = PatchSet(text)
    except UnidiffParseError as exc:
        raise PatchFileError(f"patch {name}: {path} is not a valid diff: {exc}") from None
    if not len(ps):
        raise PatchFileError(f"patch {name}: {path} contains no diff (no 'diff --git' sections)")
    return ps


def _file_diff(name: str, pf: PatchedFile) -> FileDiff:
    """One file of the patch: its paths and each hunk's start and source lines."""
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
    return FileDiff(
        path=_strip(pf.target_file) if not pf.is_removed_file else _strip(pf.source_file),
        source_path=None if pf.is_added_file else _strip(pf.source_file),
        is_added=pf.is_added_file,
        is_removed=pf.is_removed_file,
        hunks=hunks,
    )


_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def _unquote(s: str) -> tuple[str, str]:
    """A C-quoted name at the start of ``s`` (as git writes it) and the rest of ``s``."""
    out = bytearray()
    i = 1
    while i < len(s):
        c = s[i]
        if c == '"':
            return out.decode("utf-8", errors="surrogateescape"), s[i + 1 :]
        if c == "\\" and i + 1 < len(s):
            n = s[i + 1]
            if n in "0123" and i + 3 < len(s) and all(x in "01234567" for x in s[i + 1 : i + 4]):
                out.append(int(s[i + 1 : i + 4], 8))
                i += 4
                continue
            out.append(_ESCAPES.get(n, ord(n)) if n in _ESCAPES else ord(n))
            i += 2
            continue
        out += c.encode("utf-8", errors="surrogateescape")
        i += 1
    return out.decode("utf-8", errors="surrogateescape"), ""


def _name(s: str, strip: bool) -> str | None:
    """A ---/+++/rename/copy name: unquoted, cut at a tab, prefix removed when ``strip``."""
    s = s.rstrip("\n")
    if s.startswith('"'):
        name, _ = _unquote(s)
    else:
        name = s.split("\t", 1)[0]
    if name == "/dev/null":
        return None
    return _strip1(name) if strip else name


def _strip1(name: str) -> str:
    """git apply's default -p1: drop the first path component."""
    return name.split("/", 1)[1] if "/" in name else name


def _diff_git_names(rest: str) -> list[str]:
    """Every name the ``diff --git`` line may stand for (all splits when ambiguous)."""
    rest = rest.rstrip("\n")
    if rest.startswith('"'):
        first, rest2 = _unquote(rest)
        rest2 = rest2.strip()
        second = _unquote(rest2)[0] if rest2.startswith('"') else rest2
        return [n for n in (_strip1(first), _strip1(second)) if n]
    names: list[str] = []
    for i, c in enumerate(rest):
        if c != " ":
            continue
        a, b = rest[:i], rest[i + 1 :]
        if b.startswith('"'):
            b = _unquote(b)[0]
        a, b = _strip1(a), _strip1(b)
        if a == b:
            return [a]
        names += [a, b]
    return names or [rest]


@dataclass
class _Section:
    """A ``diff --git`` section while :func:`git_headers` reads it."""

    paths: list[str | None]  # None: a name _name could not read (dropped in header())
    to: str | None
    mode: str | None = None
    added: list[str] = field(default_factory=list)
    hunks: bool = False  # past the first "@@": only "+" lines matter now
    unseen: str = ""  # see GitHeader.unseen

    def read(self, line: str) -> None:
        """One line after the section's ``diff --git`` line: names, mode, added lines."""
        if self.hunks:
            if line.startswith("+"):
                self.added.append(line[1:])
            return
        if line.startswith("@@"):
            self.hunks = True
        elif line.startswith(("new file mode ", "new mode ")):
            self.mode = line.split()[-1]
        elif line.startswith("index ") and len(line.split()) == 3 and self.mode is None:
            self.mode = line.split()[-1]  # 'index a..b 120000': a symlink's target changes, checked as a new one
        elif line.startswith(("--- ", "+++ ")):
            n = _name(line[4:], strip=True)
            self.paths.append(n)
            if line.startswith("+++ ") and n:
                self.to = n
        elif line.startswith(("rename from ", "copy from ")):
            source = _name(line.split(" ", 2)[2], strip=False)
            self.paths.append(source)
            self.unseen = f"is {'renamed' if line.startswith('rename') else 'copied'} from {source!r}"
        elif line.startswith("GIT binary patch") or (line.startswith("Binary files ") and line.endswith(" differ")):
            self.unseen = "is written by a binary patch"
        elif line.startswith(("rename to ", "copy to ")):
            n = _name(line.split(" ", 2)[2], strip=False)
            self.paths.append(n)
            self.to = n

    def header(self) -> GitHeader:
        """The section read: every name it gave (once each), the file git writes, mode, added lines."""
        paths = tuple(dict.fromkeys(p for p in self.paths if p))
        target = self.to or (paths[-1] if paths else "")
        return GitHeader(paths, target, self.mode, tuple(self.added), self.unseen)


def git_headers(raw: bytes) -> list[GitHeader]:
    """The file sections of a patch as git apply reads them.

    unidiff does not unquote C-quoted names (``"b/\\303\\244"``) and ignores
    ``rename to``/``copy to``; git uses all of them, so the path checks read
    them here.
    """
    text = raw.decode("utf-8", errors="surrogateescape")
    out: list[GitHeader] = []
    cur: _Section | None = None
    for line in text.split("\n"):
        if line.startswith("diff --git "):
            if cur is not None:
                out.append(cur.header())
            names = _diff_git_names(line[len("diff --git "):])
            cur = _Section(paths=list(names), to=names[-1] if names else "")
        elif cur is not None:
            cur.read(line)
    if cur is not None:
        out.append(cur.header())
    return out


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


# .gitattributes entries that make the bytes git writes on checkout differ
# from the blobs in the tree (or run a program): refused in patches.
REWRITING_ATTRIBUTES = ("eol", "ident", "filter", "working-tree-encoding", "text", "crlf")


def check_paths(patch: Patch, symlinks: set[str]) -> None:
    """Refuse a patch that writes outside the tree, before git runs.

    ``symlinks`` holds the paths of symlinks in the tree the patch targets.
    Paths are read both as unidiff sees them and as git apply will
    (:func:`git_headers`: quoted names, ``rename to``, ``copy to``).
    """
    check_patch_text(patch.name, patch.headers, patch.files)
    for p in _all_paths(patch.headers, patch.files):
        _check_path(patch.name, p, symlinks)


def _all_paths(headers: Sequence[GitHeader], files: Sequence[FileDiff]) -> list[str]:
    names: list[str] = []
    for f in files:
        names += [p for p in (f.path, f.source_path) if p]
    for h in headers:
        names += list(h.paths)
    return list(dict.fromkeys(names))


def check_patch_text(name: str, headers: Sequence[GitHeader], files: Sequence[FileDiff] = ()) -> None:
    """What can be refused from the patch alone (when it is loaded, before any tree is touched).

    Paths must stay in the tree and out of ``.git``; a created symlink must
    point inside the tree; a ``.gitattributes`` line may not rewrite files on
    checkout.
    """
    for p in _all_paths(headers, files):
        _check_path(name, p, set())
    for h in headers:
        if h.new_mode == "120000":
            _check_symlink(name, h)
        if PurePosixPath(h.path).name.casefold() == ".gitattributes":  # any case, as .git is
            _check_attributes(name, h)


def _check_path(name: str, p: str, symlinks: set[str]) -> None:
    pp = PurePosixPath(p)
    if p.startswith("/") or pp.is_absolute():
        raise PatchFileError(
            f"patch {name}: refuses absolute path {p!r}; patches must use "
            "paths relative to the vLLM tree"
        )
    if ".." in pp.parts or p.startswith("~"):
        raise PatchFileError(
            f"patch {name}: refuses path {p!r}, which leaves the tree through '..'"
        )
    if any(part.casefold() == ".git" for part in pp.parts):
        raise PatchFileError(f"patch {name}: refuses path {p!r} inside a .git directory")
    if any(ord(c) < 0x20 for c in p):
        raise PatchFileError(f"patch {name}: refuses path {p!r} with control characters")
    for i in range(1, len(pp.parts) + 1):
        prefix = str(PurePosixPath(*pp.parts[:i]))
        if prefix in symlinks:
            raise PatchFileError(
                f"patch {name}: refuses path {p!r}: {prefix!r} is a symlink in "
                "the tree, so the write could land outside it"
            )


def _check_symlink(name: str, h: GitHeader) -> None:
    """Refuse a symlink the patch creates unless it points inside the tree, whatever links lie on its way.

    Read lexically, ``s2 -> s1/../..`` beside ``s1 -> .`` is the tree's root; on
    disk ``s1/..`` is the parent of what ``s1`` points at, so ``s2`` is the
    tree's parent. Hence two rules, both on the patch alone:

    * no ``..`` after a name (going down, maybe through a link, then up): a
      target is some leading ``..`` and then names going down only;
    * the lexical check: those leading ``..`` stay at or under the root.

    Together they keep every link inside. The link's own directory is a real
    directory at the depth its path says (a path through a symlink is refused,
    by :func:`check_paths` and by git apply), so the leading ``..`` walk up
    real directories to a directory of the tree. Each name below it is then an
    entry of a directory inside the tree: a real directory (inside), or a
    link, itself either the pin's (the sdist's links are checked when it is
    extracted) or a patch's, checked by these same rules, so it leads inside
    too; going only down from inside stays inside.
    """
    target = "\n".join(h.added)
    if not target:
        raise PatchFileError(
            f"patch {name}: turns {h.path!r} into a symlink without showing its target; "
            "only new symlinks with a visible target inside the tree are allowed"
        )
    if target.startswith("/") or "\0" in target:
        raise PatchFileError(
            f"patch {name}: creates symlink {h.path!r} -> {target!r}, which points "
            "outside the tree (absolute); only relative links inside the tree are allowed"
        )
    parts = [p for p in target.split("/") if p not in ("", ".")]
    down = next((i for i, p in enumerate(parts) if p != ".."), len(parts))
    if ".." in parts[down:]:
        raise PatchFileError(
            f"patch {name}: creates symlink {h.path!r} -> {target!r}, whose '..' follows a name: "
            "through a symlink that name would lead elsewhere than it reads (outside the tree, "
            "maybe); write the target as leading '..' then names going down only "
            f"({posixpath.normpath(target)!r} if no link is on its way)"
        )
    inside = posixpath.normpath(posixpath.join(posixpath.dirname(h.path), target))
    if inside == ".." or inside.startswith("../") or target.startswith("~"):
        raise PatchFileError(
            f"patch {name}: creates symlink {h.path!r} -> {target!r}, which points "
            "outside the tree; only relative links inside the tree are allowed"
        )


def rewriting_attribute(line: str) -> str | None:
    """The first attribute of a gitattributes line that rewrites files on checkout, if any."""
    fields = line.split()
    if not fields or fields[0].startswith("#"):
        return None
    for attr in fields[1:]:
        if attr.startswith(("-", "!")):
            continue  # unsetting an attribute never rewrites anything
        if attr.split("=", 1)[0] in REWRITING_ATTRIBUTES:
            return attr
    return None


def _check_attributes(name: str, h: GitHeader) -> None:
    """Refuse a ``.gitattributes`` the patch writes with a line that rewrites files on checkout.

    Only the lines the patch shows can be checked: a ``.gitattributes`` renamed or
    copied from another file (whose lines the patch does not hold, and an earlier
    patch may have written) or written by a binary patch is refused.
    """
    if h.unseen:
        raise PatchFileError(
            f"patch {name}: {h.path} {h.unseen}, so its attributes cannot be checked; write "
            ".gitattributes with its lines in the patch (a new file or a text hunk), so its attributes "
            "are checked")
    for line in h.added:
        attr = rewriting_attribute(line)
        if attr:
            raise PatchFileError(
                    f"patch {name}: {h.path} sets attribute {attr!r} ({line.strip()!r}); "
                    "git would then write files on checkout that differ from the tree's blobs "
                    f"(attributes {', '.join(REWRITING_ATTRIBUTES)} are refused in patches)"
                )
