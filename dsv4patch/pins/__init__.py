"""Pins and where they come from: the lock file, each pin's source fetched and kept in the
cache as a bare pin repository (:mod:`.repository`), filling the cache ahead of time.

The first stage of the pipeline: everything later reads a pin through here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsv4patch import face

if TYPE_CHECKING:
    from dsv4patch.pins.context import Context
    from dsv4patch.pins.fetching import fetch
    from dsv4patch.pins.lock import (
        DEFAULT_LOCK,
        WHEEL_PLATFORMS,
        Lock,
        Pin,
        Source,
        ToolchainDef,
        WheelFile,
        find_lock,
        git_url_problem,
        open_lock,
        project_root,
        read_lock_bytes,
        read_lock_text,
        set_variant,
        update_derived,
        valid_pin_name,
    )
    from dsv4patch.pins.lock import load as load_lock
    from dsv4patch.pins.repository import PinRepo, is_materialized, materialize
    from dsv4patch.pins.sdist import version_commit
    from dsv4patch.pins.source import SourceKind, kind_of

# The public face: name -> "module:attribute" (what other packages may use; see dsv4patch/face.py).
FACE = {
    "Context": "context:Context",
    "DEFAULT_LOCK": "lock:DEFAULT_LOCK",
    "Lock": "lock:Lock",
    "Pin": "lock:Pin",
    "PinRepo": "repository:PinRepo",
    "SourceKind": "source:SourceKind",
    "Source": "lock:Source",
    "ToolchainDef": "lock:ToolchainDef",
    "WHEEL_PLATFORMS": "lock:WHEEL_PLATFORMS",
    "WheelFile": "lock:WheelFile",
    "fetch": "fetching:fetch",
    "find_lock": "lock:find_lock",
    "git_url_problem": "lock:git_url_problem",
    "is_materialized": "repository:is_materialized",
    "kind_of": "source:kind_of",
    "load_lock": "lock:load",
    "materialize": "repository:materialize",
    "open_lock": "lock:open_lock",
    "project_root": "lock:project_root",
    "read_lock_bytes": "lock:read_lock_bytes",
    "read_lock_text": "lock:read_lock_text",
    "set_variant": "lock:set_variant",
    "update_derived": "lock:update_derived",
    "valid_pin_name": "lock:valid_pin_name",
    "version_commit": "sdist:version_commit",
}
__all__ = [
    "Context",
    "DEFAULT_LOCK",
    "Lock",
    "Pin",
    "PinRepo",
    "SourceKind",
    "Source",
    "ToolchainDef",
    "WHEEL_PLATFORMS",
    "WheelFile",
    "fetch",
    "find_lock",
    "git_url_problem",
    "is_materialized",
    "kind_of",
    "load_lock",
    "materialize",
    "open_lock",
    "project_root",
    "read_lock_bytes",
    "read_lock_text",
    "set_variant",
    "update_derived",
    "valid_pin_name",
    "version_commit",
]
if not TYPE_CHECKING:
    __getattr__ = face.lazy(__name__, globals(), FACE)
