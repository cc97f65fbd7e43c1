"""tests/gpu/selftest_h200.sh on CPU: staging, verification, unpacking, pip installs, the selftest call and its JSON.

The device has a GPU, CPython 3.12 and no network; here a payload of the same
layout as selftest_pack.py's is made with a STAND-IN stock wheel (a minimal
``vllm`` 0.26.0 wheel: the real one is 303 MB and needs CUDA), one small
dependency wheel and one small CLI wheel, and the script runs with this
interpreter.  What runs for real: the piece checks (a corrupted piece is
refused), the reassembly and its sha256, pip --target installs, the vLLM
interpreter wrapper (its PYTHONPATH holds the site and the dependencies only),
``dsv4patch selftest`` against it (the probe finds no torch and no GPU here, so
the engine case needs a GPU; the installed check fails on the stand-in) and
the files that come back.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from conftest import validate_json

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "gpu" / "selftest_h200.sh"
FAST_XZ = {"id": lzma.FILTER_LZMA2, "preset": 0, "dict_size": 4096, "nice_len": 2, "mf": lzma.MF_HC3}


def _wheel(path: Path, name: str, version: str, files: dict[str, str]) -> Path:
    dist = f"{name}-{version}.dist-info"
    members = {**files, f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
               f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},,\n" for n in members) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, text in {**members, f"{dist}/RECORD": record}.items():
            z.writestr(n, text)
    return path


def _tar_add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _payload(tmp: Path, sdist: Path) -> Path:
    """ROOT-like copy of the repo's script and CLI with a .selftest/ of two pieces."""
    repo = tmp / "repo"
    shutil.copytree(ROOT / "dsv4patch", repo / "dsv4patch", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "locks", repo / "locks")
    shutil.copytree(ROOT / "patches", repo / "patches")
    (repo / "tests" / "gpu").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "tests" / "gpu" / SCRIPT.name)
    shutil.copy(SCRIPT.parent / "safe_untar.py", repo / "tests" / "gpu" / "safe_untar.py")  # its unpack
    stock = _wheel(tmp / "vllm-0.26.0-py3-none-any.whl", "vllm", "0.26.0",
                   {"vllm/__init__.py": "__version__ = '0.26.0'\n"})
    dep = _wheel(tmp / "tinydep-1.0-py3-none-any.whl", "tinydep", "1.0", {"tinydep.py": "X = 1\n"})
    cli = _wheel(tmp / "tinycli-1.0-py3-none-any.whl", "tinycli", "1.0", {"tinycli.py": "Y = 1\n"})
    rest = io.BytesIO()
    with tarfile.open(fileobj=rest, mode="w") as tar:
        _tar_add(tar, f"deps/{dep.name}", dep.read_bytes())
        _tar_add(tar, f"cli/{cli.name}", cli.read_bytes())
        _tar_add(tar, "cache/blobs/sha256/" + sdist.name, sdist.read_bytes())
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w") as tar:
        _tar_add(tar, "vllm.whl", stock.read_bytes())
        # xz at its fastest (a 4 KiB dictionary): rest is mostly the gzip'd sdist, which no preset shrinks,
        # and preset 6 spent ~26 s of CPU on it (selftest_pack.py --xz-preset picks the real one)
        _tar_add(tar, "rest.tar.xz", lzma.compress(rest.getvalue(), filters=[FAST_XZ]))
    data = payload.getvalue()
    half = len(data) // 2 + 1
    out = repo / ".selftest"
    out.mkdir()
    parts = []
    for i, piece in enumerate((data[:half], data[half:]), 1):
        (out / f"part-0{i}.bin").write_bytes(piece)
        parts.append({"name": f"part-0{i}.bin", "size": len(piece), "sha256": hashlib.sha256(piece).hexdigest()})
    manifest = {"pin": "0.26.0", "payload_sha256": hashlib.sha256(data).hexdigest(), "payload_size": len(data),
                "parts": parts, "deps": [dep.name], "cli": [cli.name], "kernels": None,
                "stock_wheel": {"name": stock.name, "sha256": hashlib.sha256(stock.read_bytes()).hexdigest(),
                                "size": stock.stat().st_size},
                "sdist": {"blob": "cache/blobs/sha256/" + sdist.name, "sha256": sdist.name}}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return repo


def _run(repo: Path, tmp: Path, mode: str, **env: str) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "OUT")}
    bindir = str(Path(sys.executable).parent)
    e.update(ST_DIR=str(tmp / "st"), OUT=str(tmp / "out"), PYTHON=sys.executable, PATH=f"{bindir}:{e['PATH']}", **env)
    return subprocess.run(["bash", str(repo / "tests" / "gpu" / SCRIPT.name), mode], cwd=repo, env=e,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # the installed check recomputes the patched tree in the script's fresh cache (minutes here)
def test_the_device_script_stages_verifies_installs_and_runs_selftest(tmp_path, shared_cache):
    sdist = shared_cache / "blobs" / "sha256" / "23e9fa19d7e20ce7dcc1c074d41503e2116d23f19e688f5d5ea91b741f958502"
    if not sdist.exists():
        subprocess.run([sys.executable, "-m", "dsv4patch", "fetch", "--pin", "0.26.0", "--cache-dir",
                        str(shared_cache)], check=True, cwd=ROOT, capture_output=True)
    repo = _payload(tmp_path, sdist)
    sel = repo / ".selftest"
    good = (sel / "part-02.bin").read_bytes()
    (sel / "part-02.bin").write_bytes(b"x" + good[1:])  # corrupted in transit
    first = _run(repo, tmp_path, "stage")
    assert first.returncode == 0, first.stderr
    assert "sha256 mismatch, ignored" in first.stdout and "pieces here: 1/2; missing: part-02.bin" in first.stdout
    (sel / "part-01.bin").unlink()  # a later call carries only the other piece
    (sel / "part-02.bin").write_bytes(good)
    res = _run(repo, tmp_path, "stock", SELFTEST_ARGS="--cases installed,plain/short_b1 --start-deadline 120")
    assert "pieces here: 2/2" in res.stdout, res.stdout + res.stderr
    assert "payload unpacked: 1 dependency wheels, 1 CLI wheels" in res.stdout and "stock wheel installed" in res.stdout
    assert "selftest stock: exit 1" in res.stdout, res.stdout + res.stderr
    out = tmp_path / "out"
    data = validate_json("selftest", (out / "selftest-stock.json").read_text())
    assert data["python"] == str(tmp_path / "st" / "python-vllm")
    inst = data["checks"][0]
    assert inst["name"] == "installed" and inst["ok"] is False
    # the stand-in wheel was found through the wrapper's PYTHONPATH, as the installed vLLM
    assert inst["report"]["installed"]["package"] == str(tmp_path / "st" / "site" / "vllm")
    case = data["cases"][0]
    assert case["case"] == "plain/short_b1" and case["verdict"] == "needs-gpu"  # no torch, no GPU here
    assert (out / "selftest-stock-work.tgz").is_file() and "selftest stock: exit 1" in \
        (out / "selftest-stock.env.txt").read_text()
    assert "plain/short_b1" in (out / "selftest-stock.txt").read_text()
    wrapper = (tmp_path / "st" / "python-vllm").read_text()
    pythonpath = wrapper.split("PYTHONPATH=", 1)[1].split(" exec ", 1)[0].split(":")
    # the vLLM environment sees its site and its dependencies, nothing of dsv4patch (whatever the clone is named)
    assert pythonpath[:2] == [f"{tmp_path}/st/site", f"{tmp_path}/st/deps"] and str(ROOT) not in pythonpath
    # a second call finds everything installed
    again = _run(repo, tmp_path, "stock", SELFTEST_ARGS="--list")
    assert "stock wheel installed earlier on this machine" in again.stdout
    # the topology rides beside the cases (nvidia-h200-x2's command): no GPU here, so the verb refuses it, exit 2
    tp2 = _run(repo, tmp_path, "stock", ST_RUN="stock-tp2", SELFTEST_ARGS="--cases plain/short_b1",
               SELFTEST_TOPOLOGY="--tensor-parallel-size 2")
    assert "--cases plain/short_b1 --tensor-parallel-size 2" in tp2.stdout and "selftest stock-tp2: exit 2" in \
        tp2.stdout, tp2.stdout
    assert "needs 2 CUDA devices" in json.loads((out / "selftest-stock-tp2.json").read_text())["error"]["message"]
    # a run in its own session (ST_SPAN): this call waits on it and hands back its files
    bg = _run(repo, tmp_path, "stock", ST_SPAN="200", ST_RUN="stock-bg", SELFTEST_ARGS="--cases plain/short_b1")
    assert "run stock-bg started in the background" in bg.stdout and "run stock-bg finished" in bg.stdout, bg.stdout
    assert validate_json("selftest", (out / "selftest-stock-bg.json").read_text())["cases"][0]["verdict"] == \
        "needs-gpu"
    assert "no run nothing on this machine" in _run(repo, tmp_path, "collect", ST_RUN="nothing").stdout
