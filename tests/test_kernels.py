"""Kernel rebuild: source -> unit mapping, arch lists, packaging, CI compile and coverage.

The compile tests build the patched 0.27.1 units for the default (derived)
arch list with the lock's toolchain, as the card's ``apply`` does (so they find
the objects it compiled in the shared cache), and compare the library's cubins and PTX (cuobjdump) with the stock
0.27.1 wheel's ``_C_stable_libtorch`` (downloaded once by sha256 into the store).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import platform
import shutil
import subprocess
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import LOCK, PTX_ARCH, validate_json
from dsv4patch.errors import BuildError, LockFileError
from dsv4patch.kernels import build as kbuild
from dsv4patch.kernels import fatbin, sources, stock
from dsv4patch.kernels.identity import dist_name
from dsv4patch.pins.lock import load
from dsv4patch.proofs import testenv
from dsv4patch.store import Store

# vLLM 0.27.1's release wheels (.buildkite/release-pipeline.yaml, CUDA 13.0) and what its
# CMake makes of them for nvcc 13.0: CUDA_SUPPORTED_ARCHS keeps the list, cooperative_topk.cu
# gets COOPERATIVE_TOPK_ARCHS = loose_intersection("9.0a;10.0f;...;12.1f", CUDA_ARCHS).
GPU_DIR = Path(__file__).resolve().parent / "gpu"
RELEASE_X86 = ("7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0")
TOPK = "csrc/libtorch_stable/topk.cu"
COOP = "csrc/libtorch_stable/cooperative_topk.cu"
# The kernels of each op, by mangled name (namespaces vllm::persistent / vllm::cooperative).
OP_KERNELS = {"persistent_topk": r"^_ZN4vllm10persistent", "cooperative_topk": r"^_ZN4vllm11cooperative"}


@pytest.fixture(scope="module")
def patched_tree(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Iterator[Path]:
    from dsv4patch import guard
    from dsv4patch.main import main

    tree = tmp_path_factory.mktemp("kt") / "vllm"
    rc = main(["apply", "--lock", str(LOCK), "--pin", "0.27.1", "--tree", str(tree),
               "--cache-dir", str(shared_cache), "--format", "json", "--no-build"])
    assert rc == 0
    with guard.guarded(tree):  # a work tree: git runs in it only while held (dsv4patch/guard.py)
        yield tree


def test_changed_sources_map_to_units_and_ops(patched_tree: Path) -> None:
    plan = sources.plan(patched_tree)
    # extra 2 passes max_seq_len from both launchers (topk.cu, cooperative_topk.cu); extra 3
    # adds the exact fallback to the header both units include.
    assert set(plan.changed) == {"csrc/libtorch_stable/persistent_topk.cuh",
                                 "csrc/libtorch_stable/cooperative_topk.cuh",
                                 "csrc/libtorch_stable/topk_histogram_4096.cuh",
                                 TOPK, COOP}
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


def test_default_arch_list_is_the_release_list_filtered_like_cmake(patched_tree: Path) -> None:
    """Without a lock list, each unit gets what vLLM's release build gives it."""
    rel = sources.release_arch_list(patched_tree, "13.0", "x86_64")
    assert rel.archs == RELEASE_X86 and "CUDA_ARCH_X86" in rel.origin
    cmake = sources.cmake_target(patched_tree)
    units = {u.path: u for u in sources.plan(patched_tree).units}
    assert sources.unit_archs(units[TOPK], rel.archs, "13.0", cmake) == RELEASE_X86
    assert sources.unit_archs(units[COOP], rel.archs, "13.0", cmake) == ("9.0a", "10.0f", "12.0f")
    # aarch64 wheels add Thor (11.0): CUDA_SUPPORTED_ARCHS keeps it for nvcc 13.0.
    arm = sources.release_arch_list(patched_tree, "13.0", "aarch64").archs
    assert arm == ("8.0", "8.7", "8.9", "9.0", "10.0", "11.0", "12.0")
    assert sources.unit_archs(units[COOP], arm, "13.0", cmake) == ("9.0a", "10.0f", "11.0f", "12.0f")
    # nvcc 12.9: the _CU129 list and CMake's 12.x branches ('a' targets, no family code).
    cu129 = sources.release_arch_list(patched_tree, "12.9", "x86_64")
    assert cu129.archs == RELEASE_X86 and "CU129" in cu129.origin
    assert sources.unit_archs(units[COOP], cu129.archs, "12.9", cmake) == ("9.0a", "10.0a", "12.0a")
    # nvcc 13.0 does not support 10.1/10.3 SASS: dropped from a requested list, as CMake does.
    assert sources.unit_archs(units[TOPK], ("10.0", "10.3", "12.1"), "13.0", cmake) == ("10.0", "12.0")


def test_loose_intersection_matches_cmake() -> None:
    src = ("9.0a", "10.0f", "12.0f", "12.1f")
    assert sources.loose_intersection(src, ("9.0a", "12.0a")) == ("9.0a", "12.0a")
    assert sources.loose_intersection(src, ("9.0", "12.0")) == ("9.0a", "12.0f")
    assert sources.loose_intersection(src, ("8.9",)) == ()
    # The highest source arch of the same major that is not newer than the target...
    assert sources.loose_intersection(("7.5", "8.0", "8.6", "8.9"), ("8.7",)) == ("8.6",)
    # ...any major for a +PTX source, which stays +PTX (cmake/utils.cmake's example).
    assert sources.loose_intersection(("8.0+PTX",), ("9.0",)) == ("8.0+PTX",)
    assert sources.loose_intersection(("7.5", "8.0", "8.6", "9.0", "9.0a"), ("8.0", "8.9", "9.0")) == (
        "8.0", "8.6", "9.0a")


def test_arch_lists_take_the_nvcc_version_of_their_closest_branch() -> None:
    """parse_cmake reads each list's nvcc version from the closest if()/elseif()/else() before it (the
    branches are found once for the whole file: issue 39's warm wheel parsed it in 40-50 ms before);
    conditions may span lines; a call's arguments end at its matching bracket."""
    text = """
set(VLLM_STABLE_EXT_SRC "csrc/a.cu")  # comment (with a bracket
if(${CMAKE_CUDA_COMPILER_VERSION} VERSION_GREATER_EQUAL 13.0
   AND (VLLM_GPU_LANG STREQUAL "CUDA"))
  cuda_archs_loose_intersection(A_ARCHS "10.0f;12.0f" "${CUDA_ARCHS}")
elseif(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL "12.8")
  cuda_archs_loose_intersection(A_ARCHS "10.0a;12.0a" "${CUDA_ARCHS}")
  if(SOMETHING)
    cuda_archs_loose_intersection(B_ARCHS "9.0a" "${CUDA_ARCHS}")
  endif()
else()
  cuda_archs_loose_intersection(A_ARCHS "8.0" "${CUDA_ARCHS}")
endif()
cuda_archs_loose_intersection(C_ARCHS "7.5" "${CUDA_ARCHS}")
set(CUDA_SUPPORTED_ARCHS "7.5;8.0")
"""
    target = sources.parse_cmake(text)
    assert target.sources == ("csrc/a.cu",)
    assert target.arch_lists == {"A_ARCHS": [("13.0", ("10.0f", "12.0f")), ("12.8", ("10.0a", "12.0a")),
                                             (None, ("8.0",))],
                                 "B_ARCHS": [(None, ("9.0a",))],  # if(SOMETHING): no version
                                 "C_ARCHS": [(None, ("7.5",))]}  # after endif(): the else() is the last branch
    assert target.supported == [(None, ("7.5", "8.0"))]
    assert sources._enclosed("a(b(c)d)e)f", 2, "(", ")") == "b(c)d"
    assert sources._enclosed("(x(y", 1, "(", ")") == "x("  # unclosed: the rest but its last character


def test_gencode_family_and_ptx() -> None:
    assert kbuild.gencode("10.0f") == ["-gencode", "arch=compute_100f,code=sm_100f"]
    assert kbuild.gencode("12.0+PTX") == ["-gencode", "arch=compute_120,code=sm_120",
                                          "-gencode", "arch=compute_120,code=compute_120"]
    with pytest.raises(BuildError):
        kbuild.gencode("sm_90")
    # A +PTX request keeps PTX for the unit's arch of that version (vLLM would drop it).
    tu = sources.TranslationUnit("x.cu", sources.TARGET, (), ())
    assert sources.unit_archs(tu, ("9.0", "12.0+PTX"), "13.0") == ("9.0", "12.0+PTX")
    assert sources.split_ptx(("9.0", "12.0+PTX")) == (["9.0", "12.0"], ["12.0"])


def test_lock_arch_list_optional_and_stock_wheels() -> None:
    pin = load(LOCK).pin("0.27.1")
    assert pin.cuda_arch_list is None  # the release list, derived from the tree
    x86 = pin.wheels["x86_64"]
    assert x86.sha256 == "98e9fc2a1ed8549a733c9d1b242e2002b82367da9e29e37801761438cb3a2670"
    assert x86.size == 312887766 and x86.url.endswith("manylinux_2_28_x86_64.whl")
    assert pin.wheels["aarch64"].url.endswith("manylinux_2_28_aarch64.whl")


def test_lock_rejects_bad_arch_and_wheel_platform(tmp_path: Path) -> None:
    text = LOCK.read_text()
    bad = tmp_path / "arch.toml"
    bad.write_text(text.replace('[pins."0.27.1".build]', 'cuda_arch_list = ["sm_90"]\n[pins."0.27.1".build]'))
    with pytest.raises(LockFileError, match="cuda_arch_list"):
        load(bad)
    ok = tmp_path / "ptx.toml"
    ok.write_text(text.replace('vllm_version = "0.27.1"\n', 'vllm_version = "0.27.1"\ncuda_arch_list = ["9.0a", "12.0+PTX"]\n'))
    assert load(ok).pin("0.27.1").cuda_arch_list == ("9.0a", "12.0+PTX")
    plat = tmp_path / "plat.toml"
    plat.write_text(text.replace("\naarch64 = {", "\nppc64le = {", 1))
    with pytest.raises(LockFileError, match="ppc64le"):
        load(plat)


def _toolchain(**kw: object) -> kbuild.Toolchain:
    base = kbuild.Toolchain(
        nvcc=Path("/usr/local/bin/nvcc"), nvcc_version="release 13.0", cuda_version="13.0",
        python="/x/python", torch_version="2.13.0", torch_cuda_version="13.0",
        torch_include=Path("/x"), torch_lib=Path("/x"), include_dirs=())
    return dataclasses.replace(base, **kw)


def test_cuda_major_mismatch_is_refused(patched_tree: Path, tmp_path: Path) -> None:
    tc = _toolchain(torch_cuda_version="12.8")
    with pytest.raises(BuildError) as exc:
        kbuild.build(sources.plan(patched_tree), pin_name="0.27.1", vllm_version="0.27.1",
                     archs=("9.0a",), store=Store.open(tmp_path / "s"), toolchain=tc,
                     out_dir=tmp_path, dry_run=True)
    assert exc.value.exit_code == 7
    assert "CUDA 13.0" in str(exc.value) and "CUDA 12.8" in str(exc.value)
    assert kbuild.check_cuda_match(_toolchain(torch_cuda_version="13.2")) is None
    note = kbuild.check_cuda_match(_toolchain(torch_cuda_version=None))
    assert note is not None and "CUDA 13.x" in note


def test_wheel_tag_from_build_machine() -> None:
    assert kbuild.wheel_tag("x86_64") == "py3-none-linux_x86_64"
    assert kbuild.wheel_tag("aarch64") == "py3-none-linux_aarch64"


def test_a_build_asks_nvcc_for_its_toolkit_root_once_for_all_its_units(patched_tree: Path, tmp_path: Path) -> None:
    """Every unit's command carries the same prefix maps: planning a build asks ``nvcc -dryrun`` for
    TOP once, not once per unit (three asks of a warm wheel's kernel step before), and every
    command maps that root."""
    asked = tmp_path / "asked"
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(f"#!/bin/sh\necho x >> {asked}\necho '#$ TOP=/opt/cuda-a/bin/..'\n")
    nvcc.chmod(0o755)
    units, _, _ = kbuild.plan_build(sources.plan(patched_tree), ("9.0a", "12.0+PTX"), _toolchain(nvcc=nvcc),
                                    Store.open(tmp_path / "s"))
    assert len(units) == 3 and asked.read_text().count("x") == 1  # two units and the bindings
    assert all("-ffile-prefix-map=/opt/cuda-a/bin/..=/dsv4patch/cuda" in u.command for u in units)


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
    out = validate_json("build", r.out)
    assert out["command"][-4:] == ["pip", "install", "-v", "."]
    # No cuda_arch_list in the lock: vLLM's release list for this machine.
    assert out["env"]["TORCH_CUDA_ARCH_LIST"] == " ".join(
        sources.release_arch_list(patched_tree, kbuild.nvcc_version(kbuild.find_nvcc())[1]
                                  if shutil.which("nvcc") else None, platform.machine()).archs)
    assert out["env"]["MAX_JOBS"] == "2" and out["env"]["NVCC_THREADS"] == "1"
    r = cli("build", "--lock", LOCK, "--tree", patched_tree, "--full", "--docker", "--dry-run",
            "--format", "json", "--cache-dir", shared_cache)
    cmd = validate_json("build", r.out)["command"]
    assert cmd[:4] == ["docker", "build", "-f", "docker/Dockerfile"]
    assert f"torch_cuda_arch_list={out['env']['TORCH_CUDA_ARCH_LIST']}" in cmd


def test_wheel_layout(tmp_path: Path) -> None:
    whl = kbuild.write_wheel(tmp_path, "dsv4patch_kernels_0_27_1", "0.27.1+treeabc",
                             {"dsv4patch_kernels_0_27_1/__init__.py": b"def register():\n    pass\n"},
                             "[vllm.general_plugins]\nx = dsv4patch_kernels_0_27_1:register\n")
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


@pytest.fixture(scope="module")
def built(patched_tree: Path, shared_cache: Path, tmp_path_factory: pytest.TempPathFactory):
    """The CI kernel compile: the patched units for the default arch list, with the toolchain
    the card's ``apply`` builds with (the lock's torch and nvcc, cached in the store): the
    objects it compiled are found, so a run after the README's first command compiles nothing
    here (one compile per unit and arch per cache)."""
    from dsv4patch.kernels import toolchain
    from dsv4patch.progress import Progress

    store = Store.open(shared_cache)
    pin = load(LOCK).pin("0.27.1")
    tc = toolchain.resolve(store=store, pin=pin, tree=patched_tree, progress=Progress(False))
    rel = sources.release_arch_list(patched_tree, tc.cuda_version, platform.machine())
    plan = sources.plan(patched_tree)
    out = tmp_path_factory.mktemp("dist")
    kwargs = dict(pin_name=pin.name, vllm_version=pin.vllm_version, archs=rel.archs,
                  store=store, toolchain=tc, out_dir=out, max_jobs=pin.build.max_jobs,
                  nvcc_threads=pin.build.nvcc_threads)
    t0 = time.monotonic()
    first = kbuild.build(plan, **kwargs)
    seconds = time.monotonic() - t0
    second = kbuild.build(plan, **kwargs)
    print(f"kernel build: {seconds:.0f}s wall, per unit "
          + ", ".join(f"{u.source} {u.seconds:.0f}s{' (cached)' if u.cached else ''}" for u in first.units))
    return tc, rel, first, second


@pytest.mark.slow
@needs_nvcc
def test_patched_units_compile_for_default_archs_and_rebuild_is_noop(built) -> None:
    """The CI kernel-compile check: runs wherever nvcc is (torch comes from the test venv)."""
    tc, rel, first, second = built
    assert first.wheel is not None and first.wheel.exists()
    assert first.ops == ["persistent_topk", "cooperative_topk"]
    assert {u.source: u.archs for u in first.units if u.archs} == {
        TOPK: sources.cuda_archs(rel.archs, tc.cuda_version, sources.cmake_target(first.plan.tree)),
        COOP: sources.unit_archs(next(u for u in first.plan.units if u.path == COOP), rel.archs,
                                 tc.cuda_version, sources.cmake_target(first.plan.tree)),
    }
    assert second.compiled == []
    assert second.library == first.library
    zf = zipfile.ZipFile(first.wheel)
    name = dist_name("0.27.1")
    info = json.loads(zf.read(f"{name}/build_info.json"))
    assert info["units"] == [
        {"unit": TOPK, "ops": ["persistent_topk"], "sass": list(first.units[0].archs), "ptx": []},
        {"unit": COOP, "ops": ["cooperative_topk"], "sass": list(first.units[1].archs), "ptx": []},
    ]
    assert info["torch_cuda_version"] == tc.torch_cuda_version
    assert {"vllm_version", "pin", "tree_id", "head", "base", "archs", "ops", "torch_version",
            "cuda_version", "library"} <= set(info)
    meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    assert "Requires-Dist: vllm==0.27.1\n" in zf.read(meta).decode()
    assert first.wheel.name.endswith(f"-py3-none-linux_{platform.machine()}.whl")
    if tc.torch_cuda_version is None:
        assert any("CPU-only" in n and f"CUDA {kbuild.cuda_major(tc.cuda_version)}.x" in n
                   for n in first.notes)


@pytest.fixture(scope="session")
def stock_reader(shared_cache: Path):
    """machine -> the stock 0.27.1 wheel's _C_stable_libtorch as read by cuobjdump; the
    wheel is downloaded once into the store, the .so extracted once, read once per session."""
    seen: dict[str, fatbin.Fatbin] = {}

    def read(machine: str) -> fatbin.Fatbin:
        if machine not in seen:
            tool = fatbin.find_cuobjdump(kbuild.find_nvcc())
            if tool is None:
                pytest.fail("cuobjdump not found: install the test extra (pip install -e '.[test]', it "
                            "brings nvidia-cuda-cuobjdump) or put the CUDA toolkit's cuobjdump on PATH")
            pin = load(LOCK).pin("0.27.1")
            seen[machine] = fatbin.read(tool, stock.member(Store.open(shared_cache),
                                                           stock.wheel_for(pin, machine)))
        return seen[machine]

    return read


@pytest.fixture(scope="session")
def stock_fatbin(stock_reader) -> fatbin.Fatbin:
    return stock_reader("x86_64")


@pytest.mark.slow
@pytest.mark.network
@needs_nvcc
def test_cuobjdump_plugin_covers_stock_wheel(built, stock_fatbin: fatbin.Fatbin) -> None:
    """Every SASS arch and PTX the stock wheel has for an op's kernels, the plugin has too."""
    tc, _rel, first, _second = built
    ours = fatbin.read(fatbin.find_cuobjdump(tc.nvcc), first.library)
    # --list-elf/--list-ptx: the library holds exactly the units' code (no PTX by default).
    assert len(ours.elf_files) == sum(len(u.archs) for u in first.units if u.archs)
    assert ours.ptx_files == []
    report = {}
    for op, pattern in OP_KERNELS.items():
        stock_sass, stock_ptx = stock_fatbin.archs(pattern)
        our_sass, our_ptx = ours.archs(pattern)
        report[op] = {"stock": sorted(stock_sass) + [f"ptx {a}" for a in sorted(stock_ptx)],
                      "ours": sorted(our_sass) + [f"ptx {a}" for a in sorted(our_ptx)]}
        assert stock_sass, f"no {op} kernels in the stock wheel: {pattern}"
        assert stock_fatbin.kernels(pattern) <= ours.kernels(pattern), op
        assert stock_sass <= our_sass, (op, report[op])
        assert stock_ptx <= our_ptx, (op, report[op])
    print(json.dumps(report))


@pytest.mark.slow
@needs_nvcc
def test_ptx_request_embeds_ptx_and_build_info_says_so(
    built, patched_tree: Path, shared_cache: Path, tmp_path: Path
) -> None:
    """A narrowed ``12.0+PTX`` build: SASS and PTX per unit in the library (cuobjdump)
    equal what build_info.json records; the family unit's PTX is compute_120f.  Its objects are
    the ones ``dsv4patch build --arch 12.0+PTX`` plans (test_toolchain's byte-identity build of
    0.27.1 in this cache): one compile of them per run for both tests (issue 39)."""
    from dsv4patch.kernels import building
    from dsv4patch.progress import Progress

    tc = built[0]
    pin = load(LOCK).pin("0.27.1")
    assert PTX_ARCH == "12.0+PTX"  # what the assertions below expect
    store = Store.open(shared_cache)
    res = kbuild.build(sources.plan(patched_tree), pin_name=pin.name, vllm_version=pin.vllm_version,
                       archs=(PTX_ARCH,), store=store, toolchain=tc, out_dir=tmp_path,
                       max_jobs=pin.build.max_jobs, nvcc_threads=pin.build.nvcc_threads)
    assert res.wheel is not None and res.library is not None
    cli_plan = building.build_tree(tree=patched_tree, pin=pin, store=store, progress=Progress(False),
                                   archs=[PTX_ARCH], dry_run=True).result
    assert [(u.name, u.key) for u in cli_plan.units] == [(u.name, u.key) for u in res.units]
    assert all(u.cached for u in cli_plan.units)
    info = json.loads(zipfile.ZipFile(res.wheel).read(f"{dist_name('0.27.1')}/build_info.json"))
    assert info["units"] == [
        {"unit": TOPK, "ops": ["persistent_topk"], "sass": ["12.0"], "ptx": ["12.0"]},
        {"unit": COOP, "ops": ["cooperative_topk"], "sass": ["12.0f"], "ptx": ["12.0f"]},
    ]
    ours = fatbin.read(fatbin.find_cuobjdump(tc.nvcc), res.library)
    assert len(ours.ptx_files) == 2
    for unit in info["units"]:
        (op,) = unit["ops"]
        assert ours.archs(OP_KERNELS[op]) == (set(unit["sass"]), set(unit["ptx"])), op


@pytest.mark.slow
@pytest.mark.network
@needs_nvcc
@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_derived_archs_equal_stock_wheel_per_platform(
    machine: str, patched_tree: Path, stock_reader
) -> None:
    """No compile: the per-unit archs derived for each platform's release build are exactly
    the archs the stock 0.27.1 wheel of that platform has for the op's kernels (GB10/GB200
    hosts are aarch64, whose release list differs)."""
    stock_fb = stock_reader(machine)
    plan = sources.plan(patched_tree)
    cmake = sources.cmake_target(patched_tree)
    rel = sources.release_arch_list(patched_tree, "13.0", machine)  # 0.27.1's wheels: CUDA 13.0
    for unit in plan.units:
        sass, ptx = sources.split_ptx(sources.unit_archs(unit, rel.archs, "13.0", cmake))
        for op in (o.name for o in plan.ops if o.unit == unit.path):
            assert stock_fb.archs(OP_KERNELS[op]) == (set(sass), set(ptx)), (machine, op)


# Issue 29's shape, on CPU: the GPU differential's exact check (run_vllm_binary_proof.check)
# against a reference built with torch.topk, and the three wrong answers it must refuse.
ISSUE29_CHECK = r"""
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
import run_vllm_binary_proof as proof

case = next(c for c in proof.issue29_cases() if c["op"] == "cooperative_topk" and c["k"] == 2048
            and c["data"] == "randn")
rows, width, k, msl = case["rows"], case["width"], case["k"], case["msl"]
g = torch.Generator().manual_seed(29)
logits = torch.randn(rows, width, generator=g)

def answer(limit):
    out = torch.full((rows, k), -1, dtype=torch.int32)
    for r, raw in enumerate(case["lengths"]):
        n = max(0, min(raw, width, limit))
        if n <= k:
            out[r, :n] = torch.arange(n, dtype=torch.int32)
        else:
            out[r] = torch.topk(logits[r, :n], k).indices.to(torch.int32)
    return out

right = answer(msl)
by_width = answer(width)  # extra 2 before issue 29: max_seq_len not applied
dup = right.clone()
long_row = next(r for r, raw in enumerate(case["lengths"]) if raw > msl)
dup[long_row, 1024:] = dup[long_row, :1024]  # 1,024 copies of the first 1,024 indices
outside = right.clone()
outside[long_row, 0] = width + 5
report = {"valid": proof.valid_lengths(case),
          "right": proof.check(torch, case, logits, right),
          "by_width": proof.check(torch, case, logits, by_width),
          "dup": proof.check(torch, case, logits, dup),
          "outside": proof.check(torch, case, logits, outside)}
print(json.dumps(report))
"""


def test_issue29_shape_exact_check_on_cpu(patched_tree: Path, shared_cache: Path) -> None:
    """The H200 differential holds issue 29's shape and judges it exactly: the top-k of
    min(len, width, max_seq_len) passes; the answer by width alone, 1,024 repeated indices
    and an index past the row each fail the row they are in."""
    spec = importlib.util.spec_from_file_location("run_vllm_binary_proof",
                                                  GPU_DIR / "run_vllm_binary_proof.py")
    assert spec is not None and spec.loader is not None
    proof = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(proof)
    cases = proof.issue29_cases()
    assert {(c["op"], c["rows"]) for c in cases} == {
        ("cooperative_topk", 31), ("persistent_topk", 31), ("persistent_topk", 40)}
    assert all(c["width"] == 196608 and c["msl"] == 32768 for c in cases)
    assert {177256, 44418, 175412, 115691, 70619, 150196, 157786, 196608, -(2**31), -1, 0, 2049} <= {
        x for c in cases for x in c["lengths"]}
    env = testenv.ensure(patched_tree, Store.open(shared_cache))
    res = subprocess.run([str(env.python), "-c", ISSUE29_CHECK, str(GPU_DIR)], env=env.env(),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rep = json.loads(res.stdout.strip().splitlines()[-1])
    lengths = next(c for c in cases if c["op"] == "cooperative_topk")["lengths"]
    assert rep["valid"] == [[max(0, min(x, 196608, 32768))] for x in lengths]
    assert rep["right"] == []
    # Judged by width alone, every row much longer than max_seq_len is wrong (a row of 32769
    # may keep the same top-k by chance), and no other row is.
    wrong_rows = {int(e.split()[1]) for e in rep["by_width"]}
    assert {r for r, x in enumerate(lengths) if x >= 40000} <= wrong_rows
    assert wrong_rows <= {r for r, x in enumerate(lengths) if x > 32768}
    assert len(rep["dup"]) == 1 and "1024 repeated" in rep["dup"][0]
    assert len(rep["outside"]) == 1 and "1 >= width" in rep["outside"][0]


# Extra 3's gated cases, on CPU: the exact check judges a tie-overflow row (8192 scores of
# one coarse bin at the head of a row of 32768) against torch.topk, as on the H200.
OVERFLOW_CHECK = r"""
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
import run_vllm_binary_proof as proof

cases = proof.overflow_cases()
case = next(c for c in cases if c["op"] == "cooperative_topk" and c["k"] == 2048
            and c.get("data") == "tie_block")
case = dict(case, rows=3, lengths=case["lengths"][:3])
rows, width, k = case["rows"], case["width"], case["k"]
g = torch.Generator().manual_seed(29)
logits = -(torch.randn(rows, width, generator=g).abs() + 1.0)
logits[:, :8192] = 0.5 + torch.rand(rows, 8192, generator=g) * 0.03
right = torch.stack([torch.topk(logits[r, :32768], k).indices for r in range(rows)]).int()
unwritten = right.clone()
unwritten[0, 1024:] = -7  # cooperative_topk before extra 3: 1,024 slots never written
subset = right.clone()  # the top-k of the first 1,024 tie entries only
subset[1, :] = torch.cat([torch.topk(logits[1, :1024], 1024).indices,
                          torch.topk(logits[1, 8192:32768], k - 1024).indices + 8192]).int()
print(json.dumps({"n": len(cases), "data": sorted({c.get("data", "randn") for c in cases}),
                  "ops": sorted({(c["op"], c["rows"]) for c in cases}),
                  "right": proof.check(torch, case, logits, right),
                  "unwritten": proof.check(torch, case, logits, unwritten),
                  "subset": proof.check(torch, case, logits, subset)}))
"""


def test_overflow_cases_exact_check_on_cpu(patched_tree: Path, shared_cache: Path) -> None:
    """The H200 proof gates concentrated and tied scores on every path (extra 3) and judges them
    exactly: the top-k passes; 1,024 unwritten slots and a top-k over a subset of the ties fail."""
    env = testenv.ensure(patched_tree, Store.open(shared_cache))
    res = subprocess.run([str(env.python), "-c", OVERFLOW_CHECK, str(GPU_DIR)], env=env.env(),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rep = json.loads(res.stdout.strip().splitlines()[-1])
    assert rep["n"] == 44
    assert {"rand", "ties", "tie_block", "equal", "randn"} == set(rep["data"])
    assert [["cooperative_topk", 31], ["persistent_topk", 31], ["persistent_topk", 40]] == [
        o for o in rep["ops"] if o[1] in (31, 40)]
    assert rep["right"] == []
    assert len(rep["unwritten"]) == 1 and "1024 never written" in rep["unwritten"][0]
    assert len(rep["subset"]) == 1 and rep["subset"][0].startswith("row 1 ")
    assert "values differ" in rep["subset"][0]


def test_kernel_wheel_names_differ_when_their_content_does() -> None:
    """issue 40: `build --arch 9.0` wrote a wheel of the very name of the 7-arch one (710 KB against
    3.47 MB), one silently replacing the other in dist/. The version carries the tree and a short
    hash of the arch set and the toolchain; it stays a version pip takes for vllm==<pin>."""
    from packaging.version import Version

    info = {"archs": ["9.0a", "10.0f", "12.0"], "torch_version": "2.13.0", "torch_cuda_version": "13.0",
            "cuda_version": "13.0", "library_sha256": "00" * 32}
    tree = "ec2fff2214be0bf2a8ef5f42aa983aeebc2f1009"
    seven = kbuild.wheel_version("0.27.1", tree, info)
    one = kbuild.wheel_version("0.27.1", tree, {**info, "archs": ["9.0"]})
    other_cuda = kbuild.wheel_version("0.27.1", tree, {**info, "cuda_version": "13.1"})
    other_torch = kbuild.wheel_version("0.27.1", tree, {**info, "torch_version": "2.11.0"})
    assert len({seven, one, other_cuda, other_torch}) == 4
    # The same build is the same name: order of --arch does not matter, nor the library's bytes.
    assert kbuild.wheel_version("0.27.1", tree, {**info, "archs": ["12.0", "9.0a", "10.0f"],
                                                 "library_sha256": "11" * 32}) == seven
    for v in (seven, one):
        parsed = Version(v)
        assert parsed.public == "0.27.1" and parsed.local is not None and parsed.local.startswith("tree" + tree[:12])
        assert str(parsed) == v and "-" not in v  # the wheel file name splits at "-"
