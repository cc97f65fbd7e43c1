"""The kernel wheel's runtime (dsv4patch/kernels/runtime.py) where users run it, without a GPU.

What runs here is real: the wheel ``dsv4patch build`` makes from the patched
0.27.1 tree, installed next to vLLM 0.27.1's own Python package and its stock
``_C_stable_libtorch.abi3.so`` (both from the PyPI wheel, sha256 from the lock),
driven through vLLM's real CLI entry point and plugin loader, in the CPU test
venv (torch 2.13.0 CPU plus the pin's requirements).  This machine has no GPU
and no ``libcuda``: the stock library cannot load, which is exactly the CPU
host the issue is about.  What needs a GPU (the dispatcher override, the guard
on a real device) is proven by tests/gpu/run_vllm_binary_proof.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from conftest import LOCK
from dsv4patch.kernels import runtime, stock
from dsv4patch.pins.lock import load
from dsv4patch.proofs import testenv
from dsv4patch.store import Store

needs_nvcc = pytest.mark.skipif(
    shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(), reason="needs nvcc")


def test_coverage_rules() -> None:
    """Which cubins/PTX run on which compute capability (CUDA's compatibility rules)."""
    persistent = (["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"], [])
    cooperative = (["9.0a", "10.0f", "12.0f"], [])
    for cap in [(9, 0), (10, 0), (10, 3), (12, 0), (12, 1), (8, 9), (7, 5)]:
        assert runtime.covers(*persistent, cap), cap
    for cap in [(9, 0), (10, 0), (10, 3), (12, 0), (12, 1)]:
        assert runtime.covers(*cooperative, cap), cap
    assert not runtime.covers(*cooperative, (8, 9))
    assert not runtime.covers(*cooperative, (11, 0))
    # The old default: 12.0a code does not run on GB10 (12.1), 9.0a not on B200 (10.0).
    old = (["9.0a", "12.0a"], [])
    assert not runtime.covers(*old, (12, 1)) and not runtime.covers(*old, (10, 0))
    assert runtime.covers(*old, (9, 0)) and runtime.covers(*old, (12, 0))
    # PTX is JIT-compiled for later devices; arch-specific PTX only for its own arch.
    assert runtime.covers([], ["8.0"], (12, 1)) and not runtime.covers([], ["9.0"], (8, 9))
    assert not runtime.covers([], ["9.0a"], (10, 0))
    info = {"units": [{"unit": "topk.cu", "sass": persistent[0], "ptx": []},
                      {"unit": "cooperative_topk.cu", "sass": cooperative[0], "ptx": []}]}
    assert runtime.uncovered_units((8, 9), info) == ["cooperative_topk.cu"]
    assert runtime.uncovered_units((12, 1), info) == []


@pytest.fixture(scope="module")
def cpu_install(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> dict:
    """vLLM 0.27.1 as pip installs it (Python files, stock library, metadata; not the
    other binaries, which a CPU host never loads either) plus the dsv4patch kernel wheel."""
    from dsv4patch.main import main

    base = tmp_path_factory.mktemp("rt")
    tree, dist = base / "tree", base / "dist"
    assert main(["apply", "--lock", str(LOCK), "--pin", "0.27.1", "--tree", str(tree), "--cache-dir",
                 str(shared_cache), "--no-build", "--format", "json"]) == 0
    store = Store.open(shared_cache)
    env = testenv.ensure(tree, store)
    # Built as the card's apply builds (the lock's toolchain, no --python): its kernel objects.
    assert main(["build", "--lock", str(LOCK), "--pin", "0.27.1", "--tree", str(tree), "--out", str(dist),
                 "--cache-dir", str(shared_cache), "--format", "json"]) == 0
    plugin = next(dist.glob("*.whl"))
    pin = load(LOCK).pin("0.27.1")
    wheel = stock.wheel_for(pin, "x86_64")
    site = base / "site"
    with zipfile.ZipFile(stock.wheel_path(store, wheel)) as zf:
        for name in zf.namelist():
            if name.endswith(".py") or ".dist-info/" in name or name.endswith((".json", ".jinja")):
                zf.extract(name, site)
    shutil.copyfile(stock.member(store, wheel), site / stock.STABLE_LIBRARY)
    subprocess.run([str(env.python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--target", str(site), str(plugin)], check=True)
    dist_name = next(p.name for p in site.iterdir() if p.name.startswith("dsv4patch_kernels_")
                     and p.is_dir() and not p.name.endswith(".dist-info"))
    return {"python": str(env.python), "site": site, "dist": dist_name}


def _run(inst: dict, *args: str, site: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    e.update(PYTHONPATH=str(site or inst["site"]), CUDA_VISIBLE_DEVICES="", **env)
    return subprocess.run([inst["python"], *args], env=e, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@needs_nvcc
def test_vllm_cli_works_on_a_cpu_host_with_the_plugin_installed(cpu_install: dict) -> None:
    """vLLM's CLI loads general plugins while building its parser: the plugin must not
    take it down where libcuda is missing (the old plugin imported the stock library
    unconditionally and vLLM does not catch plugin errors: `ImportError: libcuda.so.1`).
    `vllm bench` is the subcommand vLLM runs on a CPU host (it switches to the CPU
    platform); stock vLLM's own `vllm --version` fails there before any plugin runs
    (`Failed to infer device type` while it builds the `serve` parser), with or without us."""
    for argv in (["bench", "--help"], ["bench", "latency", "--help"]):
        res = _run(cpu_install, "-c", "import sys; from vllm.entrypoints.cli.main import main; "
                                      f"sys.argv = ['vllm', *{argv!r}]; main()")
        assert res.returncode == 0, res.stderr[-3000:]
        assert "usage: vllm bench" in res.stdout
    res = _run(cpu_install, "-c", "from vllm.plugins import load_general_plugins; load_general_plugins(); "
                                  f"import {cpu_install['dist']} as k; print(k._STATE['outcome'])")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == "no-cuda"


@pytest.mark.slow
@needs_nvcc
def test_check_and_hook_on_a_cpu_host(cpu_install: dict, tmp_path: Path) -> None:
    """`python -m <dist> check` says it cannot tell (exit 3) instead of crashing; the
    hook goes into vllm/__init__.py once, and `import vllm` with it stays quiet on CPU."""
    dist = cpu_install["dist"]
    res = _run(cpu_install, "-m", dist, "check", "--json")
    assert res.returncode == 3, res.stderr[-2000:]
    report = json.loads(res.stdout[res.stdout.index("{"):])
    assert report["status"] == "unknown" and "libcuda" in report["reason"]
    assert {u["unit"] for u in report["units"]} == {"csrc/libtorch_stable/topk.cu",
                                                    "csrc/libtorch_stable/cooperative_topk.cu"}
    site = tmp_path / "site"
    shutil.copytree(cpu_install["site"], site, symlinks=True)
    for _ in range(2):
        res = _run(cpu_install, "-m", dist, "install-hook", site=site)
        assert res.returncode == 0, res.stderr
    init = (site / "vllm" / "__init__.py").read_text()
    assert init.count(runtime.HOOK_MARK) == 1 and init.rstrip().endswith(runtime.HOOK_MARK)
    res = _run(cpu_install, "-c", f"import json, vllm, {dist} as k; print(json.dumps(k._STATE))", site=site)
    assert res.returncode == 0, res.stderr[-2000:]
    state = json.loads(res.stdout.strip().splitlines()[-1])
    assert state["route"] == "vllm-hook" and state["outcome"] == "no-cuda"
    assert "ERROR" not in res.stdout + res.stderr


@pytest.mark.slow
@needs_nvcc
def test_version_mismatch_is_an_error_in_vllms_log_and_fatal_when_strict(cpu_install: dict,
                                                                        tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(cpu_install["site"], site, symlinks=True)
    info_path = site / cpu_install["dist"] / "build_info.json"
    info = json.loads(info_path.read_text())
    info["vllm_version"] = "0.27.0"
    info_path.write_text(json.dumps(info))
    code = f"from vllm.plugins import load_general_plugins; load_general_plugins(); " \
           f"import {cpu_install['dist']} as k; print(k._STATE['outcome'])"
    res = _run(cpu_install, "-c", code, site=site)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "version-mismatch"
    log = res.stdout + res.stderr
    assert "ERROR" in log and "built for vLLM 0.27.0" in log
    assert f"vllm.{cpu_install['dist']}" in log or "[__init__.py" in log  # vLLM's formatter
    res = _run(cpu_install, "-c", code, site=site, DSV4PATCH_KERNELS_STRICT="1")
    assert res.returncode != 0 and "KernelsError" in res.stderr
