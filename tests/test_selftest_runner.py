"""dsv4patch.selftest.runner: children, deadlines, verdicts; the installed and regression checks.

The engine cases run a STAND-IN engine (tests/selftest_standin_engine.py),
because the real child needs vLLM on a CUDA GPU and this machine has none:
it speaks the child's protocol and generates the designed chain (or, per
STANDIN_MODE, a wrong token, a hang, a crash, a refusal), so the runner's
process handling and the oracle's verdicts are the real ones.  The two
checks run for real: the lock's 0.26.0 patched tree (from the shared test
cache) and an interpreter with no vLLM.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from dsv4patch.lock import load
from dsv4patch.progress import Progress
from dsv4patch.selftest import cases, runner
from dsv4patch.selftest.model import DESIGN
from dsv4patch.store import Store

ROOT = Path(__file__).resolve().parent.parent
STANDIN = [sys.executable, str(ROOT / "tests" / "selftest_standin_engine.py")]
FAST = runner.Deadlines(start=20, first_case=20, case=20, total=120)


def _run(tmp_path, names, mode="pass", deadlines=FAST, parallel=2, force=False):
    chosen = cases.select(cases.all_cases(force_sm120_topk=force), names)
    env = {**os.environ, "STANDIN_MODE": mode}
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
    quick = runner.Deadlines(start=20, first_case=20, case=1.5, total=60)
    t0 = time.monotonic()
    got, runs = _run(tmp_path, ["plain"], mode="hang_case", deadlines=quick)
    assert time.monotonic() - t0 < 30
    assert [got[f"plain/{s}"].verdict for s in ("short_b5", "mid_b24", "long_b3")] == ["pass", "hang", "not-run"]
    assert "prompt set mid_b24: no progress within 2 s" in got["plain/mid_b24"].error
    assert "hang probe" in Path(runs[0].log).read_text()


def test_a_hung_engine_start_is_a_hang_of_its_first_case(tmp_path):
    quick = runner.Deadlines(start=1.5, first_case=20, case=20, total=60)
    got, _ = _run(tmp_path, ["mtp2/short_b5", "mtp2/short_b1"], mode="hang_start", deadlines=quick)
    assert got["mtp2/short_b5"].verdict == "hang" and got["mtp2/short_b5"].error.startswith("engine start: ")
    assert got["mtp2/short_b1"].verdict == "not-run"


def test_a_crash_carries_the_error_line(tmp_path):
    got, runs = _run(tmp_path, ["mtp1/short_b5", "mtp1/short_b1"], mode="crash_case")
    assert got["mtp1/short_b5"].verdict == "crash"
    assert "exit 3" in got["mtp1/short_b5"].error and "illegal memory access" in got["mtp1/short_b5"].error
    assert got["mtp1/short_b1"].verdict == "not-run" and runs[0].outcome == "crash"


def test_dsparks_platform_refusal_is_refused_not_crash(tmp_path):
    got, _ = _run(tmp_path, ["dspark5/short_b1", "plain/short_b1"], mode="refuse")
    assert got["dspark5/short_b1"].verdict == "refused" and "flashinfer#4380" in got["dspark5/short_b1"].error
    assert got["plain/short_b1"].verdict == "pass"


def test_drafts_all_accepted_are_inconclusive(tmp_path):
    got, _ = _run(tmp_path, ["mtp2/short_b1"], mode="all_accept")
    assert got["mtp2/short_b1"].verdict == "inconclusive" and "both accepted and rejected" in \
        got["mtp2/short_b1"].error


def test_the_total_deadline_cuts_a_running_engine_to_not_run(tmp_path):
    cut = runner.Deadlines(start=60, first_case=60, case=60, total=2.0)
    got, runs = _run(tmp_path, ["plain/short_b5", "plain/mid_b24"], mode="hang_case", deadlines=cut)
    assert got["plain/mid_b24"].verdict == "not-run" and "--deadline" in got["plain/mid_b24"].error
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
    res = runner.check_installed(lock, "0.26.0", sys.executable, store, Progress.for_output("json"))
    assert res.ok is False and "vLLM is not installed" in res.note


def test_check_regression_runs_the_series_tests_against_the_interpreters_vllm(lock_and_store):
    # This interpreter has no vLLM: every test file of the series fails to import it, and the check says so.
    lock, store = lock_and_store
    res = runner.check_regression(lock, "0.26.0", sys.executable, store, Progress.for_output("json"), gpu=False,
                                  timeout=300)
    assert res.ok is False
    files = res.data["files"]
    assert "tests/v1/attention/test_dsv4_fix6_indexer_negative_context_lens.py" in files
    assert "tests/kernels/test_dsv4_fix7_topk_lengths.py" in files
    assert res.data["counts"]["failed"] >= len(files) - 1 and "failed" in res.note
