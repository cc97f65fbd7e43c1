"""Rebuilding the CUDA kernels that the patches change.

A fix in a ``.cu``/``.cuh`` file only exists once the kernel is compiled.
:mod:`sources` works out, from a patched tree, which translation units and
registered ops the applied patches touch; :mod:`build` compiles just those for
the pin's architectures and packages them as a small vLLM plugin wheel.
"""

from __future__ import annotations
