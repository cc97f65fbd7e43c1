"""``dsv4patch selftest`` (commands/selftest.py): --help without torch or vLLM, --list, the JSON contract, exit codes.

Engine cases use the STAND-IN engine (tests/selftest_standin_engine.py; no GPU here) behind a
stand-in interpreter given as --python: it drops the real child's path and runs the stand-in
with the same arguments, so everything else (the runner, the oracle, the rendering) is real.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import validate_json
from dsv4patch.proofs.selftest import runner

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "selftest_standin_engine.py"


def _interpreter(tmp_path: Path) -> Path:
    """A --python that runs the stand-in engine in place of child.py (argv: -X faulthandler CHILD SPEC PROGRESS)."""
    py = tmp_path / "standin-python"
    py.write_text(f'#!/bin/sh\nshift 3\nexec "{sys.executable}" "{STANDIN}" "$@"\n')
    py.chmod(0o755)
    return py


def test_help_works_without_torch_or_vllm():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['vllm'] = None\n"
            "from dsv4patch.main import main\nsys.exit(main(['selftest', '--help']))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "--force-sm120-topk" in res.stdout and "DIAGNOSTIC" in res.stdout and "exit codes:" in res.stdout
    assert "differs (first request" in res.stdout
    assert "--tensor-parallel-size N" in res.stdout and "--pipeline-parallel-size M" in res.stdout


def test_list_names_checks_and_cases(cli):
    res = cli("selftest", "--list")
    names = res.out.split()
    assert res.rc == 0 and names[:2] == ["installed", "regression"] and "dspark5/long_b1" in names
    assert "mtp1-sm120topk/mid_b24" not in names
    assert "mtp1-sm120topk/mid_b24" in cli("selftest", "--list", "--force-sm120-topk").out.split()


def test_json_validates_and_a_pass_exits_0(cli, tmp_path):
    res = cli("selftest", "--python", _interpreter(tmp_path), "--cases", "plain/short_b1,mtp1/short_b1",
              "--cases", "dspark5/short_b1", "--work", tmp_path / "w", "--format", "json", "--parallel", "2")
    data = validate_json("selftest", res.out)
    assert res.rc == 0 and data["ok"] is True and data["checks"] == []
    assert [c["case"] for c in data["cases"]] == ["plain/short_b1", "mtp1/short_b1", "dspark5/short_b1"]
    assert data["counts"]["pass"] == 3 and 19 < data["min_gap"] < 20
    mtp = data["cases"][1]
    assert 0 < mtp["acceptance"]["accepted"] < mtp["acceptance"]["drafted"]
    assert mtp["acceptance"] == mtp["expected_acceptance"]
    assert data["work"] == str(tmp_path / "w") and Path(data["engines"][0]["log"]).is_file()


def test_the_run_ends_by_its_deadline_counted_from_its_start_not_from_the_engines(cli, tmp_path, monkeypatch):
    """--deadline bounds the whole verb: a slow environment probe (torch and vLLM importing on a busy node)
    comes out of the engines' time.  On the H200 (2026-12-04) a run with --deadline 145 was still going at
    190 s: the engines' deadline was counted from their launch, after the probe."""
    # The engine is launched after the probe's 4 s with 4 s left: an engine needs runner.MIN_ENGINE_SECONDS
    # left to be started, 1 s here in place of 10 (which would make the run 15 s; the real 10:
    # test_selftest_runner's test_an_engine_with_too_little_of_the_total_deadline_left_is_not_run), so a
    # probe slowed 2 s by a loaded machine still leaves the engine started.  A deadline counted from the
    # engines' launch would end the run at 4 + 8 s at the earliest.
    monkeypatch.setattr(runner, "MIN_ENGINE_SECONDS", 1.0)
    monkeypatch.setenv("STANDIN_PROBE_DELAY", "4")
    monkeypatch.setenv("STANDIN_MODE", "hang_start")
    t0 = time.monotonic()
    res = cli("selftest", "--python", _interpreter(tmp_path), "--cases", "plain/short_b1", "--deadline", "8",
              "--start-deadline", "60", "--work", tmp_path / "w", "--format", "json")
    took = time.monotonic() - t0
    data = validate_json("selftest", res.out)
    assert data["cases"][0]["verdict"] == "not-run", data["cases"][0]
    assert data["cases"][0]["error"].startswith("cut by the run's deadline during engine start"), data["cases"][0]
    assert data["seconds"] < 8 + 3 and took < 8 + 4.5, (data["seconds"], took)


def test_a_differing_case_exits_1_and_the_table_names_it(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_MODE", "differs")
    res = cli("selftest", "--python", _interpreter(tmp_path), "--cases", "mtp1/short_b5", "--work", tmp_path / "w")
    assert res.rc == 1
    assert "differs" in res.out and "request 1, token 7" in res.out and "SELFTEST FAILED" in res.out


def test_an_unknown_case_is_a_usage_error(cli):
    res = cli("selftest", "--cases", "mtp9", "--format", "json")
    assert res.rc == 2 and "no such case" in json.loads(res.out)["error"]["message"]
    assert cli("selftest", "--parallel", "0").rc == 2


def test_the_installed_check_of_an_environment_without_vllm_fails(cli, tmp_path, shared_cache):
    res = cli("selftest", "--cases", "installed", "--python", sys.executable, "--cache-dir", shared_cache,
              "--pin", "0.26.0", "--format", "json", "--work", tmp_path / "w")
    data = validate_json("selftest", res.out)
    assert res.rc == 1 and data["cases"] == [] and data["checks"][0]["name"] == "installed"
    assert data["checks"][0]["ok"] is False and "not installed" in data["checks"][0]["note"]


def test_without_a_gpu_the_engine_cases_need_one_at_once_and_the_summary_says_so(cli, tmp_path, monkeypatch):
    # The stand-in's probe answers for a machine with no CUDA device (STANDIN_GPU=none).
    monkeypatch.setenv("STANDIN_GPU", "none")
    res = cli("selftest", "--python", _interpreter(tmp_path), "--cases", "plain,mtp1/short_b1", "--work",
              tmp_path / "w", "--format", "json")
    data = validate_json("selftest", res.out)
    assert res.rc == 0 and data["gpu"] is False and data["counts"]["needs-gpu"] == 7
    assert {c["verdict"] for c in data["cases"]} == {"needs-gpu"}
    assert data["engines"][0]["detail"].startswith("needs a CUDA GPU")
    assert "7 engine case(s) need a CUDA GPU (none here)" in data["not_proven"]
    assert not (tmp_path / "w" / "plain.log").exists()  # nothing was started
    text = cli("selftest", "--python", _interpreter(tmp_path), "--cases", "plain/short_b1", "--work", tmp_path / "t")
    assert "not proven here: 1 engine case(s) need a CUDA GPU" in " ".join(text.out.split())


def test_a_gpu_with_too_little_free_memory_refuses_the_engines_with_both_figures(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_GPU", "small")  # 4 GiB free of 139.8
    res = cli("selftest", "--python", _interpreter(tmp_path), "--cases", "plain/short_b1", "--work", tmp_path / "w",
              "--format", "json")
    data = validate_json("selftest", res.out)
    assert res.rc == 1 and data["cases"][0]["verdict"] == "not-run"
    assert "one engine needs 16.0 GiB free on the GPU, 4.0 of 139.8 GiB are free" in data["cases"][0]["error"]


def test_engines_are_sized_from_the_gpus_free_memory(cli, tmp_path):
    res = cli("selftest", "--python", _interpreter(tmp_path), "--cases", "plain/short_b1,mtp1/short_b1", "--work",
              tmp_path / "w", "--format", "json", "--parallel", "64")
    data = validate_json("selftest", res.out)
    sizing = data["sizing"]
    assert res.rc == 0 and sizing["parallel"] == 8 and sizing["gpu_memory_utilization"] == 0.115
    spec = json.loads(next((Path(data["work"])).glob("plain.spec.json")).read_text())
    assert spec["gpu_memory_utilization"] == 0.115 and spec["kv_cache_bytes"] == 6 * 2**30


@pytest.mark.parametrize("bad", ["missing", "dir", "noexec"])
def test_an_unusable_python_is_a_usage_error(cli, tmp_path, bad):
    path = tmp_path / "py"
    if bad == "dir":
        path.mkdir()
    elif bad == "noexec":
        path.write_text("#!/bin/sh\n")
    res = cli("selftest", "--python", path, "--cases", "plain/short_b1", "--work", tmp_path / "w", "--format", "json")
    assert res.rc == 2, res.out
    assert str(path) in json.loads(res.out)["error"]["message"]


def test_a_python_that_is_not_an_interpreter_is_a_usage_error(cli, tmp_path):
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\necho not json; exit 3\n")
    fake.chmod(0o755)
    res = cli("selftest", "--python", fake, "--cases", "plain/short_b1", "--work", tmp_path / "w", "--format", "json")
    assert res.rc == 2 and "not a working Python interpreter" in json.loads(res.out)["error"]["message"]


@pytest.mark.parametrize(("option", "value"), [("--deadline", "inf"), ("--deadline", "nan"),
                                               ("--start-deadline", "inf"), ("--case-deadline", "-1"),
                                               ("--kv-cache-gib", "inf"), ("--kv-cache-gib", "0"),
                                               ("--parallel", "0"), ("--parallel", "1e9")])
def test_number_options_must_be_finite_and_in_range(cli, option, value):
    res = cli("selftest", "--cases", "plain/short_b1", option, value)
    assert res.rc == 2 and option in res.err


def test_links_planted_in_an_existing_work_directory_are_never_written_through(cli, tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    for name in ("plain.log", "plain.spec.json", "plain.events", "plain.stacks.txt", "tiny-dsv4"):
        (work / name).symlink_to(victim)
    res = cli("selftest", "--python", _interpreter(tmp_path), "--cases", "plain/short_b1", "--work", work,
              "--format", "json")
    data = validate_json("selftest", res.out)
    assert res.rc == 0 and victim.read_text() == "precious\n"
    run_dir = Path(data["work"])
    assert run_dir.parent == work and run_dir.name.startswith("selftest-") and (run_dir / "plain.log").is_file()
    assert oct(run_dir.stat().st_mode & 0o777) == "0o700"


def test_without_a_lock_the_checks_take_the_installed_sbom_and_say_when_there_is_none(cli, tmp_path, monkeypatch):
    # A node with only `pip install dsv4patch`: no lock here or above, none in $DSV4PATCH_LOCK.  This
    # interpreter has no vLLM, so there is no SBOM: installed fails, regression cannot know the tests.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DSV4PATCH_LOCK", raising=False)
    res = cli("selftest", "--cases", "installed,regression", "--python", sys.executable, "--format", "json",
              "--work", tmp_path / "w")
    data = validate_json("selftest", res.out)
    checks = {c["name"]: c for c in data["checks"]}
    assert res.rc == 1 and checks["installed"]["ok"] is False and "vLLM is not installed" in checks["installed"]["note"]
    assert checks["regression"]["ok"] is None and "no lock and no installed dsv4patch SBOM" in \
        checks["regression"]["note"]


def test_tensor_and_pipeline_parallel_sizes_reach_every_engine_and_the_report(cli, tmp_path, monkeypatch):
    """A (stand-in) node of four GPUs, TP 2: two engines at once on disjoint pairs; the JSON and the text say
    the topology asked and the one each engine built."""
    monkeypatch.setenv("STANDIN_GPUS", "4")
    args = ["selftest", "--python", _interpreter(tmp_path), "--cases", "plain/short_b1,mtp1/short_b1,mtp2/short_b1",
            "--tensor-parallel-size", "2"]
    res = cli(*args, "--work", tmp_path / "w", "--format", "json")
    data = validate_json("selftest", res.out)
    assert res.rc == 0 and data["counts"]["pass"] == 3
    assert data["topology"] == {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "gpus_per_engine": 2}
    assert data["sizing"]["gpus_per_engine"] == 2 and data["sizing"]["groups"] == [[0, 1], [2, 3]]
    assert {tuple(e["devices"]) for e in data["engines"]} <= {(0, 1), (2, 3)}
    assert all(e["topology"] == {"tensor_parallel_size": 2, "pipeline_parallel_size": 1} for e in data["engines"])
    assert "topology: tensor parallel 2 x pipeline parallel 1 (2 GPUs per engine)" in data["notes"]
    text = cli(*args, "--work", tmp_path / "w2")
    assert text.rc == 0 and "topology: tensor parallel 2 x pipeline parallel 1 (2 GPUs per engine)" in text.out
    one = cli("selftest", "--python", _interpreter(tmp_path), "--cases", "plain/short_b1", "--work", tmp_path / "w3",
              "--format", "json")
    assert validate_json("selftest", one.out)["topology"] == {
        "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "gpus_per_engine": 1}


def test_too_few_gpus_for_the_topology_exits_2_before_anything_starts(cli, tmp_path, monkeypatch):
    """The real probe under this interpreter (no GPU here), then a stand-in node of two GPUs asked for four."""
    res = cli("selftest", "--python", sys.executable, "--cases", "plain/short_b1", "--pipeline-parallel-size", "2",
              "--work", tmp_path / "w", "--format", "json")
    err = json.loads(res.out)["error"]
    assert res.rc == 2 and err["exit_code"] == 2 and err["kind"] == "environment"
    assert "tensor parallel 1 x pipeline parallel 2 (2 GPUs per engine) needs 2 CUDA devices" in err["message"]
    assert "sees 0 (none); nothing was started" in err["message"]
    monkeypatch.setenv("STANDIN_GPUS", "2")
    res = cli("selftest", "--python", _interpreter(tmp_path), "--cases", "plain/short_b1",
              "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2", "--work", tmp_path / "w2")
    assert res.rc == 2 and not list((tmp_path / "w2").glob("*.events"))


@pytest.mark.parametrize("option,value", [("--tensor-parallel-size", "3"), ("--tensor-parallel-size", "16"),
                                          ("--tensor-parallel-size", "0"), ("--pipeline-parallel-size", "5"),
                                          ("--pipeline-parallel-size", "0"), ("--pipeline-parallel-size", "x")])
def test_a_topology_the_tiny_model_cannot_shard_is_a_usage_error(cli, option, value):
    assert cli("selftest", option, value, "--list").rc == 2
