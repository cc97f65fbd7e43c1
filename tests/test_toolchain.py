"""dsv4patch.kernels.toolchain: the kernel build's torch and nvcc come from the pin.

Real pip against this machine's package sources (here a wheel mirror serves
torch 2.13.0+cpu, which the lock's hashes include), the lock's hashed
requirements file, real nvcc compiles of the patched units for one arch
(9.0a, 0.27.1's byte comparison 12.0+PTX: the test's arch list is cut to one to keep it
within minutes), real git
trees from the cached sdist.  No GPU is needed: nothing here loads the library.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import LOCK, PTX_ARCH, beside_cache
from dsv4patch.delivery import installed
from dsv4patch.errors import BuildError, LockFileError
from dsv4patch.kernels import toolchain
from dsv4patch.pins.lock import load
from dsv4patch.progress import Progress
from dsv4patch.store import Store

PIN = load(LOCK).pin("0.27.1")
ARCH = "9.0a"
HAVE_NVCC = bool(toolchain.system_nvccs())
needs_nvcc = pytest.mark.skipif(not HAVE_NVCC, reason="needs a system nvcc")


def _apply(tmp_path_factory: pytest.TempPathFactory, cache: Path, pin: str) -> Path:
    from dsv4patch.main import main

    t = tmp_path_factory.mktemp("tc") / "vllm"
    assert main(["apply", "--lock", str(LOCK), "--pin", pin, "--tree", str(t),
                 "--cache-dir", str(cache), "--format", "json", "--no-build"]) == 0
    return t


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Path:
    return _apply(tmp_path_factory, shared_cache, "0.27.1")


@pytest.fixture(scope="module")
def pin_trees(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> dict[str, Path]:
    """Patched trees of the pins whose series changes kernels, made once per module on first use."""
    return {}


def _run(*args: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None,
         prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [*(prefix or []), sys.executable, "-m", "dsv4patch", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=3600,
                          env={**os.environ, **(env or {})})


def test_lock_requirements_are_pinned_and_hashed(tmp_path: Path) -> None:
    assert PIN.toolchain is not None and PIN.toolchain.torch == "2.13.0"
    lock = load(LOCK)
    assert {t.torch for t in lock.toolchains.values()} >= {"2.11.0", "2.13.0", "2.14.0"}
    for tdef in lock.toolchains.values():
        reqs = toolchain.read_requirements(tdef.requirements)
        # PyPI's cp310-cp314 wheels for x86_64 and aarch64, each by the index's sha256
        assert reqs["torch"].version.split("+")[0] == tdef.torch and len(reqs["torch"].hashes) >= 10, tdef.name
        for name in (*toolchain.CUDA_PACKAGES, toolchain.CUBLAS_PACKAGE):
            assert len(reqs[name].hashes) >= 2, (tdef.name, name)
    # Every pin whose series changes kernels has a toolchain of the torch its tree requires.
    for pin in lock.pins.values():
        assert pin.toolchain is not None, pin.name
    bad = tmp_path / "r.txt"
    bad.write_text("torch==2.13.0\n")
    with pytest.raises(LockFileError, match="pinned and hashed"):
        toolchain.read_requirements(bad)


def test_required_torch_is_read_from_the_pinned_tree(tree: Path) -> None:
    req = toolchain.required_torch(tree)
    assert (req.version, req.origin) == ("2.13.0", "requirements/cuda.txt of the pinned tree")


@pytest.mark.slow
def test_provisioned_torch_is_cached_and_hash_checked(tmp_path: Path) -> None:
    assert PIN.toolchain is not None
    store = Store.open(tmp_path / "cache")
    env = toolchain.ensure_torch(store, PIN.toolchain, Progress(False))
    assert toolchain.public(env.version) == "2.13.0"
    assert (env.include / "torch" / "csrc" / "stable" / "library.h").is_file()
    assert (env.lib / "libtorch_cpu.so").is_file() and (env.lib / "libc10.so").is_file()
    again = toolchain.ensure_torch(store, PIN.toolchain, Progress(False))  # no pip: .ready is there
    assert again == env
    # A hash the index's file does not have: pip refuses, nothing is left in the cache.
    only_wrong = toolchain.Requirement("torch", "2.13.0", ("0" * 64,))
    store2 = Store.open(tmp_path / "cache2")
    with pytest.raises(BuildError, match="pip exit"):
        toolchain._provision(store2, "torch", (["t"], [only_wrong]), Progress(False), "installing torch")
    assert list((store2.root / "tmp").iterdir()) == []
    assert not (store2.root / "toolchains").exists() or not any((store2.root / "toolchains").iterdir())


@pytest.mark.slow
@needs_nvcc
def test_nonexistent_nvcc_fails_and_wrong_torch_is_refused(tree: Path, shared_cache: Path,
                                                           tmp_path: Path) -> None:
    env = {"DSV4PATCH_CACHE": str(shared_cache)}
    res = _run("build", "--lock", LOCK, "--pin", "0.27.1", "--tree", tree, "--arch", ARCH,
               "--nvcc", "/nonexistent/nvcc", "--out", tmp_path / "d", env=env)
    assert res.returncode == 7, res.stderr
    assert "--nvcc /nonexistent/nvcc: no such executable" in res.stderr
    assert not (tmp_path / "d").exists()
    # `wheel` builds the kernels in the cache: a failed build leaves no tmp/kernels-wheel-* there.
    before = set((shared_cache / "tmp").glob("kernels-wheel-*"))
    res = _run("wheel", "--lock", LOCK, "--pin", "0.27.1", "--nvcc", "/nonexistent/nvcc", "--out", tmp_path / "w",
               env=env)
    assert res.returncode == 7 and "--nvcc /nonexistent/nvcc: no such executable" in res.stderr, res.stderr
    assert set((shared_cache / "tmp").glob("kernels-wheel-*")) <= before
    # A torch other than the pin's (the issue's user had 2.14.1; here 2.14.0, the torch pin 0.33.0's
    # toolchain provisions, which its byte-identity build uses too: one install per run, issue 39):
    # refused with both versions.
    other = _pin_torch(shared_cache, "0.33.0", "2.14.0").python
    res = _run("build", "--lock", LOCK, "--pin", "0.27.1", "--tree", tree, "--arch", ARCH,
               "--python", other, "--out", tmp_path / "d", env=env)
    assert res.returncode == 7, res.stderr
    assert "torch 2.14.0" in res.stderr and "not torch 2.13.0" in res.stderr
    assert "--allow-torch 2.14.0" in res.stderr
    res = _run("build", "--lock", LOCK, "--pin", "0.27.1", "--tree", tree, "--arch", ARCH,
               "--allow-torch", "2.14.0", "--out", tmp_path / "d", env=env)
    assert res.returncode == 2 and "--allow-torch VERSION goes with --python" in res.stderr


def _build(tree: Path, cache: Path, out: Path, *extra: str, prefix: list[str] | None = None,
           env: dict[str, str] | None = None, pin: str = "0.27.1",
           arch: str = ARCH) -> tuple[dict, subprocess.CompletedProcess[str]]:
    res = _run("build", "--lock", LOCK, "--pin", pin, "--tree", tree, "--arch", arch,
               "--out", out, "--format", "json", *extra, prefix=prefix,
               env={"DSV4PATCH_CACHE": str(cache), **(env or {})})
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout), res


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


CAN_HIDE = os.geteuid() == 0 and shutil.which("unshare") is not None


def _hidden_toolkit(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """A private mount namespace without the system CUDA toolkit: an empty directory over the
    CUDA root, /dev/null over the nvcc wrappers, no CUDA_HOME; PATH stays (its nvcc is hidden)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    hide = [f"mount --bind {empty} {Path('/usr/local/cuda').resolve()}"]
    hide += [f"mount --bind /dev/null {p}" for p in ("/usr/local/bin/nvcc", "/usr/bin/nvcc") if Path(p).exists()]
    prefix = ["unshare", "-m", "--propagation", "private", "sh", "-c", " && ".join(hide) + ' && exec "$@"', "sh"]
    probe = subprocess.run([*prefix, "sh", "-c", "command -v nvcc && nvcc --version"], capture_output=True, text=True)
    assert "release" not in probe.stdout, probe.stdout  # no working nvcc left
    return prefix, {"CUDA_HOME": "", "CUDA_PATH": ""}


def _pin_torch(shared_cache: Path, pin: str, version: str | None = None) -> toolchain.TorchEnv:
    """The torch ``pin``'s lock entry provisions (``version``, where given, checked first), installed
    into the shared cache if it is not there yet: one install per run, whichever test asks first."""
    tdef = load(LOCK).pin(pin).toolchain
    assert tdef is not None and tdef.torch == (version or tdef.torch)
    return toolchain.ensure_torch(Store.open(shared_cache), tdef, Progress(False))


def _seed_torch(shared_cache: Path, cache: Path, pin: str = "0.27.1") -> None:
    """``cache``'s toolchains/ gets the pin's provisioned torch (_pin_torch) as hard links: the torch
    at its own path in that cache, without a second GB on disk (test_provisioned_torch_is_cached_and_hash_checked
    installs one cold)."""
    env = _pin_torch(shared_cache, pin)
    root = Path(env.python).parent.parent  # <cache>/toolchains/torch-<key>
    (cache / "toolchains").mkdir(parents=True)
    subprocess.run(["cp", "-al", str(root), str(cache / "toolchains" / root.name)], check=True)


# What a cold cache downloads besides the torch (NVIDIA's nvcc wheels, ~300 MB installed; the
# toolchain's cuBLAS headers, from a ~420 MB wheel): the first cold build of the module downloads
# and installs each entry as any cold cache does; later cold caches get the entries it made as hard
# links at their own paths, so a run downloads each once instead of once per pin.
COLD_DOWNLOADS = ("toolchains/cuda-*", "kernels/cublas-headers/*")


# The torch of each pin the module needs after the first tests, in the order they need it: 0.33.0's
# (test_nonexistent_nvcc_fails_and_wrong_torch_is_refused, the fourth test) before 0.26.0's (its
# byte-identity test and the allow-torch test, minutes later).
AHEAD = ("0.33.0", "0.26.0")
_AHEAD_CODE = """
import sys
from pathlib import Path
from dsv4patch.kernels import toolchain
from dsv4patch.pins.lock import load
from dsv4patch.progress import Progress
from dsv4patch.store import Store

lock, store = load(Path(sys.argv[1])), Store.open(Path(sys.argv[2]))
for pin in sys.argv[3:]:
    toolchain.ensure_torch(store, lock.pin(pin).toolchain, Progress(False))
"""


@pytest.fixture(scope="module", autouse=True)
def torch_ahead(shared_cache: Path) -> Iterator[None]:
    """The torch of 0.33.0 and 0.26.0 (~1 GB of wheels each) installed into the shared cache from the
    module's start, while its first tests and 0.27.1's builds run (issue 39: a fresh clone's run waited 16
    and 24 s on those installs in the middle of its tests).  The same install those tests make
    (_pin_torch: toolchain.ensure_torch), in a process of its own: the store's lock makes the first one
    that asks do it and the other wait for it; an install that fails here fails again, with its message,
    where a test needs it.  Not a thread of this process: every in-process CLI run (the `tree` fixture's
    apply, the `cli` tests) ends by killing the child trees this process started (childproc.end_all), so a
    thread's pip was killed at the first one (ci92: both torches were installed later, by the tests)."""
    proc = subprocess.Popen([sys.executable, "-c", _AHEAD_CODE, str(LOCK), str(shared_cache), *AHEAD],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield
    proc.wait()


@pytest.fixture(scope="module")
def linkable(shared_cache: Path) -> Iterator[Path]:
    """A directory on the shared cache's filesystem, for the cold caches that hold hard links of its
    files (the run's tmp_path may be on tmpfs: tests/conftest.py); removed with the module."""
    with beside_cache(shared_cache, "links") as path:
        yield path


@pytest.fixture(scope="module")
def cold_downloads(linkable: Path) -> Path:
    """The entries the module's cold builds downloaded (hard links), for the next cold cache."""
    path = linkable / "cold-downloads"
    path.mkdir()
    return path


def _download_entries(cache: Path) -> set[str]:
    return {str(p.relative_to(cache)) for pattern in COLD_DOWNLOADS for p in cache.glob(pattern)}


def _link_entries(src: Path, dest: Path, entries: set[str]) -> None:
    for rel in sorted(entries):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-al", str(src / rel), str(dest / rel)], check=True)


# Every pin whose series changes kernels builds against its own torch: 0.27.1 (torch 2.13.0),
# 0.26.0 (2.11.0), 0.33.0 (2.14.0, C++20 headers; its top-k kernels live in csrc/).
KERNEL_PINS = {"0.27.1": "2.13.0", "0.26.0": "2.11.0", "0.33.0": "2.14.0"}
# The arch each pin's two builds compile for: one arch keeps a compile within minutes.  0.27.1's is
# test_kernels' narrowed PTX build's (same tree, toolchain and flags: the same object keys, which
# test_kernels asserts), so a run compiles those objects once for both tests, both top-k units.
# 0.26.0's and 0.33.0's is TOPK_ARCH, for which CMake builds only the persistent top-k unit (the
# cooperative one is SM90+): their comparison is about their own torch, C++ standard and source
# layout, which that unit and the bindings carry, and it costs each pin two compiles of one unit
# instead of two (issue 39: the cooperative unit was ~25 of each compile's ~70 CPU seconds).
TOPK_ARCH = "8.0"
BYTES_ARCH = {"0.27.1": PTX_ARCH, "0.26.0": TOPK_ARCH, "0.33.0": TOPK_ARCH}
BYTES_OPS = {PTX_ARCH: ["persistent_topk", "cooperative_topk"], TOPK_ARCH: ["persistent_topk"]}
# What the module compiles (issue 39's census, counted from nvcc's processes): per pin, the
# independent build in the shared cache (0.27.1's objects are test_kernels' PTX build's and the
# card's bindings object; 0.26.0's and 0.33.0's are compiled here unless an earlier run left them)
# and the cold build, which compiles the same keys again on purpose (that is the comparison);
# test_allow_torch_builds_and_status_reports_it builds 0.27.1 at TOPK_ARCH against 0.26.0's torch
# 2.11.0: 0.26.0's independent build's device object (the same key, which it asserts), only its
# bindings unit compiled.  The warm rebuild and the text build of each pin compile nothing.


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("pin", list(KERNEL_PINS))
def test_library_bytes_do_not_depend_on_cache_path_or_toolkit_location(pin: str, tree: Path, shared_cache: Path,
                                                                       pin_trees: dict[str, Path],
                                                                       cold_downloads: Path, linkable: Path,
                                                                       tmp_path_factory: pytest.TempPathFactory,
                                                                       tmp_path: Path) -> None:
    """Two builds of the pin's kernels in two caches at different paths, each with the pin's torch at
    its own path: one in the shared cache (system nvcc; its objects are whatever that cache holds
    for these keys, compiled there by another test or an earlier run, else now), one in a cold
    cache (torch as hard links of the shared cache's, see _seed_torch; the downloads an earlier
    cold cache of this module made, see COLD_DOWNLOADS, as hard links; nothing else) without a
    system nvcc (hidden), so the lock's NVIDIA nvcc wheels are installed (or linked) and used from
    there and every object is compiled there: the same library and kernel wheel bytes, and
    neither library holds its cache's path. build_info names the pin's torch; a warm rebuild
    compiles nothing; text output names the torch and nvcc."""
    torch, arch = KERNEL_PINS[pin], BYTES_ARCH[pin]
    if pin == "0.27.1":
        pin_trees[pin] = tree
    elif pin not in pin_trees:
        pin_trees[pin] = _apply(tmp_path_factory, shared_cache, pin)
    tree = pin_trees[pin]
    cold = linkable / f"second-cache-{pin}"  # hard links of the shared cache's torch: its filesystem
    _seed_torch(shared_cache, cold, pin)
    linked = _download_entries(cold_downloads)
    _link_entries(cold_downloads, cold, linked)
    a, _ = _build(tree, shared_cache, tmp_path / "out-a", pin=pin, arch=arch)
    assert a["toolchain"]["torch_origin"].startswith(f"provisioned {shared_cache}")
    assert a["toolchain"]["cxx_standard"].startswith("C++20"), a["toolchain"]
    prefix, env = _hidden_toolkit(tmp_path) if CAN_HIDE else ([], {})
    b, _ = _build(tree, cold, tmp_path / "out-b", prefix=prefix, env=env, pin=pin, arch=arch)
    assert b["toolchain"]["torch_origin"].startswith(f"provisioned {cold}")
    if CAN_HIDE:
        assert b["toolchain"]["nvcc_origin"].startswith("NVIDIA wheels"), b["toolchain"]
        assert b["toolchain"]["nvcc"].startswith(str(cold / "toolchains"))
        assert b["toolchain"]["cuda"] == a["toolchain"]["cuda"] == "13.0"
    assert b["units"] and not any(u["cached"] for u in b["units"])  # cold: every object compiled here
    # nvcc hidden, the nvcc wheels and cuBLAS headers b used are its own cache's: linked from an
    # earlier cold cache, else downloaded by this build; either way kept for the next pin's.
    made = _download_entries(cold) - linked
    if CAN_HIDE:
        nvcc_entry = "/".join(Path(b["toolchain"]["nvcc"]).relative_to(cold).parts[:2])
        assert nvcc_entry in linked | made, (b["toolchain"]["nvcc"], linked, made)
        assert any(e.startswith("kernels/cublas-headers/") for e in linked | made), (linked, made)
    _link_entries(cold, cold_downloads, made)
    assert a["library"] != b["library"]
    assert _sha(Path(a["library"])) == _sha(Path(b["library"]))
    assert Path(a["wheel"]).name == Path(b["wheel"]).name
    assert _sha(Path(a["wheel"])) == _sha(Path(b["wheel"]))
    dist = "dsv4patch_kernels_" + pin.replace(".", "_")
    with zipfile.ZipFile(a["wheel"]) as zf:
        info = json.loads(zf.read(f"{dist}/build_info.json"))
    assert info["torch_version"] == torch and info["torch_required"] == torch
    assert info["torch_mismatch"] is False and info["library_sha256"] == _sha(Path(a["library"]))
    assert info["ops"] == BYTES_OPS[arch]
    assert installed.torch_problem(info, torch) is None
    assert str(linkable).encode() not in Path(b["library"]).read_bytes()  # the cold cache's path
    assert str(tmp_path).encode() not in Path(b["library"]).read_bytes()  # the output's
    assert str(shared_cache).encode() not in Path(a["library"]).read_bytes()
    again, _ = _build(tree, cold, tmp_path / "out-b2", prefix=prefix, env=env, pin=pin, arch=arch)
    assert again["compiled"] == [] and _sha(Path(again["wheel"])) == _sha(Path(b["wheel"]))
    text = _run("build", "--lock", LOCK, "--pin", pin, "--tree", tree, "--arch", arch,
                "--out", tmp_path / "out-b3", env={"DSV4PATCH_CACHE": str(cold), **env}, prefix=prefix)
    assert text.returncode == 0, text.stderr[-3000:]
    assert f"toolchain: torch {torch}" in text.stdout and "nvcc 13.0" in text.stdout
    assert list((cold / "tmp").iterdir()) == []
    shutil.rmtree(cold)  # passed: its GB go now (a failed test's stays until the module ends)


@pytest.mark.slow
@needs_nvcc
def test_allow_torch_builds_and_status_reports_it(tree: Path, shared_cache: Path, pin_trees: dict[str, Path],
                                                  tmp_path_factory: pytest.TempPathFactory,
                                                  tmp_path: Path) -> None:
    """0.27.1's kernels built on purpose against torch 2.11.0, not its 2.13.0: the toolchain torch
    0.26.0's byte-identity build provisioned.  0.27.1's and 0.26.0's top-k units, headers and flags
    are the same files (C++20 from both trees' CMake), so at TOPK_ARCH against that torch their object
    keys are that build's (asserted below): the device unit is compiled once per run, not again
    here (issue 39); only the bindings unit (each tree's ops.h) is 0.27.1's own."""
    other = _pin_torch(shared_cache, "0.26.0", "2.11.0").python
    rep, _ = _build(tree, shared_cache, tmp_path / "out", "--python", other, "--allow-torch", "2.11.0",
                    arch=BYTES_ARCH["0.26.0"])
    assert rep["toolchain"]["torch_mismatch"] is True
    assert rep["toolchain"]["torch_origin"] == f"--python {other}", rep["toolchain"]
    if "0.26.0" not in pin_trees:
        pin_trees["0.26.0"] = _apply(tmp_path_factory, shared_cache, "0.26.0")
    plan_0260, _ = _build(pin_trees["0.26.0"], shared_cache, tmp_path / "out-0260", "--dry-run", pin="0.26.0",
                          arch=BYTES_ARCH["0.26.0"])
    keys = {u["unit"]: u["key"] for u in plan_0260["units"] if u["unit"] != "<generated bindings>"}
    assert keys and keys == {u["unit"]: u["key"] for u in rep["units"] if u["unit"] in keys}
    with zipfile.ZipFile(rep["wheel"]) as zf:
        info = json.loads(zf.read("dsv4patch_kernels_0_27_1/build_info.json"))
    assert info["torch_version"].startswith("2.11.0") and info["torch_mismatch"] is True
    problem = installed.torch_problem(info, "2.11.0")
    assert problem is not None and "torch 2.11.0" in problem and "2.13.0" in problem
    # The patched wheel with that kernel library, installed: status --installed says so, exit 1.
    res = _run("wheel", "--lock", LOCK, "--pin", "0.27.1", "--kernels", rep["wheel"],
               "--out", tmp_path / "wheel", "--format", "json", env={"DSV4PATCH_CACHE": str(shared_cache)})
    assert res.returncode == 0, res.stderr[-3000:]
    # --no-compile: status reads the installed files, not their bytecode (a plain pip install,
    # which compiles, is test_vllm_wheel's); byte-compiling vLLM's 2,000-odd modules cost ~7 s.
    # The venv gets no pip of its own (ensurepip: ~3.5 CPU s): this interpreter's pip installs into it.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", "--no-compile", json.loads(res.stdout)["wheel"]], check=True)
    st = _run("status", "--installed", "--lock", LOCK, "--python", venv / "bin" / "python",
              env={"DSV4PATCH_CACHE": str(shared_cache)})
    assert st.returncode == 1, st.stdout + st.stderr
    assert "built for torch 2.11.0, not torch 2.13.0" in st.stdout and "DOES NOT MATCH" in st.stdout


# --- issue 36: the programs the toolchain asks are bounded -----------------------------------------

from dsv4patch import childproc  # noqa: E402
from dsv4patch.errors import ChildError  # noqa: E402
from dsv4patch.kernels import build as kbuild  # noqa: E402

NVCC_ANSWER = "nvcc: NVIDIA (R) Cuda compiler driver\\nCuda compilation tools, release 13.0, V13.0.88\\n"


def _script(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return p


def _site_with_torch(tmp_path: Path, version: str = "2.13.0", version_py: str | None = None) -> Path:
    site = tmp_path / "site"
    (site / "torch" / "include").mkdir(parents=True)
    (site / "torch" / "lib").mkdir()
    text = version_py if version_py is not None else f"__version__ = '{version}'\ncuda = '13.0'\n"
    (site / "torch" / "version.py").write_text(text)
    return site


def _fake_python(tmp_path: Path, answer: str) -> Path:
    """An 'interpreter' that answers the torch probe with ``answer`` (printed by printf, bytes as given)."""
    return _script(tmp_path, "python", f"printf '%s\\n' '{answer}'")


def test_an_nvcc_that_hangs_floods_or_is_not_utf8_is_bounded(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(kbuild, "NVCC_PROBE_DEADLINE", 1.0)
    hang = _script(tmp_path, "nvcc-hang", "sleep 300 & sleep 300")
    with pytest.raises(ChildError, match="did not finish within 1 s") as err:
        kbuild.nvcc_version(hang)
    assert err.value.exit_code == 8
    flood = _script(tmp_path, "nvcc-flood", "exec yes 'Cuda compilation tools, release 13.0'")
    with pytest.raises(ChildError, match="printed more than"):
        kbuild.nvcc_version(flood)
    latin = _script(tmp_path, "nvcc-latin1", f"printf '{NVCC_ANSWER}\\377\\376 built by caf\\351\\n'")
    text, ver = kbuild.nvcc_version(latin)
    assert ver == "13.0" and "\ufffd" in text


def test_a_hanging_nvcc_on_path_is_skipped_with_a_note(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(kbuild, "NVCC_PROBE_DEADLINE", 1.0)
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    _script(cuda / "bin", "nvcc", "sleep 300")
    monkeypatch.setenv("CUDA_HOME", str(cuda))
    monkeypatch.setenv("PATH", f"{cuda / 'bin'}:/usr/bin:/bin")
    monkeypatch.setattr(toolchain, "system_nvccs", lambda: [(cuda / "bin" / "nvcc", "CUDA_HOME")])
    notes: list[str] = []
    with pytest.raises(BuildError, match="no nvcc of CUDA 13.x found"):
        toolchain.choose_nvcc(Store.open(tmp_path / "c"), None, "13.0", None, Progress(False), notes)
    assert "did not finish within 1 s" in notes[0]


def test_build_with_a_hanging_nvcc_exits_8_and_leaves_nothing_running(tree: Path, tmp_path: Path, cli,
                                                                       monkeypatch) -> None:
    """The issue's example: `build --nvcc` whose `--version` never answers: exit 8, not a hang."""
    monkeypatch.setattr(kbuild, "NVCC_PROBE_DEADLINE", 2.0)
    site = _site_with_torch(tmp_path)
    py = _fake_python(tmp_path, f"DSV4PATCH-TORCH {json.dumps(str(site / 'torch'))}")
    nvcc = _script(tmp_path, "nvcc", "exec sleep 300")
    res = cli("build", "--lock", LOCK, "--pin", "0.27.1", "--tree", tree, "--arch", ARCH, "--python", py,
              "--nvcc", nvcc, "--out", tmp_path / "d", "--cache-dir", tmp_path / "cache")
    assert res.rc == 8, res.err
    assert f"{nvcc} --version" in res.err and "did not finish within 2 s" in res.err
    gone = subprocess.run(["pgrep", "-f", "^sleep 300$", "-P", str(os.getpid())], capture_output=True, text=True)
    assert gone.stdout == ""


@pytest.mark.parametrize("answer", ["DSV4PATCH-TORCH {not json", "DSV4PATCH-TORCH " + "[" * 100_000,
                                    'DSV4PATCH-TORCH {"a": 1}', "DSV4PATCH-TORCH NaN"])
def test_a_python_that_answers_bad_json_is_a_usage_error(tree: Path, tmp_path: Path, cli, answer: str) -> None:
    py = _fake_python(tmp_path, answer)
    res = cli("build", "--lock", LOCK, "--pin", "0.27.1", "--tree", tree, "--arch", ARCH, "--python", py,
              "--out", tmp_path / "d", "--cache-dir", tmp_path / "cache")
    assert res.rc == 2, res.err
    assert f"--python {py}" in res.err and "internal error" not in res.err


@pytest.mark.parametrize("kind", ["missing", "not-executable", "directory"])
def test_a_python_that_cannot_run_is_a_usage_error(tree: Path, tmp_path: Path, cli, kind: str) -> None:
    py = tmp_path / "py"
    if kind == "not-executable":
        py.write_text("#!/bin/sh\n")
    elif kind == "directory":
        py.mkdir()
    res = cli("build", "--lock", LOCK, "--pin", "0.27.1", "--tree", tree, "--arch", ARCH, "--python", py,
              "--out", tmp_path / "d", "--cache-dir", tmp_path / "cache")
    assert res.rc == 2 and f"--python {py}: cannot run it" in res.err, res.err


def test_a_python_that_prints_without_end_is_stopped(tmp_path: Path) -> None:
    py = _script(tmp_path, "python", "exec yes DSV4PATCH-TORCH")
    with pytest.raises(ChildError, match="printed more than"):
        toolchain.torch_from_python(str(py))


def test_a_fifo_where_the_probe_reads_version_py_does_not_hang(tmp_path: Path) -> None:
    site = _site_with_torch(tmp_path)
    (site / "torch" / "version.py").unlink()
    os.mkfifo(site / "torch" / "version.py")
    py = _fake_python(tmp_path, f"DSV4PATCH-TORCH {json.dumps(str(site / 'torch'))}")
    with pytest.raises(BuildError, match="FIFO"):
        toolchain.torch_from_python(str(py))


def test_a_link_planted_at_the_toolchain_entry_is_never_used(tmp_path: Path, monkeypatch) -> None:
    """``<cache>/toolchains/torch-<key>`` a link to a 'torch 2.13.0+evil' env: removed, never used.

    pip is pointed at no index, so the honest reinstall fails at once (and that is what this
    shows: dsv4patch went on to install, it did not take the planted env)."""
    assert PIN.toolchain is not None
    store = Store.open(tmp_path / "cache")
    torch_req = toolchain.read_requirements(PIN.toolchain.requirements)["torch"]
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    import platform

    _key, root = toolchain._env_dir(store, "torch", [py, platform.machine(), torch_req.line()])
    evil = tmp_path / "evil"
    site = evil / "lib" / f"python{py}" / "site-packages"
    site.mkdir(parents=True)
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text("__version__ = '2.13.0+evil'\n")
    (evil / ".ready").write_text("{}\n")
    root.parent.mkdir(parents=True)
    root.symlink_to(evil)
    assert not toolchain.ready(root)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nothing"))
    with pytest.raises(BuildError, match="pip exit"):
        toolchain.ensure_torch(store, PIN.toolchain, Progress(False))
    assert not root.is_symlink() and (evil / ".ready").is_file()  # the link removed, its target untouched
    assert childproc.KEEP > 0


def test_a_toolchain_venv_is_filled_by_this_pythons_pip_else_by_its_own(tmp_path: Path, monkeypatch) -> None:
    """_provision's venv is made without pip where this interpreter's pip can install into it (``--python``,
    pip 22.3+: test_provisioned_torch_is_cached_and_hash_checked installs and refuses through it);
    otherwise the venv gets its own pip, as ``python -m venv`` makes it, and that pip installs."""
    from importlib import metadata

    env = tmp_path / "env"
    own = ([], [str(env / "bin" / "python"), "-m", "pip"])
    assert toolchain._pip_for(env) == (["--without-pip"],
                                       [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python")])
    for version in ("22.2.2", "9.0.1", "dev"):
        monkeypatch.setattr(metadata, "version", lambda name, v=version: v)
        assert toolchain._pip_for(env) == own, version
    monkeypatch.setattr(metadata, "version", lambda name: "22.3")
    assert toolchain._pip_for(env)[0] == ["--without-pip"]

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert toolchain._pip_for(env) == own


def test_cxx_standard_is_chosen_from_the_toolchain_and_the_tree(tmp_path: Path) -> None:
    """The C++ standard comes from what each torch's headers need (the lock's toolchain, else
    dsv4patch's table) and the tree's CMAKE_CUDA_STANDARD, the higher of the two: never per pin."""
    from dataclasses import replace

    from dsv4patch.kernels import build as kbuild
    from dsv4patch.kernels import sources

    lock = load(LOCK)
    t214 = lock.pin("0.33.0").toolchain
    assert t214 is not None and (t214.torch, t214.cxx_standard) == ("2.14.0", 20)
    assert toolchain.torch_cxx_standard("2.14.0+cu130", t214)[0] == 20
    assert toolchain.torch_cxx_standard("2.14.1", None)[0] == 20  # torch 2.14+ without a lock entry
    assert toolchain.torch_cxx_standard("2.11.0+cu130", lock.pin("0.26.0").toolchain)[0] == 17
    assert toolchain.torch_cxx_standard("2.13.0", lock.pin("0.27.1").toolchain)[0] == 17
    with pytest.raises(LockFileError, match="need C\\+\\+20"):
        toolchain.torch_cxx_standard("2.14.0", replace(t214, cxx_standard=17))
    tc = kbuild.Toolchain(nvcc=Path("nvcc"), nvcc_version="", cuda_version="13.0", python="python",
                          torch_version="2.14.0", torch_cuda_version="13.0", torch_include=Path("i"),
                          torch_lib=Path("l"), include_dirs=(), cxx_standard=20,
                          cxx_standard_origin="torch 2.14.0's headers")
    assert kbuild.cxx_standard(tc, 17)[0] == 20  # the torch raises an older tree's standard
    assert kbuild.cxx_standard(replace(tc, cxx_standard=17), 20)[0] == 20  # never lowers it
    assert kbuild.cxx_standard(replace(tc, cxx_standard=None), None)[0] == kbuild.DEFAULT_CXX_STANDARD
    assert "-std=c++20" not in kbuild.BASE_FLAGS  # the standard is chosen per build, not fixed
    cmake = sources.parse_cmake("set(CMAKE_CXX_STANDARD 17)\nset(CMAKE_CUDA_STANDARD 17)\n")
    assert cmake.cuda_standard == 17
    # The lock's defines reach nvcc as -D macros only: nothing that names a program or a path.
    bad = tmp_path / "vllm.toml"
    text = LOCK.read_text(encoding="utf-8").replace(
        'cxx_standard = 20\n', 'cxx_standard = 20\ndefines = ["-Xcompiler=-fplugin=/tmp/x.so"]\n')
    bad.write_text(text, encoding="utf-8")
    with pytest.raises(LockFileError, match="each entry is a macro NAME"):
        load(bad)
