"""verify --upstream-tests: upstream's own tests of each fix, on the patched 0.27.1.

The test files come from the locked 0.28.0 sdist (the first release with
#51538); nothing of them is in this repository.  Each listed test must pass on
the patched pin and fail on the unpatched one, or say why not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LOCK, ROOT
from dsv4patch.errors import PatchFileError
from dsv4patch.proofs import upstream_tests
from dsv4patch.series.patches import load_patch


@pytest.mark.network
@pytest.mark.slow
def test_upstream_tests_pass_patched_and_fail_unpatched_on_0271(shared_cache, cli):
    res = cli("verify", "--lock", LOCK, "--pin", "0.27.1", "--upstream-tests", "--from", "0.28.0",
              "--cache-dir", shared_cache, "--format", "json")
    assert res.out.strip().startswith("{"), (res.rc, res.err[-3000:])
    rep = json.loads(res.out)
    assert rep["pin"] == "0.27.1" and rep["from"] == "0.28.0"
    by_patch: dict[str, list[dict]] = {}
    for t in rep["tests"]:
        by_patch.setdefault(t["patch"][:4], []).append(t)
    # Fixes 1-5 have upstream tests (fix 6 has none upstream; fix 7's are GPU-only);
    # extra 1 is covered by 0.28.0's reused-group test, on a GPU.
    assert sorted(by_patch) == ["0001", "0002", "0003", "0004", "0005", "0008"], by_patch
    for t in rep["tests"]:
        if t["mode"] == "gpu":
            assert t["verdict"] == "gpu only (not run here)", t
            continue
        assert t["patched"].startswith("passed"), t
        if t["verdict"] != "evidence":
            # The one listed exception: GPT-OSS's constants must stay as they are.
            assert t["verdict"].startswith("expected: passes unpatched too (GPT-OSS"), t
            assert t["unpatched"] == "passed"
        else:
            assert t["unpatched"].startswith(("failed", "not collected")), t
    # The device-hard-coded Triton test of fix 3 runs on CPU and proves the
    # rejected rows' position 0.
    fix3 = [t for t in by_patch["0003"] if "excludes_rejected_context_suffix" in t["nodeid"]]
    assert fix3 and fix3[0]["mode"] == "cpu-device" and fix3[0]["verdict"] == "evidence"
    assert res.rc == 0


@pytest.mark.network
def test_upstream_tests_from_a_release_without_them_is_refused(shared_cache, cli):
    # 0.27.1 predates #51538: its sdist has no tests/v1/worker/test_workspace.py.
    res = cli("verify", "--lock", LOCK, "--pin", "0.27.1", "--upstream-tests", "--from", "0.27.1",
              "--cache-dir", shared_cache, "--format", "json")
    assert res.rc == 3, (res.out, res.err)
    err = json.loads(res.out)["error"]
    assert "is not in vLLM 0.27.1" in err["message"] and "Upstream-Test" in err["message"]


def test_upstream_test_lines_are_parsed_and_validated(tmp_path):
    patch = load_patch(ROOT / "patches/0003-DSV4-fix-3-Pad-DFlash-sample-rows-and-guard-draft-KV.patch")
    tests = upstream_tests.declared(patch)
    assert [t.mode for t in tests] == ["cpu-device", "cpu-device"]
    assert tests[0].path == "tests/v1/spec_decode/test_dflash_prepare_inputs.py"

    bad = tmp_path / "0001-x.patch"
    text = (ROOT / "patches/0006-DSV4-fix-6-Clamp-indexer-MTP-decode-context-lengths-.patch").read_text()
    bad.write_text(text.replace(
        "Upstream-Marker:", "Upstream-Test: tests/x.py::test_y [cuda-only]\nUpstream-Marker:", 1))
    with pytest.raises(PatchFileError, match="bad Upstream-Test: line"):
        upstream_tests.declared(load_patch(bad))


def test_cpu_device_rewrite():
    src = (
        'pytestmark = pytest.mark.skipif(\n    not torch.cuda.is_available(), reason="x"\n)\n'
        'device = torch.device("cuda")\nt = torch.zeros(1, device="cuda:0")\n'
        "torch.accelerator.synchronize()\nname = 'cudagraph'\n"
    )
    out = upstream_tests.cpu_device(src)
    assert "skipif(\n    False," in out
    assert 'torch.device("cpu")' in out and 'device="cpu"' in out
    assert "synchronize" not in out and "'cudagraph'" in out


def test_every_declared_upstream_test_file_is_not_in_this_repository():
    """The upstream tests are a test input only: none is copied here."""
    paths = {t.path for p in sorted((ROOT / "patches").rglob("*.patch"))
             for t in upstream_tests.declared(load_patch(p))}
    assert paths
    assert not [p for p in paths if (ROOT / p).exists() or (ROOT / "tests" / Path(p).name).exists()]


@pytest.mark.network
@pytest.mark.slow
def test_one_session_runs_the_listed_tests_beside_a_module_that_does_not_collect(cpu_testenv, tmp_path):
    """pytest given node ids runs nothing when one of their modules cannot be imported ("found no
    collectors"); run_nodeids names the files and the CPU plugin picks the node ids, so one session
    reports the broken module's tests as not collected and runs the others (a parametrized test's
    cases; a test not listed is not run), and a node id that names no test is said to have run nothing."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('n', [1, 2])\ndef test_b(n):\n    assert n == 1\n\n"
        "def test_other():\n    raise AssertionError('not listed: never run')\n\n"
        "def test_m():\n    pass\n")
    (tmp_path / "tests" / "test_broken.py").write_text("from nowhere import x\n\ndef test_z():\n    pass\n")
    ids = ["tests/test_broken.py::test_z", "tests/test_x.py::test_b", "tests/test_x.py::test_m",
           "tests/test_x.py::test_nope"]
    out = upstream_tests.run_nodeids(cpu_testenv, tmp_path, ids, tmp_path / "r.xml")
    assert out[ids[0]].status == "not collected" and "nowhere" in out[ids[0]].detail, out
    assert (out[ids[1]].status, out[ids[1]].cases) == ("failed", 2) and "assert 2 == 1" in out[ids[1]].detail
    assert (out[ids[2]].status, out[ids[2]].cases) == ("passed", 1), out
    assert out[ids[3]].status == "not run" and "ran no test" in out[ids[3]].detail, out
    log = (tmp_path / "r.xml.log").read_text()
    assert "1 deselected" in log  # test_other: not listed, not run


def test_the_default_release_is_the_locks_first_with_the_fixes_and_verify_help_names_it():
    """Without --from: the lock's 0.28.0 (the first release with #51538, whose patches are all upstream
    there), the default verify's help prints."""
    from dsv4patch.pins import load_lock
    from dsv4patch.proofs import UPSTREAM_DEFAULT_FROM, upstream_source_pin

    pin = upstream_source_pin(load_lock(LOCK), None)
    assert pin.name == UPSTREAM_DEFAULT_FROM == "0.28.0"
    res = subprocess.run([sys.executable, "-m", "dsv4patch", "verify", "--help"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert res.returncode == 0 and "(default: 0.28.0)" in " ".join(res.stdout.split()), res.stderr
