#!/usr/bin/env python3
"""Warm `dsv4patch wheel --pin 0.27.1` against copying the stock wheel, and where its time goes.

The same measurement as the wheel row of ``benchmarks/run_all.py`` (goal: at most 12x the
copy), alone, so that a change to the wheel can be measured in a few minutes: rounds
alternate a copy of the stock wheel (``shutil.copyfile``, the baseline) and the CLI as a
user runs it (a subprocess, start-up included) on a warm cache; medians of wall and CPU
seconds (user + system, children included), the load average before and after.

Where the time goes: a further run per round under ``cProfile`` (slower than the timed
runs, so only its shares count), the cumulative seconds of the wheel's steps: start-up
(before ``make_wheel``), the patched tree, the stock wheel verified in the cache, the
kernel step (apply into the cache's tree, the kernel build: plan, toolchain, link,
package), reading the kernel wheel, and the repack (reading the stock wheel, waiting
for RECORD checks, writing).  Usage::

    python benchmarks/wheel_speed.py [--rounds 5] [--load 0] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import datetime
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_cli import ENV, ROOT, run_cli, write_report
from run_all import GOALS, ONE, busy, load_avg, ratio, timed

sys.path.insert(0, str(ROOT))
from dsv4patch.kernels import stock  # noqa: E402
from dsv4patch.pins.lock import load  # noqa: E402
from dsv4patch.progress import Progress  # noqa: E402
from dsv4patch.settings import Settings  # noqa: E402
from dsv4patch.store import Store  # noqa: E402

# (label, module file suffix, function): the steps of a warm wheel, as cProfile names them.
STEPS = [
    ("make_wheel (all but start-up)", "delivery/vllm_wheel.py", "make_wheel"),
    ("patched tree (check of the series, tree read)", "series/pincheck.py", "patched_tree"),
    ("kernel step: apply into the cache's tree", "checkout/applying.py", "apply_pin"),
    ("kernel step: build (plan, toolchain, link, package)", "kernels/building.py", "build_tree"),
    ("kernel step: package the kernel wheel", "kernels/build.py", "package"),
    ("kernel wheel read (members inflated, CRC)", "delivery/vllm_wheel.py", "read_kernels"),
    ("stock wheel verified in the cache (sha256 of the file)", "kernels/stock.py", "wheel_path"),
    ("repack (all)", "delivery/vllm_wheel.py", "build"),
    ("repack: read the stock wheel", "delivery/vllm_wheel.py", "_read_stock_bytes"),
    ("repack: write members", "zipcopy.py", "add"),
    ("repack: wait for RECORD checks", "delivery/vllm_wheel.py", "_next"),
]


def wheel_args(lock: Path, cache: str, out: Path) -> list[str]:
    return ["wheel", "--lock", str(lock), "--pin", ONE, "--cache-dir", cache, "--out", str(out)]


def profile(lock: Path, cache: str, out: Path, prof: Path) -> dict[str, float]:
    """One profiled warm wheel: the cumulative seconds of each of STEPS, and the whole run's."""
    cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "dsv4patch", *wheel_args(lock, cache, out),
           "--format", "json"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=ENV)
    if res.returncode != 0:
        raise SystemExit(f"`{' '.join(cmd)}` failed:\n{res.stderr[-3000:]}")
    stats: dict[Any, Any] = pstats.Stats(str(prof)).stats  # type: ignore[attr-defined]
    got: dict[str, float] = {}
    for label, suffix, func in STEPS:
        got[label] = sum(v[3] for (fname, _line, name), v in stats.items()
                         if name == func and fname.replace(os.sep, "/").endswith("dsv4patch/" + suffix))
    got["whole run (profiled)"] = max(v[3] for v in stats.values())
    got["outside make_wheel (imports, options, rendering)"] = got["whole run (profiled)"] - got[STEPS[0][0]]
    return got


def measure(ctx: dict[str, Any], rounds: int, load_procs: int) -> dict[str, Any]:
    cache = str(ctx["store"].root)
    out: dict[str, Any] = {k: [] for k in ("copy_s", "wheel_s", "copy_s_cpu", "wheel_s_cpu")}
    split: list[dict[str, float]] = []
    with busy(load_procs), tempfile.TemporaryDirectory(prefix="dsv4-bench-wheel-") as d:
        out["loadavg_start"] = load_avg()
        for i in range(rounds):
            dest, wout = Path(d) / f"copy-{i}.whl", Path(d) / f"w-{i}"
            out["copy_s"].append(timed(lambda dest=dest: shutil.copyfile(ctx["stock_wheel"], dest),
                                       out["copy_s_cpu"]))
            dest.unlink()
            out["wheel_s"].append(timed(lambda wout=wout: run_cli(wheel_args(ctx["lock"], cache, wout), env=ENV),
                                        out["wheel_s_cpu"]))
            shutil.rmtree(wout)
            split.append(profile(ctx["lock"], cache, Path(d) / f"p-{i}", Path(d) / f"p-{i}.prof"))
            shutil.rmtree(Path(d) / f"p-{i}")
        out["loadavg_end"] = load_avg()
    ratio(out, "wheel_s", "copy_s")
    out["split"] = {k: statistics.median(s[k] for s in split) for k in split[0]}
    return out


def markdown(res: dict[str, Any]) -> str:
    m, w = statistics.median, res["wheel"]
    lines = [
        f"# Warm `wheel --pin {ONE}` against a copy of the stock wheel (benchmarks/wheel_speed.py)", "",
        f"Measured {res['date']} by `python benchmarks/wheel_speed.py --rounds {res['rounds']} --load {res['load']}` "
        f"on {res['cpus']} CPUs (load average {w['loadavg_start']} at the start, {w['loadavg_end']} at the end; "
        f"{res['load']} busy processes of ours), stock wheel {res['stock_mb']:.0f} MB.", "",
        "| what | median |", "|---|---|",
        f"| copy of the stock wheel, wall / CPU | {m(w['copy_s']):.3f} s / {m(w['copy_s_cpu']):.3f} s |",
        f"| warm `wheel`, wall / CPU | {m(w['wheel_s']):.3f} s / {m(w['wheel_s_cpu']):.3f} s |",
        f"| wall ratio (goal <= {GOALS['wheel_over_copy']:g}) | **{w['ratio']:.2f}** "
        f"({'met' if w['ratio'] <= GOALS['wheel_over_copy'] else 'NOT met'}) |",
        f"| CPU ratio | {w['cpu_ratio']:.2f} |", "",
        "Where a warm `wheel` spends its time (cProfile, cumulative seconds, median of the rounds; "
        "profiling slows the run, the shares are what count):", "",
        "| step | seconds | share |", "|---|---|---|",
    ]
    whole = w["split"]["whole run (profiled)"]
    for label, secs in w["split"].items():
        lines.append(f"| {label} | {secs:.3f} | {100 * secs / whole:.0f}% |")
    lines += ["", "Per round, wall seconds: copy " + ", ".join(f"{x:.3f}" for x in w["copy_s"])
              + "; wheel " + ", ".join(f"{x:.3f}" for x in w["wheel_s"]) + "."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lock", type=Path, default=ROOT / "locks" / "vllm.toml")
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--load", type=int, default=0, help="busy processes of ours during the runs (default 0)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    store = Store.open(args.cache_dir or Settings.from_environ(os.environ).cache_root())
    stock_wheel = stock.wheel_path(store, stock.wheel_for(load(args.lock).pin(ONE), "x86_64"), Progress(False))
    with tempfile.TemporaryDirectory(prefix="dsv4-bench-wheel-") as d:  # warm-up: tree, kernels, verdict
        run_cli(wheel_args(args.lock, str(store.root), Path(d)), env=ENV)
    ctx = {"lock": args.lock, "store": store, "stock_wheel": stock_wheel}
    res = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "rounds": args.rounds, "load": args.load, "cpus": os.cpu_count(),
           "stock_mb": stock_wheel.stat().st_size / 1e6, "wheel": measure(ctx, args.rounds, args.load)}
    text = markdown(res)
    write_report(args.out, "wheel_speed", res, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
