"""The self-test's hang probe on a GPU node: a slow start told from a hang with the real tools.

The runner's verdict at engine start (``runner._outcome``: a kernel resident or the GPU busy is a hang; a
process working on the CPU on an idle GPU is a slow start, ``not-run``) rests on what nvidia-smi, cuda-gdb
and /proc say, which only a GPU node has.  This runs the runner (``runner.run_cases``) with the stand-in
engine (tests/selftest_standin_engine.py, STANDIN_CUDA=1) twice on that node: ``busy_start``, a CUDA context
and the host spinning in Python (what vLLM's graph capture did in ``gc.collect()`` on the H200), and
``hang_start``, a kernel that never retires (``torch.cuda._sleep``) with the host blocked on it.  Needs torch
with CUDA and the GPU tools; nothing else of the pack.  On the device:

    python3 tests/gpu/selftest_probe_h200.py        # writes $OUT/selftest-probe-h200.json

Expected: busy_start ``not-run`` ("a slow start, not a hang"), hang_start ``hang`` with the spinning kernel
resident (cuda-gdb) and the GPU busy.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dsv4patch.proofs.selftest import cases, runner  # noqa: E402


def one(mode: str, work: Path) -> dict[str, object]:
    work.mkdir(parents=True)
    env = {**os.environ, "STANDIN_MODE": mode, "STANDIN_CUDA": "1"}
    chosen = cases.select(cases.all_cases(force_sm120_topk=False), ["dspark5/short_b1"])
    t0 = time.monotonic()
    runs = runner.run_cases(chosen, child=[sys.executable, str(ROOT / "tests" / "selftest_standin_engine.py")],
                            work=work, deadlines=runner.Deadlines(start=25, first_case=20, case=20, total=240),
                            parallel=1, env=env)
    run = runs[0]
    ev = run.evidence
    return {"mode": mode, "outcome": run.outcome, "detail": run.detail, "seconds": round(time.monotonic() - t0, 1),
            "evidence": None if ev is None else {**ev.to_json(), "gpu_idle": ev.gpu_idle,
                                                  "working_on_cpu": ev.working_on_cpu},
            "probe_text": (Path(ev.file).read_text(errors="replace")[-6000:] if ev is not None else "")}


def main() -> int:
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp())
    work = Path(tempfile.mkdtemp(prefix="dsv4-probe-"))
    got = [one(mode, work / mode) for mode in ("busy_start", "hang_start")]
    ok = (got[0]["outcome"] == "not-run" and "a slow start, not a hang" in str(got[0]["detail"])
          and got[1]["outcome"] == "hang")
    (out / "selftest-probe-h200.json").write_text(json.dumps({"ok": ok, "runs": got}, indent=1) + "\n")
    for g in got:
        print(g["mode"], g["outcome"], g["seconds"], "s:", str(g["detail"])[:400])
    print("OK" if ok else "UNEXPECTED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
