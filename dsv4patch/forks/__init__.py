"""A fork maintainer's operations: carrying the series to a new pin (:mod:`.porting`) and
writing a tree's commits back as the series (:mod:`.refreshing`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsv4patch import face

if TYPE_CHECKING:
    from dsv4patch.forks.porting import abort as abort_port
    from dsv4patch.forks.porting import port
    from dsv4patch.forks.refreshing import refresh

# The public face: name -> "module:attribute" (what other packages may use; see dsv4patch/face.py).
FACE = {
    "abort_port": "porting:abort",
    "port": "porting:port",
    "refresh": "refreshing:refresh",
}
__all__ = [
    "abort_port",
    "port",
    "refresh",
]
if not TYPE_CHECKING:
    __getattr__ = face.lazy(__name__, globals(), FACE)
