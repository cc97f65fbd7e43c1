"""What the benchmark scripts share: one timed run of the real CLI, and writing a result pair.

Every benchmark times dsv4patch the way a user runs it (a child ``python -m
dsv4patch ... --format json``), needs the wall seconds and the parsed JSON, and
must stop with the command's own output when it fails; each writes NAME.json
and NAME.md into its ``--out`` directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# PYTHONDONTWRITEBYTECODE in the caller's environment would make every run
# compile dsv4patch's modules again.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run_cli(args: list[str], env: dict[str, str] | None = None) -> tuple[float, dict[str, Any]]:
    """Run ``dsv4patch ARGS --format json`` from the repo root; (wall seconds, parsed JSON)."""
    cmd = [sys.executable, "-m", "dsv4patch", *args, "--format", "json"]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    elapsed = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"`{' '.join(cmd)}` failed (exit {res.returncode}):\n"
                         f"{res.stdout[-2000:]}\n{res.stderr[-4000:]}")
    return elapsed, json.loads(res.stdout)


def write_report(out: Path, name: str, result: dict[str, Any], markdown: str) -> None:
    """OUT/NAME.json (RESULT) and OUT/NAME.md (MARKDOWN)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{name}.md").write_text(markdown)
