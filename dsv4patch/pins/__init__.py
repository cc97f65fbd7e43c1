"""Pins and where they come from: the lock file, each pin's source fetched and kept in the
cache as a bare pin repository (:mod:`.repository`), filling the cache ahead of time.

The first stage of the pipeline: everything later reads a pin through here.
"""

from __future__ import annotations
