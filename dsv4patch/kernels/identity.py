"""The kernel wheel's identity as the rest of dsv4patch names it: its distribution, the most one member may
declare, and the line its ``install-hook`` appends to ``vllm/__init__.py``.

Why a module of its own: delivery reads these (``status --installed`` compares an installed kernel
wheel, ``wheel`` grafts one) and must not import the kernel build for three names (the build pulls in
the source scan, the compile pool and the wheel writer).
"""

from __future__ import annotations

import re

from dsv4patch.kernels.runtime import HOOK_MARK

KERNEL_MEMBER_LIMIT = 1 << 30  # the most one member of a --kernels wheel may declare (docs/trust.md)


def dist_name(pin_name: str) -> str:
    """The kernel wheel's distribution (and import) name for the pin ``pin_name``."""
    return "dsv4patch_kernels_" + re.sub(r"[^A-Za-z0-9]+", "_", pin_name)


def hook_line(dist: str) -> str:
    """The line ``python -m <dist> install-hook`` appends (kernels/runtime.py's ``hook_line``)."""
    return f"__import__({dist!r}).activate('vllm-hook')  {HOOK_MARK}\n"
