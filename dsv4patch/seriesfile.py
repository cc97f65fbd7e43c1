"""A series file: the patch files it lists, in order, and nothing more.

Why this is not in :mod:`.patches`: a warm ``check`` needs the list (the check
cache's key is the bytes of the files it names) but never a parsed patch, and
importing the patch records and parser costs a start-up that a cache hit should
not pay (issue 39).  One patch file per line, relative to the series file;
``#`` starts a comment; blank lines are skipped.
"""

from __future__ import annotations

from pathlib import Path

from dsv4patch.errors import PatchFileError


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


def unlisted(series_files: list[Path], names: set[str]) -> set[str]:
    """Of ``names`` (patch file names, such as a pin's variants), those no file of ``series_files``
    lists; an unreadable series file is a :class:`PatchFileError`, as for :func:`read_series_file`."""
    listed = {p.name for f in series_files for p in read_series_file(f)}
    return names - listed
