"""The end-to-end harness's hooks into vLLM, against vLLM 0.26.0's own Python (PyPI wheel).

``tests/gpu/e2e/run_e2e.py`` reaches into vLLM in places that a stand-in
cannot vouch for (the engine arguments it passes and the tiny models' configs are
checked here too): ``ForceTokens`` (forced-decode scoring) subclasses vLLM's
``LogitsProcessor`` and follows its ``BatchUpdate`` protocol, ``-tk120``
replaces ``current_platform`` in ``vllm.model_executor.layers.sparse_attn_indexer``,
and the acceptance trace wraps ``Scheduler.make_spec_decoding_stats``.
Here both run against the Python files of the 0.26.0 wheel the device runs
(sha256 from the lock, through the store), in the CPU test venv of the 0.26.0
pin (torch 2.13.0 CPU); no GPU is needed for either.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import LOCK, ROOT
from dsv4patch import testenv
from dsv4patch.kernels import stock
from dsv4patch.lock import load
from dsv4patch.store import Store

pytestmark = [pytest.mark.network, pytest.mark.slow]

PROBE = r"""
import importlib.util, json, sys
from pathlib import Path
import torch
s = importlib.util.spec_from_file_location("r", sys.argv[1])
r = importlib.util.module_from_spec(s); sys.modules["r"] = r; s.loader.exec_module(r)
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality
out = {}
FT = r.force_tokens_processor()
out["subclass"] = issubclass(FT, LogitsProcessor)
lp = FT(None, torch.device("cpu"), False)
out_a, out_b, out_c = [], [], [4]
sp = lambda toks: SamplingParams(temperature=0.0, max_tokens=3, extra_args={r.FORCE_KEY: toks})
lp.update_state(BatchUpdate(batch_size=3, removed=[], moved=[], added=[
    (0, sp([3, 1, 2]), [9], out_a), (1, sp([5, 6]), [9], out_b), (2, SamplingParams(temperature=0.0), [9], out_c)]))
torch.manual_seed(0)
logits = torch.randn(3, 8)
before = logits.clone()
got = lp.apply(logits)
out["argmax"] = [int(got[0].argmax()), int(got[1].argmax())]
out["raw_kept"] = bool(got[0, 3] == before[0, 3]) and bool(got[1, 5] == before[1, 5])
out["unforced_untouched"] = bool(torch.equal(got[2], before[2]))
out_a.append(3); out_b.append(5)  # vLLM appends each sampled token to the live lists
lp.update_state(BatchUpdate(batch_size=3, removed=[], added=[], moved=[(0, 1, MoveDirectionality.SWAP)]))
got = lp.apply(torch.randn(3, 8))
out["after_swap_argmax"] = [int(got[0].argmax()), int(got[1].argmax())]
lp.update_state(BatchUpdate(batch_size=2, removed=[1], added=[], moved=[]))
out["after_remove_targets"] = lp.state.targets()
out["route"] = r.install_sm120_topk_route()
import vllm.model_executor.layers.sparse_attn_indexer as sai
import vllm.platforms as vp
out["indexer_family_120"] = sai.current_platform.is_device_capability_family(120)
out["indexer_is_cuda_delegates"] = sai.current_platform.is_cuda() == vp.current_platform.is_cuda()
out["global_platform_untouched"] = type(vp.current_platform).__name__ != "Sm120TopkRoute"
# what the child passes LLM() for the diagnostic suffixes (-sync, -eager) and always: vLLM's own fields
import dataclasses
from vllm.engine.arg_utils import EngineArgs
fields = {f.name for f in dataclasses.fields(EngineArgs)}
out["engine_args_known"] = sorted({"async_scheduling", "enforce_eager", "compilation_config", "kv_cache_memory_bytes",
                                   "logits_processors", "speculative_config", "max_num_seqs"} - fields)
# compilation_config keys the child sets (-fd, -bm)
from vllm.config import CompilationConfig
out["compilation_keys_known"] = sorted({"cudagraph_mode", "cudagraph_capture_sizes"}
                                       - {f.name for f in dataclasses.fields(CompilationConfig)})
# both tiny models (the diagnostic one has no compressed layers) load through vLLM's own config class
s2 = importlib.util.spec_from_file_location("tiny", sys.argv[2]); tiny = importlib.util.module_from_spec(s2)
s2.loader.exec_module(tiny)
from vllm.transformers_utils.config import get_config
import tempfile
d = tempfile.mkdtemp()
for name, ratios in (("tiny", None), ("swa", [0, 0, 0, 0, 0])):
    hf = get_config(str(tiny.write_model(Path(d) / name, ratios)), trust_remote_code=False)
    out[f"config_{name}"] = [type(hf).__name__, list(hf.compress_ratios)]
# --zero-kv: the caches as vLLM's own bind_kv_cache binds them (two layers share one backing, as packed
# layouts do; a DeepSeek-V4 module without a cache keeps torch.tensor([])), zeroed through the forward context
import inspect, types
from vllm import LLM
from vllm.v1.worker.utils import bind_kv_cache
backing = torch.ones(64, dtype=torch.int8)
kvs = {"model.layers.0.self_attn.attn": torch.ones(2, 4, dtype=torch.bfloat16),
       "model.layers.1.self_attn.attn": backing[:32], "model.layers.2.self_attn.attn": backing[32:]}
fc = {n: types.SimpleNamespace() for n in kvs}
fc["model.layers.3.self_attn.compressor"] = types.SimpleNamespace(kv_cache=torch.tensor([]))
bind_kv_cache(kvs, fc, [], 1)
worker = types.SimpleNamespace(vllm_config=types.SimpleNamespace(
    compilation_config=types.SimpleNamespace(static_forward_context=fc)))
out["zeroed"] = r.zero_kv_caches(worker)
out["all_zero"] = not any(bool(t.any()) for t in kvs.values())
out["llm_api"] = [list(inspect.signature(LLM.collective_rpc).parameters)[1],
                  list(inspect.signature(LLM.reset_prefix_cache).parameters)[1:]]
# --trace-split: vLLM's own split_decodes_and_prefills, rebound in the builders' modules
events = []
import threading
ready = threading.Event()  # the child's gate: splits before the engine is ready are not counted
status = r.install_split_trace(lambda **kw: events.append(kw), 1, ready)
out["split_trace"] = {k.rsplit(".", 1)[-1]: v.split(":")[0] for k, v in status.items()}
import vllm.v1.attention.backends.mla.sparse_swa as swa
cam = types.SimpleNamespace(max_query_len=8, num_reqs=3, num_actual_tokens=14, is_prefilling=None,
                            query_start_loc_cpu=torch.tensor([0, 3, 6, 14], dtype=torch.int32))
swa.split_decodes_and_prefills(cam, decode_threshold=4)  # warm-up: no event (split_events has one, below)
ready.set()
out["split_results"] = [list(swa.split_decodes_and_prefills(cam, decode_threshold=3)),
                        list(swa.split_decodes_and_prefills(cam, 2))]
out["split_events"] = [{k: e[k] for k in ("event", "who", "threshold", "result", "query_lens")} for e in events]
# acceptance trace: vLLM's own Scheduler.make_spec_decoding_stats, wrapped; called as update_from_output calls it
log, out["accept_trace"] = r.install_accept_trace()
from vllm.v1.core.sched.scheduler import Scheduler
fake = types.SimpleNamespace(log_stats=True, num_spec_tokens=2,
                             requests={"7-abcd1234": types.SimpleNamespace(_output_token_ids=[5, 6, 7])})
stats = Scheduler.make_spec_decoding_stats(fake, None, num_draft_tokens=2, num_accepted_tokens=1,
                                           num_invalid_spec_tokens=None, request_id="7-abcd1234")
Scheduler.make_spec_decoding_stats(fake, stats, 2, 0, None, "7-abcd1234")  # positional, nothing accepted
out["accept_log"] = log
out["accept_stats"] = [stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens]
# ... where the request's output is still the tokens before the step (pos), with request_id by keyword
src = inspect.getsource(Scheduler.update_from_output)
out["accept_before_append"] = 0 < src.index("self.make_spec_decoding_stats(") < src.index("self._update_request_with_output(")
out["accept_by_request_id"] = "request_id=req_id" in src
# -na: the speculative_config keys are vLLM's own, and it takes an acceptance rate of 0 at every position
from vllm.config import SpeculativeConfig
out["spec_keys_known"] = sorted(set(r.speculative_config("mtp2", {"na"}))
                                - {f.name for f in dataclasses.fields(SpeculativeConfig)})
out["synthetic_rates"] = SpeculativeConfig._resolve_synthetic_acceptance_rates(5, [0.0] * 5, None)
from vllm.v1.spec_decode.utils import unconditional_to_conditional_rates
out["conditional_rates"] = unconditional_to_conditional_rates([0.0] * 5)
import vllm.v1.worker.gpu.spec_decode.rejection_sampler as v2rs  # DSpark's (V2 runner) sampler reads the same rates
out["v2_synthetic"] = 'rejection_sample_method == "synthetic"' in inspect.getsource(v2rs.RejectionSampler.__init__)
print(json.dumps(out))
"""

# vLLM 0.26.0's own V1 rejection sampler (MTP), its Triton kernel under the interpreter: two requests whose drafts
# all equal the target's argmax; standard sampling accepts them all, synthetic at rate 0 (-na) none
REJECT = r"""
import json, types, torch
from vllm.v1.sample.rejection_sampler import rejection_sample, PLACEHOLDER_TOKEN_ID
logits = torch.full((4, 8), -5.0)
argmax = [3, 6, 1, 2]
for i, t in enumerate(argmax):
    logits[i, t] = 5.0
meta = types.SimpleNamespace(all_greedy=True, all_random=False, generators={}, temperature=None)
out = {}
for mode, rates in (("standard", None), ("na", torch.zeros(2))):
    got = rejection_sample(torch.tensor(argmax, dtype=torch.int32), [2, 2], 2, torch.tensor([2, 4], dtype=torch.int32),
                           None, logits, torch.tensor([[7], [7]], dtype=torch.int32), meta,
                           synthetic_mode=rates is not None, synthetic_conditional_rates=rates)
    out[mode] = [[int(x) if int(x) != PLACEHOLDER_TOKEN_ID else None for x in row] for row in got]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def vllm_026(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> dict:
    from dsv4patch.main import main

    base = tmp_path_factory.mktemp("e2e026")
    tree = base / "tree"
    assert main(["apply", "--lock", str(LOCK), "--pin", "0.26.0", "--tree", str(tree), "--cache-dir",
                 str(shared_cache), "--no-build", "--format", "json"]) == 0
    store = Store.open(shared_cache)
    env = testenv.ensure(tree, store, torch="2.13.0")  # 0.26.0 pins torch 2.11 (CUDA); CPU build here
    site = base / "site"
    wheel = stock.wheel_path(store, stock.wheel_for(load(LOCK).pin("0.26.0"), "x86_64"))
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.endswith(".py") or ".dist-info/" in name or name.endswith((".json", ".jinja")):
                zf.extract(name, site)
    return {"python": str(env.python), "site": site, "tree": tree, "wheel": wheel}


@pytest.fixture(scope="module")
def tiny_026(vllm_026: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny DeepSeek-V4 of make_tiny_dsv4.py, written by the 0.26.0 test venv's Python."""
    out = tmp_path_factory.mktemp("tiny026") / "tiny"
    write = ("import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; import make_tiny_dsv4 as m; "
             "m.write_model(Path(sys.argv[2]), None)")
    subprocess.run([vllm_026["python"], "-c", write, str(ROOT / "tests/gpu/e2e"), str(out)], check=True, timeout=120,
                   env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")})
    return out


def test_force_tokens_and_sm120_route_against_vllm_026(vllm_026: dict) -> None:
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    e.update(PYTHONPATH=str(vllm_026["site"]), CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([vllm_026["python"], "-c", PROBE, str(ROOT / "tests/gpu/e2e/run_e2e.py"),
                          str(ROOT / "tests/gpu/e2e/make_tiny_dsv4.py")],
                         env=e, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out == {
        "subclass": True, "argmax": [3, 5], "raw_kept": True, "unforced_untouched": True,
        # rows swapped: row 0 now decodes [5, 6] (next: 6), row 1 [3, 1, 2] (next: 1)
        "after_swap_argmax": [6, 1], "after_remove_targets": [[0, 6]],
        "route": "vllm.model_executor.layers.sparse_attn_indexer.current_platform answers SM120 family "
                 "(1 call site(s) in the module)",
        "indexer_family_120": True, "indexer_is_cuda_delegates": True, "global_platform_untouched": True,
        "engine_args_known": [], "compilation_keys_known": [],
        "config_tiny": [out["config_tiny"][0], [0, 4, 128, 4, 0]], "config_swa": [out["config_tiny"][0], [0] * 5],
        # two storages (the shared backing once), 16 + 64 bytes, all zero after
        "zeroed": [2, 80], "all_zero": True,
        "llm_api": ["method", ["reset_running_requests", "reset_connector"]],
        "split_trace": {"sparse_swa": "traced", "indexer": "traced", "sparse_mla": "traced", "compressor": "traced",
                        "sparse_mla_attention": "traced"},
        # two 3-token prompts scheduled as decodes beside an 8-token one (threshold 1 + k = 3); one event (limit 1)
        "split_results": [[2, 1, 6, 8], [0, 3, 0, 14]],
        "split_events": [{"event": "split", "who": "sparse_swa", "threshold": 3, "result": [2, 1, 6, 8],
                          "query_lens": [3, 3, 8]}],
        # one accepted draft at output position 3, under the external id; vLLM's own stats still counted
        "accept_trace": "traced", "accept_log": {"7": [[3, 1]]}, "accept_stats": [2, 4, 1],
        "accept_before_append": True, "accept_by_request_id": True,
        "spec_keys_known": [], "synthetic_rates": [0.0] * 5, "conditional_rates": [0.0] * 5, "v2_synthetic": True,
    }, out
    assert "DeepseekV4" in out["config_tiny"][0], out


def test_na_rejects_every_draft_in_vllm_026s_own_rejection_sampler(vllm_026: dict) -> None:
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    e.update(PYTHONPATH=str(vllm_026["site"]), CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1")
    res = subprocess.run([vllm_026["python"], "-c", REJECT], env=e, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    # standard: both drafts of each request match, so both are kept and the bonus token (7) follows;
    # -na: the first draft is rejected and replaced by the target's own choice at query row 0, nothing after
    assert out == {"standard": [[3, 6, 7], [1, 2, 7]], "na": [[3, None, None], [1, None, None]]}, out


def test_engine_config_builds_for_every_method_and_its_na_twin(vllm_026: dict, tiny_026: Path) -> None:
    """vLLM 0.26.0's own EngineArgs -> VllmConfig for the tiny model: plain, MTP 1-3, DSpark 5, each -na."""
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    e.update(PYTHONPATH=str(vllm_026["site"]), CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([vllm_026["python"], str(ROOT / "tests/gpu/e2e/validate_config_cpu.py"), str(tiny_026)],
                         env=e, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ok = {ln.split()[1].rstrip(":") for ln in res.stdout.splitlines() if ln.startswith("OK ")}
    assert ok == {"plain", "mtp1", "mtp2", "mtp3", "dspark5", "mtp1-na", "mtp2-na", "mtp3-na", "dspark5-na"}, res.stdout
    assert "draft=('dspark', 5, ['DSparkDraftModel']" in res.stdout and "v2_runner=True" in res.stdout
    # the references (plain, each -na twin) ask for their top logprobs, and vLLM's checks accept that
    ranked = {ln.split()[1].rstrip(":") for ln in res.stdout.splitlines()
              if ln.startswith("OK ") and " logprobs=5" in ln}  # run_e2e.RANKED
    assert ranked == {"plain", "mtp1-na", "mtp2-na", "mtp3-na", "dspark5-na"}, res.stdout


# What the harness's engine process does before LLM() builds its config, then vLLM 0.26.0's own config
# building for the tiny DeepSeek-V4 (CPU; validate_config_cpu's stand-in CUDA platform), then whether
# DeepseekV4Attention.attention_impl came out wrapped by @eager_break_during_capture
BREAK = r"""
import importlib.util, json, os, sys
def load(name, path):
    s = importlib.util.spec_from_file_location(name, path); m = importlib.util.module_from_spec(s)
    sys.modules[name] = m; s.loader.exec_module(m); return m
r = load("r", sys.argv[1])
v = load("v", sys.argv[2])
r.breakable_env(set(sys.argv[4].split(",")) - {""})
v._fake_cuda_platform()
from vllm.engine.arg_utils import EngineArgs
EngineArgs(model=sys.argv[3], load_format="dummy", skip_tokenizer_init=True, kv_cache_dtype="fp8", block_size=256,
           max_model_len=4096, max_num_seqs=32, seed=0).create_engine_config()
print(json.dumps({"env": os.environ.get("VLLM_USE_BREAKABLE_CUDAGRAPH"), "break": r.attention_break()}))
"""


def test_attention_is_a_graph_break_only_when_the_flag_precedes_the_import(vllm_026: dict, tiny_026: Path) -> None:
    """vLLM 0.26.0 turns VLLM_USE_BREAKABLE_CUDAGRAPH on for DeepSeek-V4 while building the config, after that
    has imported the attention module unwrapped: in that process piecewise graphs have no attention break.
    The harness sets the flag first (breakable_env); -unsplit is runs 1-8's order."""
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "VLLM_USE_BREAKABLE_CUDAGRAPH")}
    e.update(PYTHONPATH=str(vllm_026["site"]), CUDA_VISIBLE_DEVICES="")
    got = {}
    for flags in ("unsplit", ""):
        res = subprocess.run([vllm_026["python"], "-c", BREAK, str(ROOT / "tests/gpu/e2e/run_e2e.py"),
                              str(ROOT / "tests/gpu/e2e/validate_config_cpu.py"), str(tiny_026), flags],
                             env=e, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        got[flags or "default"] = json.loads(res.stdout.strip().splitlines()[-1])
    # vLLM itself ends with the flag on, but its attention was imported before: no break (runs 1-8)
    assert got == {"unsplit": {"env": "1", "break": "not wrapped"}, "default": {"env": "1", "break": "wrapped"}}, got


def test_status_installed_sh_reports_both_sites_from_the_carried_sdist(vllm_026: dict, shared_cache: Path,
                                                                       tmp_path: Path) -> None:
    """``status_installed.sh`` (run on the H200 in run 10) against 0.26.0's own wheel files, here without a GPU.

    The sites are laid out as ``device.sh`` lays them out: the stock wheel's
    vLLM, and a copy with the patched tree's files over it (no kernel wheel
    here: fixes 7-10 then read ``missing``). The lock's patched tree is made
    from the sdist that ``pack_status.py`` carries, in a cache of its own.
    """
    e2e, src = tmp_path / "e2e", tmp_path / "src"
    (e2e / "deps").mkdir(parents=True)
    (e2e / "deps" / ".complete").touch()
    shutil.copytree(vllm_026["site"], e2e / "vllm-stock")
    shutil.copytree(vllm_026["site"], e2e / "vllm-patched")
    # the files pack.py puts in .e2e/meta/patched, laid over the wheel's as device.sh lays them
    spec = importlib.util.spec_from_file_location("e2e_pack", ROOT / "tests/gpu/e2e/pack.py")
    assert spec and spec.loader
    pack = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look it up
    spec.loader.exec_module(pack)
    tree = vllm_026["tree"]
    changed = pack.patched_files(tree, vllm_026["wheel"])
    assert changed
    for rel in changed:
        (e2e / "vllm-patched" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tree / rel, e2e / "vllm-patched" / rel)
    subprocess.run([sys.executable, str(ROOT / "tests/gpu/e2e/pack_status.py"), "--out", str(src / "status"),
                    "--cache-dir", str(shared_cache)], check=True, timeout=600, cwd=ROOT)
    assert [p.name for p in (src / "status" / "cache" / "blobs" / "sha256").iterdir()] == \
        [load(LOCK).pin("0.26.0").source.sha256]
    res = subprocess.run(["bash", str(ROOT / "tests/gpu/e2e/status_installed.sh")], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "E2E_DIR": str(e2e), "E2E_SRC": str(src),
                                           "OUT": str(tmp_path / "out"), "PYTHON": sys.executable})
    assert res.returncode == 0, res.stderr[-2000:]
    text = (tmp_path / "out" / "status_installed.txt").read_text()
    reports = [json.loads(part[part.index("{"):part.rindex("}") + 1])
               for part in text.split("## ")[1:] if part.startswith(("patched (json)", "stock (json)"))]
    patched, stock_rep = reports
    assert patched["installed"]["package"] == str(e2e / "vllm-patched" / "vllm")
    states = {n[:4]: p["state"] for n, p in patched["patches"].items()}
    assert states == {**{f"000{i}": "present" for i in range(1, 7)}, **{f"{i:04d}": "missing" for i in (7, 8, 9, 10)}}
    assert {n[:4]: p["state"] for n, p in stock_rep["patches"].items()} == \
        {**{f"000{i}": "stock" for i in range(1, 7)}, **{f"{i:04d}": "missing" for i in (7, 8, 9, 10)}}
    assert not patched["ok"] and not stock_rep["ok"]
    assert text.count("exit code: 1") == 4 and "no GPU" in text
