#!/usr/bin/env python3
"""DeepSeek-V4 end to end on one GPU: plain greedy decode against MTP and DSpark.

Why this exists (issue 15): every other proof covers a part; this one runs
vLLM 0.26.0's whole engine on a tiny DeepSeek-V4 (``make_tiny_dsv4.py``, dummy
weights) for the stock package and for the patched one, and applies the
greedy oracle: speculative decoding must produce exactly the tokens of plain
decoding.

Each (variant, method) runs in its own child process, in its own process group,
with one ``LLM`` (CUDA graphs on, ``enforce_eager=False``) and several prompt
sets (short and long prompts, batch 1 and several, staggered lengths so the
batch drains and CUDA-graph padding slots appear; long prompts cross the
sliding window, several 256-token KV blocks and the indexer's top-k).  The
child reports progress as JSON lines; the parent kills the whole group when the
engine start or one generate call outlives its deadline, and records per case:

* ``pass``      finished, tokens equal to plain decode of the same variant;
* ``differ``    finished, first differing position (request, token) and the
                plain run's top-2 logprob gap there (a tiny gap = a near tie);
* ``crash``     the child died or raised (the error);
* ``hang``      the deadline passed (which stage);
* ``not-run``   an earlier case of that engine hung/crashed, or no budget.

Weights: the child registers its own load format (``register_loader``):
vLLM's dummy loader, then (``--weights scaled``, the default) an in-place
rescale (norms 1, embeddings N(0,1), FP8 weights N(0,1) with scales
1/sqrt(fan_in) as powers of two, other 2-D weights N(0, 1/fan_in)) so logits
are spread, the indexer's scores do not tie and greedy decoding depends on the
context (``--weights dummy`` keeps vLLM's +-1e-3 values), then the post-load
steps each DeepSeek-V4 class's ``load_weights`` runs on a real checkpoint
(``finalize_model``), all before vLLM's profile run and CUDA-graph capture.

Usage (device):
  python run_e2e.py --model DIR --out OUT --site stock=SITE1 --site patched=SITE2
      [--variants stock,patched] [--methods plain,mtp1,mtp2,mtp3,dspark5] [--budget S]
Report only (no GPU): python run_e2e.py --report OUT a.json [b.json ...]
Imports only (device.sh runs it before any engine; exit 3 on a problem):
  python run_e2e.py --preflight --out OUT --site stock=SITE1 --site patched=SITE2
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve()

# method name -> speculative_config (None = plain decode)
METHODS: dict[str, dict[str, Any] | None] = {
    "plain": None,
    "mtp1": {"method": "mtp", "num_speculative_tokens": 1},
    "mtp2": {"method": "mtp", "num_speculative_tokens": 2},
    "mtp3": {"method": "mtp", "num_speculative_tokens": 3},
    "dspark5": {"method": "dspark", "num_speculative_tokens": 5},
}
DEFAULT_METHODS = list(METHODS)
# the same-shape oracle's near tie: plain-bmN's two best tokens at most this far apart (nats;
# bf16 logits near 2-4 step by 1/64; plain decode and plain-bmN, whose steps differ in shape
# only, part at gaps up to 0.64 in run 7, median 0.11-0.14: flip_gap_notes)
TIE_NATS = 0.1
# speculative token counts only DSpark uses (it always runs vLLM's V2 model runner)
DSPARK_KS = {m["num_speculative_tokens"] for m in METHODS.values() if m and m["method"] == "dspark"} - {
    m["num_speculative_tokens"] for m in METHODS.values() if m and m["method"] == "mtp"}
# Engine variants of a method, as a suffix: ``-v2`` runs vLLM's V2 model
# runner (``VLLM_USE_V2_MODEL_RUNNER=1``; DSpark always uses it), ``-fd`` CUDA
# graphs for decode only (``cudagraph_mode=FULL_DECODE_ONLY``: no piecewise
# graphs, prefill eager), ``-tk120`` routes the indexer's decode top-k as
# vLLM 0.26.0 routes it on SM120 (``Sm120TopkRoute``).  E.g. ``mtp3-v2-fd``,
# ``mtp1-tk120``.  For telling a bug from noise (run 5's open question):
# ``-sync`` turns vLLM's asynchronous scheduling off, ``-eager`` runs without
# CUDA graphs, ``-r2`` is a second, identical engine (``plain-r2``: plain
# decode judged by plain decode, the run-to-run noise of a whole engine).
# ``-bmN`` (plain decode only; ``-bm`` = ``-bm1``) adds N batch-mates to every
# request: 2-token prompts with the same max_tokens, so each decode step runs
# 1 + N tokens per request, as the verify of N speculative tokens does (MTP N;
# DSpark 5: ``-bm5``), and the batch drains as the speculative run's does,
# while the first step (the prompts) grows only by 2N tokens a request; only
# the real requests' tokens are kept.  It tells a speculative bug from kernels
# whose numerics depend on how many tokens a step runs.  ``-cgN`` (plain
# decode only) gives plain decode the CUDA-graph sizes of MTP N
# (``spec_capture_sizes``, rounded as the V1 runner rounds them) and nothing
# else: a first step of up to 192 (N = 2) or 256 (N = 3) tokens then runs in a
# piecewise graph, as MTP N's does, where plain decode's own sizes (up to 64)
# run it eagerly.  It tells a fault of the speculative path from one of the
# piecewise prefill itself (run 8).  ``-na`` (speculative methods only) rejects
# every draft through vLLM's own synthetic rejection sampling (acceptance rate
# 0 at every position): the same engine, graphs and step shapes, each token the
# target's choice at query row 0, i.e. plain greedy decode run in the
# speculative engine's steps.  ``mtp2-fd`` against ``mtp2-fd-na`` is the exact
# oracle with nothing but acceptance changed (``same_shape_rows``).
# ``-unsplit`` runs the engine as runs 1-8 did, without setting
# ``VLLM_USE_BREAKABLE_CUDAGRAPH`` before vLLM is imported (``breakable_env``).
SUFFIXES = ("v2", "fd", "tk120", "sync", "eager", "r2", "bm", "bm2", "bm3", "bm4", "bm5",
            "cg1", "cg2", "cg3", "cg5", "na", "unsplit")
# vLLM 0.26.0's CUDA-graph sizes for plain decode with max_num_seqs=32 (the engines' default)
CAPTURE_SIZES = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
# the most requests a case has (short_b24, mid_b24)
MOST_REQUESTS = 24


def spec_capture_sizes(k: int, max_num_seqs: int = 32) -> list[int]:
    """The CUDA-graph sizes vLLM 0.26.0 gives an engine with K speculative tokens.

    ``VllmConfig._set_cudagraph_sizes``: the largest is
    ``min(max_num_seqs * (1 + k) * 2, 512)`` (no ``max_num_batched_tokens``
    cap bites here: 16,384), the list 1, 2, 4, then steps of 8 below 256 and
    of 16 from 256.  K = 0 is plain decode (``CAPTURE_SIZES``).
    """
    top = min(max_num_seqs * (1 + k) * 2, 512)
    sizes = [i for i in (1, 2, 4) if i <= top] + list(range(8, min(top + 1, 256), 8))
    return sorted(set(sizes + list(range(256, top + 1, 16))))


def mtp_capture_sizes(n: int, v1_runner: bool = True) -> list[int]:
    """The CUDA-graph sizes an engine with N speculative tokens captures (``-cgN`` gives them to plain decode).

    vLLM's V1 runner (MTP) rounds ``spec_capture_sizes`` up to multiples of
    1 + N (``CompilationConfig.adjust_cudagraph_sizes_for_spec_decode``),
    never past the largest; DSpark runs the V2 runner, which does not round
    (``v1_runner=False``).
    """
    sizes = spec_capture_sizes(n)
    if v1_runner and n > 0:
        q = 1 + n
        sizes = sorted(r for r in {-(-s // q) * q for s in sizes} if r <= sizes[-1])
    return sizes


def graphs_of(flags: set[str]) -> int:
    """N of a method's ``-cgN`` suffix (0: none): plain decode with MTP N's CUDA-graph sizes."""
    return max((int(f[2:]) for f in flags if f.startswith("cg")), default=0)


def bm_capture_sizes(n: int, requests: int = MOST_REQUESTS, v1_runner: bool = True) -> list[int]:
    """CUDA-graph sizes of a ``-bmN`` engine: those of MTP N, up to the largest step a case makes.

    A decode step of ``plain-bmN`` runs ``requests * (1 + N)`` tokens, as MTP
    N's verify does; both must pad it to the same graph size (an eager step or
    another padding changes the numerics: run 6's ``plain-eager``).  vLLM's V1
    runner (MTP) rounds its sizes up to multiples of 1 + N
    (``CompilationConfig.adjust_cudagraph_sizes_for_spec_decode``), so the
    list here is rounded too; DSpark runs the V2 runner, which does not
    (``v1_runner=False``).  Sizes above the largest step are left out: each
    new size makes the JIT compilers (TileLang) compile again at start-up.
    """
    sizes = mtp_capture_sizes(n, v1_runner)
    need = requests * (1 + n)
    top = next((s for s in sizes if s >= need), sizes[-1])
    return [s for s in sizes if s <= top]


def speculative_config(base: str, flags: set[str]) -> dict[str, Any] | None:
    """The ``speculative_config`` an engine of method BASE with suffixes FLAGS passes vLLM (None: plain decode).

    ``-na`` asks vLLM 0.26.0's ``rejection_sample_method="synthetic"`` for an
    acceptance rate of 0 at each of the N positions: both model runners'
    greedy rejection kernels then accept no draft (``u < 0`` never holds) and
    emit the target's argmax at the first position, so every token is made
    at query row 0.
    """
    spec = METHODS[base]
    if "na" in flags:
        if spec is None:
            raise SystemExit("-na rejects every draft: a speculative method only (mtp2-na, dspark5-fd-na)")
        return {**spec, "rejection_sample_method": "synthetic",
                "synthetic_acceptance_rates": [0.0] * spec["num_speculative_tokens"]}
    return None if spec is None else dict(spec)


def breakable_env(flags: set[str]) -> None:
    """Set ``VLLM_USE_BREAKABLE_CUDAGRAPH=1`` before vLLM is imported, unless FLAGS has ``unsplit``.

    vLLM 0.26.0 (to 0.28.0) sets it for DeepSeek-V4 itself, in
    ``VllmConfig.__post_init__`` (``config/vllm.py:1177-1200``). But building
    that config has already imported the model's attention module, and
    ``@eager_break_during_capture`` decides at import time
    (``compilation/breakable_cudagraph.py:90``) not to wrap
    ``DeepseekV4Attention.attention_impl``. In the process that imported it,
    a PIECEWISE graph then has no break: attention is captured on its path
    without metadata (output zero, no KV, compressor or indexer writes) and
    replayed so. ``vllm serve`` starts its engine in a new process, which
    imports vLLM with the variable already set. The harness runs the engine
    in its own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so it sets
    the variable first, as that engine process has it (a source reading,
    checked on CPU by ``tests/test_e2e_real_vllm.py``; runs 1-8 ran without
    it: ``-unsplit``).
    """
    if "unsplit" in flags:
        os.environ.pop("VLLM_USE_BREAKABLE_CUDAGRAPH", None)
    else:
        os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1"


def attention_break() -> str:
    """Whether DeepSeek-V4's attention is a break of vLLM's breakable CUDA graph in this process."""
    mod = sys.modules.get("vllm.models.deepseek_v4.attention")
    impl = getattr(getattr(mod, "DeepseekV4Attention", None), "attention_impl", None)
    if impl is None:
        return "not loaded"
    return "wrapped" if hasattr(impl, "__wrapped__") else "not wrapped"


def mates_of(flags: set[str]) -> int:
    """Batch-mates per request that a method's ``-bm``/``-bmN`` suffix asks for (0: none)."""
    return max((int(f[2:] or 1) for f in flags if f.startswith("bm")), default=0)


def with_mates(case: Case, n: int = 1) -> Case:
    """CASE with N batch-mates per request (2-token prompts, the same max_tokens), mates last.

    Two tokens, not one: vLLM schedules a 1-token prompt as a decode, which
    would make plain decode's first step a mixed batch.
    """
    k = len(case.prompts)
    mates = [_prompt(2, 7000 + j) for j in range(n * k)]
    return Case(case.name, case.prompts + mates, case.max_tokens + case.max_tokens * n)


class Sm120TopkRoute:
    """vLLM's platform object, except that it answers "SM120 family" (and only that).

    Installed as ``current_platform`` of ``vllm.model_executor.layers.
    sparse_attn_indexer`` alone.  In vLLM 0.26.0 that module asks
    ``is_device_capability_family(120)`` in one place only: the decode top-k
    choice (``use_cooperative_topk = ... and not
    current_platform.is_device_capability_family(120)``).  On sm_90, decode
    batches of at most 32 indexer rows then go to ``persistent_topk`` as they
    do on SM120 GPUs, instead of ``cooperative_topk``.  Fix 6's -1 lengths
    (CUDA-graph padding requests, ``seq_len == 0``, ``next_n > 1``) hang
    stock's persistent kernel only on that route: ``cooperative_topk``
    compares signed, and more than 32 rows go to FilteredTopK.  The kernels,
    the lengths and the engine are vLLM's own; only the route is SM120's.
    """

    def __init__(self, real: Any) -> None:
        self._real = real

    def is_device_capability_family(self, family: int, *args: Any, **kwargs: Any) -> bool:
        if family == 120:
            return True
        return self._real.is_device_capability_family(family, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def install_sm120_topk_route() -> str:
    """Install ``Sm120TopkRoute`` in vLLM's sparse-attention indexer module; returns what was done."""
    import vllm.model_executor.layers.sparse_attn_indexer as sai

    src = Path(sai.__file__).read_text()
    uses = src.count("is_device_capability_family(")
    if uses != 1 or "not current_platform.is_device_capability_family(120)" not in src:
        # another vLLM: the answer could change more than the top-k route
        raise RuntimeError(f"{sai.__file__}: expected exactly the top-k route to ask for the SM120 "
                           f"family, found {uses} call site(s); -tk120 is not safe here")
    sai.current_platform = Sm120TopkRoute(sai.current_platform)
    return f"{sai.__name__}.current_platform answers SM120 family ({uses} call site(s) in the module)"


# vLLM 0.26.0's persistent_topk launcher (csrc/libtorch_stable/topk.cu and
# persistent_topk.cuh): a row of the indexer's decode logits is split over
# ceil(stride / chunk) CTAs, where a CTA's chunk is what fits its shared memory
# after the radix histograms (2080 bytes), in 4-byte elements: 35,968 bytes
# for at most 4 rows, 48 KiB for 5-8 rows, the whole opt-in maximum (227 KiB
# on sm_90 and sm_120) above that.  The hang needs that split: with a -1 length
# the leader CTA enters the radix path and waits for CTAs that left early.
TOPK_FIXED_SMEM = 2080
TOPK_THREADS = 1024


def persistent_topk_ctas(stride: int, rows: int, smem_optin: int = 227 * 1024) -> int:
    """CTAs per row that vLLM 0.26.0's ``persistent_topk`` uses for decode logits STRIDE wide."""
    smem = min(smem_optin, 35968) if rows <= 4 else min(smem_optin, 48 * 1024) if rows <= 8 else smem_optin
    vec = 4 if stride % 4 == 0 else 2 if stride % 2 == 0 else 1
    chunk = (smem - TOPK_FIXED_SMEM) // 4 // vec * vec
    chunk = max(chunk, vec * TOPK_THREADS)
    return -(-stride // chunk)


def tk120_problem(methods: list[str], max_model_len: int, compress_ratio: int = 4) -> str | None:
    """Why ``-tk120`` could not reach the hang at MAX_MODEL_LEN, or None.

    The indexer's decode logits are ``max_model_len // compress_ratio`` wide
    (``vllm/models/deepseek_v4/attention.py``); padded decode batches of at
    most 8 rows must split a row over more than one CTA.
    """
    if not any("tk120" in split_method(m)[1] for m in methods):
        return None
    stride = max_model_len // compress_ratio
    if persistent_topk_ctas(stride, 4) > 1 and persistent_topk_ctas(stride, 8) > 1:
        return None
    return (f"-tk120 with --max-model-len {max_model_len}: the indexer's decode logits are {stride} wide, "
            f"one CTA per row for padded batches of 4-8 rows, so stock's persistent_topk cannot hang "
            f"(use --max-model-len 65536)")


def split_method(name: str) -> tuple[str, set[str]]:
    """``mtp3-v2-fd`` -> (``mtp3``, {``v2``, ``fd``}); unknown parts raise SystemExit."""
    base, *flags = name.split("-")
    if base not in METHODS or any(f not in SUFFIXES for f in flags):
        raise SystemExit(f"unknown method {name!r}; known: {', '.join(METHODS)}, each optionally "
                         f"with suffixes {', '.join('-' + s for s in SUFFIXES)}")
    return base, set(flags)


@dataclass(frozen=True)
class Case:
    """One generate() call: prompts (token ids) and max_tokens per request."""

    name: str
    prompts: list[list[int]]
    max_tokens: list[int]


def _prompt(length: int, seed: int, vocab: int = 1000) -> list[int]:
    """Deterministic token ids in [2, vocab) (0 = bos, 1 = eos are avoided)."""
    x = seed * 2654435761 % 2**32
    out = []
    for _ in range(length):
        x = (1103515245 * x + 12345) % 2**31
        out.append(2 + x % (vocab - 2))
    return out


def select_cases(cases: list[Case], names: str) -> list[Case]:
    """The cases named in NAMES (comma-separated, in that order); all when empty."""
    if not names:
        return cases
    by = {c.name: c for c in cases}
    unknown = [n for n in names.split(",") if n and n not in by]
    if unknown:
        raise SystemExit(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(by)}")
    return [by[n] for n in names.split(",") if n]


def build_cases(long_len: int = 2300) -> list[Case]:
    """Prompt sets; the b1 cases repeat the first request of the batched ones."""
    short = [_prompt(n, s) for n, s in [(4, 1), (3, 2), (7, 3), (5, 4), (6, 5)]]
    many = [_prompt(3 + i % 6, 100 + i) for i in range(24)]
    longs = [_prompt(n, s) for n, s in [(long_len, 11), (1500, 12), (700, 13)]]
    # Most telling first: a hang or crash ends the engine's remaining cases.
    return [
        # staggered lengths: the batch drains 5 -> 1, leaving CUDA-graph padding
        # slots (seq_len 0): <= 32 indexer rows -> cooperative_topk on sm_90
        Case("short_b5", short, [300, 260, 200, 150, 90]),
        # 24 requests x (1 + k) > 32 indexer rows -> persistent_topk's
        # FilteredTopK path, which reads a padded slot's huge length past the row
        Case("short_b24", many, [300 - 10 * i for i in range(24)]),
        Case("long_b3", longs, [200, 150, 100]),
        Case("short_b1", short[:1], [300]),
        Case("long_b1", longs[:1], [200]),
        # short_b24's shape with prompts of 9-14 tokens: longer than 1 + k for
        # every method, so no prompt is scheduled as a decode (vLLM classifies a
        # request with at most 1 + k new tokens as a decode)
        Case("mid_b24", [_prompt(9 + i % 6, 100 + i) for i in range(24)], [300 - 10 * i for i in range(24)]),
        # run 7's open question (MTP 2/3 with CUDA graphs put token 0 of short_b24 off): the same
        # first-step total (132 tokens, padded to MTP 2's graph of 138) with prompts of 4-7
        # tokens, so MTP 2 schedules none as a decode ...
        Case("short_b24_pf", [_prompt(4 + i % 4, 100 + i) for i in range(24)], [300 - 10 * i for i in range(24)]),
        # ... and short_b24 with its last prompt 6 tokens longer: 138 tokens, MTP 2's graph size
        # exactly, so its first step has decodes beside prefills but no padding rows
        Case("short_b24_nopad", many[:-1] + [_prompt(3 + 23 % 6 + 6, 123)], [300 - 10 * i for i in range(24)]),
    ]


# --------------------------------------------------------------------------
# child side (runs inside the device's Python with vLLM importable)


def _scale_model_weights(model: Any) -> int:
    """In-place rescale of one model's dummy weights (see module docstring).

    Runs inside the loader, on the checkpoint-layout tensors, before vLLM's
    ``process_weights_after_loading`` turns them into kernel layouts, so every
    later transform (FP8 scale layouts, ...) is vLLM's own.
    """
    import math
    import zlib

    import torch

    count = 0
    seen: set[int] = set()
    for name, p in model.named_parameters(remove_duplicate=True):
        t = p.data
        if t.device.type == "meta" or t.numel() == 0 or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        gen = torch.Generator(device=t.device).manual_seed(zlib.crc32(name.encode()))
        leaf = name.rsplit(".", 1)[-1]
        owner = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
        if t.dtype == torch.float8_e4m3fn:
            r = torch.randn(t.shape, generator=gen, device=t.device).clamp_(-4, 4)
            t.copy_(r.to(t.dtype))
        elif leaf in ("weight_scale_inv", "weight_scale") or leaf.endswith("_weight_scale_inv"):
            if t.dtype == torch.float32 and t.dim() >= 1:
                fan_in = max(1, t.shape[-1] * 128)
                t.fill_(2.0 ** round(math.log2(1.0 / math.sqrt(fan_in))))
            else:
                continue
        elif leaf == "weight" and "norm" in owner and t.is_floating_point():
            t.fill_(1.0)
        elif leaf == "weight" and owner in ("embed_tokens", "lm_head") and t.is_floating_point():
            std = 1.0 if owner == "embed_tokens" else 1.0 / math.sqrt(t.shape[-1])
            t.copy_(torch.randn(t.shape, generator=gen, device=t.device) * std)
        elif leaf == "weight" and t.dim() == 2 and t.is_floating_point():
            # unquantized projections (indexer weights_proj, router, compressor,
            # Markov head): without this the indexer's scores all tie
            std = 1.0 / math.sqrt(t.shape[-1])
            t.copy_(torch.randn(t.shape, generator=gen, device=t.device) * std)
        else:
            continue
        count += 1
    return count


# What each DeepSeek-V4 model class's own ``load_weights`` runs after loading a
# checkpoint (vLLM 0.26.0, ``vllm/models/deepseek_v4/nvidia/``): the target
# model (``model.py``) calls ``self.model.finalize_mega_moe_weights()`` and
# ``self.model.finalize_mhc_broadcast_weights()``; MTP (``mtp.py``)
# ``self.finalize_mega_moe_weights()``; DSpark (``dspark.py``)
# ``self._finalize_moe()``.  vLLM's dummy loader never calls ``load_weights``,
# so without these the first forward stops at ``assert
# self.hc_attn_fn_broadcast is not None`` (run 2).
FINALIZE_STEPS: tuple[tuple[str, str], ...] = (
    ("model", "finalize_mega_moe_weights"),
    ("model", "finalize_mhc_broadcast_weights"),
    ("", "finalize_mega_moe_weights"),
    ("", "_finalize_moe"),
)


def finalize_model(model: Any) -> list[str]:
    """Run the post-load steps MODEL's class has (FINALIZE_STEPS); returns the ones run."""
    ran: list[str] = []
    for attr, method in FINALIZE_STEPS:
        owner = getattr(model, attr, None) if attr else model
        fn = getattr(type(owner), method, None) if owner is not None else None
        if callable(fn):
            getattr(owner, method)()
            ran.append(f"{type(owner).__name__}.{method}")
    return ran


LOAD_FORMAT = "dsv4e2e_dummy"


def register_loader(weights: str, emit: Any) -> str:
    """Register LOAD_FORMAT: vLLM's dummy loader + optional rescale + the finalize steps.

    Registered in this process; the child runs the engine in-process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the engine core's model runner
    (and the MTP/DSpark proposer, whose ``draft_load_config`` defaults to the
    target's) resolve the same registry.
    """
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    class E2EDummyLoader(DummyModelLoader):
        def load_weights(self, model: Any, model_config: Any) -> None:
            super().load_weights(model, model_config)
            scaled = _scale_model_weights(model) if weights == "scaled" else 0
            ran = finalize_model(model)
            emit(event="loaded", model=type(model).__name__, scaled_params=scaled, finalize=ran)

    register_model_loader(LOAD_FORMAT)(E2EDummyLoader)
    return LOAD_FORMAT


def _fingerprint() -> dict[str, Any]:
    """Which vLLM is loaded and which fixes its Python carries (proves the variant)."""
    import importlib
    import importlib.metadata as md

    import vllm

    fp: dict[str, Any] = {"vllm_file": vllm.__file__, "vllm_version": getattr(vllm, "__version__", "?")}
    probes = {
        "fix1_get_dspark_swa_index_width": ("vllm.v1.attention.backends.mla.compressor_utils", "get_dspark_swa_index_width"),
        "fix2_use_workspace_lane": ("vllm.v1.worker.workspace", "use_workspace_lane"),
        "fix5_has_flashinfer_sparse_mla_sm120_config": ("vllm.utils.flashinfer", "has_flashinfer_sparse_mla_sm120_config"),
    }
    for key, (mod, attr) in probes.items():
        try:
            fp[key] = hasattr(importlib.import_module(mod), attr)
        except Exception as exc:  # noqa: BLE001
            fp[key] = f"{type(exc).__name__}: {exc}"
    fp["general_plugins"] = sorted(e.name for e in md.entry_points(group="vllm.general_plugins"))
    return fp


def deficits(prompt_len: int, seq: list[int], plp: list[dict[int, float] | None]) -> list[float]:
    """Per generated token: plain's best logprob minus the token's, teacher-forced.

    PLP is the prompt logprobs (``prompt_logprobs=1``) of prompt + SEQ scored as
    one prompt by the plain engine: entry i holds the logprobs of the top-1 and
    of the actual token i given tokens < i.  0 means the token is plain's own
    greedy choice in that context; a missing or non-finite entry counts as inf.
    """
    return [_deficit(plp[prompt_len + j] if prompt_len + j < len(plp) else None, tok) for j, tok in enumerate(seq)]


def _deficit(d: dict[int, float] | None, tok: int) -> float:
    """Best logprob in D minus TOK's; inf when TOK or a finite value is missing."""
    if not d or tok not in d:
        return float("inf")
    best, got = max(d.values()), d[tok]
    return best - got if best == best and got == got and got != float("-inf") else float("inf")


# top logprobs a reference records at each position (``ranked_rows``)
RANKED = 5


def ranked_rows(steps: list[dict[int, float]]) -> tuple[list[float], list[int], list[list[Any]]]:
    """Per position of one request: the top-2 logprob gap, the second token, and the near ties.

    STEPS[j] holds vLLM's logprobs at output position j (its top ``RANKED``
    and the sampled token).  The near ties are ``[j, tokens]`` for each
    position where more than one token is within ``TIE_NATS`` of the best,
    best first: a tie of three tokens or more, which the runner-up alone
    cannot tell (run 9: ``long_b3`` request 0, position 2).
    """
    gaps: list[float] = []
    second: list[int] = []
    near: list[list[Any]] = []
    for j, lp in enumerate(steps):
        ranked = sorted(((v, k) for k, v in lp.items()), reverse=True)
        gaps.append(round(ranked[0][0] - ranked[1][0], 6) if len(ranked) > 1 else float("inf"))
        second.append(ranked[1][1] if len(ranked) > 1 else -1)
        close = [k for v, k in ranked if ranked[0][0] - v <= TIE_NATS]
        if len(close) > 1:
            near.append([j, close])
    return gaps, second, near


FORCE_KEY = "dsv4e2e_force"


def forced_deficits(seq: list[int], got: list[int], step_lps: list[dict[int, float] | None]) -> list[float]:
    """Per token of SEQ: plain decode's best raw logprob minus SEQ's token's, forced decode.

    The plain engine decodes the case again with each step's token forced to
    SEQ's (``ForceTokens``) and ``logprobs=1``; vLLM reports raw logprobs
    (before logits processors), so STEP_LPS[j] holds plain decode's top-1 and
    the forced token at step j, in plain decode's own kernels, batch shapes and
    KV cache.  A step where forcing did not hold (GOT differs) or a missing
    entry counts as inf.
    """
    return [_deficit(step_lps[j] if j < len(step_lps) else None, tok)
            if j < len(got) and got[j] == tok else float("inf") for j, tok in enumerate(seq)]


class ForceState:
    """Which batch row decodes which forced sequence (vLLM's persistent-batch updates).

    The bookkeeping of ``ForceTokens`` without vLLM or torch, so it is tested
    on CPU: rows are added with their SamplingParams and the live list of
    output token ids (its length is the index of the token sampled next,
    placeholders of in-flight steps included), removed, moved or swapped.
    """

    def __init__(self) -> None:
        self.rows: dict[int, tuple[list[int], list[int]]] = {}

    def update(self, added: Any, removed: Any, moved: Any) -> None:
        for index, params, _prompt, output_ids in added:
            forced = (getattr(params, "extra_args", None) or {}).get(FORCE_KEY)
            if forced is not None:
                self.rows[index] = (list(forced), output_ids)
            else:
                self.rows.pop(index, None)
        for index in removed:
            self.rows.pop(index, None)
        for a, b, direction in moved:
            ea, eb = self.rows.pop(a, None), self.rows.pop(b, None)
            if ea is not None:
                self.rows[b] = ea
            if eb is not None and getattr(direction, "name", str(direction)) == "SWAP":
                self.rows[a] = eb

    def targets(self) -> list[tuple[int, int]]:
        """(row, token) for every row whose next token is forced."""
        out = []
        for row, (forced, output_ids) in self.rows.items():
            n = len(output_ids)
            if n < len(forced):
                out.append((row, forced[n]))
        return out


def force_tokens_processor() -> type:
    """vLLM logits processor forcing each request's tokens to ``extra_args[FORCE_KEY]``."""
    from vllm.v1.sample.logits_processor import LogitsProcessor

    class ForceTokens(LogitsProcessor):
        def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
            self.state = ForceState()

        def is_argmax_invariant(self) -> bool:
            return False

        def update_state(self, batch_update: Any) -> None:
            if batch_update is not None:
                self.state.update(batch_update.added, batch_update.removed, batch_update.moved)

        def apply(self, logits: Any) -> Any:
            for row, tok in self.state.targets():
                if row < logits.shape[0]:
                    keep = logits[row, tok].clone()
                    logits[row].fill_(float("-inf"))
                    logits[row, tok] = keep
            return logits

    return ForceTokens


# deficit thresholds counted per request (score_done "counts": [tokens, > 0.1, > 0.5, > 1.0])
COUNT_THRESHOLDS = (0.1, 0.5, 1.0)


def first_marks(ds: list[float], over: float = 1.0) -> list[float]:
    """[deficit of token 0, first position more than OVER nats below plain's best (-1: none)].

    Token 0 comes from the prompt alone, the same context in every engine: a
    large deficit there is the prefill's, before any speculative step ran.
    """
    d0 = ds[0] if ds else 0.0
    pos = next((j for j, d in enumerate(ds) if d > over), -1)
    return [round(d0, 6) if d0 != float("inf") else float("inf"), pos]


def worst_deficit(ds: list[float]) -> list[float]:
    """[largest deficit, its position] (position -1 for an empty sequence); inf stays a float."""
    if not ds:
        return [0.0, -1]
    j = max(range(len(ds)), key=lambda k: ds[k])
    return [round(ds[j], 6) if ds[j] != float("inf") else float("inf"), j]


# Modules that import vLLM's ``split_decodes_and_prefills`` by name and use it
# on DeepSeek-V4's path (vLLM 0.26.0): each attention metadata builder splits
# the batch into decodes and prefills with its own threshold.
SPLIT_USERS = (
    "vllm.v1.attention.backends.mla.sparse_swa",
    "vllm.v1.attention.backends.mla.indexer",
    "vllm.models.deepseek_v4.sparse_mla",
    "vllm.models.deepseek_v4.compressor",
    "vllm.model_executor.layers.attention.sparse_mla_attention",
)


def install_split_trace(emit: Any, limit: int, gate: Any = None) -> dict[str, str]:
    """--trace-split: report the first LIMIT decode/prefill splits of the builders in SPLIT_USERS.

    With GATE (a ``threading.Event``) only splits made once it is set count:
    the child sets it when the engine is ready, so the limit is not spent on
    the warm-up and CUDA-graph capture (run 7's 80 splits all were).

    Each module's name ``split_decodes_and_prefills`` is rebound to a wrapper
    that calls vLLM's function unchanged and emits a ``split`` event: which
    module, its threshold and flags, the result (decodes, prefills, decode
    tokens, prefill tokens) and the step's query lengths.  It shows how a
    step with short prompts is cut (run 6's open question: prompts of at
    most 1 + k tokens scheduled as decodes beside longer ones).  Returns
    module -> "traced" or why not.
    """
    import importlib

    import vllm.v1.attention.backends.utils as utils

    real = utils.split_decodes_and_prefills
    seen = [0]

    def wrap(who: str) -> Any:
        def traced(cam: Any, decode_threshold: int = 1, require_uniform: bool = False,
                   treat_short_extends_as_decodes: bool = True) -> Any:
            out = real(cam, decode_threshold, require_uniform, treat_short_extends_as_decodes)
            if seen[0] < limit and (gate is None or gate.is_set()):
                seen[0] += 1
                qsl = cam.query_start_loc_cpu
                lens = [int(x) for x in (qsl[1:] - qsl[:-1])[:64]]
                emit(event="split", who=who, threshold=decode_threshold, require_uniform=require_uniform,
                     short_extends_as_decodes=treat_short_extends_as_decodes, result=[int(x) for x in out],
                     num_reqs=int(cam.num_reqs), query_lens=lens)
            return out
        return traced

    status: dict[str, str] = {}
    for name in SPLIT_USERS:
        try:
            mod = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a module this vLLM lacks or cannot import here
            status[name] = f"not imported: {type(exc).__name__}: {exc}"[:200]
            continue
        if getattr(mod, "split_decodes_and_prefills", None) is real:
            mod.split_decodes_and_prefills = wrap(name.rsplit(".", 1)[-1])
            status[name] = "traced"
        else:
            status[name] = "does not import split_decodes_and_prefills by name"
    return status


def install_accept_trace() -> tuple[dict[str, list[list[int]]] | None, str]:
    """Record, per request, each verify step that accepted drafts: ``[tokens before it, accepted]``.

    The exact oracle needs it (``same_shape_rows``): with A drafts accepted
    at a step, that step's tokens at positions ``pos .. pos + A - 1`` are
    the drafts, each checked by the target model at query row ``0 .. A - 1``,
    and the bonus token at ``pos + A`` is the target's choice at query row A.
    Plain decode computes every token at row 0, so from ``pos + A`` on the
    two may round differently; before it they must agree token for token.
    vLLM 0.26.0's ``Scheduler.update_from_output`` reports each request's
    accepted drafts to ``make_spec_decoding_stats`` before the step's tokens
    are appended, so the request's output length there is ``pos``; that
    method is wrapped (in the scheduler class: the engine runs in this
    process).  Keys are the external request ids (``RequestOutput.request_id``:
    the scheduler's id less its random ``-xxxxxxxx`` suffix).  Returns the log
    (None when not traced) and "traced" or why not.
    """
    import inspect

    try:
        from vllm.v1.core.sched.scheduler import Scheduler
    except Exception as exc:  # noqa: BLE001 - a vLLM without this scheduler: no trace
        return None, f"not imported: {type(exc).__name__}: {exc}"[:200]
    real = Scheduler.make_spec_decoding_stats
    sig = inspect.signature(real)
    if not {"num_accepted_tokens", "request_id"} <= set(sig.parameters):
        return None, f"make_spec_decoding_stats{sig} has no num_accepted_tokens/request_id"
    log: dict[str, list[list[int]]] = {}

    def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        a = sig.bind(self, *args, **kwargs).arguments
        n, rid = int(a["num_accepted_tokens"] or 0), str(a["request_id"])
        req = self.requests.get(rid)
        if n > 0 and req is not None:
            head, _, tail = rid.rpartition("-")
            log.setdefault(head if head and len(tail) == 8 else rid, []).append([len(req._output_token_ids), n])
        return real(self, *args, **kwargs)

    Scheduler.make_spec_decoding_stats = traced
    return log, "traced"


def zero_kv_caches(worker: Any) -> list[int]:
    """Zero every KV-cache storage of WORKER's layers; returns [storages, bytes].

    Runs inside vLLM's worker (``LLM.collective_rpc``).  The caches are found
    where vLLM binds them, as ``kv_cache`` of each layer in the compilation
    config's ``static_forward_context`` (target, MTP and DSpark layers, the
    compressor state and indexer caches included); storages shared by several
    layers (packed layouts) are zeroed once.
    """
    import torch

    ctx = worker.vllm_config.compilation_config.static_forward_context
    storages: dict[int, Any] = {}
    for layer in ctx.values():
        kv = getattr(layer, "kv_cache", None)
        for t in kv if isinstance(kv, (list, tuple)) else [kv]:
            if isinstance(t, torch.Tensor) and t.numel():
                st = t.untyped_storage()
                storages.setdefault(st.data_ptr(), st)
    cuda = bool(storages) and torch.cuda.is_available()
    if cuda:  # the last step's kernels (another stream) are done before the caches change
        torch.cuda.synchronize()
    for st in storages.values():
        st.fill_(0)
    if cuda:
        torch.cuda.synchronize()
    return [len(storages), sum(st.nbytes() for st in storages.values())]


def fresh_state(llm: Any) -> list[int]:
    """--zero-kv: drop the prefix cache and zero every KV cache; returns [storages, bytes].

    Between generate() calls no request is running, so every block is free:
    each case (and each scoring pass) then starts from the same all-zero cache
    a fresh engine has (vLLM allocates it with ``torch.zeros``).  vLLM 0.26.0
    does not zero reused blocks for DeepSeek-V4 (0.27.1 and 0.28.0 zero new
    blocks of mixed-precision caches); this tells a
    kernel that reads slots no token of the case wrote (stale bytes from
    earlier cases) from a difference of the speculative path itself.
    """
    if not llm.reset_prefix_cache():
        raise RuntimeError("reset_prefix_cache() refused: requests still running between cases")
    (res,) = llm.collective_rpc(zero_kv_caches)
    return res


def child_main(args: argparse.Namespace) -> int:
    import threading

    progress = open(args.progress, "a", buffering=1)  # noqa: SIM115
    lock = threading.Lock()  # --trace-split emits from vLLM's threads too

    def emit(**kw: Any) -> None:
        kw["t"] = time.time()
        with lock:
            progress.write(json.dumps(kw) + "\n")
            progress.flush()

    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    # SIGUSR1 dumps every thread's Python stack into the log: the parent sends
    # it to a child that stopped making progress, before killing it
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # engine core in this process: the loader registered below is the one it uses
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    base, flags = split_method(args.method)
    if "v2" in flags:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    breakable_env(flags)
    fp = _fingerprint()
    if "tk120" in flags:
        fp["topk_route"] = install_sm120_topk_route()
    ready = threading.Event()  # set once the engine is ready: the split trace skips warm-up and capture
    if args.trace_split:
        fp["split_trace"] = install_split_trace(emit, args.trace_split, ready)
    spec = speculative_config(base, flags)
    accepted: dict[str, list[list[int]]] | None = None
    if spec is not None:
        accepted, fp["accept_trace"] = install_accept_trace()
    emit(event="fingerprint", data=fp)
    load_format = register_loader(args.weights, emit)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    own: dict[str, list[list[int]]] = {}
    extra: dict[str, Any] = {}
    cc: dict[str, Any] = {}
    if "fd" in flags:
        cc["cudagraph_mode"] = "FULL_DECODE_ONLY"
    mates = mates_of(flags)
    if mates:
        if spec is not None:
            raise SystemExit("-bm is a control for plain decode (plain-bm)")
        # as the speculative engine of the same N pads its steps (DSpark: V2 runner, -bm5)
        cc["cudagraph_capture_sizes"] = bm_capture_sizes(mates, v1_runner=mates not in DSPARK_KS)
    graphs = graphs_of(flags)
    if graphs:
        if spec is not None or mates:
            raise SystemExit("-cg is a control for plain decode (plain-cg2)")
        cc["cudagraph_capture_sizes"] = mtp_capture_sizes(graphs, v1_runner=graphs not in DSPARK_KS)
    if cc:
        extra["compilation_config"] = cc
    if "sync" in flags:
        extra["async_scheduling"] = False
    if args.method == "plain" and args.score_mode == "decode":
        # only the scorer needs it (vLLM's V2 runner refuses custom logits processors: plain-bm5-v2);
        # rows without extra_args[FORCE_KEY] are left alone: plain decode is unchanged
        extra["logits_processors"] = [force_tokens_processor()]
    llm = LLM(
        model=args.model,
        load_format=load_format,
        skip_tokenizer_init=True,
        kv_cache_dtype="fp8",
        block_size=256,
        max_model_len=args.max_model_len,
        max_num_seqs=32 * (1 + mates),
        gpu_memory_utilization=args.gpu_memory_utilization,
        # a fixed KV cache instead of memory profiling: several engines share
        # the GPU (--parallel), and profiling would count the others' memory
        kv_cache_memory_bytes=int(args.kv_cache_gib * 2**30),
        seed=0,
        enforce_eager="eager" in flags,
        speculative_config=spec,
        disable_log_stats=False,  # spec-decode acceptance counters for the report
        **extra,
    )
    emit(event="engine_ready", attention_break=attention_break())
    ready.set()

    def before_generate() -> None:
        if args.zero_kv:
            storages, nbytes = fresh_state(llm)
            emit(event="kv_zeroed", storages=storages, bytes=nbytes)

    # plain engines and -na twins record each position's top RANKED logprobs, the references'
    # near ties (``ranked_rows``); a -na twin's tokens are all made at query row 0, so its
    # logprobs are the target's there, in the very engine it judges
    ranked_logprobs = spec is None or "na" in flags
    for real in select_cases(build_cases(args.long_len), args.cases):
        case = with_mates(real, mates) if mates else real
        n_real = len(real.prompts)  # the mates' outputs (after the real requests') are dropped
        before_generate()
        emit(event="case_start", case=case.name)
        params = [
            SamplingParams(
                temperature=0.0,
                max_tokens=n,
                ignore_eos=True,
                detokenize=False,
                logprobs=RANKED if ranked_logprobs else None,
            )
            for n in case.max_tokens
        ]
        if accepted is not None:
            accepted.clear()
        t0 = time.time()
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in case.prompts], params, use_tqdm=False
        )
        outs = outs[:n_real]
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        # per request, its steps that accepted drafts (None: not traced)
        accepts = None if accepted is None else [sorted(accepted.get(str(o.request_id), [])) for o in outs]
        gaps: list[list[float]] | None = None
        runner_up: list[list[int]] | None = None  # plain engines, -na twins: each position's second choice
        near: list[list[list[Any]]] | None = None  # ... and [position, tokens] where several are near the best
        if ranked_logprobs:
            gaps, runner_up, near = [], [], []
            for o in outs:
                gap_row, second_row, near_row = ranked_rows(
                    [{int(k): float(v.logprob) for k, v in lp.items()} for lp in o.outputs[0].logprobs or []])
                gaps.append(gap_row)
                runner_up.append(second_row)
                near.append(near_row)
        metrics: dict[str, Any] = {}
        try:
            for m in llm.get_metrics():
                if "spec_decode" in m.name:
                    val = getattr(m, "value", None)
                    metrics[m.name] = val if val is not None else getattr(m, "values", None)
        except Exception:  # noqa: BLE001
            pass
        emit(event="case_done", case=case.name, tokens=tokens, gaps=gaps, runner_up=runner_up, near=near,
             seconds=round(time.time() - t0, 3), spec_metrics=metrics, accepts=accepts)
        if spec is None:
            own[case.name] = tokens
    if args.method == "plain":
        # score: this plain engine's own tokens (the noise control), then each
        # speculative run's, teacher-forced (--score-mode).  With --score-wait
        # the engine stays up until the parent writes that file: a JSON list of
        # the speculative runs' progress files (they ran alongside this engine).
        score_from = list(args.score_from)
        if args.score_wait:
            emit(event="waiting")
            go = Path(args.score_wait)
            while not go.exists():
                time.sleep(0.5)
            score_from += json.loads(go.read_text())
        sources: list[tuple[str, dict[str, list[list[int]]]]] = [("plain", own)]
        for path in score_from:
            src = Path(path).stem.split("-", 1)[-1]
            done = {e["case"]: e["tokens"] for e in _read_events(Path(path)) if e["event"] == "case_done"}
            sources.append((src, done))
        cases = {c.name: c for c in build_cases(args.long_len)}
        for src, by_case in sources:
            for name, seqs in by_case.items():
                before_generate()
                emit(event="score_start", source=src, case=name, mode=args.score_mode)
                prompts = cases[name].prompts
                worst, counts, first = [], [], []
                if args.score_mode == "decode":
                    # the case again, every token forced to the source's: plain
                    # decode's own numerics judge each token in the source's context
                    outs = llm.generate(
                        [TokensPrompt(prompt_token_ids=p) for p in prompts],
                        [SamplingParams(temperature=0.0, max_tokens=max(1, len(s)), ignore_eos=True, detokenize=False,
                                        logprobs=1, extra_args={FORCE_KEY: s}) for s in seqs],
                        use_tqdm=False,
                    )
                    per_req = []
                    for o, s in zip(outs, seqs, strict=False):
                        lps = [None if d is None else {int(k): float(v.logprob) for k, v in d.items()}
                               for d in (o.outputs[0].logprobs or [])]
                        per_req.append(forced_deficits(s, list(o.outputs[0].token_ids), lps))
                else:
                    outs = llm.generate(
                        [TokensPrompt(prompt_token_ids=p + s) for p, s in zip(prompts, seqs, strict=False)],
                        SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1, detokenize=False),
                        use_tqdm=False,
                    )
                    per_req = []
                    for o, p, s in zip(outs, prompts, seqs, strict=False):
                        plp = [None if d is None else {int(k): float(v.logprob) for k, v in d.items()}
                               for d in (o.prompt_logprobs or [])]
                        per_req.append(deficits(len(p), s, plp))
                for ds in per_req:
                    worst.append(worst_deficit(ds))
                    counts.append([len(ds)] + [sum(1 for d in ds if d > t) for t in COUNT_THRESHOLDS])
                    first.append(first_marks(ds))
                emit(event="score_done", source=src, case=name, worst=worst, counts=counts, first=first)
    emit(event="child_done")
    return 0


# --------------------------------------------------------------------------
# parent side (no vLLM import)


@dataclass
class CaseResult:
    variant: str
    method: str
    case: str
    status: str  # pass | differ | crash | hang | not-run | finished (plain)
    detail: str = ""
    seconds: float | None = None
    tokens: list[list[int]] | None = None
    gaps: list[list[float]] | None = None
    spec_metrics: dict[str, Any] = field(default_factory=dict)
    # speculative runs: per request, [position, accepted drafts] of each step that accepted
    # some (install_accept_trace); None where not traced
    accepts: list[list[list[int]]] | None = None
    # plain runs (and -na twins from run 10): per request, each position's second choice
    # (top-2 logprobs); None before run 8
    runner_up: list[list[int]] | None = None
    # the same runs from run 10: per request, [position, tokens] wherever more than one token's
    # logprob is within TIE_NATS of the best (``ranked_rows``); None before
    near: list[list[list[Any]]] | None = None


@dataclass
class RunResult:
    variant: str
    method: str
    start_seconds: float | None
    fingerprint: dict[str, Any] | None
    outcome: str  # done | crash | hang | cut (budget) | not-run
    detail: str
    cases: list[CaseResult]
    # plain runs only: source ("plain" or a method) -> case -> [[worst deficit, position], ...]
    scores: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)
    # source -> case -> per request [tokens, deficits > 0.1, > 0.5, > 1.0] (COUNT_THRESHOLDS)
    score_counts: dict[str, dict[str, list[list[int]]]] = field(default_factory=dict)
    score_mode: str = ""
    # source -> case -> per request [deficit of token 0, first position beyond 1 nat or -1] (first_marks)
    score_first: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)
    # merged reports (--report): which input file (one device call) the run came from
    call: str = ""


def scoring_plain(runs: list[RunResult], r: RunResult) -> RunResult | None:
    """The plain run that judges R: plain decode of R's variant in R's own call.

    Merged calls hold several plain runs of a variant, and a method may have
    run in more than one call: R is judged by the plain engine that scored R's
    tokens, i.e. the one of its call that has R's method among its scores,
    else the last plain run of R's call; another call's only when R's call
    has no plain run of R's variant.
    """
    cands = [p for p in runs if p.method == "plain" and p.variant == r.variant]
    group = [p for p in cands if p.call == r.call] or cands  # another call's only without one of R's own
    hit = next((p for p in reversed(group) if r.method in p.scores or r.method in p.score_counts), None)
    return hit or (group[-1] if group else None)


# case statuses of a run that finished its case: the oracle's verdicts and plain's "finished"
VERDICTS = ("pass", "differ", "noise", "wrong")
FINISHED = ("finished", *VERDICTS)


def _read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill
    return events


def _error_from_log(log: str) -> str:
    """The most telling error line of a child's log."""
    lines = [ln for ln in log.splitlines() if ln.strip()]
    keys = ("Error", "Exception", "error:", "Traceback", "Assertion", "CUDA", "Killed")
    picked = [ln for ln in lines if any(k in ln for k in keys) and "Traceback" not in ln]
    if picked:
        return picked[-1].strip()[:500]
    return (lines[-1].strip()[:500] if lines else "no output")


def cuda_gdb() -> str | None:
    """cuda-gdb of the CUDA toolkit, if this machine has one."""
    found = shutil.which("cuda-gdb")
    if found:
        return found
    home = os.environ.get("CUDA_HOME")
    cand = Path(home) / "bin" / "cuda-gdb" if home else None
    return str(cand) if cand is not None and cand.is_file() else None


def probe_hang(pid: int, log: Any, budget: float) -> None:
    """Say in LOG where a child that stopped making progress is stuck.

    Its Python stack (SIGUSR1, see ``child_main``) shows where the host waits;
    with BUDGET > 0 and cuda-gdb on the machine, ``info cuda kernels`` names
    the kernel still running on the GPU (a spinning ``persistent_topk_kernel``
    is fix 7's hang).  Best effort: a probe that fails says so and the child
    is killed as before.
    """
    log.write("\n===== hang probe: python stacks (SIGUSR1) =====\n")
    log.flush()
    try:
        os.kill(pid, signal.SIGUSR1)
        time.sleep(2.0)
    except ProcessLookupError:
        return
    gdb = cuda_gdb() if budget > 0 else None
    which = gdb or ("(none on this machine)" if budget > 0 else "(off)")
    log.write(f"\n===== hang probe: cuda-gdb {which} =====\n")
    log.flush()
    if gdb is None:
        return
    try:
        out = subprocess.run(
            [gdb, "-q", "-batch", "-p", str(pid), "-ex", "info cuda kernels", "-ex", "info cuda blocks",
             "-ex", "detach"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=budget,
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        out = f"cuda-gdb failed: {exc!r}"
    log.write(out[-6000:] + "\n===== hang probe end =====\n")
    log.flush()


def run_child(
    cmd: list[str],
    env: dict[str, str],
    progress: Path,
    log_path: Path,
    case_names: list[str],
    start_deadline: float,
    case_deadline: float,
    variant: str,
    method: str,
    first_case_deadline: float | None = None,
    hard_stop: float | None = None,
    poll: float = 0.5,
    settle: float = 5.0,
    on_event: Any = None,
    hang_probe_s: float = 0.0,
) -> RunResult:
    """Run one child in its own process group under the deadlines; collect results.

    ON_EVENT, when given, is called with each new progress event (the parent
    starts the other engines when the first one reports ``engine_ready``).  A
    plain child that reports ``waiting`` (for the speculative runs to score) has
    no deadline but HARD_STOP.
    """
    progress.write_text("")
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        t_start = time.monotonic()
        stage_start, stage, deadline = t_start, "engine start", start_deadline
        hung: str | None = None
        seen = 0
        while proc.poll() is None:
            events = _read_events(progress)
            for ev in events[seen:]:
                if ev["event"] in ("engine_ready", "case_done"):
                    stage, stage_start, deadline = "between cases", time.monotonic(), case_deadline
                if ev["event"] == "case_start":
                    first = ev["case"] == case_names[0] and first_case_deadline is not None
                    stage, stage_start = f"case {ev['case']}", time.monotonic()
                    deadline = first_case_deadline if first else case_deadline
                if ev["event"] == "score_start":
                    stage, stage_start = f"scoring {ev['source']} {ev['case']}", time.monotonic()
                    deadline = case_deadline
                if ev["event"] == "score_done":
                    stage, stage_start, deadline = "between scores", time.monotonic(), case_deadline
                if ev["event"] == "waiting":
                    stage, stage_start, deadline = "waiting for the speculative runs", time.monotonic(), float("inf")
                if on_event is not None:
                    on_event(ev)
            seen = len(events)
            over_budget = hard_stop is not None and time.monotonic() > hard_stop
            if over_budget or time.monotonic() - stage_start > deadline:
                hung = (
                    f"budget: cut during {stage}"
                    if over_budget
                    else f"{stage}: no progress within {deadline:.0f} s"
                )
                if not over_budget:
                    room = hang_probe_s if hard_stop is None else min(hang_probe_s, hard_stop - time.monotonic() - 10)
                    probe_hang(proc.pid, log, budget=max(0.0, room))
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
                break
            time.sleep(poll)
        rc = proc.returncode
        # Leave no straggler of the group (vLLM's engine core) holding the GPU,
        # and give the driver a moment to tear a killed context down.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
            killed_rest = True
        except (ProcessLookupError, PermissionError):
            killed_rest = False
        if hung is not None or killed_rest:
            time.sleep(settle)
    events = _read_events(progress)
    log_text = log_path.read_text(errors="replace")
    fingerprint = next((e["data"] for e in events if e["event"] == "fingerprint"), None)
    ready = next((e for e in events if e["event"] == "engine_ready"), None)
    if fingerprint is not None and ready is not None and "attention_break" in ready:
        fingerprint["attention_break"] = ready["attention_break"]
    start_seconds = None
    if ready is not None and events:
        start_seconds = round(ready["t"] - events[0]["t"], 1)
    done = {e["case"]: e for e in events if e["event"] == "case_done"}
    started = [e["case"] for e in events if e["event"] == "case_start"]
    finished_all = any(e["event"] == "child_done" for e in events)
    if hung is not None and hung.startswith("budget"):
        outcome, detail = "cut", hung
    elif hung is not None:
        outcome, detail = "hang", hung
    elif rc != 0 or not finished_all:
        outcome, detail = "crash", f"exit {rc}: {_error_from_log(log_text)}"
    else:
        outcome, detail = "done", ""
    cases: list[CaseResult] = []
    for name in case_names:
        if name in done:
            ev = done[name]
            cases.append(CaseResult(variant, method, name, "finished", "", ev.get("seconds"),
                                    ev.get("tokens"), ev.get("gaps"), ev.get("spec_metrics") or {},
                                    ev.get("accepts"), ev.get("runner_up"), ev.get("near")))
        elif outcome == "cut":
            cases.append(CaseResult(variant, method, name, "not-run", detail))
        elif started and started[-1] == name and outcome in ("hang", "crash"):
            cases.append(CaseResult(variant, method, name, outcome, detail))
        elif outcome in ("hang", "crash") and ready is None and name == case_names[0]:
            cases.append(CaseResult(variant, method, name, outcome, "engine start: " + detail))
        else:
            why = f"earlier {outcome}" if outcome != "done" else "not reached"
            cases.append(CaseResult(variant, method, name, "not-run", why))
    scores: dict[str, dict[str, list[list[float]]]] = {}
    counts: dict[str, dict[str, list[list[int]]]] = {}
    first: dict[str, dict[str, list[list[float]]]] = {}
    mode = ""
    for e in events:
        if e["event"] == "score_start":
            mode = e.get("mode", "prefill")
        if e["event"] == "score_done":
            scores.setdefault(e["source"], {})[e["case"]] = e["worst"]
            if "counts" in e:
                counts.setdefault(e["source"], {})[e["case"]] = e["counts"]
            if "first" in e:
                first.setdefault(e["source"], {})[e["case"]] = e["first"]
    return RunResult(variant, method, start_seconds, fingerprint, outcome, detail, cases, scores, counts, mode,
                     score_first=first)


def first_difference(ref: list[list[int]], got: list[list[int]]) -> tuple[int, int] | None:
    """(request, position) of the first differing token, or None when equal."""
    for r, (a, b) in enumerate(zip(ref, got, strict=False)):
        n = min(len(a), len(b))
        for i in range(n):
            if a[i] != b[i]:
                return r, i
        if len(a) != len(b):
            return r, n
    if len(ref) != len(got):
        return min(len(ref), len(got)), 0
    return None


def tolerance(plain: RunResult | None, floor: float = 0.5, factor: float = 2.0) -> float | None:
    """How far from plain's greedy choice a token may be and still be numerical noise.

    FACTOR times the worst deficit of plain decode's own tokens when the same
    engine scores them again (--score-mode: through prefill, whose kernels
    round differently from decode, or by forced decode, which shows how far
    plain decode is from reproducing itself), and never under FLOOR.  None
    without plain's self-score.  One global number: ``noise_table`` shows the
    same comparison case by case.
    """
    if plain is None or "plain" not in plain.scores:
        return None
    worst = [w[0] for rows in plain.scores["plain"].values() for w in rows]
    if not worst:
        return None
    return max(floor, factor * max(worst))


def apply_oracle(runs: list[RunResult], tie_gap: float = 1e-3) -> None:
    """Mark each finished speculative case against plain decode of its variant.

    ``pass``: the very tokens of plain decode.  Otherwise, when the plain
    engine scored the speculative run's tokens (teacher-forced, see
    ``deficits``): ``noise`` when every token is within ``tolerance`` of
    plain's greedy choice in its own context, ``wrong`` when one is not (a
    bug, not rounding).  ``differ`` when there is no score.
    """
    for r in runs:
        pr = scoring_plain(runs, r) if r.method != "plain" else None
        for c in r.cases:
            if c.status not in FINISHED or r.method == "plain":
                continue
            ref = next((x for x in pr.cases if x.case == c.case and x.status == "finished"), None) if pr else None
            if ref is None or ref.tokens is None or c.tokens is None:
                c.status, c.detail = "finished", "no plain reference for this variant"
                continue
            diff = first_difference(ref.tokens, c.tokens)
            if diff is None:
                c.status, c.detail = "pass", ""
                continue
            req, pos = diff
            gap = None
            if ref.gaps and req < len(ref.gaps) and pos < len(ref.gaps[req]):
                gap = ref.gaps[req][pos]
            tie = " (near tie)" if gap is not None and gap < tie_gap else ""
            first = f"first difference request {req} token {pos}; plain top-2 logprob gap there {gap}{tie}"
            worst = pr.scores.get(r.method, {}).get(c.case) if pr is not None else None
            tol = tolerance(pr)
            if worst is None or tol is None:
                c.status, c.detail = "differ", first
                continue
            w_req = max(range(len(worst)), key=lambda k: worst[k][0])
            w, w_pos = worst[w_req]
            c.status = "noise" if w <= tol else "wrong"
            c.detail = (f"{first}; worst token: request {w_req} token {int(w_pos)}, "
                        f"{w} below plain's best logprob (tolerance {tol:.3f}, {pr.score_mode or 'prefill'} scoring)")
            cnt = pr.score_counts.get(r.method, {}).get(c.case)
            if cnt:
                tot = _count_totals(cnt)
                c.detail += "; tokens beyond " + "/".join(str(t) for t in COUNT_THRESHOLDS) + ": " + \
                    "/".join(str(x) for x in tot[1:]) + f" of {tot[0]}"


class Early(NamedTuple):
    """A request of a speculative case that leaves its reference before its first bonus token."""

    request: int
    token: int  # the first differing position
    bonus: int  # the request's first bonus token, -1 when it accepted no draft
    gap: float | None  # the reference's top-2 logprob gap there (None: not recorded)
    # whether the run took the reference's second choice there, or where the reference recorded its
    # near ties (``near``), one of them (None: unknown)
    second: bool | None
    step: int = -1  # the engine step that made the position (-1: untraced)
    gap_from: str = ""  # "" the reference's own logprobs; "plain": plain decode's at the same prefix
    # whether plain decode of the run's variant and call gave this request's own tokens again when
    # it decoded them forced (``plain_reproducible``; None: unknown)
    reproducible: bool | None = None


# A speculative run's excess of tokens off plain decode's choices over its -na twin's, in standard
# errors (pooled two-proportion z), beyond which the run is worse than its twin (``TwinNoise``).
TWIN_Z_MAX = 3.0


@dataclass
class TwinNoise:
    """A speculative case's tokens against its ``-na`` twin's, both scored by the same plain engine.

    Where the exact oracle cannot decide (the batches around a request differ
    once a batch-mate accepted a draft; plain decode itself does not reproduce
    a request's tokens), the run must at least be no further from plain
    decode's choices than the very engine with every draft rejected: per
    ``COUNT_THRESHOLDS``, its share of tokens more than that far below plain's
    best logprob may exceed the twin's by at most ``TWIN_Z_MAX`` standard
    errors.  Speculative tokens a bug made (accepted drafts the target would
    not choose, another request's KV) sit far below plain's choice, many of
    them: the counts are the test.  The worst token is reported, not gated:
    a single maximum over thousands of tokens is the noisiest statistic there
    is (run 10, DSpark, two engines that differ only in accepted drafts:
    ``mid_b24``'s twin's worst token is 0.98 nat worse than the run's,
    ``short_b24``'s run's 0.52 nat worse than its twin's), and a margin tied
    to plain's tolerance would judge the same tokens by whether a long case
    ran in the same call (run 9b: tolerance 0.5 without one, 10b: 1.84).
    """

    run: list[int]  # [tokens, beyond 0.1, beyond 0.5, beyond 1.0]
    twin: list[int]
    run_worst: float
    twin_worst: float

    @property
    def z(self) -> list[float]:
        out = []
        n1, n2 = self.run[0], self.twin[0]
        for k1, k2 in zip(self.run[1:], self.twin[1:], strict=False):
            p = (k1 + k2) / (n1 + n2) if n1 + n2 else 0.0
            se = (p * (1 - p) * (1 / n1 + 1 / n2)) ** 0.5 if n1 and n2 else 0.0
            out.append(round((k1 / n1 - k2 / n2) / se, 2) if se else 0.0)
        return out

    @property
    def ok(self) -> bool:
        return self.run[0] > 0 and self.run[0] == self.twin[0] and all(z <= TWIN_Z_MAX for z in self.z)

    def describe(self) -> str:
        heads = "/".join(str(t) for t in COUNT_THRESHOLDS)
        return (f"beyond {heads} nat {'/'.join(map(str, self.run[1:]))} vs the twin's "
                f"{'/'.join(map(str, self.twin[1:]))} of {self.run[0]} (z {'/'.join(map(str, self.z))}), "
                f"worst {self.run_worst} vs {self.twin_worst}")


def twin_noise(runs: list[RunResult], run: RunResult, twin: RunResult, case: str) -> TwinNoise | None:
    """``TwinNoise`` of RUN's CASE against TWIN's, from the plain engine that scored both; None unscored."""
    pr = scoring_plain(runs, run)
    if pr is None:
        return None
    counts = [_count_totals(pr.score_counts.get(m, {}).get(case, [])) for m in (run.method, twin.method)]
    worst = [pr.scores.get(m, {}).get(case) for m in (run.method, twin.method)]
    if not all(counts) or not all(worst):
        return None
    return TwinNoise(counts[0], counts[1], max(w[0] for w in worst[0]), max(w[0] for w in worst[1]))


@dataclass
class SameShape:
    """One speculative case against a run of its own step shape (``plain-bmN`` or its ``-na`` twin): the exact oracle."""

    variant: str
    call: str
    method: str
    reference: str  # plain-bmN, or the run's -na twin
    case: str
    requests: int
    equal: int
    # differ, but not before the request's first bonus token (first accepted step's pos + accepted)
    after_accept: int
    # the requests that differ earlier (``Early``)
    before: list[Early]
    traced: bool
    # differ, but not before the engine step at which the two batches stopped having the same
    # requests (``batch_change_step``); that step, None when every request ran to the end in both
    after_change: int = 0
    change_step: int | None = None
    # -na twins only: the first engine step whose batch differs from the twin's (``mates_step``;
    # None: no request accepted a draft), and whether plain decode of this variant and call gave
    # its own tokens again when it decoded them forced (False: it did not, so the engines are not
    # reproducible on this case; None: unknown)
    twin: bool = False
    mates_step: int | None = None
    reproducible: bool | None = None
    # -na twins only: the run's tokens against the twin's, scored by plain decode (``TwinNoise``)
    noise: TwinNoise | None = None

    def _unrepro(self, e: Early) -> bool:
        return (self.reproducible if e.reproducible is None else e.reproducible) is False

    def kind(self, e: Early) -> str:
        """How an early difference is judged: ``tie``, ``batch``, ``nondet`` (both: by ``noise``) or ``fail``.

        The twin runs the same engine on the same inputs until a batch-mate
        accepts a draft (``mates_step``): before that step a difference on a
        request plain decode reproduces is a bug, near tie or not.  From that
        step on the batches around the request differ, and vLLM's kernels do
        not promise the same rounding in another batch (FlashMLA splits a
        request's KV by the whole batch's work); on a request plain decode
        does not reproduce (long prompts) nothing is exact.
        """
        near = e.gap is not None and e.gap <= TIE_NATS and e.second is not False
        if not self.twin:
            return "tie" if near else "fail"
        later = self.mates_step is not None and e.step >= self.mates_step
        if near and (later or self._unrepro(e)):
            return "tie"
        if self._unrepro(e):
            return "nondet"
        return "batch" if later else "fail"

    @property
    def verdict(self) -> str:
        """``pass``: exact up to each bonus token; ``tie``: the only earlier differences are near-tie flips.

        A near-tie flip: at the first difference the reference's two best
        tokens are at most ``TIE_NATS`` apart and the run took the second
        (or one of its near ties, where recorded).  Against a ``-na`` twin
        the differences ``kind`` calls ``batch`` or ``nondet`` leave the
        exact oracle without a decision; the case is then ``noise`` when its
        tokens are no further from plain decode's than the twin's
        (``TwinNoise.ok``), else ``fail``.
        """
        if not self.before:  # an untraced row puts every difference here
            return "pass"
        if not self.traced:  # which differences follow accepted drafts is unknown
            return "untraced"
        kinds = {self.kind(e) for e in self.before}
        if "fail" in kinds:
            return "fail"
        if kinds == {"tie"}:
            return "tie"
        return "noise" if self.noise is not None and self.noise.ok else "fail"

    def kinds_text(self) -> str:
        """How many early differences are of each kind, e.g. ``batch 9, tie 1``."""
        counts: dict[str, int] = {}
        for e in self.before:
            counts[self.kind(e)] = counts.get(self.kind(e), 0) + 1
        return ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))


def bm_runs(runs: list[RunResult]) -> list[tuple[RunResult, int]]:
    """The ``plain-bmN`` runs among RUNS, each with its N."""
    out = []
    for r in runs:
        base, flags = split_method(r.method)
        if base == "plain" and mates_of(flags):
            out.append((r, mates_of(flags)))
    return out


def shape_references(runs: list[RunResult]) -> list[tuple[RunResult, Callable[[RunResult], bool]]]:
    """The runs that judge others token for token (``same_shape_rows``), each with which runs it judges.

    ``plain-bmN`` judges the speculative runs of its N in its CUDA-graph mode
    (a prefill in a piecewise graph and an eager one differ in plain decode
    too: run 8).  A ``-na`` run judges the run of its very method without
    ``-na``: the same engine, whose drafts may be accepted.
    """
    out: list[tuple[RunResult, Callable[[RunResult], bool]]] = []
    for bm, n in bm_runs(runs):
        def by_bm(r: RunResult, n: int = n, mode: frozenset[str] = graph_mode(split_method(bm.method)[1])) -> bool:
            base, flags = split_method(r.method)
            spec = METHODS[base]
            return spec is not None and spec["num_speculative_tokens"] == n and graph_mode(flags) == mode
        out.append((bm, by_bm))
    for na in runs:
        base, flags = split_method(na.method)
        if "na" in flags:
            out.append((na, lambda r, me=(base, flags - {"na"}): split_method(r.method) == me))
    return out


def _at(rows: list[list[Any]] | None, i: int, j: int) -> Any:
    """ROWS[i][j], or None where a row or position is missing (per request, per token lists)."""
    return rows[i][j] if rows and i < len(rows) and j < len(rows[i]) else None


def near_set(case: CaseResult, i: int, pos: int) -> set[int] | None:
    """The tokens within ``TIE_NATS`` of the best at request I, position POS of CASE (empty: one clear best).

    None where CASE recorded no near ties (runs up to 9: only the runner-up).
    """
    if case.near is None or i >= len(case.near):
        return None
    return next((set(tokens) for j, tokens in case.near[i] if j == pos), set())


def first_bonus(accepts: list[list[int]]) -> int | None:
    """Position of a request's first bonus token (computed at a query row > 0), None without one."""
    return min((pos + n for pos, n in accepts if n > 0), default=None)


def step_of(accepts: list[list[int]], pos: int) -> int:
    """The engine step (0: the prompt's) that made position POS of a request with ACCEPTS.

    Each step makes one token and, at a verify step that accepted A drafts
    (``[tokens before it, A]``), A more: positions ``p .. p + A`` share a step.
    """
    return pos - sum(min(n, max(0, pos - p)) for p, n in accepts)


def batch_change_step(tokens: list[list[int]], accepts: list[list[list[int]]]) -> int | None:
    """First engine step at which a speculative batch no longer holds the requests plain-bmN's holds.

    A request that accepted drafts reaches its ``max_tokens`` in fewer steps
    than plain-bmN's copy of it (which makes one token a step), so from the
    step after its last one the speculative batch is smaller: every request's
    step has another shape there, and the kernels whose rounding follows the
    batch (FlashMLA splits each request's KV by the whole batch's work) may
    flip a near tie from then on.  None when no request accepted a draft.
    """
    ends = [step_of(acc, len(t) - 1) + 1 for t, acc in zip(tokens, accepts, strict=False) if any(n > 0 for _, n in acc)]
    return min(ends, default=None)


def mates_step(accepts: list[list[list[int]]]) -> int | None:
    """First engine step whose batch is not its ``-na`` twin's: the one after the first step that accepted a draft.

    Until then both engines ran the same requests at the same positions with
    the same drafts; the step after a request accepts drafts, its context is
    longer and its drafts are others, so every request's step has another
    batch around it (FlashMLA splits each request's KV by the whole batch's
    work).  None when no request accepted a draft.
    """
    steps = [step_of(acc, pos) + 1 for acc in accepts for pos, n in acc if n > 0]
    return min(steps, default=None)


def plain_run(runs: list[RunResult], variant: str, call: str) -> RunResult | None:
    """The plain decode run of VARIANT in CALL (the scorer and noise control of that call), if it ran."""
    return next((r for r in runs if r.method == "plain" and r.variant == variant and r.call == call), None)


def plain_reproducible(plain: RunResult | None, case: str, request: int | None = None) -> bool | None:
    """Whether PLAIN gave its own tokens again, decoding them forced, on CASE (or its REQUEST alone).

    Its forced decode of its own tokens (``scores["plain"]``) finds each one
    plain decode's best unless the engine is not reproducible there (runs 9
    and 10: ``long_b3`` request 0, whose compressed context exceeds the
    indexer's top-k, 0.4-2.3 nat; 0.0 on its other requests and on the
    short cases).  None when that run or score is missing.
    """
    rows = None if plain is None else plain.scores.get("plain", {}).get(case)
    if not rows:
        return None
    if request is not None:
        return rows[request][0] == 0 if request < len(rows) else None
    return all(w[0] == 0 for w in rows)


def graph_mode(flags: set[str]) -> frozenset[str]:
    """The suffixes that change how an engine's steps run (CUDA-graph mode); runs compared token for token share it."""
    return frozenset(flags & {"fd", "eager"})


def _tie_at(ref: CaseResult, plain: CaseResult | None, i: int, pos: int, a: list[int],
            b: list[int]) -> tuple[float | None, bool | None, str]:
    """Where request I of a run (tokens B) leaves its reference's (A) at POS: the gap, ``second``, its source.

    The reference's own top-2 gap there, and whether B took its second choice
    (or one of its near ties, where recorded).  A reference without logprobs
    (a ``-na`` twin before run 10) borrows PLAIN's, when plain decode made
    that very prefix and both tokens are among its best (``Early``).
    """
    gap, second = _at(ref.gaps, i, pos), None
    runner_up, close = _at(ref.runner_up, i, pos), near_set(ref, i, pos)
    if close is not None and pos < len(b):
        second = b[pos] in close
    elif runner_up is not None and pos < len(b):
        second = b[pos] == runner_up
    if gap is not None or plain is None or i >= len(plain.tokens or []):
        return gap, second, ""
    p_tokens = plain.tokens[i]
    p_gap, p_second, p_close = _at(plain.gaps, i, pos), _at(plain.runner_up, i, pos), near_set(plain, i, pos)
    if (p_gap is None or (p_second is None and p_close is None)
            or pos >= min(len(p_tokens), len(a), len(b)) or p_tokens[:pos] != b[:pos]):
        return gap, second, ""
    if p_close is not None:
        return p_gap, {a[pos], b[pos]} <= p_close | {p_tokens[pos]}, "plain"
    return p_gap, {a[pos], b[pos]} == {p_tokens[pos], p_second}, "plain"


def same_shape_rows(runs: list[RunResult]) -> list[SameShape]:
    """Each speculative case against the ``plain-bmN`` of its own N and its ``-na`` twin, same variant and call.

    (The references and whom each judges: ``shape_references``.)

    ``plain-bmN`` is plain decode with each step running 1 + N tokens per
    request, as the verify of N speculative tokens does, padded to the same
    CUDA-graph size (``bm_capture_sizes``).  Every token a speculative run
    makes at query row 0 must then be plain-bmN's very token; only a bonus
    token (after accepted drafts, ``install_accept_trace``) is computed at
    another row, so a request may leave plain-bmN's tokens there and
    nowhere earlier, and from the step at which the two batches stop holding
    the same requests on (``batch_change_step``).  A request that differs
    before both fails the case, unless at a near tie (``SameShape.verdict``).
    A ``-na`` twin's near ties are its own top-2 logprobs (from run 10);
    where it has none, plain decode's at the same prefix, when plain decode
    made that prefix and the two runs took plain decode's two best tokens.
    """
    rows: list[SameShape] = []
    for ref_run, judged in shape_references(runs):
        twin = "na" in split_method(ref_run.method)[1]
        ref = {c.case: c for c in ref_run.cases if c.status in FINISHED and c.tokens}
        plain = plain_run(runs, ref_run.variant, ref_run.call) if twin else None
        plain_cases = {c.case: c for c in plain.cases if c.tokens} if plain is not None else {}
        for r in runs:
            if r is ref_run or r.variant != ref_run.variant or r.call != ref_run.call or not judged(r):
                continue
            for c in r.cases:
                if c.case not in ref or c.status not in FINISHED or not c.tokens:
                    continue
                refc = ref[c.case]
                acc = c.accepts
                traced = acc is not None and len(acc) == len(c.tokens)
                change = batch_change_step(c.tokens, acc) if traced else None
                equal, after, after_change, before = 0, 0, 0, []
                for i, (a, b) in enumerate(zip(refc.tokens or [], c.tokens, strict=False)):
                    d = first_difference([a], [b])
                    if d is None:
                        equal += 1
                        continue
                    pos = d[1]
                    fb = first_bonus(acc[i]) if acc is not None and i < len(acc) else None
                    if fb is not None and pos >= fb:
                        after += 1
                        continue
                    step = step_of(acc[i], pos) if traced else -1
                    if change is not None and step >= change:
                        after_change += 1
                        continue
                    gap, second, gap_from = _tie_at(refc, plain_cases.get(c.case), i, pos, a, b)
                    before.append(Early(i, pos, -1 if fb is None else fb, gap, second, step, gap_from,
                                        plain_reproducible(plain, c.case, i) if twin else None))
                rows.append(SameShape(
                    r.variant, r.call, r.method, ref_run.method, c.case, len(c.tokens), equal, after, before,
                    acc is not None, after_change, change, twin=twin,
                    mates_step=mates_step(acc) if twin and traced else None,
                    reproducible=plain_reproducible(plain, c.case) if twin else None,
                    noise=twin_noise(runs, r, ref_run, c.case) if twin else None))
    return rows


def same_token_count_notes(runs: list[RunResult]) -> list[str]:
    """``same_shape_rows`` as control lines."""
    notes: list[str] = []
    for x in same_shape_rows(runs):
        line = f"{x.variant} {x.method} vs {x.reference} {x.case}: {x.equal}/{x.requests} requests equal"
        if x.after_accept:
            line += f"; {x.after_accept} differ only from their first bonus token on (after accepted drafts)"
        if x.after_change:
            line += (f"; {x.after_change} differ only from engine step {x.change_step} on (a request that "
                     "accepted drafts had finished: the batches differ)")
        if x.before:
            pos = sorted(e.token for e in x.before)
            line += (f"; {len(x.before)} differ before any bonus token, at tokens {pos[0]}-{pos[-1]} "
                     f"(median {pos[len(pos) // 2]})")
        if x.twin and x.before:
            line += ("; no request accepted a draft" if x.mates_step is None else
                     f"; the batches differ from engine step {x.mates_step} on (a batch-mate accepted a draft)")
            if x.reproducible is False:
                unrep = [str(e.request) for e in x.before if e.reproducible is False]
                line += ("; plain decode does not reproduce its own tokens on this case"
                         + (f" (request {', '.join(unrep)})" if unrep else ""))
            line += f"; early differences: {x.kinds_text()}"
            if x.noise is not None and x.verdict in ("noise", "fail") and x.kinds_text() != "tie":
                line += f"; against the twin, scored by plain decode: {x.noise.describe()}"
        if x.verdict == "untraced":
            line += " (accepted drafts not traced)"
        notes.append(f"{line}: {x.verdict}")
    return notes


def same_shape_table(runs: list[RunResult]) -> list[str]:
    """Markdown rows of ``same_shape_rows``: the oracle at equal step shape, pass or fail per case."""
    rows = same_shape_rows(runs)
    if not rows:
        return []
    out = ["| call | variant | method | against | case | requests equal | differ after a bonus token "
           "| differ after the batch changed (from step) "
           "| differ before (request: token, first bonus, the reference's top-2 gap there; against a -na twin "
           "also @ the engine step) | verdict |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        before = "; ".join(f"{e.request}: {e.token}, {'-' if e.bonus < 0 else e.bonus}, "
                           f"{'-' if e.gap is None else e.gap}{' (plain)' if e.gap_from else ''}"
                           + (" (not its 2nd choice)" if e.second is False else "")
                           + (f" @{e.step}" if x.twin and e.step >= 0 else "")
                           for e in x.before[:6]) + (" ..." if len(x.before) > 6 else "")
        after = str(x.after_accept) if x.traced else f"{x.after_accept} (not traced)"
        changed = f"{x.after_change} ({'-' if x.change_step is None else x.change_step})"
        reference = x.reference
        if x.twin:
            reference += f" (batches differ from step {'-' if x.mates_step is None else x.mates_step}" + (
                "; plain not reproducible here)" if x.reproducible is False else ")")
        verdict = x.verdict
        if x.twin and x.before and x.traced:
            verdict += f" ({x.kinds_text()}" + (f"; z {'/'.join(map(str, x.noise.z))}" if x.noise is not None
                                                 and verdict in ("noise", "fail") else "") + ")"
        out.append(f"| {x.call or '-'} | {x.variant} | {x.method} | {reference} | {x.case} | {x.equal}/{x.requests} "
                   f"| {after} | {changed} | {before or '-'} | {verdict} |")
    return out


def flip_gap_notes(runs: list[RunResult]) -> list[str]:
    """Plain decode against each ``plain-bmN`` of its call: the top-2 gaps where their tokens part.

    Both are plain decode; only the step's shape differs.  Where a request
    first leaves plain's tokens, plain's two best tokens were this close: the
    scale of the ties a change of step shape flips by rounding alone, next to
    which the same-shape table's gaps can be read.
    """
    notes: list[str] = []
    for bm, _ in bm_runs(runs):
        plain = plain_run(runs, bm.variant, bm.call)
        if plain is None:
            continue
        mine = {c.case: c for c in plain.cases if c.status == "finished" and c.tokens}
        for c in bm.cases:
            ref = mine.get(c.case)
            if ref is None or c.status not in FINISHED or not c.tokens or not ref.gaps:
                continue
            firsts = [(i, first_difference([a], [b])) for i, (a, b) in enumerate(zip(ref.tokens or [], c.tokens, strict=False))]
            gaps = sorted(g for g in (_at(ref.gaps, i, d[1]) for i, d in firsts if d is not None) if g is not None)
            if gaps:
                notes.append(f"{bm.variant}{f' (call {bm.call})' if bm.call else ''} plain vs {bm.method} {c.case}: "
                             f"{len(gaps)}/{len(c.tokens)} requests part, at plain's top-2 gaps "
                             f"{gaps[0]}-{gaps[-1]} (median {gaps[len(gaps) // 2]})")
    return notes


def eager_prefill_notes(runs: list[RunResult]) -> list[str]:
    """Each run against ``plain-fd`` / ``plain-eager`` of its call: requests equal token for token.

    Those two run every prefill eagerly (vLLM 0.26.0's piecewise-graph prefill
    changes tokens, plain decode's too: run 8), so they are the references
    for a run whose own prefill is eager; equal requests there are exact
    agreement, different step shapes notwithstanding.
    """
    notes: list[str] = []
    for ref in runs:
        base, flags = split_method(ref.method)
        if base != "plain" or not flags or not flags <= {"fd", "eager"}:
            continue
        mine = {c.case: c for c in ref.cases if c.status in FINISHED and c.tokens}
        for r in runs:
            if r is ref or r.variant != ref.variant or r.call != ref.call or mates_of(split_method(r.method)[1]):
                continue
            for c in r.cases:
                rc = mine.get(c.case)
                if rc is None or c.status not in FINISHED or not c.tokens:
                    continue
                firsts = [d[1] for a, b in zip(rc.tokens or [], c.tokens, strict=False) if (d := first_difference([a], [b]))]
                line = (f"{r.variant}{f' (call {r.call})' if r.call else ''} {r.method} vs {ref.method} {c.case}: "
                        f"{len(c.tokens) - len(firsts)}/{len(c.tokens)} requests equal")
                if firsts:
                    line += f", the others part at tokens {min(firsts)}-{max(firsts)}"
                notes.append(line)
    return notes


def repeat_notes(runs: list[RunResult]) -> list[str]:
    """Plain decode of one variant and case in several calls (merged reports): the same tokens each time?

    The same engine, inputs and seed; a request whose tokens differ between
    calls is one the engine does not reproduce (run 10: ``long_b3``'s
    request 0 and ``long_b1``; every short and mid case, and ``long_b3``'s
    shorter requests, came out the same in every call).
    """
    seen: dict[tuple[str, str], list[tuple[str, list[list[int]]]]] = {}
    for r in runs:
        if r.method != "plain":
            continue
        for c in r.cases:
            if c.status == "finished" and c.tokens:
                seen.setdefault((r.variant, c.case), []).append((r.call, c.tokens))
    notes = []
    for (variant, case), got in sorted(seen.items()):
        if len(got) < 2:
            continue
        first = got[0][1]
        parts = []
        for i, a in enumerate(first):
            pos = [d[1] for _, t in got[1:] if i < len(t) and (d := first_difference([a], [t[i]])) is not None]
            if pos:
                parts.append(f"request {i} differs (from token {min(pos)})")
        calls = ", ".join(c for c, _ in got)
        notes.append(f"{variant} plain {case} in calls {calls}: "
                     + ("; ".join(parts) + f"; the other {len(first) - len(parts)} equal" if parts
                        else f"all {len(first)} requests equal in every call"))
    return notes


def controls(runs: list[RunResult]) -> list[str]:
    """Cross checks that bound the oracle's noise."""
    notes: list[str] = (same_token_count_notes(runs) + flip_gap_notes(runs) + eager_prefill_notes(runs)
                        + repeat_notes(runs))
    plains = [r for r in runs if r.method == "plain"]  # one per variant and call (merged reports: several calls)
    for p in sorted(plains, key=lambda r: (r.variant, r.call)):
        variant = p.variant + (f" (call {p.call})" if p.call else "")
        cs = {c.case: c for c in p.cases if c.status == "finished"}
        for one, many in (("short_b1", "short_b5"), ("long_b1", "long_b3")):
            if one in cs and many in cs and cs[one].tokens and cs[many].tokens:
                a, b = cs[one].tokens[0], cs[many].tokens[0]
                d = first_difference([a], [b])
                notes.append(
                    f"{variant} plain batch invariance {one} vs {many}[0]: "
                    + ("equal" if d is None else f"differ at token {d[1]}")
                )
        self_scores = p.scores.get("plain", {})
        if self_scores:
            case, req, (w, pos) = max(
                ((cn, i, row) for cn, rows in self_scores.items() for i, row in enumerate(rows)),
                key=lambda t: t[2][0],
            )
            how = "forced decode" if p.score_mode == "decode" else "prefill"
            notes.append(
                f"{variant} plain decode's own tokens scored by its own engine ({how}): worst token "
                f"{w} below the best logprob ({case} request {req} token {int(pos)}); "
                f"tolerance for speculative runs {tolerance(p):.3f}"
            )
    for call in sorted({p.call for p in plains}):
        s = next((p for p in plains if p.variant == "stock" and p.call == call), None)
        q = next((p for p in plains if p.variant == "patched" and p.call == call), None)
        if s and q:
            tag = f" (call {call})" if call else ""
            for cs_, cq in zip(s.cases, q.cases, strict=False):
                if cs_.tokens and cq.tokens:
                    d = first_difference(cs_.tokens, cq.tokens)
                    notes.append(
                        f"plain stock vs patched {cs_.case}{tag}: "
                        + ("equal" if d is None else f"differ at request {d[0]} token {d[1]}")
                    )
    return notes


def _count_totals(rows: list[list[int]]) -> list[int]:
    """Sum per-request [n, beyond 0.1, beyond 0.5, beyond 1.0] rows of one case."""
    return [sum(r[i] for r in rows) for i in range(len(rows[0]))] if rows else []


def noise_table(runs: list[RunResult]) -> list[str]:
    """Markdown rows: each scored speculative case next to plain decode's own tokens in the same case.

    Both columns come from the same plain engine (the one that scored the
    speculative run), forced to each sequence in turn: the speculative run's
    tokens, and plain's own from its first pass.  Plain's column is the noise
    that engine shows on that very case; a speculative column far above it is
    what a bug in the speculative path would look like, even inside the
    global tolerance.
    """
    def fmt(t: list[int]) -> str:
        return "/".join(f"{x} ({100 * x / t[0]:.0f}%)" for x in t[1:]) if t and t[0] else "-"

    def off0(marks: list[list[float]]) -> str:
        # requests whose token 0 (the prefill's, same context everywhere) is more than 1 nat off
        return f"{sum(1 for m in marks if m[0] > 1.0)}/{len(marks)}" if marks else "-"

    heads = "/".join(str(t) for t in COUNT_THRESHOLDS)
    out = [f"| call | variant | method | case | tokens | speculative beyond {heads} nats | plain's own beyond {heads} "
           "| token 0 off > 1 nat: speculative / plain's own |",
           "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        if r.method == "plain":
            continue
        pr = scoring_plain(runs, r)
        if pr is None or r.method not in pr.score_counts:
            continue
        scored = {c.case for c in r.cases if c.status in FINISHED}
        for case, rows in pr.score_counts[r.method].items():
            if case not in scored:
                continue
            spec, own = _count_totals(rows), _count_totals(pr.score_counts.get("plain", {}).get(case, []))
            if not spec:
                continue
            first = pr.score_first.get(r.method, {}).get(case, [])
            own_first = pr.score_first.get("plain", {}).get(case, [])
            out.append(f"| {r.call or '-'} | {r.variant} | {r.method} | {case} | {spec[0]} | {fmt(spec)} | {fmt(own)} "
                       f"| {off0(first)} / {off0(own_first)} |")
    return out if len(out) > 2 else []


def verdict_table(runs: list[RunResult]) -> list[str]:
    """Markdown: one line per speculative run (its ``-na`` twins aside) and case, the verdict that counts.

    A case that hung, crashed or did not run says so; a finished one takes
    the verdict against its ``-na`` twin (``same_shape_rows``) where the
    call ran one, else the verdict against plain decode (``apply_oracle``).
    """
    twin = {(x.call, x.variant, x.method, x.case): x for x in same_shape_rows(runs) if x.twin}
    out = ["| call | variant | method | case: verdict | judged against |", "|---|---|---|---|---|"]
    for r in runs:
        base, flags = split_method(r.method)
        if base == "plain" or "na" in flags:
            continue
        cells, against = [], set()
        for c in r.cases:
            x = twin.get((r.call, r.variant, r.method, c.case))
            if c.status in FINISHED and x is not None:
                cells.append(f"{c.case}: {x.verdict}")
                against.add(x.reference)
            else:
                cells.append(f"{c.case}: {c.status}")
                if c.status in FINISHED:
                    against.add("plain")
        out.append(f"| {r.call or '-'} | {r.variant} | {r.method} | {'; '.join(cells)} | "
                   f"{', '.join(sorted(against)) or '-'} |")
    return out if len(out) > 2 else []


def render_markdown(runs: list[RunResult], notes: list[str], meta: dict[str, Any]) -> str:
    out = ["# DeepSeek-V4 end to end: plain decode vs MTP / DSpark (greedy oracle)", ""]
    for k, v in meta.items():
        out.append(f"- {k}: {v}")
    merged = any(r.call for r in runs)  # --report: say which call each row comes from
    out += ["", ("| call " if merged else "") + "| variant | method | engine start s | case | result | detail | gen s |",
            ("|---" if merged else "") + "|---|---|---|---|---|---|---|"]
    for r in runs:
        for c in r.cases:
            detail = (c.detail or "").replace("|", "/")
            if c.spec_metrics:
                detail += (" " if detail else "") + json.dumps(c.spec_metrics)
            out.append(
                (f"| {r.call} " if merged else "")
                + f"| {r.variant} | {r.method} | {r.start_seconds if r.start_seconds is not None else '-'} "
                f"| {c.case} | {c.status} | {detail[:300]} | {c.seconds if c.seconds is not None else '-'} |"
            )
    verdicts = verdict_table(runs)
    if verdicts:
        out += ["", "## Verdicts: each speculative run and case", "",
                "pass: exact; tie: near-tie flips only; noise: differences the exact oracle cannot decide "
                "(batch-mates at other lengths, or a request plain decode does not reproduce), no further "
                "off than the -na twin; fail; or how the case ended (hang, crash, not-run). Details in the "
                "sections below.", ""] + verdicts
    out += ["", "## Runs", ""]
    for r in runs:
        out.append(f"- {r.variant}/{r.method}{f' (call {r.call})' if r.call else ''}: {r.outcome} {r.detail[:400]}")
        if r.fingerprint:
            out.append(f"  - fingerprint: `{json.dumps(r.fingerprint)}`")
    shape = same_shape_table(runs)
    if shape:
        out += ["", "## Same step shape: speculative runs against plain-bmN and their -na twins "
                "(exact, up to each bonus token)", "",
                "Tokens a speculative run makes at query row 0 must be plain-bmN's very tokens; a request may "
                "leave them only at a bonus token (after accepted drafts: computed at another query row), or "
                "from the engine step at which a request that accepted drafts had finished while plain-bmN's copy "
                "still ran (the batches differ from then on). Each run is compared with the plain-bmN of its own "
                "CUDA-graph mode (-fd with -fd, -eager with -eager), and with its -na twin (the same engine, "
                "every draft rejected). A difference at a near tie (the reference's two best tokens at most "
                f"{TIE_NATS} nat apart, the run taking the second or one of its near ties) is a tie; against "
                "a -na twin only from the step at which the batches differ (the step after a batch-mate "
                "accepted a draft), or on a request whose own tokens plain decode does not reproduce. Against "
                "a twin, any earlier difference before that step on a request plain decode reproduces fails "
                "the case. Other early differences against a twin are 'batch' (from that step on: vLLM's "
                "kernels round by the whole batch) or 'nondet' (a request plain decode does not reproduce); "
                "the exact oracle cannot decide them, and the case is 'noise' when its tokens, scored by "
                "plain decode, are no further off than the twin's (per threshold at most "
                f"{TWIN_Z_MAX} standard errors more tokens beyond it; z in the verdict), else 'fail'. Where a -na twin recorded no "
                "logprobs (before run 10), plain decode's gap at the same prefix is used, marked (plain).", ""]
        out += shape
    table = noise_table(runs)
    if table:
        out += ["", "## Per-case noise: speculative tokens against plain decode's own", ""] + table
    out += ["", "## Controls", ""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


_PTH_PROBE = (
    "import site, sys; before = list(sys.path); [site.addsitedir(d) for d in sys.argv[1:]]; "
    "print('\\n'.join(p for p in sys.path if p not in before))"
)


def site_env(site: Path | str, base: dict[str, str], python: str = sys.executable) -> dict[str, str]:
    """Environment with SITE's directories first on PYTHONPATH, plus what their .pth files add.

    SITE is one directory or several joined by ``os.pathsep`` (device.sh gives
    ``vllm-<variant>:deps``: the variant's own vLLM, then the dependencies both
    variants share).  pip --target dirs are not site dirs, so their .pth files
    are not processed; nvidia-cutlass-dsl's is an ``import`` line that puts
    ``nvidia_cutlass_dsl/dsl_packages`` (the ``cutlass`` package) on sys.path.
    ``site.addsitedir`` in a throw-away interpreter runs them exactly as Python
    would and reports the entries they add; those go on PYTHONPATH so every
    process (vLLM's engine core too) sees them.
    """
    dirs = [d for d in str(site).split(os.pathsep) if d]
    proc = subprocess.run(
        [python, "-S", "-c", _PTH_PROBE, *dirs],
        capture_output=True,
        text=True,
        env={k: v for k, v in base.items() if k != "PYTHONPATH"},
    )
    added = [p for p in proc.stdout.splitlines() if p and p not in dirs]
    paths = dirs + added
    env = dict(base)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join(paths + ([old] if old else []))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


# Modules DeepSeek-V4 (plain, MTP, DSpark) needs on sm_90, imported by the
# preflight in each site before any engine starts.  The first device run
# (2026-12-01) spent ~200 s starting engines that died on imports the
# preflight had already reported; now a problem here stops the call.
PREFLIGHT_MODULES: tuple[str, ...] = (
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

# Runs in the site's environment: imports each module, prints info lines and
# one JSON line {"problems": [...]} last.
_PREFLIGHT_PROBE = """
import importlib, json, os, shutil, sys
label, mods = sys.argv[1], sys.argv[2:]
bad = []
for m in mods:
    try:
        importlib.import_module(m)
    except BaseException as e:
        bad.append(f"{m}: {type(e).__name__}: {e}")
try:
    import torch
    cuda = torch.cuda.is_available()
    cap = torch.cuda.get_device_capability() if cuda else None
    print(f"[{label}] torch {torch.__version__}; cuda {cuda} cap {cap}")
except BaseException as e:
    print(f"[{label}] torch: {type(e).__name__}: {e}")
vllm = sys.modules.get("vllm")
if vllm is not None:
    print(f"[{label}] vllm {getattr(vllm, '__version__', '?')} from {vllm.__file__}")
print(f"[{label}] CUDA_HOME={os.environ.get('CUDA_HOME')} nvcc={shutil.which('nvcc')}")
print(json.dumps({"problems": bad}))
"""


def preflight(
    sites: dict[str, Path],
    modules: list[str] | tuple[str, ...] = PREFLIGHT_MODULES,
    python: str = sys.executable,
    timeout: float = 300.0,
) -> tuple[dict[str, list[str]], str]:
    """Import MODULES in each site's environment (as the children see it).

    Returns the problems per site (empty lists when all import) and the text
    of the probes' output for preflight.txt.  A probe that dies or prints no
    result counts as a problem of its site.
    """
    problems: dict[str, list[str]] = {}
    lines: list[str] = []
    for label, site in sites.items():
        env = site_env(site, dict(os.environ), python)
        try:
            proc = subprocess.run(
                [python, "-c", _PREFLIGHT_PROBE, label, *modules],
                capture_output=True, text=True, env=env, timeout=timeout,
            )
            out, err, rc = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired:
            out, err, rc = "", f"import probe still running after {timeout:.0f} s", -1
        result: list[str] | None = None
        for ln in out.splitlines():
            if ln.startswith('{"problems"'):
                result = list(json.loads(ln)["problems"])
            else:
                lines.append(ln)
        if result is None:
            tail = (err.strip().splitlines() or ["(no output)"])[-1]
            result = [f"import probe failed (exit {rc}): {tail}"]
        problems[label] = result
        lines.append(f"[{label}] import problems: {result or 'none'}")
    return problems, "\n".join(lines) + "\n"


def preflight_main(args: argparse.Namespace) -> int:
    """--preflight: exit 3 (and name every problem) unless all modules import in all sites."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sites = {k: Path(v) for k, v in (s.split("=", 1) for s in args.site)}
    modules = [m for m in args.preflight_modules.split(",") if m] if args.preflight_modules else PREFLIGHT_MODULES
    problems, text = preflight(sites, modules)
    with (out / "preflight.txt").open("a") as f:
        f.write(text)
    print(text, end="")
    bad = {k: v for k, v in problems.items() if v}
    if bad:
        print("PREFLIGHT FAILED: modules DeepSeek-V4 needs do not import; no engine started.")
        for label, items in bad.items():
            for item in items:
                print(f"  [{label}] {item}")
        return 3
    print(f"preflight ok: {len(modules)} modules import in {', '.join(sites)}")
    return 0


def schedule(variants: list[str], methods: list[str]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(plain jobs, speculative jobs), each a list of (variant, method) in start order.

    Plain decode runs alongside the speculative engines and scores their tokens
    when they are done (``--score-wait``); the first job (plain decode of the
    first variant, else the first speculative job) starts alone and warms the
    JIT caches (TileLang, DeepGEMM, Triton, torch.compile) the others then read.
    Within the speculative jobs the variants of one method sit side by side.
    """
    plain = [(v, "plain") for v in variants] if "plain" in methods else []
    spec = [(v, m) for m in methods if m != "plain" for v in variants]
    return plain, spec


def parent_main(args: argparse.Namespace) -> int:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sites = dict(s.split("=", 1) for s in args.site)
    variants = [v for v in args.variants.split(",") if v]
    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        split_method(m)
    problem = tk120_problem(methods, args.max_model_len)
    if problem:
        raise SystemExit(problem)
    for v in variants:
        if v not in sites:
            raise SystemExit(f"no --site {v}=DIR given")
    case_names = [c.name for c in select_cases(build_cases(args.long_len), args.cases)]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    log_all = out / "e2e_logs.txt"
    envs = {v: site_env(sites[v], dict(os.environ)) for v in variants}
    t0 = time.monotonic()
    plain_jobs, spec_jobs = schedule(variants, methods)
    order = spec_jobs + plain_jobs  # report order: plain decode last
    results: dict[tuple[str, str], RunResult] = {}
    lock = threading.Lock()
    stopped: list[str] = []
    warm = threading.Event()
    end = t0 + args.budget
    # the speculative engines leave plain decode its time to score them
    spec_stop = end - (args.score_reserve if plain_jobs else 0.0)

    def go_file(variant: str) -> Path:
        return work / f"{variant}-plain.go"

    for v in variants:
        go_file(v).unlink(missing_ok=True)

    def skipped(variant: str, method: str, why: str) -> RunResult:
        return RunResult(variant, method, None, None, "not-run", why,
                         [CaseResult(variant, method, c, "not-run", why) for c in case_names])

    def job(variant: str, method: str, hard_stop: float) -> None:
        tag = f"{variant}-{method}"
        left = hard_stop - time.monotonic()
        try:
            if stopped:
                res = skipped(variant, method, stopped[0])
            elif left < args.min_start:
                res = skipped(variant, method, f"budget: {left:.0f} s left")
            else:
                cmd = [sys.executable, args.child_script, "--child", "--method", method, "--model", args.model,
                       "--progress", str(work / f"{tag}.jsonl"), "--weights", args.weights,
                       "--long-len", str(args.long_len), "--max-model-len", str(args.max_model_len),
                       "--gpu-memory-utilization", str(args.gpu_memory_utilization),
                       "--kv-cache-gib", str(args.kv_cache_gib), "--cases", ",".join(case_names),
                       "--score-mode", args.score_mode]
                if args.zero_kv:
                    cmd.append("--zero-kv")
                if args.trace_split:
                    cmd += ["--trace-split", str(args.trace_split)]
                if method == "plain":
                    cmd += ["--score-wait", str(go_file(variant))]
                print(f"[{time.monotonic() - t0:6.0f}s] {tag} ...", flush=True)
                res = run_child(cmd, envs[variant], work / f"{tag}.jsonl", work / f"{tag}.log", case_names,
                                args.start_deadline, args.case_deadline, variant, method,
                                first_case_deadline=args.first_case_deadline, hard_stop=hard_stop,
                                on_event=lambda ev: ev["event"] == "engine_ready" and warm.set(),
                                hang_probe_s=args.hang_probe)
                print(f"[{time.monotonic() - t0:6.0f}s] {tag}: {res.outcome} {res.detail[:200]}", flush=True)
                if args.stop_on_start_failure and res.start_seconds is None and res.outcome in ("crash", "hang"):
                    stopped.append(f"not started: {tag} failed at engine start (--stop-on-start-failure)")
        finally:
            warm.set()  # the first job ended (or never ran): nothing more to wait for
        with lock:
            results[(variant, method)] = res
            if res.outcome != "not-run":
                with log_all.open("a") as f:
                    lines = (work / f"{tag}.log").read_text(errors="replace").splitlines()
                    f.write(f"===== {tag}: {res.outcome} (last {args.log_lines} lines)\n")
                    f.write("\n".join(lines[-args.log_lines:]) + "\n")
            write_results(out, [results[j] for j in order if j in results], args)

    # Plain engines get their own threads (they wait for the speculative runs,
    # so they must not hold --parallel slots); the first job starts alone.
    jobs = plain_jobs + spec_jobs
    first, rest_plain = jobs[0], [j for j in plain_jobs if j != jobs[0]]
    rest_spec = [j for j in spec_jobs if j != first]
    threads = [threading.Thread(target=job, args=(*first, end if first in plain_jobs else spec_stop))]
    threads[0].start()
    if args.warm_first:
        warm.wait()
    for v, m in rest_plain:
        t = threading.Thread(target=job, args=(v, m, end))
        t.start()
        threads.append(t)
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        for f in [pool.submit(job, v, m, spec_stop) for v, m in rest_spec]:
            f.result()
    if first in spec_jobs:
        threads.pop(0).join()
    # every speculative run is over: tell each plain engine which runs to score
    for v in variants:
        done = [str(work / f"{v}-{m}.jsonl") for vv, m in spec_jobs
                if vv == v and any(c.status == "finished" for c in results[(vv, m)].cases)]
        go_file(v).write_text(json.dumps(done))
    for t in threads:
        t.join()
    write_results(out, [results[j] for j in order if j in results], args)
    return 0


def write_results(out: Path, runs: list[RunResult], args: argparse.Namespace) -> None:
    out.mkdir(parents=True, exist_ok=True)
    apply_oracle(runs)
    notes = controls(runs)
    meta = {"model": args.model, "weights": args.weights, "long prompt tokens": args.long_len,
            "case deadline s": args.case_deadline, "start deadline s": args.start_deadline,
            "KV caches zeroed before each generate": getattr(args, "zero_kv", False)}
    (out / "e2e_results.json").write_text(
        json.dumps({"meta": meta, "runs": [asdict(r) for r in runs], "controls": notes}, indent=1) + "\n"
    )
    (out / "e2e_results.md").write_text(render_markdown(runs, notes, meta))


def load_runs(path: Path) -> list[RunResult]:
    """The runs of one ``e2e_results.json`` (``.json.gz``: as committed under tests/gpu/results/e2e)."""
    import gzip

    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    data = json.loads(raw)
    runs = []
    for r in data["runs"]:
        cases = [CaseResult(**c) for c in r.pop("cases")]
        runs.append(RunResult(cases=cases, **r))
    return runs


def report_main(out: Path, inputs: list[Path]) -> int:
    runs: list[RunResult] = []
    for i, p in enumerate(inputs):
        for r in load_runs(p):
            r.call = f"{i + 1}:{p.parent.name or p.name}"
            runs.append(r)
    for r in runs:  # recompute the oracle over the merged set
        for c in r.cases:
            if c.status in VERDICTS:
                c.status = "finished"
    out.mkdir(parents=True, exist_ok=True)
    ns = argparse.Namespace(model="(merged)", weights="(see inputs)", long_len="-", case_deadline="-",
                            start_deadline="-", zero_kv="(see inputs)")
    write_results(out, runs, ns)
    print((out / "e2e_results.md").read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--progress", help=argparse.SUPPRESS)
    ap.add_argument("--method", default="plain")
    ap.add_argument("--report", nargs="+", metavar=("OUT", "JSON"), help="merge result files, no GPU")
    ap.add_argument("--model", default="/tmp/e2e/tiny-dsv4")
    ap.add_argument("--out", default="e2e-out")
    ap.add_argument("--site", action="append", default=[], metavar="VARIANT=DIR")
    ap.add_argument("--variants", default="stock,patched")
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    ap.add_argument("--weights", choices=("scaled", "dummy"), default="scaled")
    ap.add_argument("--long-len", type=int, default=2300)
    ap.add_argument("--cases", default="", help="comma-separated case names, in run order (default: all)")
    ap.add_argument("--max-model-len", type=int, default=65536,
                    help="the tiny model's max_position_embeddings; -tk120 needs the indexer's logits this wide "
                         "(see persistent_topk_ctas)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.25)
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for all children")
    ap.add_argument("--start-deadline", type=float, default=300.0)
    ap.add_argument("--case-deadline", type=float, default=120.0,
                    help="one generate() call; engines share the GPU, so leave room")
    ap.add_argument("--min-start", type=float, default=60.0, help="skip a run with less budget left")
    ap.add_argument("--first-case-deadline", type=float, default=240.0,
                    help="the first generate() may JIT-compile kernels for new shapes")
    ap.add_argument("--work", default="/tmp/e2e/work", help="progress files and full child logs")
    ap.add_argument("--log-lines", type=int, default=120)
    ap.add_argument("--parallel", type=int, default=1,
                    help="speculative engines at once on the one GPU (each gets --kv-cache-gib); plain decode "
                         "engines, one per variant, run alongside them")
    ap.add_argument("--kv-cache-gib", type=float, default=6.0)
    ap.add_argument("--hang-probe", type=float, default=45.0,
                    help="seconds cuda-gdb may spend naming the kernels a hung engine still runs, before it is "
                         "killed (0: Python stacks only)")
    ap.add_argument("--score-reserve", type=float, default=120.0,
                    help="seconds at the end of --budget kept for plain decode to score the speculative runs")
    ap.add_argument("--no-warm-first", dest="warm_first", action="store_false",
                    help="start every engine at once (default: the first one alone, until its engine is ready, "
                         "so the others find the JIT caches warm)")
    ap.add_argument("--score-from", action="append", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--score-wait", default="", help=argparse.SUPPRESS)
    ap.add_argument("--score-mode", choices=("decode", "prefill"), default="decode",
                    help="how plain decode judges a token: decode = the case decoded again with every token "
                         "forced (plain decode's own kernels and KV cache; default), prefill = the sequence "
                         "scored as one prompt (prompt_logprobs; prefill's kernels, run 4)")
    ap.add_argument("--zero-kv", action="store_true",
                    help="every engine drops its prefix cache and zeroes all KV caches before each generate() "
                         "(cases and scoring): each case starts from a fresh engine's cache")
    ap.add_argument("--trace-split", type=int, default=0, metavar="N",
                    help="each engine reports its first N decode/prefill splits once it is ready (not those of "
                         "warm-up and CUDA-graph capture; split_decodes_and_prefills, per metadata builder) as "
                         "'split' events in its progress file (work dir)")
    ap.add_argument("--child-script", default=str(HERE), help=argparse.SUPPRESS)  # tests: a stand-in child
    ap.add_argument("--stop-on-start-failure", action="store_true",
                    help="after an engine that does not start, run no further engine (saves device time)")
    ap.add_argument("--preflight", action="store_true",
                    help="only import the modules DeepSeek-V4 needs in each --site; exit 3 on a problem")
    ap.add_argument("--preflight-modules", default="",
                    help="comma-separated modules for --preflight (default: PREFLIGHT_MODULES)")
    args = ap.parse_args(argv)
    if args.preflight:
        return preflight_main(args)
    if args.report:
        return report_main(Path(args.report[0]), [Path(p) for p in args.report[1:]])
    if args.child:
        return child_main(args)
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
