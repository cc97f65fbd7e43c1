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
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4patch.proofs.selftest import cases, plan, runner

ROOT = Path(__file__).resolve().parent.parent
CHILD = ROOT / "dsv4patch" / "proofs" / "selftest" / "child.py"
ROUTE = "vllm.model_executor.layers.sparse_attn_indexer.current_platform answers SM120 family"


def _children(tmp_path: Path, vllm026, vllm_dir: Path, names: list[str], topology: plan.Topology | None = None,
              extra_env: dict[str, str] | None = None) -> list[runner.EngineRun]:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        # torch's and vLLM's imports here without the cyclic collector's rescans of the growing heap (issue
        # 39: ~20 % of these CPU children's time); on again before the child's own code runs
        f"import gc\ngc.disable()\nimport sys\nsys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "import vllm026_cpu_platform\nvllm026_cpu_platform.fake_cuda_platform()\ngc.enable()\n")
    env = vllm026.env(vllm_dir)
    env["PYTHONPATH"] = f"{hook}:{vllm_dir}"
    env.update(extra_env or {})
    chosen = cases.select(cases.all_cases(force_sm120_topk=True), names)
    return runner.run_cases(chosen, child=[str(vllm026.python), str(CHILD)], work=tmp_path / "work",
                            deadlines=runner.Deadlines(start=600, first_case=60, case=60, total=1500), parallel=2,
                            env=env, topology=topology)


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


@pytest.mark.slow  # as above, and two vLLM worker processes per engine that gets to them; ~4 min
def test_tensor_parallel_engines_reach_one_vllm_worker_per_rank_with_the_oracle_installed(tmp_path, vllm026):
    """TP 2: vLLM 0.26.0 builds the engine config from the child's own LLM(...) arguments (``child.llm_arguments``:
    tensor_parallel_size 2, the multiprocessing executor) and starts one worker process per rank; each stops at
    the first step that needs a GPU, its device check.  The workers are spawned, as vLLM does on a GPU node (CUDA
    is initialised in the engine's process there): each imports the child again and installs the oracle's load
    format and, for the diagnostic engine, SM120's route (its ``worker`` event says so)."""
    runs = _children(tmp_path, vllm026, vllm026.site, ["mtp1-sm120topk/short_b5", "dspark5/short_b1"],
                     plan.Topology(2, 1), {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"})
    assert sorted(r.engine.name for r in runs) == ["dspark5", "mtp1-sm120topk"]
    for run in runs:
        log = Path(run.log).read_text(errors="replace")
        assert run.fingerprint is not None and run.fingerprint["vllm_version"] == "0.26.0", log[-3000:]
        spec = json.loads(Path(run.log).with_suffix(".spec.json").read_text())
        assert (spec["tensor_parallel_size"], spec["pipeline_parallel_size"]) == (2, 1)
        assert run.outcome == "crash" and run.loaded == [], (run.engine.name, run.outcome, run.detail)
        error = _error(run)
        assert "WorkerProc initialization failed" in error["error"], error["error"]
        assert "multiproc_executor.py" in error["traceback"] and "LLM(" in error["traceback"]
        # The ranks stop at their device check; vLLM's executor ends the other rank when the first one fails, so
        # under load the second can be ended before it logs its own (seen once at load 5-8): that both started
        # and installed the oracle is what their ``worker`` events show.
        stopped = [ln for ln in log.splitlines() if "is out of bounds for 0 devices" in ln]
        assert 1 <= len(stopped) <= 2 and "in init_device" in log, log[-4000:]
        assert len(run.workers) == 2, run.workers
        for w in run.workers:
            assert "load format dsv4selftest_oracle" in w["installed"]
            assert (ROUTE in w["installed"]) == run.engine.sm120_topk


@pytest.mark.slow  # as above; ~3 min
def test_pipeline_parallel_plain_reaches_its_workers_and_vllm_refuses_every_draft(tmp_path, vllm026):
    """PP 2: the plain engine's config is built and its two stages' workers start (and stop at the device check);
    MTP and DSpark are refused by vLLM 0.26.0's own engine config before anything starts: the draft's parallel
    config takes the target's PP size and its classes lack SupportsPP (config/speculative.py:1195-1196,
    config/model.py:1240-1247).  So DSpark on the last PP rank (fix 3b's production fault) cannot be configured
    on this pin at all: ``refused``, with vLLM's message (docs/selftest.md)."""
    runs = {r.engine.name: r for r in _children(tmp_path, vllm026, vllm026.site,
                                                 ["plain/short_b1", "mtp1/short_b1", "dspark5/short_b1"],
                                                 plan.Topology(1, 2))}
    plain = runs["plain"]
    log = Path(plain.log).read_text(errors="replace")
    assert plain.outcome == "crash" and "WorkerProc initialization failed" in _error(plain)["error"], plain.detail
    # Its two stages' workers stop at the device check (one may be ended by the executor first, as above).
    assert 1 <= len([ln for ln in log.splitlines() if "is out of bounds for 0 devices" in ln]) <= 2, log[-4000:]
    for name in ("mtp1", "dspark5"):
        run = runs[name]
        assert run.outcome == "refused", (name, run.outcome, run.detail)
        assert run.detail.endswith("NotImplementedError: Pipeline parallelism is not supported for this model. "
                                   "Supported models implement the `SupportsPP` interface."), run.detail
        tb = _error(run)["traceback"]
        assert "create_speculative_config" in tb and "verify_with_parallel_config" in tb, tb[-2000:]
        assert [c.verdict for c in run.cases] == ["refused"]


NULL_BLOCK_CHECK = r"""
import importlib.util, json, sys
from types import SimpleNamespace as NS
import torch
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor, SlidingWindowSpec

spec = importlib.util.spec_from_file_location("child", sys.argv[1])
child = importlib.util.module_from_spec(spec)
spec.loader.exec_module(child)

NUM_BLOCKS, BLOCK = 8, 256
swa = SlidingWindowSpec(block_size=BLOCK, num_kv_heads=1, head_size=656, dtype=torch.uint8, sliding_window=128)
names = ["model.layers.4.attn.swa", "model.layers.3.attn.swa"]
config = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[KVCacheTensor(size=1, shared_by=[n]) for n in names],
                       kv_cache_groups=[KVCacheGroupSpec(layer_names=[names[1]], kv_cache_spec=swa),
                                        KVCacheGroupSpec(layer_names=[names[0]], kv_cache_spec=swa)])
# the draft's layer a strided view of a packed buffer (two layers' pages per block), the other a plain tensor
caches = {names[0]: torch.zeros(NUM_BLOCKS, 2, BLOCK, 656, dtype=torch.uint8)[:, 1],
          names[1]: torch.zeros(NUM_BLOCKS, BLOCK, 656, dtype=torch.uint8)}
context = {n: NS(kv_cache=[caches[n]]) for n in names}


def worker(draft_groups):
    runner = NS(speculator=NS(draft_kv_cache_group_ids=draft_groups), kv_cache_config=config,
                compilation_config=NS(static_forward_context=context))
    return NS(model_runner=runner)


workers = [worker([1]), worker([1]), NS(model_runner=NS(speculator=None))]  # two TP ranks, a stage without a draft
llm = NS(collective_rpc=lambda fn, args=(): [fn(w, *args) for w in workers])
out = {"snapshot": child._null_block(llm, "snapshot")}
caches[names[0]][1, 7] = 5   # the draft's own block: allowed
caches[names[1]][0, 0] = 9   # the target's layer (not a draft group): not measured
out["clean"] = child._null_block(llm, "compare")
caches[names[0]][0, 3, :10] = 1  # ten bytes of draft KV into the null block
out["dirty"] = child._null_block(llm, "compare")
context[names[0]] = NS(kv_cache=torch.zeros(2, NUM_BLOCKS, BLOCK, 328, dtype=torch.bfloat16))  # K and V first
out["odd"] = child._null_block(llm, "compare")
print(json.dumps(out))
"""


@pytest.mark.slow  # the 0.26.0 CPU test venv (torch, vLLM's KV cache config classes)
def test_the_null_block_check_counts_draft_writes_into_block_0_only(tmp_path, vllm026):
    """Fix 3b's debug check (``child.null_block_meter`` through ``_null_block``) on CPU tensors laid out as a
    DeepSeek-V4 sliding-window cache, in vLLM 0.26.0's own KVCacheConfig: the workers, their runner and the
    speculator are stand-ins (the real ones need a GPU); a write into a draft layer's block 0 is counted, a write
    elsewhere or into a layer outside the draft's groups is not, a layout it cannot read is named."""
    script = tmp_path / "check.py"
    script.write_text(NULL_BLOCK_CHECK)
    res = subprocess.run([str(vllm026.python), str(script), str(CHILD)], env=vllm026.env(), capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    skipped = ["worker 2: no draft KV cache groups on this worker (not a DFlash/DSpark speculator)"]
    assert out["snapshot"] == {"layers": 2, "written": {}, "unmeasured": {}, "skipped": skipped}
    assert out["clean"] == {"layers": 2, "written": {}, "unmeasured": {}, "skipped": skipped}
    assert out["dirty"]["written"] == {"worker 0: model.layers.4.attn.swa": 10, "worker 1: model.layers.4.attn.swa": 10}
    assert out["odd"]["unmeasured"] == {
        f"worker {r}: model.layers.4.attn.swa": "layout (2, 8, 256, 328): its first dimension is not the blocks"
        for r in (0, 1)}


def test_vllms_imports_run_without_the_collector_and_leave_the_start_up_heap_frozen(tmp_path: Path) -> None:
    """issue 39: the child's and each spawned worker's imports (torch, vLLM: ~670,000 objects) run with the
    cyclic collector off; after them one collection, the survivors frozen (never rescanned), the collector on
    again before the engine starts.  Checked in a fresh interpreter (the standard library only, as child.py's
    top is), and that both of the child's entry points take that path."""
    code = (
        "import gc, importlib.util, inspect, json, sys\n"
        "spec = importlib.util.spec_from_file_location('child', sys.argv[1])\n"
        "child = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(child)\n"
        "with child._imports_without_collector():\n"
        "    inside = gc.isenabled()\n"
        "    heap = [[i] for i in range(200000)]\n"
        "    loop = []\n"
        "    loop.append(loop)\n"
        "    del loop\n"
        "print(json.dumps({'inside': inside, 'after': gc.isenabled(), 'frozen': gc.get_freeze_count(),\n"
        "                  'users': [f.__name__ for f in (child.run, child.worker_setup)\n"
        "                            if '_imports_without_collector()' in inspect.getsource(f)]}))\n"
    )
    res = subprocess.run([sys.executable, "-c", code, str(CHILD)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["inside"] is False and got["after"] is True, got
    assert got["frozen"] >= 200000, got
    assert got["users"] == ["run", "worker_setup"], got
