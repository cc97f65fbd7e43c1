"""Fix 5's SM120 gate against the FlashInfer releases where its inputs changed.

The patched 0.27.1 gate (``has_flashinfer_sparse_mla_sm120_config``, behind
``has_flashinfer_sparse_mla_sm120`` like the layer that uses it) must give, for
a grid of (query heads, top-k), the same answer as 0.28.0's own gate with the
same FlashInfer: 0.6.14 (pin 0.26.0), 0.6.16.post3 (pin 0.27.1), 0.6.18.post1
(first with top-k 192/256), 0.7.0 (dispatch envelope, public query),
0.7.2.post1 and 0.7.4 (the newest here).

The wheels are pure Python (``py3-none-any``); they are fetched by sha256 into
the shared store (``tests/flashinfer_wheels.lock.json``), unpacked without
``flashinfer/data/`` (the CUDA sources its JIT compiles), and imported on CPU in
the ``verify`` venv, with the four small packages ``flashinfer`` imports at
module level.  Nothing is faked: both gates run the real vLLM code on the real
FlashInfer modules.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from conftest import LOCK, ROOT
from dsv4patch.main import main
from dsv4patch.progress import Progress
from dsv4patch.proofs import testenv
from dsv4patch.store import Store

pytestmark = [
    pytest.mark.network,
    pytest.mark.slow,
    # vLLM's has_flashinfer() (behind both gates) wants nvcc or flashinfer-cubin.
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc on PATH (vLLM's has_flashinfer)"),
]

WHEELS = json.loads((ROOT / "tests" / "flashinfer_wheels.lock.json").read_text())
GRID = [(h, k) for h in (8, 16, 32, 64, 128) for k in (128, 192, 256, 512, 1024, 2048)]

# One process per tree: it imports torch, vLLM's package and what FlashInfer's import pulls from
# torch (the ~4 s every probe shares), then forks one child per release, which imports that release
# and vllm.utils.flashinfer for the first time and asks both gates (issue 39: twelve processes that
# each imported everything cost ~65 CPU s, this ~20).  Nothing of FlashInfer or of the gates' module
# is imported before the fork.
PROBE = """
import json, os, sys
import torch, torch._dynamo, torch._inductor  # noqa: F401 (shared by every release's import)
import vllm, vllm.envs, vllm.logger  # noqa: F401
assert not any(m == "flashinfer" or m.startswith(("flashinfer.", "vllm.utils.flashinfer")) for m in sys.modules)
grid, jobs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for version, paths in jobs:
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            sys.path[1:1] = paths  # after the tree, as PYTHONPATH would put them
            from vllm.utils import flashinfer as fi
            api = fi.has_flashinfer_sparse_mla_sm120()
            gate = {f"{h},{k}": bool(fi.has_flashinfer_sparse_mla_sm120_config(h, k)) for h, k in grid}
            flashinfer = getattr(sys.modules.get("flashinfer"), "__file__", None)
            print(json.dumps({"version": version, "file": fi.__file__, "flashinfer": flashinfer, "api": api,
                              "gate": gate}), flush=True)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, (version, status)
"""


def _tree(tmp_path_factory: pytest.TempPathFactory, cache: Path, pin: str) -> Path:
    tree = tmp_path_factory.mktemp(f"fi-{pin}") / "vllm"
    assert main(["apply", "--lock", str(LOCK), "--pin", pin, "--tree", str(tree),
                 "--cache-dir", str(cache), "--format", "json", "--no-build"]) == 0
    return tree


@pytest.fixture(scope="module")
def trees(tmp_path_factory, shared_cache) -> dict[str, Path]:
    return {pin: _tree(tmp_path_factory, shared_cache, pin) for pin in ("0.27.1", "0.28.0")}


@pytest.fixture(scope="module")
def env(trees, shared_cache) -> testenv.TestEnv:
    return testenv.ensure(trees["0.27.1"], Store.open(shared_cache))


@pytest.fixture(scope="module")
def deps(env, shared_cache) -> Path:
    """flashinfer's import-time dependencies, installed once into the store."""
    store = Store.open(shared_cache)
    key = "-".join(WHEELS["deps"]).replace("=", "").replace(".", "_")
    dest = store.root / "derived" / f"flashinfer-deps-{key}"
    with store.mutex(f"flashinfer-deps-{key}"):
        if not (dest / ".ready").exists():
            subprocess.run([str(env.python), "-m", "pip", "install", "-q", "--no-deps",
                            "--target", str(dest), *WHEELS["deps"]], check=True)
            (dest / ".ready").write_text("ok\n")
    return dest


def _flashinfer(shared_cache: Path, version: str) -> Path:
    """The release's wheel, fetched by sha256 and unpacked once in the store: every member but
    ``flashinfer/data/`` (the CUDA sources and headers its JIT compiles, up to 430 MB of a
    release's 680; nothing here compiles, and the modules only name those paths)."""
    w = WHEELS["wheels"][version]
    store = Store.open(shared_cache)
    blob = store.fetch_blob(w["url"], w["sha256"], w["size"], f"flashinfer-python {version}",
                            Progress(False))
    dest = store.root / "derived" / f"flashinfer-nodata-{w['sha256']}"
    with store.mutex(f"flashinfer-{w['sha256']}"):
        if not (dest / ".ready").exists():
            with zipfile.ZipFile(blob) as z:
                z.extractall(dest, [n for n in z.namelist() if not n.startswith("flashinfer/data/")])
            (dest / ".ready").write_text(version + "\n")
    return dest


def _probe(env: testenv.TestEnv, tree: Path, releases: dict[str, list[Path]]) -> dict[str, dict]:
    """Both gates' answers for each release, from ``tree``'s vLLM (one forked child per release)."""
    e = env.env()
    e["PYTHONPATH"] = os.pathsep.join([str(tree), e["PYTHONPATH"]])
    jobs = [[version, [str(p) for p in paths]] for version, paths in releases.items()]
    res = subprocess.run([str(env.python), "-c", PROBE, json.dumps(GRID), json.dumps(jobs)], cwd=tree, env=e,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    answers = [json.loads(line) for line in res.stdout.splitlines() if line.startswith('{"version"')]
    assert [a["version"] for a in answers] == list(releases), res.stdout[-3000:]
    for a in answers:
        assert a["file"] == str(tree / "vllm" / "utils" / "flashinfer.py"), a["file"]
        release = releases[a["version"]][0]
        assert a["flashinfer"] == str(release / "flashinfer" / "__init__.py"), (a["version"], a["flashinfer"])
    return {a["version"]: a for a in answers}


@pytest.fixture(scope="module")
def answers(trees, env, deps, shared_cache) -> dict[str, dict[str, dict]]:
    """Each tree's answers for every release (fetched and unpacked into the store first)."""
    releases = {version: [_flashinfer(shared_cache, version), deps] for version in WHEELS["wheels"]}
    return {pin: _probe(env, tree, releases) for pin, tree in trees.items()}


@pytest.mark.parametrize("version", list(WHEELS["wheels"]))
def test_patched_gate_matches_028_gate(version, answers):
    ours, upstream = answers["0.27.1"][version], answers["0.28.0"][version]
    # The layer that consults the gate exists only where the API does: compare
    # what the patched 0.27.1 would accept with 0.28.0's answer.
    accepted = {k: ours["api"] and v for k, v in ours["gate"].items()}
    assert accepted == upstream["gate"], {
        k: (accepted[k], upstream["gate"][k]) for k in accepted if accepted[k] != upstream["gate"][k]
    }
    assert ours["api"], "FlashInfer's SM120 sparse MLA API did not import: the test proves nothing"
    supported = {k for k, v in accepted.items() if v}
    # The table really was read: every release has (32, 512), and top-k 192
    # arrived in 0.6.18.
    assert "32,512" in supported
    assert ("32,192" in supported) == (version not in ("0.6.14", "0.6.16.post3"))
