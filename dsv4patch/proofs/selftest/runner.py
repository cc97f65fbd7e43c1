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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4patch import childproc
from dsv4patch.errors import ChildError, Dsv4Error
from dsv4patch.proofs.selftest import model as tiny
from dsv4patch.proofs.selftest import plan, probe
from dsv4patch.proofs.selftest.node import ProbeError, parse_probe
from dsv4patch.proofs.selftest.oracle import (
    Acceptance,
    expected_acceptance,
    expected_tokens,
    first_difference,
    min_gap,
)
from dsv4patch.proofs.selftest.regression import run_regression
from dsv4patch.records import frozen
from dsv4patch.safeio import create_exclusive

if TYPE_CHECKING:
    from dsv4patch.delivery import ProbedVllm
    from dsv4patch.pins import Context, Lock
    from dsv4patch.progress import Progress
    from dsv4patch.proofs.selftest.cases import Case, Engine, PromptSet
    from dsv4patch.proofs.selftest.node import Node
    from dsv4patch.proofs.selftest.oracle import (
        Difference,
    )
    from dsv4patch.proofs.selftest.probe import HangEvidence
    from dsv4patch.proofs.selftest.regression import RegressionResult

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


@frozen
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


START_STAGE = "engine start"  # the stage an engine is in until it is ready (its own start deadline)
# Seconds of the run's deadline an engine needs left to be started; with less it is not run ("no time left").
MIN_ENGINE_SECONDS = 10.0


@dataclass
class _Watch:
    """Where an engine's child is, as its events say, and how the watch over it ended.

    A stage (engine start, one prompt set, between sets) has its own deadline,
    counted from the event that began it; ``hung`` is set when one passed.
    """

    deadlines: EngineDeadlines
    stage: str = START_STAGE
    stage_start: float = field(default_factory=time.monotonic)
    deadline: float = 0.0
    batch: str = ""  # the batch when the stage last changed shape (step events)
    seen: int = 0  # events already followed
    ready_seen: bool = False
    hung: str | None = None
    cut: bool = False  # ended by the run's deadline, not the stage's
    stage_label: str = START_STAGE
    evidence: HangEvidence | None = None

    def __post_init__(self) -> None:
        self.deadline = self.deadlines.start

    def enter(self, stage: str, deadline: float) -> None:
        self.stage, self.stage_start, self.deadline = stage, time.monotonic(), deadline

    def follow(self, events: list[dict[str, Any]], psets: list[PromptSet],
               on_ready: Callable[[float | None], None] | None) -> None:
        """The stage the new events put the child in (and the warm engines released at its readiness)."""
        for ev in events[self.seen:]:
            kind = ev["event"]
            if kind == "step":
                self.batch = f"{ev['running']} running, {ev['waiting']} waiting, {ev['tokens']} tokens generated"
            elif kind == "engine_ready":
                self.ready_seen = True
                self.enter("between prompt sets", self.deadlines.case)
                if on_ready is not None:
                    on_ready(float(ev["t"]) - float(events[0]["t"]))
            elif kind == "case_start":
                first = bool(psets) and ev.get("case") == psets[0].name
                self.enter(f"prompt set {ev.get('case')}",
                           self.deadlines.first_case if first else self.deadlines.case)
                self.batch = ""
            elif kind == "case_done":
                self.enter("between prompt sets", self.deadlines.case)
        self.seen = len(events)


@frozen
class _EngineFiles:
    """An engine child's files in the work directory, named after its engine."""

    work: Path
    tag: str

    def path(self, suffix: str) -> Path:
        return self.work / f"{self.tag}.{suffix}"


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
    files = _EngineFiles(work, engine.name)
    full = {**spec, "engine": {**engine.to_json(), "speculative_config": engine.speculative_config()},
            "prompt_sets": [p.to_json() for p in psets], "watchdog": deadlines.watchdog()}
    for path, text in ((files.path("spec.json"), json.dumps(full)), (files.path("events"), ""),
                       (files.path("stacks.txt"), "")):
        create_exclusive(path, text)
    reader = EventReader(files.path("events"))
    with childproc.Child([*child, str(files.path("spec.json")), str(files.path("events")),
                          str(files.path("stacks.txt"))], what=f"engine {engine.name}",
                         log=files.path("log"), cwd=work, env=env) as proc:
        watch = _Watch(deadlines)
        _watch_child(proc, reader, watch, psets, files, stop_at=stop_at, on_ready=on_ready, poll=poll)
        fin = proc.finish()  # the whole tree: no straggler keeps the GPU
    if on_ready is not None and not watch.ready_seen:
        on_ready(None)  # the engines waiting for this one's warm caches may start anyway
    return _engine_run(engine, psets, reader, watch, fin, files)


def _watch_child(proc: childproc.Child, reader: EventReader, watch: _Watch, psets: list[PromptSet],
                 files: _EngineFiles, *, stop_at: float, on_ready: Callable[[float | None], None] | None,
                 poll: float) -> None:
    """Follow the child's events until it ends, its events go wrong, or a deadline passes."""
    while proc.poll() is None:
        watch.follow(reader.read(), psets, on_ready)
        if reader.error:
            break
        now = time.monotonic()
        if now > stop_at or now - watch.stage_start > watch.deadline:
            _stop_watch(proc, watch, files, cut=now > stop_at)
            break
        time.sleep(poll)


def _stop_watch(proc: childproc.Child, watch: _Watch, files: _EngineFiles, *, cut: bool) -> None:
    """A deadline passed: the run's (``cut``), or the stage's: a hang, with its evidence collected
    while the child is still alive (stacks, the last log line, the hang probe)."""
    watch.cut = cut
    watch.stage_label = watch.stage
    if cut:
        watch.hung = f"cut by the run's deadline during {watch.stage}"
        return
    last = probe.last_log_line(proc.tail(64 << 10))
    what = "not ready within" if watch.stage == START_STAGE else "no progress within"
    watch.hung = (f"{watch.stage}: {what} {watch.deadline:.0f} s"
                  + (f" ({watch.batch})" if watch.batch else "") + (f" (last logged: {last})" if last else ""))
    watch.evidence = probe.collect(proc, stacks=files.path("stacks.txt"), out=files.path("probe.txt"))


def _refused_or(outcome: str, detail: str, ready: dict[str, Any] | None) -> str:
    """A failure at engine start that names a platform's documented refusal is ``refused``."""
    return "refused" if ready is None and any(r in detail for r in REFUSALS) else outcome


def _outcome(reader: EventReader, events: list[dict[str, Any]], watch: _Watch, fin: childproc.Finished,
             log_text: str) -> tuple[str, str]:
    """How the engine ended (done, crash, refused, hang, not-run) and the detail that says why."""
    ready = next((e for e in events if e["event"] == "engine_ready"), None)
    err = next((str(e.get("error", "")) for e in events if e["event"] == "error"), "")
    finished = any(e["event"] == "child_done" for e in events)
    evidence = watch.evidence
    if reader.error:
        return "crash", reader.error
    if err and not finished:  # it failed first; a deadline that fired later is not the cause
        detail = f"{fin.status()}: {err}"
        return _refused_or("crash", detail, ready), detail
    if watch.cut:
        return "not-run", watch.hung or ""
    if watch.hung is not None and evidence is not None and evidence.still_compiling:
        # not a hang: the engine was compiling kernels on an idle GPU (a cold node's JIT caches)
        return "not-run", (f"{watch.stage_label}: still compiling kernels ({evidence.compiler}) on an idle GPU "
                           f"when the deadline passed: a cold node, not a hang; {evidence.describe()}")
    if watch.hung is not None and evidence is not None and watch.stage_label == START_STAGE and \
            evidence.working_on_cpu:
        # not a hang either: the start was still working on the host (H200, five engines starting at once: DSpark's
        # graph capture in vLLM's gc.collect() past 180 s; alone on the same caches it started in 87 s)
        return "not-run", (f"{watch.hung}: still working on the CPU on an idle GPU when its start deadline passed, "
                           f"a slow start, not a hang; {evidence.describe()}")
    if watch.hung is not None:
        return "hang", watch.hung + (f"; {evidence.describe()}" if evidence and evidence.describe() else "")
    if fin.returncode != 0 or not finished:
        detail = f"{fin.status()}: {err or error_line(log_text)}"
        return _refused_or("crash", detail, ready), detail
    return "done", ""


def _case_results(engine: Engine, psets: list[PromptSet], events: list[dict[str, Any]], outcome: str,
                  detail: str) -> list[CaseResult]:
    """Every prompt set of the engine: judged when it finished, else the engine's end marks it."""
    ready = next((e for e in events if e["event"] == "engine_ready"), None)
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
    return cases


def _engine_run(engine: Engine, psets: list[PromptSet], reader: EventReader, watch: _Watch,
                fin: childproc.Finished, files: _EngineFiles) -> EngineRun:
    """The finished child as a record: its outcome, its cases, and what its events said about it."""
    events = reader.read()
    log_text = probe.read_tail(files.path("log"), 256 << 10)
    outcome, detail = _outcome(reader, events, watch, fin, log_text)
    ready = next((e for e in events if e["event"] == "engine_ready"), None)
    start_seconds = round(float(ready["t"]) - float(events[0]["t"]), 1) if ready is not None and events else None
    loaded = [{"model": e.get("model"), "set": e.get("set"), "finalize": e.get("finalize"),
               **{k: e[k] for k in ("tp_rank", "pp_rank") if isinstance(e.get(k), int)}}
              for e in events if e["event"] == "loaded"]
    reserved = int(ready.get("torch_reserved_bytes", 0)) if ready is not None and isinstance(
        ready.get("torch_reserved_bytes"), int) else None
    ran = None if ready is None or ready.get("tensor_parallel_size") is None else {
        "tensor_parallel_size": int(ready["tensor_parallel_size"]),
        "pipeline_parallel_size": int(ready.get("pipeline_parallel_size") or 1)}
    return EngineRun(engine, outcome, detail, start_seconds,
                     next((e.get("data") for e in events if e["event"] == "fingerprint"), None), loaded,
                     _case_results(engine, psets, events, outcome, detail), str(files.path("log")),
                     stage=watch.stage_label if watch.hung else "", start_deadline=watch.deadlines.start,
                     stacks=str(files.path("stacks.txt")), evidence=watch.evidence, gpu_reserved_bytes=reserved,
                     exit=fin.status(), topology=ran,
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


@dataclass
class _Launch:
    """What run_cases' engine threads share: the run's plan and clock, the first engine's readiness
    (it releases the others), the free GPU groups, and the runs so far."""

    child: list[str]
    work: Path
    spec: dict[str, Any]
    deadlines: Deadlines
    env: dict[str, str]
    groups: tuple[tuple[int, ...], ...] | None
    stop_at: float  # the run's deadline (monotonic): counted from the self-test's start, not the engines'
    t0: float = field(default_factory=time.monotonic)
    free_groups: queue.Queue[tuple[int, ...]] = field(default_factory=queue.Queue)
    first_ready: threading.Event = field(default_factory=threading.Event)
    first_start: float | None = None  # the first engine's measured start (None: it never became ready)
    first_failed: str | None = None  # the first engine's launch raised (the others are not started)
    runs: dict[str, EngineRun] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for g in self.groups or ():
            self.free_groups.put(g)

    def released(self, seconds: float | None) -> None:
        """The first engine is ready (or ended): the others may start, with its start measured."""
        self.first_start = seconds
        self.first_ready.set()

    def one(self, item: tuple[Engine, list[PromptSet]], first: bool) -> None:
        """One engine's thread: wait for the first engine's readiness, take a GPU group, run it.

        The first engine's thread releases the others however it ends: when its launch raises (its
        child cannot be started, its files cannot be made) they are marked not run at once, instead
        of waiting for a readiness that never comes until the run's deadline."""
        if not first:
            self.first_ready.wait(max(0.0, self.stop_at - time.monotonic()))
            self._start(*item, first=False)
            return
        try:
            self._start(*item, first=True)
        except BaseException as exc:
            self.first_failed = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            if not self.first_ready.is_set():
                self.released(None)

    def _start(self, engine: Engine, psets: list[PromptSet], *, first: bool) -> None:
        why = None
        if self.first_failed is not None:
            why = f"not started: the first engine's launch failed ({self.first_failed})"
        elif time.monotonic() > self.stop_at - MIN_ENGINE_SECONDS:
            why = "no time left (the run's deadline)"
        if why is not None:
            self.runs[engine.name] = EngineRun(engine, "not-run", why, None, None, [], [
                CaseResult(f"{engine.name}/{p.name}", engine.name, p.name, "not-run", why) for p in psets], "")
            return
        start = self.deadlines.start if first else plan.warm_start_deadline(self.deadlines.start, self.first_start)
        ed = EngineDeadlines(start=start, first_case=self.deadlines.first_case, case=self.deadlines.case)
        group = self.free_groups.get() if self.groups else None  # as many threads as groups: never waits long
        try:
            launched = time.monotonic() - self.t0
            run = run_engine(engine, psets, child=self.child, spec=self.spec, work=self.work, deadlines=ed,
                             stop_at=self.stop_at, env=self.env if group is None else {
                                 **self.env, "CUDA_VISIBLE_DEVICES": visible(group, self.env)},
                             on_ready=self.released if first else None)
        finally:
            if group is not None:
                self.free_groups.put(group)
        run.launched_at = launched
        run.devices = group
        self.runs[engine.name] = run


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
    stop_at: float | None = None,
) -> list[EngineRun]:
    """Every engine the cases need, in :func:`.plan.engine_order`: the first alone until it is ready, then
    the rest PARALLEL at once, each with a warm start deadline from the first one's measured start.

    The first engine fills the JIT caches (TileLang, DeepGEMM, Triton) the
    others then find; its readiness (or its end) releases them.  Each engine
    is spread as TOPOLOGY (one GPU by default); with GROUPS (the probe's device
    indices, :func:`.plan.size_topology`) each engine running at once holds
    one group alone, given to it as ``CUDA_VISIBLE_DEVICES``.  STOP_AT (monotonic
    seconds) is the run's deadline when the run began before the engines (the
    probe, the model's files): else ``deadlines.total`` from now.
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
    launch = _Launch(child, work, spec, deadlines, child_env(env), groups,
                     stop_at=time.monotonic() + deadlines.total if stop_at is None else stop_at)
    order = [by_engine[e.name] for e in plan.engine_order([e for e, _ in by_engine.values()])]
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(groups)) if groups else parallel)) as pool:
        futures = [pool.submit(launch.one, item, i == 0) for i, item in enumerate(order)]
        for f in futures:
            f.result()
    return [launch.runs[name] for name in by_engine]  # in the cases' order; ``launched_at`` says when each ran


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


def check_installed(pin: str | None, python: str, *, ctx: Context, on_gpu: bool) -> CheckResult:
    """What ``status --installed`` checks (its core function), the kernel package's GPU check on a GPU."""
    from dsv4patch.delivery import (
        check_kernels_active,
        inspect_installed,
    )

    try:
        rep = inspect_installed(pin, python, ctx=ctx)
    except Dsv4Error as exc:
        return CheckResult("installed", False, f"{type(exc).__name__}: {exc}")
    kernel = rep.kernels
    if kernel is not None and kernel.installed and on_gpu:
        active = check_kernels_active(python, kernel.package)
        rep = replace(rep, kernels=replace(kernel, active=active), ok=bool(rep.ok and active.active))
    bad = [f"{n}: {p.state}" for n, p in rep.patches.items() if p.state not in ("present", "upstream")]
    note = "every patched file and the kernel library match the lock" if rep.ok else "; ".join(
        bad + [str(n) for n in rep.notes])
    out = rep.to_json()
    if rep.installed is not None:  # the SBOM's text too, as installed
        out["sbom_document"] = rep.sbom_document
    return CheckResult("installed", rep.ok, note, {"report": out})


def check_installed_sbom(python: str, *, on_gpu: bool, lock: Lock | None = None,
                         pin: str | None = None) -> tuple[CheckResult, ProbedVllm | None]:
    """Without the lock's patch files: the installed vLLM against its own SBOM, and against ``lock``'s pin
    when a lock came without them (a URL): ``installed.check_from_sbom``.  Also the probe's vLLM."""
    from dsv4patch.delivery import (
        check_from_sbom,
        probe_installed,
    )

    try:
        vllm = probe_installed(python, "").vllm
        rep = check_from_sbom(python=python, lock=lock, pin_name=pin)
    except Dsv4Error as exc:
        return CheckResult("installed", False, f"{type(exc).__name__}: {exc}"), None
    if vllm is None:
        return CheckResult("installed", False, f"vLLM is not installed in {python}"), None
    out = rep.to_json()
    bad = [f"{n}: {p.state}" for n, p in rep.patches.items() if p.state not in ("present", "not-shipped")]
    note = "; ".join(rep.notes[1:]) if rep.ok else "; ".join(bad + rep.notes[2:])
    if not on_gpu and rep.ok:
        note += " (kernels not checked active: no GPU)"
    return CheckResult("installed", rep.ok, note, {"report": {**out, "source": "sbom"}}), vllm


def series_tests(pin: str, *, ctx: Context) -> dict[str, bytes]:
    """The series' regression test files (``tests/**/test_*.py`` the patches add or change), patched content."""
    from dsv4patch.series import patched_tree

    tree = patched_tree(ctx=ctx, pin=ctx.lock.pin(pin))
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


def check_regression(pin: str | None, python: str, *, ctx: Context | None, progress: Progress,
                     work: Path, on_gpu: bool, deadline: float = 1200.0, env: dict[str, str] | None = None,
                     node: Node | None = None, vllm: ProbedVllm | None = None) -> CheckResult:
    """The series' own regression tests (its patched ``tests/`` files), run against the installed vLLM.

    The test files come from the patched tree of the context's lock, or without one
    (``ctx`` None) from the installed wheel's SBOM (``vllm``: the probe's answer); ``progress``
    is the run's (``ctx.progress`` when there is a context).  They are
    written into the work directory without vLLM's source beside them, so
    ``import vllm`` is the installed package; each file runs in its own
    pytest process (:mod:`.regression`), on the GPU when there is one.
    """
    from dsv4patch.delivery import sbom_tests_for

    try:
        if ctx is not None and pin is not None:
            tests = series_tests(pin, ctx=ctx)
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


PROBE_DEADLINE = 180.0  # seconds for ``child.py --probe`` (imports torch and vLLM, asks CUDA), at most


def probe_node(child: list[str], *, deadline: float = PROBE_DEADLINE) -> Node:
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


@dataclass
class _SelftestChecks:
    """The selected checks (installed files, regression tests) of one self-test, run in a thread of their
    own beside the engines; ``results`` is what they found (the thread appends, the caller sorts)."""

    ctx: Context | None  # the lock with its patches and the cache; None: the checks use the installed SBOM
    sbom_lock: Lock | None  # without ctx: a lock without its patches (a URL) whose pin the SBOM is matched to
    pin: str | None
    python: str
    progress: Progress
    checks: tuple[str, ...]
    work: Path
    deadlines: Deadlines
    node: Node
    on_gpu: bool
    t0: float
    results: list[CheckResult] = field(default_factory=list)

    def budget(self) -> float:
        """The regression tests' deadline: what is left of the whole run (they run beside the engines)."""
        return max(30.0, self.t0 + self.deadlines.total - 30.0 - time.monotonic())

    def not_here(self) -> bool:
        """The regression tests cannot run in this environment: said at once (not run, why), not as
        one pytest crash per test file."""
        missing = _regression_cannot_run(self.node)
        if missing:
            self.results.append(CheckResult("regression", None, f"not run: {missing} in {self.python} (the "
                                            "series' tests import the installed vLLM and torch)"))
        return missing is not None

    def guarded(self) -> None:
        """The thread's body: a bug in a check must not pass for success: it fails, named."""
        try:
            self.run()
        except Exception as exc:
            self.results.append(CheckResult("installed" if not self.results and "installed" in self.checks
                                            else "regression", False, f"internal error: {type(exc).__name__}: {exc}"))

    def run(self) -> None:
        if not self.checks:
            return
        if self.ctx is None:  # no lock (or one without its patches): the installed SBOM
            self._from_sbom()
        else:
            self._from_lock(self.ctx)

    def _from_sbom(self) -> None:
        """The checks against the installed wheel's SBOM (and a patch-less lock's pin, when given)."""
        vllm = None
        if "installed" in self.checks:
            inst, vllm = check_installed_sbom(self.python, on_gpu=self.on_gpu, lock=self.sbom_lock, pin=self.pin)
            self.results.append(inst)
        if "regression" not in self.checks:
            return
        if vllm is None:
            from dsv4patch.delivery import probe_installed

            vllm = probe_installed(self.python, "").vllm
        if vllm is not None and self.not_here():
            return
        self.results.append(check_regression(None, self.python, ctx=None, progress=self.progress, work=self.work,
                                             on_gpu=self.on_gpu, deadline=self.budget(), node=self.node, vllm=vllm))

    def _from_lock(self, ctx: Context) -> None:
        """The checks against the lock's pin: the one given, else the installed one's."""
        chosen_pin = self.pin
        if "installed" in self.checks:
            inst = check_installed(self.pin, self.python, ctx=ctx, on_gpu=self.on_gpu)
            self.results.append(inst)
            chosen_pin = chosen_pin or (inst.data.get("report") or {}).get("pin")
        if "regression" not in self.checks or self.not_here():
            return
        if chosen_pin is None:
            from dsv4patch.delivery import pick_installed_pin

            try:
                chosen_pin = pick_installed_pin(ctx.lock, None, self.node.vllm).name
            except Dsv4Error as exc:
                self.results.append(CheckResult("regression", False, f"{type(exc).__name__}: {exc}"))
                return
        self.results.append(check_regression(chosen_pin, self.python, ctx=ctx, progress=ctx.progress, work=self.work,
                                             on_gpu=self.on_gpu, deadline=self.budget(), node=self.node))


def run_selftest(
    *,
    ctx: Context | None,  # the lock with its patches and the cache; None: the checks use the installed SBOM
    sbom_lock: Lock | None = None,  # without ctx: a lock without its patches (a URL) the SBOM is matched to
    pin: str | None,
    python: str,
    progress: Progress,  # the run's (ctx.progress when there is a ctx)
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
    stop_at = t0 + deadlines.total  # every step below ends by it: the probe, the checks, the engines
    topology = (topology or plan.Topology()).validated()
    child = child or default_child(python)
    node = probe_node(child, deadline=max(1.0, min(PROBE_DEADLINE, stop_at - time.monotonic())))
    if cases:
        plan.check_gpus(topology, node)
    on_gpu = node.gpu is not None if gpu is None else gpu
    run_checks = _SelftestChecks(ctx, sbom_lock, pin, python, progress, checks, work, deadlines, node, on_gpu, t0)
    thread = threading.Thread(target=run_checks.guarded, name="selftest-checks", daemon=True)
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
        runs, sizing = _run_engines(cases, node, child=child, work=work, deadlines=deadlines, parallel=parallel,
                                    kv_cache_gib=kv_cache_gib, topology=topology, stop_at=stop_at)
    thread.join()
    results = run_checks.results
    results.sort(key=lambda c: CHECK_NAMES.index(c.name))
    return Report(python, on_gpu, force_sm120_topk, results, runs, time.monotonic() - t0, node, sizing, topology)


def _run_engines(cases: list[Case], node: Node, *, child: list[str], work: Path, deadlines: Deadlines,
                 parallel: int, kv_cache_gib: float, topology: plan.Topology, stop_at: float,
                 ) -> tuple[list[EngineRun], plan.Sizing | None]:
    """The engine cases on a GPU node: sized from its devices' free memory, then run (or not-run, why)."""
    sizing: plan.Sizing | None = None
    if node.devices:
        sizing = plan.size_topology(node.devices, topology, kv_cache_bytes=int(kv_cache_gib * 2**30), most=parallel)
    if sizing is not None and sizing.parallel == 0:
        return _unrun(cases, "not-run", f"not enough GPU memory: {sizing.describe()}"), sizing
    runs = run_cases(cases, child=child, work=work, deadlines=deadlines,
                     parallel=sizing.parallel if sizing is not None else parallel, kv_cache_gib=kv_cache_gib,
                     gpu_memory_utilization=sizing.gpu_memory_utilization if sizing is not None else 0.25,
                     topology=topology, groups=sizing.groups if sizing is not None and topology.gpus > 1 else None,
                     stop_at=stop_at)
    return runs, sizing
