"""A fork maintainer's operations: carrying the series to a new pin (:mod:`.porting`) and
writing a tree's commits back as the series (:mod:`.refreshing`).
"""

from __future__ import annotations
