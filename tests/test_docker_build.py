"""Build the Dockerfile for real, offline, with a private dockerd: patch -> wheel -> final.

What it takes (``.ci/docker-setup.sh`` installs it): root, Debian's ``docker.io``
(dockerd + a docker client with built-in BuildKit) and ``mmdebstrap``; nvcc
for the kernel wheel.  Where dockerd cannot start (no root, no cgroups/overlay,
no package) the test skips and says why.

The test
  * starts its own ``dockerd`` (no bridge, no iptables, data root in a temp dir: on tmpfs
    where memory allows, see _tmpfs) and stops it by PID afterwards;
  * makes the base image: a minimal Debian trixie rootfs with python3, venv and
    git (mmdebstrap from the Debian mirror, cached as a tarball in the shared
    test cache, ``docker import``-ed as the PYTHON_IMAGE), and from it the
    stand-in for the vLLM image (a venv on PATH, like vLLM's own image, with
    the Python packages vLLM's import needs besides torch (``pip download``,
    cached in the shared test cache), and the driver's
    ``libcuda.so.1`` from Debian's non-free ``libcuda1`` at the CUDA images'
    compat path; docs/docker.md says what it leaves out);
  * prepares an offline build context: the repository's files, the pin's vLLM
    sdist in ``sdists/`` and its stock x86_64 wheel in ``vllm-wheels/`` (from
    the dsv4patch cache), dsv4patch's dependency wheels in ``wheels/`` (``pip
    download``, cached in the shared test cache per what pyproject.toml declares:
    its dependencies and build system), and the kernel wheel ``dsv4patch build``
    makes (nvcc, with the lock's toolchain as the card's ``apply``: its cached
    objects) in ``kernels/`` (``KERNELS_STAGE=kernels-context``: the CUDA
    ``kernels`` stage needs the CUDA image);
  * runs ``docker build --network none --target final`` with the label build
    args from ``dsv4patch lock --build-args``: the final stage pip-installs the
    patched wheel (``--no-deps``) and its self-check ``dsv4patch status
    --installed`` runs for real; then checks the images: labels equal the lock,
    the patch stage's tree is the lock's patched_tree, the final image's vLLM
    carries every patch, and with one patched file replaced by the stock one
    ``status --installed`` exits 1 naming the patch and the file;
  * checks that a wrong label build arg fails the build;
  * runs ``python -m dsv4patch_kernels_<pin> check --no-device`` in the built
    final image, with the pin's torch 2.13.0 (CUDA 13.0) and the CUDA
    libraries it loads installed by pip for the image's python into the shared
    test cache (~3.7 GB, kept there like the base rootfs; on a cold cache made in
    a thread while the images build; its torch wheel checked against the lock's
    hashes every run) and mounted read-only: the
    dispatcher runs the dsv4patch kernels, and the stock ones with
    ``DSV4PATCH_KERNELS=0``;
  * runs ``dsv4patch selftest --help`` and ``--list`` in it (the node check
    docs/docker.md documents; no GPU here) and checks that ``status
    --installed`` points to it.

Only the CUDA ``kernels`` stage and the real vLLM base image are not used here
(registries and GPUs' worth of downloads); they are linted
(tests/test_ci_files.py) and built by the ``image`` workflow.

Timing on 2 cores, warm caches (the base rootfs, the wheels and the torch runtime in the test
cache; the dockerd data root on tmpfs): ~2-2.5 min and ~62 CPU s besides the containers' own
(2026-12-06: 146 s at load 6-8; 100 CPU s when the torch runtime was made per run).  Cold: +
~20 s mmdebstrap, + the sdist and wheel downloads; the torch runtime (75-110 s on the disk) is
made beside the image builds.  Without nvcc only the ``patch`` stage is built (the final-image
test skips and says so).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import TMPFS, tmpfs_has_room
from dsv4patch.delivery import buildargs
from dsv4patch.kernels import stock, toolchain
from dsv4patch.kernels.identity import dist_name
from dsv4patch.pins.lock import load, tomllib
from dsv4patch.series.patches import series_for_pin
from dsv4patch.store import Store

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "locks" / "vllm.toml"
PIN = "0.27.1"
BASE_IMAGE = "dsv4patch-test/python:trixie"
VLLM_BASE_IMAGE = "dsv4patch-test/vllm-base:trixie"  # stands in for vllm/vllm-openai
SUITE = "trixie"  # python >= 3.11.4 (tarfile extraction filters); bookworm's 3.11.2 is too old
MIRROR = os.environ.get("DSV4PATCH_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# pip's platform tags for the image's python (trixie: glibc 2.41); pip does not widen --platform itself.
PLATFORMS = [f"manylinux_2_{v}_x86_64" for v in (28, 27, 26, 25, 24, 18, 17, 12)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64"]
# What vLLM's `import vllm` and plugin loader import besides torch (measured: `check --no-device`
# in a bare environment, adding each missing module): installed in the stand-in for vLLM's image.
VLLM_IMPORT_SET = ("numpy", "packaging", "regex", "msgspec", "huggingface_hub", "tqdm", "pyyaml")
# torch's dependencies that `import torch` and the dispatcher check never load: torch.compile
# (triton), torch.linalg's solver (cusolver, loaded on first use), NVTX ranges, CUDA's Python
# bindings, the cuda-toolkit meta package, setuptools (cpp_extension).  Left out of the runtime.
TORCH_LEFT_OUT = frozenset({"triton", "nvidia-cusolver", "nvidia-nvtx", "cuda-bindings",
                            "cuda-pathfinder", "cuda-toolkit", "setuptools"})
TORCH_MOUNT = "/opt/dsv4patch-test/torch"  # where the check's torch runtime is mounted, read-only
# Free space the cache's filesystem needs to make the runtime (_TorchJob): ~3.7 GB installed,
# pip's copy of its largest wheel (0.55 GB) and that wheel unpacked.
MIN_FREE_FOR_TORCH = 8 << 30
# On tmpfs (_tmpfs): the private dockerd's data root (images and build cache); memory left to
# the rest of the suite.
DOCKER_ROOT_TMPFS_NEED = 6 << 30
TMPFS_SPARE = 6 << 30
ROOTFS_TMPFS_NEED = 1 << 30  # mmdebstrap's work directory (~0.5 GB: the rootfs and its .deb files)
CONTEXT_FILES = ("pyproject.toml", "README.md", "LICENSE", "Dockerfile", ".dockerignore")
CONTEXT_DIRS = ("dsv4patch", "locks", "patches")

pytestmark = [pytest.mark.slow, pytest.mark.network]


def _docker_client() -> str | None:
    """A docker CLI whose ``docker build`` does BuildKit without the buildx plugin.

    Debian's docker.io client (20.10) has BuildKit built in; newer clients need
    buildx for DOCKER_BUILDKIT=1.
    """
    cands = [c for c in (shutil.which("docker"), "/usr/bin/docker") if c and os.path.exists(c)]
    for c in cands:
        if subprocess.run([c, "buildx", "version"], capture_output=True).returncode == 0:
            return c
    for c in cands:
        res = subprocess.run([c, "--version"], capture_output=True, text=True)
        if res.returncode == 0 and " 20.10" in res.stdout:
            return c
    return None


class Docker:
    def __init__(self, client: str, sock: Path) -> None:
        self.client = client
        self.env = {**os.environ, "DOCKER_HOST": f"unix://{sock}", "DOCKER_BUILDKIT": "1"}

    def __call__(self, *args: str, check: bool = True, input: bytes | None = None,
                 stdin=None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        res = subprocess.run([self.client, *args], env=self.env, input=input, stdin=stdin,
                             capture_output=True, timeout=timeout)
        out = subprocess.CompletedProcess(res.args, res.returncode,
                                          res.stdout.decode(errors="replace"),
                                          res.stderr.decode(errors="replace"))
        if check and out.returncode != 0:
            raise AssertionError(f"docker {' '.join(args[:3])} ... failed ({out.returncode}):\n"
                                 f"{out.stdout[-6000:]}\n{out.stderr[-6000:]}")
        return out


@pytest.fixture(scope="module")
def docker() -> Iterator[Docker]:
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        pytest.skip("dockerd not installed (run .ci/docker-setup.sh: apt-get install docker.io)")
    if os.geteuid() != 0:
        pytest.skip("dockerd needs root")
    client = _docker_client()
    if client is None:
        pytest.skip("no docker client with built-in BuildKit or buildx (install docker.io)")
    # Short path: the socket path must fit in sun_path (108 bytes).
    _sweep_tmpfs()
    work = Path(tempfile.mkdtemp(prefix="dsv4d-", dir="/tmp"))
    shm = _tmpfs(DOCKER_ROOT_TMPFS_NEED)
    data_root = Path(tempfile.mkdtemp(prefix=f"{_SHM_PREFIX}{os.getpid()}-dockerd-", dir=shm)) if shm else work / "root"
    sock = work / "docker.sock"
    log = open(work / "dockerd.log", "wb")
    proc = subprocess.Popen(
        [dockerd, "--bridge=none", "--iptables=false", "--ip-forward=false", "--ip-masq=false",
         "--data-root", str(data_root), "--exec-root", str(work / "exec"),
         "-H", f"unix://{sock}", "--pidfile", str(work / "dockerd.pid")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    d = Docker(client, sock)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                tail = (work / "dockerd.log").read_text(errors="replace")[-2000:]
                pytest.skip(f"dockerd exited ({proc.returncode}); cannot run docker here:\n{tail}")
            if sock.exists() and d("version", check=False, timeout=20).returncode == 0:
                break
            if time.monotonic() > deadline:
                pytest.skip("dockerd did not come up within 60s")
            time.sleep(0.5)
        yield d
    finally:
        t0 = time.monotonic()
        used = subprocess.run(["du", "-sxm", str(data_root)], capture_output=True, text=True).stdout.split()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        t1 = time.monotonic()
        log.close()
        shutil.rmtree(data_root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
        if shm is not None:
            _TMPFS_GRANTED[0] -= DOCKER_ROOT_TMPFS_NEED
        print(f"\ndockerd data root: {used[0] if used else '?'} MB on {'tmpfs' if shm else 'disk'}; stopped in "
              f"{t1 - t0:.0f}s, removed in {time.monotonic() - t1:.0f}s")


def _base_rootfs_tar(cache: Path) -> Path:
    """A tarball of a minimal Debian rootfs with python3, venv and git (cached).

    ``mmdebstrap`` writes it directly (apt resolves and downloads, dpkg unpacks once, no shell
    script per package): 17-23 s and 18-24 CPU s on the 2-core machine, where debootstrap plus tar
    took 37 s and 33 CPU s (issue 39; this runs cold in every CI run).  Docs, manuals and locales
    are not unpacked (dpkg path-exclude), apt's lists and downloads not kept (its default)."""
    tar = cache / "docker" / f"debian-{SUITE}-python-git.tar"
    if tar.exists():
        return tar
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        pytest.skip("mmdebstrap not installed (run .ci/docker-setup.sh)")
    tar.parent.mkdir(parents=True, exist_ok=True)
    # Its work directory on tmpfs where it fits: dpkg fsyncs every file it unpacks, which waits on a busy disk.
    shm = _tmpfs(ROOTFS_TMPFS_NEED)
    work = Path(tempfile.mkdtemp(prefix=f"{_SHM_PREFIX}{os.getpid()}-rootfs-" if shm else "dsv4-rootfs-",
                                 dir=shm or "/tmp"))
    tmp = tar.with_suffix(".tmp.tar")
    try:
        excludes = [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "locale", "info")]
        res = subprocess.run(
            [mmdebstrap, "--quiet", "--mode=root", "--variant=minbase",
             "--include=python3,python3-venv,git,ca-certificates", *excludes, SUITE, str(tmp), MIRROR],
            capture_output=True, text=True, timeout=1200, env={**os.environ, "TMPDIR": str(work)},
        )
        if res.returncode != 0:
            pytest.skip(f"mmdebstrap {SUITE} failed (Debian mirror unreachable?): "
                        f"{res.stdout[-1500:]}{res.stderr[-1500:]}")
        tmp.replace(tar)
    finally:
        tmp.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
        if shm is not None:
            _TMPFS_GRANTED[0] -= ROOTFS_TMPFS_NEED
    return tar


def _libcuda(cache: Path) -> Path:
    """``libcuda.so.1`` of Debian's ``libcuda1`` (non-free; cached): the NVIDIA driver's user-space
    CUDA library, which the CUDA images (so vLLM's) carry as ``/usr/local/cuda/compat/libcuda.so.1``.

    It loads without a GPU or kernel driver, which is all ``check --no-device`` asks of it (the
    stock vLLM library links it).  apt fetches it with a scratch configuration (nothing of this
    machine's apt setup is changed) and checks it against the signed archive index with Debian's
    keyring; ``dpkg-deb -x`` unpacks it (no maintainer scripts run).
    """
    dest = cache / "docker" / f"libcuda1-{SUITE}" / "libcuda.so.1"
    if dest.is_file():
        return dest
    apt, dpkg = shutil.which("apt-get"), shutil.which("dpkg-deb")
    keyring = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
    if apt is None or dpkg is None or not keyring.is_file():
        pytest.skip("apt-get, dpkg-deb and Debian's archive keyring are needed to fetch libcuda1")
    work = Path(tempfile.mkdtemp(prefix="dsv4-apt-", dir="/tmp"))
    try:
        (work / "lists" / "partial").mkdir(parents=True)
        (work / "cache" / "archives" / "partial").mkdir(parents=True)
        sources = work / "sources.list"
        sources.write_text(f"deb [signed-by={keyring}] {MIRROR} {SUITE} non-free\n")
        opts = [f"-oDir::Etc::SourceList={sources}", "-oDir::Etc::SourceParts=/nonexistent",
                f"-oDir::State::Lists={work / 'lists'}", f"-oDir::Cache={work / 'cache'}",
                "-oDebug::NoLocking=1", "-oAPT::Architecture=amd64", "-oAcquire::Languages=none",
                "-oAPT::Sandbox::User=root"]
        for step in (["update"], ["download", "libcuda1"]):
            res = subprocess.run([apt, "-q", *opts, *step], cwd=work, capture_output=True, text=True,
                                 timeout=600)
            if res.returncode != 0:
                pytest.skip(f"apt-get {step[0]} of Debian {SUITE} non-free failed (mirror unreachable?): "
                            f"{res.stdout[-1000:]}{res.stderr[-1000:]}")
        deb = next(work.glob("libcuda1_*_amd64.deb"))
        subprocess.run([dpkg, "-x", str(deb), str(work / "x")], check=True, capture_output=True)
        lib = next(f for f in (work / "x").rglob("libcuda.so.*.*") if f.is_file() and not f.is_symlink())
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".tmp")
        shutil.copyfile(lib, tmp)
        tmp.replace(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def _cache_key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


_CACHE_TMP = ".tmp-"  # + the pytest process's pid: what a killed run left in the test cache is swept


def _sweep_cache_tmp(cache: Path) -> None:
    """Remove what a killed run of this module left under ``cache/docker`` (_cached_dir's work
    directories whose pytest process is gone)."""
    for d in (cache / "docker").glob(f"{_CACHE_TMP}*-*"):
        pid = d.name[len(_CACHE_TMP):].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)


def _cached_dir(cache: Path, name: str, make) -> Path:
    """``cache/docker/<name>``, made on first use by ``make(work)`` in a work directory beside it
    that is then renamed into place (a concurrent run's entry wins; never half-made)."""
    entry = cache / "docker" / name
    if entry.is_dir():
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{_CACHE_TMP}{os.getpid()}-{name[:40]}-", dir=entry.parent))
    try:
        work.chmod(0o755)  # as the cache's other directories (mkdtemp's is 0700)
        make(work)
        try:
            work.rename(entry)
        except OSError:  # made meanwhile by a concurrent run
            if not entry.is_dir():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return entry


def _wheels(cache: Path, name: str, key: list[object], pip_args: list[str], dest: Path) -> None:
    """``pip download`` of ``pip_args`` into ``dest``: cached in the shared test cache per ``key``
    (what the arguments ask for), like the base rootfs; copied from there (its files are small)."""
    def download(work: Path) -> None:
        res = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-cache-dir",
             "--dest", str(work), *pip_args], capture_output=True, text=True,
        )
        if res.returncode != 0:
            pytest.skip(f"pip download of {name} failed (no PyPI?): {res.stderr[-1500:]}")

    shutil.copytree(_cached_dir(cache, f"wheels-{name}-{_cache_key(*key)}", download), dest)


def _pip_platform_args(python_version: str) -> list[str]:
    return ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
            *[a for tag in PLATFORMS for a in ("--platform", tag)]]


def _vllm_base_context(tmp: Path, cache: Path, python_version: str) -> Path:
    """The stand-in for vLLM's image: a venv on PATH (as vLLM's image has), the Python packages
    vLLM's import needs besides torch (VLLM_IMPORT_SET, from PyPI) and the driver's libcuda where
    the CUDA images keep it.  torch and the CUDA libraries are not in it (see _torch_runtime)."""
    ctx = tmp / "vllm-base"
    ctx.mkdir()
    shutil.copyfile(_libcuda(cache), ctx / "libcuda.so.1")
    pip_args = [*_pip_platform_args(python_version), *VLLM_IMPORT_SET]
    _wheels(cache, f"vllm-import-set-cp{python_version.replace('.', '')}", pip_args, pip_args, ctx / "wheels")
    (ctx / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\n"
        "COPY libcuda.so.1 /usr/local/cuda/compat/libcuda.so.1\n"
        "COPY wheels/ /tmp/wheels/\n"
        "RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir --no-index "
        f"--find-links /tmp/wheels {' '.join(VLLM_IMPORT_SET)} && rm -rf /tmp/wheels\n"
        "ENV PATH=/opt/venv/bin:$PATH\n")
    return ctx


def _torch_want() -> toolchain.Requirement:
    """The pin's torch as the lock's toolchain file pins it (version and wheel hashes)."""
    tdef = load(LOCK).pin(PIN).toolchain
    assert tdef is not None
    return toolchain.read_requirements(tdef.requirements)["torch"]


TORCH_MANIFEST = "requirements.txt"  # beside the runtime's site/: what pip installed, with hashes


def _torch_runtime(dest: Path, python_version: str) -> Path:
    """The pin's torch (2.13.0, CUDA 13.0) for the image's python, with the CUDA libraries
    ``import torch`` loads, installed by pip into ``dest`` (``--target``): what vLLM's image has and
    the stand-in lacks.  pip resolves torch's dependencies (a dry run, metadata only); each is
    installed hash-checked with ``--no-deps`` except TORCH_LEFT_OUT; torch's wheel must be one the
    lock's toolchain file pins.  One package at a time, so at most one wheel waits on disk, each
    into a directory of its own that is then moved into ``dest`` file by file (``--target``
    replaces whole top-level directories, and the nvidia-* wheels share ``nvidia/``).  What was
    installed, hash-pinned, goes to TORCH_MANIFEST beside ``dest``."""
    want = _torch_want()
    report = dest.parent / "torch-resolve.json"
    plat = _pip_platform_args(python_version)
    res = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--disable-pip-version-check",
         "--ignore-installed", "--no-cache-dir", "--report", str(report), "--target", str(dest), *plat,
         f"torch=={want.version}"], capture_output=True, text=True, timeout=900,
    )
    if res.returncode != 0:
        pytest.skip(f"pip could not resolve torch=={want.version} for python {python_version} (no PyPI?): "
                    f"{res.stderr[-1500:]}")
    resolved = json.loads(report.read_text())["install"]
    report.unlink()
    reqs = []
    for item in resolved:
        name = item["metadata"]["name"].lower().replace("_", "-")
        sha = item["download_info"]["archive_info"]["hashes"]["sha256"]
        if name == "torch":
            assert sha in want.hashes, f"PyPI's torch {want.version} wheel ({sha}) is not one the lock pins"
        if name not in TORCH_LEFT_OUT:
            reqs.append(f"{name}=={item['metadata']['version']} --hash=sha256:{sha}")
    assert any(r.startswith("torch==") for r in reqs) and any(r.startswith("nvidia-cublas==") for r in reqs)
    req, one = dest.parent / "torch-req.txt", dest.parent / "torch-one"
    # pip's download and unpack directories next to dest (TMPDIR): on tmpfs nothing goes to disk,
    # and pip's move of the unpacked package into --target is a rename, not a copy.
    ptmp = dest.parent / "pip-tmp"
    ptmp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(ptmp)}
    for line in reqs:
        req.write_text(line + "\n")
        res = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--require-hashes", "--no-cache-dir", "--no-compile", "--target", str(one), *plat,
             "-r", str(req)], capture_output=True, text=True, timeout=900, env=env,
        )
        assert res.returncode == 0, f"pip install {line.split()[0]}: {res.stderr[-2000:]}"
        for d, _, files in os.walk(one):
            rel = Path(d).relative_to(one)
            (dest / rel).mkdir(parents=True, exist_ok=True)
            for f in files:
                os.replace(Path(d) / f, dest / rel / f)
        shutil.rmtree(one)
    req.unlink()
    shutil.rmtree(ptmp, ignore_errors=True)
    (dest.parent / TORCH_MANIFEST).write_text("".join(line + "\n" for line in reqs))
    return dest


def _sdist(cache: Path, sha: str) -> Path:
    """The pin's sdist from the dsv4patch cache, fetched (and verified) if absent."""
    blob = cache / "blobs" / "sha256" / sha
    if not blob.exists():
        res = subprocess.run(
            [sys.executable, "-m", "dsv4patch", "fetch", "--lock", str(LOCK), "--pin", PIN,
             "--cache-dir", str(cache)], capture_output=True, text=True,
        )
        assert res.returncode == 0, res.stderr
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == sha
    return blob


def _has_nvcc() -> bool:
    return shutil.which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").exists()


def _kernel_wheel(cache: Path, dest: Path) -> Path:
    """The kernel wheel `dsv4patch build` makes for the pin with the lock's toolchain, as the
    card's ``apply`` builds it: its objects are the ones that command compiled into the shared
    cache (one compile per unit and arch per cache; the CPU test venv's torch was a second key)."""
    tree = dest.parent / "tree"
    base = [sys.executable, "-m", "dsv4patch"]
    res = subprocess.run([*base, "apply", "--lock", str(LOCK), "--pin", PIN, "--tree", str(tree),
                          "--cache-dir", str(cache), "--no-build"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    res = subprocess.run([*base, "build", "--lock", str(LOCK), "--pin", PIN, "--tree", str(tree),
                          "--out", str(dest), "--cache-dir", str(cache)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return next(dest.glob("*.whl"))


def _context(tmp: Path, cache: Path, sdist_sha: str, python_version: str) -> Path:
    ctx = tmp / "ctx"
    ctx.mkdir()
    for f in CONTEXT_FILES:
        if (ROOT / f).exists():
            shutil.copy2(ROOT / f, ctx / f)
    for d in CONTEXT_DIRS:
        shutil.copytree(ROOT / d, ctx / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (ctx / "sdists").mkdir()
    shutil.copyfile(_sdist(cache, sdist_sha), ctx / "sdists" / f"vllm-{PIN}.tar.gz")
    pin = load(LOCK).pin(PIN)
    wheel = stock.wheel_for(pin, "x86_64")
    (ctx / "vllm-wheels").mkdir()
    shutil.copyfile(stock.wheel_path(Store.open(cache), wheel),
                    ctx / "vllm-wheels" / wheel.url.rsplit("/", 1)[1])
    if _has_nvcc():  # else only the patch stage is built (the wheel needs the kernel library)
        _kernel_wheel(cache, ctx / "kernels")
    # dsv4patch's dependencies and its build backend: the cache key is what pyproject.toml declares.
    pyproject = tomllib.loads((ctx / "pyproject.toml").read_text())
    pip_args = ["--python-version", python_version, "--only-binary=:all:", str(ctx), "setuptools>=68", "wheel"]
    key: list[object] = [pyproject["build-system"], pyproject["project"].get("dependencies", []),
                         pyproject["project"].get("requires-python"), pip_args[:3], pip_args[4:]]
    _wheels(cache, f"dsv4patch-deps-cp{python_version.replace('.', '')}", key, pip_args, ctx / "wheels")
    return ctx


def _step_times(log: str) -> list[str]:
    """BuildKit's plain progress as "seconds step" strings, slowest first (the steps that ran, not cached)."""
    names = dict(re.findall(r"^(#\d+) (\[.+)$", log, re.M))
    done = re.findall(r"^(#\d+) DONE (\d+\.\d+)s$", log, re.M)
    steps = sorted(((float(t), names[n]) for n, t in done if n in names), reverse=True)
    return [f"{t:.1f}s {name[:90]}" for t, name in steps]


_SHM_PREFIX = "dsv4-test-"  # + the pytest process's pid: what a killed run left is swept (_sweep_tmpfs)


def _sweep_tmpfs() -> None:
    """Remove what a killed run of this module left on tmpfs (memory, until the next reboot): the
    directories whose pytest process is gone."""
    for d in TMPFS.glob(f"{_SHM_PREFIX}*-*"):
        pid = d.name[len(_SHM_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)


_TMPFS_GRANTED = [0]  # bytes this module has placed on tmpfs (each grant counted at its full need)


def _tmpfs(need: int) -> Path | None:
    """/dev/shm for up to ``need`` bytes of this module's scratch, when it is there, not noexec
    (shared libraries and container binaries are loaded from it), has room, and the machine's
    available memory covers it, what this module already put there and TMPFS_SPARE for the rest
    of the suite; else None (the disk).  Written and deleted in RAM: on the shared disk, deleting
    the GBs this module writes took 20-146 s per run."""
    if not tmpfs_has_room(need, _TMPFS_GRANTED[0] + need + TMPFS_SPARE):
        return None
    _TMPFS_GRANTED[0] += need
    return TMPFS


class _TorchJob:
    """The torch runtime (_torch_runtime) from the shared test cache, like the base rootfs: one
    entry per torch version and wheel hashes the lock pins, image python, platform tags and
    TORCH_LEFT_OUT.  On a cold cache it is made in a thread, started as soon as the image's
    python version is known, so that its downloads and unpacking (~1 min) overlap the image
    builds instead of following them; on the cache's filesystem (the disk), where it stays."""

    def __init__(self, cache: Path, pyver: str) -> None:
        want = _torch_want()
        self.entry = cache / "docker" / (
            f"torch-{want.version}-cp{pyver.replace('.', '')}-"
            + _cache_key(want.version, sorted(want.hashes), pyver, PLATFORMS, sorted(TORCH_LEFT_OUT)))
        self.pool: ThreadPoolExecutor | None = None
        self.skip = ""
        self.cached = self.entry.is_dir()
        if self.cached:
            return
        self.entry.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.entry.parent).free
        if free < MIN_FREE_FOR_TORCH:
            self.skip = (f"{free >> 30} GiB free: the dispatcher check needs the pin's torch and its CUDA "
                         f"libraries (~3.7 GB installed, kept in the test cache); free "
                         f"{MIN_FREE_FOR_TORCH >> 30} GiB to run it")
            return
        self.pool = ThreadPoolExecutor(1)
        self.future = self.pool.submit(self._run, cache, self.entry, pyver)

    @staticmethod
    def _run(cache: Path, entry: Path, pyver: str) -> float:
        t0 = time.monotonic()
        _cached_dir(cache, entry.name, lambda work: _torch_runtime(work / "site", pyver))
        return time.monotonic() - t0

    def result(self) -> tuple[Path, float | None]:
        """The runtime's site directory and the seconds its making took (None: it was cached)."""
        if self.skip:
            pytest.skip(self.skip)
        took = None if self.pool is None else self.future.result()
        # Whether made now or cached: torch's wheel is one the lock pins (the manifest holds its hash).
        want = _torch_want()
        pinned = [line for line in (self.entry / TORCH_MANIFEST).read_text().splitlines() if line.startswith("torch==")]
        assert len(pinned) == 1, pinned
        assert pinned[0].rsplit("--hash=sha256:", 1)[1] in want.hashes, f"{pinned[0]}: not a wheel the lock pins"
        return self.entry / "site", took

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)  # pip runs to its end (or its timeout) first


def _module_wants(request: pytest.FixtureRequest, fixture: str) -> bool:
    """Whether a selected test of this module uses ``fixture`` (-k may have deselected them)."""
    return any(fixture in getattr(item, "fixturenames", ()) and item.path == request.path
               for item in request.session.items)


@pytest.fixture(scope="module")
def built(docker: Docker, shared_cache: Path, tmp_path_factory: pytest.TempPathFactory,
          request: pytest.FixtureRequest):
    t0 = time.monotonic()
    _sweep_cache_tmp(shared_cache)
    tar = _base_rootfs_tar(shared_cache)
    with open(tar, "rb") as fh:
        docker("import", "-", BASE_IMAGE, stdin=fh)
    pyver = docker("run", "--rm", "--network", "none", BASE_IMAGE, "python3", "-c",
                   "import sys; print('%d.%d' % sys.version_info[:2])").stdout.strip()
    tmp = tmp_path_factory.mktemp("docker")
    torch_job = _TorchJob(shared_cache, pyver) if _has_nvcc() and _module_wants(request, "torch_runtime") else None
    try:
        yield from _build(docker, shared_cache, tmp, pyver, t0, torch_job)
    finally:
        if torch_job is not None:
            torch_job.close()
        shutil.rmtree(tmp, ignore_errors=True)  # the contexts (sdist, stock wheel, kernel wheel); the
        # images go with the private dockerd's data root (the `docker` fixture removes it)


def _build(docker: Docker, shared_cache: Path, tmp: Path, pyver: str, t0: float,
           torch_job: _TorchJob | None) -> Iterator[dict]:
    sdist_sha = load(LOCK).pin(PIN).source.sha256

    def base_build() -> float:
        t = time.monotonic()
        base_ctx = _vllm_base_context(tmp, shared_cache, pyver)
        docker("build", "--network", "none", "-t", VLLM_BASE_IMAGE, str(base_ctx))
        shutil.rmtree(base_ctx)
        return time.monotonic() - t

    # The stand-in image (its context, then its build in dockerd) is made while the main context
    # is (the kernel wheel's apply and build here): neither needs the other.
    with ThreadPoolExecutor(1) as pool:
        base_job = pool.submit(base_build)
        t_ctx = time.monotonic()
        ctx = _context(tmp, shared_cache, sdist_sha, pyver)
        t_ctx = time.monotonic() - t_ctx
        t_base = base_job.result()
    # Everything below compares with the context's copy of the lock (a snapshot).
    lock_path = ctx / "locks" / "vllm.toml"
    lock = load(lock_path)
    want = buildargs.compute(lock, lock.pin(PIN))
    t_prep = time.monotonic() - t0
    args = [a for k in buildargs.BUILD_ARGS for a in ("--build-arg", f"{k}={want[k]}")]
    # KERNEL_DISPATCH_CHECK=0: the stand-in has no torch (vLLM's image does); the test runs the
    # same check in the built image with the pin's torch mounted (test_kernel_check_in_the_final_image).
    common = ["build", "--network", "none", "--progress", "plain",
              "--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}", "--build-arg", f"VLLM_IMAGE={VLLM_BASE_IMAGE}",
              "--build-arg", "KERNELS_STAGE=kernels-context", "--build-arg", "KERNEL_DISPATCH_CHECK=0"]
    final = (ctx / "kernels").is_dir()
    log = ""
    t_final = 0.0
    if final:
        t1 = time.monotonic()
        res = docker(*common, "--target", "final", *args, "-t", "dsv4patch-test/final:ok", str(ctx))
        t_final = time.monotonic() - t1
        log = res.stdout + res.stderr
    t1 = time.monotonic()
    docker(*common, "--target", "patch", *args, "-t", "dsv4patch-test/patch:ok", str(ctx))
    t_patch = time.monotonic() - t1
    sizes = {img: int(docker("image", "inspect", "--format", "{{.Size}}", img).stdout.strip() or 0)
             for img in (VLLM_BASE_IMAGE, "dsv4patch-test/final:ok")[:2 if final else 1]}
    # docs/docker.md quotes these lines ("Build time").
    print(f"\ndocker build timings: prep {t_prep:.0f}s (base image, contexts; the stand-in image, its context and "
          f"build, {t_base:.0f}s beside the main context's {t_ctx:.0f}s), "
          f"--target final {t_final:.0f}s (patch -> wheel -> final), --target patch {t_patch:.0f}s "
          f"(cached stages); image sizes: " + ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in sizes.items()))
    print("docker build --target final, its slowest steps: " + "; ".join(_step_times(log)[:8]))
    yield {"docker": docker, "want": want, "ctx": ctx, "common": common, "args": args, "pyver": pyver,
           "lock": lock_path, "log": log, "cache": shared_cache, "final": final, "tmp": tmp,
           "torch_job": torch_job}


@pytest.fixture(scope="module")
def torch_runtime(built) -> Path:
    """The pin's torch with its CUDA libraries for the image's python (_torch_runtime): ~3.7 GB,
    from the shared test cache (made there on first use by ``built``, alongside the image builds:
    _TorchJob); mounted read-only, so the container cannot change it."""
    job = built["torch_job"]
    if job is None:
        _needs_final(built)
        pytest.skip("the torch runtime was not started")
    t0 = time.monotonic()
    site, took = job.result()
    size = sum(f.stat().st_size for f in site.rglob("*") if f.is_file() and not f.is_symlink())
    made = "cached" if took is None else f"made in {took:.0f}s alongside the image builds"
    print(f"\ntorch runtime for the dispatcher check: {size / 1e9:.2f} GB in the test cache ({made}; "
          f"{time.monotonic() - t0:.0f}s waited for here)")
    return site


def _needs_final(built) -> None:
    if not built["final"]:
        pytest.skip("no nvcc here: no kernel wheel, so the wheel and final stages were not built")


def test_labels_match_lock(built) -> None:
    docker, want = built["docker"], built["want"]
    pin = load(built["lock"]).pin(PIN)
    for image in ("dsv4patch-test/patch:ok", "dsv4patch-test/final:ok")[:2 if built["final"] else 1]:
        labels = json.loads(docker("image", "inspect", "--format", "{{json .Config.Labels}}",
                                   image).stdout)
        assert labels["dev.dsv4patch.pin"] == PIN
        assert labels["dev.dsv4patch.vllm.version"] == pin.vllm_version
        assert labels["dev.dsv4patch.vllm.commit"] == pin.commit
        assert labels["dev.dsv4patch.patched-tree"] == pin.patched_tree
        assert labels["dev.dsv4patch.lock.sha256"] == hashlib.sha256(built["lock"].read_bytes()).hexdigest()
        assert labels["dev.dsv4patch.patch-set.sha256"] == want["PATCH_SET_SHA256"]
        assert labels["org.opencontainers.image.version"] == want["IMAGE_VERSION"]


def test_patch_stage_tree_is_the_locked_one(built) -> None:
    docker = built["docker"]
    pin = load(built["lock"]).pin(PIN)
    rep = json.loads(docker("run", "--rm", "--network", "none", "dsv4patch-test/patch:ok",
                            "cat", "/opt/dsv4patch-apply.json").stdout)
    assert rep["ok"] is True
    assert rep["pins"][PIN]["patched_tree"] == pin.patched_tree
    assert rep["pins"][PIN]["base_tree"] == pin.base_tree
    head_tree = docker("run", "--rm", "--network", "none", "dsv4patch-test/patch:ok",
                       "git", "-C", "/opt/vllm-src", "rev-parse", "HEAD^{tree}").stdout.strip()
    assert head_tree == pin.patched_tree


def test_final_image_runs_the_patched_wheel(built) -> None:
    """The final stage's self-check ran in the build; here again, and after a stock file
    replaces a patched one it exits 1 naming the patch and the file."""
    _needs_final(built)
    docker, want = built["docker"], built["want"]
    run = ["run", "--rm", "-i", "--network", "none", "dsv4patch-test/final:ok"]
    show = docker(*run, "python3", "-m", "pip", "show", "vllm").stdout
    # +dsv4.<patch set>.k<kernel package>: the label covers both (vllm_wheel.local_version)
    assert any(line.startswith(f"Version: {PIN}+dsv4.{want['PATCH_SET_SHA256'][:12]}.k")
               for line in show.splitlines())
    rep = json.loads(docker(*run, "dsv4patch", "status", "--installed", "--format", "json").stdout)
    assert rep["ok"] and rep["pin"] == PIN and rep["patched_tree"] == want["PATCHED_TREE"]
    lock = load(built["lock"])
    assert set(p["state"] for p in rep["patches"].values()) == {"present"}
    assert len(rep["patches"]) == len(series_for_pin(lock, lock.pin(PIN)).patches)  # ten since extra 3
    assert rep["kernels"]["ok"] and rep["kernels"]["routes"]["vllm-hook"]
    # The SBOM: at the path the label names, the same bytes as the installed one, which matches.
    assert rep["sbom"]["state"] == "ok"
    labels = json.loads(docker("image", "inspect", "dsv4patch-test/final:ok").stdout)[0]["Config"]["Labels"]
    assert labels["dev.dsv4patch.sbom"] == "/opt/dsv4patch/sbom.cdx.json"
    assert docker(*run, "cat", labels["dev.dsv4patch.sbom"]).stdout == docker(
        *run, "dsv4patch", "status", "--installed", "--format", "cyclonedx").stdout
    assert "dsv4patch status --installed" in built["log"] and "everything matches the lock" in built["log"]
    pin = load(built["lock"]).pin(PIN)
    with zipfile.ZipFile(stock.wheel_path(Store.open(built["cache"]), stock.wheel_for(pin, "x86_64"))) as zf:
        stock_file = zf.read("vllm/v1/worker/workspace.py")
    swap = ('site="$(python3 -c \'import importlib.util as u; '
            'print(u.find_spec("vllm").submodule_search_locations[0])\')" '
            '&& cat > "$site/v1/worker/workspace.py" && dsv4patch status --installed')
    res = docker(*run, "sh", "-c", swap, input=stock_file, check=False)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "0002-DSV4-fix-2" in res.stdout and "vllm/v1/worker/workspace.py: stock" in res.stdout


def test_wrong_label_arg_fails_the_build(built) -> None:
    docker = built["docker"]
    bad = [a.replace(f"PATCHED_TREE={built['want']['PATCHED_TREE']}", "PATCHED_TREE=" + "0" * 40)
           for a in built["args"]]
    res = docker(*built["common"], "--target", "patch", *bad, "-t", "dsv4patch-test/patch:bad",
                 str(built["ctx"]), check=False)
    assert res.returncode != 0
    assert "build args do not match the lock" in res.stdout + res.stderr


def _last_json(stdout: str) -> dict:
    """The ``--json`` report: the last line that is ``{`` opens it (vLLM's log lines may come first)."""
    lines = stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "{")
    return json.loads("\n".join(lines[start:]))


def test_kernel_check_in_the_final_image(built, torch_runtime: Path) -> None:
    """`python -m dsv4patch_kernels_<pin> check --no-device` in the built image, the command the
    final stage runs with KERNEL_DISPATCH_CHECK=1 (the module name as the Dockerfile derives it).

    What vLLM's image has and the stand-in lacks is supplied for real: the driver's libcuda is in
    the stand-in at the CUDA images' compat path, and the pin's torch 2.13.0 (CUDA 13.0) with the
    CUDA libraries it loads is mounted read-only (PYTHONPATH).  vLLM, its hook line, the kernel
    wheel and the stock ``_C_stable_libtorch`` are the image's.  With the hook the dispatcher runs
    the dsv4patch kernels for every rebuilt op (loaded after vLLM's own library, which must load
    too); with DSV4PATCH_KERNELS=0 the same check sees none of them and exits 1."""
    _needs_final(built)
    docker = built["docker"]
    kdist = dist_name(PIN)
    # The Dockerfile's `tr -cs 'A-Za-z0-9\n' '_'` of the pin is the kernel wheel's package name.
    assert kdist == "dsv4patch_kernels_" + "".join(c if c.isalnum() else "_" for c in PIN)
    run = ["run", "--rm", "--network", "none", "-v", f"{torch_runtime}:{TORCH_MOUNT}:ro",
           "-e", f"PYTHONPATH={TORCH_MOUNT}", "dsv4patch-test/final:ok"]
    t0 = time.monotonic()
    res = docker(*run, "python3", "-m", kdist, "check", "--no-device", "--json", check=False)
    t_on = time.monotonic() - t0
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    rep = _last_json(res.stdout)
    with zipfile.ZipFile(next((built["ctx"] / "kernels").glob("*.whl"))) as zf:
        info = json.loads(zf.read(f"{kdist}/build_info.json"))
    assert rep["status"] == "dsv4patch" and rep["devices"] == []
    assert rep["tree_id"] == built["want"]["PATCHED_TREE"] and rep["vllm_version"] == rep["vllm_version_built"] == PIN
    assert set(rep["ops"]) == set(info["ops"]) and rep["ops"]
    for op, st in rep["ops"].items():
        assert st["kernel"] == "dsv4patch" and "dsv4patch_bindings" in st["registered_at"], (op, st)
    assert rep["routes"]["vllm-hook"]["installed"] and rep["activated_by"] == "vllm-hook"
    t0 = time.monotonic()
    off = docker(*run[:-1], "-e", "DSV4PATCH_KERNELS=0", run[-1],
                 "python3", "-m", kdist, "check", "--no-device", "--json", check=False)
    print(f"\nkernel check in the final image: {t_on:.0f}s, with DSV4PATCH_KERNELS=0 {time.monotonic() - t0:.0f}s")
    assert off.returncode == 1, off.stdout[-4000:] + off.stderr[-4000:]
    rep = _last_json(off.stdout)
    assert rep["status"] == "stock" and rep["outcome"] == "disabled"
    # Nothing loads a kernel library then (no GPU: vLLM's plugin loader imports none either).
    assert all(st["kernel"] != "dsv4patch" for st in rep["ops"].values()), rep["ops"]


def test_selftest_verb_in_the_final_image(built) -> None:
    """The node check the image documents (`docker run --gpus all --entrypoint dsv4patch <image>
    selftest`): the verb and its cases are there, and `status --installed` points to it (status
    compares files; the selftest runs the engine, which needs the node's GPU)."""
    _needs_final(built)
    docker = built["docker"]
    # As documented: vLLM's image starts `vllm serve`, so dsv4patch is named as the entrypoint.
    run = ["run", "--rm", "--network", "none", "--entrypoint", "dsv4patch", "dsv4patch-test/final:ok"]
    help_text = docker(*run, "selftest", "--help").stdout
    assert help_text.startswith("usage: dsv4patch selftest") and "--cases" in help_text
    cases = docker(*run, "selftest", "--list").stdout.split()
    assert "installed" in cases and "mtp1/short_b5" in cases
    status = docker(*run, "status", "--installed").stdout
    assert "`dsv4patch selftest` runs a tiny DeepSeek-V4" in status
