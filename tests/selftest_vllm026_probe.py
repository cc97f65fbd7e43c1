"""Build vLLM 0.26.0's own DeepSeek-V4 classes on CPU and apply the self-test's oracle weights to them.

Run by tests/test_selftest_model.py in the 0.26.0 CPU test venv with the stock wheel's Python files on
PYTHONPATH.  What it fakes, only to construct the modules without a GPU (no forward runs): vLLM's CUDA
platform as sm_90 (``vllm026_cpu_platform.fake_cuda_platform``), CUDA streams and events, tensors asked for on
``cuda`` made on the CPU, DeepGEMM reported present, and the ``torch.ops`` custom ops the constructors only
look up.  Prints one JSON line: per model, its class, what apply_oracle_weights set and what it missed,
and the dtype/shape of the MTP layer's e_proj.

With RANKS (a JSON list of ``[tp, pp, tp_rank, pp_rank]``) it then builds, in the same process (one import
of torch and vLLM for both, issue 39), for each, the modules one worker of that
topology builds: the engine config from the self-test child's own ``LLM(...)`` arguments
(``child.llm_arguments``, so vLLM 0.26.0 accepts them for that topology), then vLLM's TP and PP groups told
that size and rank (the constructors only read them; no collective runs), and reports per rank what the oracle
set, what it missed for that pipeline stage, and every nonzero entry of the vocab-parallel matrices in whole-
matrix coordinates (the test puts the shards together and compares them with the design): a second line.

Usage: python selftest_vllm026_probe.py MODEL_PY MODEL_DIR [RANKS]
"""

from __future__ import annotations

import gc

gc.disable()  # a probe that builds and exits: no cyclic collections rescanning torch's and vLLM's heap (issue 39)

import importlib.util  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from vllm026_cpu_platform import fake_cuda_platform  # noqa: E402

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
SPECS = (("target", None), ("mtp", {"method": "mtp", "num_speculative_tokens": 1}),
         ("dspark", {"method": "dspark", "num_speculative_tokens": 5}))
state = {"first": True}


def engine_config(spec_cfg, tp=1, pp=1):
    if tp * pp == 1:
        return EngineArgs(model=sys.argv[2], load_format="dummy", skip_tokenizer_init=True, kv_cache_dtype="fp8",
                          block_size=256, max_model_len=4096, max_num_seqs=32, speculative_config=spec_cfg,
                          seed=0).create_engine_config()
    cspec = importlib.util.spec_from_file_location("selftest_child", str(Path(sys.argv[1]).parent / "child.py"))
    child = importlib.util.module_from_spec(cspec)
    cspec.loader.exec_module(child)
    args = child.llm_arguments({"model": sys.argv[2], "max_model_len": 4096, "gpu_memory_utilization": 0.115,
                                "kv_cache_bytes": 6 << 30, "tensor_parallel_size": tp, "pipeline_parallel_size": pp,
                                "engine": {"speculative_config": spec_cfg}}, "dummy")
    cfg = EngineArgs(**args).create_engine_config()
    assert (cfg.parallel_config.tensor_parallel_size, cfg.parallel_config.pipeline_parallel_size) == (tp, pp)
    return cfg


def as_rank(group, size, rank):
    """vLLM's group GROUP as rank RANK of SIZE (what the modules' constructors read of it)."""
    group.world_size, group.rank_in_group, group.rank, group.ranks = size, rank, rank, list(range(size))


def init_once(cfg):
    if state["first"]:
        with set_current_vllm_config(cfg):
            init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                         distributed_init_method="tcp://127.0.0.1:29517", backend="gloo")
            initialize_model_parallel(1, 1)
        torch.cuda.Stream = _Dummy
        torch.cuda.Event = _Dummy
        state["first"] = False


def build(which, cfg):
    init_once(cfg)
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
    return model, done


def shards(model):
    """Every vocab-parallel weight's nonzero entries, in whole-matrix coordinates (module name -> entries)."""
    out = {}
    for name, mod in model.named_modules():
        rows = m.vocab_shard(mod)
        weight = getattr(mod, "weight", None)
        if rows is None or weight is None:
            continue
        w = weight.data.float()
        nz = (w != 0).nonzero().tolist()
        out[name] = {"rows": list(rows), "shape": list(w.shape),
                     "entries": [[r + rows[0], c, float(w[r, c])] for r, c in nz]}
    return out


def tp1_report():
    """Per model at TP 1: its class, what the oracle set and missed, the MTP layer's e_proj."""
    out = {}
    for which, spec_cfg in SPECS:
        cfg = engine_config(spec_cfg)
        model, done = build(which, cfg)
        entry = {"class": type(model).__name__, "set": done, "missing": m.missing_parts(type(model).__name__, done)}
        for name, p in model.named_parameters():
            if name.endswith("e_proj.weight") or name.endswith("e_proj.weight_scale_inv"):
                entry[name.rsplit(".", 1)[-1]] = [str(p.dtype), list(p.shape)]
                if name.endswith("e_proj.weight"):
                    w = p.data.float()
                    entry["e_proj_columns_one_hot"] = bool(
                        ((w[:, : m.VOCAB_SIZE] != 0).sum(0) == 1).all() and (w.abs().max() == 1.0))
        out[which] = entry
    return out


print(json.dumps(tp1_report()), flush=True)

if len(sys.argv) > 3:
    from vllm.distributed import parallel_state as ps

    out = []
    for tp, pp, tp_rank, pp_rank in json.loads(sys.argv[3]):
        last = pp_rank == pp - 1
        for which, spec_cfg in SPECS:
            if which != "target" and pp > 1:
                continue  # vLLM 0.26.0 refuses every draft with PP > 1 in its config (docs/selftest.md, fix 3b)
            cfg = engine_config(spec_cfg, tp, pp)
            init_once(cfg)
            as_rank(ps._TP, tp, tp_rank)
            as_rank(ps._PP, pp, pp_rank)
            model, done = build(which, cfg)
            cls = type(model).__name__
            layers = sorted({int(n.split(".")[2]) for n, _ in model.named_parameters()
                             if n.startswith("model.layers.")})
            out.append({"topology": [tp, pp, tp_rank, pp_rank], "which": which, "class": cls, "set": done,
                        "layers": layers, "missing": m.missing_parts(cls, done, first_pp_rank=pp_rank == 0,
                                                                     last_pp_rank=last),
                        "missing_as_tp1": m.missing_parts(cls, done), "shards": shards(model)})
            del model
    print(json.dumps(out))

