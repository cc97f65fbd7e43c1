"""The card's command as typed: ``dsv4patch apply --lock locks/vllm.toml`` and no other flag.

The tree goes to ``./vllm-src/<pin>`` (printed), the lock is found from the
current directory upwards or from ``DSV4PATCH_LOCK``, so the tool works from
any subdirectory of a checkout.  Real git, the real 0.27.1 sdist (cached).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import LOCK, ROOT
from dsv4patch.pins.lock import load

PATCHED = load(LOCK).pin("0.27.1").patched_tree


def _tree_id(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD^{tree}"], capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the checkout's lock and patches (what a user's clone has)."""
    proj = tmp_path / "proj"
    shutil.copytree(ROOT / "locks", proj / "locks")
    shutil.copytree(ROOT / "patches", proj / "patches")
    return proj


def test_apply_without_tree_or_lock_from_a_subdirectory(cli, project: Path, shared_cache: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSV4PATCH_CACHE", str(shared_cache))
    monkeypatch.delenv("DSV4PATCH_LOCK", raising=False)
    sub = project / "a" / "b"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    res = cli("apply", "--no-build", "--format", "json")
    assert res.rc == 0, res.err
    rep = json.loads(res.out)
    tree = sub / "vllm-src" / "0.27.1"
    assert rep["tree"] == str(tree) and rep["lock"] == str(project / "locks" / "vllm.toml")
    assert any(n.startswith(f"tree: {tree} (the default for pin 0.27.1") for n in rep["notes"])
    assert _tree_id(tree) == PATCHED
    again = cli("apply", "--no-build", "--python", sys.executable)  # the kernel build's options parse
    assert again.rc == 0 and "already has all patches" in again.out


def test_lock_from_environment_or_a_clear_error(cli, tmp_path: Path, shared_cache: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSV4PATCH_CACHE", str(shared_cache))
    monkeypatch.delenv("DSV4PATCH_LOCK", raising=False)
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    monkeypatch.chdir(empty)
    res = cli("check", "--pin", "0.27.1")
    assert res.rc == 2 and "no lock file" in res.err and "DSV4PATCH_LOCK" in res.err
    monkeypatch.setenv("DSV4PATCH_LOCK", str(LOCK))
    res = cli("check", "--pin", "0.27.1", "--format", "json")
    assert res.rc == 0, res.err
    assert json.loads(res.out)["pins"]["0.27.1"]["ok"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
                    reason="needs nvcc")
def test_the_card_command_as_typed_builds_the_kernels(cli, project: Path, shared_cache: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`dsv4patch apply --lock locks/vllm.toml` in an environment without torch (this test venv,
    as the README's install makes it): the tree and the kernel wheel, nothing else given. The
    pin's torch is installed by dsv4patch into the cache (toolchain.py); the table of what
    apply did is printed before the kernel step."""
    monkeypatch.delenv("DSV4PATCH_TORCH_PYTHON", raising=False)
    monkeypatch.setenv("DSV4PATCH_CACHE", str(shared_cache))
    monkeypatch.chdir(project)
    res = cli("apply", "--lock", "locks/vllm.toml")
    assert res.rc == 0, res.err[-3000:]
    assert _tree_id(project / "vllm-src" / "0.27.1") == PATCHED
    assert f"tree: {project / 'vllm-src' / '0.27.1'}" in res.out
    assert res.out.index("applied ") < res.out.index("toolchain: torch 2.13.0")
    wheels = list((project / "dist").glob("dsv4patch_kernels_0_27_1-*.whl"))
    assert len(wheels) == 1
    with zipfile.ZipFile(wheels[0]) as zf:
        info = json.loads(zf.read("dsv4patch_kernels_0_27_1/build_info.json"))
    assert info["torch_version"].split("+")[0] == "2.13.0" and not info["torch_mismatch"]
