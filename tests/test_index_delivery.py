"""Delivery through a real package index: pypiserver on 127.0.0.1, twine, pip and uv.

The patched 0.27.1 wheel (built as in tests/test_sbom.py) is uploaded with
``twine`` to a real ``pypiserver`` started here on 127.0.0.1, installed from
that index with pip and with uv into fresh venvs (``--no-deps``: vLLM's
dependencies are not what is tested), and ``status --installed`` exits 0
against each, with its SBOM matching; an SBOM that contradicts the install
fails.  A second server stands in for PyPI with only the stock wheel: a
requirements file that pins the patched wheel by hash refuses it when the
private index is unreachable, where an unpinned ``vllm==0.27.1`` takes it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import LOCK
from dsv4patch import hashing
from dsv4patch.kernels import stock
from dsv4patch.store import Store
from test_sbom import kernel_wheel, make_patched  # noqa: F401  (module fixture: the kernel wheel)

needs_nvcc = pytest.mark.skipif(
    shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(), reason="needs nvcc")
pytestmark = [pytest.mark.slow, needs_nvcc]

BIN = Path(sys.executable).parent


def _env() -> dict[str, str]:
    """pip and uv with no configuration and no cache: every install reads the index (and no
    300 MB wheel is kept a second time in a cache; uv's temporary one goes when it exits)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_INDEX_URL",
                                                             "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS",
                                                             "UV_INDEX_URL", "UV_EXTRA_INDEX_URL",
                                                             "PIP_CACHE_DIR", "UV_CACHE_DIR")}
    env.update({"PIP_CONFIG_FILE": os.devnull, "UV_NO_CONFIG": "1", "UV_NO_CACHE": "1",
                "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Index:
    """A pypiserver on 127.0.0.1 serving ``root`` (uploads without authentication)."""

    def __init__(self, root: Path, log: Path) -> None:
        self.root, self.port = root, _free_port()
        root.mkdir(parents=True, exist_ok=True)
        self.log = open(log, "wb")
        self.proc = subprocess.Popen([str(BIN / "pypi-server"), "run", "-i", "127.0.0.1", "-p", str(self.port),
                                      "-a", ".", "-P", ".", "--disable-fallback", "--backend", "simple-dir",
                                      str(root)], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.url, timeout=2).read()  # noqa: S310 (our own 127.0.0.1 server)
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"pypiserver did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.3)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.base + "/simple/"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path, kernel_wheel: Path) -> dict:
    """The patched wheel, built once (tests/test_sbom.py builds it twice, for reproducibility)."""
    return make_patched(tmp_path_factory.mktemp("wheel"), shared_cache, kernel_wheel, ("a",))


@pytest.fixture(scope="module")
def index(built: dict, tmp_path_factory: pytest.TempPathFactory):
    """The private index with the patched wheel uploaded by twine."""
    tmp = tmp_path_factory.mktemp("index")
    idx = Index(tmp / "packages", tmp / "pypiserver.log")
    try:
        wheel = built["a"].built.path
        res = subprocess.run([str(BIN / "twine"), "upload", "--non-interactive", "--disable-progress-bar",
                              "--repository-url", idx.base + "/", "-u", "dsv4patch", "-p", "unused", str(wheel)],
                             capture_output=True, text=True, env=_env(), timeout=600)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        assert (idx.root / wheel.name).read_bytes() == wheel.read_bytes()  # what twine sent is the wheel
        yield {"index": idx, "wheel": wheel, "version": built["a"].built.version}
    finally:
        idx.stop()


def _link_or_copy(src: Path, dest: Path) -> None:
    """A hard link (no second 300 MB copy; the server only reads it), a copy across filesystems."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def _status(python: str, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsv4patch", "status", "--installed", "--lock", str(LOCK),
                           "--cache-dir", str(cache), "--python", python, *args],
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def pip_venv(index: dict, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh venv with the patched wheel from the index, for the module (800 MB, gone with it): one pip
    install of the 313 MB wheel, not one per test (~8 CPU s each, issue 39); the test that edits the
    installed SBOM puts it back."""
    venv = tmp_path_factory.mktemp("pip") / "pip-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    res = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--index-url", index["index"].url,
                          f"vllm=={index['version']}"], capture_output=True, text=True, env=_env(), timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return py


def test_index_page_lists_the_patched_wheel_with_its_hash(index: dict) -> None:
    page = urllib.request.urlopen(index["index"].url + "vllm/", timeout=10).read().decode()  # noqa: S310
    assert index["wheel"].name in page and hashing.hash_file(index["wheel"]) in page


def test_pip_from_the_index_then_status_installed_exits_0(index: dict, pip_venv: str, shared_cache: Path) -> None:
    res = _status(pip_venv, shared_cache, "--format", "json")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    rep = json.loads(res.stdout)
    assert rep["ok"] and rep["installed"]["version"] == index["version"]
    assert rep["sbom"]["state"] == "ok" and rep["sbom"]["problems"] == []
    assert rep["sbom"]["path"].endswith(f"vllm-{index['version']}.dist-info/sboms/dsv4patch.cdx.json")
    # --format cyclonedx prints the installed SBOM as it is in the wheel.
    cdx = _status(pip_venv, shared_cache, "--format", "cyclonedx")
    assert cdx.returncode == 0, cdx.stderr[-2000:]
    import zipfile

    with zipfile.ZipFile(index["wheel"]) as zf:
        assert cdx.stdout.encode() == zf.read(f"vllm-{index['version']}.dist-info/sboms/dsv4patch.cdx.json")
    text = _status(pip_venv, shared_cache)
    assert text.returncode == 0 and "matches the installed vLLM, patch set and kernel library" in text.stdout


def test_uv_from_the_index_then_status_installed_exits_0(index: dict, shared_cache: Path, tmp_path: Path) -> None:
    venv = tmp_path / "uv-venv"
    env = _env()
    subprocess.run([str(BIN / "uv"), "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env)
    py = str(venv / "bin" / "python")
    res = subprocess.run([str(BIN / "uv"), "pip", "install", "-q", "--no-deps", "--python", py,
                          "--index-url", index["index"].url, f"vllm=={index['version']}"],
                         capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    st = _status(py, shared_cache, "--format", "json")
    assert st.returncode == 0, st.stdout[-3000:] + st.stderr[-2000:]
    assert json.loads(st.stdout)["sbom"]["state"] == "ok"


def test_an_sbom_that_contradicts_the_install_fails(index: dict, pip_venv: str, shared_cache: Path) -> None:
    site = Path(subprocess.run([pip_venv, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    path = site / f"vllm-{index['version']}.dist-info" / "sboms" / "dsv4patch.cdx.json"
    saved = path.read_bytes()
    try:
        doc = json.loads(saved)
        doc["components"][0]["hashes"][0]["content"] = "0" * 64
        path.write_text(json.dumps(doc))
        res = _status(pip_venv, shared_cache, "--format", "json")
        assert res.returncode == 1
        rep = json.loads(res.stdout)
        assert rep["sbom"]["state"] == "mismatch" and not rep["ok"]
        assert any("kernel library" in p and "the SBOM says 0000000000000000" in p for p in rep["sbom"]["problems"])
        path.unlink()
        res = _status(pip_venv, shared_cache, "--format", "json")
        gone = json.loads(res.stdout)["sbom"]  # RECORD lists it, the file is gone: reported, not trusted
        assert gone["state"] == "unreadable" and "listed in RECORD but missing" in gone["problems"][0]
        cdx = _status(pip_venv, shared_cache, "--format", "cyclonedx")
        assert cdx.returncode == 1 and "no SBOM to print" in cdx.stderr and cdx.stdout == ""
    finally:
        path.write_bytes(saved)
    assert _status(pip_venv, shared_cache).returncode == 0


def test_hash_pinned_requirements_refuse_the_stock_wheel(index: dict, built: dict, shared_cache: Path,
                                                          tmp_path: Path) -> None:
    """With the private index gone, a stand-in PyPI serves only the stock vllm 0.27.1."""
    tmp = tmp_path
    pin = built["pin"]
    stock_path = stock.wheel_path(Store.open(shared_cache), stock.wheel_for(pin, "x86_64"))
    public = Index(tmp / "public", tmp / "public.log")
    try:
        _link_or_copy(stock_path, public.root / "vllm-0.27.1-cp38-abi3-manylinux_2_28_x86_64.whl")
        env = _env()
        patched_sha = hashing.hash_file(index["wheel"])
        pinned = tmp / "requirements.txt"
        pinned.write_text(f"vllm==0.27.1 --hash=sha256:{patched_sha}\n")
        venv = tmp / "pinned-venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        py = str(venv / "bin" / "python")
        res = subprocess.run([py, "-m", "pip", "install", "--no-deps", "--index-url", public.url,
                              "-r", str(pinned)], capture_output=True, text=True, env=env, timeout=900)
        assert res.returncode != 0 and "THESE PACKAGES DO NOT MATCH THE HASHES" in res.stderr, res.stderr[-2000:]
        assert "vllm" not in subprocess.run([py, "-m", "pip", "list"], capture_output=True, text=True,
                                            env=env).stdout
        uv = subprocess.run([str(BIN / "uv"), "pip", "install", "--no-deps", "--python", py,
                             "--index-url", public.url, "-r", str(pinned)],
                            capture_output=True, text=True, env=env, timeout=900)
        assert uv.returncode != 0 and "hash" in uv.stderr.lower(), uv.stderr[-2000:]
        # The control: the same line without the hash takes the stock wheel silently.
        loose = subprocess.run([py, "-m", "pip", "download", "--no-deps", "-d", str(tmp / "loose"),
                                "--index-url", public.url, "vllm==0.27.1"], capture_output=True, text=True,
                               env=env, timeout=900)
        assert loose.returncode == 0 and [p.name for p in (tmp / "loose").iterdir()] == [
            "vllm-0.27.1-cp38-abi3-manylinux_2_28_x86_64.whl"]
    finally:
        public.stop()
