"""What running a series against a pin decides: a status per patch, the hunks, the trees.

Why a module of its own: the engine computes these, the check cache stores and reloads them,
``check``, ``apply``, ``releases`` and ``port`` read them.  Plain records with no machinery
behind them, so reading a cached result (or a type) does not load the engine, git or the patch
parser: the check cache's chain stops here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    CLEAN = "clean"
    OFFSET = "offset"
    CONFLICT = "conflict"
    MISSING_FILE = "missing-file"
    ALREADY_APPLIED = "already-applied"
    UPSTREAM = "upstream"
    NOT_CHECKED = "not-checked"

    @property
    def applies(self) -> bool:
        return self in (Status.CLEAN, Status.OFFSET)

    @property
    def blocks(self) -> bool:
        """The series cannot go on past a patch with this status."""
        return self in (Status.CONFLICT, Status.MISSING_FILE, Status.NOT_CHECKED)


@dataclass
class HunkNote:
    file: str
    hunk: int
    detail: str  # "offset +3 lines", or the first line that differs
    line: int | None = None
    expected: str | None = None
    actual: str | None = None


@dataclass
class PatchResult:
    patch: str
    series: str
    sha256: str
    status: Status
    message: str = ""
    hunks: list[HunkNote] = field(default_factory=list)
    tree: str | None = None  # index tree after this patch (when it applied)
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d


@dataclass
class SeriesResult:
    pin: str
    base_commit: str
    base_tree: str
    patches: list[PatchResult]

    @property
    def final_tree(self) -> str | None:
        """Tree after the whole series (patches found upstream are skipped)."""
        tree = self.base_tree
        for p in self.patches:
            if p.status.blocks:
                return None
            if p.status.applies:
                tree = p.tree or tree
        return tree
