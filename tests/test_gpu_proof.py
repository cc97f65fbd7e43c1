"""Runs tests/gpu/run_topk_proof.py (fix 7 + extra 0008 on a real GPU); skipped without CUDA."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "gpu" / "run_topk_proof.py"


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not _has_cuda(), reason="needs an NVIDIA GPU")
def test_topk_gpu_proof(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], timeout=600)
    summary = json.loads((tmp_path / "topk_proof.json").read_text())
    failed = [c for c in summary["cases"] if c["pass"] is False]
    assert res.returncode == 0 and summary["ok"], (failed, summary.get("perf_geomean_ratio"))


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not _has_cuda(), reason="needs an NVIDIA GPU")
def test_kernel_plugin_wheel_overrides_stock_kernels(tmp_path: Path) -> None:
    """Build the plugin wheel for the patched 0.27.1 tree and load it as vLLM would."""
    from conftest import LOCK
    from dsv4patch.main import main

    tree = tmp_path / "vllm"
    assert main(["apply", "--lock", str(LOCK), "--pin", "0.27.1", "--tree", str(tree),
                 "--out", str(tmp_path / "dist")]) == 0
    wheel = next((tmp_path / "dist").glob("*.whl"))
    res = subprocess.run([sys.executable, str(SCRIPT.with_name("run_plugin_proof.py")), str(wheel),
                          str(tmp_path / "out")], timeout=600)
    assert res.returncode == 0
