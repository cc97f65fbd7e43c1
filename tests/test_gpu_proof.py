"""Runs the H200 proof (tests/gpu/make_bundle.py, then run_vllm_binary_proof.py) on a GPU.

Skipped without an NVIDIA GPU: the stock vLLM kernels and the rebuilt ones can only
run there. The committed output of a real run is in tests/gpu/results/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parent / "gpu"


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not _has_cuda(), reason="needs an NVIDIA GPU")
def test_vllm_binary_proof(tmp_path: Path, shared_cache: Path) -> None:
    env = {**os.environ, "DSV4PATCH_CACHE": str(shared_cache),
           "DSV4PATCH_TORCH_PYTHON": os.environ.get("DSV4PATCH_TORCH_PYTHON", sys.executable)}
    subprocess.run([sys.executable, str(GPU / "make_bundle.py"), str(tmp_path / "bundle")], env=env,
                   check=True, timeout=3600)
    res = subprocess.run([sys.executable, str(GPU / "run_vllm_binary_proof.py"), str(tmp_path / "bundle"),
                          str(tmp_path / "out")], timeout=1800)
    report = json.loads((tmp_path / "out" / "vllm_binary_proof.json").read_text())
    failed = [e for e in report["expectations"] if not e["ok"]]
    assert res.returncode == 0 and report["ok"], failed


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not _has_cuda(), reason="needs an NVIDIA GPU")
def test_kernel_proof_standalone(tmp_path: Path, shared_cache: Path) -> None:
    """The one-call proof (make_kernel_proof.py, kernel_proof.sh): the patched kernels alone,
    the differential with issue 29's shape (31/40 rows, width 196608, max_seq_len 32768)."""
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    arch = f"{major}.{minor}" + ("a" if major >= 9 else "")
    env = {**os.environ, "DSV4PATCH_CACHE": str(shared_cache),
           "DSV4PATCH_TORCH_PYTHON": os.environ.get("DSV4PATCH_TORCH_PYTHON", sys.executable)}
    subprocess.run([sys.executable, str(GPU / "make_kernel_proof.py"), str(tmp_path / "lib"),
                    "--arch", arch], env=env, check=True, timeout=3600)
    res = subprocess.run(["bash", str(GPU / "kernel_proof.sh"), str(tmp_path / "lib")],
                         env={**os.environ, "OUT": str(tmp_path / "out")}, timeout=1800)
    report = json.loads((tmp_path / "out" / "kernel_proof.json").read_text())
    failed = [e for e in report["expectations"] if not e["ok"]]
    assert res.returncode == 0 and report["ok"], failed
    assert any(e["what"].startswith("issue 29 shape") and e["ok"] for e in report["expectations"])
