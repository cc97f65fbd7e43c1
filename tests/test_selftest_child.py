"""dsv4patch.proofs.selftest.child against vLLM 0.26.0's own Python, as far as it goes without a GPU.

The runner starts the real child (``dsv4patch/proofs/selftest/child.py``) in the 0.26.0 CPU test venv with
the stock wheel's Python files, and again with the pin's patched tree: the child imports vLLM,
installs SM120's top-k route (``--force-sm120-topk``; it refuses a vLLM whose indexer asks for the
SM120 family anywhere but the decode top-k choice), reports its fingerprint, registers the oracle's
load format and builds ``LLM(...)``, which ends the child without a GPU: a ``crash`` whose error
comes from inside vLLM's engine, after every step of the child's own.  What stands in for the GPU:
``tests/vllm026_cpu_platform.py`` (vLLM's CUDA platform answering as an H200), installed through a
``sitecustomize`` on the child's PYTHONPATH.  The engine itself needs the H200 (selftest_h200.sh).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4patch.proofs.selftest import cases, runner

ROOT = Path(__file__).resolve().parent.parent
CHILD = ROOT / "dsv4patch" / "proofs" / "selftest" / "child.py"
ROUTE = "vllm.model_executor.layers.sparse_attn_indexer.current_platform answers SM120 family"


def _children(tmp_path: Path, vllm026, vllm_dir: Path, names: list[str]) -> list[runner.EngineRun]:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "import vllm026_cpu_platform\nvllm026_cpu_platform.fake_cuda_platform()\n")
    env = vllm026.env(vllm_dir)
    env["PYTHONPATH"] = f"{hook}:{vllm_dir}"
    chosen = cases.select(cases.all_cases(force_sm120_topk=True), names)
    return runner.run_cases(chosen, child=[str(vllm026.python), str(CHILD)], work=tmp_path / "work",
                            deadlines=runner.Deadlines(start=600, first_case=60, case=60, total=1500), parallel=2,
                            env=env)


def _error(run: runner.EngineRun) -> dict:
    events = [json.loads(line) for line in Path(run.log).with_suffix(".events").read_text().splitlines()]
    return next(e for e in events if e["event"] == "error")


@pytest.mark.slow  # the pin's tree and CPU test venv (shared cache), the stock wheel (303 MB, cached); ~3 min
@pytest.mark.parametrize("variant", ["stock", "patched"])
def test_every_engine_gets_through_the_childs_steps_to_vllms_gpu_worker(tmp_path, vllm026, variant):
    """Stock: every engine of the case set (the config of each, V1 and DSpark's V2 runner, built by vLLM
    0.26.0 from the child's own LLM arguments); patched: SM120's route, which the H200 run forces there."""
    vllm_dir = vllm026.site if variant == "stock" else vllm026.tree
    names = ([f"{e.name}/short_b1" for e in cases.ENGINES] if variant == "stock" else []) + ["mtp1-sm120topk/short_b5"]
    runs = _children(tmp_path, vllm026, vllm_dir, names)
    assert sorted(r.engine.name for r in runs) == sorted(n.split("/")[0] for n in names)
    for run in runs:
        log = Path(run.log).read_text(errors="replace")
        assert run.fingerprint is not None, log[-3000:]
        assert run.fingerprint["vllm_version"] == "0.26.0"
        assert run.fingerprint["vllm_file"] == str(vllm_dir / "vllm" / "__init__.py")
        assert run.fingerprint.get("topk_route") == (ROUTE if run.engine.sm120_topk else None)
        # the child's own steps all ran; vLLM built the engine config and stopped at the first step
        # that needs a GPU: the worker's device check (gpu_worker.py, init_device)
        assert run.outcome == "crash" and run.loaded == [], (run.engine.name, run.outcome, run.detail)
        error = _error(run)
        assert "0 devices" in error["error"], (run.engine.name, error["error"])
        assert "in init_device" in error["traceback"] and "LLM(" in error["traceback"], error["traceback"][-3000:]
        assert [(c.verdict, c.error.startswith("engine start: ")) for c in run.cases] == [("crash", True)]
