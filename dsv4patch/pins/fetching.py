"""Filling the cache ahead of time: seed pinned files, download and materialize pins.

``dsv4patch fetch`` calls :func:`fetch`.  A seeded file (an sdist or a stock
vLLM wheel obtained elsewhere: an offline build, a Docker context) enters the
cache only if its sha256 is one the selected pins lock; then every selected
pin is downloaded (unless cached) and materialized as a git repository.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4patch import report, safeio
from dsv4patch.errors import FetchError, IntegrityError
from dsv4patch.pins import repository
from dsv4patch.records import frozen
from dsv4patch.store import UNSIZED_LIMIT

if TYPE_CHECKING:
    from dsv4patch.pins.context import Context


@frozen
class Seeded:
    """A file copied (or found already) in the cache."""

    path: Path
    kind: str  # "sdist" | "wheel"
    sha256: str
    pins: tuple[str, ...]  # what the lock calls it: pin names (a wheel: "NAME (PLATFORM wheel)")
    added: bool  # False: the cache had it already

    def note(self) -> str:
        where = "copied into the cache" if self.added else "already in the cache"
        if self.kind == "wheel":
            return f"{self.path}: pin {self.pins[0]}; {where}"
        return (f"{self.path}: the sdist of pin{'s' if len(self.pins) > 1 else ''} {', '.join(self.pins)} "
                f"(sha256 {self.sha256[:12]}...); {where}")


@frozen
class Materialized:
    pin: str
    repo: Path
    base_commit: str
    base_tree: str


@dataclass
class FetchResult:
    pins: list[Materialized] = field(default_factory=list)
    seeded: list[Seeded] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"pins": {m.pin: {"repo": str(m.repo), "base_commit": m.base_commit, "base_tree": m.base_tree}
                         for m in self.pins},
                "ok": True, "seeded": {str(s.path): list(s.pins) for s in self.seeded},
                "notes": [s.note() for s in self.seeded]}

    def table(self) -> tuple[report.Table, str]:
        return report.simple_table("dsv4patch fetch", ["pin", "base tree", "cache"],
                                   [[m.pin, m.base_tree[:12], str(m.repo)] for m in self.pins])


def fetch(
    *,
    ctx: Context,
    pins: Sequence[str] | None = None,
    sdists: Sequence[Path] = (),
    wheels: Sequence[Path] = (),
) -> FetchResult:
    """Seed ``wheels`` then ``sdists`` (refused unless a selected pin locks their sha256),
    then materialize the pins named (default: all)."""
    lock, store, progress = ctx.lock, ctx.store, ctx.progress
    selected = lock.select(list(pins) if pins else None)
    sdist_pins: dict[str, list[str]] = {}
    for p in selected:
        if p.source.kind == "pypi-sdist":
            sdist_pins.setdefault(p.source.sha256, []).append(p.name)
    wheel_pins = {w.sha256: [f"{p.name} ({w.platform} wheel)"] for p in selected for w in p.wheels.values()}
    # A seeded file is read at most to the largest size the selected pins lock for its kind (+ 1 byte):
    # /dev/zero, a FIFO or a 3 GiB file is never read for ever or whole.
    sdist_limit = _largest(p.source.size for p in selected if p.source.kind == "pypi-sdist")
    wheel_limit = _largest(w.size for p in selected for w in p.wheels.values())
    result = FetchResult()

    def seed(f: Path, kind: str, known: dict[str, list[str]], unknown: str, limit: int) -> None:
        digest = _hash_seeded(f, kind, limit)
        if digest not in known:
            raise IntegrityError(f"{f}: sha256 {digest} is not {unknown}")
        result.seeded.append(Seeded(f, kind, digest, tuple(known[digest]), store.seed_blob(f, digest, limit=limit)))

    for f in wheels:
        seed(f, "wheel", wheel_pins, "a stock wheel any selected pin locks", wheel_limit)
    for f in sdists:
        seed(f, "sdist", sdist_pins, "pinned by any selected pin", sdist_limit)
    for pin in selected:
        repo = repository.materialize(pin, store, progress)
        result.pins.append(Materialized(pin.name, repo.repo, repo.base_commit, repo.base_tree))
    return result


def _largest(sizes: Iterable[int | None]) -> int:
    """The most bytes a seeded file of a kind may have: the largest size the lock gives one
    (:data:`dsv4patch.store.UNSIZED_LIMIT` where a pinned file has no size, or none is pinned)."""
    known = list(sizes)
    if not known or any(s is None for s in known):
        return UNSIZED_LIMIT
    return max(s for s in known if s is not None)


def _hash_seeded(f: Path, kind: str, limit: int) -> str:
    """The sha256 of the file ``f`` named to be seeded: a regular file (a link the user names is followed;
    a FIFO or a device is refused, never read), read through :mod:`dsv4patch.safeio` to at most ``limit``
    bytes (a longer file is refused at its size, unread, or once it grows past ``limit``): exit 4."""
    label = f"{f}: the {kind}"
    try:
        fd = safeio.open_regular(f, error=FetchError, what=label, follow=True,
                                 advice=f"name the {kind} file itself (a {'.whl' if kind == 'wheel' else '.tar.gz'})")
    except OSError as exc:
        raise FetchError(f"{f}: cannot read the {kind} ({exc.strerror})") from None
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise IntegrityError(f"{label} is {size} bytes, more than any {kind} the selected pins lock "
                                 f"(at most {limit} bytes): not one of them; refused unread")
        h = hashlib.sha256()
        for chunk in safeio.chunks(fd, limit, label=label, error=IntegrityError):
            h.update(chunk)
        return h.hexdigest()
    except OSError as exc:
        raise FetchError(f"{f}: cannot read the {kind} ({exc.strerror})") from None
    finally:
        os.close(fd)
