"""Build the Dockerfile for real, offline, with a private dockerd: patch -> wheel -> final.

What it takes (``.ci/docker-setup.sh`` installs it): root, Debian's ``docker.io``
(dockerd + a docker client with built-in BuildKit) and ``debootstrap``; nvcc
for the kernel wheel.  Where dockerd cannot start (no root, no cgroups/overlay,
no package) the test skips and says why.

The test
  * starts its own ``dockerd`` (no bridge, no iptables, data root in a temp dir)
    and stops it by PID afterwards;
  * makes the base image: a minimal Debian trixie rootfs with python3, venv and
    git (debootstrap from the Debian mirror, cached as a tarball in the shared
    test cache, ``docker import``-ed as the PYTHON_IMAGE), and from it the
    stand-in for the vLLM image (a venv on PATH, like vLLM's own image);
  * prepares an offline build context: the repository's files, the pin's vLLM
    sdist in ``sdists/`` and its stock x86_64 wheel in ``vllm-wheels/`` (from
    the dsv4patch cache), dsv4patch's dependency wheels in ``wheels/`` (``pip
    download``), and the kernel wheel ``dsv4patch build`` makes (nvcc, against
    the CPU test venv's torch) in ``kernels/`` (``KERNELS_STAGE=kernels-context``:
    the CUDA ``kernels`` stage needs the CUDA image);
  * runs ``docker build --network none --target final`` with the label build
    args from ``dsv4patch lock --build-args``: the final stage pip-installs the
    patched wheel (``--no-deps``) and its self-check ``dsv4patch status
    --installed`` runs for real; then checks the images: labels equal the lock,
    the patch stage's tree is the lock's patched_tree, the final image's vLLM
    carries every patch, and with one patched file replaced by the stock one
    ``status --installed`` exits 1 naming the patch and the file;
  * checks that a wrong label build arg fails the build.

Only the CUDA ``kernels`` stage and the real vLLM base image are not used here
(registries and GPUs' worth of downloads); they are linted
(tests/test_ci_files.py) and built by the ``image`` workflow.

Timing on 2 cores, warm caches: ~4 min (cold: + ~2 min debootstrap, + the
sdist and wheel downloads).  Without nvcc only the ``patch`` stage is built
(the final-image test skips and says so).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsv4patch import buildargs, testenv
from dsv4patch.kernels import stock
from dsv4patch.lock import load
from dsv4patch.series import series_for_pin
from dsv4patch.store import Store

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "locks" / "vllm.toml"
PIN = "0.27.1"
BASE_IMAGE = "dsv4patch-test/python:trixie"
VLLM_BASE_IMAGE = "dsv4patch-test/vllm-base:trixie"  # stands in for vllm/vllm-openai
SUITE = "trixie"  # python >= 3.11.4 (tarfile extraction filters); bookworm's 3.11.2 is too old
MIRROR = os.environ.get("DSV4PATCH_DEBIAN_MIRROR", "http://deb.debian.org/debian")
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


def _has_nvcc() -> bool:
    return shutil.which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").exists()


def _kernel_wheel(cache: Path, dest: Path) -> Path:
    """The kernel wheel `dsv4patch build` makes for the pin (nvcc; objects cached in the store)."""
    tree = dest.parent / "tree"
    base = [sys.executable, "-m", "dsv4patch"]
    res = subprocess.run([*base, "apply", "--lock", str(LOCK), "--pin", PIN, "--tree", str(tree),
                          "--cache-dir", str(cache), "--no-build"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    python = testenv.ensure(tree, Store.open(cache)).python
    res = subprocess.run([*base, "build", "--lock", str(LOCK), "--pin", PIN, "--tree", str(tree),
                          "--python", str(python), "--out", str(dest), "--cache-dir", str(cache)],
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
    tmp = tmp_path_factory.mktemp("docker")
    base_ctx = tmp / "vllm-base"
    base_ctx.mkdir()
    (base_ctx / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nRUN python3 -m venv /opt/venv\nENV PATH=/opt/venv/bin:$PATH\n")
    docker("build", "--network", "none", "-t", VLLM_BASE_IMAGE, str(base_ctx))
    sdist_sha = load(LOCK).pin(PIN).source.sha256
    ctx = _context(tmp, shared_cache, sdist_sha, pyver)
    # Everything below compares with the context's copy of the lock (a snapshot).
    lock_path = ctx / "locks" / "vllm.toml"
    lock = load(lock_path)
    want = buildargs.compute(lock, lock.pin(PIN))
    t_prep = time.monotonic() - t0
    args = [a for k in buildargs.BUILD_ARGS for a in ("--build-arg", f"{k}={want[k]}")]
    common = ["build", "--network", "none", "--progress", "plain",
              "--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}", "--build-arg", f"VLLM_IMAGE={VLLM_BASE_IMAGE}",
              "--build-arg", "KERNELS_STAGE=kernels-context", "--build-arg", "KERNEL_DISPATCH_CHECK=0"]
    t1 = time.monotonic()
    final = (ctx / "kernels").is_dir()
    log = ""
    if final:
        res = docker(*common, "--target", "final", *args, "-t", "dsv4patch-test/final:ok", str(ctx))
        log = res.stdout + res.stderr
    docker(*common, "--target", "patch", *args, "-t", "dsv4patch-test/patch:ok", str(ctx))
    t_build = time.monotonic() - t1
    print(f"\ndocker build --target {'final' if final else 'patch'}: prep {t_prep:.0f}s, "
          f"build {t_build:.0f}s")
    return {"docker": docker, "want": want, "ctx": ctx, "common": common, "args": args,
            "lock": lock_path, "log": log, "cache": shared_cache, "final": final}


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
