#!/usr/bin/env python3
"""Import the modules the device preflight imports, on a machine without a GPU.

Why this exists: the first device run (2026-12-01) lost its engines to two
imports (``cutlass.cute``, ``flashinfer``) that only a CUDA machine reached;
this script lets a CPU machine check the modules DeepSeek-V4 on vLLM 0.26.0
imports (``MODULES``, what issue 15's device preflight imported) with a new
``pack.DEPS`` set before it is packed and carried (``dsv4patch selftest``
would only show a missing one as a crash of every engine on the GPU).  Some packages query the GPU at import
(FlashInfer's GDN kernels read ``torch.cuda.get_device_properties(0)``);
``--fake-sm90`` answers those two queries as an H200 would (sm_90, 132 SMs)
so the import can go on.  A module that still fails for a CUDA-only reason
(a library such as ``libtorch_cuda.so``, a ``current_platform.is_cuda()``
branch) shows its error: read it, it is not proof of a missing package.

Usage: PYTHONPATH=SITE:SITE/nvidia_cutlass_dsl/dsl_packages[:STAND-INS] \
           python tests/gpu/e2e/import_check_cpu.py [--fake-sm90] [MODULE ...]
"""

from __future__ import annotations

import argparse
import importlib
import sys
import types

MODULES: tuple[str, ...] = (
    "vllm",
    "vllm.entrypoints.llm",
    "vllm.models.deepseek_v4",
    "vllm.models.deepseek_v4.nvidia.model",
    "vllm.models.deepseek_v4.nvidia.mtp",
    "vllm.models.deepseek_v4.nvidia.dspark",
    "vllm.models.deepseek_v4.nvidia.flashmla",
    "vllm.models.deepseek_v4.nvidia.ops.sparse_attn_compress_cutedsl",
    "vllm.models.deepseek_v4.nvidia.ops.fused_indexer_q_cutedsl",
    "vllm.models.deepseek_v4.nvidia.ops.dequant_gather_k_cutedsl",
    "vllm.model_executor.layers.sparse_attn_indexer",
    "vllm.model_executor.kernels.mhc.tilelang_kernels",
    "vllm.third_party.deep_gemm",
    # the V1 sampler imports the FlashInfer backend on every CUDA engine
    "vllm.v1.attention.backends.flashinfer",
    "vllm.v1.sample.ops.topk_topp_sampler",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.worker.gpu.model_runner",
    "cutlass",
    "cutlass.cute",
    "quack",
    "tilelang",
    "flashinfer",
)


def fake_sm90() -> None:
    """Answer torch.cuda's device-property queries as an H200 (import-time only)."""
    import torch

    props = types.SimpleNamespace(
        name="NVIDIA H200 (fake)", major=9, minor=0, multi_processor_count=132,
        total_memory=141 << 30, shared_memory_per_block_optin=227 << 10,
    )
    torch.cuda.get_device_properties = lambda *a, **k: props  # type: ignore[assignment]
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fake-sm90", action="store_true", help="fake torch.cuda device properties (sm_90)")
    ap.add_argument("modules", nargs="*", help="default: MODULES")
    args = ap.parse_args(argv)

    if args.fake_sm90:
        fake_sm90()
    failed = 0
    for name in args.modules or MODULES:
        try:
            importlib.import_module(name)
            print(f"OK   {name}")
        except BaseException as e:  # noqa: BLE001 - report every kind of failure
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[:300]}")
    print(f"{failed} of {len(args.modules or MODULES)} modules failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
