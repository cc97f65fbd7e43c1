"""verify on the real 0.27.1 tree: each CPU-provable patch fails before and passes after.

Builds (once, cached) the CPU test venv: torch CPU, triton, vLLM's
requirements/common.txt.  Fix 7 is CUDA-only: its tests skip here and are
proven by tests/gpu/ on an H200.
"""

from __future__ import annotations

import json

import pytest

from conftest import LOCK

pytestmark = [pytest.mark.network, pytest.mark.slow]


def test_verify_0271_proves_fixes_1_to_6_on_cpu(shared_cache, cli):
    res = cli("verify", "--lock", LOCK, "--pin", "0.27.1", "--cache-dir", shared_cache, "--format", "json")
    rep = json.loads(res.out)
    verdicts = {name.split("-")[0]: v["verdict"] for name, v in rep["patches"].items()}
    assert verdicts == {
        "0001": "proven", "0002": "proven", "0003": "proven", "0004": "proven",
        "0005": "proven", "0006": "proven", "0007": "skipped here",
    }, json.dumps(rep["patches"], indent=1)
    for name, v in rep["patches"].items():
        if v["verdict"] == "proven":
            assert "failed" in v["before"] and "passed" not in v["before"], (name, v)
            assert "passed" in v["after"] and "failed" not in v["after"], (name, v)
    assert res.rc == 0
