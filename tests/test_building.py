"""building.py: the arch list a build uses and vLLM's own build of the whole tree (dry run),
on the real patched 0.27.1 tree (made by applying.apply_pin).  Compiling the kernels
(building.build_tree) is test_kernels.py's and test_vllm_wheel.py's (needs nvcc)."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import pytest

from conftest import LOCK, applied_tree, validate_json
from dsv4patch.kernels import building, sources
from dsv4patch.pins.lock import load
from dsv4patch.progress import Progress
from dsv4patch.store import Store

pytestmark = [pytest.mark.network]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Path:
    return applied_tree(tmp_path_factory, shared_cache, "bt")


def test_archs_from_the_caller_else_the_lock_else_the_trees_release_list(tree: Path) -> None:
    pin = load(LOCK).pin("0.27.1")
    assert building.resolve_archs(tree, pin, ["9.0a"], None) == (("9.0a",), "--arch")
    archs, origin = building.resolve_archs(tree, pin, None, "13.0")
    if pin.cuda_arch_list:
        assert (archs, origin) == (pin.cuda_arch_list, 'lock: pins."0.27.1".cuda_arch_list')
    else:
        assert archs == sources.release_arch_list(tree, "13.0", platform.machine()).archs and archs
        assert origin.startswith(f"vLLM release list for {platform.machine()}")


def test_full_build_dry_run_says_what_would_run_and_runs_nothing(tree: Path) -> None:
    pin = load(LOCK).pin("0.27.1")
    res = building.full_build(tree=tree, pin=pin, archs=["9.0a", "10.0f"], python="/no/such/python", dry_run=True)
    assert res.command == ["/no/such/python", "-m", "pip", "install", "-v", "."]
    assert res.env["TORCH_CUDA_ARCH_LIST"] == "9.0a 10.0f" and res.env["MAX_JOBS"] == str(pin.build.max_jobs)
    out = res.to_json()
    assert out["mode"] == "full" and out["dry_run"] is True and out["cwd"] == str(tree)
    assert out["notes"] == ["VLLM_TARGET_DEVICE='cuda' TORCH_CUDA_ARCH_LIST='9.0a 10.0f' "
                            f"MAX_JOBS='{pin.build.max_jobs}' NVCC_THREADS='{pin.build.nvcc_threads}' "
                            "/no/such/python -m pip install -v ."]
    docker = building.full_build(tree=tree, pin=pin, archs=["9.0a"], docker=True, dry_run=True)
    assert docker.command[:4] == ["docker", "build", "-f", "docker/Dockerfile"] and docker.env == {}
    assert "torch_cuda_arch_list=9.0a" in docker.command and f"vllm-dsv4patch:{pin.name}" in docker.command


def test_expect_tree_builds_only_the_exact_clean_tree(tree: Path, shared_cache: Path) -> None:
    """``expect_tree`` (``wheel``'s warm kernel step: the cache's tree is built as it is only while it
    holds exactly the locked patched tree): another tree id, a changed tracked file or an untracked
    file is NotThatTree before anything is planned; the exact, clean tree is planned (dry run)."""
    pin = load(LOCK).pin("0.27.1")
    store = Store.open(shared_cache)
    assert pin.patched_tree is not None
    held = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD^{tree}"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert held == pin.patched_tree

    def build(expect: str) -> building.TreeBuild:
        return building.build_tree(tree=tree, pin=pin, store=store, progress=Progress(False), dry_run=True,
                                   expect_tree=expect, archs=["9.0a"])

    with pytest.raises(building.NotThatTree, match=f"HEAD holds tree {held}, not {pin.base_tree}"):
        build(str(pin.base_tree))
    source = tree / "csrc" / "topk.cu"
    if not source.exists():
        source = next(p for p in sorted((tree / "csrc").rglob("*.cu")))
    original = source.read_bytes()
    try:
        source.write_bytes(original + b"// not the patched tree\n")
        with pytest.raises(building.NotThatTree, match=f"changed or untracked: {source.relative_to(tree)}"):
            build(held)
    finally:
        source.write_bytes(original)
    planted = tree / "csrc" / "planted.cuh"
    try:
        planted.write_text("#error planted\n")
        with pytest.raises(building.NotThatTree, match="changed or untracked: csrc/planted.cuh"):
            build(held)
    finally:
        planted.unlink()
    res = build(held)
    assert res.dry_run and res.result.units, res.to_json()


def test_kernel_dry_run_installs_and_downloads_nothing(tree: Path, tmp_path: Path, cli) -> None:
    """``build --dry-run`` with a cache that has no toolchain (a fresh one): nothing is installed or
    downloaded (no toolchains/ or kernels/ entry, no blob), and the output says what a build would
    install first, from the lock (the pin's torch into the cache's toolchains/, ...), and lists the
    units it would compile (the plan), each without a key or command (the toolchain keys them)."""
    cache = tmp_path / "cache"
    pin = load(LOCK).pin("0.27.1")
    assert pin.toolchain is not None
    res = cli("build", "--lock", LOCK, "--pin", "0.27.1", "--tree", tree, "--cache-dir", cache, "--dry-run",
              "--format", "json")
    assert res.rc == 0, res.err
    out = validate_json("build", res.out)
    tc = out["toolchain"]
    assert out["dry_run"] is True and tc["installed"] is False, tc
    would = {w["what"]: w for w in tc["would_install"]}
    torch = would[f"torch {pin.toolchain.torch}"]
    assert torch["packages"] == [f"torch=={pin.toolchain.torch}"] and torch["action"] == "install"
    assert Path(torch["path"]).parent == cache / "toolchains"
    assert all(Path(w["path"]).is_relative_to(cache) and not Path(w["path"]).exists() for w in would.values())
    units = {u["unit"]: u for u in out["units"]}
    assert {"csrc/libtorch_stable/topk.cu", "<generated bindings>"} <= set(units), units
    assert all(u["key"] is None and u["object"] is None and not u["cached"] for u in units.values())
    assert units["csrc/libtorch_stable/topk.cu"]["archs"] and out["commands"] == []
    assert out["ops"] == ["persistent_topk", "cooperative_topk"]
    assert not list((cache / "toolchains").glob("*")) and not (cache / "kernels").exists()
    assert not list((cache / "blobs").rglob("*.*")) and not list((cache / "blobs" / "sha256").iterdir())

    text = cli("build", "--lock", LOCK, "--tree", tree, "--cache-dir", cache, "--dry-run")
    assert text.rc == 0, text.err
    flat = " ".join(text.out.split())
    assert (f"toolchain: not all in the cache yet, a build would first install torch {pin.toolchain.torch} "
            f"(torch=={pin.toolchain.torch}) into {cache / 'toolchains'}/torch-") in flat, text.out
    assert "this dry run installed and downloaded nothing" in flat and "would compile" in text.out
    assert not list((cache / "toolchains").glob("*")) and not (cache / "kernels").exists()
