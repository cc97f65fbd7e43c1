#!/usr/bin/env python3
"""How much `dsv4patch check` costs over the bare git loop it is built on.

Measured in one run, on the same materialized pins and the same patch files:

* baseline: for each pin, a fresh scratch index loaded with the pin's base
  commit and, per patch in series order, ``git apply --cached --check`` then
  ``git apply --cached`` (the minimal loop that checks a *series*: later
  patches must see earlier ones);
* dsv4patch: ``dsv4patch check --lock LOCK --format json`` as a subprocess
  (CLI start-up, lock parsing, markers, offset/conflict parsing, report).

Both run on a warm cache (pins already materialized), alternating, N rounds;
the report gives medians and the ratio.  A second table times materializing
0.27.1: cold (verified sdist blob present, tree not yet built: extract + git
commit) against warm (tree cached).  Usage::

    python benchmarks/check_speed.py --lock locks/vllm.toml --rounds 5 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dsv4patch import git, tree  # noqa: E402
from dsv4patch.lock import load  # noqa: E402
from dsv4patch.progress import Progress  # noqa: E402
from dsv4patch.series import series_for_pin  # noqa: E402
from dsv4patch.store import Store  # noqa: E402


def baseline(pins: list[tuple[Path, str, list[Path]]]) -> float:
    t0 = time.perf_counter()
    for repo, base, patches in pins:
        with git.scratch_index(repo, base) as env:
            for p in patches:
                if git.apply(repo, p, env=env, check_only=True).ok:
                    git.apply(repo, p, env=env)
    return time.perf_counter() - t0


def dsv4patch_check(lock: Path, cache: Path) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "dsv4patch", "check", "--lock", str(lock), "--cache-dir", str(cache),
         "--format", "json"], capture_output=True, text=True, cwd=ROOT,
    )
    elapsed = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"dsv4patch check failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lock", type=Path, default=ROOT / "locks" / "vllm.toml")
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    store = Store.open(args.cache_dir)
    lock = load(args.lock)
    quiet = Progress(False)
    pins = []
    for pin in lock.pins.values():
        repo = tree.materialize(pin, store, quiet)  # warm the cache (untimed)
        pins.append((repo.repo, repo.base_commit, [p.path for p in series_for_pin(lock, pin).patches]))
    dsv4patch_check(args.lock, store.root)  # warm-up
    base_t, tool_t = [], []
    for _ in range(args.rounds):
        base_t.append(baseline(pins))
        tool_t.append(dsv4patch_check(args.lock, store.root))
    b, t = statistics.median(base_t), statistics.median(tool_t)

    # Materialization of 0.27.1: cold (blob only) vs warm (tree cached).
    pin = lock.pin("0.27.1")
    blob = store.blob_path(pin.source.sha256)
    cold_t, warm_t = [], []
    for _ in range(max(1, args.rounds // 2)):
        with tempfile.TemporaryDirectory(prefix="dsv4-bench-") as d:
            fresh = Store.open(Path(d))
            shutil.copyfile(blob, fresh.blob_path(pin.source.sha256))
            t0 = time.perf_counter()
            tree.materialize(pin, fresh, quiet)
            cold_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            tree.materialize(pin, fresh, quiet)
            warm_t.append(time.perf_counter() - t0)
    c, w = statistics.median(cold_t), statistics.median(warm_t)

    n_patches = sum(len(p[2]) for p in pins)
    result = {
        "pins": len(pins), "patch_checks": n_patches, "rounds": args.rounds,
        "baseline_git_loop_s": base_t, "dsv4patch_check_s": tool_t,
        "median_baseline_s": b, "median_dsv4patch_s": t, "ratio_dsv4patch_over_git": t / b,
        "materialize_cold_s": cold_t, "materialize_warm_s": warm_t, "ratio_cold_over_warm": c / w,
        "cpu": os.cpu_count(), "python": sys.version.split()[0],
    }
    md = [
        "# `dsv4patch check` vs a bare `git apply` loop (warm cache)", "",
        f"{len(pins)} pins, {n_patches} patch checks per run, {args.rounds} alternating rounds, "
        f"{os.cpu_count()} CPUs.", "",
        "| what | median s | ratio |", "|---|---|---|",
        f"| bare loop: `git apply --cached --check` + `--cached` per patch | {b:.3f} | 1.00 |",
        f"| `dsv4patch check --format json` (subprocess, whole lock) | {t:.3f} | {t / b:.2f} |", "",
        "# Materializing pin 0.27.1", "",
        "| what | median s | ratio |", "|---|---|---|",
        f"| warm (tree cached) | {w:.3f} | 1.00 |",
        f"| cold (verified sdist in cache; extract + git commit) | {c:.3f} | {c / w:.0f} |", "",
        "A cold cache with no sdist adds the download (39 MB from PyPI; network-dependent, not timed here).",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "check_speed.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "check_speed.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
