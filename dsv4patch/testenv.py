"""The Python environment that runs a patched vLLM tree's tests on this host.

A CPU-only venv, cached in the store and keyed by everything that decides its
contents (Python version, the pin's ``requirements/common.txt``, torch and
triton versions): torch (CPU build), triton, pytest and vLLM's common
requirements.  vLLM itself is imported from the source tree under test, with
no compiled extension: the fixes' Triton kernels run under the Triton
interpreter (``TRITON_INTERPRET=1``) on CPU tensors, and
``CUDA_VISIBLE_DEVICES`` is emptied, or vLLM replaces Triton with a
placeholder.  A small pytest plugin makes vLLM's GPU memory cleanup a no-op on
a CPU-only torch.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dsv4patch.errors import BuildError
from dsv4patch.store import Store

# Triton release that goes with each torch minor (what torch's CUDA wheels pin).
TRITON_FOR_TORCH = {"2.13": "3.7.1", "2.12": "3.7.0", "2.11": "3.6.0", "2.10": "3.5.1"}
EXTRA = ("pytest", "tblib")
PLUGIN_NAME = "dsv4patch_cpu_plugin"


@dataclass(frozen=True)
class TestEnv:
    python: Path
    plugin_dir: Path
    torch: str

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(
            TRITON_INTERPRET="1",
            CUDA_VISIBLE_DEVICES="",
            PYTHONPATH=str(self.plugin_dir),
            PYTHONDONTWRITEBYTECODE="1",
            VLLM_LOGGING_LEVEL="WARNING",
        )
        return env

    def pytest_args(self) -> list[str]:
        return [str(self.python), "-m", "pytest", "-p", PLUGIN_NAME, "-p", "no:cacheprovider"]


def torch_version(tree: Path, override: str | None) -> str:
    if override:
        return override
    for req in ("requirements/cuda.txt", "requirements/common.txt"):
        f = tree / req
        if f.exists():
            m = re.search(r"^torch\s*==\s*([0-9.]+)", f.read_text(), re.M)
            if m:
                return m.group(1)
    raise BuildError(f"{tree}: cannot find the pinned torch version in requirements/cuda.txt")


def ensure(tree: Path, store: Store, torch: str | None = None, log: Path | None = None) -> TestEnv:
    """The cached test venv for the tree's requirements, created on first use."""
    common = tree / "requirements" / "common.txt"
    if not common.exists():
        raise BuildError(f"{tree}: requirements/common.txt not found; is this a vLLM tree?")
    tv = torch_version(tree, torch)
    triton = TRITON_FOR_TORCH.get(".".join(tv.split(".")[:2]))
    key_src = "\n".join(
        [sys.version, tv, triton or "", common.read_text(), *EXTRA, "v1"]
    ).encode()
    key = hashlib.sha256(key_src).hexdigest()[:20]
    root = store.root / "venvs" / key
    python = root / "bin" / "python"
    with store.lock(f"venv-{key}"):
        if not (root / ".ready").exists():
            # venvs are not relocatable, so build in place; ".ready" is written last,
            # and a half-built venv left by a killed run is built again.
            shutil.rmtree(root, ignore_errors=True)
            _create(root, common, tv, triton, log)
            (root / ".ready").write_text(tv + "\n")
    plugin_dir = root / "dsv4patch-plugin"
    plugin_dir.mkdir(exist_ok=True)
    src = Path(__file__).with_name("cpu_pytest_plugin.py").read_text()
    target = plugin_dir / f"{PLUGIN_NAME}.py"
    if not target.exists() or target.read_text() != src:
        target.write_text(src)
    return TestEnv(python=python, plugin_dir=plugin_dir, torch=tv)


def _create(root: Path, common: Path, torch: str, triton: str | None, log: Path | None) -> None:
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    pkgs = [f"torch=={torch}", *EXTRA] + ([f"triton=={triton}"] if triton else [])
    cmd = [str(root / "bin" / "python"), "-m", "pip", "install", "-q", *pkgs, "-r", str(common)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if log:
        log.write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        raise BuildError(
            f"creating the test environment failed (pip exit {res.returncode}):\n"
            f"{res.stderr.strip()[-2000:]}\nThe pin needs torch=={torch}; on a host without it "
            "pass --torch VERSION (e.g. the CPU build available here)"
        )
