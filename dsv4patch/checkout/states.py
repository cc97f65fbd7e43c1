"""The state files dsv4patch leaves in a tree's git directory, as validated dataclasses.

Three files record work in progress inside a tree the user (or anyone who
can write it) controls:

* :class:`ApplyJournal` (``.git/dsv4patch-apply.json``): the move ``apply``
  was making when it was killed (see :mod:`dsv4patch.checkout.transaction`);
* :class:`ResolveState` (``.git/dsv4patch-resolve.json``): the conflict
  workspace ``apply --3way`` opened (see :mod:`dsv4patch.checkout.resolving`);
* :class:`PortState` (``.git/dsv4patch-port.json``): the conflict workspace
  ``port --workspace`` opened (see :mod:`dsv4patch.forks.portspace`).

Their values go to ``git reset --hard``, ``commit-tree`` and path joins, so a
state is read only through :meth:`from_json`, which refuses anything
dsv4patch does not write: commits must be full commit ids (never an option
or a revision expression), paths relative paths inside the work tree (never
into its git directory), a ref a branch under ``refs/heads/``.  One mechanism
checks all three: each field names its JSON key and its :class:`Kind`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import field, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from dsv4patch import safeio
from dsv4patch.errors import TreeError
from dsv4patch.records import frozen

COMMIT_ID = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")  # a state's commits: nothing git would parse
STATE_LIMIT = safeio.STATE_LIMIT  # the most dsv4patch reads of a state file


def inside_tree(name: str) -> bool:
    """Whether NAME (from a state file) is a relative path inside a work tree, not into its git dir."""
    parts = name.split("/")
    return bool(name) and "\0" not in name and not name.startswith("/") and ".." not in parts and \
        ".git" not in [p.lower() for p in parts]


@frozen
class Kind:
    """What a state field may hold: ``ok(value)`` decides, ``why(key, value)`` says what is wrong."""

    ok: Callable[[Any], bool]
    why: Callable[[str, Any], str]


def _is_commit(v: Any) -> bool:
    return isinstance(v, str) and bool(COMMIT_ID.match(v))


def _is_paths(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(n, str) and inside_tree(n) for n in v)


def _paths_why(key: str, v: Any) -> str:
    if not isinstance(v, list):
        return f"{key} is not a list"
    bad = next(n for n in v if not (isinstance(n, str) and inside_tree(n)))
    return f"{key} names {bad!r}, which is not a path inside the tree"


def _is_branch(v: Any) -> bool:
    return isinstance(v, str) and v.startswith("refs/heads/") and inside_tree(v) and len(v) > 11


TEXT = Kind(lambda v: isinstance(v, str) and bool(v), lambda k, v: f"missing {k}")
STRING = Kind(lambda v: isinstance(v, str), lambda k, v: f"{k} is not a string")
COMMIT = Kind(_is_commit, lambda k, v: f"{k} = {v!r} is not a full commit id")
PATHS = Kind(_is_paths, _paths_why)
NAMES = Kind(lambda v: isinstance(v, list) and all(isinstance(x, str) and x for x in v),
             lambda k, v: f"{k} is not a list of names")
FLAG = Kind(lambda v: isinstance(v, bool), lambda k, v: f"{k} is not true or false")
COUNT = Kind(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
             lambda k, v: f"{k} is not a count")
BRANCH = Kind(_is_branch, lambda k, v: f"{k} = {v!r} is not a branch (refs/heads/...)")


def spec(kind: Kind, key: str | None = None, *, required: bool = True, default: Any = None) -> Any:
    """A state field: its JSON ``key`` (default: the field's name) and what it may hold.

    A field that is not ``required`` may be absent or null (then ``default``)."""
    meta = {"kind": kind, "key": key, "required": required}
    if required:
        return field(metadata=meta)
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


S = TypeVar("S", bound="State")


class State:
    """Base of the state dataclasses: JSON in and out, validated on the way in."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @classmethod
    def from_json(cls: type[S], data: Any) -> S:
        """The state ``data`` (parsed JSON) holds; ValueError naming the first wrong field."""
        if not isinstance(data, dict):
            raise ValueError("not an object")
        values: dict[str, Any] = {}
        for f in fields(cls):
            kind: Kind = f.metadata["kind"]
            key = f.metadata["key"] or f.name
            value = data.get(key)
            if value is None:
                if f.metadata["required"]:
                    raise ValueError(f"missing {key}")
                continue  # the field's default
            if not kind.ok(value):
                raise ValueError(kind.why(key, value))
            values[f.name] = list(value) if isinstance(value, list) else value
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.metadata["key"] or f.name] = list(value) if isinstance(value, (list, tuple)) else value
        return out


@frozen
class ApplyJournal(State):
    """The move of a tree ``apply`` is making: HEAD, index and files from ``frm`` to ``to``."""

    frm: str = spec(COMMIT, "from")
    to: str = spec(COMMIT)
    ref: str | None = spec(BRANCH, required=False)  # the branch HEAD was on (None: detached)
    pid: int | None = spec(COUNT, required=False)


@frozen
class ResolveState(State):
    """The conflict workspace ``apply --3way`` left (``resolve --continue`` / ``--abort`` close it)."""

    lock: str = spec(TEXT)
    pin: str = spec(TEXT)
    patch: str = spec(TEXT)
    orig_head: str = spec(COMMIT)  # where --abort returns: HEAD before the first apply --3way
    at: str = spec(COMMIT)  # the committed prefix the resolution goes on
    series: list[str] | None = spec(NAMES, required=False)  # --series of the apply, if any
    patch_index: int | None = spec(COUNT, required=False)
    base_commit: str | None = spec(COMMIT, required=False)
    # The apply's own options that decide how it finishes (the kernel build: which cache and toolchain,
    # where the wheel goes): compared with resolve's and shown as the command to run, never used, so
    # a tree cannot choose them. Absent in a state an older dsv4patch wrote: None (not given).
    cache_dir: str | None = spec(STRING, required=False)
    build: bool = spec(FLAG, required=False, default=False)
    out: str | None = spec(STRING, required=False)
    conflicts: list[str] = spec(PATHS, required=False, default=[])
    python: str | None = spec(STRING, required=False)
    nvcc: str | None = spec(STRING, required=False)
    allow_torch: str | None = spec(STRING, required=False)


@frozen
class PortState(State):
    """The conflict workspace ``port --workspace DIR`` left (the same port run again goes on)."""

    lock: str = spec(TEXT)
    frm: str = spec(TEXT, "from")
    to: str = spec(TEXT)
    patch: str = spec(TEXT)
    base_commit: str = spec(COMMIT)  # the ported patches go on it (the fork's HEAD, for its own checkout)
    at: str = spec(COMMIT)
    conflicts: list[str] = spec(PATHS)
    # The fork's own checkout as the workspace: HEAD is detached while it is open and goes back
    # to base_commit, on branch orig_ref (None: HEAD was detached), when the port ends.
    own: bool = spec(FLAG, required=False, default=False)
    orig_ref: str | None = spec(BRANCH, required=False)


class _Unreadable(TreeError):
    """A state file that is a link, a FIFO, too large, too deep or not JSON (see safeio)."""


def read_json(path: Path) -> Any:
    """The JSON in ``path``: never through a link, never blocking on a FIFO, bounded (:mod:`safeio`).

    OSError (e.g. absent) or ValueError naming what is wrong."""
    try:
        return safeio.read_json(path, STATE_LIMIT, error=_Unreadable)
    except _Unreadable as exc:
        raise ValueError(str(exc)) from None


def read(cls: type[S], path: Path) -> S:
    """The state of class ``cls`` in ``path`` (OSError / ValueError as :func:`read_json`)."""
    return cls.from_json(read_json(path))


def write(path: Path, state: State, *, durable: bool = False) -> None:
    """Write ``state`` to ``path`` atomically (:func:`safeio.atomic_write`: never through a planted link)."""
    safeio.atomic_write(path, json.dumps(state.to_json(), indent=2), durable=durable)
