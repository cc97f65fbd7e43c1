"""A STAND-IN for the self-test's engine child (dsv4patch/proofs/selftest/child.py), for machines without a GPU.

The real child needs vLLM and a CUDA GPU.  This script speaks the same
protocol (argv: SPEC.json PROGRESS.jsonl; JSON-line events) so the runner's
deadlines, process-group kill, crash and refusal handling and the oracle's
verdicts run for real.  What it generates is the designed chain, read from the
same model.py the real child loads, with the spec-decode counters the design
predicts; STANDIN_MODE changes that to exercise each verdict:

  pass (default), differs (engine mtp1: token 7 of request 1 moved on by one),
  hang_case (sleeps in the second prompt set), hang_start (never ready),
  busy_start (never ready either, but working on the CPU all along, as a slow start does),
  with STANDIN_CUDA=1 (a GPU node, tests/gpu/selftest_probe_h200.py) both start modes hold a CUDA context
  first, and hang_start then waits on a kernel that never retires (torch.cuda._sleep) instead of sleeping,
  crash_case (exits 3 in the first prompt set), refuse (DSpark engines raise
  fix 5's refusal at start), all_accept (reports every draft accepted),
  bad_event (a case_done whose tokens are not integers), flood (prints 40 MiB
  to its log at start, then passes), null_block (DSpark's debug check reports
  bytes written into block 0; otherwise it reports one layer measured, none).

``--probe`` answers the environment probe as the real child does, for a
STAND-IN GPU (STANDIN_GPU: "h200" by default, "none" for a machine without one,
"small" for one with 4 GiB free; STANDIN_GPUS=N: N such devices; STANDIN_PROBE_DELAY=S: it answers after S seconds, as a node whose torch and
vLLM import slowly): the sizing and the no-GPU paths run for real.
Like vLLM 0.26.0's engine config, a speculative engine (MTP, DSpark) asked for pipeline parallelism is refused
at start with vLLM's own message (``config/model.py:1240-1247``, for the draft); ``engine_ready`` reports the
spec's TP and PP sizes
(what the real child reads back from vLLM's parallel config) and the fingerprint the CUDA_VISIBLE_DEVICES it
was given.
The third argument (the stacks file) is accepted and written by the hang modes
the way faulthandler's watchdog would (a dump of this process's stacks).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"standin_{name}", ROOT / "dsv4patch" / "proofs" / "selftest" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def probe() -> dict:
    gpu = os.environ.get("STANDIN_GPU", "h200")
    devices = []
    if gpu != "none":
        total = 150_106_341_376
        free = 4 * 2**30 if gpu == "small" else total - 600 * 2**20
        for i in range(int(os.environ.get("STANDIN_GPUS", "1"))):
            devices.append({"index": i, "name": "STAND-IN H200", "capability": "9.0", "free_bytes": free,
                            "total_bytes": total})
    return {"python": sys.executable, "vllm": "0.26.0", "torch": "2.11.0", "torch_cuda": "13.0",
            "pytest": "9.0.0", "triton": "3.6.0", "devices": devices}


def main() -> int:
    if sys.argv[1] == "--probe":
        time.sleep(float(os.environ.get("STANDIN_PROBE_DELAY", "0")))  # a node whose torch and vLLM import slowly
        print(json.dumps(probe()))
        return 0
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2]).open("a", buffering=1)
    mode = os.environ.get("STANDIN_MODE", "pass")
    engine = spec["engine"]

    def emit(event: str, **kw: object) -> None:
        kw["event"] = event
        kw["t"] = time.time()
        out.write(json.dumps(kw) + "\n")
        out.flush()

    model = _load("model")
    emit("fingerprint", data={"standin": True, "python": sys.executable,
                              "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
    stacks = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    if mode == "flood":
        chunk = "x" * 1023 + "\n"
        for _ in range(40 * 1024):
            sys.stdout.write(chunk)
        sys.stdout.flush()
    if mode in ("hang_start", "hang_case", "busy_start") and stacks is not None:
        import faulthandler
        import signal

        fh = stacks.open("a")
        faulthandler.register(signal.SIGUSR1, file=fh, all_threads=True)
    if mode in ("hang_start", "busy_start") and os.environ.get("STANDIN_CUDA") == "1":
        import torch

        torch.zeros(1, device="cuda")  # a CUDA context, as an engine at start holds one
        if mode == "hang_start":
            torch.cuda._sleep(1 << 62)  # a spinning kernel: the GPU busy, the host blocked behind it
            torch.cuda.synchronize()
    if mode == "hang_start":
        time.sleep(3600)
    if mode == "busy_start":  # what vLLM's graph capture did in gc.collect() on the H200: the host busy, no GPU work
        end = time.monotonic() + 3600
        while time.monotonic() < end:
            sum(i * i for i in range(10_000))
    if mode == "refuse" and engine["method"] == "dspark":
        print("RuntimeError: DeepSeek-V4 sparse MLA on SM120: FlashInfer lacks (num_q_heads=64, top_k=192); "
              "needs flashinfer-ai/flashinfer#4380", file=sys.stderr)
        emit("error", error="RuntimeError: FlashInfer lacks (64, 192): flashinfer-ai/flashinfer#4380")
        return 1
    tp, pp = int(spec.get("tensor_parallel_size", 1)), int(spec.get("pipeline_parallel_size", 1))
    if engine["method"] != "plain" and pp > 1:
        refusal = ("NotImplementedError: Pipeline parallelism is not supported for this model. Supported models "
                   "implement the `SupportsPP` interface.")
        print(refusal, file=sys.stderr)
        emit("error", error=refusal)
        return 1
    if os.environ.get("STANDIN_READY_DELAY"):
        time.sleep(float(os.environ["STANDIN_READY_DELAY"]))
    emit("engine_ready", tensor_parallel_size=tp, pipeline_parallel_size=pp)
    for i, pset in enumerate(spec["prompt_sets"]):
        emit("case_start", case=pset["name"])
        if mode == "hang_case" and i == 1:
            emit("step", running=3, waiting=0, tokens=12)  # as the real child's StepMonitor reports a batch
            time.sleep(3600)
        if mode == "crash_case":
            print("RuntimeError: CUDA error: an illegal memory access was encountered", file=sys.stderr)
            sys.stderr.flush()
            os._exit(3)
        tokens = [model.DESIGN.chain(p[-1], n) for p, n in zip(pset["prompts"], pset["max_tokens"], strict=True)]
        if mode == "differs" and engine["name"] == "mtp1" and len(tokens) > 1:
            tokens[1][7] = model.DESIGN.successor[tokens[1][7]]
        counters = {}
        if engine["method"] != "plain":
            drafted = accepted = 0
            for seq in tokens:
                p = 0
                while p < len(seq) - 1:
                    if engine["method"] == "mtp":
                        drafts, t = [], seq[p]
                        for _ in range(engine["k"]):
                            t = model.DESIGN.mtp_draft(t)
                            drafts.append(t)
                    else:
                        drafts = model.DESIGN.dspark_drafts(seq[p], engine["k"])
                    a = 0
                    while a < engine["k"] and p + 1 + a < len(seq) and drafts[a] == seq[p + 1 + a]:
                        a += 1
                    drafted += engine["k"]
                    accepted += a
                    p += a + 1
            if mode == "all_accept":
                accepted = drafted
            counters = {"num_drafts": drafted // max(1, engine["k"]), "num_draft_tokens": drafted,
                        "num_accepted_tokens": accepted}
        gaps = [[round(model.GAIN - 0.04 * (j % 3), 4) for j in range(len(seq))] for seq in tokens]
        if mode == "bad_event":
            tokens = [["abc"] for _ in tokens]
        extra = {}
        if engine["method"] == "dspark":  # fix 3b's debug check, as the real child reports it
            written = {"worker 0: model.layers.4.attn.swa_cache": 656} if mode == "null_block" else {}
            extra["null_block"] = {"layers": 1, "written": written, "unmeasured": {}, "skipped": []}
        emit("case_done", case=pset["name"], tokens=tokens, gaps=gaps, not_top=[[] for _ in tokens], seconds=0.01,
             spec=counters, **extra)
    emit("child_done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
