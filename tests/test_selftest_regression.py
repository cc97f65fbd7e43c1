"""dsv4patch.proofs.selftest.regression: each series test file in its own pytest process, everything kept.

Real pytest sessions (this interpreter's pytest) on small test files made
here: a pass, a failure whose own error reaches the report, a skip, a file
whose process dies (a fault stays in its file), a file past its deadline, the
device each test records, and the CPU environment (Triton's interpreter,
``CUDA_VISIBLE_DEVICES`` empty, the CPU plugin) versus the GPU one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dsv4patch.proofs.selftest import regression

GOOD = b'''
import os
def test_ok(record_property):
    record_property("device", "cpu (Triton interpreter)")
    assert os.environ["TRITON_INTERPRET"] == "1" and os.environ["CUDA_VISIBLE_DEVICES"] == ""
def test_plugin_loaded(request):
    assert request.config.pluginmanager.has_plugin("dsv4patch_cpu_plugin")
'''
BAD = b'''
import pytest
def test_wrong():
    assert [0, 0] == [-1, 0], "padded request's lengths"
def test_skip():
    pytest.skip("needs SM90")
'''
DIES = b'''
import os
def test_dies():
    os.abort()
'''
SLOW = b'''
import time
def test_slow():
    time.sleep(60)
'''


def _run(tmp_path, tests, **kw):
    kw.setdefault("on_gpu", False)
    kw.setdefault("deadline", 120)
    return regression.run_regression({f"tests/{k}": v for k, v in tests.items()}, python=sys.executable,
                                     work=tmp_path, **kw)


@pytest.fixture
def torch_stub(monkeypatch, tmp_path):
    """The CPU plugin imports torch in pytest_configure and this interpreter has none: a STAND-IN
    ``torch`` (an accelerator-less one, as on a CPU host) on the sessions' PYTHONPATH."""
    stub = tmp_path / "stub"
    (stub / "torch").mkdir(parents=True)
    (stub / "torch" / "__init__.py").write_text(
        "class accelerator:\n    @staticmethod\n    def is_available():\n        return False\n"
        "    @staticmethod\n    def empty_cache():\n        raise RuntimeError('no accelerator')\n")
    orig = regression.environment

    def with_stub(base, *, on_gpu, plugin_dir):
        env = orig(base, on_gpu=on_gpu, plugin_dir=plugin_dir)
        env["PYTHONPATH"] = f"{env.get('PYTHONPATH', '')}:{stub}"
        return env

    monkeypatch.setattr(regression, "environment", with_stub)


def test_each_file_alone_its_outcomes_errors_devices_and_logs(tmp_path, torch_stub):
    res = _run(tmp_path / "w", {"a/test_good.py": GOOD, "a/test_bad.py": BAD, "b/test_dies.py": DIES})
    by = {f.file: f for f in res.files}
    assert by["tests/a/test_good.py"].status == "passed" and by["tests/a/test_good.py"].count("passed") == 2
    assert by["tests/a/test_good.py"].devices() == ["cpu (Triton interpreter)"]
    bad = by["tests/a/test_bad.py"]
    assert bad.status == "failed" and bad.count("skipped") == 1
    wrong = next(t for t in bad.tests if t.outcome == "failed")
    assert wrong.test == "tests/a/test_bad.py::test_wrong" and "padded request's lengths" in wrong.message
    dies = by["tests/b/test_dies.py"]
    assert dies.status == "error" and "killed by SIGABRT" in dies.error
    assert all(Path(f.log).is_file() for f in res.files)
    assert "test_wrong" in Path(bad.log).read_text()
    assert not res.ok and res.counts() == {"passed": 2, "failed": 1, "skipped": 1}
    assert res.failures()[0].startswith("tests/a/test_bad.py::test_wrong: ")


def test_on_a_gpu_node_the_cpu_setup_is_not_applied(tmp_path):
    probe = b'''
import os
def test_env():
    assert "TRITON_INTERPRET" not in os.environ and "CUDA_VISIBLE_DEVICES" not in os.environ
'''
    import os

    base = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES")}
    res = _run(tmp_path / "w", {"test_env.py": probe}, on_gpu=True, base_env={**base, "TRITON_INTERPRET": "1"})
    assert res.ok, res.failures()


def test_a_file_past_its_deadline_is_a_timeout_and_the_others_still_run(tmp_path):
    ok = b"def test_fine():\n    pass\n"
    res = _run(tmp_path / "w", {"test_slow.py": SLOW, "test_fine.py": ok}, on_gpu=True, deadline=8)
    by = {f.file: f for f in res.files}
    assert by["tests/test_slow.py"].status == "timeout" and by["tests/test_fine.py"].status == "passed"


@pytest.mark.parametrize("rel", ["tests/../evil.py", "/etc/x.py", "other/test_x.py", "tests/x.txt"])
def test_a_path_outside_tests_is_refused(tmp_path, rel):
    with pytest.raises(ValueError):
        regression.write_tests({rel: b""}, tmp_path)
