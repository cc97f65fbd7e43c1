#!/usr/bin/env python3
"""Check the tiny DeepSeek-V4 config against vLLM 0.26.0's own config code, on CPU.

Why this exists: the GPU minutes are few, so a config vLLM would refuse must be
caught before the run.  This imports vLLM 0.26.0 (its wheel installed
``--no-deps`` with the packages pack.py lists, into any Python >= 3.10 with a
CPU torch) and builds the engine config exactly as the run does
(``EngineArgs(...).create_engine_config()``) for plain decode, MTP 1-3 and
DSpark, which runs vLLM's config classes, the DeepSeek-V4 quantization override,
the speculative-config validation (MTP ``n_predict``, DSpark block size,
draft architecture) and the V2-runner choice; for plain decode and each ``-na``
twin also vLLM's checks of the requests' top logprobs (``SamplingParams.verify``).

What it fakes, and only to get that far without a GPU: vLLM's CUDA platform is
forced (capability 9.0, "NVIDIA H200"); the compiled extension
``vllm._C_stable_libtorch`` and FlashAttention 3 are stand-in empty modules; the
four ``torch.ops._C`` capability queries return fixed answers; Triton is
declared present.  Nothing here runs a kernel or loads weights: the model
itself is only checked on the GPU.

Usage: python validate_config_cpu.py MODEL_DIR
"""

from __future__ import annotations

import sys
import types


def _fake_cuda_platform() -> None:
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
    _fake_cuda_platform.lib = lib  # type: ignore[attr-defined]

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


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    model = argv[0]
    _fake_cuda_platform()
    from vllm.engine.arg_utils import EngineArgs

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from run_e2e import METHODS, RANKED, speculative_config
    from vllm import SamplingParams

    failed = 0
    # every method, and each speculative one again with -na (vLLM's synthetic rejection at rate 0)
    todo = [(name, speculative_config(name, set())) for name in METHODS]
    todo += [(f"{name}-na", speculative_config(name, {"na"})) for name, spec in METHODS.items() if spec]
    for name, spec in todo:
        try:
            args = EngineArgs(
                model=model,
                load_format="dummy",
                skip_tokenizer_init=True,
                kv_cache_dtype="fp8",
                block_size=256,
                max_model_len=4096,
                max_num_seqs=32,
                speculative_config=spec,
                seed=0,
            )
            cfg = args.create_engine_config()
            sc = cfg.speculative_config
            draft = None
            if sc is not None:
                hf = sc.draft_model_config.hf_config
                draft = (sc.method, sc.num_speculative_tokens, hf.architectures, hf.model_type)
            ranked = ""
            if spec is None or name.endswith("-na"):
                # the references record their top logprobs (run_e2e: ranked_logprobs): the request
                # must pass vLLM's own SamplingParams checks, speculative ones included
                SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False,
                               logprobs=RANKED).verify(cfg.model_config, cfg.speculative_config,
                                                       cfg.structured_outputs_config, None)
                ranked = f" logprobs={RANKED}"
            print(
                f"OK   {name}: quantization={cfg.model_config.quantization} "
                f"kv_cache={cfg.cache_config.cache_dtype} block={cfg.cache_config.block_size} "
                f"v2_runner={cfg.use_v2_model_runner} draft={draft}{ranked}"
            )
        except Exception as exc:  # noqa: BLE001
            failed += 1
            print(f"FAIL {name}: {type(exc).__name__}: {str(exc)[:600]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
