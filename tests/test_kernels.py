"""Kernel rebuild: source -> unit mapping, full-build dry run, incremental no-op, CI compile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LOCK
from dsv4patch.kernels import build as kbuild
from dsv4patch.kernels import sources
from dsv4patch.lock import load
from dsv4patch.store import Store


def _torch_python() -> str | None:
    for py in (os.environ.get("DSV4PATCH_TORCH_PYTHON"), sys.executable, "/tmp/vllmenv/bin/python"):
        if py and Path(py).exists() and subprocess.run(
            [py, "-c", "import torch"], capture_output=True
        ).returncode == 0:
            return py
    return None


@pytest.fixture(scope="module")
def patched_tree(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Path:
    from dsv4patch.main import main

    tree = tmp_path_factory.mktemp("kt") / "vllm"
    rc = main(["apply", "--lock", str(LOCK), "--pin", "0.27.1", "--tree", str(tree),
               "--cache-dir", str(shared_cache), "--format", "json", "--no-build"])
    assert rc == 0
    return tree


def test_changed_sources_map_to_units_and_ops(patched_tree: Path) -> None:
    plan = sources.plan(patched_tree)
    assert set(plan.changed) == {"csrc/libtorch_stable/persistent_topk.cuh",
                                 "csrc/libtorch_stable/cooperative_topk.cuh"}
    units = {u.path: u for u in plan.units}
    assert set(units) == {"csrc/libtorch_stable/topk.cu", "csrc/libtorch_stable/cooperative_topk.cu"}
    assert units["csrc/libtorch_stable/cooperative_topk.cu"].arch_var == "COOPERATIVE_TOPK_ARCHS"
    assert {(o.name, o.unit) for o in plan.ops} == {
        ("persistent_topk", "csrc/libtorch_stable/topk.cu"),
        ("cooperative_topk", "csrc/libtorch_stable/cooperative_topk.cu"),
    }
    assert not plan.unmapped
    cmake = sources.cmake_target(patched_tree)
    coop = units["csrc/libtorch_stable/cooperative_topk.cu"]
    assert sources.unit_archs(coop, ("9.0a", "12.0a"), "13.0", cmake) == ("9.0a", "12.0a")
    assert sources.unit_archs(coop, ("8.0",), "13.0", cmake) == ()


def test_loose_intersection_matches_cmake() -> None:
    src = ("9.0a", "10.0f", "12.0f", "12.1f")
    assert sources.loose_intersection(src, ("9.0a", "12.0a")) == ("9.0a", "12.0a")
    assert sources.loose_intersection(src, ("9.0", "12.0")) == ("9.0a", "12.0f")
    assert sources.loose_intersection(src, ("8.9",)) == ()


def test_generated_bindings_override_only_changed_ops() -> None:
    ops = [sources.Op("persistent_topk", "persistent_topk", "persistent_topk(Tensor a) -> ()",
                      "csrc/x.cu", "_C")]
    text = kbuild.generate_bindings(ops)
    assert "STABLE_TORCH_LIBRARY_IMPL(_C, CUDA, m)" in text
    assert 'm.impl("persistent_topk", TORCH_BOX(&persistent_topk));' in text
    assert "m.def(" not in text


def test_full_build_dry_run(cli, patched_tree: Path, shared_cache: Path) -> None:
    r = cli("build", "--lock", LOCK, "--tree", patched_tree, "--full", "--dry-run",
            "--format", "json", "--cache-dir", shared_cache)
    assert r.rc == 0, r.err
    out = json.loads(r.out)
    assert out["command"][-4:] == ["pip", "install", "-v", "."]
    assert out["env"]["TORCH_CUDA_ARCH_LIST"] == "9.0a 12.0a"
    assert out["env"]["MAX_JOBS"] == "2" and out["env"]["NVCC_THREADS"] == "1"
    r = cli("build", "--lock", LOCK, "--tree", patched_tree, "--full", "--docker", "--dry-run",
            "--format", "json", "--cache-dir", shared_cache)
    cmd = json.loads(r.out)["command"]
    assert cmd[:4] == ["docker", "build", "-f", "docker/Dockerfile"]
    assert "torch_cuda_arch_list=9.0a 12.0a" in cmd


def test_wheel_layout(tmp_path: Path) -> None:
    whl = kbuild.write_wheel(tmp_path, "dsv4patch_kernels_0_27_1", "0.27.1+treeabc",
                             {"dsv4patch_kernels_0_27_1/__init__.py": b"def register():\n    pass\n"},
                             "[vllm.general_plugins]\nx = dsv4patch_kernels_0_27_1:register\n")
    import zipfile

    names = zipfile.ZipFile(whl).namelist()
    info = "dsv4patch_kernels_0_27_1-0.27.1+treeabc.dist-info"
    assert {f"{info}/METADATA", f"{info}/WHEEL", f"{info}/RECORD", f"{info}/entry_points.txt"} <= set(names)
    assert whl.read_bytes() == kbuild.write_wheel(
        tmp_path / "again", "dsv4patch_kernels_0_27_1", "0.27.1+treeabc",
        {"dsv4patch_kernels_0_27_1/__init__.py": b"def register():\n    pass\n"},
        "[vllm.general_plugins]\nx = dsv4patch_kernels_0_27_1:register\n").read_bytes()


needs_nvcc = pytest.mark.skipif(
    shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
    reason="needs nvcc")


@pytest.mark.slow
@needs_nvcc
def test_patched_units_compile_for_sm90a_sm120a_and_rebuild_is_noop(
    patched_tree: Path, shared_cache: Path, tmp_path: Path
) -> None:
    """The CI kernel-compile check: the patched units compile for both archs; a second build
    compiles nothing (it reuses the store's objects)."""
    py = _torch_python()
    if py is None:
        pytest.skip("needs a Python with torch (set DSV4PATCH_TORCH_PYTHON)")
    store = Store.open(shared_cache)
    pin = load(LOCK).pin("0.27.1")
    tc = kbuild.detect_toolchain(store, python=py)
    plan = sources.plan(patched_tree)
    kwargs = dict(pin_name=pin.name, vllm_version=pin.vllm_version, archs=("9.0a", "12.0a"),
                  store=store, toolchain=tc, out_dir=tmp_path, max_jobs=pin.build.max_jobs,
                  nvcc_threads=pin.build.nvcc_threads)
    first = kbuild.build(plan, **kwargs)
    assert first.wheel is not None and first.wheel.exists()
    assert first.ops == ["persistent_topk", "cooperative_topk"]
    second = kbuild.build(plan, **kwargs)
    assert second.compiled == []
    assert second.library == first.library
