"""Run pytest sessions, one per test file, each in its own process, from one start-up of torch.

Run by the CPU test venv's python (``tests/test_verify.py``, with the environment a session of
``dsv4patch verify`` gets): ``python one_file_sessions.py JOBS.json`` where JOBS.json holds
``{"cwd": DIR, "parallel": N, "jobs": [{"args": [pytest's arguments], "log": FILE}, ...]}``.  It
imports pytest, the CPU plugin and torch once, then forks one child per job, at most N at a time;
each child runs ``pytest.main(args)`` in DIR with its stdout and stderr in its FILE and exits with
pytest's exit code.  It prints ``{"exit codes": [...]}`` in the jobs' order.

What a child starts from is what every ``python -m pytest -p dsv4patch_cpu_plugin`` session has
before pytest collects a test file: pytest imported, then the plugin (which turns the cyclic
collector off until the test modules are imported), then torch (the plugin's ``pytest_configure``
imports it first thing).  ``import torch`` imports neither triton nor vLLM and starts no Python
thread (numpy's OpenBLAS starts its thread pool: OpenBLAS shuts it down at a fork, through
pthread_atfork, and starts it again when used), so the fork is safe and each file still imports the vLLM and Triton it uses itself, in a
process of its own that no other file's tests ran in.  What a child does not pay again is the
~1.5 CPU s of Python, pytest and torch start-up (issue 39: 10 files, 48 -> 34 CPU s).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable


def _child(pytest_main: Callable[[list[str]], int], args: list[str], log: str) -> int:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        return int(pytest_main(args))
    except BaseException:  # noqa: BLE001  # whatever it was, into the log and a code no pytest exit has
        traceback.print_exc()
        return 99
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    # As ``python -m pytest`` run in DIR: DIR is the working directory and first on sys.path (not
    # this file's directory), before anything is imported.
    os.chdir(spec["cwd"])
    sys.path[0] = os.getcwd()
    # In a session's order: pytest, the plugin (gc off until the test modules are imported), torch.
    for name in ("pytest", "dsv4patch_cpu_plugin", "torch"):
        importlib.import_module(name)
    pytest_main = sys.modules["pytest"].main
    jobs = spec["jobs"]
    codes: list[int | None] = [None] * len(jobs)
    running: dict[int, int] = {}  # pid -> job index
    for i, job in enumerate([*jobs, None]):
        while running and (job is None or len(running) >= spec["parallel"]):
            pid, status = os.wait()
            codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
        if job is None:
            break
        pid = os.fork()
        if pid == 0:
            os._exit(_child(pytest_main, job["args"], job["log"]))
        running[pid] = i
    print(json.dumps({"exit codes": codes}))


if __name__ == "__main__":
    main()
