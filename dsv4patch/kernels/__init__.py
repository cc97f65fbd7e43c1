"""Rebuilding the CUDA kernels that the patches change.

A fix in a ``.cu``/``.cuh`` file only exists once the kernel is compiled.
:mod:`sources` works out, from a patched tree, which translation units and
registered ops the applied patches touch; :mod:`build` compiles just those for
the pin's architectures and packages them as a small vLLM plugin wheel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsv4patch import face

if TYPE_CHECKING:
    from dsv4patch.kernels.building import DEFAULT_OUT as DEFAULT_BUILD_OUT
    from dsv4patch.kernels.building import NotThatTree, TreeBuild, build_tree, full_build
    from dsv4patch.kernels.identity import KERNEL_MEMBER_LIMIT, hook_line
    from dsv4patch.kernels.identity import dist_name as kernel_dist_name
    from dsv4patch.kernels.runtime import HOOK_MARK
    from dsv4patch.kernels.sources import is_kernel_source
    from dsv4patch.kernels.sources import plan as plan_kernels
    from dsv4patch.kernels.stock import wheel_for as stock_wheel_for
    from dsv4patch.kernels.stock import wheel_path as stock_wheel_path
    from dsv4patch.kernels.wheelcache import keep as keep_kernel_wheel
    from dsv4patch.kernels.wheelcache import kept as kept_kernel_wheel
    from dsv4patch.kernels.wheelcache import key as kernel_wheel_key

# The public face: name -> "module:attribute" (what other packages may use; see dsv4patch/face.py).
FACE = {
    "DEFAULT_BUILD_OUT": "building:DEFAULT_OUT",
    "HOOK_MARK": "runtime:HOOK_MARK",
    "KERNEL_MEMBER_LIMIT": "identity:KERNEL_MEMBER_LIMIT",
    "NotThatTree": "building:NotThatTree",
    "TreeBuild": "building:TreeBuild",
    "build_tree": "building:build_tree",
    "full_build": "building:full_build",
    "hook_line": "identity:hook_line",
    "is_kernel_source": "sources:is_kernel_source",
    "keep_kernel_wheel": "wheelcache:keep",
    "kept_kernel_wheel": "wheelcache:kept",
    "kernel_dist_name": "identity:dist_name",
    "kernel_wheel_key": "wheelcache:key",
    "plan_kernels": "sources:plan",
    "stock_wheel_for": "stock:wheel_for",
    "stock_wheel_path": "stock:wheel_path",
}
__all__ = [
    "DEFAULT_BUILD_OUT",
    "HOOK_MARK",
    "KERNEL_MEMBER_LIMIT",
    "NotThatTree",
    "TreeBuild",
    "build_tree",
    "full_build",
    "hook_line",
    "is_kernel_source",
    "keep_kernel_wheel",
    "kept_kernel_wheel",
    "kernel_dist_name",
    "kernel_wheel_key",
    "plan_kernels",
    "stock_wheel_for",
    "stock_wheel_path",
]
if not TYPE_CHECKING:
    __getattr__ = face.lazy(__name__, globals(), FACE)
