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
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from dsv4patch.errors import Dsv4Error
from dsv4patch.selftest import model as tiny
from dsv4patch.selftest.cases import Case, Engine, PromptSet
from dsv4patch.selftest.oracle import (
    Acceptance,
    Difference,
    expected_acceptance,
    expected_tokens,
    first_difference,
    min_gap,
)

if TYPE_CHECKING:
    from dsv4patch.lock import Lock
    from dsv4patch.progress import Progress
    from dsv4patch.store import Store

CHILD = Path(__file__).resolve().parent / "child.py"
VERDICTS = ("pass", "differs", "hang", "crash", "refused", "inconclusive", "not-run")
FAILING = ("differs", "hang", "crash", "inconclusive")
# Engine-start errors that are a platform's documented refusal, not a crash (fix 5's SM120 gate names
# flashinfer#4380; vLLM's config refuses DSpark where it cannot run).
REFUSALS = ("flashinfer-ai/flashinfer#4380", "DSpark is not supported", "dspark is not supported")


@dataclass(frozen=True)
class Deadlines:
    """Seconds: the engine start, the first prompt set (JIT compiles new shapes), each later set, all."""

    start: float = 420.0
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

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case, "engine": self.engine, "prompt_set": self.prompt_set, "verdict": self.verdict,
            "error": self.error or None,
            "difference": None if self.difference is None else self.difference.to_json(),
            "min_gap": self.min_gap,
            "acceptance": None if self.acceptance is None else self.acceptance.to_json(),
            "expected_acceptance": None if self.expected_acceptance is None else self.expected_acceptance.to_json(),
            "not_top": self.not_top, "seconds": self.seconds,
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

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine.to_json(), "outcome": self.outcome, "detail": self.detail or None,
                "start_seconds": self.start_seconds, "fingerprint": self.fingerprint, "loaded": self.loaded,
                "log": self.log}


def read_events(path: Path, limit: int = 64 * 2**20) -> list[dict[str, Any]]:
    """The child's JSON-line events (a partly written last line is left for the next read)."""
    try:
        with path.open("rb") as fh:
            data = fh.read(limit)
    except FileNotFoundError:
        return []
    out: list[dict[str, Any]] = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict) and isinstance(ev.get("event"), str):
            out.append(ev)
    return out


def error_line(log: str) -> str:
    """The most telling error line of a child's log."""
    lines = [ln for ln in log.splitlines() if ln.strip()]
    keys = ("Error", "Exception", "error:", "Assertion", "CUDA", "Killed")
    picked = [ln for ln in lines if any(k in ln for k in keys) and "Traceback" not in ln]
    return (picked or lines or ["no output"])[-1].strip()[:500]


def judge(engine: Engine, pset: PromptSet, ev: dict[str, Any]) -> CaseResult:
    """The oracle's verdict on a finished prompt set (its ``case_done`` event)."""
    name = f"{engine.name}/{pset.name}"
    tokens = [[int(t) for t in row] for row in ev.get("tokens") or []]
    want = expected_tokens([list(p) for p in pset.prompts], list(pset.max_tokens))
    diff = first_difference(want, tokens)
    gaps = [[float(g) for g in row] for row in ev.get("gaps") or []]
    not_top = sum(len(r) for r in ev.get("not_top") or [])
    res = CaseResult(name, engine.name, pset.name, "pass", difference=diff, min_gap=min_gap(gaps),
                     not_top=not_top, seconds=ev.get("seconds"))
    if engine.method != "plain":
        spec = ev.get("spec") or {}
        res.acceptance = Acceptance(int(spec.get("num_draft_tokens", 0)), int(spec.get("num_accepted_tokens", 0)))
        res.expected_acceptance = expected_acceptance(engine.method, engine.k, want)
    if diff is not None:
        res.verdict = "differs"
        res.error = diff.describe()
    elif res.acceptance is not None and not res.acceptance.partial:
        res.verdict = "inconclusive"
        res.error = (f"drafts: {res.acceptance.accepted} of {res.acceptance.drafted} accepted; both accepted "
                     "and rejected drafts must occur")
    return res


def _probe_hang(pid: int, log: IO[str]) -> None:
    """Python stacks of a child that stopped making progress (SIGUSR1: faulthandler), into its log."""
    log.write("\n===== hang probe: python stacks (SIGUSR1) =====\n")
    log.flush()
    try:
        os.kill(pid, signal.SIGUSR1)
        time.sleep(2.0)
    except ProcessLookupError:
        pass


def run_engine(
    engine: Engine,
    psets: list[PromptSet],
    *,
    child: list[str],
    spec: dict[str, Any],
    work: Path,
    deadlines: Deadlines,
    stop_at: float,
    env: dict[str, str],
    on_ready: Callable[[], None] | None = None,
    poll: float = 0.2,
) -> EngineRun:
    """One engine's child under the deadlines; every prompt set judged or marked."""
    tag = engine.name
    spec_path, progress, log_path = work / f"{tag}.spec.json", work / f"{tag}.events", work / f"{tag}.log"
    full = {**spec, "engine": {**engine.to_json(), "speculative_config": engine.speculative_config()},
            "prompt_sets": [p.to_json() for p in psets]}
    spec_path.write_text(json.dumps(full), encoding="utf-8")
    progress.write_text("", encoding="utf-8")
    hung: str | None = None
    cut = False
    ready_seen = False
    with log_path.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen([*child, str(spec_path), str(progress)], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=str(work))
        stage, stage_start, deadline = "engine start", time.monotonic(), deadlines.start
        seen = 0
        while proc.poll() is None:
            events = read_events(progress)
            for ev in events[seen:]:
                kind = ev["event"]
                if kind == "engine_ready":
                    ready_seen = True
                    stage, stage_start, deadline = "between prompt sets", time.monotonic(), deadlines.case
                    if on_ready is not None:
                        on_ready()
                elif kind == "case_start":
                    first = bool(psets) and ev.get("case") == psets[0].name
                    stage, stage_start = f"prompt set {ev.get('case')}", time.monotonic()
                    deadline = deadlines.first_case if first else deadlines.case
                elif kind == "case_done":
                    stage, stage_start, deadline = "between prompt sets", time.monotonic(), deadlines.case
            seen = len(events)
            now = time.monotonic()
            if now > stop_at or now - stage_start > deadline:
                cut = now > stop_at
                hung = f"cut by --deadline during {stage}" if cut else f"{stage}: no progress within {deadline:.0f} s"
                if not cut:
                    _probe_hang(proc.pid, log)
                break
            time.sleep(poll)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the child's whole group: no straggler keeps the GPU
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    if on_ready is not None and not ready_seen:
        on_ready()  # the engines waiting for this one's warm caches may start anyway
    events = read_events(progress)
    log_text = log_path.read_text(encoding="utf-8", errors="replace")
    fingerprint = next((e.get("data") for e in events if e["event"] == "fingerprint"), None)
    loaded = [{"model": e.get("model"), "set": e.get("set"), "finalize": e.get("finalize")}
              for e in events if e["event"] == "loaded"]
    ready = next((e for e in events if e["event"] == "engine_ready"), None)
    start_seconds = round(float(ready["t"]) - float(events[0]["t"]), 1) if ready is not None and events else None
    err = next((str(e.get("error", "")) for e in events if e["event"] == "error"), "")
    finished = any(e["event"] == "child_done" for e in events)
    if cut:
        outcome, detail = "not-run", hung or ""
    elif hung is not None:
        outcome, detail = "hang", hung
    elif proc.returncode != 0 or not finished:
        outcome, detail = "crash", f"exit {proc.returncode}: {err or error_line(log_text)}"
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
    return EngineRun(engine, outcome, detail, start_seconds, fingerprint, loaded, cases, str(log_path))


def child_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The engine child's environment: offline, unbuffered; NVLink multicast stays off."""
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
) -> list[EngineRun]:
    """Every engine the cases need, at most PARALLEL at once; the first alone until it is ready.

    The first engine warms the JIT caches (TileLang, DeepGEMM, Triton) that the
    others then find; its readiness (or its end) releases them.
    """
    work.mkdir(parents=True, exist_ok=True)
    model_dir = tiny.write_model(work / "tiny-dsv4")
    spec = {"model": str(model_dir), "max_model_len": max_model_len,
            "kv_cache_bytes": int(kv_cache_gib * 2**30), "gpu_memory_utilization": gpu_memory_utilization}
    by_engine: dict[str, tuple[Engine, list[PromptSet]]] = {}
    for c in cases:
        by_engine.setdefault(c.engine.name, (c.engine, []))[1].append(c.prompts)
    stop_at = time.monotonic() + deadlines.total
    env = child_env(env)
    order = list(by_engine.values())
    runs: dict[str, EngineRun] = {}
    first_ready = threading.Event()

    def one(item: tuple[Engine, list[PromptSet]], first: bool) -> None:
        engine, psets = item
        if not first:
            first_ready.wait(max(0.0, stop_at - time.monotonic()))
        if time.monotonic() > stop_at - 10:
            runs[engine.name] = EngineRun(engine, "not-run", "no time left (--deadline)", None, None, [],
                                          [CaseResult(f"{engine.name}/{p.name}", engine.name, p.name, "not-run",
                                                      "no time left (--deadline)") for p in psets], "")
            return
        runs[engine.name] = run_engine(engine, psets, child=child, spec=spec, work=work, deadlines=deadlines,
                                       stop_at=stop_at, env=env, on_ready=first_ready.set if first else None)

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = [pool.submit(one, item, i == 0) for i, item in enumerate(order)]
        for f in futures:
            f.result()
    return [runs[e.name] for e, _ in order]


# ---------------------------------------------------------------------------
# The other two checks


def gpu_present() -> bool:
    return any(Path("/dev").glob("nvidia[0-9]*"))


@dataclass
class CheckResult:
    """The installed-files check or the regression tests: ok, what ran, the details."""

    name: str
    ok: bool | None  # None: not run (the reason in ``note``)
    note: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "note": self.note or None, **self.data}


def check_installed(lock: Lock, pin: str | None, python: str, store: Store, progress: Progress) -> CheckResult:
    """What ``status --installed`` checks (its core function), the kernel package's GPU check on a GPU."""
    from dsv4patch import installed

    try:
        out = installed.inspect(lock, pin, python, store, progress)
    except Dsv4Error as exc:
        return CheckResult("installed", False, f"{type(exc).__name__}: {exc}")
    kernel = out.get("kernels") or {}
    if kernel.get("installed") and gpu_present():
        kernel["active"] = installed.active_check(python, kernel["package"])
        out["ok"] = bool(out["ok"] and kernel["active"]["active"])
    bad = [f"{n}: {p['state']}" for n, p in out.get("patches", {}).items() if p["state"] not in ("present", "upstream")]
    note = "every patched file and the kernel library match the lock" if out["ok"] else "; ".join(
        bad + [str(n) for n in out.get("notes", [])])
    return CheckResult("installed", bool(out["ok"]), note, {"report": out})


def _junit(path: Path) -> dict[str, str]:
    outcomes: dict[str, str] = {}
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return outcomes
    for tc in root.iter("testcase"):
        node = f"{tc.get('classname', '')}::{tc.get('name', '')}"
        state = "passed"
        for child in tc:
            if child.tag in ("failure", "error"):
                state = "failed"
            elif child.tag == "skipped":
                state = "skipped"
        outcomes[node] = state
    return outcomes


def check_regression(lock: Lock, pin: str, python: str, store: Store, progress: Progress, *, gpu: bool,
                     timeout: float = 600.0, env: dict[str, str] | None = None) -> CheckResult:
    """The series' own regression tests (its patched ``tests/`` files), run against the installed vLLM.

    They are written into a scratch directory without vLLM's source beside
    them, so ``import vllm`` is the installed package.  Every file runs; the
    kernel tests skip themselves without CUDA (their own ``skipif``), so on a
    machine without a GPU the CPU tests decide and the skips are counted.
    """
    from dsv4patch import vllm_wheel

    try:
        tree = vllm_wheel.patched_tree(lock, lock.pin(pin), store, progress)
    except Dsv4Error as exc:
        return CheckResult("regression", False, f"{type(exc).__name__}: {exc}")
    tests = {rel: ch.patched for rel, ch in tree.by_path().items()
             if rel.startswith("tests/") and rel.endswith(".py") and ch.patched is not None
             and Path(rel).name.startswith("test_")}
    run = sorted(tests)
    if not run:
        return CheckResult("regression", None, "the series adds no regression test")
    with tempfile.TemporaryDirectory(prefix="dsv4patch-selftest-tests-") as tmp:
        root = Path(tmp)
        for rel in run:
            dest = root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            data = tests[rel]
            assert data is not None
            dest.write_bytes(data)
        xml = root / "junit.xml"
        cmd = [python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--rootdir", str(root),
               f"--junitxml={xml}", *run]
        try:
            res = subprocess.run(cmd, cwd=root, env=child_env(env), capture_output=True, text=True,
                                 timeout=timeout)
            rc, tail = res.returncode, (res.stdout + res.stderr)[-3000:]
        except subprocess.TimeoutExpired:
            rc, tail = -1, f"pytest did not finish within {timeout:.0f} s"
        outcomes = _junit(xml)
    failed = sorted(n for n, s in outcomes.items() if s == "failed")
    counts = {s: sum(1 for v in outcomes.values() if v == s) for s in ("passed", "failed", "skipped")}
    ok = rc == 0 and not failed
    note = (f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped in "
            f"{len(run)} file(s)" + ("" if gpu else " (no GPU here: the kernel tests skip themselves)"))
    if rc not in (0, 1) and not outcomes:
        note = f"pytest exit {rc}: {tail.strip().splitlines()[-1] if tail.strip() else 'no output'}"
    return CheckResult("regression", ok, note, {"files": run, "counts": counts, "failed": failed,
                                                "exit_code": rc, "output_tail": None if ok else tail})


def default_child(python: str) -> list[str]:
    """The engine child under PYTHON: ``child.py`` copied out of the package (its ``model.py`` beside it).

    Copied, so the environment under test runs two standalone files and never
    imports dsv4patch (or this environment's site-packages) at all.
    """
    tmp = Path(tempfile.mkdtemp(prefix="dsv4patch-selftest-child-"))
    for name in ("child.py", "model.py"):
        shutil.copyfile(CHILD.parent / name, tmp / name)
    return [python, "-X", "faulthandler", str(tmp / "child.py")]


def python_of(given: str | None) -> str:
    return given or os.environ.get("DSV4PATCH_VLLM_PYTHON") or sys.executable


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

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "python": self.python, "gpu": self.gpu, "force_sm120_topk": self.force_sm120_topk,
            "design": {"vocab": tiny.VOCAB_SIZE, "cycle_len": tiny.CYCLE_LEN, "accept": len(tiny.DESIGN.accept),
                       "gain_nats": tiny.GAIN, "post_mix": round(2.0 / (1.0 + 2.718281828459045 ** -tiny.POST_LOGIT), 8)},
            "checks": [c.to_json() for c in self.checks],
            "engines": [r.to_json() for r in self.engines],
            "cases": [c.to_json() for c in self.cases],
            "counts": self.counts(), "min_gap": self.min_gap(), "seconds": round(self.seconds, 1),
        }


CHECK_NAMES = ("installed", "regression")


def run_selftest(
    *,
    lock: Lock | None,  # None (and store None) when no check is selected
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
) -> Report:
    """The selected checks beside the engine cases (each engine a child of PYTHON); the report.

    The checks run in a thread of their own while the engines start: they
    share nothing with the engines but the GPU (the kernel tests), and on a
    node whose engines need minutes to compile kernels they cost no time.
    """
    t0 = time.monotonic()
    on_gpu = gpu_present() if gpu is None else gpu
    results: list[CheckResult] = []

    def run_checks() -> None:
        if not checks:
            return
        if lock is None or store is None:  # guarded() reports it as the check's failure
            raise RuntimeError("internal: the selected checks need the lock and the store")
        chosen_pin = pin
        if "installed" in checks:
            inst = check_installed(lock, pin, python, store, progress)
            results.append(inst)
            chosen_pin = chosen_pin or (inst.data.get("report") or {}).get("pin")
        if "regression" in checks:
            if chosen_pin is None:
                from dsv4patch import installed

                try:
                    version = (installed.probe(python, "").get("vllm") or {}).get("version")
                    chosen_pin = installed.pick_pin(lock, None, version).name
                except Dsv4Error as exc:
                    results.append(CheckResult("regression", False, f"{type(exc).__name__}: {exc}"))
                    return
            # beside the engines: what is left of the whole run
            budget = max(30.0, t0 + deadlines.total - 30.0 - time.monotonic())
            results.append(check_regression(lock, chosen_pin, python, store, progress, gpu=on_gpu,
                                            timeout=budget))

    def guarded() -> None:
        try:
            run_checks()
        except Exception as exc:  # a bug in a check must not pass for success: it fails, named
            results.append(CheckResult("installed" if not results and "installed" in checks else "regression",
                                       False, f"internal error: {type(exc).__name__}: {exc}"))

    thread = threading.Thread(target=guarded, name="selftest-checks", daemon=True)
    thread.start()
    runs: list[EngineRun] = []
    if cases:
        runs = run_cases(cases, child=child or default_child(python), work=work, deadlines=deadlines,
                         parallel=parallel, kv_cache_gib=kv_cache_gib)
    thread.join()
    results.sort(key=lambda c: CHECK_NAMES.index(c.name))
    return Report(python, on_gpu, force_sm120_topk, results, runs, time.monotonic() - t0)
