"""Progress display for long steps (download, extract, build).

A person at a terminal sees a rich progress bar; ``--format json`` runs and
non-TTY output (CI logs, pipes) see nothing, so machine-readable output stays
clean.  Code that does long work takes a :class:`Progress` and never checks
the terminal itself.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Task(Protocol):
    def advance(self, n: int) -> None: ...

    def update(self, description: str) -> None: ...


class _NullTask:
    def advance(self, n: int) -> None:
        pass

    def update(self, description: str) -> None:
        pass


class Progress:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    @classmethod
    def for_output(cls, fmt: str) -> Progress:
        return cls(fmt != "json" and sys.stderr.isatty())

    @contextmanager
    def task(self, description: str, total: int | None, unit: str = "bytes") -> Iterator[Task]:
        """A bar for ``total`` units (``bytes``: sizes and ETA; else ``done/total unit``).

        ``total=None`` is a step of unknown length (a git import or fetch): a
        pulsing bar with the elapsed time.
        """
        if not self.enabled:
            yield _NullTask()
            return
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress

        from dsv4patch.report import console, literal

        # A description names a pin or a file: shown literally, never read as markup.
        columns = [TextColumn("{task.description}", markup=False), BarColumn()]
        if total and unit == "bytes":
            columns += [DownloadColumn(), TimeRemainingColumn()]
        elif total:
            columns += [MofNCompleteColumn(), TextColumn(unit), TimeElapsedColumn()]
        else:
            columns += [TimeElapsedColumn()]
        with RichProgress(*columns, console=console(stderr=True), transient=True) as bar:
            tid = bar.add_task(literal(description), total=total)

            class _T:
                def advance(self, n: int) -> None:
                    bar.advance(tid, n)

                def update(self, description: str) -> None:
                    bar.update(tid, description=literal(description))

            yield _T()

    def note(self, message: str) -> None:
        if self.enabled:
            from dsv4patch.report import literal

            print(literal(message), file=sys.stderr)
