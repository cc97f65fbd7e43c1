"""Names that do not exist, wrong types and lint fail here, not in a user's run.

Merging work that made imports lazy (the check cache, issue 14) with work
that used a module-level name (lock.set_variant, issue 13) left a NameError
that only one CLI path reached. pyflakes finds undefined names statically in
every module of the package, the GPU scripts and the benchmarks.

``mypy --strict`` (``[tool.mypy]`` in pyproject: strict, files = dsv4patch)
and ``ruff check`` (``[tool.ruff.lint]``; on the tests and benchmarks too) run as the venv's own
tools, the same checks as .pre-commit-config.yaml (issue 26); any finding fails
the test with the tool's report.  Two more tests give each tool a file with a
known finding, so a configuration that stopped checking would fail too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pyflakes import api, messages
from pyflakes.reporter import Reporter

from conftest import ROOT

FATAL = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


class _Collect(Reporter):
    def __init__(self) -> None:
        self.found: list[str] = []

    def flake(self, message: object) -> None:
        if isinstance(message, FATAL):
            self.found.append(str(message))

    def syntaxError(self, filename: str, msg: str, lineno: int, offset: int, text: str) -> None:  # noqa: N802
        self.found.append(f"{filename}:{lineno}: syntax error: {msg}")

    def unexpectedError(self, filename: str, msg: str) -> None:  # noqa: N802
        self.found.append(f"{filename}: {msg}")


def test_no_undefined_names() -> None:
    files = sorted(
        p for d in ("dsv4patch", "tests", "benchmarks") for p in (ROOT / d).rglob("*.py")
        if ".venv" not in p.parts
    )
    assert len(files) > 40
    rep = _Collect()
    for f in files:
        api.checkPath(str(f), rep)
    assert rep.found == []


def _tool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``python -m <tool> ...`` with this venv's python (mypy and ruff come with the test extra)."""
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, check=False)


def test_mypy_strict_passes_on_the_package() -> None:
    res = _tool("mypy")  # files and strictness from [tool.mypy]
    assert res.returncode == 0, f"mypy --strict found problems:\n{res.stdout}{res.stderr}"
    assert "Success: no issues found" in res.stdout, res.stdout


def test_ruff_passes_on_the_package_tests_and_benchmarks() -> None:
    res = _tool("ruff", "check", "--no-fix", "--output-format", "concise", "dsv4patch", "tests", "benchmarks")
    assert res.returncode == 0, f"ruff check found problems:\n{res.stdout}{res.stderr}"


def test_the_configured_checks_do_find_problems(tmp_path: Path) -> None:
    """The project's own configuration flags an untyped function, an unsorted import and a
    zip() without strict= (so the two tests above can fail)."""
    bad = tmp_path / "bad.py"
    bad.write_text("from __future__ import annotations\n\nimport sys\nimport os\n\n\n"
                   "def pairs(a, b):\n    return list(zip(a, b)), os.sep, sys.argv\n")
    res = _tool("mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(ROOT / ".mypy_cache"),
                str(bad), cwd=tmp_path)
    assert res.returncode == 1 and "[no-untyped-def]" in res.stdout, res.stdout + res.stderr
    res = _tool("ruff", "check", "--no-fix", "--no-cache", "--output-format", "concise", "--config", str(ROOT / "pyproject.toml"),
                str(bad), cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "I001" in res.stdout and "B905" in res.stdout, res.stdout


def test_pre_commit_runs_the_same_checks() -> None:
    """.pre-commit-config.yaml's hooks are the two commands above, with the project's venv."""
    text = (ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8")
    entries = [line.split("entry:", 1)[1].strip() for line in text.splitlines() if "entry:" in line]
    assert entries == [".venv/bin/python -m ruff check --no-fix dsv4patch tests benchmarks",
                       ".venv/bin/python -m mypy"]
