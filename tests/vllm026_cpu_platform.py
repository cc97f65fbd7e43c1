"""vLLM 0.26.0's CUDA platform as an H200 would answer it, on a machine without a GPU (tests only).

Why: tests run vLLM 0.26.0's own Python (the stock wheel's files, CPU torch) as far as it goes
without a GPU: building its model classes (selftest_vllm026_probe.py) and the self-test child up
to the engine (test_selftest_child.py).  What it fakes, and nothing more: the platform reports
capability 9.0, "NVIDIA H200", 140 GiB, fully connected; the compiled extension
``vllm._C_stable_libtorch`` and FlashAttention 3 are empty modules; the four ``torch.ops._C``
capability queries answer fixed values; Triton is declared present.  No kernel runs.
"""

from __future__ import annotations

import sys
import types


def fake_cuda_platform() -> None:
    """Install the stand-in platform (call before vLLM picks its platform)."""
    import torch

    lib = torch.library.Library("_C", "DEF")  # kept alive below
    for name, answer in (
        ("cutlass_scaled_mm_supports_fp8", True),
        ("cutlass_scaled_mm_supports_block_fp8", True),
        ("cutlass_group_gemm_supported", True),
        ("cutlass_scaled_mm_supports_fp4", False),
    ):
        lib.define(f"{name}(int cap) -> bool")
        lib.impl(name, lambda cap, _a=answer: _a, "CompositeExplicitAutograd")
    fake_cuda_platform.lib = lib  # type: ignore[attr-defined]

    for mod in ("vllm._C_stable_libtorch", "vllm.vllm_flash_attn._vllm_fa3_C"):
        sys.modules[mod] = types.ModuleType(mod)
    import vllm.platforms as platforms
    import vllm.platforms.cuda as cuda
    from vllm.platforms.interface import DeviceCapability

    cls = getattr(cuda, "CudaPlatform", None) or cuda.NvmlCudaPlatform
    cls.get_device_capability = classmethod(lambda c, device_id=0: DeviceCapability(9, 0))
    cls.get_device_name = classmethod(lambda c, device_id=0: "NVIDIA H200")
    cls.get_device_total_memory = classmethod(lambda c, device_id=0: 140 << 30)
    cls.is_fully_connected = classmethod(lambda c, ids: True)
    platforms._current_platform = cls()
    import vllm.config.vllm as vllm_config_module

    vllm_config_module.HAS_TRITON = True

