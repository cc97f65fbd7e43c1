#!/usr/bin/env python3
"""How much `dsv4patch check` costs over the bare git loop it is built on.

The three goals of issue 14, measured in one run (``ratios`` in the JSON):

* warm, whole lock: ``dsv4patch check`` (CLI start-up included; results from
  the check cache) against the bare loop over every pin: goal <= 0.5;
* warm, one pin: ``dsv4patch check --pin 0.27.1`` against the bare loop over
  that pin alone: goal <= 1.0;
* cold, one pin: a store holding only the verified sdist (no tree, no cached
  result), ``check --pin 0.27.1`` against materializing the pin in-process
  plus its bare loop: goal <= 1.5.  The whole lock cold (pins in parallel)
  against materializing every pin one after the other plus the bare loop is
  reported too.

Measured on the same materialized pins and the same patch files:

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
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_cli import ENV, run_cli, write_report  # noqa: E402
from dsv4patch import git
from dsv4patch.pins import repository  # noqa: E402
from dsv4patch.pins.lock import load  # noqa: E402
from dsv4patch.progress import Progress  # noqa: E402
from dsv4patch.series.patches import series_for_pin  # noqa: E402
from dsv4patch.settings import Settings  # noqa: E402
from dsv4patch.store import Store  # noqa: E402

ONE = "0.27.1"


def baseline(pins: list[tuple[Path, str, list[Path]]]) -> float:
    t0 = time.perf_counter()
    for repo, base, patches in pins:
        with git.scratch_index(repo, base) as env:
            for p in patches:
                if git.apply(repo, p, env=env, check_only=True).ok:
                    git.apply(repo, p, env=env)
    return time.perf_counter() - t0




def dsv4patch_check(lock: Path, cache: Path, *extra: str) -> float:
    return run_cli(["check", "--lock", str(lock), "--cache-dir", str(cache), *extra], env=ENV)[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lock", type=Path, default=ROOT / "locks" / "vllm.toml")
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    store = Store.open(args.cache_dir or Settings.from_environ(os.environ).cache_root())
    lock = load(args.lock)
    quiet = Progress(False)
    pins = []
    for pin in lock.pins.values():
        repo = repository.materialize(pin, store, quiet)  # warm the cache (untimed)
        pins.append((repo.repo, repo.base_commit, [p.path for p in series_for_pin(lock, pin).patches]))
    dsv4patch_check(args.lock, store.root)  # warm-up (fills the check cache)
    dsv4patch_check(args.lock, store.root, "--pin", ONE)
    one = [p for p, name in zip(pins, lock.pins, strict=True) if name == ONE]
    base_t, tool_t, base1_t, tool1_t, nocache_t = [], [], [], [], []
    for _ in range(args.rounds):
        base_t.append(baseline(pins))
        tool_t.append(dsv4patch_check(args.lock, store.root))
        base1_t.append(baseline(one))
        tool1_t.append(dsv4patch_check(args.lock, store.root, "--pin", ONE))
        nocache_t.append(dsv4patch_check(args.lock, store.root, "--no-cache"))
    b, t = statistics.median(base_t), statistics.median(tool_t)
    b1, t1 = statistics.median(base1_t), statistics.median(tool1_t)
    nc = statistics.median(nocache_t)

    # Cold: a store holding only the verified sdists.
    def fresh_store(d: str, names: list[str]) -> Store:
        fresh = Store.open(Path(d))
        for name in names:
            sha = lock.pin(name).source.sha256
            shutil.copyfile(store.blob_path(sha), fresh.blob_path(sha))
        return fresh

    cold_t, warm_t, cold_check_t = [], [], []
    for _ in range(max(1, args.rounds // 2)):
        with tempfile.TemporaryDirectory(prefix="dsv4-bench-") as d:
            fresh = fresh_store(d, [ONE])
            t0 = time.perf_counter()
            repository.materialize(lock.pin(ONE), fresh, quiet)
            cold_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            repository.materialize(lock.pin(ONE), fresh, quiet)
            warm_t.append(time.perf_counter() - t0)
        with tempfile.TemporaryDirectory(prefix="dsv4-bench-") as d:
            fresh = fresh_store(d, [ONE])
            cold_check_t.append(dsv4patch_check(args.lock, fresh.root, "--pin", ONE))
    c, w, cc = statistics.median(cold_t), statistics.median(warm_t), statistics.median(cold_check_t)
    cold_ref = c + b1
    names = [n for n in lock.pins if lock.pin(n).source.kind == "pypi-sdist"]
    with tempfile.TemporaryDirectory(prefix="dsv4-bench-") as d:
        fresh = fresh_store(d, names)
        t0 = time.perf_counter()
        for name in names:
            repository.materialize(lock.pin(name), fresh, quiet)
        all_seq = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="dsv4-bench-") as d:
        fresh = fresh_store(d, names)
        all_cold = dsv4patch_check(args.lock, fresh.root)
    all_ref = all_seq + b

    n_patches = sum(len(p[2]) for p in pins)
    ratios = {"warm_lock_over_bare_loop": t / b, "warm_one_pin_over_its_bare_loop": t1 / b1,
              "cold_one_pin_over_materialize_plus_bare_loop": cc / cold_ref,
              "cold_lock_over_sequential_materialize_plus_bare_loop": all_cold / all_ref}
    result = {
        "pins": len(pins), "patch_checks": n_patches, "rounds": args.rounds, "one_pin": ONE,
        "goals": {"warm_lock_over_bare_loop": 0.5, "warm_one_pin_over_its_bare_loop": 1.0,
                  "cold_one_pin_over_materialize_plus_bare_loop": 1.5},
        "ratios": ratios,
        "baseline_git_loop_s": base_t, "dsv4patch_check_s": tool_t, "dsv4patch_check_no_cache_s": nocache_t,
        "baseline_one_pin_s": base1_t, "dsv4patch_check_one_pin_s": tool1_t,
        "median_baseline_s": b, "median_dsv4patch_s": t, "ratio_dsv4patch_over_git": t / b,
        "median_no_cache_s": nc,
        "materialize_cold_s": cold_t, "materialize_warm_s": warm_t, "ratio_cold_over_warm": c / w,
        "check_one_pin_cold_s": cold_check_t,
        "materialize_all_sequential_s": all_seq, "check_lock_cold_s": all_cold,
        "cpu": os.cpu_count(), "python": sys.version.split()[0],
    }
    md = [
        "# `dsv4patch check` vs a bare `git apply` loop", "",
        f"{len(pins)} pins, {n_patches} patch checks per run, {args.rounds} alternating rounds, "
        f"{os.cpu_count()} CPUs; every `dsv4patch` time is a subprocess, CLI start-up included.", "",
        "| what | median s | ratio | goal |", "|---|---|---|---|",
        f"| bare loop, whole lock: `git apply --cached --check` + `--cached` per patch | {b:.3f} | 1.00 | |",
        f"| `dsv4patch check --format json`, whole lock, warm (cached result) | {t:.3f} | {t / b:.2f} | <= 0.5 |",
        f"| `dsv4patch check --no-cache`, whole lock, warm trees | {nc:.3f} | {nc / b:.2f} | |",
        f"| bare loop, pin {ONE} | {b1:.3f} | 1.00 | |",
        f"| `dsv4patch check --pin {ONE}`, warm (cached result) | {t1:.3f} | {t1 / b1:.2f} | <= 1.0 |",
        f"| materialize {ONE} cold (in-process) + its bare loop | {cold_ref:.3f} | 1.00 | |",
        f"| `dsv4patch check --pin {ONE}`, cold (only the sdist cached) | {cc:.3f} | {cc / cold_ref:.2f} | <= 1.5 |",
        f"| materialize all {len(names)} pins one by one + bare loop | {all_ref:.3f} | 1.00 | |",
        f"| `dsv4patch check`, whole lock cold (pins in parallel) | {all_cold:.3f} | {all_cold / all_ref:.2f} | |",
        "",
        "# Materializing pin 0.27.1", "",
        "| what | median s | ratio |", "|---|---|---|",
        f"| warm (tree cached) | {w:.3f} | 1.00 |",
        f"| cold (verified sdist in cache; extract + git commit) | {c:.3f} | {c / w:.0f} |", "",
        "A cold cache with no sdist adds the download (39 MB from PyPI; network-dependent, not timed here).",
    ]
    write_report(args.out, "check_speed", result, "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
