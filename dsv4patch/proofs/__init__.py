"""Evidence the fixes work: each patch's tests on the unpatched and patched pin (CPU test
venvs, cached pytest runs), upstream's own tests, and the on-node self-test (:mod:`.selftest`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsv4patch import face

if TYPE_CHECKING:
    from dsv4patch.proofs.selftest.cases import all_cases
    from dsv4patch.proofs.selftest.cases import select as select_cases
    from dsv4patch.proofs.selftest.model import MAX_PIPELINE_PARALLEL_SIZE, TENSOR_PARALLEL_SIZES
    from dsv4patch.proofs.selftest.plan import Topology
    from dsv4patch.proofs.selftest.runner import CHECK_NAMES, FAILING, Deadlines, python_of, run_selftest
    from dsv4patch.proofs.upstream_release import DEFAULT_FROM as UPSTREAM_DEFAULT_FROM
    from dsv4patch.proofs.upstream_tests import run as run_upstream_tests
    from dsv4patch.proofs.upstream_tests import source_pin as upstream_source_pin
    from dsv4patch.proofs.verifying import verify

# The public face: name -> "module:attribute" (what other packages may use; see dsv4patch/face.py).
FACE = {
    "CHECK_NAMES": "selftest.runner:CHECK_NAMES",
    "Deadlines": "selftest.runner:Deadlines",
    "FAILING": "selftest.runner:FAILING",
    "MAX_PIPELINE_PARALLEL_SIZE": "selftest.model:MAX_PIPELINE_PARALLEL_SIZE",
    "TENSOR_PARALLEL_SIZES": "selftest.model:TENSOR_PARALLEL_SIZES",
    "Topology": "selftest.plan:Topology",
    "UPSTREAM_DEFAULT_FROM": "upstream_release:DEFAULT_FROM",
    "all_cases": "selftest.cases:all_cases",
    "python_of": "selftest.runner:python_of",
    "run_selftest": "selftest.runner:run_selftest",
    "run_upstream_tests": "upstream_tests:run",
    "select_cases": "selftest.cases:select",
    "upstream_source_pin": "upstream_tests:source_pin",
    "verify": "verifying:verify",
}
__all__ = [
    "CHECK_NAMES",
    "Deadlines",
    "FAILING",
    "MAX_PIPELINE_PARALLEL_SIZE",
    "TENSOR_PARALLEL_SIZES",
    "Topology",
    "UPSTREAM_DEFAULT_FROM",
    "all_cases",
    "python_of",
    "run_selftest",
    "run_upstream_tests",
    "select_cases",
    "upstream_source_pin",
    "verify",
]
if not TYPE_CHECKING:
    __getattr__ = face.lazy(__name__, globals(), FACE)
