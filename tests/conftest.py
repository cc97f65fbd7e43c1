"""Shared fixtures: a real git "vLLM-like" upstream, lock builders, CLI runner.

Tests use real git and, for the sdist pins, the real vLLM sdists from PyPI,
downloaded once into a shared cache so a warm machine never re-downloads:
``$DSV4PATCH_TEST_CACHE``, default the CLI's own cache (``$DSV4PATCH_CACHE``, else
``~/.cache/dsv4patch``), so the README's test command reuses what its first command
(the card's apply) fetched and compiled: the pin's tree, torch, nvcc, the kernel objects.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from dsv4patch.main import main

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "locks" / "vllm.toml"
# The narrowed arch list two tests build 0.27.1's kernels for in the shared cache: test_kernels'
# PTX check and test_toolchain's byte-identity build (`dsv4patch build --arch`, its independent
# build).  The same tree, toolchain, flags and archs give the same object keys, so a run compiles
# these objects once for both (issue 39); test_kernels asserts that the keys agree.
PTX_ARCH = "12.0+PTX"


def validate_json(command: str, text: str) -> dict:
    """Parse TEXT (a command's --format json output) and validate it against schemas/COMMAND."""
    import json

    import jsonschema

    data = json.loads(text)
    assert data["schema_version"] == 1
    schema = json.loads((ROOT / "schemas" / f"{command}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(data)
    return data


def sh(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t", GIT_AUTHOR_DATE="2001-01-01T00:00:00Z",
               GIT_COMMITTER_DATE="2001-01-01T00:00:00Z")
    return subprocess.run(
        ["git", "-c", "init.defaultBranch=main", *args], cwd=cwd, env=env, check=True,
        capture_output=True, text=True,
    ).stdout.strip()


# Modules that take minutes (CUDA compiles, pytest sessions in the vLLM venv, a Docker
# build, the stock wheels' downloads) run first, so that with ``-n 2 --dist loadfile``
# the short ones fill the other worker instead of waiting behind a long one at the end.
# pytest-xdist (3.6+) reorders loadfile/loadscope/loadgroup work by the number of tests per
# module unless told not to (it ran test_docs' 300 quick cases first and test_verify last, so
# one worker ended alone on it): pytest_configure turns that off, and the order is this one.
# test_selftest_child (vLLM 0.26.0 engines started on CPU, ~3.5 min in the last CI run),
# test_docs (the forks page's journey, 1.5-3 min), test_card_command and test_terminal (verify
# in a terminal, 1-1.5 min) came late in file order, where one of them could end the run alone.
# The suite is CPU-bound on two cores.  Three modules mostly wait (test_selftest_runner and
# test_selftest: their children sleep out deadlines, ~55 s of wall time for ~10 CPU s; and
# test_hostile_delivery: its trickling servers and minimum-rate cuts, ~35 s for ~15 CPU s): they come
# after test_selftest_child, so that one worker waits in them while the other runs that module's two
# vLLM engine children at once (beside a compile, ci50, a core idled through them: 20-43 % of both
# cores for ~100 s).  The two modules that compile CUDA (test_toolchain, test_kernels) never run
# together: two ptxas at once on these 2 vCPUs each take 1.5-1.9x the CPU seconds they take alone
# (process accounting of ci46 against ci49: 28-32 -> 41-45 s, 6 -> 11.6 s; docs/benchmarks.md), so
# test_toolchain starts beside test_verify (the CPU test venv's pip install and pytest sessions: no
# compiler) and the Docker build (no compiler: the kernel wheel is built from cached objects), and
# test_kernels comes after test_toolchain is done; test_selftest_model (~1 min of torch) comes before
# the quick ones (a CI run ended on it, one worker idle for 76 s).
SLOW_FIRST = ("test_toolchain.py", "test_verify.py", "test_docker_build.py", "test_selftest_child.py",
              "test_selftest_runner.py", "test_selftest.py", "test_hostile_delivery.py",
              "test_upstream_tests.py", "test_kernels.py",
              "test_selftest_model.py", "test_docs.py", "test_vllm_wheel.py", "test_kernels_runtime.py",
              "test_flashinfer_matrix.py", "test_testenv.py", "test_testrun.py", "test_recovery.py",
              "test_index_delivery.py", "test_hostile.py",
              "test_card_command.py", "test_terminal.py", "test_pins.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return SLOW_FIRST.index(name) if name in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)  # stable: the order within a module is kept


# Disk: the suite's trees, wheels and venvs are GBs, and CI's disk is small (it once failed
# with ENOSPC).  pyproject.toml sets tmp_path_retention_policy = "failed", so a passing test's
# tmp_path is removed when it ends; the directories a module's fixtures make with
# tmp_path_factory.mktemp are removed here when the module is done, unless one of its tests
# failed (then they stay for a look, as a failed test's tmp_path does).  Directories that a
# session-scoped fixture makes (e.g. vllm026) outlive the module that first asked for it.
_FAILED_MODULES: set[str] = set()
_SESSION_DIRS: set[Path] = set()


class _SessionDirs:
    """Records what session-scoped fixtures make in the basetemp.  A plugin object, not a
    conftest hook: a session fixture is set up on the Session node, which the hooks of
    tests/conftest.py (scoped to tests/) do not see."""

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest):
        if fixturedef.scope != "session" or fixturedef.argname == "tmp_path_factory":
            return (yield)
        base = request.config._tmp_path_factory.getbasetemp()
        before = set(base.iterdir())
        try:
            return (yield)
        finally:
            _SESSION_DIRS.update(set(base.iterdir()) - before)


# Where the temporary directories go (issue 39): tmpfs, when /dev/shm is one with room.  The suite
# makes and removes hundreds of thousands of files (vLLM trees, venvs, git repositories); on the
# ext4 disk of a 2-core CI VM that churn cost far more system time than the work itself
# (tests/test_pins.py and tests/test_hostile.py together: 53-69 CPU s of system time with their
# tmp_path on the disk, 10 s on tmpfs, the same 78 tests passing).  The shared cache stays where
# it is (on the disk: it is the CLI's own cache), so trees on tmpfs are made from a cache on another
# filesystem, as a user's tree and cache often are.  PYTEST_DEBUG_TEMPROOT (pytest's own variable)
# or --basetemp choose another place; DSV4PATCH_TEST_TMPFS=0 keeps the default (the system's
# temporary directory).  A test that needs the disk (hard links into the shared cache, a cache timed
# as a user's) makes its directory beside the cache (beside_cache, disk_tmp_path).
TMPFS = Path("/dev/shm")
TMPFS_MIN_FREE = 8 << 30  # the basetemp's peak in CI is ~2 GB; the Docker module puts its own GBs there
TMPFS_MIN_AVAILABLE = 12 << 30  # tmpfs pages are memory: leave the rest of the suite its RAM


def _mem_available() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError):
        pass
    return 0


def tmpfs_has_room(need: int, memory: int) -> bool:
    """TMPFS can take ``need`` bytes: it is there, writable and not ``noexec`` (programs and shared
    libraries run from it), has ``need`` free, and the machine has ``memory`` bytes available (tmpfs
    pages are memory).  The basetemp's choice below and the Docker module's scratch ask it."""
    try:
        st = os.statvfs(TMPFS)
    except OSError:
        return False
    return not (st.f_flag & os.ST_NOEXEC or not os.access(TMPFS, os.W_OK) or st.f_bavail * st.f_frsize < need
                or _mem_available() < memory)


def tmpfs_temproot(config: pytest.Config, environ: Mapping[str, str]) -> Path | None:
    """/dev/shm when the run's temporary directories should go there (above), else None."""
    if (config.option.basetemp or environ.get("PYTEST_DEBUG_TEMPROOT")
            or environ.get("DSV4PATCH_TEST_TMPFS", "1") == "0" or hasattr(config, "workerinput")):
        return None  # a worker: the controller chose (the basetemp it hands each worker is below it)
    return TMPFS if tmpfs_has_room(TMPFS_MIN_FREE, TMPFS_MIN_AVAILABLE) else None


def compile_package() -> None:
    """dsv4patch's bytecode, once per run, as ``pip install`` would have written it (issue 39).  The
    editable install has none, and where PYTHONDONTWRITEBYTECODE is set (this machine's and CI's
    environment) no process writes any: each of the suite's dsv4patch subprocesses compiled every
    module it imported again (warm ``check --pin 0.27.1``: 0.18 CPU s without, 0.11 s with).  Python
    checks each file's timestamp and size, so an edited module is compiled from its source as before."""
    import compileall

    compileall.compile_dir(ROOT / "dsv4patch", quiet=1)


def pytest_configure(config: pytest.Config) -> None:
    root = tmpfs_temproot(config, os.environ)
    if root is not None:
        os.environ["PYTEST_DEBUG_TEMPROOT"] = str(root)  # read when the basetemp is first made
    if not hasattr(config, "workerinput"):  # the controller, before the workers start
        compile_package()
    config.pluginmanager.register(_SessionDirs(), "dsv4patch-session-dirs")
    if hasattr(config.option, "loadscopereorder"):  # xdist: keep SLOW_FIRST's order (above)
        config.option.loadscopereorder = False


# Setup budget: on a warm cache (everything fetched, built and compiled once, e.g. after the
# README's first command and one run of the suite) no single test's setup (its fixtures: trees,
# builds, venvs) may take longer than SETUP_BUDGET seconds (DSV4PATCH_TEST_SETUP_BUDGET, default
# 120), times the machine's load per core where that is over 1 (the 1-minute load average when
# the setup ends: a shared machine at load 20 on 2 cores runs each process ~10x slower).  The
# slowest warm setups measured were 142 s at load 20 (test_sbom: apply, then build with every
# kernel object cached) and 24 s at load 10 (test_kernels' cuobjdump read of the stock library);
# compiling the default arch list again takes ~700 s on a quiet machine.  A slower setup fails
# the test, since it means a fixture recomputes what the cache should hold.  A run from a cold
# cache (CI's fresh clone: .ci/run and the workflow set
# DSV4PATCH_TEST_COLD=1) downloads and builds in its setups: there an over-budget setup is only
# listed at the end of the run.
SETUP_BUDGET = float(os.environ.get("DSV4PATCH_TEST_SETUP_BUDGET", "120"))
COLD = os.environ.get("DSV4PATCH_TEST_COLD", "") not in ("", "0")
_OVER_BUDGET: list[tuple[str, float]] = []


def setup_budget(base: float) -> float:
    """``base`` seconds, times the load per core where that is over 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return base * max(1.0, os.getloadavg()[0] / cores)


def over_budget(report: pytest.TestReport, base: float, cold: bool) -> pytest.TestReport:
    """A passed setup over the budget (:func:`setup_budget`): failed (warm) or marked (cold)."""
    if report.when != "setup" or not report.passed or report.duration <= base:
        return report
    budget = setup_budget(base)
    if report.duration <= budget:
        return report
    if cold:
        report.user_properties.append(("setup_over_budget", report.duration))
    else:
        report.outcome = "failed"
        report.longrepr = (f"setup took {report.duration:.1f} s, over the {budget:.1f} s budget for a warm "
                           f"cache ({base:g} s at the load now; tests/conftest.py: a fixture recomputes what "
                           "the cache should hold; DSV4PATCH_TEST_COLD=1 on a cold cache)")
    return report


_CPU_LAST: list[tuple[float, float]] = []


def _cpu_since_last_report() -> tuple[float, float]:
    """User and system CPU seconds of this (worker) process and the children it reaped since its
    previous report: what each module cost the machine's cores, beside its wall time."""
    t = os.times()
    now = (t.user + t.children_user, t.system + t.children_system)
    prev = _CPU_LAST[0] if _CPU_LAST else now
    _CPU_LAST[:] = [now]
    return now[0] - prev[0], now[1] - prev[1]


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """This process's CPU when its first test starts, so that the first report counts that test's setup
    (the module's shared fixtures: a whole image build for test_docker_build) instead of nothing."""
    if not _CPU_LAST:
        t = os.times()
        _CPU_LAST[:] = [(t.user + t.children_user, t.system + t.children_system)]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = over_budget((yield), SETUP_BUDGET, COLD)
    report.user_properties.append(("cpu", _cpu_since_last_report()))
    report.user_properties.append(("pid", os.getpid()))  # which process ran it: the CPU census's workers
    if report.failed:
        _FAILED_MODULES.add(str(item.path))
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]  # read by tmp_path's teardown
    return report


@dataclass
class _ModuleTime:
    """One module, as its reports arrive: its worker, its first start and last stop (wall clock), its phases'
    seconds.  Printed at the end beside --durations: what each worker spent the run on and when it went idle
    (SLOW_FIRST's order is checked against these figures)."""

    worker: str
    start: float
    stop: float
    seconds: float = 0.0
    user: float = 0.0  # CPU seconds (tests/conftest.py _cpu_since_last_report)
    system: float = 0.0


_MODULES: dict[str, _ModuleTime] = {}
_WORKER_PIDS: dict[str, int] = {}  # worker -> the pid that ran its tests (benchmarks/cpu_census.py reads it)
_TEST_TIMES: dict[tuple[str, str], tuple[float, float]] = {}  # (nodeid, phase) -> (CPU s user+system, wall s)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Where reports arrive (the controller under xdist): collect the cold run's over-budget setups and each
    module's time."""
    _OVER_BUDGET.extend((report.nodeid, float(v)) for k, v in report.user_properties if k == "setup_over_budget")
    worker = str(getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "main"))
    row = _MODULES.setdefault(report.nodeid.split("::", 1)[0], _ModuleTime(worker, report.start, report.stop))
    row.start, row.stop, row.seconds = min(row.start, report.start), max(row.stop, report.stop), row.seconds + report.duration
    for key, value in report.user_properties:
        if key == "cpu":
            row.user, row.system = row.user + value[0], row.system + value[1]
            _TEST_TIMES[(report.nodeid, report.when)] = (value[0] + value[1], report.duration)
        elif key == "pid":
            _WORKER_PIDS[worker] = int(value)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _OVER_BUDGET:
        terminalreporter.section(f"setups over the {SETUP_BUDGET:g} s warm-cache budget (cold run)")
        for nodeid, seconds in sorted(_OVER_BUDGET, key=lambda x: -x[1]):
            terminalreporter.line(f"{seconds:7.1f}s {nodeid}")
    if _MODULES:
        t0 = min(m.start for m in _MODULES.values())
        terminalreporter.section("slowest modules (seconds, worker, from..to in s after the first test, "
                                 "CPU s user+system)")
        for name, m in sorted(_MODULES.items(), key=lambda x: -x[1].seconds)[:25]:
            terminalreporter.line(f"{m.seconds:7.1f}s {m.worker:>4} {m.start - t0:7.1f}..{m.stop - t0:7.1f} "
                                  f"{m.user:6.0f}+{m.system:<5.0f} {name}")
        user, system = sum(m.user for m in _MODULES.values()), sum(m.system for m in _MODULES.values())
        terminalreporter.line(f"CPU of all modules: {user:.0f} s user + {system:.0f} s system "
                              "(children counted once reaped)")
        ends: dict[str, float] = {}
        for m in _MODULES.values():
            ends[m.worker] = max(ends.get(m.worker, 0.0), m.stop - t0)
        terminalreporter.line("each worker's last test ended at: "
                              + ", ".join(f"{w} {e:.0f} s" for w, e in sorted(ends.items())))
        terminalreporter.line("worker processes: "
                              + ", ".join(f"{w} pid {pid}" for w, pid in sorted(_WORKER_PIDS.items())))
        terminalreporter.section("most CPU (s user+system, the worker and the children it reaped; "
                                 "a module's shared fixtures count in the setup of its first test)")
        for (nodeid, when), (cpu, _wall) in sorted(_TEST_TIMES.items(), key=lambda x: -x[1][0])[:25]:
            terminalreporter.line(f"{cpu:7.1f} {when:8} {nodeid}")
        # Wall time beyond the CPU counted for a test: sleeps, deadlines, downloads, locks (a core idle), but
        # also the CPU of a process reaped later (the Docker module's dockerd, counted in its teardown) and,
        # under -n 2, time the test's children waited while the other worker had the cores.
        waits = sorted(((k, wall - cpu) for k, (cpu, wall) in _TEST_TIMES.items() if wall - cpu >= 1.0),
                       key=lambda x: -x[1])
        terminalreporter.section(f"most waiting (s of wall time beyond the CPU the test used; {sum(w for _, w in waits):.0f} s "
                                 "in all over tests waiting 1 s or more)")
        for (nodeid, when), wait in waits[:20]:
            terminalreporter.line(f"{wait:7.1f} {when:8} {nodeid}")


@pytest.fixture(scope="module", autouse=True)
def _module_tmp_dirs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Autouse, so set up before and torn down after the module's own module-scoped fixtures:
    what appeared in the (per-worker) basetemp while the module ran is its own."""
    base = tmp_path_factory.getbasetemp()
    before = set(base.iterdir())
    yield
    if str(request.path) not in _FAILED_MODULES:
        for path in set(base.iterdir()) - before - _SESSION_DIRS:
            if path.is_symlink():  # pytest's "<name>current" links
                path.unlink()
            else:
                _remove_behind(path)


# A module's trees, venvs and caches are GBs, and deleting them on a busy disk took 20-33 s of a module's
# teardown (test_toolchain's three pin trees and venv): the directory is renamed aside at once (the disk
# check of the next module sees it gone from the basetemp) and deleted by an ``rm -rf`` that runs beside the
# next module; the session waits for every such removal before it ends.
_REMOVALS: list[subprocess.Popen[bytes]] = []


def _remove_behind(path: Path) -> None:
    aside = path.parent.parent / f"removing-{os.getpid()}-{len(_REMOVALS)}-{path.name}"
    try:
        path.rename(aside)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
        return
    # in a session of its own: a Ctrl-C of the run does not stop a removal halfway (nothing is left aside)
    _REMOVALS.append(subprocess.Popen(["rm", "-rf", "--one-file-system", "--", str(aside)],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True))


def pytest_sessionfinish(session: pytest.Session) -> None:
    for proc in _REMOVALS:
        proc.wait()


@pytest.fixture
def tmp_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """pytest's own ``tmp_path`` (the same name and place; kept when the test failed, as
    tmp_path_retention_policy = "failed" says), but a passing test's directory is removed beside the next
    test (:func:`_remove_behind`): the byte-identity builds leave a cache with a toolchain in theirs."""
    name = re.sub(r"[\W]", "_", request.node.name)[:30]
    path = tmp_path_factory.mktemp(name, numbered=True)
    yield path
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.passed:
        _remove_behind(path)


def applied_tree(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path, name: str,
                 pin: str = "0.27.1") -> Path:
    """A new tree with ``pin``'s series applied by ``applying.apply_pin`` (the pin from the shared cache)."""
    from dsv4patch.checkout import applying
    from dsv4patch.pins import Context
    from dsv4patch.pins.lock import load
    from dsv4patch.progress import Progress
    from dsv4patch.store import Store

    lock = load(LOCK)
    path = tmp_path_factory.mktemp(name) / "vllm"
    ctx = Context(lock=lock, store=Store.open(shared_cache), progress=Progress(False))
    res = applying.apply_pin(ctx=ctx, pin=lock.pin(pin), tree_path=path)
    assert res.ok, res.notes
    return path


@pytest.fixture(scope="session")
def shared_cache() -> Path:
    """``$DSV4PATCH_TEST_CACHE``, else the cache the CLI uses (``Settings.cache_root``)."""
    from dsv4patch.settings import Settings

    path = Path(os.environ.get("DSV4PATCH_TEST_CACHE") or Settings.from_environ(os.environ).cache_root())
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def beside_cache(shared_cache: Path, name: str) -> Iterator[Path]:
    """A directory on the shared cache's filesystem, removed after use: for hard links of the cache's
    files, or a cache on the disk as a user's is, where the run's tmp_path may be tmpfs (above)."""
    path = Path(tempfile.mkdtemp(prefix=f".dsv4patch-test-{name}-", dir=shared_cache.parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def disk_tmp_path(shared_cache: Path) -> Iterator[Path]:
    """tmp_path's twin on the shared cache's filesystem (the disk; :func:`beside_cache`)."""
    with beside_cache(shared_cache, "disk") as path:
        yield path


@pytest.fixture(scope="session")
def cpu_testenv(shared_cache: Path, tmp_path_factory: pytest.TempPathFactory):
    """The CPU test venv (torch's CPU build, triton, pytest) that verify uses, for tests that need
    torch: the CLI's own venv has none (CI's has none), so such tests run their torch parts in this
    venv's python. Built once into the shared cache (minutes on a cold cache, needs PyPI)."""
    from dsv4patch.proofs import testenv
    from dsv4patch.store import Store

    req = pin_requirements("0.27.1", shared_cache, tmp_path_factory.mktemp("req"))
    return testenv.ensure(req, Store.open(shared_cache))


@dataclass(frozen=True)
class Vllm026:
    """vLLM 0.26.0 on CPU: the stock wheel's Python files, the pin's patched tree, and the CPU test
    venv (torch 2.13.0 CPU) whose python runs them with ``env()``'s PYTHONPATH."""

    python: Path
    site: Path  # the stock wheel's .py, .json, .jinja files and its dist-info
    tree: Path  # dsv4patch apply --pin 0.26.0 --no-build

    def env(self, path: Path | None = None) -> dict[str, str]:
        # Bytecode is written (site and tree are this session's own): the first process compiles vLLM's
        # ~700 modules it imports, the rest of the session's children read them (issue 39; ~0.7 of ~8.5
        # CPU s a process where PYTHONDONTWRITEBYTECODE is set, as in this machine's environment), and
        # the next session finds them in the bytecode store (:func:`seed_bytecode`).
        e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}
        e.update(PYTHONPATH=str(path or self.site), CUDA_VISIBLE_DEVICES="",
                 VLLM_CACHE_ROOT=str(vllm_cache_root(path or self.site)))
        return e


def vllm_cache_root(path: Path) -> Path:
    """vLLM's cache root for the vLLM at PATH: one per content of its ``vllm/models`` (issue 39).

    vLLM keeps what it learns of a model class (``modelinfos/<class>.json``, the hash of the class's
    package with it) in one file per class under its cache root; a miss inspects the class in a
    subprocess that imports vLLM again (~7 CPU s).  The stock wheel's and the patched tree's DeepSeek-V4
    packages differ, so with one cache root every switch between them (test_selftest_child's stock and
    patched children, test_selftest_model's probes, another session's) rewrote the files and the next
    child inspected again: 2-4 such subprocesses a module.  One root per content: each is inspected
    once, vLLM still checks its hash on every read."""
    import hashlib

    digest = hashlib.sha256()
    for src in sorted((path / "vllm" / "models").rglob("*.py")):
        digest.update(f"{src.relative_to(path)}\0".encode() + src.read_bytes() + b"\0")
    base = Path(os.environ.get("VLLM_CACHE_ROOT") or Path.home() / ".cache" / "vllm").expanduser()
    return base / "dsv4patch-tests" / digest.hexdigest()[:16]


# The bytecode store (issue 39): compiling the ~700 modules of vLLM a child imports takes ~14 CPU s, once
# for the stock wheel's files and once for the patched tree, in every session (both are made anew in the
# basetemp).  The store keeps checked-hash .pyc files by the sha256 of their source: Python checks such a
# file against its source's hash on every import (a changed source is compiled again), and sets the code's
# file names from where the source is, so one .pyc serves every path with the same source (the tree's
# files that the series does not change take the wheel's).  Beside the shared cache, never in it.
def bytecode_store(shared_cache: Path) -> Path:
    return shared_cache.parent / "dsv4patch-test-pyc" / sys.implementation.cache_tag


def seed_bytecode(root: Path, store: Path) -> int:
    """The stored .pyc of every source under ROOT that the store has, in place (how many)."""
    import hashlib

    tag = sys.implementation.cache_tag
    seeded = 0
    for src in root.rglob("*.py"):
        pyc = store / f"{hashlib.sha256(src.read_bytes()).hexdigest()}.pyc"
        if pyc.is_file():
            (src.parent / "__pycache__").mkdir(exist_ok=True)
            shutil.copyfile(pyc, src.parent / "__pycache__" / f"{src.stem}.{tag}.pyc")
            seeded += 1
    return seeded


def keep_bytecode(root: Path, store: Path) -> int:
    """What the children compiled under ROOT, into the store as checked-hash .pyc (how many new): only a
    .pyc of this Python's magic number that is valid for its source now (its mtime and size, or hash)."""
    import hashlib
    import importlib.util

    tag = sys.implementation.cache_tag
    store.mkdir(parents=True, exist_ok=True)
    kept = 0
    for pyc in root.rglob(f"__pycache__/*.{tag}.pyc"):
        src = pyc.parent.parent / f"{pyc.name[: -len(f'.{tag}.pyc')]}.py"
        if not src.is_file():
            continue
        data, code = src.read_bytes(), pyc.read_bytes()
        dest = store / f"{hashlib.sha256(data).hexdigest()}.pyc"
        if dest.exists() or len(code) < 16 or code[:4] != importlib.util.MAGIC_NUMBER:
            continue
        flags, st = int.from_bytes(code[4:8], "little"), src.stat()
        valid = (code[8:12] == (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
                 and code[12:16] == (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")) if flags == 0 else \
            (flags & 1 and code[8:16] == importlib.util.source_hash(data))
        if not valid:
            continue
        part = dest.with_name(f".{dest.name}.{os.getpid()}")
        part.write_bytes(importlib.util.MAGIC_NUMBER + (0b11).to_bytes(4, "little")
                         + importlib.util.source_hash(data) + code[16:])
        os.replace(part, dest)  # whole or not at all: sessions beside this one read the store
        kept += 1
    return kept


@pytest.fixture(scope="session")
def vllm026(shared_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vllm026]:
    """Made once per session (the pin's tree and venv come from the shared cache; the stock wheel,
    303 MB, is read from the store); vLLM's bytecode comes from and goes to :func:`bytecode_store`."""
    import zipfile

    from dsv4patch.kernels import stock
    from dsv4patch.pins.lock import load
    from dsv4patch.proofs import testenv
    from dsv4patch.store import Store

    base = tmp_path_factory.mktemp("vllm026")
    tree = base / "tree"
    assert main(["apply", "--lock", str(LOCK), "--pin", "0.26.0", "--tree", str(tree), "--cache-dir",
                 str(shared_cache), "--no-build", "--format", "json"]) == 0
    store = Store.open(shared_cache)
    env = testenv.ensure(tree, store, torch="2.13.0")  # 0.26.0 pins torch 2.11 (CUDA); CPU build here
    site = base / "site"
    wheel = stock.wheel_path(store, stock.wheel_for(load(LOCK).pin("0.26.0"), "x86_64"))
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.endswith(".py") or ".dist-info/" in name or name.endswith((".json", ".jinja")):
                zf.extract(name, site)
    pycs = bytecode_store(shared_cache)
    for root in (site / "vllm", tree / "vllm"):
        seed_bytecode(root, pycs)
    yield Vllm026(Path(env.python), site, tree)
    for root in (site / "vllm", tree / "vllm"):
        keep_bytecode(root, pycs)


@dataclass
class CliResult:
    rc: int
    out: str
    err: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    def run(*args: str | Path) -> CliResult:
        capsys.readouterr()
        rc = main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(rc, captured.out, captured.err)

    return run


def cli_bounded(*args: str | Path, timeout: float = 60, memory: int = 2 << 30) -> CliResult:
    """The CLI in a child process under a deadline and an address-space cap: for hostile files (a FIFO,
    ``/dev/zero``, a sparse file of gigabytes) where a regression would hang or eat the machine's memory.
    A run past ``timeout`` fails the test (subprocess.TimeoutExpired), never hangs the suite."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    proc = subprocess.run([sys.executable, "-m", "dsv4patch", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=cap, stdin=subprocess.DEVNULL)
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


class Overran(Exception):
    """A block ran past its :func:`deadline` (not an OSError: no ``except OSError`` swallows it)."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail with :class:`Overran` if the block runs past ``seconds`` (SIGALRM: a call blocked in open() or
    read() on a FIFO is interrupted), so an in-process regression cannot hang the suite."""
    import signal

    def expire(signum: int, frame: object) -> None:
        raise Overran(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


MINI_FILES = {
    "vllm/__init__.py": "",
    "vllm/envs.py": "".join(f"VAR_{i} = {i}\n" for i in range(40)),
    "vllm/worker.py": textwrap.dedent(
        """\
        def step(x):
            y = x + 1
            z = y * 2
            return z


        def other():
            return 0
        """
    ),
    "csrc/kernel.cuh": "int length = row_len;\nint k = 4;\n",
}


@dataclass
class Upstream:
    """A small real git repository standing in for a vLLM remote."""

    path: Path
    commit: str

    def patch(self, out: Path, name: str, edits: dict[str, str | None], message: str) -> Path:
        """A git format-patch file for ``edits`` (path -> new content, None = delete)."""
        work = out.parent / f"work-{name}"
        sh(out.parent, "clone", "-q", str(self.path), str(work))
        for p, content in edits.items():
            f = work / p
            if content is None:
                f.unlink()
            else:
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_text(content)
        sh(work, "add", "-A")
        sh(work, "commit", "-qm", message)
        produced = sh(work, "format-patch", "-1", "-o", str(out.parent))
        Path(produced).rename(out)
        return out


@pytest.fixture
def upstream(tmp_path: Path) -> Upstream:
    repo = tmp_path / "upstream"
    repo.mkdir()
    sh(repo, "init", "-q")
    for p, content in MINI_FILES.items():
        (repo / p).parent.mkdir(parents=True, exist_ok=True)
        (repo / p).write_text(content)
    sh(repo, "add", "-A")
    sh(repo, "commit", "-qm", "upstream")
    return Upstream(repo, sh(repo, "rev-parse", "HEAD"))


def write_lock(path: Path, pins: dict[str, str], series: dict[str, list[str]] | None = None,
               extra_top: str = "", series_dir: str = "") -> Path:
    """A lock at ``path`` with series files next to it, or in ``series_dir`` (relative to the lock's
    directory, e.g. ``../patches`` beside ``locks/``), listing names of patch files beside them."""
    series = series or {"main": []}
    parts = ["schema = 1", extra_top]
    for name, files in series.items():
        sfile = path.parent / series_dir / f"{name}.series"
        sfile.write_text("".join(f"{f}\n" for f in files))
        rel = f"{series_dir}/{sfile.name}" if series_dir else sfile.name
        parts.append(f'[series.{name}]\npath = "{rel}"\n')
    for body in pins.values():
        parts.append(textwrap.dedent(body).strip() + "\n")
    path.write_text("\n".join(parts))
    return path


def pin_table(name: str, commit: str, source: dict[str, str], version: str | None = None,
              extra: str = "") -> str:
    """A ``[pins."NAME"]`` table (``vllm_version`` defaults to NAME) with its ``source`` sub-table."""
    src = "".join(f'{k} = "{v}"\n' for k, v in source.items())
    return (f'[pins."{name}"]\nvllm_version = "{version or name}"\ncommit = "{commit}"\n'
            f'{textwrap.dedent(extra).strip()}\n[pins."{name}".source]\n{src}')


def git_pin(name: str, upstream: Upstream, extra: str = "", kind: str = "git") -> str:
    key = "url" if kind == "git" else "path"
    return pin_table(name, upstream.commit, {"kind": kind, key: str(upstream.path)}, extra=extra)


def local_pin(name: str, path: object, commit: str, version: str = "0.0.1") -> str:
    """A ``local`` pin table: a fork checkout at PATH (absolute, or relative to the lock file)."""
    return pin_table(name, commit, {"kind": "local", "path": str(path)}, version=version)


def sdist_pin(name: str, commit: str, sha: str, url: str | None = None) -> str:
    """A ``pypi-sdist`` pin table (vLLM 0.0.1) for ``sha``; without ``url`` the sdist must be cached."""
    source = {"kind": "pypi-sdist", "name": "vllm", "version": "0.0.1", "sha256": sha}
    return pin_table(name, commit, {**source, **({"url": url} if url is not None else {})}, version="0.0.1")


def pin_requirements(pin_name: str, cache: Path, dest: Path) -> Path:
    """A directory holding the pin's ``requirements/`` files: all that testenv reads to pick
    the CPU test venv (the pin is materialized into ``cache`` if it is not there yet)."""
    from dsv4patch import git
    from dsv4patch.pins import repository
    from dsv4patch.pins.lock import load
    from dsv4patch.progress import Progress
    from dsv4patch.store import Store

    pr = repository.materialize(load(LOCK).pin(pin_name), Store.open(cache), Progress(False))
    for name in ("common.txt", "cuda.txt"):
        f = dest / "requirements" / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(git.out(pr.repo, "show", f"{pr.base_commit}:requirements/{name}") + "\n")
    return dest


def pty_run(args: list[str], cwd: Path, env: dict[str, str],
            cols: int = 80) -> tuple[int, list[tuple[float, bytes]], float]:
    """Run ``dsv4patch ARGS`` in a COLS-column pseudo-terminal: (exit code, (seconds since start, bytes) per read, total)."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, cols, 0, 0))
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "dsv4patch", *args], stdin=slave, stdout=slave, stderr=slave,
                            env=env, cwd=cwd)
    os.close(slave)
    reads: list[tuple[float, bytes]] = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        reads.append((time.monotonic() - t0, data))
    os.close(master)
    rc = proc.wait()
    return rc, reads, time.monotonic() - t0
