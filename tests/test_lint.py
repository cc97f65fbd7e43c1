"""Names that do not exist fail here, not in a user's run.

Merging work that made imports lazy (the check cache, issue 14) with work
that used a module-level name (lock.set_variant, issue 13) left a NameError
that only one CLI path reached. pyflakes finds undefined names statically in
every module of the package, the GPU scripts and the benchmarks.
"""

from __future__ import annotations

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
