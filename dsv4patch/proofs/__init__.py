"""Evidence the fixes work: each patch's tests on the unpatched and patched pin (CPU test
venvs, cached pytest runs), upstream's own tests, and the on-node self-test (:mod:`.selftest`).
"""

from __future__ import annotations
