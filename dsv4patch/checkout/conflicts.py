"""A conflict workspace's edited files turned into a patch: shared by both workspaces.

``apply --3way`` (:mod:`.resolving`) and ``port --workspace``
(:mod:`dsv4patch.forks.portspace`) both leave conflict markers in a checkout for the
user to edit, then read the edited tree back as the patch's resolution; the two
checks they share live here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from dsv4patch import git

if TYPE_CHECKING:
    from dsv4patch.series import Patch

_MARKER = re.compile(r"^(<{7} |>{7} |<{7}$|>{7}$)", re.M)


def marked(path: Path, names: list[str]) -> list[str]:
    """The files among ``names`` (under ``path``) that still hold conflict markers (also ``resolve``'s check)."""
    return [n for n in names if (path / n).is_file() and not (path / n).is_symlink()
            and _MARKER.search((path / n).read_text(encoding="utf-8", errors="replace"))]


def resolution_patch(path: Path, at: str, patch: Patch, number: int, total: int) -> str | None:
    """The edited work tree of ``path`` as ``patch`` on commit ``at``: format-patch text, None if it changes nothing.

    Stages everything (``git add -A``), commits it on ``at`` with the
    patch's message and author, numbered ``number``/``total``.  Shared by
    ``port --workspace`` and ``resolve --continue``.
    """
    git.add_all(path)
    resolved = git.write_tree(path, {})
    if resolved == git.out(path, "rev-parse", f"{at}^{{tree}}"):
        return None
    commit = git.commit_tree(path, resolved, at, patch.message or patch.subject + "\n", patch.author)
    return git.format_patch(path, commit, number, total)
