"""Conformance: upstream's own tests of each fix, run against the patched pin.

A backport is trusted when the fix's *own* tests pass on it.  Each patch
header lists, under ``Upstream-Test:``, the test node ids of the first release
that contains the fix (0.28.0 for #51538) which cover it.  The test files are
not copied into this repository: ``dsv4patch verify --upstream-tests`` takes
them from that release's sdist (a pin of the lock, so its sha256 is checked),
copies exactly the listed files into two scratch checkouts of the pin under
test (patched and unpatched) and runs the listed node ids in both, on CPU
(:func:`run`; ``commands/verify.py`` renders its :class:`UpstreamResult`).

A test is *evidence* only when it passes on the patched tree and fails on the
unpatched one.  Every other outcome is listed with its reason.

``Upstream-Test:`` values are ``NODEID`` optionally followed by one mode in
brackets and a reason in parentheses:

* (no mode) ``[cpu]``: run as shipped;
* ``[cpu-device]``: the test hard-codes the CUDA device but its kernels are
  Triton (or plain torch), so it runs on CPU once the device is rewritten
  (string literals ``"cuda"``/``"cuda:0"`` become ``"cpu"``, the
  CUDA-availability skips and ``torch.accelerator.synchronize()`` are
  neutralised; the rewrite is applied to the scratch copy only);
* ``[gpu]``: needs a GPU (CUDA kernels); listed, not run here;
* ``(same-on-unpatched: REASON)``: the test pins behaviour the fix must keep,
  so it passes on both trees; expected, reported with REASON.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4patch import childproc, git, report, safeio
from dsv4patch.errors import BuildError, PatchFileError, TreeError, param
from dsv4patch.nextstep import Step, mention
from dsv4patch.pins import materialize
from dsv4patch.proofs import testenv, testrun
from dsv4patch.proofs.upstream_release import DEFAULT_FROM
from dsv4patch.records import frozen
from dsv4patch.series import run_series, series_for_pin

if TYPE_CHECKING:
    from dsv4patch.pins import Context, Lock, Pin, PinRepo
    from dsv4patch.progress import Task
    from dsv4patch.series import Patch

TRAILER = "Upstream-Test"
MODES = ("cpu", "cpu-device", "gpu")
SAME = "same-on-unpatched"

_VALUE = re.compile(
    r"(?P<nodeid>tests/[^\s\[\]]+?\.py(?:::[^\s]+)?)"
    r"(?:\s+\[(?P<mode>[a-z-]+)\])?"
    r"(?:\s+\((?P<note>[a-z-]+):\s*(?P<reason>[^)]+)\))?"
)

# The rewrite that lets a CUDA-hard-coded Triton/torch test run on CPU.
_DEVICE_REWRITES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"""(["'])cuda(?::0)?\1"""), '"cpu"'),
    (re.compile(r"not\s+torch\.cuda\.is_available\(\)"), "False"),
    (re.compile(r"not\s+current_platform\.is_cuda\(\)"), "False"),
    (re.compile(r"torch\.accelerator\.synchronize\(\)"), "None"),
)


@frozen
class UpstreamTest:
    patch: str
    nodeid: str
    mode: str = "cpu"
    same_reason: str | None = None  # expected to pass unpatched too, and why

    @property
    def path(self) -> str:
        return self.nodeid.split("::", 1)[0]


@dataclass
class CaseResult:
    """The outcome of one listed node id (all its parametrized cases) in one tree."""

    status: str = "not run"  # passed | failed | skipped | not collected | not run
    detail: str = ""
    cases: int = 0

    def __str__(self) -> str:
        s = self.status if self.cases <= 1 else f"{self.status} ({self.cases} cases)"
        return f"{s}: {self.detail}" if self.detail and self.status != "passed" else s


@dataclass
class Row:
    test: UpstreamTest
    patched: CaseResult = field(default_factory=CaseResult)
    unpatched: CaseResult = field(default_factory=CaseResult)

    @property
    def verdict(self) -> str:
        if self.test.mode == "gpu":
            return "gpu only (not run here)"
        p, u = self.patched.status, self.unpatched.status
        if p == "passed":
            if u in ("failed", "not collected"):
                return "evidence"
            if u == "passed" and self.test.same_reason:
                return f"expected: passes unpatched too ({self.test.same_reason})"
            return f"NOT EVIDENCE: {u} on the unpatched pin"
        if p == "skipped":
            return f"SKIPPED on patched: {self.patched.detail}"
        return f"FAILS ON PATCHED: {self.patched.detail}"

    @property
    def ok(self) -> bool:
        v = self.verdict
        return v == "evidence" or v.startswith(("gpu only", "expected:"))


def declared(patch: Patch) -> list[UpstreamTest]:
    """The patch's ``Upstream-Test:`` lines, validated."""
    out = []
    for value in patch.trailers.get(TRAILER, []):
        m = _VALUE.fullmatch(value.strip())
        mode = (m.group("mode") or "cpu") if m else ""
        note = m.group("note") if m else None
        if not m or mode not in MODES or ".." in m.group("nodeid").split("/") or (
            note is not None and note != SAME
        ):
            raise PatchFileError(
                f"{patch.path}: bad {TRAILER}: line {value!r}; write "
                f"'tests/PATH.py::TEST [MODE] ({SAME}: REASON)' with MODE one of "
                f"{', '.join(MODES)} (mode and note optional)"
            )
        out.append(UpstreamTest(patch.name, m.group("nodeid"), mode,
                                m.group("reason").strip() if note else None))
    return out


def cpu_device(text: str) -> str:
    """``text`` with the CUDA device hard-coding rewritten for a CPU run."""
    for pattern, repl in _DEVICE_REWRITES:
        text = pattern.sub(repl, text)
    return text


@dataclass
class UpstreamResult:
    """The upstream tests of one pin's patches, each run patched and unpatched."""

    pin: Pin
    source: Pin  # the pin whose sdist the tests come from
    rows: list[Row]
    torch: str | None  # None: nothing ran here (every test needs a GPU)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        return {
            "pin": self.pin.name,
            "from": self.source.name,
            "torch": self.torch,
            "ok": self.ok,
            "tests": [
                {"patch": r.test.patch, "nodeid": r.test.nodeid, "mode": r.test.mode,
                 "patched": str(r.patched), "unpatched": str(r.unpatched),
                 "verdict": r.verdict, "ok": r.ok}
                for r in self.rows
            ],
        }

    def table(self) -> tuple[report.Table, str]:
        """The terminal table and its markdown."""
        return report.simple_table(
            f"{mention(Step.of('verify', upstream_tests=True))}: pin {self.pin.name}, tests of vLLM "
            f"{self.source.vllm_version} (CPU, TRITON_INTERPRET=1)",
            ["patch", "upstream test", "mode", "patched", "unpatched", "verdict"],
            [[r.test.patch[:4], r.test.nodeid.rsplit("/", 1)[-1], r.test.mode,
              _short(str(r.patched)), _short(str(r.unpatched)), r.verdict]
             for r in self.rows],
        )


def run(
    *,
    ctx: Context,
    pin: Pin,
    source: Pin | None = None,
    patches: Sequence[str] | None = None,
    torch: str | None = None,
) -> UpstreamResult:
    """Run upstream's tests of ``pin``'s patches (``patches``: only those) from ``source``'s
    sdist (default: the lock's pin 0.28.0) on the patched and the unpatched pin."""
    lock, store, progress = ctx.lock, ctx.store, ctx.progress
    source = source or source_pin(lock, None)
    pinrepo = materialize(pin, store, progress)
    srcrepo = materialize(source, store, progress)
    series = series_for_pin(lock, pin)
    result = run_series(pinrepo.repo, pinrepo.base_commit, series)
    if result.final_tree is None:
        raise TreeError(
            f"pin {pin.name}: the series does not apply, nothing to verify; run dsv4patch check"
        )
    wanted = patches
    rows = [Row(t) for p in series.patches
            if not wanted or any(p.name == w or p.name.startswith(w) for w in wanted)
            for t in declared(p)]
    work = store.tmpdir(f"upstream-tests-{pin.name}-")
    torch_version = None
    try:
        files = _source_files(srcrepo, source, rows)
        patched = work / "patched"
        unpatched = work / "unpatched"
        after = git.commit_tree(pinrepo.repo, result.final_tree, pinrepo.base_commit,
                                "verify: patched\n")
        git.worktree_add(pinrepo.repo, patched, after)
        git.worktree_add(pinrepo.repo, unpatched, pinrepo.base_commit)
        for d in (patched, unpatched):
            for rel, data in files.items():
                (d / rel).parent.mkdir(parents=True, exist_ok=True)
                (d / rel).write_text(data, encoding="utf-8")
        runnable = [r for r in rows if r.test.mode != "gpu"]
        if runnable:
            with progress.step(f"the CPU test venv (torch {torch or 'of the pin'}; made once, then cached)"):
                env = testenv.ensure(patched, store, torch, log=work / "pip.log")
            torch_version = env.torch
            nodeids = [r.test.nodeid for r in runnable]
            with progress.task(f"pytest: upstream's {len(nodeids)} test(s) of vLLM {source.vllm_version} on the "
                               f"patched and the unpatched pin {pin.name}, at the same time", 2,
                               unit="sessions") as task:
                on_patched, on_unpatched = _both(env, (patched, unpatched), nodeids, work, task)
            for r in runnable:
                r.patched, r.unpatched = on_patched[r.test.nodeid], on_unpatched[r.test.nodeid]
    finally:
        for d in (work / "patched", work / "unpatched"):
            if (d / ".git").exists():
                git.worktree_remove(pinrepo.repo, d)
        store.remove_tmp(work)
    return UpstreamResult(pin, source, rows, torch_version)


def source_pin(lock: Lock, name: str | None) -> Pin:
    """The pin whose tests run: ``name`` (``--from``), else the lock's 0.28.0."""
    return lock.pin(name or DEFAULT_FROM, given_as="upstream_from")


def _source_files(srcrepo: PinRepo, source: Pin, rows: list[Row]) -> dict[str, str]:
    """Exactly the listed test files, from the source pin (device-rewritten where asked)."""
    files: dict[str, str] = {}
    rewrite = {r.test.path for r in rows if r.test.mode == "cpu-device"}
    for r in rows:
        if r.test.path in files:
            continue
        entry = git.ls_tree_entry(srcrepo.repo, srcrepo.base_commit, r.test.path)
        if entry is None or not entry.is_blob:
            raise PatchFileError(
                f"{r.test.patch}: {TRAILER}: {r.test.nodeid}: {r.test.path} is not in vLLM "
                f"{source.vllm_version} (pin {source.name}); fix the header or pass {param('upstream_from')}"
            )
        text = git.cat_blob(srcrepo.repo, entry.oid).decode("utf-8")
        files[r.test.path] = cpu_device(text) if r.test.path in rewrite else text
    return files


def _both(env: testenv.TestEnv, trees: tuple[Path, Path], nodeids: list[str], work: Path,
          task: Task) -> tuple[dict[str, CaseResult], dict[str, CaseResult]]:
    """``nodeids`` on both trees at the same time: two processes that each mostly wait on one
    core (vLLM's import, the Triton interpreter); ``task`` counts the sessions as they end."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = [pool.submit(run_nodeids, env, d, nodeids, work / f"{d.name}.xml") for d in trees]
        found = []
        for fut in runs:
            found.append(fut.result())
            task.advance(1)
    return found[0], found[1]


def run_nodeids(env: testenv.TestEnv, cwd: Path, nodeids: list[str], xml: Path) -> dict[str, CaseResult]:
    """Run ``nodeids`` in ``cwd`` in one pytest session; one aggregated result per node id (its cases).

    pytest is given the node ids' files, and the CPU plugin runs only the node ids
    (``$DSV4PATCH_SELECT``): a module that fails to collect is then one ``not collected``
    beside the others' results, where named node ids would make pytest run nothing
    ("found no collectors", even with ``--continue-on-collection-errors``) and a second
    session would be needed for the rest.
    """
    out = {n: CaseResult() for n in nodeids}
    _run_once(env, cwd, nodeids, xml, out)
    return out


def _run_once(
    env: testenv.TestEnv, cwd: Path, nodeids: list[str], xml: Path, out: dict[str, CaseResult]
) -> None:
    """One pytest session over NODEIDS; each one's result from the junit report, or why there is none."""
    xml.unlink(missing_ok=True)
    select = xml.with_name(xml.name + ".select")
    select.write_text("".join(f"{n}\n" for n in nodeids), encoding="utf-8")
    files = dict.fromkeys(n.split("::", 1)[0] for n in nodeids)
    cmd = env.pytest_args() + ["-q", "--continue-on-collection-errors", "--junitxml", str(xml),
                               "-o", "junit_family=xunit1", *files]
    run_env = env.env()
    run_env["DSV4PATCH_SELECT"] = str(select)
    proc = childproc.run(cmd, cwd=cwd, env=run_env, deadline=testrun.SESSION_DEADLINE,
                         what="upstream's tests (pytest)", output=xml.with_name(xml.name + ".log"))
    if not xml.exists():
        for n in nodeids:
            out[n].status, out[n].detail = "not collected", f"pytest {proc.status()}: {proc.last_line(160)}"
        return
    wanted = {n: out[n] for n in nodeids}
    data = safeio.read_bytes(xml, testrun.RESULTS_LIMIT, error=BuildError, what="pytest's junit report")
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise BuildError(f"{xml}: pytest's junit report is not XML ({exc})") from None
    for case in root.iter("testcase"):
        for nodeid, res in wanted.items():
            _take_case(res, nodeid, case)
    for res in wanted.values():
        if res.status == "not run":
            res.detail = f"pytest ran no test of this node id ({proc.status()})"


def _take_case(res: CaseResult, nodeid: str, case: ET.Element) -> None:
    """Fold one junit ``testcase`` into NODEID's result when it is one of its cases (a parametrized
    test has many: any failure fails it, a skip counts only where nothing failed), or the module's
    collection error."""
    classname, name = case.get("classname", ""), case.get("name", "")
    bad = case.find("failure") if case.find("failure") is not None else case.find("error")
    skipped = case.find("skipped")
    path, _, func = nodeid.partition("::")
    module = path[:-3].replace("/", ".")
    if not classname and name == module:  # the module failed to collect
        res.status = "not collected"
        res.detail = _message(bad)
        return
    base = name if "[" in func else name.split("[", 1)[0]
    if classname != module or (func and base != func):
        return
    res.cases += 1
    if bad is not None:
        if res.status != "failed":
            res.status, res.detail = "failed", _message(bad)
    elif skipped is not None:
        if res.status in ("not run", "passed", "skipped"):
            res.status, res.detail = "skipped", skipped.get("message", "")[:160]
    elif res.status == "not run":
        res.status = "passed"


def _message(bad: ET.Element | None) -> str:
    """The failure's one-line reason: the last ``E`` line of the report (the
    exception that was raised), else the junit message."""
    if bad is None:
        return ""
    e_lines = [ln[1:].strip() for ln in (bad.text or "").splitlines() if ln.startswith("E ")]
    e_lines = [ln for ln in e_lines if ln]
    if e_lines:
        return e_lines[-1][:160]
    msg = (bad.get("message") or "error").strip().splitlines()
    return (msg[0] if msg else "error")[:160]


def _short(text: str, limit: int = 72) -> str:
    """A table cell: the reason cut short (``--format json`` has it whole)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
