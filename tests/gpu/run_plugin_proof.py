#!/usr/bin/env python3
"""GPU proof that the wheel `dsv4patch build` makes replaces vLLM's top-k kernels.

The device has no vLLM, so a stand-in ``vllm`` package plays the stock wheel:
``vllm._C_stable_libtorch`` defines the two ops with vLLM 0.27.1's exact
schemas and registers CUDA kernels that only raise "stock kernel".  The wheel
is unpacked, its ``vllm.general_plugins`` entry point is found through
importlib.metadata and called, as vLLM does at start-up; then:

* the ops run the rebuilt (patched) kernels: a multi-CTA out-of-range case
  that hangs the stock 0.27.1 kernel returns the right answer, and
  cooperative_topk pads a negative-length row with -1;
* with the stand-in reporting another vLLM version, the plugin refuses to load
  (the stock kernel is still the one called), and with
  DSV4PATCH_KERNELS_STRICT=1 it raises.

Usage: python tests/gpu/run_plugin_proof.py WHEEL OUTDIR
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

STOCK = textwrap.dedent(
    '''
    import torch
    _lib = torch.library.Library("_C", "DEF")
    for _name in ("persistent_topk", "cooperative_topk"):
        _lib.define(_name + "(Tensor logits, Tensor lengths, Tensor! output, "
                    "Tensor workspace, int k, int max_seq_len) -> ()")
        def _stock(*args, _n=_name):
            raise RuntimeError("stock kernel " + _n)
        _lib.impl(_name, _stock, "CUDA")
    '''
)

CHILD = textwrap.dedent(
    '''
    import json, sys, importlib.metadata as md
    import torch
    eps = [e for e in md.entry_points(group="vllm.general_plugins") if e.name.startswith("dsv4patch")]
    result = {"entry_points": [f"{e.name} = {e.value}" for e in eps]}
    try:
        eps[0].load()()
        result["register"] = "ok"
    except Exception as exc:  # strict mode
        result["register"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(result)); sys.exit(0)
    rows, stride, k, msl = 4, 16384, 2048, 16384
    lengths = [-1, 5000, 16384, 100]
    g = torch.Generator().manual_seed(0)
    data = torch.randperm(stride * rows, generator=g).float().reshape(rows, stride)
    logits = data.cuda()
    out = torch.full((rows, k), -7, dtype=torch.int32, device="cuda")
    ws = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    try:
        torch.ops._C.persistent_topk(logits, torch.tensor(lengths, dtype=torch.int32, device="cuda"), out, ws, k, msl)
        torch.cuda.synchronize()
        ok = True
        for r, raw in enumerate(lengths):
            L = max(0, min(raw, stride, msl))
            got = out[r].cpu()
            valid = set(got[got >= 0].tolist())
            want = set(range(L)) if L <= k else set(torch.topk(data[r, :L], k).indices.tolist())
            ok &= valid == want and (L > k or int((got == -1).sum()) == k - L)
        result["persistent_topk"] = "right" if ok else "wrong"
    except RuntimeError as exc:
        result["persistent_topk"] = str(exc).splitlines()[0]
    out2 = torch.full((2, 512), -7, dtype=torch.int32, device="cuda")
    try:
        torch.ops._C.cooperative_topk(logits[:2, :4096].contiguous(), torch.tensor([-1, 3000], dtype=torch.int32, device="cuda"), out2, ws, 512, 4096)
        torch.cuda.synchronize()
        result["cooperative_topk_negative_row_all_minus_1"] = bool((out2[0] == -1).all())
    except RuntimeError as exc:
        result["cooperative_topk_negative_row_all_minus_1"] = str(exc).splitlines()[0]
    print(json.dumps(result))
    '''
)


def main() -> int:
    wheel, outdir = Path(sys.argv[1]), Path(sys.argv[2])
    outdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="plugin-proof-"))
    site = work / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    results = {}
    for label, version, strict in (("matching vLLM 0.27.1", "0.27.1", "0"),
                                   ("other vLLM 0.27.0", "0.27.0", "0"),
                                   ("other vLLM 0.27.0, strict", "0.27.0", "1")):
        fake = work / f"fake-{version}-{strict}"
        (fake / "vllm").mkdir(parents=True)
        (fake / "vllm" / "__init__.py").write_text(f"__version__ = {version!r}\n")
        (fake / "vllm" / "_C_stable_libtorch.py").write_text(STOCK)
        env = {**os.environ, "PYTHONPATH": f"{site}:{fake}", "DSV4PATCH_KERNELS_STRICT": strict}
        # The stand-in must be imported before the plugin runs, as vLLM's own import would.
        code = "import vllm._C_stable_libtorch\n" + CHILD
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             timeout=300, start_new_session=True)
        line = (res.stdout.strip().splitlines() or ["{}"])[-1]
        try:
            results[label] = json.loads(line)
        except ValueError:
            results[label] = {"error": res.stderr[-2000:]}
        print(label, results[label], flush=True)
    expect = {
        "matching vLLM 0.27.1": lambda r: r.get("register") == "ok" and r.get("persistent_topk") == "right"
        and r.get("cooperative_topk_negative_row_all_minus_1") is True,
        "other vLLM 0.27.0": lambda r: r.get("register") == "ok"
        and str(r.get("persistent_topk", "")).startswith("stock kernel"),
        "other vLLM 0.27.0, strict": lambda r: str(r.get("register", "")).startswith("RuntimeError"),
    }
    verdict = {k: bool(f(results.get(k, {}))) for k, f in expect.items()}
    (outdir / "plugin_proof.json").write_text(json.dumps({"wheel": wheel.name, "results": results,
                                                          "pass": verdict}, indent=2) + "\n")
    md = [f"# Kernel plugin wheel on the GPU ({wheel.name})", "", "| scenario | result | pass |", "|---|---|---|"]
    md += [f"| {k} | `{json.dumps(results.get(k))}` | {'PASS' if v else 'FAIL'} |" for k, v in verdict.items()]
    (outdir / "plugin_proof.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if all(verdict.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
