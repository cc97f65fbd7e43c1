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
  measured start (:func:`warm_start_deadline`), never more than the cold one;
* **topology**: an engine of tensor x pipeline parallel size N x M takes N*M
  GPUs (:class:`Topology`); the node must have them (:func:`check_gpus`), each
  of them holds the per-GPU share above, and engines of more than one GPU
  never share a GPU: they run on disjoint groups of N*M devices, so no more
  of them at once than the node has groups (:func:`size_topology`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dsv4patch.errors import EXIT_USAGE, Dsv4Error, ParameterError
from dsv4patch.proofs.selftest import model as tiny
from dsv4patch.records import frozen

if TYPE_CHECKING:
    from dsv4patch.proofs.selftest.cases import Engine
    from dsv4patch.proofs.selftest.node import Device, Node

GIB = 2**30
# What one engine of the tiny model holds on the GPU beyond its KV cache: weights (about 2 GiB in bf16/FP8),
# the activation workspace of its profile run, the CUDA graphs of up to 32 sequences, the CUDA context and
# torch's allocator slack.  Each engine reports what it holds when it is ready (``engine_ready``'s
# ``torch_reserved_bytes`` and the device's free memory), and the report carries the measured figure.
ENGINE_OVERHEAD_GIB = 10.0
# Never plan the last few percent of the device: other processes, fragmentation, the driver.
FREE_MARGIN = 0.95
# A warm engine start never gets less than this (CUDA graph capture and torch.compile's cache load).  The engines
# after the first start together: on the H200 (2026-12-04, five at once, warm caches) MTP 2/3 took 101-104 s and
# DSpark, whose target and draft graphs are both captured, more than 180 s (190 s after the stock run, 2026-12-03);
# alone on the same caches it started in 87 s.
MIN_WARM_START = 300.0
WARM_START_FACTOR = 1.5


class NotEnoughGpus(Dsv4Error):
    """The topology asked for needs more GPUs than the environment under test sees: exit 2, nothing started."""

    exit_code = EXIT_USAGE
    kind = "environment"


@frozen
class Topology:
    """How each engine is spread: ``tensor_parallel_size`` x ``pipeline_parallel_size`` GPUs (1 x 1: one GPU)."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def problems(self) -> list[str]:
        """Why the tiny model cannot run spread this way (empty: it can); :func:`tiny.shard_problems`."""
        tp, pp = self.tensor_parallel_size, self.pipeline_parallel_size
        out = []
        if tp not in tiny.TENSOR_PARALLEL_SIZES:
            out.append(f"tensor parallel size {tp}: must be one of "
                       f"{', '.join(str(n) for n in tiny.TENSOR_PARALLEL_SIZES)}")
        if not 1 <= pp <= tiny.MAX_PIPELINE_PARALLEL_SIZE:
            out.append(f"pipeline parallel size {pp}: must be 1 to {tiny.MAX_PIPELINE_PARALLEL_SIZE}")
        return out or tiny.shard_problems(tp, pp)

    def validated(self) -> Topology:
        problems = self.problems()
        if problems:
            raise ParameterError("the tiny model cannot be spread that way: " + "; ".join(problems))
        return self

    def describe(self) -> str:
        return (f"tensor parallel {self.tensor_parallel_size} x pipeline parallel {self.pipeline_parallel_size} "
                f"({self.gpus} GPU{'s' if self.gpus > 1 else ''} per engine)")

    def to_json(self) -> dict[str, object]:
        return {"tensor_parallel_size": self.tensor_parallel_size,
                "pipeline_parallel_size": self.pipeline_parallel_size, "gpus_per_engine": self.gpus}


def check_gpus(topology: Topology, node: Node) -> None:
    """Refuse (exit 2) a topology of more than one GPU on a node that sees fewer: nothing would start.

    One GPU asked on a node without any is not refused here: the engine cases
    are ``needs-gpu`` there and the checks still run (docs/selftest.md).
    """
    if topology.gpus > 1 and len(node.devices) < topology.gpus:
        seen = ", ".join(f"{d.index}: {d.name}" for d in node.devices) or "none"
        raise NotEnoughGpus(f"{topology.describe()} needs {topology.gpus} CUDA devices; {node.python} sees "
                            f"{len(node.devices)} ({seen}); nothing was started. Run on a node with "
                            f"{topology.gpus} GPUs, make them visible (CUDA_VISIBLE_DEVICES), or ask for fewer")


@frozen
class Sizing:
    """How much each engine may take and how many fit at once; ``parallel == 0``: not even one fits.

    The figures are per GPU; ``groups`` are the device indices each engine
    running at once gets (one group of one device, shared, for one-GPU
    engines; disjoint groups of ``gpus_per_engine`` devices otherwise).
    """

    per_engine_bytes: int
    gpu_memory_utilization: float
    parallel: int
    free_bytes: int
    total_bytes: int
    gpus_per_engine: int = 1
    groups: tuple[tuple[int, ...], ...] = ((0,),)

    def describe(self) -> str:
        where = "" if self.gpus_per_engine == 1 else (
            f" on {self.gpus_per_engine} GPUs each (devices " + " | ".join(",".join(str(i) for i in g)
                                                              for g in self.groups) + ")")
        if self.parallel == 0:
            return (f"one engine needs {self.per_engine_bytes / GIB:.1f} GiB free on "
                    f"{'each of its GPUs' if self.gpus_per_engine > 1 else 'the GPU'}, "
                    f"{self.free_bytes / GIB:.1f} of {self.total_bytes / GIB:.1f} GiB are free")
        return (f"{self.parallel} engine(s) at once{where}, {self.per_engine_bytes / GIB:.1f} GiB each"
                f"{' per GPU' if self.gpus_per_engine > 1 else ''} "
                f"(gpu_memory_utilization {self.gpu_memory_utilization:.3f}; {self.free_bytes / GIB:.1f} of "
                f"{self.total_bytes / GIB:.1f} GiB free{' on the fullest GPU' if self.gpus_per_engine > 1 else ''})")

    def to_json(self) -> dict[str, object]:
        return {"per_engine_bytes": self.per_engine_bytes, "gpu_memory_utilization": self.gpu_memory_utilization,
                "parallel": self.parallel, "free_bytes": self.free_bytes, "total_bytes": self.total_bytes,
                "gpus_per_engine": self.gpus_per_engine, "groups": [list(g) for g in self.groups]}


def size_engines(device: Device, *, kv_cache_bytes: int, most: int,
                 overhead_bytes: int = int(ENGINE_OVERHEAD_GIB * GIB)) -> Sizing:
    """Engines that fit in DEVICE's free memory now, each reserving its KV cache plus the overhead."""
    per_engine = kv_cache_bytes + overhead_bytes
    util = min(0.95, math.ceil(1000 * per_engine / device.total_bytes) / 1000)
    reserved = int(util * device.total_bytes)  # what vLLM checks is free when an engine starts
    fits = int(device.free_bytes * FREE_MARGIN // reserved) if reserved > 0 else 0
    return Sizing(per_engine, util, max(0, min(most, fits)), device.free_bytes, device.total_bytes,
                  groups=((device.index,),))


def size_topology(devices: tuple[Device, ...], topology: Topology, *, kv_cache_bytes: int, most: int,
                  overhead_bytes: int = int(ENGINE_OVERHEAD_GIB * GIB)) -> Sizing:
    """Engines spread as TOPOLOGY that fit on DEVICES now (vLLM's ``kv_cache_memory_bytes`` is per GPU).

    One GPU per engine: :func:`size_engines` on the first device, which every
    engine shares (vLLM's default).  More: the devices in consecutive disjoint
    groups of ``topology.gpus``, one engine at a time on a group, and a group
    only when each of its devices holds the per-GPU share, sized against the
    fullest device of the usable groups (the same ``gpu_memory_utilization``
    for every worker).
    """
    if topology.gpus == 1:
        return size_engines(devices[0], kv_cache_bytes=kv_cache_bytes, most=most, overhead_bytes=overhead_bytes)
    n = topology.gpus
    groups = [devices[i:i + n] for i in range(0, len(devices) - n + 1, n)]
    per_engine = kv_cache_bytes + overhead_bytes
    usable = []
    for g in groups:
        total = min(d.total_bytes for d in g)
        util = min(0.95, math.ceil(1000 * per_engine / total) / 1000)
        if all(d.free_bytes * FREE_MARGIN >= util * d.total_bytes for d in g):
            usable.append(g)
    chosen = usable[:max(0, most)]
    pool = [d for g in (chosen or groups[:1]) for d in g]
    tight = min(pool, key=lambda d: d.free_bytes)
    util = min(0.95, math.ceil(1000 * per_engine / min(d.total_bytes for d in pool)) / 1000)
    return Sizing(per_engine, util, len(chosen), tight.free_bytes, tight.total_bytes, n,
                  tuple(tuple(d.index for d in g) for g in (chosen or groups[:1])))


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
