"""A series file: the patch files it lists, in order, and nothing more; and the one reader of patch files.

Why this is not in :mod:`.patches`: a warm ``check`` needs the list (the check
cache's key is the bytes of the files it names) but never a parsed patch, and
importing the patch records and parser costs a start-up that a cache hit should
not pay (issue 39).  One patch file per line, relative to the series file;
``#`` starts a comment; blank lines are skipped.  An entry is a path below the
series file's directory: an absolute one, or one with a ``..`` component, is
refused (exit 3, "unsafe path"), and a series' patch files are opened without
following a link anywhere below that directory (:func:`dsv4patch.safeio.open_beneath`),
so a series never applies a file from outside the project's reviewed patches.

Series files and patch files are read through :mod:`dsv4patch.safeio` only (docs/trust.md "Bounds"):
a regular file (a FIFO never blocks, ``/dev/zero`` is not read), never a link as the file itself, at
most :data:`SERIES_LIMIT` / :data:`PATCH_LIMIT` bytes.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from dsv4patch import safeio
from dsv4patch.errors import PatchFileError

SERIES_LIMIT = 1 << 20  # a series file: 1 MiB (the repository's list ten names)
PATCH_LIMIT = 16 << 20  # a patch file: 16 MiB (the repository's largest is under 40 KiB)


def read_series_text(path: Path, *, below: Path | None = None) -> str:
    """The series file's text: a regular file of at most :data:`SERIES_LIMIT` bytes, UTF-8.  ``below``:
    the directory it must lie in, with no link anywhere below it (the lock's project: a series path of
    ``/etc/passwd`` is refused unread, so no line of it is ever shown)."""
    what = f"series file {path}"
    try:
        if below is not None:
            raw = safeio.read_beneath(below, path, SERIES_LIMIT, error=PatchFileError, what=what,
                                      advice=f"unsafe path: a lock's series files are regular files in its "
                                             f"project {below}")
        else:
            raw = safeio.read_bytes(path, SERIES_LIMIT, error=PatchFileError, what=what,
                                    advice="the lock's [series.*] path must name a file listing patch files")
    except FileNotFoundError:
        raise PatchFileError(f"series file {path} not found") from None
    except OSError as exc:
        raise PatchFileError(
            f"series file {path} cannot be read ({exc.strerror or exc}); the lock's "
            "[series.*] path must name a file listing patch files"
        ) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatchFileError(
            f"series file {path} is not UTF-8 text (byte {exc.start}); it lists patch files, "
            "one per line"
        ) from None


def read_series_file(path: Path, *, below: Path | None = None) -> list[Path]:
    """The patch files ``path`` lists, in order: each below the series file's directory.  ``below``: as
    for :func:`read_series_text` (the lock's project)."""
    lines = read_series_text(path, below=below).splitlines()
    out = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            bad = next((c for c in line if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0), None)
            if bad is not None:
                raise PatchFileError(
                    f"series file {path}: {line!r}: the path contains a NUL/control character ({bad!r}); "
                    "a series lists patch file names, one per line"
                )
            entry = PurePosixPath(line)
            if entry.is_absolute() or ".." in entry.parts:
                raise PatchFileError(
                    f"series file {path}: {line!r} is an unsafe path (absolute, or with a '..' component); "
                    f"a series lists its patch files by their path below its own directory {path.parent}"
                )
            out.append(path.parent / entry)
    if not out:
        raise PatchFileError(f"series file {path} lists no patches")
    return out


def read_patch_file(path: Path, name: str, *, below: Path | None = None) -> bytes:
    """The bytes of patch file ``path`` (patch ``name``): a regular file of at most :data:`PATCH_LIMIT`
    bytes, never a link; a missing or unreadable one says what to do.  ``below``: the directory the file
    must lie in (its series file's, or the project's for a variant), with no link anywhere below it.
    Every read of a patch file of a series (or a variant) goes through here."""
    what = f"patch {name}: {path}"
    advice = "a series lists patch files, regular files in the project"
    try:
        if below is not None:
            return safeio.read_beneath(below, path, PATCH_LIMIT, error=PatchFileError, what=what,
                                       advice=f"unsafe path: a series' patch files are regular files below {below}")
        return safeio.read_bytes(path, PATCH_LIMIT, error=PatchFileError, what=what, advice=advice)
    except FileNotFoundError:
        raise PatchFileError(
            f"patch {name}: file {path} not found; restore it or remove it from the series"
        ) from None
    except OSError as exc:
        raise PatchFileError(
            f"patch {name}: {path} cannot be read ({exc.strerror or exc}); a series lists "
            "patch files"
        ) from None


def unlisted(series_files: list[Path], names: set[str], *, below: Path | None = None) -> set[str]:
    """Of ``names`` (patch file names, such as a pin's variants), those no file of ``series_files``
    lists; an unreadable series file is a :class:`PatchFileError`, as for :func:`read_series_file`."""
    listed = {p.name for f in series_files for p in read_series_file(f, below=below)}
    return names - listed
