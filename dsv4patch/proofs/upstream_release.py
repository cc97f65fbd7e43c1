"""Which release's own tests ``verify --upstream-tests`` takes by default.

Why a module of its own: ``verify``'s help names this default, and every parser that lists
``verify`` (``dsv4patch --help``, a bare or mistyped command) would otherwise import
:mod:`.upstream_tests` for one string, and with it the test environments, XML and thread pools
it runs with (about 30 ms of every such start-up, issue 39).
"""

from __future__ import annotations

# The first vLLM release with #51538 (the seven fixes): its tests are the fixes' own.
DEFAULT_FROM = "0.28.0"
