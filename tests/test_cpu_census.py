"""benchmarks/cpu_census.py: the log's module windows, the worker each process belongs to, the kinds.

Reading a process accounting file needs the ``acct`` package (root, ``accton``), which CI does not have:
these tests give the census the records themselves, as ``dump-acct`` reads them (``read`` is that parse).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("cpu_census", ROOT / "benchmarks" / "cpu_census.py")
assert _spec is not None and _spec.loader is not None
census = importlib.util.module_from_spec(_spec)
sys.modules["cpu_census"] = census
_spec.loader.exec_module(census)

LOG = """\
= slowest modules (seconds, worker, from..to in s after the first test, CPU s user+system) =
  299.3s  gw1     0.0..  299.4    227+47    tests/test_toolchain.py
  122.2s  gw0     0.0..  122.2     96+19    tests/test_kernels.py
   34.9s  gw0   122.2..  157.2      7+1     tests/test_selftest_runner.py
CPU of all modules: 1028 s user + 355 s system (children counted once reaped)
"""


def test_modules_are_read_from_the_logs_slowest_modules_section() -> None:
    assert census.modules(LOG) == [("gw1", 0.0, 299.4, "tests/test_toolchain.py"),
                                   ("gw0", 0.0, 122.2, "tests/test_kernels.py"),
                                   ("gw0", 122.2, 157.2, "tests/test_selftest_runner.py")]
    assert census.modules("no such section") == []


def test_a_reused_pid_is_the_parent_alive_when_the_child_started() -> None:
    P = census.Proc
    controller = P("python", 1, 1, 800, 100, 1, 1000)
    gw0 = P("python", 60, 5, 790, 101, 100, 1001)
    early = P("git", 0.1, 0.1, 1, 200, 101, 1010)
    reused = P("bash", 0, 0, 5, 101, 1, 500)  # pid 101 before the worker had it
    ptxas = P("ptxas", 25, 1, 26, 300, 200, 1010)  # started by pid 200 while that git lived
    tree = census.Tree([controller, reused, gw0, early, ptxas])  # the reused pid first: found by time, not order
    assert tree.parent(early) is gw0 and tree.parent(ptxas) is early
    assert tree.ancestor_in(ptxas, {101: "gw0"}) == "gw0"
    assert tree.ancestor_in(reused, {101: "gw0"}) is None
    assert [census.category(c) for c in ("git-upload-pack", "cicc", "python3.11", "VLLM::Worker", "dockerd")] == [
        "git", "compile", "python", "vllm", "other"]


def test_each_process_counts_in_the_module_its_worker_ran_when_it_started() -> None:
    P = census.Proc
    controller = P("python", 1, 1, 800, 100, 1, 1000)
    gw0 = P("python", 60, 5, 790, 101, 100, 1001)
    gw1 = P("python", 30, 5, 790, 102, 100, 1001)
    ptxas = P("ptxas", 25, 1, 26, 300, 101, 1011)  # gw0, 10 s in: test_kernels
    git = P("git", 0.5, 0.5, 1, 301, 102, 1400)  # gw1, 399 s in: between its modules
    procs = [controller, gw0, gw1, ptxas, git]
    names, per = census.by_module(procs, census.Tree(procs), census.modules(LOG))
    assert names == {101: "gw0", 102: "gw1"}
    assert per["tests/test_kernels.py"] == {"compile": 26}
    assert per["gw1: between modules"] == {"git": 1}
    assert per["gw0: the worker itself (in-process tests, pytest)"] == {"python": 65}


def test_the_logs_worker_pids_name_the_workers_not_their_start_order() -> None:
    """gw1 started a second before gw0 (xdist starts them together): the log's ``worker processes:`` line
    decides, and a process of a reused worker pid before the run is not that worker."""
    P = census.Proc
    controller = P("python", 1, 1, 800, 100, 1, 1000)
    gw1 = P("python", 30, 5, 790, 101, 100, 1000)
    gw0 = P("python", 60, 5, 790, 102, 100, 1001)
    earlier = P("python", 3, 0, 2, 102, 1, 900)  # pid 102 before the run
    ptxas = P("ptxas", 25, 1, 26, 300, 102, 1011)  # gw0's, 10 s in: test_kernels
    procs = [controller, earlier, gw1, gw0, ptxas]
    log = LOG + "worker processes: gw0 pid 102, gw1 pid 101\n"
    pids = census.worker_pids(log)
    assert pids == {"gw0": 102, "gw1": 101}
    names, per = census.by_module(procs, census.Tree(procs), census.modules(log), pids)
    assert names == {102: "gw0", 101: "gw1"}
    assert per["tests/test_kernels.py"] == {"compile": 26}
    assert per["gw0: the worker itself (in-process tests, pytest)"] == {"python": 65}
    guessed, _ = census.by_module(procs, census.Tree(procs), census.modules(log))  # the old guess: by start
    assert guessed == {101: "gw0", 102: "gw1"}
    assert census.worker_pids(LOG) == {}
