"""Run the self-test: the installed-files check, the series' regression tests, the engine cases.

Why this shape: a hung kernel (fix 7's spinning top-k) never returns and a
fault can take its process down, so each engine is a child process in its
own process group, watched through its progress file: a stage (engine start,
one prompt set) that outlives its deadline is a ``hang`` (the child's Python
stacks are dumped with SIGUSR1 into its log first), a child that exits
without finishing is a ``crash`` with its error line.  A case is one prompt
set on one engine; when an engine hangs or crashes, its later sets are
``not-run``.  Finished cases are judged by :mod:`.oracle`: ``pass`` (every
token is the designed chain's, and for speculative engines both accepted and
rejected drafts occurred), ``differs`` (first request, position and both
tokens), ``inconclusive`` (tokens right, but the drafts were all accepted or
all rejected: the run did not exercise both paths).  DSpark refused at engine
start for a documented platform reason is ``refused`` with vLLM's message.

The child command is a parameter (``child``), so the tests drive the runner
with a stand-in engine script (no GPU there); on a real node it is
``child.py`` under the environment's interpreter.
"""

from __future__ import annotations

import json
import math
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4patch import childproc
from dsv4patch.errors import ChildError, Dsv4Error
from dsv4patch.proofs.selftest import model as tiny
from dsv4patch.proofs.selftest import plan, probe
from dsv4patch.proofs.selftest.cases import Case, Engine, PromptSet
from dsv4patch.proofs.selftest.node import Node, ProbeError, parse_probe
from dsv4patch.proofs.selftest.oracle import (
    Acceptance,
    Difference,
    expected_acceptance,
    expected_tokens,
    first_difference,
    min_gap,
)
from dsv4patch.proofs.selftest.probe import HangEvidence
from dsv4patch.proofs.selftest.regression import RegressionResult, run_regression
from dsv4patch.safeio import create_exclusive

if TYPE_CHECKING:
    from dsv4patch.pins import Lock
    from dsv4patch.progress import Progress
    from dsv4patch.store import Store

CHILD = Path(__file__).resolve().parent / "child.py"
# needs-gpu: the case needs a CUDA device and this node has none (not a failure; the summary says so);
# null-block: the tokens are right but the draft wrote KV into the KV pool's null block (fix 3b's debug check)
VERDICTS = ("pass", "differs", "null-block", "hang", "crash", "refused", "inconclusive", "not-run", "needs-gpu")
FAILING = ("differs", "null-block", "hang", "crash", "inconclusive")
# Engine-start errors that are a platform's documented refusal, not a crash (fix 5's SM120 gate names
# flashinfer#4380; vLLM's config refuses DSpark where it cannot run).
# vLLM 0.26.0-0.29.0 refuse every DeepSeek-V4 draft (MTP, DSpark) with pipeline parallelism when they build the
# engine config: the draft's parallel config takes the target's PP size (config/speculative.py:1195-1196 in
# 0.26.0) and its model classes do not implement SupportsPP (config/model.py:1240-1247); behind that, the V2
# runner refuses DSpark/DFlash with PP (v1/worker/gpu/model_runner.py:197-204).  docs/selftest.md, fix 3b.
REFUSALS = ("flashinfer-ai/flashinfer#4380", "DSpark is not supported", "dspark is not supported",
            "Pipeline parallelism is not supported for this model", "with pipeline parallel is not supported")


@dataclass(frozen=True)
class Deadlines:
    """Seconds: the engine start, the first prompt set (JIT compiles new shapes), each later set, all."""

    # the first engine's start: a cold H200 node compiled kernels (TileLang mHC, FlashInfer autotune, CuTe-DSL
    # router GEMM) for more than 400 + 184 s on 2026-12-03 (docs/selftest.md); a warm start takes 40-90 s
    start: float = 900.0
    first_case: float = 240.0
    case: float = 120.0
    total: float = 1800.0


@dataclass
class CaseResult:
    """One (engine, prompt set): the verdict and what the oracle measured."""

    case: str
    engine: str
    prompt_set: str
    verdict: str
    error: str = ""
    difference: Difference | None = None
    min_gap: float | None = None
    acceptance: Acceptance | None = None
    expected_acceptance: Acceptance | None = None
    not_top: int = 0  # positions whose emitted token was not the top logprob
    seconds: float | None = None
    null_block: dict[str, Any] | None = None  # fix 3b's debug check (DSpark): block 0 bytes the draft changed

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case, "engine": self.engine, "prompt_set": self.prompt_set, "verdict": self.verdict,
            "error": self.error or None,
            "difference": None if self.difference is None else self.difference.to_json(),
            "min_gap": self.min_gap,
            "acceptance": None if self.acceptance is None else self.acceptance.to_json(),
            "expected_acceptance": None if self.expected_acceptance is None else self.expected_acceptance.to_json(),
            "not_top": self.not_top, "seconds": self.seconds, "null_block": self.null_block,
        }


@dataclass
class EngineRun:
    """One child: how it ended and its cases."""

    engine: Engine
    outcome: str  # done, hang, crash, refused, not-run
    detail: str
    start_seconds: float | None
    fingerprint: dict[str, Any] | None
    loaded: list[dict[str, Any]]
    cases: list[CaseResult]
    log: str  # path of the child's full log
    stage: str = ""  # where a hang happened ("engine start", "prompt set mid_b24")
    start_deadline: float | None = None  # the start deadline it ran under (cold for the first engine, else warm)
    stacks: str = ""  # the child's faulthandler dumps (watchdog before each deadline, SIGUSR1)
    evidence: HangEvidence | None = None  # the hang probe's summary (py-spy, nvidia-smi, cuda-gdb)
    gpu_reserved_bytes: int | None = None  # torch's reserved memory when the engine was ready
    launched_at: float | None = None  # seconds after the engines' phase began that its child was started
    exit: str = ""  # how the child ended: "exit 0", "killed by SIGKILL" (ours, at a deadline), ...
    topology: dict[str, int] | None = None  # what vLLM built: its parallel config's TP and PP sizes (engine_ready)
    devices: tuple[int, ...] | None = None  # the GPUs it was given (CUDA_VISIBLE_DEVICES), None: all visible
    workers: list[dict[str, Any]] = field(default_factory=list)  # spawned vLLM workers: pid, what each installed

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine.to_json(), "outcome": self.outcome, "detail": self.detail or None,
                "start_seconds": self.start_seconds, "fingerprint": self.fingerprint, "loaded": self.loaded,
                "log": self.log, "stage": self.stage or None, "start_deadline": self.start_deadline,
                "stacks": self.stacks or None, "hang_evidence": None if self.evidence is None
                else self.evidence.to_json(), "gpu_reserved_bytes": self.gpu_reserved_bytes,
                "launched_at": None if self.launched_at is None else round(self.launched_at, 1),
                "exit": self.exit or None, "topology": self.topology,
                "devices": None if self.devices is None else list(self.devices), "workers": self.workers}


EVENTS_LIMIT = 64 << 20  # bytes of a child's events file read in all (a flood is a crash, never our memory)
_EVENT_KINDS = frozenset({"fingerprint", "loaded", "engine_ready", "case_start", "case_done", "step", "error",
                          "child_done", "worker"})


class EventError(ValueError):
    """A child's event that does not follow the protocol: the engine's verdict is a crash, with this."""


def _check_event(ev: Any) -> dict[str, Any]:
    """One event as the protocol says (child.py); anything else raises :class:`EventError`."""
    if not isinstance(ev, dict) or ev.get("event") not in _EVENT_KINDS:
        raise EventError(f"not an event of the protocol: {str(ev)[:120]!r}")
    t = ev.get("t")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t):
        raise EventError(f"event {ev['event']!r}: time {t!r} is not a number")
    if ev["event"] == "step" and not all(isinstance(ev.get(k), int) and not isinstance(ev.get(k), bool)
                                         for k in ("running", "waiting", "tokens")):
        raise EventError("event 'step': running, waiting and tokens must be integers")
    if ev["event"] == "engine_ready" and not all(
            ev.get(k) is None or (isinstance(ev.get(k), int) and not isinstance(ev.get(k), bool) and 1 <= ev[k] <= 64)
            for k in ("tensor_parallel_size", "pipeline_parallel_size")):
        raise EventError("event 'engine_ready': the parallel sizes must be integers of 1 to 64")
    if ev["event"] in ("case_start", "case_done") and not isinstance(ev.get("case"), str):
        raise EventError(f"event {ev['event']!r}: no prompt set name")
    if ev["event"] == "case_done":
        for key, cell in (("tokens", int), ("not_top", int), ("gaps", float)):
            rows = ev.get(key, [])
            if not isinstance(rows, list) or not all(
                    isinstance(r, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) and
                                                (cell is float or isinstance(x, int)) and math.isfinite(x)
                                                for x in r) for r in rows):
                raise EventError(f"event case_done {ev['case']!r}: {key} is not rows of {cell.__name__}s")
        spec = ev.get("spec", {})
        if not isinstance(spec, dict) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                 for v in spec.values()):
            raise EventError(f"event case_done {ev['case']!r}: spec-decode counters are not integers")
        seconds = ev.get("seconds")
        if seconds is not None and (not isinstance(seconds, (int, float)) or not math.isfinite(seconds)):
            raise EventError(f"event case_done {ev['case']!r}: seconds is not a number")
        meter = ev.get("null_block")
        written = meter.get("written", {}) if isinstance(meter, dict) else {}
        if meter is not None and (not isinstance(meter, dict) or not isinstance(written, dict) or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
                for k, v in written.items())):
            raise EventError(f"event case_done {ev['case']!r}: the null-block check is not bytes per layer")
    return ev


class EventReader:
    """A child's JSON-line events, read as they come: new bytes only, bounded, each line checked.

    A partly written last line waits for the next read.  A malformed event or
    more than ``limit`` bytes in all stops the reading and is kept as
    ``error``: the runner ends that engine as a crash saying so.
    """

    def __init__(self, path: Path, limit: int = EVENTS_LIMIT) -> None:
        self.path = path
        self.limit = limit
        self.events: list[dict[str, Any]] = []
        self.error = ""
        self._offset = 0
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        if self.error:
            return self.events
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return self.events
        try:
            data = os.pread(fd, self.limit + 1 - self._offset, self._offset) if self._offset <= self.limit else b""
        finally:
            os.close(fd)
        self._offset += len(data)
        if self._offset > self.limit:
            self.error = f"the engine wrote more than {self.limit} bytes of events"
            return self.events
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            if not raw.strip():
                continue
            try:
                self.events.append(_check_event(json.loads(raw.decode("utf-8"), parse_constant=_no_constant)))
            except (ValueError, UnicodeDecodeError, RecursionError) as exc:
                self.error = f"the engine's event {len(self.events) + 1} is malformed: {exc}"[:300]
                break
        return self.events


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def read_events(path: Path, limit: int = EVENTS_LIMIT) -> list[dict[str, Any]]:
    """Every well-formed event of a finished child (the reader's view; malformed ones end the list)."""
    return EventReader(path, limit).read()


def error_line(log: str) -> str:
    """The most telling error line of a child's log."""
    lines = [ln for ln in log.splitlines() if ln.strip()]
    keys = ("Error", "Exception", "error:", "Assertion", "CUDA", "Killed")
    picked = [ln for ln in lines if any(k in ln for k in keys) and "Traceback" not in ln]
    return (picked or lines or ["no output"])[-1].strip()[:500]


def judge(engine: Engine, pset: PromptSet, ev: dict[str, Any]) -> CaseResult:
    """The oracle's verdict on a finished prompt set (its ``case_done`` event, checked by the reader)."""
    name = f"{engine.name}/{pset.name}"
    tokens = [[int(t) for t in row] for row in ev.get("tokens") or []]
    want = expected_tokens([list(p) for p in pset.prompts], list(pset.max_tokens))
    diff = first_difference(want, tokens)
    gaps = [[float(g) for g in row] for row in ev.get("gaps") or []]
    not_top = sum(len(r) for r in ev.get("not_top") or [])
    seconds = ev.get("seconds")
    res = CaseResult(name, engine.name, pset.name, "pass", difference=diff, min_gap=min_gap(gaps),
                     not_top=not_top, seconds=float(seconds) if seconds is not None else None)
    if engine.method != "plain":
        spec = ev.get("spec") or {}
        res.acceptance = Acceptance(int(spec.get("num_draft_tokens", 0)), int(spec.get("num_accepted_tokens", 0)))
        res.expected_acceptance = expected_acceptance(engine.method, engine.k, want)
    meter = ev.get("null_block")
    if isinstance(meter, dict):
        res.null_block = meter
    written = res.null_block.get("written") if res.null_block is not None else None
    if diff is not None:
        res.verdict = "differs"
        res.error = diff.describe()
    elif isinstance(written, dict) and written:
        res.verdict = "null-block"
        res.error = ("the draft wrote KV into the null block (block 0): "
                     + ", ".join(f"{k} ({v} bytes)" for k, v in sorted(written.items())[:4])
                     + (f" and {len(written) - 4} more layer(s)" if len(written) > 4 else "") + " (fix 3b)")
    elif res.acceptance is not None and not res.acceptance.partial:
        res.verdict = "inconclusive"
        res.error = (f"drafts: {res.acceptance.accepted} of {res.acceptance.drafted} accepted; both accepted "
                     "and rejected drafts must occur")
    return res


@dataclass
class EngineDeadlines:
    """One engine's stage deadlines (seconds): its start, its first prompt set, each later one."""

    start: float
    first_case: float
    case: float

    def watchdog(self) -> dict[str, float]:
        """When the child dumps its own stacks: a little before each deadline (the parent kills at it)."""
        return {k: max(1.0, v - max(3.0, 0.05 * v))
                for k, v in (("start", self.start), ("first_case", self.first_case), ("case", self.case))}


def run_engine(
    engine: Engine,
    psets: list[PromptSet],
    *,
    child: list[str],
    spec: dict[str, Any],
    work: Path,
    deadlines: EngineDeadlines,
    stop_at: float,
    env: dict[str, str],
    on_ready: Callable[[float | None], None] | None = None,
    poll: float = 0.2,
) -> EngineRun:
    """One engine's child under the deadlines; every prompt set judged or marked."""
    tag = engine.name
    spec_path, progress = work / f"{tag}.spec.json", work / f"{tag}.events"
    log_path, stacks_path = work / f"{tag}.log", work / f"{tag}.stacks.txt"
    full = {**spec, "engine": {**engine.to_json(), "speculative_config": engine.speculative_config()},
            "prompt_sets": [p.to_json() for p in psets], "watchdog": deadlines.watchdog()}
    for path, text in ((spec_path, json.dumps(full)), (progress, ""), (stacks_path, "")):
        create_exclusive(path, text)
    hung: str | None = None
    cut = False
    ready_seen = False
    stage_label = "engine start"
    evidence: HangEvidence | None = None
    reader = EventReader(progress)
    with childproc.Child([*child, str(spec_path), str(progress), str(stacks_path)], what=f"engine {tag}",
                         log=log_path, cwd=work, env=env) as proc:
        stage, stage_start, deadline = "engine start", time.monotonic(), deadlines.start
        seen = 0
        batch = ""  # the batch when the stage last changed shape (step events)
        while proc.poll() is None:
            events = reader.read()
            for ev in events[seen:]:
                kind = ev["event"]
                if kind == "step":
                    batch = f"{ev['running']} running, {ev['waiting']} waiting, {ev['tokens']} tokens generated"
                elif kind == "engine_ready":
                    ready_seen = True
                    stage, stage_start, deadline = "between prompt sets", time.monotonic(), deadlines.case
                    if on_ready is not None:
                        on_ready(float(ev["t"]) - float(events[0]["t"]))
                elif kind == "case_start":
                    first = bool(psets) and ev.get("case") == psets[0].name
                    stage, stage_start, batch = f"prompt set {ev.get('case')}", time.monotonic(), ""
                    deadline = deadlines.first_case if first else deadlines.case
                elif kind == "case_done":
                    stage, stage_start, deadline = "between prompt sets", time.monotonic(), deadlines.case
            seen = len(events)
            if reader.error:
                break
            now = time.monotonic()
            if now > stop_at or now - stage_start > deadline:
                cut = now > stop_at
                stage_label = stage
                if cut:
                    hung = f"cut by the run's deadline during {stage}"
                else:
                    last = probe.last_log_line(proc.tail(64 << 10))
                    hung = (f"{stage}: no progress within {deadline:.0f} s" + (f" ({batch})" if batch else "")
                            + (f" (last logged: {last})" if last else ""))
                    evidence = probe.collect(proc, stacks=stacks_path, out=work / f"{tag}.probe.txt")
                break
            time.sleep(poll)
        fin = proc.finish()  # the whole tree: no straggler keeps the GPU
    if on_ready is not None and not ready_seen:
        on_ready(None)  # the engines waiting for this one's warm caches may start anyway
    events = reader.read()
    log_text = probe.read_tail(log_path, 256 << 10)
    fingerprint = next((e.get("data") for e in events if e["event"] == "fingerprint"), None)
    loaded = [{"model": e.get("model"), "set": e.get("set"), "finalize": e.get("finalize"),
               **{k: e[k] for k in ("tp_rank", "pp_rank") if isinstance(e.get(k), int)}}
              for e in events if e["event"] == "loaded"]
    ready = next((e for e in events if e["event"] == "engine_ready"), None)
    start_seconds = round(float(ready["t"]) - float(events[0]["t"]), 1) if ready is not None and events else None
    err = next((str(e.get("error", "")) for e in events if e["event"] == "error"), "")
    finished = any(e["event"] == "child_done" for e in events)
    if reader.error:
        outcome, detail = "crash", reader.error
    elif err and not finished:  # it failed first; a deadline that fired later is not the cause
        outcome, detail = "crash", f"{fin.status()}: {err}"
        if ready is None and any(r in detail for r in REFUSALS):
            outcome = "refused"
    elif cut:
        outcome, detail = "not-run", hung or ""
    elif hung is not None and evidence is not None and evidence.still_compiling:
        # not a hang: the engine was compiling kernels on an idle GPU (a cold node's JIT caches)
        outcome, detail = "not-run", (f"{stage_label}: still compiling kernels ({evidence.compiler}) on an idle GPU "
                                      f"when the deadline passed: a cold node, not a hang; {evidence.describe()}")
    elif hung is not None:
        outcome, detail = "hang", hung + (f"; {evidence.describe()}" if evidence and evidence.describe() else "")
    elif fin.returncode != 0 or not finished:
        outcome, detail = "crash", f"{fin.status()}: {err or error_line(log_text)}"
        if ready is None and any(r in detail for r in REFUSALS):
            outcome = "refused"
    else:
        outcome, detail = "done", ""
    done = {e.get("case"): e for e in events if e["event"] == "case_done"}
    started = [e.get("case") for e in events if e["event"] == "case_start"]
    cases: list[CaseResult] = []
    for i, pset in enumerate(psets):
        name = f"{engine.name}/{pset.name}"
        if pset.name in done:
            cases.append(judge(engine, pset, done[pset.name]))
        elif outcome in ("hang", "crash") and ((started and started[-1] == pset.name) or
                                               (ready is None and i == 0)):
            where = "" if ready is not None else "engine start: "
            cases.append(CaseResult(name, engine.name, pset.name, outcome, where + detail))
        elif outcome == "refused":
            cases.append(CaseResult(name, engine.name, pset.name, "refused", detail))
        else:
            why = detail if outcome == "not-run" else (f"earlier {outcome}" if outcome != "done" else "not reached")
            cases.append(CaseResult(name, engine.name, pset.name, "not-run", why))
    reserved = int(ready.get("torch_reserved_bytes", 0)) if ready is not None and isinstance(
        ready.get("torch_reserved_bytes"), int) else None
    ran = None if ready is None or ready.get("tensor_parallel_size") is None else {
        "tensor_parallel_size": int(ready["tensor_parallel_size"]),
        "pipeline_parallel_size": int(ready.get("pipeline_parallel_size") or 1)}
    return EngineRun(engine, outcome, detail, start_seconds, fingerprint, loaded, cases, str(log_path),
                     stage=stage_label if hung else "", start_deadline=deadlines.start,
                     stacks=str(stacks_path), evidence=evidence, gpu_reserved_bytes=reserved, exit=fin.status(),
                     topology=ran,
                     workers=[{"pid": e.get("pid"), "installed": e.get("installed")} for e in events
                              if e["event"] == "worker"])


def child_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The engine child's environment: offline, unbuffered; NVLink multicast stays off (NCCL's NVLS, torch's
    symmetric memory and NVSHMEM: a multi-GPU engine's collectives must not depend on it)."""
    env = dict(os.environ if base is None else base)
    env.pop("PYTHONSAFEPATH", None)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})
    return env


def run_cases(
    cases: list[Case],
    *,
    child: list[str],
    work: Path,
    deadlines: Deadlines,
    parallel: int = 1,
    max_model_len: int = tiny.MAX_POSITION,
    kv_cache_gib: float = 6.0,
    gpu_memory_utilization: float = 0.25,
    env: dict[str, str] | None = None,
    topology: plan.Topology | None = None,
    groups: tuple[tuple[int, ...], ...] | None = None,
) -> list[EngineRun]:
    """Every engine the cases need, in :func:`.plan.engine_order`: the first alone until it is ready, then
    the rest PARALLEL at once, each with a warm start deadline from the first one's measured start.

    The first engine fills the JIT caches (TileLang, DeepGEMM, Triton) the
    others then find; its readiness (or its end) releases them.  Each engine
    is spread as TOPOLOGY (one GPU by default); with GROUPS (the probe's device
    indices, :func:`.plan.size_topology`) each engine running at once holds
    one group alone, given to it as ``CUDA_VISIBLE_DEVICES``.
    """
    topology = topology or plan.Topology()
    model_dir = tiny.write_model(work / "tiny-dsv4")
    spec = {"model": str(model_dir), "max_model_len": max_model_len,
            "kv_cache_bytes": int(kv_cache_gib * 2**30), "gpu_memory_utilization": gpu_memory_utilization,
            "tensor_parallel_size": topology.tensor_parallel_size,
            "pipeline_parallel_size": topology.pipeline_parallel_size}
    by_engine: dict[str, tuple[Engine, list[PromptSet]]] = {}
    for c in cases:
        by_engine.setdefault(c.engine.name, (c.engine, []))[1].append(c.prompts)
    t0 = time.monotonic()
    stop_at = t0 + deadlines.total
    env = child_env(env)
    free_groups: queue.Queue[tuple[int, ...]] = queue.Queue()
    for g in groups or ():
        free_groups.put(g)
    order = [by_engine[e.name] for e in plan.engine_order([e for e, _ in by_engine.values()])]
    runs: dict[str, EngineRun] = {}
    first_ready = threading.Event()
    first_start: list[float | None] = [None]

    def released(seconds: float | None) -> None:
        first_start[0] = seconds
        first_ready.set()

    def one(item: tuple[Engine, list[PromptSet]], first: bool) -> None:
        engine, psets = item
        if not first:
            first_ready.wait(max(0.0, stop_at - time.monotonic()))
        if time.monotonic() > stop_at - 10:
            runs[engine.name] = EngineRun(engine, "not-run", "no time left (the run's deadline)", None, None, [],
                                          [CaseResult(f"{engine.name}/{p.name}", engine.name, p.name, "not-run",
                                                      "no time left (the run's deadline)") for p in psets], "")
            return
        start = deadlines.start if first else plan.warm_start_deadline(deadlines.start, first_start[0])
        ed = EngineDeadlines(start=start, first_case=deadlines.first_case, case=deadlines.case)
        group = free_groups.get() if groups else None  # as many threads as groups: never waits long
        try:
            launched = time.monotonic() - t0
            run = run_engine(engine, psets, child=child, spec=spec, work=work, deadlines=ed, stop_at=stop_at,
                             env=env if group is None else {**env, "CUDA_VISIBLE_DEVICES": visible(group, env)},
                             on_ready=released if first else None)
        finally:
            if group is not None:
                free_groups.put(group)
        run.launched_at = launched
        run.devices = group
        runs[engine.name] = run

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(groups)) if groups else parallel)) as pool:
        futures = [pool.submit(one, item, i == 0) for i, item in enumerate(order)]
        for f in futures:
            f.result()
    return [runs[name] for name in by_engine]  # reported in the cases' order; ``launched_at`` says when each ran


def visible(group: tuple[int, ...], env: dict[str, str]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for GROUP: the probe's indices count the devices ENV already makes visible."""
    given = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if "CUDA_VISIBLE_DEVICES" in env and len(given) > max(group):
        return ",".join(given[i] for i in group)
    return ",".join(str(i) for i in group)


# ---------------------------------------------------------------------------
# The other two checks


@dataclass
class CheckResult:
    """The installed-files check or the regression tests: ok, what ran, the details."""

    name: str
    ok: bool | None  # None: not run (the reason in ``note``)
    note: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "note": self.note or None, **self.data}


def check_installed(lock: Lock, pin: str | None, python: str, store: Store, progress: Progress, *,
                    on_gpu: bool) -> CheckResult:
    """What ``status --installed`` checks (its core function), the kernel package's GPU check on a GPU."""
    from dsv4patch.delivery import (
        check_kernels_active,
        inspect_installed,
    )

    try:
        out = inspect_installed(lock, pin, python, store, progress)
    except Dsv4Error as exc:
        return CheckResult("installed", False, f"{type(exc).__name__}: {exc}")
    kernel = out.get("kernels") or {}
    if kernel.get("installed") and on_gpu:
        kernel["active"] = check_kernels_active(python, kernel["package"])
        out["ok"] = bool(out["ok"] and kernel["active"]["active"])
    bad = [f"{n}: {p['state']}" for n, p in out.get("patches", {}).items() if p["state"] not in ("present", "upstream")]
    note = "every patched file and the kernel library match the lock" if out["ok"] else "; ".join(
        bad + [str(n) for n in out.get("notes", [])])
    return CheckResult("installed", bool(out["ok"]), note, {"report": out})


def check_installed_sbom(python: str, *, on_gpu: bool, lock: Lock | None = None,
                         pin: str | None = None) -> tuple[CheckResult, dict[str, Any] | None]:
    """Without the lock's patch files: the installed vLLM against its own SBOM, and against ``lock``'s pin
    when a lock came without them (a URL): ``installed.check_from_sbom``.  Also the probe's vLLM."""
    from dsv4patch.delivery import (
        check_from_sbom,
        probe_installed,
    )

    try:
        vllm = probe_installed(python, "").get("vllm")
        rep = check_from_sbom(python=python, lock=lock, pin_name=pin)
    except Dsv4Error as exc:
        return CheckResult("installed", False, f"{type(exc).__name__}: {exc}"), None
    if vllm is None:
        return CheckResult("installed", False, f"vLLM is not installed in {python}"), None
    out = rep.to_json()
    bad = [f"{n}: {p['state']}" for n, p in rep.patches.items() if p["state"] not in ("present", "not-shipped")]
    note = "; ".join(rep.notes[1:]) if rep.ok else "; ".join(bad + rep.notes[2:])
    if not on_gpu and rep.ok:
        note += " (kernels not checked active: no GPU)"
    return CheckResult("installed", rep.ok, note, {"report": {**out, "source": "sbom"}}), vllm


def series_tests(lock: Lock, pin: str, store: Store, progress: Progress) -> dict[str, bytes]:
    """The series' regression test files (``tests/**/test_*.py`` the patches add or change), patched content."""
    from dsv4patch.series import patched_tree

    tree = patched_tree(lock, lock.pin(pin), store, progress)
    return {rel: ch.patched for rel, ch in tree.by_path().items()
            if rel.startswith("tests/") and rel.endswith(".py") and ch.patched is not None
            and Path(rel).name.startswith("test_")}


def regression_check(result: RegressionResult, node: Node | None) -> CheckResult:
    """The regression run as a check: ok, a one-line note (where it ran, the counts, the first failures)."""
    counts = result.counts()
    gpu = node.gpu if node is not None else None
    where = (f"on {gpu.name}" if result.on_gpu and gpu is not None else
             "on the GPU" if result.on_gpu else "on CPU (Triton interpreter; the kernel tests skip without a GPU)")
    note = (f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped in "
            f"{len(result.files)} file(s), each in its own process, {where}")
    failures = result.failures()
    if failures:
        note += "; " + "; ".join(failures[:3]) + (f"; and {len(failures) - 3} more" if len(failures) > 3 else "")
    return CheckResult("regression", result.ok, note, result.to_json())


def check_regression(lock: Lock | None, pin: str | None, python: str, store: Store | None, progress: Progress, *,
                     work: Path, on_gpu: bool, deadline: float = 1200.0, env: dict[str, str] | None = None,
                     node: Node | None = None, vllm: dict[str, Any] | None = None) -> CheckResult:
    """The series' own regression tests (its patched ``tests/`` files), run against the installed vLLM.

    The test files come from the lock's patched tree, or without a lock from
    the installed wheel's SBOM (``vllm``: the probe's answer).  They are
    written into the work directory without vLLM's source beside them, so
    ``import vllm`` is the installed package; each file runs in its own
    pytest process (:mod:`.regression`), on the GPU when there is one.
    """
    from dsv4patch.delivery import sbom_tests_for

    try:
        if lock is not None and store is not None and pin is not None:
            tests = series_tests(lock, pin, store, progress)
        elif vllm is not None:
            tests = sbom_tests_for(vllm)
        else:
            return CheckResult("regression", None, "no lock and no installed dsv4patch SBOM: the series' tests "
                               "are not known here")
    except Dsv4Error as exc:
        return CheckResult("regression", False, f"{type(exc).__name__}: {exc}")
    if not tests:
        return CheckResult("regression", None, "the series adds no regression test")
    if node is not None and node.pytest is None:
        return CheckResult("regression", None, f"pytest is not installed in {python}: the series' tests cannot "
                           "run there (install pytest into that environment to run them)")
    with progress.task(f"regression: {len(tests)} test file(s), each in its own pytest process "
                       f"({'GPU' if on_gpu else 'CPU'})", len(tests), unit="files") as task:
        result = run_regression(tests, python=python, work=work, on_gpu=on_gpu, deadline=deadline,
                                base_env=child_env(env), done=lambda: task.advance(1))
    return regression_check(result, node)


def default_child(python: str) -> list[str]:
    """The engine child under PYTHON: ``child.py`` copied out of the package (its ``model.py`` beside it).

    Copied, so the environment under test runs two standalone files and never
    imports dsv4patch (or this environment's site-packages) at all.
    """
    tmp = Path(tempfile.mkdtemp(prefix="dsv4patch-selftest-child-"))
    for name in ("child.py", "model.py"):
        shutil.copyfile(CHILD.parent / name, tmp / name)
    return [python, "-X", "faulthandler", str(tmp / "child.py")]


def python_of(given: str | None, env_python: str | None = None) -> str:
    """The interpreter whose vLLM is checked: ``given`` (``--python``), else ``env_python``
    (``$DSV4PATCH_VLLM_PYTHON``, read by the command), else the one running dsv4patch."""
    return given or env_python or sys.executable


def probe_node(child: list[str], *, deadline: float = 180.0) -> Node:
    """``child.py --probe`` under the environment's interpreter: what it has (:mod:`.node`)."""
    try:
        fin = childproc.run([*child, "--probe"], deadline=deadline, what="the environment probe",
                            env=child_env(), keep=256 << 10, flood=8 << 20)
    except ChildError as exc:
        raise ProbeError(f"{child[0]}: {exc}") from None
    if fin.returncode != 0:
        raise ProbeError(f"{child[0]}: not a working Python interpreter ({fin.status()}: {fin.last_line()})")
    try:
        return parse_probe(fin.stdout)
    except ProbeError as exc:
        raise ProbeError(f"{child[0]}: {exc}") from None


# ---------------------------------------------------------------------------
# The whole self-test


@dataclass
class Report:
    """Everything ``dsv4patch selftest`` found, and the exit code it implies."""

    python: str
    gpu: bool
    force_sm120_topk: bool
    checks: list[CheckResult]
    engines: list[EngineRun]
    seconds: float
    node: Node | None = None
    sizing: plan.Sizing | None = None
    topology: plan.Topology = field(default_factory=plan.Topology)

    @property
    def cases(self) -> list[CaseResult]:
        return [c for r in self.engines for c in r.cases]

    @property
    def ok(self) -> bool:
        checks_ok = all(c.ok is not False for c in self.checks)
        return checks_ok and not any(c.verdict in FAILING for c in self.cases) and \
            not any(c.verdict == "not-run" for c in self.cases)

    def counts(self) -> dict[str, int]:
        return {v: sum(1 for c in self.cases if c.verdict == v) for v in VERDICTS}

    def min_gap(self) -> float | None:
        gaps = [c.min_gap for c in self.cases if c.min_gap is not None]
        return min(gaps) if gaps else None

    def not_proven(self) -> list[str]:
        """What this run did not prove here, and why (never hidden behind exit 0)."""
        out = []
        needs = [c.case for c in self.cases if c.verdict == "needs-gpu"]
        if needs:
            out.append(f"{len(needs)} engine case(s) need a CUDA GPU (none here)")
        for c in self.checks:
            if c.ok is None:
                out.append(f"{c.name}: {c.note}")
            elif c.name == "regression" and c.data.get("counts", {}).get("skipped"):
                out.append(f"regression: {c.data['counts']['skipped']} test(s) skipped")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "python": self.python, "gpu": self.gpu, "force_sm120_topk": self.force_sm120_topk,
            "topology": self.topology.to_json(),
            "design": {"vocab": tiny.VOCAB_SIZE, "cycle_len": tiny.CYCLE_LEN, "accept": len(tiny.DESIGN.accept),
                       "gain_nats": tiny.GAIN, "post_mix": round(2.0 / (1.0 + 2.718281828459045 ** -tiny.POST_LOGIT), 8)},
            "node": None if self.node is None else self.node.to_json(),
            "sizing": None if self.sizing is None else self.sizing.to_json(),
            "checks": [c.to_json() for c in self.checks],
            "engines": [r.to_json() for r in self.engines],
            "cases": [c.to_json() for c in self.cases],
            "counts": self.counts(), "min_gap": self.min_gap(), "not_proven": self.not_proven(),
            "seconds": round(self.seconds, 1),
        }


CHECK_NAMES = ("installed", "regression")


def _unrun(cases: list[Case], verdict: str, why: str) -> list[EngineRun]:
    """Every engine of CASES, its cases all VERDICT for the same reason (nothing started)."""
    runs: dict[str, EngineRun] = {}
    for c in cases:
        run = runs.setdefault(c.engine.name, EngineRun(c.engine, "not-run", why, None, None, [], [], ""))
        run.cases.append(CaseResult(c.name, c.engine.name, c.prompts.name, verdict, why))
    return list(runs.values())


def _regression_cannot_run(node: Node) -> str | None:
    """Why the regression tests cannot run in the probed environment (None: they can)."""
    missing = [name for name, version in (("vLLM", node.vllm), ("torch", node.torch)) if version is None]
    return " and ".join(missing) + (" is" if len(missing) == 1 else " are") + " not installed" if missing else None


def run_selftest(
    *,
    lock: Lock | None,  # None, or a lock without its patches (store None): the checks use the installed SBOM
    pin: str | None,
    python: str,
    store: Store | None,
    progress: Progress,
    checks: tuple[str, ...],
    cases: list[Case],
    work: Path,
    deadlines: Deadlines,
    parallel: int = 1,
    force_sm120_topk: bool = False,
    child: list[str] | None = None,
    kv_cache_gib: float = 6.0,
    gpu: bool | None = None,
    topology: plan.Topology | None = None,
) -> Report:
    """The environment probed, then the selected checks beside the engine cases; the report.

    The probe (:func:`probe_node`) decides what can run: without a CUDA
    device the engine cases are ``needs-gpu`` at once and the regression tests
    run on CPU; with one, the engines are sized from its free memory
    (:func:`.plan.size_engines`).  The checks run in a thread of their own
    while the engines start: they share nothing with the engines but the GPU,
    and on a node whose engines need minutes to compile kernels they cost no
    time.

    TOPOLOGY spreads every engine over tensor x pipeline parallel GPUs; a node
    that sees fewer GPUs than one engine needs is refused before anything
    starts (:func:`.plan.check_gpus`, exit 2).
    """
    t0 = time.monotonic()
    topology = (topology or plan.Topology()).validated()
    child = child or default_child(python)
    node = probe_node(child)
    if cases:
        plan.check_gpus(topology, node)
    on_gpu = node.gpu is not None if gpu is None else gpu
    results: list[CheckResult] = []

    def not_here() -> bool:
        """The regression tests cannot run in this environment: said at once (not run, why), not as
        one pytest crash per test file."""
        missing = _regression_cannot_run(node)
        if missing:
            results.append(CheckResult("regression", None, f"not run: {missing} in {python} (the series' "
                                       "tests import the installed vLLM and torch)"))
        return missing is not None

    def run_checks() -> None:
        if not checks:
            return
        if lock is None or store is None:  # no lock (or one without its patches): the installed wheel's SBOM
            vllm = None
            if "installed" in checks:
                inst, vllm = check_installed_sbom(python, on_gpu=on_gpu, lock=lock, pin=pin)
                results.append(inst)
            if "regression" in checks:
                if vllm is None:
                    from dsv4patch.delivery import (
                        pick_installed_pin,
                        probe_installed,
                    )

                    vllm = probe_installed(python, "").get("vllm")
                if vllm is not None and not_here():
                    return
                budget = max(30.0, t0 + deadlines.total - 30.0 - time.monotonic())
                results.append(check_regression(None, None, python, None, progress, work=work, on_gpu=on_gpu,
                                                deadline=budget, node=node, vllm=vllm))
            return
        chosen_pin = pin
        if "installed" in checks:
            inst = check_installed(lock, pin, python, store, progress, on_gpu=on_gpu)
            results.append(inst)
            chosen_pin = chosen_pin or (inst.data.get("report") or {}).get("pin")
        if "regression" in checks and not not_here():
            if chosen_pin is None:
                from dsv4patch.delivery import (
                    pick_installed_pin,
                    probe_installed,
                )

                try:
                    chosen_pin = pick_installed_pin(lock, None, node.vllm).name
                except Dsv4Error as exc:
                    results.append(CheckResult("regression", False, f"{type(exc).__name__}: {exc}"))
                    return
            # beside the engines: what is left of the whole run
            budget = max(30.0, t0 + deadlines.total - 30.0 - time.monotonic())
            results.append(check_regression(lock, chosen_pin, python, store, progress, work=work, on_gpu=on_gpu,
                                            deadline=budget, node=node))

    def guarded() -> None:
        try:
            run_checks()
        except Exception as exc:  # a bug in a check must not pass for success: it fails, named
            results.append(CheckResult("installed" if not results and "installed" in checks else "regression",
                                       False, f"internal error: {type(exc).__name__}: {exc}"))

    thread = threading.Thread(target=guarded, name="selftest-checks", daemon=True)
    thread.start()
    runs: list[EngineRun] = []
    sizing: plan.Sizing | None = None
    if cases and not on_gpu:
        # Said at once (the checks that can run here go on): not after the checks' minutes.
        progress.note(f"{python}: {node.describe()}: the {len(cases)} engine case(s) need a CUDA GPU and are "
                      f"not run here; running the checks: {', '.join(checks) or 'none selected'}")
        runs = _unrun(cases, "needs-gpu", f"needs a CUDA GPU; {python} sees none ({node.describe()})")
    elif cases and node.vllm is None:
        runs = _unrun(cases, "not-run", f"vLLM is not installed in {python}")
    elif cases:
        if node.devices:
            sizing = plan.size_topology(node.devices, topology, kv_cache_bytes=int(kv_cache_gib * 2**30),
                                        most=parallel)
        if sizing is not None and sizing.parallel == 0:
            runs = _unrun(cases, "not-run", f"not enough GPU memory: {sizing.describe()}")
        else:
            runs = run_cases(cases, child=child, work=work, deadlines=deadlines,
                             parallel=sizing.parallel if sizing is not None else parallel, kv_cache_gib=kv_cache_gib,
                             gpu_memory_utilization=sizing.gpu_memory_utilization if sizing is not None else 0.25,
                             topology=topology,
                             groups=sizing.groups if sizing is not None and topology.gpus > 1 else None)
    thread.join()
    results.sort(key=lambda c: CHECK_NAMES.index(c.name))
    return Report(python, on_gpu, force_sm120_topk, results, runs, time.monotonic() - t0, node, sizing, topology)
