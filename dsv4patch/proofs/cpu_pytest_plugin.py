"""pytest plugin loaded into a patched vLLM tree's test run on a CPU-only host.

vLLM's ``tests/conftest.py`` releases accelerator memory after every test with
``torch.accelerator.empty_cache()`` (and newer vLLM ``empty_host_cache()`` at
process-group teardown), which raise on a CPU-only torch build
("Cannot access accelerator device when none is available").  The regression
tests the patches carry exercise index/metadata logic that runs on CPU tensors
(Triton kernels under ``TRITON_INTERPRET=1``), so on such a host the cleanup is
made a no-op.

That cleanup also runs a full ``gc.collect()`` after every test (after
``gc.unfreeze()``), over everything torch, vLLM and their dependencies keep alive
(about 670,000 objects): 0.37 s a test, three quarters of a CPU session's time
(0.27.1's 88 tests: 43 s, 10.5 s with what follows).  On a CPU-only host the heap
as it is once every test module is imported is frozen (``gc.freeze``: left out of
the cyclic collector's scans; reference counting still frees whatever a test lets
go of) and vLLM's ``gc.unfreeze()`` leaves it frozen, so each test's collection
scans what the tests made, as before.  Should anything in the session freeze
objects itself (vLLM's engine does after start-up), ``gc.unfreeze()`` is real again
from then on, as vLLM means it.  Nothing else in vLLM is touched.

The imports before that (torch, vLLM and its dependencies with the test modules: ~670,000 objects)
run with the cyclic collector off: each full collection it triggers while the heap grows scans all
of it again, ~1.2 of a CPU session's ~6 s of start-up (importing torch and vLLM 0.27.1's tree on
CPU: 6.0 s with the collector, 4.8 s without).  It is on again, by the one collection above, once
the test modules are imported; on a host with an accelerator at once.

With ``$DSV4PATCH_SELECT`` naming a file of node ids (one a line), only those tests
run (a parametrized test's cases, a class's tests), the others are deselected: the
caller names the test *files* on the command line, so a module that cannot be
imported is one collection error beside the others' results, where named node ids
would end the whole session ("found no collectors") and need a second one.
"""

from __future__ import annotations

import gc
from typing import Any

gc.disable()  # until the test modules are imported (above): pytest imports this plugin before any conftest
_STATE = {"cpu_only": False, "others_froze": False}


def pytest_configure(config: object) -> None:
    import torch

    if torch.accelerator.is_available():
        gc.enable()
        return
    _STATE["cpu_only"] = True
    # Newer vLLM also releases pinned host memory (empty_host_cache) on teardown.
    for name in ("empty_cache", "empty_host_cache"):
        if hasattr(torch.accelerator, name):
            setattr(torch.accelerator, name, lambda *a, **k: None)


def pytest_collection_finish(session: object) -> None:
    """Freeze the imported heap (above): the per-test collections scan only what the tests made."""
    if not _STATE["cpu_only"]:
        return

    real_freeze, real_unfreeze = gc.freeze, gc.unfreeze

    def freeze() -> None:
        _STATE["others_froze"] = True
        real_freeze()

    def unfreeze() -> None:
        if _STATE["others_froze"]:
            real_unfreeze()

    gc.collect()
    real_freeze()
    gc.enable()
    for name, fn in (("freeze", freeze), ("unfreeze", unfreeze)):
        setattr(gc, name, fn)


# Results for dsv4patch verify (testrun.py): one JSON line per test phase report
# and per collection error, written to $DSV4PATCH_RESULTS when it is set, so one
# pytest session can serve several patches (results are mapped back by node id).
def _record(rec: dict[str, str]) -> None:
    import json
    import os

    path = os.environ.get("DSV4PATCH_RESULTS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")


def _crash(report: object) -> str:
    longrepr = getattr(report, "longrepr", None)
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return str(getattr(crash, "message", ""))
    return str(longrepr or "")


def pytest_runtest_logreport(report: object) -> None:
    when = getattr(report, "when", "")
    rec = {"nodeid": getattr(report, "nodeid", ""), "when": when,
           "outcome": getattr(report, "outcome", "")}
    if rec["outcome"] == "failed":
        msg = _crash(report)
        rec["message"] = msg if when == "call" else f'failed on {when} with "{msg}"'
    elif rec["outcome"] == "skipped":
        longrepr = getattr(report, "longrepr", None)
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        rec["reason"] = reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
    _record(rec)


def pytest_collectreport(report: object) -> None:
    if getattr(report, "outcome", "") == "failed":
        _record({"nodeid": getattr(report, "nodeid", ""), "when": "collect", "outcome": "failed",
                 "message": "collection failure"})


def _wanted(nodeid: str, wanted: list[str]) -> bool:
    return any(nodeid == w or nodeid.startswith((w + "[", w + "::")) for w in wanted)


def pytest_collection_modifyitems(config: Any, items: list[object]) -> None:
    import os

    path = os.environ.get("DSV4PATCH_SELECT")
    if not path:
        return
    with open(path, encoding="utf-8") as f:
        wanted = [line.strip() for line in f if line.strip()]
    keep: list[object] = []
    drop: list[object] = []
    for item in items:
        (keep if _wanted(str(getattr(item, "nodeid", "")), wanted) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
