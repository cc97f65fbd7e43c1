"""What a pin's source is, as one type: a new kind is one module and its registration.

Why a protocol: the lock names where a pin's files come from (``kind = "pypi-sdist"``,
``"git"``, ``"local"``), and each step that depends on it (reading the lock, the cache
key, fetching the files, checking a user's checkout of it, the lock entry ``port``
writes, whether a fork's own checkout can be the tree) asks the kind, not an if-chain on
its name.  The built-in kinds live in :mod:`.sdist`, :mod:`.gitsource` and
:mod:`.localsource`; each registers itself when loaded, and :func:`source_kind` loads
them on first use.  Another kind is a class with these members passed to
:func:`register` (``tests/test_sources.py`` adds one and runs check and apply with it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dsv4patch import face
from dsv4patch.errors import LockFileError

if TYPE_CHECKING:
    from dsv4patch.pins.lock import LockTable, Pin, Source
    from dsv4patch.progress import Progress
    from dsv4patch.store import Store

BUILTIN = ("dsv4patch.pins.sdist", "dsv4patch.pins.gitsource", "dsv4patch.pins.localsource")


class SourceKind(Protocol):
    """One kind of pin source (the lock's ``[pins.NAME.source] kind``)."""

    @property
    def kind(self) -> str:
        """The name the lock gives it."""

    @property
    def keys(self) -> frozenset[str]:
        """The keys its source table may have besides ``kind``."""

    @property
    def fork(self) -> bool:
        """Whether a user's git checkout of the pin's commit can be the tree (a fork: ``apply
        --branch``, ``status --tree`` by history, ``port``'s version from the tree)."""

    @property
    def checks_base_tree(self) -> bool:
        """Whether the files fetched must give the lock's ``base_tree`` (an sdist is pinned by its
        sha256 instead; its ``base_tree`` is derived)."""

    def parse(self, table: LockTable) -> Source:
        """The source from its lock table (``table.lock_path`` for relative paths)."""

    def cache_key(self, pin: Pin) -> str:
        """The identity of the pin's files in the cache (the same files, the same key)."""

    def check_checkout(self, pin: Pin, own_tree: Path | None) -> None:
        """Refuse the pin if the user's checkout it comes from is not as the lock says (run on
        every use, warm cache or not); ``own_tree``: the tree the command works on."""

    def fetch_files(self, pin: Pin, store: Store, dest: Path, progress: Progress, own_tree: Path | None) -> None:
        """Write the pin's files (no ``.git``) into the empty directory ``dest``."""

    def describe(self, source: Source) -> str:
        """Where the files come from, for messages."""

    def checkout_path(self, source: Source) -> Path | None:
        """The user's own checkout the pin is read from (a fork's), if any: ``port`` reads its
        history (tags, the series dsv4patch committed there)."""

    def to_entry(self, source: Source, lock_dir: Path) -> dict[str, Any]:
        """The source table ``port`` writes into the lock (``kind`` included)."""


_KINDS: dict[str, SourceKind] = {}


def register(impl: SourceKind) -> None:
    """Make ``impl.kind`` a kind the lock may name."""
    have = _KINDS.get(impl.kind)
    if have is not None and have is not impl:
        raise ValueError(f"source kind {impl.kind!r} is registered already")
    _KINDS[impl.kind] = impl


def unregister(kind: str) -> None:
    _KINDS.pop(kind, None)


def kinds() -> tuple[str, ...]:
    for module in BUILTIN:
        face.load(module)  # each registers itself once
    return tuple(_KINDS)


def source_kind(kind: str) -> SourceKind:
    if kind not in kinds():
        raise LockFileError(f"source kind {kind!r} is not one of {', '.join(kinds())}")
    return _KINDS[kind]


def kind_of(pin: Pin) -> SourceKind:
    """The kind of ``pin``'s source."""
    return source_kind(pin.source.kind)
