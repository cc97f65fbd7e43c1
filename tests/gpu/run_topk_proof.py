#!/usr/bin/env python3
"""GPU proof for fix 7 (top-k lengths) and extra patch 0008 (radix histogram).

Run on a machine with an NVIDIA GPU, torch (2.11+, CUDA build) and nvcc:

    python tests/gpu/run_topk_proof.py OUTDIR

It needs nothing but this repository: the unpatched vLLM 0.27.1 kernel sources
are vendored in ``tests/gpu/vllm_src``; the patched ones are made by applying
the ``csrc/`` hunks of ``patches/0007-*`` (and ``patches/extra/0008-*``) to
copies.  Three libraries are built (unpatched, fix7, fix7+extra) with nvcc,
each registering ``persistent_topk``/``cooperative_topk`` in its own op
namespace.  Every case runs in a child process in its own process group; the
child polls a CUDA event with a deadline (a hung kernel never blocks) and the
parent kills the group on a backstop timeout.  Results go to
``OUTDIR/topk_proof.json`` and ``OUTDIR/topk_proof.md``; exit code 0 means
every expectation held.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
VENDORED = HERE / "vllm_src"
VARIANTS = {"unpatched": [], "fix7": ["patches/0007-*.patch"],
            "extra": ["patches/0007-*.patch", "patches/extra/0008-*.patch"]}
INT32_MIN = -(2**31)
HANG_S = 12.0  # a kernel still running after this is a hang (normal runs take milliseconds)
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


# ----------------------------------------------------------------------------- build

BINDINGS = """\
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <cstdint>
#define SIG const torch::stable::Tensor&, const torch::stable::Tensor&, \\
    torch::stable::Tensor&, torch::stable::Tensor&, int64_t, int64_t
void persistent_topk(SIG);
void cooperative_topk(SIG);
STABLE_TORCH_LIBRARY(NS, m) {
  m.def("persistent_topk(Tensor logits, Tensor lengths, Tensor! output, "
        "Tensor workspace, int k, int max_seq_len) -> ()");
  m.def("cooperative_topk(Tensor logits, Tensor lengths, Tensor! output, "
        "Tensor workspace, int k, int max_seq_len) -> ()");
}
STABLE_TORCH_LIBRARY_IMPL(NS, CUDA, m) {
  m.impl("persistent_topk", TORCH_BOX(&persistent_topk));
  m.impl("cooperative_topk", TORCH_BOX(&cooperative_topk));
}
"""


def csrc_only(patch_text: str) -> str:
    """The parts of a format-patch that touch csrc/ (tests and docs are left out)."""
    parts = re.split(r"(?m)^(?=diff --git )", patch_text)
    keep = [p for p in parts[1:] if re.match(r"diff --git a/csrc/", p)]
    return "".join(keep)


def apply_patch(src: Path, patch: Path) -> None:
    text = csrc_only(patch.read_text())
    if not text:
        return
    pf = src / ".p.diff"
    pf.write_text(text)
    tries = []
    if shutil.which("git"):
        tries.append(["git", "apply", "--unsafe-paths", "--whitespace=nowarn", "-p1", str(pf)])
    if shutil.which("patch"):
        tries.append(["patch", "-p1", "--batch", "--forward", "-i", str(pf)])
    for cmd in tries:
        res = subprocess.run(cmd, cwd=src, capture_output=True, text=True)
        if res.returncode == 0:
            pf.unlink()
            return
    raise SystemExit(f"cannot apply {patch.name} to {src} (need git or patch): {res.stderr}")


def find_cublas(torch_dir: Path, nvcc: Path) -> Path | None:
    root = nvcc.resolve().parent.parent
    cands = [root / "include", *root.glob("targets/*/include")]
    for base in {torch_dir.parent, *map(Path, sys.path)}:
        if base.is_dir():
            cands += list((base / "nvidia").glob("*/include")) + list((base / "nvidia").glob("*/*/include"))
    for c in cands:
        if (c / "cublas_v2.h").is_file():
            return c
    return None


def build_variant(name: str, work: Path, arch: str, nvcc: Path, torch_dir: Path,
                  cublas: Path | None, jobs: int) -> Path:
    src = work / name
    shutil.copytree(VENDORED, src)
    for pat in VARIANTS[name]:
        matches = sorted(REPO.glob(pat))
        if not matches:
            raise SystemExit(f"no patch matches {pat} in {REPO}")
        apply_patch(src, matches[0])
    inc = torch_dir / "include"
    stub = src / "stub_include"
    includes = ["-I", "csrc", "-I", str(inc), "-I", str(inc / "torch/csrc/api/include")]
    if cublas is not None:
        includes += ["-I", str(cublas)]
    else:  # torch_utils.h only needs the handle type from cublas_v2.h
        stub.mkdir()
        (stub / "cublas_v2.h").write_text(
            "#pragma once\nstruct cublasContext;\ntypedef struct cublasContext *cublasHandle_t;\n")
        includes += ["-I", str(stub)]
    sm = arch.replace(".", "")
    flags = ["-std=c++20", "--expt-relaxed-constexpr", "-O2", "-DNDEBUG", "-DUSE_CUDA",
             "-DENABLE_FP8", "-DTORCH_TARGET_VERSION=0x020B000000000000ULL",
             "-DVLLM_ENABLE_COOPERATIVE_TOPK=1", "-Xcompiler", "-fPIC",
             "-gencode", f"arch=compute_{sm},code=sm_{sm}"]
    (src / "bindings.cpp").write_text(BINDINGS.replace("NS", f"dsv4_{name}"))
    units = ["csrc/libtorch_stable/topk.cu", "csrc/libtorch_stable/cooperative_topk.cu", "bindings.cpp"]
    cmds = [[str(nvcc), *flags, *includes, "-c", u, "-o", Path(u).stem + ".o"] for u in units]

    def run(cmd: list[str]) -> None:
        res = subprocess.run(cmd, cwd=src, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"nvcc failed ({name}):\n{' '.join(cmd)}\n{res.stderr[-4000:]}")

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(run, cmds))
    lib = src / f"libdsv4_{name}.so"
    link = [str(nvcc), "-shared", "-cudart", "shared", "-o", str(lib), "topk.o",
            "cooperative_topk.o", "bindings.o", "-Xlinker", "-Bsymbolic",
            "-L", str(torch_dir / "lib"), "-lc10", "-ltorch", "-ltorch_cpu"]
    run(link)
    return lib


# ----------------------------------------------------------------------------- cases

def P(name, rows, stride, k, msl, lengths, expect_unpatched, why, variants=None):
    return {"name": name, "op": "persistent_topk", "rows": rows, "stride": stride, "k": k,
            "msl": msl, "lengths": lengths, "expect_unpatched": expect_unpatched, "why": why,
            "variants": variants or list(VARIANTS)}


def cases() -> list[dict]:
    cs = [
        P("neg1_multicta", 4, 16384, 2048, 16384, [-1, 16384, 100, 9000], "hang",
          "-1 read as uint32 takes the multi-CTA radix path; non-leaders already left"),
        P("int32min_multicta", 4, 16384, 1024, 16384, [INT32_MIN, 500, 16384, 3000], "hang",
          "INT32_MIN as uint32 is > 32768"),
        P("above_width", 4, 16384, 2048, 16384, [9000, 40000, 0, 20000], "hang",
          "40000 > stride and > max_seq_len"),
        P("above_msl_5cta", 4, 40000, 2048, 20000, [35000, 1000, 20000, 5], "hang",
          "35000 > max_seq_len 20000, 5 CTAs per group"),
        P("neg1_12rows", 12, 65540, 512, 30000,
          [30000, 100, -1, 29999, 0, 512, 20000, 7, 30000, 4096, 12345, 1], "hang",
          "a -1 row among 11 normal rows, 2 CTAs per group on H200"),
        P("mixed_normal", 4, 16384, 2048, 16384, [16384, 100, 2048, 9000], "ok",
          "in-range lengths only (control)"),
        P("msl_above_radix", 4, 65540, 2048, 65540, [-1, 65540, 70000, 40000], "wrong",
          "max_seq_len > 32768: no hang, but -1 is top-k'd and 70000 reads past the row"),
        P("filtered_many_rows", 40, 8192, 512, 8192,
          [-1, 0, 9000, INT32_MIN] + [100 + 200 * i for i in range(36)], "observe",
          "rows > 32: FilteredTopK path on H100/H200"),
        P("single_row_leader", 2, 4096, 512, 4096, [5000, 3000], "observe",
          "one CTA; a length above the row read past it"),
        {"name": "coop_negative", "op": "cooperative_topk", "rows": 4, "stride": 16384, "k": 2048,
         "msl": 16384, "lengths": [-1, 5000, INT32_MIN, 16384], "expect_unpatched": "wrong",
         "why": "negative rows emit 0..k-1 instead of -1", "variants": list(VARIANTS)},
        {"name": "coop_negative_8rows", "op": "cooperative_topk", "rows": 8, "stride": 8192,
         "k": 512, "msl": 8192, "lengths": [-3, 100, 0, 8192, 600, -1, 7000, 512],
         "expect_unpatched": "wrong", "why": "negative rows", "variants": list(VARIANTS)},
        {"name": "radix_histogram_reuse", "op": "persistent_topk", "rows": 3, "stride": 1_000_000,
         "k": 2048, "msl": 1_000_000, "lengths": [1_000_000, 5000, 999_000],
         "expect_unpatched": "wrong", "expect_fix7": "wrong",
         "why": "long, short, long rows in one group reuse a stale histogram (extra patch 0008)",
         "variants": list(VARIANTS)},
    ]
    return cs


def make_inputs(torch, c: dict, seed: int = 0):
    rows, stride = c["rows"], c["stride"]
    g = torch.Generator().manual_seed(seed)
    grid = torch.arange(stride, dtype=torch.float64) * (8.0 / stride) - 4.0
    data = torch.empty(rows + 1, stride, dtype=torch.float32)
    for r in range(rows + 1):  # one spare row: reads past the last row see planted values
        data[r] = grid[torch.randperm(stride, generator=g)].float()
        n = min(64, stride)
        data[r, :n] = 10.0 + torch.arange(n, dtype=torch.float32) * 0.37 + r * 0.001
    logits_full = data.cuda()
    logits = logits_full[:rows]
    lengths = torch.tensor(c["lengths"], dtype=torch.int32).cuda()
    out = torch.full((rows, c["k"]), -7, dtype=torch.int32).cuda()
    ws = torch.zeros(1 << 20, dtype=torch.uint8).cuda()
    return data[:rows], logits, lengths, out, ws


def check(torch, c: dict, data, out, patched_cooperative: bool) -> dict:
    """Per-row comparison with torch.topk on the valid prefix (-1 padding elsewhere)."""
    k, stride, msl = c["k"], c["stride"], c["msl"]
    out = out.cpu()
    rows = []
    ok = True
    for r, raw in enumerate(c["lengths"]):
        if c["op"] == "persistent_topk":
            L = max(0, min(raw, stride, msl))
        else:
            L = max(0, raw)
        got = out[r]
        valid = got[got >= 0]
        pad = int((got == -1).sum())
        if L <= k:
            want = set(range(L))
            good = set(valid.tolist()) == want and len(valid) == L and pad == k - L
        else:
            want = set(torch.topk(data[r, :L], k).indices.tolist())
            good = len(valid) == k and set(valid.tolist()) == want
        n_wrong = len(set(valid.tolist()) ^ want) + (0 if L > k else abs(pad - (k - L)))
        rows.append({"row": r, "length": raw, "effective": L, "ok": good, "mismatch": n_wrong,
                     "max_index": int(got.max()), "pad": pad})
        ok &= good
    return {"ok": ok, "rows": rows}


def child(args: argparse.Namespace) -> int:
    """Run cases in this process; one JSON line per case to args.results (appended)."""
    faulthandler_timeout = HANG_S * 4
    import faulthandler

    import torch

    libs = json.loads(args.libs)
    for lib in libs.values():
        torch.ops.load_library(lib)
    todo = json.loads(Path(args.cases).read_text())
    res_f = open(args.results, "a")
    for c in todo:
        variant = c["variant"]
        print(f"  child: {variant}/{c['name']} start", flush=True)
        res_f.write(json.dumps({"case": c["name"], "variant": variant, "status": "started"}) + "\n")
        res_f.flush()
        data, logits, lengths, out, ws = make_inputs(torch, c)
        op = getattr(getattr(torch.ops, f"dsv4_{variant}"), c["op"])
        torch.cuda.synchronize()
        done = torch.cuda.Event()
        t = time.monotonic()
        try:
            op(logits, lengths, out, ws, c["k"], c["msl"])
            done.record()
        except Exception as exc:  # a host-side check refused the input
            res_f.write(json.dumps({"case": c["name"], "variant": variant, "status": "error",
                                    "error": str(exc)[:500]}) + "\n")
            res_f.flush()
            continue
        while not done.query():
            if time.monotonic() - t > HANG_S:
                res_f.write(json.dumps({"case": c["name"], "variant": variant, "status": "hang",
                                        "seconds": HANG_S}) + "\n")
                res_f.flush()
                print(f"  child: {variant}/{c['name']} HANG, exiting", flush=True)
                os._exit(3)  # the driver tears the context down and ends the kernel
            time.sleep(0.005)
        faulthandler.dump_traceback_later(faulthandler_timeout, exit=True)
        try:
            torch.cuda.synchronize()
            result = check(torch, c, data, out, variant != "unpatched")
            status = "ok"
        except Exception as exc:  # e.g. an illegal address from a read past the row
            result, status = {"ok": False, "error": str(exc)[:500]}, "error"
        faulthandler.cancel_dump_traceback_later()
        res_f.write(json.dumps({"case": c["name"], "variant": variant, "status": status,
                                "seconds": round(time.monotonic() - t, 4), **result}) + "\n")
        res_f.flush()
        if status == "error":
            os._exit(4)  # the CUDA context may be unusable
    return 0


def run_children(tasks: list[dict], libs: dict[str, str], work: Path, deadline: float) -> dict:
    """Run ``tasks`` in child processes; a hang or crash ends a child, the rest go to a new one."""
    results: dict[tuple[str, str], dict] = {}
    pending = list(tasks)
    while pending:
        if time.monotonic() > deadline:
            for t in pending:
                results[(t["variant"], t["name"])] = {"status": "skipped", "why": "time budget"}
            break
        cf = work / f"cases_{len(results)}.json"
        rf = work / f"results_{len(results)}.jsonl"
        cf.write_text(json.dumps(pending))
        rf.write_text("")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--cases", str(cf),
               "--results", str(rf), "--libs", json.dumps(libs)]
        proc = subprocess.Popen(cmd, start_new_session=True)
        backstop = min(deadline - time.monotonic(), 60 + HANG_S * 2 + 20 * len(pending))
        try:
            proc.wait(timeout=max(10, backstop))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        lines = [json.loads(x) for x in rf.read_text().splitlines() if x.strip()]
        started = None
        for rec in lines:
            key = (rec["variant"], rec["case"])
            if rec["status"] == "started":
                started = key
            else:
                results[key] = rec
                started = None
        if started is not None and started not in results:
            # Started but never reported: killed by the backstop or crashed.
            results[started] = {"case": started[1], "variant": started[0],
                                "status": "hang" if proc.returncode in (-9, None) else "crash",
                                "returncode": proc.returncode}
        done = set(results)
        nxt = [t for t in pending if (t["variant"], t["name"]) not in done]
        if len(nxt) == len(pending):  # the child died before starting anything
            for t in nxt:
                results[(t["variant"], t["name"])] = {"status": "crash", "returncode": proc.returncode}
            break
        pending = nxt
    return results


# ----------------------------------------------------------------------------- perf

PERF_SHAPES = [(1, 65536), (4, 32768), (8, 65536), (16, 131072), (32, 65536), (64, 65536)]


def perf_child(args: argparse.Namespace) -> int:
    import torch

    libs = json.loads(args.libs)
    for lib in libs.values():
        torch.ops.load_library(lib)
    out_rows = []
    for rows, stride in PERF_SHAPES:
        for k in (512, 1024, 2048):
            c = {"rows": rows, "stride": stride, "k": k, "msl": stride,
                 "lengths": [stride - (i * 997) % (stride // 2) for i in range(rows)]}
            data, logits, lengths, out, ws = make_inputs(torch, c, seed=1)
            row = {"rows": rows, "stride": stride, "k": k}
            fns = {v: (lambda v=v: getattr(torch.ops, f"dsv4_{v}").persistent_topk(
                logits, lengths, out, ws, k, stride)) for v in libs}
            fns["torch.topk"] = lambda: torch.topk(logits, k, dim=1)
            for name, fn in fns.items():
                for _ in range(5):
                    fn()
                torch.cuda.synchronize()
                times = []
                for _ in range(30):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    fn()
                    e.record()
                    e.synchronize()
                    times.append(s.elapsed_time(e) * 1000.0)
                row[name] = round(statistics.median(times), 2)
            out_rows.append(row)
            print(f"  perf {row}", flush=True)
    Path(args.results).write_text(json.dumps(out_rows))
    return 0


# ----------------------------------------------------------------------------- report

def verdicts(cs: list[dict], results: dict) -> list[dict]:
    rows = []
    for c in cs:
        for v in c["variants"]:
            r = results.get((v, c["name"]), {"status": "missing"})
            st = r.get("status")
            outcome = "hang" if st == "hang" else ("crash" if st in ("crash", "error") else
                      ("right" if r.get("ok") else "wrong") if st == "ok" else st)
            if v == "unpatched":
                want = c["expect_unpatched"]
            elif v == "fix7":
                want = c.get("expect_fix7", "right")
            else:
                want = "right"
            if want == "observe":
                passed = None
            elif want == "hang":
                passed = outcome == "hang"
            elif want == "wrong":
                passed = outcome in ("wrong", "crash")
            elif want == "ok":
                passed = outcome == "right"
            else:
                passed = outcome == "right"
            bad = [x for x in r.get("rows", []) if not x["ok"]]
            rows.append({"case": c["name"], "op": c["op"], "variant": v, "expected": want,
                         "outcome": outcome, "pass": passed, "why": c["why"],
                         "bad_rows": [{k: x[k] for k in ("row", "length", "mismatch", "max_index")}
                                      for x in bad][:6], "detail": {k: r[k] for k in r
                                                                    if k not in ("rows",)}})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", nargs="?", type=Path, default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--perf-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cases"), ap.add_argument("--results"), ap.add_argument("--libs")
    ap.add_argument("--arch", default=None, help="e.g. 9.0a (default: the GPU's, with 'a')")
    ap.add_argument("--build-only", action="store_true", help="compile the three libraries and stop")
    ap.add_argument("--no-perf", action="store_true")
    ap.add_argument("--budget", type=float, default=450.0, help="seconds for the whole run")
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.perf_child:
        return perf_child(args)
    outdir = args.outdir or Path(os.environ.get("OUT", "topk_proof_out"))
    outdir.mkdir(parents=True, exist_ok=True)
    deadline = T0 + args.budget
    import torch

    torch_dir = Path(torch.__file__).parent
    info = {"torch": torch.__version__, "python": sys.version.split()[0]}
    arch = args.arch
    if torch.cuda.is_available():
        cc = torch.cuda.get_device_capability()
        info["gpu"] = torch.cuda.get_device_name()
        info["capability"] = f"{cc[0]}.{cc[1]}"
        arch = arch or f"{cc[0]}.{cc[1]}a"
    elif not args.build_only:
        print("needs an NVIDIA GPU (torch.cuda.is_available() is False)", flush=True)
        return 2
    arch = arch or "9.0a"
    nvcc = Path(shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    if not nvcc.is_file():
        print("needs nvcc (not on PATH, no /usr/local/cuda/bin/nvcc)", flush=True)
        return 2
    info["nvcc"] = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    cublas = find_cublas(torch_dir, nvcc)
    info["cublas_include"] = str(cublas) if cublas else "stub (cublasHandle_t only)"
    info["arch"] = arch
    log(f"env {info}")
    work = Path(tempfile.mkdtemp(prefix="topk_proof_"))
    jobs = max(1, min(9, os.cpu_count() or 2))
    log(f"building unpatched, fix7, extra for arch {arch} in {work} ({jobs} jobs)")
    with ThreadPoolExecutor(3) as pool:
        futs = {v: pool.submit(build_variant, v, work, arch, nvcc, torch_dir, cublas, max(1, jobs // 3))
                for v in VARIANTS}
        libs = {v: str(f.result()) for v, f in futs.items()}
    info["build_seconds"] = round(time.monotonic() - T0, 1)
    log(f"built: {libs}")
    if args.build_only:
        (outdir / "topk_proof.json").write_text(json.dumps({"info": info, "libs": libs}, indent=2))
        return 0
    cs = cases()
    # Patched variants share a child (they must not hang); every unpatched case expected to
    # hang gets its own, the others share one.  The runner restarts after a hang anyway.
    tasks = []
    for v in ("fix7", "extra"):
        tasks += [{**c, "variant": v} for c in cs if v in c["variants"]]
    tasks += [{**c, "variant": "unpatched"} for c in cs if c["expect_unpatched"] != "hang"]
    tasks += [{**c, "variant": "unpatched"} for c in cs if c["expect_unpatched"] == "hang"]
    log(f"running {len(tasks)} case runs")
    perf_deadline = deadline - (0 if args.no_perf else 90)
    results = run_children(tasks, libs, work, perf_deadline)
    table = verdicts(cs, results)
    for row in table:
        log(f"{row['variant']:>9} {row['case']:<24} expected {row['expected']:<7} got "
            f"{row['outcome']:<7} {'PASS' if row['pass'] else ('-' if row['pass'] is None else 'FAIL')}")
    perf: list[dict] = []
    if not args.no_perf and time.monotonic() < deadline - 20:
        log("benchmark (persistent_topk, normal inputs)")
        pf = work / "perf.json"
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--perf-child",
                                 "--results", str(pf), "--libs", json.dumps(libs)],
                                start_new_session=True)
        try:
            proc.wait(timeout=max(10, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if pf.exists():
            perf = json.loads(pf.read_text())
    for p in perf:
        p["ratio_fix7"] = round(p["fix7"] / p["unpatched"], 3)
        p["ratio_extra"] = round(p["extra"] / p["unpatched"], 3)
    geo = None
    if perf:
        import math
        geo = {v: round(math.exp(statistics.mean(math.log(p[f"ratio_{v}"]) for p in perf)), 3)
               for v in ("fix7", "extra")}
    perf_ok = bool(perf) and all(g <= 1.05 for g in geo.values()) if geo else None
    correctness_ok = all(r["pass"] is not False for r in table)
    summary = {"ok": correctness_ok and perf_ok is not False, "correctness_ok": correctness_ok,
               "perf_ok": perf_ok, "perf_geomean_ratio": geo, "info": info, "cases": table,
               "perf": perf, "runtime_s": round(time.monotonic() - T0, 1)}
    (outdir / "topk_proof.json").write_text(json.dumps(summary, indent=2))
    md = ["# Top-k GPU proof (fix 7, extra 0008)", "",
          f"GPU {info.get('gpu')} (arch {arch}), torch {info['torch']}, {info['nvcc']}; "
          f"runtime {summary['runtime_s']} s. Overall: **{'PASS' if summary['ok'] else 'FAIL'}**", "",
          "| case | op | variant | expected | outcome | result |", "|---|---|---|---|---|---|"]
    for r in table:
        res = "PASS" if r["pass"] else ("observed" if r["pass"] is None else "FAIL")
        md.append(f"| {r['case']} | {r['op']} | {r['variant']} | {r['expected']} | {r['outcome']} | {res} |")
    if perf:
        md += ["", "Median µs per call (CUDA events, 30 runs), persistent_topk on normal inputs:", "",
               "| rows | stride | k | unpatched | fix7 | extra | torch.topk | fix7/unp | extra/unp |",
               "|---|---|---|---|---|---|---|---|---|"]
        for p in perf:
            md.append(f"| {p['rows']} | {p['stride']} | {p['k']} | {p['unpatched']} | {p['fix7']} | "
                      f"{p['extra']} | {p['torch.topk']} | {p['ratio_fix7']} | {p['ratio_extra']} |")
        md += ["", f"Geometric-mean ratio vs unpatched: {geo} (pass if <= 1.05)"]
    (outdir / "topk_proof.md").write_text("\n".join(md) + "\n")
    log(f"wrote {outdir}/topk_proof.md and .json; ok={summary['ok']}")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
