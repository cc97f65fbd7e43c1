"""Build the Dockerfile's ``patch`` stage for real, offline, with a private dockerd.

What it takes (``.ci/docker-setup.sh`` installs it): root, Debian's ``docker.io``
(dockerd + a docker client with built-in BuildKit) and ``debootstrap``.  Where
dockerd cannot start (no root, no cgroups/overlay, no package) the test skips
and says why.

The test
  * starts its own ``dockerd`` (no bridge, no iptables, data root in a temp dir)
    and stops it by PID afterwards;
  * makes the base image: a minimal Debian trixie rootfs with python3, venv and
    git (debootstrap from the Debian mirror, cached as a tarball in the shared
    test cache, ``docker import``-ed as the PYTHON_IMAGE);
  * prepares an offline build context: the repository's files, the pin's vLLM
    sdist in ``sdists/`` (from the dsv4patch cache, ``dsv4patch fetch``) and
    dsv4patch's dependency wheels in ``wheels/`` (``pip download``);
  * runs ``docker build --target patch --network none`` with the label build
    args from ``docker/build-args.py`` and checks the image: labels equal the
    lock, /opt/dsv4patch-apply.json and the tree's HEAD^{tree} equal the lock's
    patched_tree;
  * checks that a wrong label build arg fails the build.

Only the ``patch`` stage is built; ``kernels`` (CUDA devel image, nvcc, torch)
and the final stage (vLLM image) need registries and GPUs' worth of downloads
and are only linted (tests/test_ci_files.py).

Timing on 2 cores, warm caches: ~1.5 min (cold: + ~2 min debootstrap, + the
sdist download).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsv4patch.lock import load

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "locks" / "vllm.toml"
PIN = "0.27.1"
BASE_IMAGE = "dsv4patch-test/python:trixie"
SUITE = "trixie"  # python >= 3.11.4 (tarfile extraction filters); bookworm's 3.11.2 is too old
MIRROR = os.environ.get("DSV4PATCH_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CONTEXT_FILES = ("pyproject.toml", "README.md", "LICENSE", "Dockerfile", ".dockerignore")
CONTEXT_DIRS = ("dsv4patch", "locks", "patches", "docker")

pytestmark = [pytest.mark.slow, pytest.mark.network]


def _build_args_module():
    spec = importlib.util.spec_from_file_location("build_args", ROOT / "docker" / "build-args.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


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
    work = Path(tempfile.mkdtemp(prefix="dsv4d-", dir="/tmp"))
    sock = work / "docker.sock"
    log = open(work / "dockerd.log", "wb")
    proc = subprocess.Popen(
        [dockerd, "--bridge=none", "--iptables=false", "--ip-forward=false", "--ip-masq=false",
         "--data-root", str(work / "root"), "--exec-root", str(work / "exec"),
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
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def _base_rootfs_tar(cache: Path) -> Path:
    """A tarball of a minimal Debian rootfs with python3, venv and git (cached)."""
    tar = cache / "docker" / f"debian-{SUITE}-python-git.tar"
    if tar.exists():
        return tar
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        pytest.skip("debootstrap not installed (run .ci/docker-setup.sh)")
    tar.parent.mkdir(parents=True, exist_ok=True)
    rootfs = Path(tempfile.mkdtemp(prefix="dsv4-rootfs-", dir="/tmp"))
    try:
        res = subprocess.run(
            [debootstrap, "--variant=minbase", "--include=python3,python3-venv,git,ca-certificates",
             SUITE, str(rootfs), MIRROR], capture_output=True, text=True, timeout=1200,
        )
        if res.returncode != 0:
            pytest.skip(f"debootstrap {SUITE} failed (Debian mirror unreachable?): "
                        f"{res.stdout[-1500:]}{res.stderr[-1500:]}")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc",
                     "usr/share/man", "usr/share/locale", "usr/share/info"):
            shutil.rmtree(rootfs / junk, ignore_errors=True)
        tmp = tar.with_suffix(".tmp")
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tmp), "."], check=True)
        tmp.replace(tar)
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    return tar


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
    res = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
         "--dest", str(ctx / "wheels"), "--python-version", python_version,
         "--only-binary=:all:", str(ctx), "setuptools>=68", "wheel"],
        capture_output=True, text=True,
    )
    if res.returncode != 0:
        pytest.skip(f"pip download of dsv4patch's wheels failed (no PyPI?): {res.stderr[-1500:]}")
    return ctx


@pytest.fixture(scope="module")
def built(docker: Docker, shared_cache: Path, tmp_path_factory: pytest.TempPathFactory):
    t0 = time.monotonic()
    tar = _base_rootfs_tar(shared_cache)
    with open(tar, "rb") as fh:
        docker("import", "-", BASE_IMAGE, stdin=fh)
    pyver = docker("run", "--rm", "--network", "none", BASE_IMAGE, "python3", "-c",
                   "import sys; print('%d.%d' % sys.version_info[:2])").stdout.strip()
    sdist_sha = load(LOCK).pin(PIN).source.sha256
    ctx = _context(tmp_path_factory.mktemp("docker"), shared_cache, sdist_sha, pyver)
    # Everything below compares with the context's copy of the lock (a snapshot).
    lock_path = ctx / "locks" / "vllm.toml"
    want = _build_args_module().compute(lock_path, PIN)
    t_prep = time.monotonic() - t0
    args = [a for k in _build_args_module().BUILD_ARGS for a in ("--build-arg", f"{k}={want[k]}")]
    common = ["build", "--network", "none", "--target", "patch", "--progress", "plain",
              "--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}"]
    t1 = time.monotonic()
    res = docker(*common, *args, "-t", "dsv4patch-test/patch:ok", str(ctx))
    t_build = time.monotonic() - t1
    print(f"\ndocker build --target patch: prep {t_prep:.0f}s, build {t_build:.0f}s")
    return {"docker": docker, "want": want, "ctx": ctx, "common": common, "args": args,
            "lock": lock_path, "log": res.stdout + res.stderr}


def test_patch_stage_labels_match_lock(built) -> None:
    docker, want = built["docker"], built["want"]
    pin = load(built["lock"]).pin(PIN)
    labels = json.loads(docker("image", "inspect", "--format", "{{json .Config.Labels}}",
                               "dsv4patch-test/patch:ok").stdout)
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
    manifest = json.loads(docker("run", "--rm", "--network", "none", "dsv4patch-test/patch:ok",
                                 "cat", "/opt/dsv4patch/manifest.json").stdout)
    assert manifest["files"], "the patches change files under vllm/"
    assert all(f.startswith("vllm/") for f in manifest["files"])
    # The staged overlay holds exactly those files, byte for byte the patched ones.
    listing = docker("run", "--rm", "--network", "none", "dsv4patch-test/patch:ok", "sh", "-c",
                     "cd /opt/vllm-overlay && find . -type f -exec sha256sum {} +").stdout
    staged = {line.split()[1][2:]: line.split()[0] for line in listing.splitlines()}
    assert staged == {f: h["patched_sha256"] for f, h in manifest["files"].items()}


def test_wrong_label_arg_fails_the_build(built) -> None:
    docker = built["docker"]
    bad = [a.replace(f"PATCHED_TREE={built['want']['PATCHED_TREE']}", "PATCHED_TREE=" + "0" * 40)
           for a in built["args"]]
    res = docker(*built["common"], *bad, "-t", "dsv4patch-test/patch:bad", str(built["ctx"]),
                 check=False)
    assert res.returncode != 0
    assert "build args do not match the lock" in res.stdout + res.stderr
