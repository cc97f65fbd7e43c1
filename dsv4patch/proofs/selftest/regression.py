"""The series' own regression tests, run against the installed vLLM: one process per test file.

Why one process per file: on the H200 (2026-12-03) one test of fix 6 made
the vendored DeepGEMM kernel read host memory (an illegal address), and every
CUDA test after it in the same pytest process failed; the report could not
say which test it was, because only the end of the output was kept.  So each
file is its own pytest session (a fault stays in its file, and each file is
proven to run alone), several at once, each with its own deadline; its whole
output is kept in the work directory (``regression/<file>.log``, capped), its
JUnit XML beside it, and the report carries every test's outcome, the device
each test ran on (the tests record it) and each failing test's own error.

Where it runs: with a CUDA device the tests run on it (the series' tests put
their tensors on the GPU and run the real Triton, DeepGEMM and CUDA kernels);
without one they run on CPU as ``dsv4patch verify`` runs them (Triton's
interpreter, ``CUDA_VISIBLE_DEVICES`` empty, the CPU plugin that makes
vLLM's GPU memory cleanup a no-op), and the kernel tests skip themselves.
"""

from __future__ import annotations

import os
import shutil
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from dsv4patch import childproc
from dsv4patch.errors import ChildError

CPU_PLUGIN = Path(__file__).resolve().parent.parent / "cpu_pytest_plugin.py"
PLUGIN_MODULE = "dsv4patch_cpu_plugin"
FILE_DEADLINE = 900.0  # one file's session (fix 7's hang tests end each kernel after 30 s: 8 of them)
LOG_CAP = 32 << 20  # one file's output kept in the work directory
JUNIT_LIMIT = 16 << 20
MESSAGE = 600  # characters of a failing test's error in the report


@dataclass
class TestOutcome:
    """One test of one file: passed, failed (with its error), skipped (with the reason)."""

    test: str
    outcome: str
    message: str = ""
    device: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"test": self.test, "outcome": self.outcome, "message": self.message or None,
                "device": self.device or None}


@dataclass
class FileResult:
    """One test file's own pytest session."""

    file: str
    status: str  # "passed", "failed" (a test failed), "error" (pytest or the file could not run), "timeout"
    exit_code: int | None
    seconds: float
    log: str
    tests: list[TestOutcome] = field(default_factory=list)
    error: str = ""  # for "error" / "timeout": what went wrong with the session itself

    def count(self, outcome: str) -> int:
        return sum(1 for t in self.tests if t.outcome == outcome)

    def devices(self) -> list[str]:
        return sorted({t.device for t in self.tests if t.device})

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "status": self.status, "exit_code": self.exit_code,
                "seconds": round(self.seconds, 1), "log": self.log, "error": self.error or None,
                "counts": {o: self.count(o) for o in ("passed", "failed", "skipped")},
                "devices": self.devices(), "tests": [t.to_json() for t in self.tests]}


@dataclass
class RegressionResult:
    """Every file's result; ``ok`` when every file ran and no test failed or skipped where it must not."""

    files: list[FileResult]
    on_gpu: bool

    def counts(self) -> dict[str, int]:
        return {o: sum(f.count(o) for f in self.files) for o in ("passed", "failed", "skipped")}

    @property
    def ok(self) -> bool:
        return bool(self.files) and all(f.status == "passed" for f in self.files)

    def failures(self) -> list[str]:
        """Each failing test with its own error, then each file that could not run."""
        out = [f"{t.test}: {t.message}" for f in self.files for t in f.tests if t.outcome == "failed"]
        out += [f"{f.file}: {f.status}: {f.error}" for f in self.files if f.status in ("error", "timeout")]
        return out

    def to_json(self) -> dict[str, Any]:
        return {"on_gpu": self.on_gpu, "counts": self.counts(), "files": [f.to_json() for f in self.files]}


def _safe_rel(rel: str) -> PurePosixPath:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts or p.parts[0] != "tests" or p.suffix != ".py":
        raise ValueError(f"not a series test path: {rel!r}")
    return p


def write_tests(tests: dict[str, bytes], root: Path) -> list[str]:
    """The test files under ROOT (a fresh directory of ours), in path order; their paths relative to ROOT."""
    out = []
    for rel in sorted(tests):
        p = _safe_rel(rel)
        dest = root.joinpath(*p.parts)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(tests[rel])
        out.append(str(p))
    return out


def _text(node: ET.Element) -> str:
    msg = node.get("message") or ""
    body = (node.text or "").strip()
    if body:  # pytest's own one-line summary is the message; the body ends with the error line
        last = [ln for ln in body.splitlines() if ln.strip()]
        if last and last[-1].strip() not in msg:
            msg = f"{msg} ({last[-1].strip()})" if msg else last[-1].strip()
    return " ".join(msg.split())[:MESSAGE]


def read_junit(path: Path) -> list[TestOutcome]:
    """Every test case of a JUnit XML (pytest's xunit1 family, with the tests' recorded properties)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(JUNIT_LIMIT + 1)
    if len(data) > JUNIT_LIMIT:
        return []
    try:
        root = ET.fromstring(data)
    except ET.ParseError:
        return []
    out = []
    for tc in root.iter("testcase"):
        cls, name = tc.get("classname", ""), tc.get("name", "")
        test = f"{cls.replace('.', '/')}.py::{name}" if cls else name
        outcome, message, device = "passed", "", ""
        for child in tc:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", _text(child)
            elif child.tag == "skipped" and outcome == "passed":
                outcome, message = "skipped", _text(child)
            elif child.tag == "properties":
                for prop in child.iter("property"):
                    if prop.get("name") == "device":
                        device = (prop.get("value") or "")[:100]
        out.append(TestOutcome(test, outcome, message, device))
    return out


def environment(base: dict[str, str], *, on_gpu: bool, plugin_dir: Path) -> dict[str, str]:
    """The test sessions' environment: the GPU as it is, or the CPU setup ``dsv4patch verify`` uses."""
    env = {k: v for k, v in base.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env.update(PYTHONDONTWRITEBYTECODE="1", VLLM_LOGGING_LEVEL="WARNING")
    if on_gpu:
        env.pop("TRITON_INTERPRET", None)
    else:
        env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(plugin_dir))
    return env


def run_file(python: str, root: Path, rel: str, *, logs: Path, env: dict[str, str], on_gpu: bool,
             deadline: float) -> FileResult:
    """One test file in its own pytest session under the deadline."""
    stem = rel.replace("/", "__").removesuffix(".py")
    log, xml = logs / f"{stem}.log", logs / f"{stem}.xml"
    argv = [python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
            "--rootdir", str(root), f"--junitxml={xml}", *([] if on_gpu else ["-p", PLUGIN_MODULE]), rel]
    t0 = time.monotonic()
    try:
        fin = childproc.run(argv, deadline=deadline, what=f"the regression tests of {rel}", cwd=root, env=env,
                            output=log, merge=True, keep=8 << 10, output_cap=LOG_CAP, check_bounds=False)
    except ChildError as exc:  # pytest could not start at all
        return FileResult(rel, "error", None, time.monotonic() - t0, str(log), error=str(exc))
    tests = read_junit(xml)
    res = FileResult(rel, "passed", fin.returncode, fin.seconds, str(log), tests)
    if fin.timed_out:
        res.status, res.error = "timeout", f"the file's session did not finish within {deadline:.0f} s"
    elif any(t.outcome == "failed" for t in tests):
        res.status = "failed"
    elif fin.returncode != 0 or not tests:
        res.status = "error"
        res.error = f"pytest {fin.status()}: {fin.last_line()}"
    return res


def run_regression(tests: dict[str, bytes], *, python: str, work: Path, on_gpu: bool, deadline: float,
                   parallel: int = 4, base_env: dict[str, str] | None = None,
                   done: Callable[[], None] | None = None) -> RegressionResult:
    """Every series test file in its own session, PARALLEL at once, all within DEADLINE seconds
    (``done`` is called as each file finishes: the progress count)."""
    root = work / "regression" / "tree"
    logs = work / "regression"
    root.mkdir(parents=True)
    files = write_tests(tests, root)
    plugin_dir = work / "regression" / "plugin"
    plugin_dir.mkdir()
    shutil.copyfile(CPU_PLUGIN, plugin_dir / f"{PLUGIN_MODULE}.py")
    env = environment(dict(os.environ if base_env is None else base_env), on_gpu=on_gpu, plugin_dir=plugin_dir)
    end = time.monotonic() + deadline

    def one(rel: str) -> FileResult:
        left = end - time.monotonic()
        if left < 5:
            return FileResult(rel, "timeout", None, 0.0, "", error="no time left for this file (the run's deadline)")
        try:
            return run_file(python, root, rel, logs=logs, env=env, on_gpu=on_gpu, deadline=min(FILE_DEADLINE, left))
        finally:
            if done is not None:
                done()

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        results = list(pool.map(one, files))
    return RegressionResult(results, on_gpu)
