"""The committed GPU evidence (tests/gpu/results/) is small, readable and remakes its verdicts.

Only the current verdict of each proof and the device runs it is made from stay in the
tree (older runs are in git history, at the commit tests/gpu/results/e2e/README.md names).
These tests keep it that way: the end-to-end verdict is remade on CPU from the committed
runs with the command its README shows and must equal the committed file byte for byte;
the folder stays under 2 MB with long results gzipped; every run folder is described.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "tests" / "gpu" / "results"
E2E = RESULTS / "e2e"
VERDICT = E2E / "issue-15-verdict" / "e2e_results.md"
LIMIT = 2_000_000  # bytes, issue 26


def _files() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*") if p.is_file())


def test_results_stay_under_two_megabytes() -> None:
    total = sum(p.stat().st_size for p in _files())
    assert total < LIMIT, f"tests/gpu/results holds {total:,} bytes (limit {LIMIT:,}): move superseded runs out"


def test_long_results_are_gzipped() -> None:
    """JSON results and logs over 64 KiB are committed as .gz (run_e2e.py --report reads .json.gz)."""
    big = [p.relative_to(RESULTS) for p in _files()
           if p.suffix in {".json", ".txt", ".log"} and p.stat().st_size > 64 * 1024]
    assert big == []


def _verdict_command() -> str:
    readme = (E2E / "README.md").read_text()
    blocks = re.findall(r"^    python3 tests/gpu/e2e/run_e2e\.py --report /tmp/issue-15-verdict .*?(?=\n\n)",
                        readme, re.M | re.S)
    assert len(blocks) == 1, "tests/gpu/results/e2e/README.md shows the command that remakes the verdict"
    return str(blocks[0])


def test_verdict_is_remade_from_the_committed_runs(tmp_path: Path) -> None:
    """The README's command, run on the committed JSON, gives the committed verdict byte for byte."""
    command = _verdict_command().replace("/tmp/issue-15-verdict", str(tmp_path / "verdict"))
    command = re.sub(r"^\s*python3 ", f"{sys.executable} ", command)
    res = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "verdict" / "e2e_results.md").read_bytes() == VERDICT.read_bytes()


def test_every_run_folder_is_described() -> None:
    """Each committed run folder is named in the results README, and each call it names is there."""
    readme = (E2E / "README.md").read_text()
    for run in sorted(p.name for p in E2E.iterdir() if p.is_dir() and p.name.startswith("run-")):
        assert f"`{run}/`" in readme, f"{run} is not described in tests/gpu/results/e2e/README.md"
    for call in re.findall(r"`(run-\d+[a-z]-[^`/]*)/`", readme):
        if "(full series only)" not in readme.split(f"`{call}/`", 1)[1].split("\n", 1)[0]:
            assert (E2E / call).is_dir(), f"{call} is named as committed but is not in the tree"


def test_kernel_proof_report_holds() -> None:
    """The committed kernel proof (vLLM's own binary) is one run: JSON and Markdown agree, all held."""
    report = json.loads((RESULTS / "vllm_binary_proof.json").read_text())
    md = (RESULTS / "vllm_binary_proof.md").read_text()
    rows = re.findall(r"^\| (.+?) \| (yes|no) \|", md, re.M)
    assert report["ok"] is True and "All expectations held: **True**" in md
    assert len(rows) == len(report["expectations"]) and all(ok == "yes" for _, ok in rows)
