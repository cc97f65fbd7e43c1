#!/usr/bin/env python3
"""Fix 7 with vLLM's own binary: the stock kernels hang, the dsv4patch wheel's are active and right.

Runs on a machine with an NVIDIA GPU and torch (CUDA build), from a bundle that
``tests/gpu/make_bundle.py`` made out of what the product makes:

* the tree ``dsv4patch apply --pin 0.27.1`` made (its ``vllm/`` Python package
  and its ``tests/kernels`` tests of fix 7 and the extra kernel fixes);
* the plugin wheel ``dsv4patch build`` made from that tree;
* the stock ``vllm/_C_stable_libtorch.abi3.so`` from the pin's PyPI wheel
  (sha256 of the wheel and of the member checked), xz-compressed.

    python tests/gpu/run_vllm_binary_proof.py BUNDLE OUTDIR

Sites (each a directory on PYTHONPATH holding a ``vllm`` package):
``stock`` (stock library only), ``plugin`` (+ the wheel, activated through vLLM's
real ``vllm.plugins.load_general_plugins``), ``hook`` (+ ``install-hook``: the
patched vLLM activates the kernels itself), ``uncovered`` (the wheel with its
build_info claiming no code for this GPU: the guard must keep the stock
kernels).  Every kernel call runs in a child process in its own process group
with a deadline; cases that can hang or fault run after the others.  Writes
``OUTDIR/vllm_binary_proof.json`` and ``.md``; exit 0 when every expectation held.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
HANG_S = 15.0
T0 = time.monotonic()
HANG_CASE = {"op": "persistent_topk", "rows": 4, "width": 16384, "k": 2048, "msl": 16384,
             "lengths": [-1, 16384, 9000, 2049]}


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


# ----------------------------------------------------------------------------- sites

def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def make_sites(bundle: Path, work: Path) -> dict:
    meta = json.loads((bundle / "bundle.json").read_text())
    from safe_untar import extract  # beside this script (its directory is sys.path[0])

    with tarfile.open(bundle / meta["tree_tar"]) as tf:
        extract(tf, work / "tree")
    # The tests' root must not hold a vllm/ without the library: pytest puts it first on sys.path.
    os.replace(work / "tree" / "vllm", work / "vllm")
    stock = work / "stock.so"
    with lzma.open(bundle / meta["stock_so_xz"]) as src, stock.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    got = sha256(stock)
    if got != meta["stock_so_sha256"]:
        raise SystemExit(f"stock library sha256 {got} != {meta['stock_so_sha256']}")
    sites = {}
    for name in ("stock", "plugin", "hook", "uncovered"):
        site = work / "sites" / name
        shutil.copytree(work / "vllm", site / "vllm", copy_function=os.link)
        os.link(stock, site / "vllm" / "_C_stable_libtorch.abi3.so")
        for info in (work / "tree" / "distinfo").iterdir():  # the stock wheel's metadata
            shutil.copytree(info, site / info.name)
        if name != "stock":
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                            "--no-compile", "--target", str(site), str(bundle / meta["plugin_wheel"])],
                           check=True)
        sites[name] = site
    dist = meta["plugin_dist"]
    env = {**os.environ, "PYTHONPATH": str(sites["hook"])}
    res = subprocess.run([sys.executable, "-m", dist, "install-hook"], env=env, capture_output=True,
                         text=True)
    log(f"install-hook: {res.stdout.strip()} {res.stderr.strip()[-300:]}")
    info_path = sites["uncovered"] / dist / "build_info.json"
    info = json.loads(info_path.read_text())
    for u in info["units"]:
        u["sass"], u["ptx"] = ["10.0f"], []
    info_path.unlink()  # a hard link to nothing else, but never write through one
    info_path.write_text(json.dumps(info))
    meta["sites"] = {k: str(v) for k, v in sites.items()}
    meta["tests_root"] = str(work / "tree")
    return meta


# ----------------------------------------------------------------------------- child side

def activate(mode: str):
    import torch

    if mode == "stock":
        import vllm._C_stable_libtorch
    elif mode == "plugins":
        import vllm._C_stable_libtorch
        from vllm.plugins import load_general_plugins

        load_general_plugins()
    elif mode == "import":
        import vllm  # noqa: F401  (the hook runs in vllm/__init__.py)
    elif mode == "lib":  # make_kernel_proof.py's library: defines and implements _C's top-k ops
        import ctypes

        # The stable ABI's CUDA entry points live in libtorch_cuda, which torch loads
        # RTLD_LOCAL; the library was linked against a CPU torch: make them global.
        cuda_lib = Path(torch.__file__).parent / "lib" / "libtorch_cuda.so"
        if cuda_lib.exists():
            ctypes.CDLL(str(cuda_lib), mode=ctypes.RTLD_GLOBAL)
        torch.ops.load_library(os.environ["DSV4PATCH_PROOF_LIB"])
    return torch


def dispatch(torch) -> dict:
    out = {}
    for op in ("persistent_topk", "cooperative_topk"):
        try:
            table = torch._C._dispatch_dump_table(f"_C::{op}")
        except RuntimeError:
            out[op] = None
            continue
        line = next((ln for ln in table.splitlines() if ln.startswith("CUDA:")), "")
        out[op] = line[5:].strip()
    return out


def inputs(torch, c: dict, seed: int):
    rows, width = c["rows"], c["width"]
    g = torch.Generator(device="cuda").manual_seed(seed)
    # One spare row: a read past the last row sees planted large values.
    data = c.get("data", "randn")
    if data == "rand":  # uniform [0, 1): dense coarse-histogram bins near the top
        buf = torch.rand(rows + 1, width, generator=g, device="cuda", dtype=torch.float32)
    else:
        buf = torch.randn(rows + 1, width, generator=g, device="cuda", dtype=torch.float32)
        if data == "ties":  # quarter steps: many exactly equal scores
            buf = (buf * 4).round() / 4
        elif data == "tie_block":  # the first 8192 of a row in one coarse (fp16) bin, the rest below
            span = c.get("tie_span", 8192)
            head = torch.rand(rows + 1, span, generator=g, device="cuda", dtype=torch.float32)
            buf = -(buf.abs() + 1.0)
            buf[:, :span] = 0.5 + head * 0.03
        elif data == "equal":  # every score of every row equal
            buf.fill_(0.25)
    logits = buf[:rows]
    lengths = torch.tensor(c["lengths"], dtype=torch.int32, device="cuda")
    out = torch.full((rows, c["k"]), -7, dtype=torch.int32, device="cuda")
    ws = torch.zeros(1 << 22, dtype=torch.uint8, device="cuda")
    return logits, lengths, out, ws


def valid_lengths(c: dict) -> list[list[int]]:
    """The valid-prefix length of each row (docs/gpu-proofs.md: the contract).

    Every path (persistent kernel, FilteredTopK, cooperative_topk) clamps a row's
    length to [0, min(width, max_seq_len)] with extra 2: one answer per row."""
    return [[max(0, min(raw, c["width"], c["msl"]))] for raw in c["lengths"]]


def check(torch, c: dict, logits, out) -> list[str]:
    errors = []
    k = c["k"]
    for r, allowed in enumerate(valid_lengths(c)):
        got = out[r].long()
        reasons = []
        for L in allowed:
            if L <= k:
                want = torch.full((k,), -1, dtype=torch.long, device=got.device)
                want[:L] = torch.arange(L, device=got.device)
                if torch.equal(got.sort().values, want.sort().values):
                    reasons = []
                    break
                reasons.append(f"L={L}: want 0..{L - 1} and -1 padding")
                continue
            if int(got.min()) < 0 or int(got.max()) >= L or got.unique().numel() != k:
                reasons.append(f"L={L}: indices out of [0,{L}) or repeated "
                               f"(min {int(got.min())}, max {int(got.max())}, "
                               f"{k - got.unique().numel()} repeated, "
                               f"{int((got >= c['width']).sum())} >= width, "
                               f"{int((got == -7).sum())} never written)")
                continue
            ref = torch.topk(logits[r, :L], k).values.sort().values
            if torch.equal(logits[r, got].sort().values, ref):
                reasons = []
                break
            reasons.append(f"L={L}: values differ from torch.topk on the prefix")
        if reasons:
            errors.append(f"row {r} (length {c['lengths'][r]}): " + "; ".join(reasons))
    return errors


def run_one(torch, c: dict, seed: int, res_f) -> bool:
    """Run case ``c``; False when the CUDA context can no longer be trusted."""
    import faulthandler

    logits, lengths, out, ws = inputs(torch, c, seed)
    op = getattr(torch.ops._C, c["op"])
    torch.cuda.synchronize()
    t = time.monotonic()
    if c.get("graph"):
        scratch = torch.full_like(lengths, 1)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            op(logits, scratch, out, ws, c["k"], c["msl"])  # warm-up outside capture
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        captured = torch.full_like(lengths, 1)
        with torch.cuda.graph(graph):
            op(logits, captured, out, ws, c["k"], c["msl"])
        captured.copy_(lengths)  # the hang input arrives at replay, as in the engine
        out.fill_(-7)
        graph.replay()
    else:
        op(logits, lengths, out, ws, c["k"], c["msl"])
    done = torch.cuda.Event()
    done.record()
    while not done.query():
        if time.monotonic() - t > HANG_S:
            res_f.write(json.dumps({"id": c["id"], "status": "hang"}) + "\n")
            res_f.flush()
            os._exit(3)  # the driver tears the context down and ends the kernel
        time.sleep(0.002)
    faulthandler.dump_traceback_later(HANG_S * 4, exit=True)
    try:
        torch.cuda.synchronize()
        errors = check(torch, c, logits, out)
        status = "ok" if not errors else "wrong"
    except Exception as exc:  # e.g. an illegal address
        errors, status = [str(exc)[:400]], "error"
    faulthandler.cancel_dump_traceback_later()
    res_f.write(json.dumps({"id": c["id"], "status": status, "errors": errors[:6],
                            "seconds": round(time.monotonic() - t, 4)}) + "\n")
    res_f.flush()
    return status != "error"


def spawn_target(case_json: str, results: str) -> None:
    torch = activate("stock")  # only what a worker imports: vllm/__init__ runs the hook
    with open(results, "a") as res_f:
        res_f.write(json.dumps({"id": "dispatch", "dispatch": dispatch(torch)}) + "\n")
        run_one(torch, json.loads(case_json), 7, res_f)


def child_main(args: argparse.Namespace) -> int:
    torch = activate(args.mode)
    todo = json.loads(Path(args.cases).read_text())
    with open(args.results, "a") as res_f:
        res_f.write(json.dumps({"id": "dispatch", "dispatch": dispatch(torch)}) + "\n")
        res_f.flush()
        for c in todo:
            res_f.write(json.dumps({"id": c["id"], "status": "started"}) + "\n")
            res_f.flush()
            if c.get("spawn"):
                import multiprocessing as mp

                p = mp.get_context("spawn").Process(target=spawn_target,
                                                    args=(json.dumps(c), args.results))
                p.start()
                p.join(HANG_S * 6)
                if p.is_alive():
                    p.kill()
                continue
            if not run_one(torch, c, c.get("seed", 0), res_f):
                return 4
    return 0


# ----------------------------------------------------------------------------- parent side

def run_cases(cases: list[dict], site: Path, mode: str, work: Path, tag: str,
              env_extra: dict | None = None, backstop: float = 900.0) -> tuple[dict, dict]:
    """Run ``cases`` in children; a hang or fault ends a child, the rest go to a new one."""
    results: dict[str, dict] = {}
    dispatch_seen: dict = {}
    pending = list(cases)
    n = 0
    while pending:
        n += 1
        cf, rf = work / f"{tag}-{n}.cases.json", work / f"{tag}-{n}.results.jsonl"
        cf.write_text(json.dumps(pending))
        rf.write_text("")
        env = {**os.environ, "PYTHONPATH": str(site), **(env_extra or {})}
        proc = subprocess.Popen([sys.executable, str(HERE), "child", "--mode", mode, "--cases", str(cf),
                                 "--results", str(rf)], env=env, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            out, _ = proc.communicate(timeout=backstop)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        last_started = None
        for line in rf.read_text().splitlines():
            r = json.loads(line)
            if r["id"] == "dispatch":
                dispatch_seen = r["dispatch"]
            elif r.get("status") == "started":
                last_started = r["id"]
            else:
                results[r["id"]] = r
        done_ids = set(results)
        if last_started and last_started not in done_ids:
            results[last_started] = {"id": last_started, "status": "crash" if proc.returncode else "lost",
                                     "rc": proc.returncode, "tail": (out or "")[-600:]}
            done_ids.add(last_started)
        before = len(pending)
        pending = [c for c in pending if c["id"] not in done_ids]
        if len(pending) == before:  # the child died before running anything
            for c in pending:
                results[c["id"]] = {"id": c["id"], "status": "crash", "rc": proc.returncode,
                                    "tail": (out or "")[-600:]}
            break
    return results, dispatch_seen


def check_cli(site: Path, dist: str, env_extra: dict | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(site), **(env_extra or {})}
    res = subprocess.run([sys.executable, "-m", dist, "check", "--json"], env=env,
                         capture_output=True, text=True, timeout=600)
    # vLLM's logger writes to stdout too: the report is the last top-level JSON object.
    start = res.stdout.rfind("\n{\n") + 1 if not res.stdout.startswith("{\n") else 0
    try:
        report = json.loads(res.stdout[start:])
    except json.JSONDecodeError:
        report = {"unparsed": res.stdout[-800:]}
    return {"rc": res.returncode, "report": report,
            "log": (res.stdout[:start] + res.stderr)[-2000:]}


def grid(rng: random.Random) -> list[dict]:
    cases = []
    widths = [2048, 4096, 8472, 11768, 16384, 32768, 32772, 57592, 65536, 131072, 1000000]
    for op in ("persistent_topk", "cooperative_topk"):
        for width in widths:
            for rows in (1, 3, 5, 9, 12, 32, 33, 64, 300):
                if op == "cooperative_topk" and rows > 32:
                    continue
                if rows * width > 40_000_000:
                    continue
                for k in (512, 2048):
                    for msl in sorted({width, max(1, width // 2)}):
                        special = [INT32_MIN, -1, 0, 1, k - 1, k, k + 1, width - 1, width, width + 1,
                                   msl - 1, msl, msl + 1, INT32_MAX]
                        lengths = [special[(i * 5 + rows + k) % len(special)] if i % 3 else width
                                   for i in range(rows)]
                        cases.append({"op": op, "rows": rows, "width": width, "k": k, "msl": msl,
                                      "lengths": lengths})
    # The stale-histogram pattern (extra 1): long, short, long in one CTA group.
    for x in (-1, 0, 5000):
        for k in (512, 2048):
            cases.append({"op": "persistent_topk", "rows": 3, "width": 1000000, "k": k,
                          "msl": 1000000, "lengths": [1000000, x, 1000000]})
    rng.shuffle(cases)
    return cases


def fuzz(rng: random.Random, n: int) -> list[dict]:
    cases = []
    for _ in range(n):
        op = rng.choice(("persistent_topk", "cooperative_topk"))
        rows = rng.randint(1, 32 if op == "cooperative_topk" else 300)
        width = 4 * rng.randint(16, min(250000, 40_000_000 // rows) // 4)
        k = rng.choice((512, 1024, 2048))
        msl = rng.choice((width, rng.randint(1, width)))
        pool = [INT32_MIN, -1, 0, 1, k - 1, k, k + 1, width - 1, width, width + 1, msl - 1, msl,
                msl + 1, INT32_MAX, 2 * width]
        lengths = [rng.choice(pool) if rng.random() < 0.4 else rng.randint(0, width)
                   for _ in range(rows)]
        cases.append({"op": op, "rows": rows, "width": width, "k": k, "msl": msl, "lengths": lengths})
    return cases


# Issue 29's report: 31 rows of width 196608, max_seq_len 32768, k 2048, lengths mixing
# INT32_MIN, -1, 0, 2049 and values above max_seq_len (within and past the row).
# cooperative_topk returned rows with 1,023 repeated indices before extra 2 clamped to
# max_seq_len. The same lengths on every path: 31 rows (persistent kernel), 40 rows
# (FilteredTopK), k 512 and 2048, normal and uniform scores.
ISSUE29_LENGTHS = [INT32_MIN, -1, 0, 2049, 177256, 44418, 175412, 115691, 70619, 150196, 157786,
                   196608, 32768, 32769, 196609, INT32_MAX]


def issue29_cases() -> list[dict]:
    cases = []
    for op, rows in (("cooperative_topk", 31), ("persistent_topk", 31), ("persistent_topk", 40)):
        for k in (2048, 512):
            for data in ("randn", "rand"):
                lengths = [ISSUE29_LENGTHS[i % len(ISSUE29_LENGTHS)] for i in range(rows)]
                cases.append({"op": op, "rows": rows, "width": 196608, "k": k, "msl": 32768,
                              "lengths": lengths, "data": data})
    return cases


def overflow_cases() -> list[dict]:
    """Concentrated and tied scores (extra 3): issue 29's shape with quarter-step scores (many
    exactly equal), with one CTA's share of every row in one coarse bin (8192 scores at the
    head: cooperative_topk kept 1,024 ties per CTA and left 1,024 slots unwritten), in-contract
    long rows at its width (max_seq_len = width, so 177256 is a valid length) with normal,
    uniform and tied scores, FilteredTopK's long rows (40 rows) with uniform scores, and rows
    of one repeated score on the short paths (<= 8192, <= 16384, <= 32768, cluster)."""
    cases = [dict(c, data="ties") for c in issue29_cases() if c["data"] == "randn"]
    cases += [dict(c, data="tie_block", lengths=[32768] * c["rows"])
              for c in issue29_cases() if c["data"] == "randn"]
    for op, rows in (("cooperative_topk", 31), ("persistent_topk", 31), ("persistent_topk", 40)):
        for k in (2048, 512):
            for data in ("randn", "rand", "ties"):
                lengths = [max(0, min(x, 196608)) for x in ISSUE29_LENGTHS]
                lengths = [lengths[i % len(lengths)] for i in range(rows)]
                cases.append({"op": op, "rows": rows, "width": 196608, "k": k, "msl": 196608,
                              "lengths": lengths, "data": data})
    for op, rows, width in (("persistent_topk", 8, 8192), ("persistent_topk", 8, 32768),
                            ("persistent_topk", 40, 32768), ("persistent_topk", 4, 65536),
                            ("cooperative_topk", 4, 16384), ("cooperative_topk", 8, 65536),
                            ("cooperative_topk", 31, 65536)):
        for k in (2048, 512):
            cases.append({"op": op, "rows": rows, "width": width, "k": k, "msl": width,
                          "lengths": [width] * rows, "data": "equal"})
    return cases


PERF_SHAPES = [(1, 65536), (4, 32768), (8, 65536), (16, 131072), (32, 65536), (64, 65536)]


def perf_main(args: argparse.Namespace) -> int:
    torch = activate(args.mode)
    rows_out = []
    for op in ("persistent_topk", "cooperative_topk"):
        for rows, width in PERF_SHAPES:
            if op == "cooperative_topk" and rows > 32:
                continue
            for k in (512, 1024, 2048):
                c = {"rows": rows, "width": width, "k": k,
                     "lengths": [width - (i * 997) % (width // 2) for i in range(rows)]}
                logits, lengths, out, ws = inputs(torch, c, 1)
                fn = getattr(torch.ops._C, op)
                for _ in range(5):
                    fn(logits, lengths, out, ws, k, width)
                torch.cuda.synchronize()
                times = []
                for _ in range(40):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    fn(logits, lengths, out, ws, k, width)
                    e.record()
                    e.synchronize()
                    times.append(s.elapsed_time(e) * 1000.0)
                rows_out.append({"op": op, "rows": rows, "width": width, "k": k,
                                 "us": round(statistics.median(times), 2)})
    Path(args.results).write_text(json.dumps({"dispatch": dispatch(torch), "rows": rows_out}))
    return 0


def run_perf(site: Path, mode: str, work: Path, tag: str) -> dict:
    rf = work / f"perf-{tag}.json"
    env = {**os.environ, "PYTHONPATH": str(site)}
    subprocess.run([sys.executable, str(HERE), "perf", "--mode", mode, "--results", str(rf)], env=env,
                   timeout=600, check=True)
    return json.loads(rf.read_text())


def differential(site: Path, mode: str, work: Path, n_fuzz: int, section, expect: list) -> None:
    """The differential against torch.topk (grid, fuzz, issue 29's shape), then the probes."""
    rng = random.Random(51538)
    cases = [dict(c, id=f"g{i}") for i, c in enumerate(grid(rng))]
    cases += [dict(c, id=f"f{i}", seed=i) for i, c in enumerate(fuzz(rng, n_fuzz))]
    cases += [dict(c, id=f"i29-{i}", seed=29000 + i) for i, c in enumerate(issue29_cases())]
    log(f"differential: {len(cases)} cases")
    r, d = run_cases(cases, site, mode, work, "diff")
    bad = {k: v for k, v in r.items() if v["status"] != "ok"}
    section("differential", {"cases": len(cases), "dispatch": d, "not_ok": bad,
                             "by_status": {s: sum(v["status"] == s for v in r.values())
                                           for s in {v["status"] for v in r.values()}},
                             "case_list": cases if bad else f"{len(cases)} cases, seed 51538"})
    expect.append((f"differential: all {len(cases)} cases right with the rebuilt kernels",
                   not bad and len(r) == len(cases), f"{len(bad)} not ok"))
    i29 = [c for c in cases if c["id"].startswith("i29-")]
    i29_bad = {c["id"]: r.get(c["id"], {"status": "missing"}) for c in i29
               if r.get(c["id"], {}).get("status") != "ok"}
    section("issue29_shape", {"cases": i29, "results": {c["id"]: r.get(c["id"]) for c in i29}})
    expect.append((f"issue 29 shape (31/40 rows, width 196608, max_seq_len 32768; {len(i29)} cases, "
                   "cooperative_topk, persistent kernel, FilteredTopK): exactly the top-k of "
                   "min(len, width, max_seq_len), no repeated index, none outside the row",
                   not i29_bad and len(i29) == 12, json.dumps(i29_bad)[:400]))
    ov = [dict(c, id=f"p{i}", seed=29500 + i) for i, c in enumerate(overflow_cases())]
    log(f"overflow cases (extra 3): {len(ov)} cases, concentrated and tied scores")
    pr, _ = run_cases(ov, site, mode, work, "overflow")
    ov_bad = sorted(k for k, v in pr.items() if v["status"] != "ok")
    section("overflow_cases", {"note": "extra 3: issue 29's shape with quarter-step ties, 8192 "
                               "scores of one coarse bin at each row's head, in-contract rows up "
                               "to the width with normal, uniform and tied scores, and rows of "
                               "one repeated score on the short paths",
                               "cases": ov, "results": pr, "not_ok": ov_bad})
    expect.append((f"concentrated and tied scores ({len(ov)} cases: uniform, quarter-step ties, a "
                   "one-bin block per row, all-equal rows; cooperative_topk, persistent kernel, "
                   "FilteredTopK): exactly the top-k, no repeated index, none outside the row, "
                   "none unwritten", not ov_bad and len(pr) == len(ov),
                   ", ".join(ov_bad)[:400]))


def standalone_main(args: argparse.Namespace) -> int:
    """One-call kernel proof: make_kernel_proof.py's library, no stock vLLM (kernel_proof.sh)."""
    import torch

    libdir = Path(args.bundle).resolve()
    meta = json.loads((libdir / "kernel_proof.json").read_text())
    lib = libdir / meta["library"]
    if sha256(lib) != meta["library_sha256"]:
        raise SystemExit(f"{lib}: sha256 differs from kernel_proof.json")
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("PROOF_WORK", "/tmp/dsv4patch-kernel-proof"))
    shutil.rmtree(work, ignore_errors=True)
    site = work / "site"  # nothing on the path but torch: the library defines the ops
    site.mkdir(parents=True)
    os.environ["DSV4PATCH_PROOF_LIB"] = str(lib)
    report: dict = {"kernel_proof": meta, "device": torch.cuda.get_device_name(0),
                    "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
                    "torch": torch.__version__, "sections": {}}
    expect: list[tuple[str, bool, str]] = []

    def section(name: str, value) -> None:
        report["sections"][name] = value
        (out / "kernel_proof.json").write_text(json.dumps(report, indent=1))

    log(f"hang input, library {lib.name} (tree {meta['tree_id'][:12]})")
    hang = {**HANG_CASE, "id": "hang-input"}
    r, d = run_cases([hang, {**hang, "id": "hang-input-graph", "graph": True}], site, "lib", work, "hang")
    section("hang_input", {"dispatch": d, "results": r})
    expect += [("dispatcher names the library's registration for both ops",
                bool(d) and all("dsv4patch_bindings" in (v or "") for v in d.values()), str(d)),
               ("hang input right", r["hang-input"]["status"] == "ok", str(r["hang-input"])),
               ("hang input right in CUDA-graph replay", r["hang-input-graph"]["status"] == "ok",
                str(r["hang-input-graph"]))]
    differential(site, "lib", work, args.fuzz, section, expect)
    report["expectations"] = [{"what": w, "ok": ok, "detail": det[:400]} for w, ok, det in expect]
    report["ok"] = all(ok for _, ok, _ in expect)
    (out / "kernel_proof.json").write_text(json.dumps(report, indent=1))
    ov = report["sections"]["overflow_cases"]
    lines = [f"# dsv4patch kernel proof on {report['device']} (sm_{report['capability'].replace('.', '')}, "
             f"torch {report['torch']})", "",
             f"vLLM {meta['vllm_version']}, series {' + '.join(meta['series'])}, patched tree "
             f"`{meta['tree_id']}` (lock: `{meta['lock_patched_tree']}`), library built for "
             f"{', '.join(meta['archs'])} by {meta['nvcc']}, torch {meta['torch_version']} headers.",
             "", "| expectation | ok | detail |", "|---|---|---|"]
    lines += [f"| {w} | {'yes' if ok else '**NO**'} | {det[:160].replace('|', '/')} |"
              for w, ok, det in expect]
    n_diff = report["sections"]["differential"]["cases"]
    lines += ["", f"All expectations held: **{report['ok']}**", "",
              f"Cases right: {n_diff - len(report['sections']['differential']['not_ok'])} of {n_diff} "
              f"(differential), {len(ov['cases']) - len(ov['not_ok'])} of {len(ov['cases'])} "
              "(concentrated and tied scores)"
              + (f"; not right: {', '.join(ov['not_ok'])}" if ov["not_ok"] else ""), ""]
    by_id = {c["id"]: c for c in ov["cases"]}
    for pid in ov["not_ok"]:
        c, res = by_id[pid], ov["results"][pid]
        first = (res.get("errors") or [res.get("tail", "")])[0]
        lines.append(f"* {pid}: {c['op']} rows {c['rows']} k {c['k']} max_seq_len {c['msl']} "
                     f"data {c.get('data', 'randn')}: {res['status']}; {str(first)[:200]}")
    (out / "kernel_proof.md").write_text("\n".join(lines) + "\n")
    log(f"ok={report['ok']}")
    return 0 if report["ok"] else 1


def main() -> int:
    if sys.argv[1:2] in (["child"], ["perf"]):
        sp = argparse.ArgumentParser()
        sp.add_argument("cmd")
        sp.add_argument("--mode", required=True)
        sp.add_argument("--results", required=True)
        sp.add_argument("--cases")
        a = sp.parse_args()
        return child_main(a) if a.cmd == "child" else perf_main(a)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("outdir")
    ap.add_argument("--fuzz", type=int, default=150)
    ap.add_argument("--skip", default="", help="comma-separated sections to skip: pytest, diff, perf")
    ap.add_argument("--standalone", action="store_true",
                    help="BUNDLE is make_kernel_proof.py's directory: run the kernels alone "
                    "(hang input, differential, issue 29's shape, concentrated and tied "
                    "scores), no stock vLLM")
    args = ap.parse_args()
    if args.standalone:
        return standalone_main(args)
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("PROOF_WORK", "/tmp/vllm-binary-proof"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    skip = set(filter(None, args.skip.split(",")))
    import torch

    meta = make_sites(Path(args.bundle), work)
    sites = {k: Path(v) for k, v in meta["sites"].items()}
    dist = meta["plugin_dist"]
    report: dict = {"bundle": {k: v for k, v in meta.items() if k != "sites"},
                    "device": torch.cuda.get_device_name(0),
                    "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
                    "torch": torch.__version__, "sections": {}}
    expect: list[tuple[str, bool, str]] = []

    def section(name: str, value) -> None:
        report["sections"][name] = value
        (out / "vllm_binary_proof.json").write_text(json.dumps(report, indent=1))

    # 1. Safe cases first: the rebuilt kernel through each route.
    hang = {**HANG_CASE, "id": "hang-input"}
    log("plugin through vLLM's loader")
    r, d = run_cases([hang, {**hang, "id": "hang-input-graph", "graph": True}], sites["plugin"],
                     "plugins", work, "plugin")
    section("plugin_loader", {"dispatch": d, "results": r})
    expect += [("plugin: dispatcher names the dsv4patch kernel for both ops",
                all("dsv4patch_bindings" in (d.get(op) or "") for op in d), str(d)),
               ("plugin: hang input right", r["hang-input"]["status"] == "ok", str(r["hang-input"])),
               ("plugin: hang input right in CUDA-graph replay", r["hang-input-graph"]["status"] == "ok",
                str(r["hang-input-graph"]))]
    log("hook route, spawned child")
    r, d = run_cases([{**hang, "id": "spawned", "spawn": True}], sites["hook"], "import", work, "spawn")
    section("hook_spawned_child", {"dispatch": d, "results": r})
    expect.append(("hook: spawned child runs the rebuilt kernel, right",
                   r.get("spawned", {}).get("status") == "ok" and "dsv4patch_bindings" in
                   (d.get("persistent_topk") or ""), str(r)))
    log("checks: VLLM_PLUGINS naming another plugin only")
    other = {"VLLM_PLUGINS": "some_other_plugin"}
    chk_hook = check_cli(sites["hook"], dist, other)
    chk_plugin = check_cli(sites["plugin"], dist, other)
    chk_plugin_default = check_cli(sites["plugin"], dist)
    section("checks", {"hook_VLLM_PLUGINS_other": chk_hook, "plugin_VLLM_PLUGINS_other": chk_plugin,
                       "plugin_default": chk_plugin_default})
    rep = chk_hook["report"]
    expect += [
        ("check, hook + VLLM_PLUGINS=other: dsv4patch kernel active via the hook",
         chk_hook["rc"] == 0 and rep.get("activated_by") == "vllm-hook", json.dumps(rep.get("ops"))),
        ("check, hook + VLLM_PLUGINS=other: entry-point route reported inactive",
         rep.get("routes", {}).get("entry-point", {}).get("active") is False
         and rep.get("routes", {}).get("entry-point", {}).get("allowed_by_VLLM_PLUGINS") is False,
         json.dumps(rep.get("routes"))),
        ("check, plugin only + VLLM_PLUGINS=other: stock kernel reported (exit 1)",
         chk_plugin["rc"] == 1 and chk_plugin["report"].get("status") == "stock", str(chk_plugin["rc"])),
        ("check, plugin only, default: entry-point active (exit 0)",
         chk_plugin_default["rc"] == 0 and chk_plugin_default["report"].get("activated_by") == "entry-point",
         str(chk_plugin_default["rc"])),
    ]
    log("guard: a wheel without code for this GPU")
    chk_unc = check_cli(sites["uncovered"], dist)
    chk_unc_strict = check_cli(sites["uncovered"], dist, {"DSV4PATCH_KERNELS_STRICT": "1"})
    section("guard", {"uncovered": chk_unc, "uncovered_strict": chk_unc_strict})
    expect += [("guard: uncovered GPU keeps the stock kernel, error in vLLM's log",
                chk_unc["rc"] == 1 and "carry no code for this GPU" in chk_unc["log"],
                chk_unc["log"][-300:]),
               ("guard: strict mode raises", chk_unc_strict["rc"] != 0
                and "KernelsError" in chk_unc_strict["log"]
                and "status" not in chk_unc_strict["report"], chk_unc_strict["log"][-300:])]

    # 2. vLLM-tree tests in the hook setup (their children import only vllm._C_stable_libtorch).
    if "pytest" not in skip:
        log("vLLM-tree tests (hook site)")
        env = {**os.environ, "PYTHONPATH": f"{sites['hook']}:{meta['tests_root']}"}
        tests = sorted(str(p.relative_to(meta["tests_root"]))
                       for p in Path(meta["tests_root"]).glob("tests/kernels/test_dsv4_*.py"))
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "--noconftest", "-rA", *tests], cwd=meta["tests_root"], env=env,
                             capture_output=True, text=True, timeout=900)
        section("vllm_tree_tests", {"tests": tests, "rc": res.returncode, "tail": res.stdout[-3000:]})
        last = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr[-300:]
        expect.append(("vLLM-tree tests of fix 7 and extras pass, none skipped (hook setup)",
                       res.returncode == 0 and "passed" in last and "skipped" not in last, last))

    # 3. Differential test of the rebuilt kernel (default series) against torch.topk.
    if "diff" not in skip:
        differential(sites["hook"], "import", work, args.fuzz, section, expect)

    # 4. Throughput, stock against rebuilt, same run.
    if "perf" not in skip:
        log("throughput")
        stock = run_perf(sites["stock"], "stock", work, "stock")
        patched = run_perf(sites["hook"], "import", work, "patched")
        ratios = [s["us"] / p["us"] for s, p in zip(stock["rows"], patched["rows"], strict=True)]
        gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        section("throughput", {"stock": stock, "patched": patched,
                               "throughput_ratio_geomean": round(gm, 4),
                               "min_ratio": round(min(ratios), 4)})
        expect.append(("throughput patched/stock >= 0.98 (geometric mean)", gm >= 0.98, f"{gm:.4f}"))

    # 5. Last: the stock kernel alone on the hang input (hangs; the child is killed).
    log("stock kernel alone on the hang input")
    r, d = run_cases([hang, {**hang, "id": "hang-input-graph", "graph": True}], sites["stock"],
                     "stock", work, "stock")
    section("stock_only", {"dispatch": d, "results": r})
    expect += [("stock: dispatcher names vLLM's own registration", all(
                    "dsv4patch" not in (v or "") for v in d.values()) and bool(d), str(d)),
               ("stock: hang input hangs", r["hang-input"]["status"] == "hang", str(r["hang-input"])),
               ("stock: hang input hangs in CUDA-graph replay", r["hang-input-graph"]["status"] == "hang",
                str(r["hang-input-graph"]))]

    report["expectations"] = [{"what": w, "ok": ok, "detail": det[:400]} for w, ok, det in expect]
    report["ok"] = all(ok for _, ok, _ in expect)
    (out / "vllm_binary_proof.json").write_text(json.dumps(report, indent=1))
    lines = [f"# Fix 7 with vLLM {meta['vllm_version']}'s own binary on {report['device']} "
             f"(sm_{report['capability'].replace('.', '')}, torch {report['torch']})", "",
             f"Patched tree `{meta['tree_id']}`, plugin wheel `{meta['plugin_wheel']}`, stock "
             f"`_C_stable_libtorch.abi3.so` sha256 `{meta['stock_so_sha256'][:16]}…` from "
             f"`{meta['stock_wheel']}`.", "", "| expectation | ok | detail |", "|---|---|---|"]
    lines += [f"| {w} | {'yes' if ok else '**NO**'} | {det[:160].replace('|', '/')} |"
              for w, ok, det in expect]
    lines += ["", f"All expectations held: **{report['ok']}**", ""]
    (out / "vllm_binary_proof.md").write_text("\n".join(lines))
    log(f"ok={report['ok']}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
