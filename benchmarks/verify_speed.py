#!/usr/bin/env python3
"""How long `dsv4patch verify --pin 0.27.1` takes, per phase, warm and with nothing changed.

Both runs are the CLI as a user runs it (a subprocess, start-up included) on a
warm cache (pin materialized, CPU test venv built):

* warm: ``--no-cache``, so both pytest sessions (before: the unpatched pin plus
  every patch's test files; after: the patched tree) really run: goal <= 60 s;
* unchanged: the same command again without ``--no-cache``: the results come
  from the store (same tree ids, tests and venv): goal <= 5 s.

The per-phase split is verify's own ``phases`` (prepare: materialize, series,
tree states; venv: pick the test venv; tests: the sessions, run at the same
time).  Usage::

    python benchmarks/verify_speed.py --pin 0.27.1 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench_cli import ENV, ROOT, run_cli, write_report


def verify(lock: Path, pin: str, cache: Path | None, *extra: str) -> tuple[float, dict]:
    args = ["verify", "--lock", str(lock), "--pin", pin, *extra] + (["--cache-dir", str(cache)] if cache else [])
    return run_cli(args, env=ENV)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lock", type=Path, default=ROOT / "locks" / "vllm.toml")
    ap.add_argument("--pin", default="0.27.1")
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    verify(args.lock, args.pin, args.cache_dir)  # make sure the venv and trees are warm (untimed)
    warm_s, warm = verify(args.lock, args.pin, args.cache_dir, "--no-cache")
    same_s, same = verify(args.lock, args.pin, args.cache_dir)
    assert same["patches"] == warm["patches"], "cached results differ from the run"
    verdicts = {k.split("-")[0]: v["verdict"] for k, v in warm["patches"].items()}
    result = {"pin": args.pin, "cpu": os.cpu_count(), "python": sys.version.split()[0],
              "warm_s": warm_s, "warm_phases": warm["phases"], "warm_sessions": warm["sessions"],
              "unchanged_s": same_s, "unchanged_phases": same["phases"], "unchanged_sessions": same["sessions"],
              "goals": {"warm_s": 60, "unchanged_s": 5}, "verdicts": verdicts}
    phases = sorted(set(warm["phases"]) | set(same["phases"]))
    md = [f"# `dsv4patch verify --pin {args.pin}` (CPU, warm venv)", "",
          f"{os.cpu_count()} CPUs; wall seconds of the CLI (start-up included), and verify's own phases.", "",
          "| run | wall s | goal | " + " | ".join(phases) + " | pytest sessions |",
          "|---" * (len(phases) + 4) + "|",
          f"| warm (`--no-cache`) | {warm_s:.1f} | <= 60 | "
          + " | ".join(f"{warm['phases'].get(p, 0):.1f}" for p in phases)
          + f" | {warm['sessions']['run']} run |",
          f"| nothing changed (cached) | {same_s:.2f} | <= 5 | "
          + " | ".join(f"{same['phases'].get(p, 0):.2f}" for p in phases)
          + f" | {same['sessions']['cached']} cached |", "",
          "Verdicts: " + ", ".join(f"{k} {v}" for k, v in verdicts.items())]
    write_report(args.out, "verify_speed", result, "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
