"""What ships: the patched vLLM wheel made from the stock one, its SBOM, the image's
build args, and checking what a node has installed against both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsv4patch import face

if TYPE_CHECKING:
    from dsv4patch.delivery.buildargs import BUILD_ARGS
    from dsv4patch.delivery.buildargs import compute as compute_build_args
    from dsv4patch.delivery.buildargs import mismatches as build_arg_mismatches
    from dsv4patch.delivery.installed import InstalledReport, SbomError, check_from_sbom
    from dsv4patch.delivery.installed import active_check as check_kernels_active
    from dsv4patch.delivery.installed import check as check_installed
    from dsv4patch.delivery.installed import inspect as inspect_installed
    from dsv4patch.delivery.installed import pick_pin as pick_installed_pin
    from dsv4patch.delivery.installed import probe as probe_installed
    from dsv4patch.delivery.installed_state import ProbedVllm
    from dsv4patch.delivery.provenance import lock_from_url
    from dsv4patch.delivery.provenance import tests_for as sbom_tests_for
    from dsv4patch.delivery.vllm_wheel import make_wheel

# The public face: name -> "module:attribute" (what other packages may use; see dsv4patch/face.py).
FACE = {
    "BUILD_ARGS": "buildargs:BUILD_ARGS",
    "InstalledReport": "installed:InstalledReport",
    "ProbedVllm": "installed_state:ProbedVllm",
    "SbomError": "installed:SbomError",
    "build_arg_mismatches": "buildargs:mismatches",
    "check_from_sbom": "installed:check_from_sbom",
    "check_installed": "installed:check",
    "check_kernels_active": "installed:active_check",
    "compute_build_args": "buildargs:compute",
    "inspect_installed": "installed:inspect",
    "lock_from_url": "provenance:lock_from_url",
    "make_wheel": "vllm_wheel:make_wheel",
    "pick_installed_pin": "installed:pick_pin",
    "probe_installed": "installed:probe",
    "sbom_tests_for": "provenance:tests_for",
}
__all__ = [
    "BUILD_ARGS",
    "InstalledReport",
    "ProbedVllm",
    "SbomError",
    "build_arg_mismatches",
    "check_from_sbom",
    "check_installed",
    "check_kernels_active",
    "compute_build_args",
    "inspect_installed",
    "lock_from_url",
    "make_wheel",
    "pick_installed_pin",
    "probe_installed",
    "sbom_tests_for",
]
if not TYPE_CHECKING:
    __getattr__ = face.lazy(__name__, globals(), FACE)
