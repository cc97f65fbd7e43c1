"""tests/conftest.py's setup budget and module order, on a real inner pytest run.

A test whose setup takes longer than the budget (a tiny one here: 0.01 s, times the load per
core, against a fixture that sleeps 1.5 s) fails on a warm cache and is only listed
(at the end of the run) on a cold one (``DSV4PATCH_TEST_COLD=1``), also under xdist, where
the reports are made on the workers and summed up on the controller.  Under
``--dist loadfile`` the modules named in SLOW_FIRST are handed out first, although
pytest-xdist would otherwise start with the modules that have the most tests.  The run's
temporary directories go on the tmpfs when it has room.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import ROOT

INNER_CONFTEST = f"""\
import importlib.util
import sys

_spec = importlib.util.spec_from_file_location("suite_conftest", {str(ROOT / "tests" / "conftest.py")!r})
_suite = sys.modules["suite_conftest"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)
_suite.SLOW_FIRST = ("test_z_slow.py",)
pytest_configure = _suite.pytest_configure
pytest_collection_modifyitems = _suite.pytest_collection_modifyitems
pytest_runtest_makereport = _suite.pytest_runtest_makereport
pytest_runtest_logreport = _suite.pytest_runtest_logreport
pytest_terminal_summary = _suite.pytest_terminal_summary
"""

INNER_TESTS = """\
import time

import pytest


@pytest.fixture
def slow():
    time.sleep(1.5)


@pytest.fixture
def quick():
    pass


def test_slow_setup(slow):
    pass


def test_quick_setup(quick):
    pass
"""


def inner(tmp_path: Path, *args: str, cold: bool, tests: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(INNER_CONFTEST)
    for name, text in (tests or {"test_inner.py": INNER_TESTS}).items():
        (tmp_path / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DSV4PATCH_TEST_SETUP_BUDGET": "0.01",
           "DSV4PATCH_TEST_COLD": "1" if cold else "0"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
                           str(tmp_path), *args, str(tmp_path)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)


def test_a_slow_setup_fails_on_a_warm_cache(tmp_path: Path) -> None:
    res = inner(tmp_path, cold=False)
    assert res.returncode == 1, res.stdout
    assert "1 passed, 1 error" in res.stdout
    assert "budget for a warm cache (0.01 s at the load now" in res.stdout and "test_slow_setup" in res.stdout


def test_a_slow_setup_is_listed_on_a_cold_cache_also_under_xdist(tmp_path: Path) -> None:
    res = inner(tmp_path, "-n", "2", cold=True)
    assert res.returncode == 0, res.stdout
    assert "2 passed" in res.stdout
    listed = res.stdout.split("setups over the 0.01 s warm-cache budget (cold run)", 1)[1].split("slowest modules", 1)[0]
    assert "test_inner.py::test_slow_setup" in listed and "test_quick_setup" not in listed
    most_cpu = res.stdout.split("= most CPU (s user+system", 1)[1].split("passed in", 1)[0]
    assert "setup    test_inner.py::test_slow_setup" in most_cpu, res.stdout


def test_the_slow_modules_are_handed_out_first_under_loadfile(tmp_path: Path) -> None:
    """One worker (-vv: -q is inner's), so the order the tests ran in is the order the modules were handed out:
    test_z_slow.py (SLOW_FIRST) first, before test_a_many.py's five tests (xdist's own reorder
    by test count would start with those)."""
    many = "\n".join(f"def test_{i}():\n    pass\n" for i in range(5))
    res = inner(tmp_path, "-vv", "-n", "1", "--dist", "loadfile", cold=True,
                tests={"test_a_many.py": many, "test_z_slow.py": "def test_slow():\n    pass\n"})
    assert res.returncode == 0, res.stdout
    ran = [line.split()[-1] for line in res.stdout.splitlines() if line.startswith("[gw0]") and "PASSED" in line]
    assert len(ran) == 6 and ran[0] == "test_z_slow.py::test_slow", ran


def test_the_run_puts_its_temporary_directories_on_the_tmpfs_when_it_has_room(tmp_path: Path) -> None:
    """tmpfs_temproot: the basetemp (the workers' too) goes below TMPFS when it has room; not where the
    caller chose (DSV4PATCH_TEST_TMPFS=0, PYTEST_DEBUG_TEMPROOT), nor where TMPFS has too little room."""
    shm, other = tmp_path / "shm", tmp_path / "elsewhere"
    shm.mkdir()
    other.mkdir()
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "conftest.py").write_text(INNER_CONFTEST + textwrap.dedent("""\
        import os
        from pathlib import Path
        _suite.TMPFS = Path(os.environ["INNER_TMPFS"])
        _suite.TMPFS_MIN_FREE = int(os.environ["INNER_MIN_FREE"])
        _suite.TMPFS_MIN_AVAILABLE = 0
        """))
    (proj / "test_where.py").write_text("import os, pathlib\n\ndef test_where(tmp_path):\n"
                                        "    pathlib.Path(os.environ['INNER_OUT']).write_text(str(tmp_path))\n")
    out = tmp_path / "where.txt"
    base = {k: v for k, v in os.environ.items() if k not in ("PYTEST_DEBUG_TEMPROOT", "DSV4PATCH_TEST_TMPFS")}

    def where(*args: str, min_free: int = 0, **env: str) -> Path:
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
                              str(proj), *args, str(proj)], capture_output=True, text=True, cwd=proj, timeout=300,
                             env={**base, "PYTHONPATH": str(ROOT), "INNER_TMPFS": str(shm),
                                  "INNER_MIN_FREE": str(min_free), "INNER_OUT": str(out), "TMPDIR": str(other),
                                  **env})
        assert res.returncode == 0, res.stdout + res.stderr
        return Path(out.read_text())

    assert where().is_relative_to(shm)
    assert where("-n", "2").is_relative_to(shm)  # each worker's basetemp is below the controller's
    assert where(DSV4PATCH_TEST_TMPFS="0").is_relative_to(other)
    assert where(PYTEST_DEBUG_TEMPROOT=str(other)).is_relative_to(other)
    assert where(min_free=1 << 62).is_relative_to(other)  # no room: pytest's default
