"""The series against a pin: patch files and series (:mod:`.patches`), the engine that runs
them in a scratch index (the one code path behind check and apply), the pin check and
its cache, and what the series says about the lock (``lock --update``, the release watcher).
"""

from __future__ import annotations
