"""The series against a pin: patch files and series (:mod:`.patches`), the engine that runs
them in a scratch index (the one code path behind check and apply), the pin check and
its cache, and what the series says about the lock (``lock --update``, the release watcher).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsv4patch import face

if TYPE_CHECKING:
    from dsv4patch.series.engine import (
        PatchResult,
        SeriesResult,
        Status,
        carried,
        carried_result,
        check_one,
        has_offsets,
        run_series,
    )
    from dsv4patch.series.lockupdate import update as update_lock
    from dsv4patch.series.patchedtree import ChangedFile, PatchedTree
    from dsv4patch.series.patches import Patch, Series, load_patch, series_for_pin
    from dsv4patch.series.pincheck import PinReport, check_pin, check_pins, patched_tree, pin_report
    from dsv4patch.series.releases import ADOPT as RELEASE_ADOPT
    from dsv4patch.series.releases import INVESTIGATE as RELEASE_INVESTIGATE
    from dsv4patch.series.releases import PORT as RELEASE_PORT
    from dsv4patch.series.releases import TOOLCHAIN as RELEASE_TOOLCHAIN
    from dsv4patch.series.releases import ReleaseReport
    from dsv4patch.series.releases import watch as watch_releases
    from dsv4patch.series.releases import write_entry as write_release_entry

# The public face: name -> "module:attribute" (what other packages may use; see dsv4patch/face.py).
FACE = {
    "ChangedFile": "patchedtree:ChangedFile",
    "Patch": "patches:Patch",
    "PatchResult": "engine:PatchResult",
    "PatchedTree": "patchedtree:PatchedTree",
    "PinReport": "pincheck:PinReport",
    "RELEASE_ADOPT": "releases:ADOPT",
    "RELEASE_INVESTIGATE": "releases:INVESTIGATE",
    "RELEASE_PORT": "releases:PORT",
    "RELEASE_TOOLCHAIN": "releases:TOOLCHAIN",
    "ReleaseReport": "releases:ReleaseReport",
    "Series": "patches:Series",
    "SeriesResult": "engine:SeriesResult",
    "Status": "engine:Status",
    "carried": "engine:carried",
    "carried_result": "engine:carried_result",
    "check_one": "engine:check_one",
    "check_pin": "pincheck:check_pin",
    "check_pins": "pincheck:check_pins",
    "has_offsets": "engine:has_offsets",
    "load_patch": "patches:load_patch",
    "patched_tree": "pincheck:patched_tree",
    "pin_report": "pincheck:pin_report",
    "run_series": "engine:run_series",
    "series_for_pin": "patches:series_for_pin",
    "update_lock": "lockupdate:update",
    "watch_releases": "releases:watch",
    "write_release_entry": "releases:write_entry",
}
__all__ = [
    "ChangedFile",
    "Patch",
    "PatchResult",
    "PatchedTree",
    "PinReport",
    "RELEASE_ADOPT",
    "RELEASE_INVESTIGATE",
    "RELEASE_PORT",
    "RELEASE_TOOLCHAIN",
    "ReleaseReport",
    "Series",
    "SeriesResult",
    "Status",
    "carried",
    "carried_result",
    "check_one",
    "check_pin",
    "check_pins",
    "has_offsets",
    "load_patch",
    "patched_tree",
    "pin_report",
    "run_series",
    "series_for_pin",
    "update_lock",
    "watch_releases",
    "write_release_entry",
]
if not TYPE_CHECKING:
    __getattr__ = face.lazy(__name__, globals(), FACE)
