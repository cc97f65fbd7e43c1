"""The sha256 digests dsv4patch computes, in one place.

Three forms are needed: the hex digest of bytes (file contents in reports and
provenance), the hex digest of a file read in chunks (cache blobs, seeded
files: never read whole), and a wheel ``RECORD`` entry (``sha256=`` and the
urlsafe base64 digest without padding, as the wheel spec writes it).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable
from pathlib import Path

CHUNK = 1 << 20


def sha256(data: bytes) -> str:
    """The hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def code_identity(modules: Iterable[str]) -> str:
    """dsv4patch's version and the sha256 of ``modules`` (paths relative to the package, e.g.
    ``series/engine.py``): what keys a cached result a pure function of that code decided."""
    from dsv4patch import __version__

    h = hashlib.sha256(__version__.encode())
    pkg = Path(__file__).resolve().parent
    for name in modules:
        h.update(b"\0" + name.encode() + b"\0" + (pkg / name).read_bytes())
    return h.hexdigest()


def hash_file(path: Path) -> str:
    """The hex sha256 of the file at ``path``, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def hash_installed(path: Path, limit: int) -> str | None:
    """The hex sha256 of an installed file we do not trust: a regular file (no link, no FIFO) of at most
    ``limit`` bytes, else None."""
    import os

    from dsv4patch import safeio

    try:
        fd = safeio.open_regular(path)
    except (OSError, safeio.UnsafeFileError):
        return None
    h = hashlib.sha256()
    got = 0
    try:
        while chunk := os.read(fd, CHUNK):
            got += len(chunk)
            if got > limit:
                return None
            h.update(chunk)
    finally:
        os.close(fd)
    return h.hexdigest()


def record_b64(digest: bytes) -> str:
    """A digest as a wheel RECORD writes it: urlsafe base64 without the padding."""
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def record_hash(data: bytes, digest: bytes | None = None) -> str:
    """The hash column of a wheel RECORD row for ``data`` (``digest``: its sha256, where the caller has it)."""
    return "sha256=" + record_b64(hashlib.sha256(data).digest() if digest is None else digest)
