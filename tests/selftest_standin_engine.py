"""A STAND-IN for the self-test's engine child (dsv4patch/selftest/child.py), for machines without a GPU.

The real child needs vLLM and a CUDA GPU.  This script speaks the same
protocol (argv: SPEC.json PROGRESS.jsonl; JSON-line events) so the runner's
deadlines, process-group kill, crash and refusal handling and the oracle's
verdicts run for real.  What it generates is the designed chain, read from the
same model.py the real child loads, with the spec-decode counters the design
predicts; STANDIN_MODE changes that to exercise each verdict:

  pass (default), differs (engine mtp1: token 7 of request 1 moved on by one),
  hang_case (sleeps in the second prompt set), hang_start (never ready),
  crash_case (exits 3 in the first prompt set), refuse (DSpark engines raise
  fix 5's refusal at start), all_accept (reports every draft accepted).
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
    spec = importlib.util.spec_from_file_location(f"standin_{name}", ROOT / "dsv4patch" / "selftest" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
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
    emit("fingerprint", data={"standin": True, "python": sys.executable})
    if mode == "hang_start":
        time.sleep(3600)
    if mode == "refuse" and engine["method"] == "dspark":
        print("RuntimeError: DeepSeek-V4 sparse MLA on SM120: FlashInfer lacks (num_q_heads=64, top_k=192); "
              "needs flashinfer-ai/flashinfer#4380", file=sys.stderr)
        emit("error", error="RuntimeError: FlashInfer lacks (64, 192): flashinfer-ai/flashinfer#4380")
        return 1
    emit("engine_ready")
    for i, pset in enumerate(spec["prompt_sets"]):
        emit("case_start", case=pset["name"])
        if mode == "hang_case" and i == 1:
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
        emit("case_done", case=pset["name"], tokens=tokens, gaps=gaps, not_top=[[] for _ in tokens], seconds=0.01,
             spec=counters)
    emit("child_done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
