"""The engine side of ``dsv4patch selftest``: one vLLM engine, its prompt sets, JSON-line events.

Why a separate script: it runs in the interpreter of the environment under
test (``--python``), which has vLLM and torch but need not have dsv4patch, and
each engine must be a process of its own so a hung kernel or a fault is
killed with its process group without taking the parent along.  So this file
imports only the standard library at the top, loads ``model.py`` beside it
by file path, and reports through a progress file the parent reads:
``fingerprint``, ``loaded`` (per model class: what the oracle set),
``engine_ready``, ``case_start`` / ``case_done`` (tokens, per-position top-2
gaps, spec-decode counters of that call), ``error``, ``child_done``; ``worker``
from each spawned vLLM worker (what it installed, below).

What it borrows from the old harness (issue 15's ``run_e2e.py``, at commit
270cbd89fb01; measured on the H200): the engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the load format registered here is
the one the engine core uses; ``VLLM_USE_BREAKABLE_CUDAGRAPH=1`` is set
before vLLM is imported (vLLM 0.26.0 sets it only after DeepSeek-V4's
attention module was imported, which then is not a break of piecewise
graphs in this process); the dummy loader is followed by each DeepSeek-V4
class's post-load steps (``finalize_*``); DeepGEMM's start-up warm-up is
skipped (it JIT-compiles 2,429 shapes); the SM120 top-k route is installed
by replacing the platform object of the indexer module only.

Tensor and pipeline parallelism (``spec["tensor_parallel_size"]``,
``spec["pipeline_parallel_size"]``): the engine core stays in this process,
its workers are vLLM's multiprocessing executor's processes, one per GPU.
The oracle's load format and SM120's top-k route must be in every worker: a
forked worker inherits them; a spawned one (vLLM spawns when CUDA is already
initialised here) imports this file again as ``__mp_main__``, which installs
them from ``WORKER_ENV`` and ``WORKER_EVENTS_ENV`` (the spec's and the
progress file's paths, set before the engine starts).

Hang evidence: every stage (engine start, each prompt set) arms faulthandler's
watchdog thread (``dump_traceback_later``) a little before the parent's deadline
for that stage, so the Python stacks of every thread land in the stacks file
even when the main thread is blocked in C (a spinning kernel's synchronize)
and even when vLLM or a library has replaced a signal handler; SIGUSR1 (the
parent's probe) dumps them too.

Usage (by the runner): PYTHON child.py SPEC.json PROGRESS.jsonl [STACKS.txt]
                       PYTHON child.py --probe  (one JSON line: torch, CUDA devices and their free memory, vLLM)
"""

from __future__ import annotations

import faulthandler
import gc
import importlib.util
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LOAD_FORMAT = "dsv4selftest_oracle"
# A spawned vLLM worker finds the engine's spec and progress file here: see the module docstring.
WORKER_ENV = "DSV4SELFTEST_WORKER_SPEC"
WORKER_EVENTS_ENV = "DSV4SELFTEST_WORKER_EVENTS"

# What each DeepSeek-V4 class's own ``load_weights`` runs after a checkpoint (vLLM 0.26.0,
# ``vllm/models/deepseek_v4/nvidia/``); the dummy loader never calls ``load_weights``.
FINALIZE_STEPS: tuple[tuple[str, str], ...] = (
    ("model", "finalize_mega_moe_weights"),
    ("model", "finalize_mhc_broadcast_weights"),
    ("", "finalize_mega_moe_weights"),
    ("", "_finalize_moe"),
)


def _load_model_module() -> Any:
    spec = importlib.util.spec_from_file_location("dsv4selftest_model", HERE / "model.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


class Events:
    """Append-only JSON lines, flushed at once (the parent reads them while this process runs)."""

    def __init__(self, path: Path) -> None:
        self._fh = path.open("a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()

    def emit(self, event: str, **data: Any) -> None:
        data["event"] = event
        data["t"] = time.time()
        with self._lock:
            self._fh.write(json.dumps(data) + "\n")
            self._fh.flush()


def finalize_model(model: Any) -> list[str]:
    ran: list[str] = []
    for attr, method in FINALIZE_STEPS:
        owner = getattr(model, attr, None) if attr else model
        fn = getattr(type(owner), method, None) if owner is not None else None
        if callable(fn):
            getattr(owner, method)()
            ran.append(f"{type(owner).__name__}.{method}")
    return ran


class Sm120TopkRoute:
    """vLLM's platform object, except that it answers "SM120 family" (and only that).

    Installed as ``current_platform`` of ``vllm.model_executor.layers.sparse_attn_indexer``
    alone, where vLLM 0.26.0 asks the family in one place: the decode top-k choice.
    """

    def __init__(self, real: Any) -> None:
        self._real = real

    def is_device_capability_family(self, family: int, *args: Any, **kwargs: Any) -> bool:
        if family == 120:
            return True
        return bool(self._real.is_device_capability_family(family, *args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def install_sm120_topk_route() -> str:
    sai: Any = importlib.import_module("vllm.model_executor.layers.sparse_attn_indexer")

    src = Path(sai.__file__).read_text(encoding="utf-8")
    uses = src.count("is_device_capability_family(")
    if uses != 1 or "not current_platform.is_device_capability_family(120)" not in src:
        raise RuntimeError(f"{sai.__file__}: expected exactly the decode top-k route to ask for the SM120 "
                           f"family, found {uses} call site(s); --force-sm120-topk is not safe on this vLLM")
    sai.current_platform = Sm120TopkRoute(sai.current_platform)
    return f"{sai.__name__}.current_platform answers SM120 family"


def register_loader(model_mod: Any, events: Events) -> str:
    register_model_loader = importlib.import_module("vllm.model_executor.model_loader").register_model_loader
    dummy: Any = importlib.import_module("vllm.model_executor.model_loader.dummy_loader").DummyModelLoader

    class OracleLoader(dummy):  # type: ignore[misc]
        def load_weights(self, model: Any, model_config: Any) -> None:
            super().load_weights(model, model_config)
            done = model_mod.apply_oracle_weights(model)
            cls = type(model).__name__
            ranks = parallel_ranks()
            missing = model_mod.missing_parts(cls, done, first_pp_rank=ranks["first_pp_rank"],
                                              last_pp_rank=ranks["last_pp_rank"])
            if missing:
                raise RuntimeError(f"selftest oracle: {cls} has no {', '.join(missing)} on TP rank "
                                   f"{ranks['tp_rank']}, PP rank {ranks['pp_rank']} "
                                   "(this vLLM's DeepSeek-V4 layout is not the one the oracle knows)")
            events.emit("loaded", model=cls, set=done, finalize=finalize_model(model),
                        tp_rank=ranks["tp_rank"], pp_rank=ranks["pp_rank"])

    register_model_loader(LOAD_FORMAT)(OracleLoader)
    return LOAD_FORMAT


def parallel_ranks() -> dict[str, Any]:
    """This worker's place: its TP and PP rank, and whether it is the first or last pipeline stage."""
    dist: Any = importlib.import_module("vllm.distributed")
    pp = dist.get_pp_group()
    return {"tp_rank": int(dist.get_tensor_model_parallel_rank()), "pp_rank": int(pp.rank_in_group),
            "first_pp_rank": bool(pp.is_first_rank), "last_pp_rank": bool(pp.is_last_rank)}


def llm_arguments(spec: dict[str, Any], load_format: str) -> dict[str, Any]:
    """The engine's ``LLM(...)`` keywords, from the runner's SPEC (the CPU tests build vLLM's config from them)."""
    tp = int(spec.get("tensor_parallel_size", 1))
    pp = int(spec.get("pipeline_parallel_size", 1))
    args: dict[str, Any] = {
        "model": spec["model"],
        "load_format": load_format,
        "skip_tokenizer_init": True,
        "kv_cache_dtype": "fp8",
        "block_size": 256,
        "max_model_len": int(spec["max_model_len"]),
        "max_num_seqs": 32,
        "gpu_memory_utilization": float(spec["gpu_memory_utilization"]),
        "kv_cache_memory_bytes": int(spec["kv_cache_bytes"]),
        "seed": 0,
        "enforce_eager": False,
        "speculative_config": spec["engine"].get("speculative_config"),
        "disable_log_stats": False,
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
    }
    if tp * pp > 1:
        # vLLM's own workers, one process per GPU, on this node (never Ray, whatever is installed)
        args["distributed_executor_backend"] = "mp"
    return args


def _counters(llm: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        metrics = llm.get_metrics()
    except Exception:  # the counters are a report, never a reason to fail
        return out
    for m in metrics:
        name = str(getattr(m, "name", ""))
        value = getattr(m, "value", None)
        if "spec_decode" not in name or not isinstance(value, (int, float)):
            continue
        for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            if name.removesuffix("_total").endswith(key):
                out[key] = out.get(key, 0) + int(value)
    return out


@contextmanager
def _imports_without_collector() -> Iterator[None]:
    """vLLM's imports (torch, its model loader, the LLM entry point: ~670,000 objects) without the cyclic
    collector, whose full collections rescan the growing heap (~1.2 of ~6 CPU s); then one collection and
    what is left frozen (module-level objects that live as long as the process, never rescanned again, as
    long-lived servers freeze their start-up heap), and the collector on again before the engine starts,
    so the engine's own garbage is collected as vLLM expects.  On CPU (the suite's stand-in platform) this
    took the children of tests/test_selftest_child.py from ~122 to ~103 CPU s."""
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()
        gc.enable()


def run(spec: dict[str, Any], events: Events, watchdog: Watchdog) -> None:
    """The engine's life: its environment, the fingerprint, the engine's start, then each prompt set."""
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1"
    os.environ.setdefault("VLLM_DEEP_GEMM_WARMUP", "skip")
    with _imports_without_collector():
        model_mod = _load_model_module()
        vllm = importlib.import_module("vllm")
        events.emit("fingerprint", data=_fingerprint(vllm, spec))
        watchdog.arm("start", "engine start")
        load_format = register_loader(model_mod, events)
        LLM, SamplingParams = vllm.LLM, vllm.SamplingParams
        TokensPrompt = importlib.import_module("vllm.inputs").TokensPrompt
    llm = LLM(**llm_arguments(spec, load_format))
    watchdog.disarm()
    meter = spec["engine"].get("method") == "dspark"  # fix 3b's debug check: the draft's KV writes into block 0
    events.emit("engine_ready", **_ready(llm, meter))
    StepMonitor(llm, events).start()
    for i, pset in enumerate(spec["prompt_sets"]):
        watchdog.arm("first_case" if i == 0 else "case", f"prompt set {pset['name']}")
        events.emit("case_start", case=pset["name"])
        _run_prompt_set(llm, pset, events, watchdog, SamplingParams, TokensPrompt, meter=meter)


def _fingerprint(vllm: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Which vLLM, torch and GPU this engine runs on (a broken torch is reported, not fatal); SM120's
    top-k route installed first when the engine asks for it."""
    fp: dict[str, Any] = {"vllm_file": vllm.__file__, "vllm_version": getattr(vllm, "__version__", "?"),
                          "python": sys.executable}
    try:
        torch = importlib.import_module("torch")
        fp["torch"] = torch.__version__
        if torch.cuda.is_available():
            fp["gpu"] = torch.cuda.get_device_name(0)
            fp["capability"] = ".".join(str(x) for x in torch.cuda.get_device_capability(0))
    except Exception as exc:  # torch may be broken: reported
        fp["torch"] = f"{type(exc).__name__}: {exc}"
    if spec["engine"].get("sm120_topk"):
        fp["topk_route"] = install_sm120_topk_route()
    return fp


def _ready(llm: Any, meter: bool) -> dict[str, Any]:
    """The ``engine_ready`` event: the parallel sizes vLLM built, what the engine holds on the GPU
    (the runner sizes the engines it starts later from it), block 0's snapshot when metered."""
    parallel = llm.llm_engine.vllm_config.parallel_config
    ready: dict[str, Any] = {"tensor_parallel_size": int(parallel.tensor_parallel_size),
                             "pipeline_parallel_size": int(parallel.pipeline_parallel_size)}
    try:
        torch = importlib.import_module("torch")
        free, total = torch.cuda.mem_get_info()
        ready.update({"gpu_free_bytes": int(free), "gpu_total_bytes": int(total),
                      "torch_reserved_bytes": int(torch.cuda.memory_reserved())})
    except Exception:  # a report, never a reason to fail
        pass
    if meter:
        ready["null_block"] = _null_block(llm, "snapshot")
    return ready


def _run_prompt_set(llm: Any, pset: dict[str, Any], events: Events, watchdog: Watchdog,
                    SamplingParams: Any, TokensPrompt: Any, *, meter: bool) -> None:
    """One prompt set, greedy with the top-2 logprobs; its ``case_done`` event (tokens, gaps, the
    spec-decode counters of this call, block 0's comparison when metered)."""
    params = [SamplingParams(temperature=0.0, max_tokens=int(n), ignore_eos=True, detokenize=False, logprobs=2)
              for n in pset["max_tokens"]]
    before = _counters(llm)
    t0 = time.time()
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in pset["prompts"]], params,
                        use_tqdm=False)
    seconds = round(time.time() - t0, 3)
    after = _counters(llm)
    tokens, gaps, not_top = _read_outputs(outs)
    watchdog.disarm()
    extra: dict[str, Any] = {"null_block": _null_block(llm, "compare")} if meter else {}
    events.emit("case_done", case=pset["name"], tokens=tokens, gaps=gaps, not_top=not_top, seconds=seconds,
                spec={k: after.get(k, 0) - before.get(k, 0) for k in after}, **extra)


def _read_outputs(outs: Any) -> tuple[list[list[int]], list[list[float]], list[list[int]]]:
    """Per request: the tokens, the top-2 logprob gap at each position, and the positions where the
    emitted token is not the top logprob."""
    tokens: list[list[int]] = []
    gaps: list[list[float]] = []
    not_top: list[list[int]] = []
    for o in outs:
        seq = [int(x) for x in o.outputs[0].token_ids]
        tokens.append(seq)
        row: list[float] = []
        bad: list[int] = []
        for pos, lp in enumerate(o.outputs[0].logprobs or []):
            ranked = sorted(((float(v.logprob), int(k)) for k, v in lp.items()), reverse=True)
            if len(ranked) >= 2:
                row.append(round(ranked[0][0] - ranked[1][0], 4))
            if ranked and pos < len(seq) and ranked[0][1] != seq[pos]:
                bad.append(pos)
        gaps.append(row)
        not_top.append(bad)
    return tokens, gaps, not_top


def null_block_meter(worker: Any, action: str) -> dict[str, Any]:
    """Run in each vLLM worker (``LLM.collective_rpc``): block 0 of every draft KV cache layer, kept or compared.

    Fix 3b's debug check.  Block 0 is the KV pool's null block: never given to
    a request (vLLM 0.26.0 ``v1/core/block_pool.py:188-191``), it stands for
    evicted sliding-window blocks and padding in block tables, and nothing may
    write it (vLLM reads it as all-zero KV: ``v1/core/single_type_kv_cache_manager.py:831-832``).
    Stock 0.26.0's DFlash/DSpark input kernel computes draft KV slots as
    ``block_id * block_size + offset`` with no guard for block 0
    (``v1/worker/gpu/spec_decode/dflash/speculator.py:516-532`` for the context rows, ``:537-552``
    for the query rows),
    so a row that holds it writes draft KV into that block.  ``snapshot``
    (when the engine is ready, after its CUDA graphs were captured) keeps a
    copy of block 0 of each layer of the draft's KV cache groups on the
    worker; ``compare`` answers how many of its bytes changed since, per
    layer.  A layer whose cache's first dimension is not the blocks is named,
    not measured.  Standalone (imports inside): it is sent to the workers.
    """
    torch: Any = importlib.import_module("torch")
    runner = getattr(worker, "model_runner", None)
    spec = getattr(runner, "speculator", None)
    groups = getattr(spec, "draft_kv_cache_group_ids", None)
    config = getattr(runner, "kv_cache_config", None)
    if runner is None or groups is None or config is None:
        return {"skipped": "no draft KV cache groups on this worker (not a DFlash/DSpark speculator)"}
    context = runner.compilation_config.static_forward_context
    num_blocks = int(config.num_blocks)
    kept: dict[str, Any] = getattr(worker, "_dsv4selftest_block0", {})
    out: dict[str, Any] = {"layers": {}, "unmeasured": {}}
    for gid in groups:
        for name in config.kv_cache_groups[gid].layer_names:
            cache = getattr(context.get(name), "kv_cache", None)
            if isinstance(cache, (list, tuple)):
                cache = cache[0] if cache else None
            bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
            if cache is None or cache.dim() < 2 or cache.shape[0] < num_blocks or cache.shape[0] % num_blocks \
                    or cache.element_size() not in bits:
                out["unmeasured"][name] = ("no cache" if cache is None else
                                           f"layout {tuple(cache.shape)}: its first dimension is not the blocks")
                continue
            # block 0 = the first (kernel) blocks of the first dimension, whatever the strides (packed layouts);
            # compared bit for bit (a NaN is its own value)
            block0 = cache[: cache.shape[0] // num_blocks].view(bits[cache.element_size()])
            if action == "snapshot":
                kept[name] = block0.clone()
                out["layers"][name] = int(torch.count_nonzero(block0).item()) * cache.element_size()
            elif name in kept:
                out["layers"][name] = int((block0 != kept[name]).sum().item()) * cache.element_size()
    if action == "snapshot":
        worker._dsv4selftest_block0 = kept
    return out


def _null_block(llm: Any, action: str) -> dict[str, Any]:
    """:func:`null_block_meter` on every worker, as one report: layers measured, bytes changed per layer."""
    try:
        answers = llm.collective_rpc(null_block_meter, args=(action,))
    except Exception as exc:  # a report: the case's tokens are judged anyway
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}
    written: dict[str, int] = {}
    layers = 0
    unmeasured: dict[str, str] = {}
    skipped = []
    for rank, ans in enumerate(answers):
        if "skipped" in ans:
            skipped.append(f"worker {rank}: {ans['skipped']}")
            continue
        layers += len(ans["layers"])
        unmeasured.update({f"worker {rank}: {k}": v for k, v in ans["unmeasured"].items()})
        if action == "compare":
            written.update({f"worker {rank}: {k}": v for k, v in ans["layers"].items() if v})
    return {"layers": layers, "written": written, "unmeasured": unmeasured, "skipped": skipped}


def probe() -> dict[str, Any]:
    """What this environment can run: torch and its CUDA devices (free memory now), vLLM's and pytest's versions.

    Imports torch (CUDA is initialised to read the free memory) but not vLLM:
    its version comes from the installed metadata, so the probe takes seconds.
    """
    from importlib import metadata

    out: dict[str, Any] = {"python": sys.executable, "devices": []}
    for dist in ("vllm", "torch", "pytest", "triton"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
        except Exception as exc:  # a broken install is reported, not raised
            out[dist] = None
            out.setdefault("errors", []).append(f"{dist}: {type(exc).__name__}: {exc}")
    try:
        torch = importlib.import_module("torch")
        out["torch_cuda"] = getattr(torch.version, "cuda", None)
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                free, total = torch.cuda.mem_get_info(i)
                out["devices"].append({"index": i, "name": torch.cuda.get_device_name(i),
                                       "capability": ".".join(str(x) for x in torch.cuda.get_device_capability(i)),
                                       "free_bytes": int(free), "total_bytes": int(total)})
    except Exception as exc:  # no torch, or CUDA broken: reported, the runner decides
        out.setdefault("errors", []).append(f"torch: {type(exc).__name__}: {exc}")
    return out


class StepMonitor:
    """A thread that reports the engine's batch as it changes: ``step`` events (requests running, waiting,
    tokens generated so far).

    Why: fix 6/7's hang needs one batch shape (on SM120's route in vLLM 0.26.0:
    exactly three requests decoding, padded to four), so a hang report must say
    which shape the engine was in when it stopped.  The engine runs in this
    process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so its scheduler is read
    directly; a reading that fails is skipped (a report, never a reason to fail).
    """

    def __init__(self, llm: Any, events: Events, period: float = 0.1, heartbeat: float = 5.0) -> None:
        core = getattr(getattr(getattr(llm, "llm_engine", None), "engine_core", None), "engine_core", None)
        self._scheduler = getattr(core, "scheduler", None)
        self._events = events
        self._period = period
        self._heartbeat = heartbeat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="selftest-steps", daemon=True)

    def start(self) -> StepMonitor:
        if self._scheduler is not None:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _read(self) -> tuple[int, int, int] | None:
        sched: Any = self._scheduler
        try:
            running = list(sched.running)
            waiting = len(sched.waiting)
            tokens = sum(int(getattr(r, "num_output_tokens", 0)) for r in running)
        except Exception:  # the scheduler changed under us: read again later
            return None
        return len(running), waiting, tokens

    def _run(self) -> None:
        last: tuple[int, int, int] | None = None
        last_t = 0.0
        while not self._stop.wait(self._period):
            now = self._read()
            if now is None:
                continue
            t = time.monotonic()
            if last is None or now[:2] != last[:2] or (now != last and t - last_t >= self._heartbeat):
                self._events.emit("step", running=now[0], waiting=now[1], tokens=now[2])
                last, last_t = now, t


class Watchdog:
    """faulthandler's timer per stage: every thread's Python stack into the stacks file before the deadline."""

    def __init__(self, path: Path | None, seconds: dict[str, float]) -> None:
        self._fh = path.open("a", encoding="utf-8") if path is not None else None
        self._seconds = seconds

    def arm(self, stage: str, label: str) -> None:
        if self._fh is None:
            return
        faulthandler.cancel_dump_traceback_later()
        # re-registered at every stage: vLLM or a library may have replaced the handler since
        faulthandler.register(signal.SIGUSR1, file=self._fh, all_threads=True)
        seconds = self._seconds.get(stage)
        if seconds and seconds > 0:
            self._fh.write(f"\n===== stage: {label} (stacks dumped if it lasts {seconds:.0f} s) =====\n")
            self._fh.flush()
            faulthandler.dump_traceback_later(seconds, repeat=False, file=self._fh)

    def disarm(self) -> None:
        if self._fh is not None:
            faulthandler.cancel_dump_traceback_later()


def worker_setup(spec_path: str, progress: str) -> None:
    """In a spawned vLLM worker (this file imported as ``__mp_main__``): the route and the load format again."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    events = Events(Path(progress))
    with _imports_without_collector():  # torch and vLLM again, in this process: as in run()
        installed = [install_sm120_topk_route()] if spec["engine"].get("sm120_topk") else []
        installed.append(f"load format {register_loader(_load_model_module(), events)}")
    events.emit("worker", pid=os.getpid(), installed=installed)


def main(argv: list[str]) -> int:
    if len(argv) > 1 and argv[1] == "--probe":
        print(json.dumps(probe()), flush=True)
        return 0
    spec = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    os.environ[WORKER_ENV] = str(Path(argv[1]).resolve())
    os.environ[WORKER_EVENTS_ENV] = str(Path(argv[2]).resolve())
    events = Events(Path(argv[2]))
    stacks = Path(argv[3]) if len(argv) > 3 else None
    watchdog = Watchdog(stacks, {k: float(v) for k, v in (spec.get("watchdog") or {}).items()})
    # SIGUSR1 dumps every thread's Python stack (the parent's hang probe), into the stacks file when there is one
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        run(spec, events, watchdog)
    except BaseException as exc:  # reported, then the exit code says it
        watchdog.disarm()
        events.emit("error", error=f"{type(exc).__name__}: {exc}"[:4000],
                    traceback=traceback.format_exc()[-8000:])
        return 1
    watchdog.disarm()
    events.emit("child_done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
elif __name__ == "__mp_main__" and os.environ.get(WORKER_ENV) and os.environ.get(WORKER_EVENTS_ENV):
    worker_setup(os.environ[WORKER_ENV], os.environ[WORKER_EVENTS_ENV])
