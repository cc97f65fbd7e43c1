"""dsv4patch.proofs.selftest.runner: children, deadlines, verdicts; the installed and regression checks.

The engine cases run a STAND-IN engine (tests/selftest_standin_engine.py),
because the real child needs vLLM on a CUDA GPU and this machine has none:
it speaks the child's protocol and generates the designed chain (or, per
STANDIN_MODE, a wrong token, a hang, a crash, a refusal), so the runner's
process handling and the oracle's verdicts are the real ones.  The two
checks run for real: the lock's 0.26.0 patched tree (from the shared test
cache) and an interpreter with no vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsv4patch.errors import ChildError
from dsv4patch.pins import Context
from dsv4patch.pins.lock import load
from dsv4patch.progress import Progress
from dsv4patch.proofs.selftest import cases, plan, probe, runner
from dsv4patch.proofs.selftest.model import DESIGN
from dsv4patch.store import Store

ROOT = Path(__file__).resolve().parent.parent
STANDIN = [sys.executable, str(ROOT / "tests" / "selftest_standin_engine.py")]
FAST = runner.Deadlines(start=20, first_case=20, case=20, total=120)


@pytest.fixture(autouse=True)
def short_hang_sample(monkeypatch):
    """A hang's evidence is sampled for 0.2 s here, not 2 s (probe.SAMPLE_SECONDS; the probe still waits for
    the child's stack dump however long it takes): only the CPU-time verdict (working_on_cpu, which needs 1 s)
    depends on its length, and the one test of it sets 1 s."""
    monkeypatch.setattr(probe, "SAMPLE_SECONDS", 0.2)


def _run(tmp_path, names, mode="pass", deadlines=FAST, parallel=2, force=False):
    chosen = cases.select(cases.all_cases(force_sm120_topk=force), names)
    env = {**os.environ, "STANDIN_MODE": mode}
    (tmp_path / "work").mkdir(exist_ok=True)
    runs = runner.run_cases(chosen, child=STANDIN, work=tmp_path / "work", deadlines=deadlines, parallel=parallel,
                            env=env)
    return {c.case: c for r in runs for c in r.cases}, runs


def test_a_correct_engine_passes_with_the_designed_acceptance(tmp_path):
    got, runs = _run(tmp_path, ["plain/short_b5", "mtp1/short_b5", "mtp3/short_b1", "dspark5/short_b1"])
    assert {k: v.verdict for k, v in got.items()} == dict.fromkeys(got, "pass")
    plain = got["plain/short_b5"]
    assert plain.acceptance is None and plain.min_gap == pytest.approx(19.92, abs=0.01)
    for name in ("mtp1/short_b5", "mtp3/short_b1", "dspark5/short_b1"):
        c = got[name]
        assert c.acceptance.partial and c.acceptance == c.expected_acceptance
    assert all(r.outcome == "done" and r.fingerprint["standin"] for r in runs)
    assert (tmp_path / "work" / "tiny-dsv4" / "config.json").is_file()


def test_a_wrong_token_differs_with_request_position_and_both_tokens(tmp_path):
    got, _ = _run(tmp_path, ["mtp1/short_b5", "plain/short_b5"], mode="differs")
    bad = got["mtp1/short_b5"]
    assert bad.verdict == "differs" and got["plain/short_b5"].verdict == "pass"
    d = bad.difference
    assert (d.request, d.position) == (1, 7) and d.got == DESIGN.successor[d.expected]
    assert bad.error == f"request 1, token 7: expected {d.expected}, got {d.got}"


def test_a_hung_prompt_set_is_a_hang_and_the_rest_of_its_engine_is_not_run(tmp_path):
    quick = runner.Deadlines(start=20, first_case=20, case=1, total=60)
    t0 = time.monotonic()
    got, runs = _run(tmp_path, ["plain"], mode="hang_case", deadlines=quick)
    assert time.monotonic() - t0 < 30
    assert [got[f"plain/{s}"].verdict for s in ("trio_b3", "short_b5", "mid_b24")] == ["pass", "hang", "not-run"]
    # the stage, and the batch the engine was in when it stopped (its step events)
    assert got["plain/short_b5"].error.startswith("prompt set short_b5: no progress within 1 s (3 running, 0 waiting, ")
    # the hang probe: the child's stacks (SIGUSR1 into its stacks file), the main thread named in the verdict
    run = runs[0]
    assert run.stage == "prompt set short_b5" and "Current thread" in Path(run.stacks).read_text()
    assert run.evidence is not None and run.evidence.main_frames[0].startswith("main (selftest_standin_engine.py:")
    assert "main thread in main (selftest_standin_engine.py:" in got["plain/short_b5"].error
    assert Path(run.evidence.file).is_file() and run.evidence.tools["faulthandler"] == "ok"


def test_a_hung_engine_start_is_a_hang_of_its_first_case(tmp_path):
    quick = runner.Deadlines(start=1, first_case=20, case=20, total=60)
    got, _ = _run(tmp_path, ["mtp2/short_b5", "mtp2/short_b1"], mode="hang_start", deadlines=quick)
    assert got["mtp2/short_b5"].verdict == "hang" and got["mtp2/short_b5"].error.startswith("engine start: ")
    assert got["mtp2/short_b1"].verdict == "not-run"


def test_an_engine_start_busy_on_the_cpu_on_an_idle_gpu_is_a_slow_start_not_a_hang(tmp_path, monkeypatch):
    # nvidia-smi is a stand-in (this machine has no GPU): it reports the idle H200 of the run of 2026-12-04, where
    # dspark5's start, in vLLM's graph capture (gc.collect) with five engines starting, passed its 180 s deadline
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text('#!/bin/sh\necho "0 %, 11269 MiB, 143771 MiB"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(probe, "SAMPLE_SECONDS", 1.0)  # the CPU time over at least 1 s decides
    quick = runner.Deadlines(start=1.5, first_case=20, case=20, total=60)
    got, runs = _run(tmp_path, ["dspark5/short_b5", "dspark5/short_b1"], mode="busy_start", deadlines=quick)
    ev = runs[0].evidence
    assert ev is not None and ev.gpu_idle and ev.working_on_cpu, ev
    assert runs[0].outcome == "not-run" and got["dspark5/short_b5"].verdict == "not-run"
    assert got["dspark5/short_b5"].error.startswith("engine start: not ready within 2 s: still working on the CPU")
    assert "a slow start, not a hang" in got["dspark5/short_b5"].error
    # the same idle GPU with an engine that sleeps at start (a deadlock): a hang, as before
    got, runs = _run(tmp_path / "work", ["dspark5/short_b5"], mode="hang_start", deadlines=quick)
    ev = runs[0].evidence
    assert ev is not None and ev.gpu_idle and not ev.working_on_cpu, ev
    assert got["dspark5/short_b5"].verdict == "hang"


def test_engines_start_in_plan_order_and_a_hang_of_the_first_costs_only_its_deadline(tmp_path):
    # mtp1 warms the caches alone; when it hangs at start the others start once its deadline passed,
    # with the cold start deadline (the first engine never measured a start)
    quick = runner.Deadlines(start=1, first_case=20, case=20, total=60)
    t0 = time.monotonic()
    got, runs = _run(tmp_path, ["plain/short_b1", "mtp1/short_b1", "dspark5/short_b1"], mode="hang_start",
                     deadlines=quick, parallel=1)
    assert time.monotonic() - t0 < 30
    started = sorted(runs, key=lambda r: r.launched_at)
    assert [r.engine.name for r in started] == ["mtp1", "dspark5", "plain"]
    assert started[1].launched_at >= 1 and [r.outcome for r in runs] == ["hang", "hang", "hang"]
    assert all(r.start_deadline == 1 for r in runs)


@pytest.mark.parametrize("how", ["child_cannot_start", "files_already_there"])
def test_a_first_engine_whose_launch_raises_ends_the_run_at_once_and_starts_no_other(tmp_path, how):
    # The others wait for the first engine's readiness; a launch that raises (an interpreter that
    # cannot be run, the engine's files already in the work directory) must release them at once,
    # not leave them waiting until the run's deadline (120 s here: the old code waited that long).
    names = ["plain/short_b1", "mtp1/short_b1", "mtp2/short_b1"]
    chosen = cases.select(cases.all_cases(), names)
    work = tmp_path / "work"
    work.mkdir()
    child = STANDIN
    if how == "child_cannot_start":
        child = [str(tmp_path / "no-such-python"), *STANDIN[1:]]
    else:
        (work / "mtp1.spec.json").write_text("{}")
    t0 = time.monotonic()
    with pytest.raises((ChildError, FileExistsError)) as caught:
        runner.run_cases(chosen, child=child, work=work, deadlines=FAST, parallel=3,
                         env={**os.environ, "STANDIN_MODE": "pass"})
    assert time.monotonic() - t0 < 15
    assert "mtp1" in str(caught.value) or "mtp1.spec.json" in str(caught.value)
    assert not (work / "plain.spec.json").exists() and not (work / "mtp2.spec.json").exists()


def test_a_warm_engine_gets_a_start_deadline_from_the_first_ones_measured_start(tmp_path):
    got, runs = _run(tmp_path, ["plain/short_b1", "mtp1/short_b1"], parallel=2)
    first, later = sorted(runs, key=lambda r: r.launched_at)
    assert (first.engine.name, later.engine.name) == ("mtp1", "plain") and first.start_deadline == FAST.start
    assert later.start_deadline == min(FAST.start, max(plan.MIN_WARM_START, 1.5 * first.start_seconds))


def test_a_malformed_child_event_is_a_crash_that_says_so(tmp_path):
    got, runs = _run(tmp_path, ["plain/short_b1", "plain/short_b5"], mode="bad_event")
    assert runs[0].outcome == "crash" and "malformed" in runs[0].detail
    assert {c.verdict for c in got.values()} <= {"crash", "not-run"}


def test_a_child_flooding_its_log_costs_disk_not_memory(tmp_path):
    # 40 MiB printed by the engine: it goes to its log file; the runner keeps bounded tails only
    # VmHWM after resetting it (clear_refs 5): this process's own peak; ru_maxrss would start at the
    # pytest worker's size (exec carries it over), hiding any growth below it
    code = ("import os, re, sys\n"
            "sys.path[:0] = [sys.argv[1], sys.argv[1] + '/tests']\n"
            "import test_selftest_runner as t\n"
            "from pathlib import Path\n"
            "hwm = lambda: int(re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read()).group(1))\n"
            "Path('/proc/self/clear_refs').write_text('5')\n"
            "before = hwm()\n"
            "got, runs = t._run(Path(sys.argv[2]), ['plain/short_b1'], mode='flood')\n"
            "grew = hwm() - before\n"
            "print(runs[0].outcome, got['plain/short_b1'].verdict, grew)\n")
    res = subprocess.run([sys.executable, "-c", code, str(ROOT), str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    outcome, verdict, grew_kib = res.stdout.split()
    assert (outcome, verdict) == ("done", "pass")
    assert int(grew_kib) < 16 * 1024, f"the runner grew by {grew_kib} KiB reading a 40 MiB log"
    assert (tmp_path / "work" / "plain.log").stat().st_size >= 40 * 2**20


def test_a_crash_carries_the_error_line(tmp_path):
    got, runs = _run(tmp_path, ["mtp1/short_b5", "mtp1/short_b1"], mode="crash_case")
    assert got["mtp1/short_b5"].verdict == "crash"
    assert "exit 3" in got["mtp1/short_b5"].error and "illegal memory access" in got["mtp1/short_b5"].error
    assert got["mtp1/short_b1"].verdict == "not-run" and runs[0].outcome == "crash"


def test_dsparks_platform_refusal_is_refused_not_crash(tmp_path):
    got, _ = _run(tmp_path, ["dspark5/short_b1", "plain/short_b1"], mode="refuse")
    assert got["dspark5/short_b1"].verdict == "refused" and "flashinfer#4380" in got["dspark5/short_b1"].error
    assert got["plain/short_b1"].verdict == "pass"


def test_multi_gpu_engines_run_on_disjoint_device_groups_and_report_their_topology(tmp_path):
    """TP 2 engines on two groups of two GPUs: each engine holds one group alone (CUDA_VISIBLE_DEVICES, mapped
    through the one the node already had), the spec carries the sizes and the report what the engine built."""
    chosen = cases.select(cases.all_cases(), ["plain/short_b1", "mtp1/short_b1", "mtp2/short_b1", "mtp3/short_b1"])
    (tmp_path / "work").mkdir()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "4,5,6,7", "STANDIN_READY_DELAY": "0.3"}
    runs = runner.run_cases(chosen, child=STANDIN, work=tmp_path / "work", deadlines=FAST, parallel=6, env=env,
                            topology=plan.Topology(2, 1), groups=((0, 1), (2, 3)))
    assert all(c.verdict == "pass" for r in runs for c in r.cases)
    assert {r.devices for r in runs} == {(0, 1), (2, 3)} and all(r.devices for r in runs)
    for r in runs:
        assert r.fingerprint["cuda_visible_devices"] == ("4,5" if r.devices == (0, 1) else "6,7")
        assert r.topology == {"tensor_parallel_size": 2, "pipeline_parallel_size": 1}
        assert r.to_json()["topology"] == r.topology and r.to_json()["devices"] == list(r.devices)
        spec = json.loads((tmp_path / "work" / f"{r.engine.name}.spec.json").read_text())
        assert (spec["tensor_parallel_size"], spec["pipeline_parallel_size"]) == (2, 1)
    # one engine at a time on a group: the spans (first event to the child's end) of a group never overlap
    spans: dict[tuple[int, ...], list[tuple[float, float]]] = {}
    for r in runs:
        ts = [e["t"] for e in runner.read_events(tmp_path / "work" / f"{r.engine.name}.events")]
        spans.setdefault(r.devices, []).append((min(ts), max(ts)))
    for group in spans.values():
        group.sort()
        assert all(a[1] <= b[0] for a, b in zip(group, group[1:], strict=False)), spans
    assert runner.visible((1,), {}) == "1" and runner.visible((0, 1), {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}) == \
        "GPU-a,GPU-b"


def test_drafts_with_pipeline_parallelism_are_refused_as_vllm_0_26_0s_config_refuses_them(tmp_path):
    """vLLM 0.26.0 refuses MTP and DSpark drafts with PP > 1 when it builds the engine config (the draft classes
    lack SupportsPP; tests/test_selftest_child.py shows it on vLLM's own code): ``refused``, not a failure; the
    plain engine runs."""
    chosen = cases.select(cases.all_cases(), ["dspark5/short_b1", "mtp1/short_b1", "plain/short_b1"])
    (tmp_path / "work").mkdir()
    runs = runner.run_cases(chosen, child=STANDIN, work=tmp_path / "work", deadlines=FAST, parallel=1,
                            env={**os.environ, "STANDIN_GPUS": "2"}, topology=plan.Topology(1, 2), groups=((0, 1),))
    got = {c.case: c for r in runs for c in r.cases}
    assert got["plain/short_b1"].verdict == "pass"
    for name in ("dspark5/short_b1", "mtp1/short_b1"):
        assert got[name].verdict == "refused", got[name].error
        assert "Pipeline parallelism is not supported for this model" in got[name].error


def test_a_draft_write_into_the_null_block_fails_dspark_even_with_every_token_right(tmp_path):
    """Fix 3b's debug check: the child measures block 0 of the draft's KV cache (null_block_meter; needs a GPU,
    so the stand-in reports it); any byte written there is ``null-block``, a failure, naming the layer."""
    got, _ = _run(tmp_path, ["dspark5/short_b1"], mode="null_block")
    bad = got["dspark5/short_b1"]
    assert bad.verdict == "null-block" and bad.difference is None and "null-block" in runner.FAILING
    assert bad.error == ("the draft wrote KV into the null block (block 0): worker 0: model.layers.4.attn.swa_cache "
                         "(656 bytes) (fix 3b)")
    assert bad.to_json()["null_block"]["written"] == {"worker 0: model.layers.4.attn.swa_cache": 656}
    (tmp_path / "again").mkdir()
    good, _ = _run(tmp_path / "again", ["dspark5/short_b1"])
    assert good["dspark5/short_b1"].verdict == "pass"
    assert good["dspark5/short_b1"].null_block == {"layers": 1, "written": {}, "unmeasured": {}, "skipped": []}
    with pytest.raises(runner.EventError, match="null-block check"):
        runner._check_event({"event": "case_done", "t": 1.0, "case": "x", "null_block": {"written": {"l": -1}}})


def test_drafts_all_accepted_are_inconclusive(tmp_path):
    got, _ = _run(tmp_path, ["mtp2/short_b1"], mode="all_accept")
    assert got["mtp2/short_b1"].verdict == "inconclusive" and "both accepted and rejected" in \
        got["mtp2/short_b1"].error


def test_an_engine_with_too_little_of_the_total_deadline_left_is_not_run(tmp_path):
    """With 2 s of the run's deadline left (an engine needs 10 s to start), the engine is not started and
    its cases are not-run, naming the run's deadline.  A running engine cut by the deadline:
    test_selftest.py's test_the_run_ends_by_its_deadline_counted_from_its_start_not_from_the_engines."""
    cut = runner.Deadlines(start=60, first_case=60, case=60, total=2.0)
    got, runs = _run(tmp_path, ["plain/trio_b3", "plain/mid_b24"], mode="hang_case", deadlines=cut)
    assert got["plain/mid_b24"].verdict == "not-run" and "the run's deadline" in got["plain/mid_b24"].error
    assert runs[0].outcome == "not-run"


def test_report_ok_and_counts():
    e = cases.ENGINES[1]
    good = runner.CaseResult("mtp1/x", "mtp1", "x", "pass", min_gap=19.5)
    refused = runner.CaseResult("dspark5/x", "dspark5", "x", "refused")
    run = runner.EngineRun(e, "done", "", 1.0, {}, [], [good, refused], "")
    ok = runner.Report("py", True, False, [runner.CheckResult("installed", True)], [run], 1.0)
    assert ok.ok and ok.counts()["refused"] == 1 and ok.min_gap() == 19.5
    failing = runner.Report("py", True, False, [runner.CheckResult("installed", False, "stock")], [run], 1.0)
    assert not failing.ok
    hung = runner.EngineRun(e, "hang", "x", None, None, [], [runner.CaseResult("a", "b", "c", "hang")], "")
    assert not runner.Report("py", True, False, [], [hung], 1.0).ok


@pytest.fixture(scope="module")
def lock_and_store(shared_cache):
    return load(ROOT / "locks" / "vllm.toml"), Store.open(shared_cache)


def test_check_installed_without_vllm_fails_and_says_so(lock_and_store):
    lock, store = lock_and_store
    ctx = Context(lock=lock, store=store, progress=Progress.for_output("json"))
    res = runner.check_installed("0.26.0", sys.executable, ctx=ctx, on_gpu=False)
    assert res.ok is False and "vLLM is not installed" in res.note


def test_check_regression_runs_each_series_test_file_in_its_own_process(lock_and_store, tmp_path):
    # This interpreter has no vLLM: every test file of the series fails to import it, each in its own
    # pytest process, and the check says so file by file with the error of each.
    lock, store = lock_and_store
    ctx = Context(lock=lock, store=store, progress=Progress.for_output("json"))
    res = runner.check_regression("0.26.0", sys.executable, ctx=ctx, progress=ctx.progress,
                                  work=tmp_path, on_gpu=False, deadline=300)
    assert res.ok is False
    files = {f["file"]: f for f in res.data["files"]}
    assert "tests/v1/attention/test_dsv4_fix6_indexer_negative_context_lens.py" in files
    assert "tests/kernels/test_dsv4_fix7_topk_lengths.py" in files
    assert all(f["status"] in ("error", "failed") for f in files.values())
    assert all(Path(f["log"]).is_file() and "No module named" in Path(f["log"]).read_text() for f in files.values())
    assert all("No module named" in f["error"] for f in files.values())
    assert "on CPU (Triton interpreter" in res.note and res.data["on_gpu"] is False
