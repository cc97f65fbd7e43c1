"""Build vLLM 0.26.0's own DeepSeek-V4 classes on CPU and apply the self-test's oracle weights to them.

Run by tests/test_selftest_model.py in the 0.26.0 CPU test venv with the stock wheel's Python files on
PYTHONPATH.  What it fakes, only to construct the modules without a GPU (no forward runs): vLLM's CUDA
platform as sm_90 (``vllm026_cpu_platform.fake_cuda_platform``), CUDA streams and events, tensors asked for on
``cuda`` made on the CPU, DeepGEMM reported present, and the ``torch.ops`` custom ops the constructors only
look up.  Prints one JSON line: per model, its class, what apply_oracle_weights set and what it missed,
and the dtype/shape of the MTP layer's e_proj.

Usage: python selftest_vllm026_probe.py MODEL_PY MODEL_DIR
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys

from vllm026_cpu_platform import fake_cuda_platform

fake_cuda_platform()
import torch  # noqa: E402
import vllm.model_executor.layers.sparse_attn_indexer as sai  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402
from vllm.config import set_current_vllm_config  # noqa: E402
from vllm.distributed import init_distributed_environment, initialize_model_parallel  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.model_executor.model_loader.utils import initialize_model  # noqa: E402

sai.has_deep_gemm = lambda: True
spec = importlib.util.spec_from_file_location("selftest_model", sys.argv[1])
m = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = m
spec.loader.exec_module(m)


def _cpu(d):
    return "cpu" if d is not None and str(d).startswith("cuda") else d


class CPUMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        if getattr(func, "__name__", "") in ("to", "cuda"):
            args = tuple(_cpu(a) if isinstance(a, (str, torch.device)) else a for a in args)
            if func.__name__ == "cuda":
                return args[0]
        return func(*args, **kwargs)


class _Dummy:
    def __init__(self, *a, **k):
        pass


libs = [fake_cuda_platform.lib]
out = {}
first = True
for which, spec_cfg in (("target", None), ("mtp", {"method": "mtp", "num_speculative_tokens": 1}),
                        ("dspark", {"method": "dspark", "num_speculative_tokens": 5})):
    cfg = EngineArgs(model=sys.argv[2], load_format="dummy", skip_tokenizer_init=True, kv_cache_dtype="fp8",
                     block_size=256, max_model_len=4096, max_num_seqs=32, speculative_config=spec_cfg,
                     seed=0).create_engine_config()
    if first:
        with set_current_vllm_config(cfg):
            init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                         distributed_init_method="tcp://127.0.0.1:29517", backend="gloo")
            initialize_model_parallel(1, 1)
        torch.cuda.Stream = _Dummy
        torch.cuda.Event = _Dummy
        first = False
    for _ in range(40):
        cfg.compilation_config.static_forward_context.clear()
        try:
            with set_current_vllm_config(cfg), torch.device("cpu"), CPUMode():
                mc = cfg.model_config if which == "target" else cfg.speculative_config.draft_model_config
                model = initialize_model(vllm_config=cfg, model_config=mc)
            break
        except AttributeError as exc:
            found = re.search(r"'_OpNamespace' '(\w+)' object has no attribute '(\w+)'", str(exc))
            if not found:
                raise
            ns, op = found.groups()
            lib = libs[0] if ns == "_C" else torch.library.Library(ns, "FRAGMENT")
            lib.define(f"{op}(Tensor x) -> Tensor")
            libs.append(lib)
    with CPUMode():
        done = m.apply_oracle_weights(model)
    entry = {"class": type(model).__name__, "set": done, "missing": m.missing_parts(type(model).__name__, done)}
    for name, p in model.named_parameters():
        if name.endswith("e_proj.weight") or name.endswith("e_proj.weight_scale_inv"):
            entry[name.rsplit(".", 1)[-1]] = [str(p.dtype), list(p.shape)]
            if name.endswith("e_proj.weight"):
                w = p.data.float()
                entry["e_proj_columns_one_hot"] = bool(
                    ((w[:, : m.VOCAB_SIZE] != 0).sum(0) == 1).all() and (w.abs().max() == 1.0))
    out[which] = entry
print(json.dumps(out))
