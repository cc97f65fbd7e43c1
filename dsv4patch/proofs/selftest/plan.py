"""Which engines run when, how much GPU memory each may take, and how long each stage may last.

Why this is decided up front, from the probe (:mod:`.node`) and from what the
first engine measures: the H200 run of 2026-12-03 started twelve engines of
0.25 of the GPU each at once on 139.8 GiB, so the later ones found 4.2 GiB
free and crashed at start, and every engine waited 420 s for a diagnostic
engine that hung first.  So:

* **memory**: one engine of the tiny model holds its KV cache plus a fixed
  overhead (weights, activations, CUDA graphs, the CUDA context); each engine
  is given ``gpu_memory_utilization`` = that share of the device, and as many
  engines run at once as fit in the free memory (at most the number asked
  for).  When not even one fits, the engine cases are refused with both
  figures;
* **order**: one ordinary engine (MTP 1, else the first one selected) starts
  alone and fills the JIT caches (TileLang, DeepGEMM, Triton, torch.compile)
  the others reuse; the rest start when it is ready (or has ended), the
  engines with their own kernels to compile first (DSpark), the diagnostic
  engine last: a hang costs its own deadline and delays no other engine;
* **deadlines**: the first engine's start gets the cold-start deadline; an
  engine that starts after it gets a warm one, from the first engine's
  measured start (:func:`warm_start_deadline`), never more than the cold one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsv4patch.proofs.selftest.cases import Engine
from dsv4patch.proofs.selftest.node import Device

GIB = 2**30
# What one engine of the tiny model holds on the GPU beyond its KV cache: weights (about 2 GiB in bf16/FP8),
# the activation workspace of its profile run, the CUDA graphs of up to 32 sequences, the CUDA context and
# torch's allocator slack.  Each engine reports what it holds when it is ready (``engine_ready``'s
# ``torch_reserved_bytes`` and the device's free memory), and the report carries the measured figure.
ENGINE_OVERHEAD_GIB = 10.0
# Never plan the last few percent of the device: other processes, fragmentation, the driver.
FREE_MARGIN = 0.95
# A warm engine start never gets less than this (CUDA graph capture and torch.compile's cache load).
MIN_WARM_START = 180.0
WARM_START_FACTOR = 1.5


@dataclass(frozen=True)
class Sizing:
    """How much each engine may take and how many fit at once; ``parallel == 0``: not even one fits."""

    per_engine_bytes: int
    gpu_memory_utilization: float
    parallel: int
    free_bytes: int
    total_bytes: int

    def describe(self) -> str:
        if self.parallel == 0:
            return (f"one engine needs {self.per_engine_bytes / GIB:.1f} GiB free on the GPU, "
                    f"{self.free_bytes / GIB:.1f} of {self.total_bytes / GIB:.1f} GiB are free")
        return (f"{self.parallel} engine(s) at once, {self.per_engine_bytes / GIB:.1f} GiB each "
                f"(gpu_memory_utilization {self.gpu_memory_utilization:.3f}; {self.free_bytes / GIB:.1f} of "
                f"{self.total_bytes / GIB:.1f} GiB free)")

    def to_json(self) -> dict[str, object]:
        return {"per_engine_bytes": self.per_engine_bytes, "gpu_memory_utilization": self.gpu_memory_utilization,
                "parallel": self.parallel, "free_bytes": self.free_bytes, "total_bytes": self.total_bytes}


def size_engines(device: Device, *, kv_cache_bytes: int, most: int,
                 overhead_bytes: int = int(ENGINE_OVERHEAD_GIB * GIB)) -> Sizing:
    """Engines that fit in DEVICE's free memory now, each reserving its KV cache plus the overhead."""
    per_engine = kv_cache_bytes + overhead_bytes
    util = min(0.95, math.ceil(1000 * per_engine / device.total_bytes) / 1000)
    reserved = int(util * device.total_bytes)  # what vLLM checks is free when an engine starts
    fits = int(device.free_bytes * FREE_MARGIN // reserved) if reserved > 0 else 0
    return Sizing(per_engine, util, max(0, min(most, fits)), device.free_bytes, device.total_bytes)


def engine_order(engines: list[Engine]) -> list[Engine]:
    """The warm-up engine first, then the ones with kernels of their own, the plain ones, the diagnostic last."""
    if not engines:
        return []
    warm = next((e for e in engines if e.name == "mtp1"), None) or \
        next((e for e in engines if not e.sm120_topk), engines[0])

    def rank(e: Engine) -> tuple[int, int]:
        if e.sm120_topk:
            return (3, 0)
        if e.method == "dspark":
            return (0, 0)
        return (1 if e.method == "plain" else 2, e.k)

    return [warm, *sorted((e for e in engines if e is not warm), key=rank)]


def warm_start_deadline(cold: float, first_start: float | None) -> float:
    """The start deadline of an engine started after the first: its caches are warm, so far less than cold."""
    if first_start is None:  # the first engine never got ready: the others get the cold deadline
        return cold
    return min(cold, max(MIN_WARM_START, WARM_START_FACTOR * first_start))
