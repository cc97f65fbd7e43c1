"""Progress display for long steps (download, extract, check, build, test sessions).

A person at a terminal sees a live rich display (a bar with sizes, units or
counts, or a spinner with the elapsed time), redrawn every second, on stderr;
off a terminal (CI logs, pipes) each step is one plain line on stderr when it
starts; ``--format json`` runs show nothing, so machine-readable output stays
clean.  Code that does long work takes a :class:`Progress` and never checks
the terminal itself.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol


class Task(Protocol):
    def advance(self, n: int) -> None: ...

    def update(self, description: str) -> None: ...


class _NullTask:
    def advance(self, n: int) -> None:
        pass

    def update(self, description: str) -> None:
        pass


class _LoggedTask:
    """Off a terminal: the step's line is written once; later updates are not (a log, not a display)."""

    def advance(self, n: int) -> None:
        pass

    def update(self, description: str) -> None:
        pass


class Progress:
    """Where long steps are shown: ``enabled``, live on the terminal; ``log``, one line each (off a
    terminal); neither, nowhere (``--format json``, and the workers of a parallel step)."""

    def __init__(self, enabled: bool, log: bool = False) -> None:
        self.enabled = enabled  # live display on the terminal
        self.log = log and not enabled  # one plain line per step on stderr
        self._bar: Any = None  # the live rich display while a task runs (tasks nest in it)
        self._open = 0

    @classmethod
    def for_output(cls, fmt: str) -> Progress:
        tty = sys.stderr.isatty()
        return cls(fmt != "json" and tty, log=fmt != "json" and not tty)

    def _log(self, line: str) -> None:
        from dsv4patch.report import literal

        print(f"dsv4patch: {literal(line)}", file=sys.stderr, flush=True)

    @contextmanager
    def task(self, description: str, total: int | None, unit: str = "bytes") -> Iterator[Task]:
        """A step, with ``total`` units (``bytes``: sizes; else ``done/total unit``) and the elapsed time.

        ``total=None`` is a step of unknown length (a git import, a pip install, a test
        session): a pulsing bar with the elapsed time.  Steps may nest (a pin fetched
        inside a check): each is a line of the same live display, gone when it ends.
        """
        if not self.enabled:
            if self.log:
                amount = (f" ({_size(total)})" if unit == "bytes" else f" ({total} {unit})") if total else ""
                self._log(description + amount)
                yield _LoggedTask()
            else:
                yield _NullTask()
            return
        from dsv4patch.report import literal

        bar = self._start()
        tid = bar.add_task(literal(description), total=total, unit=unit)
        self._open += 1
        try:

            class _T:
                def advance(self, n: int) -> None:
                    bar.advance(tid, n)

                def update(self, description: str) -> None:
                    bar.update(tid, description=literal(description))

            yield _T()
        finally:
            bar.remove_task(tid)
            self._open -= 1
            if self._open == 0:
                bar.stop()
                self._bar = None

    def step(self, description: str) -> AbstractContextManager[Task]:
        """A step of unknown length (``task(description, None)``)."""
        return self.task(description, None)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Take the live display off the screen while a command prints its result (a table shown
        before a long build), then bring it back below."""
        bar = self._bar
        if bar is None:
            yield
            return
        bar.stop()
        try:
            yield
        finally:
            bar.start()

    def _start(self) -> Any:
        if self._bar is not None:
            return self._bar
        from rich.progress import BarColumn, DownloadColumn, ProgressColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress
        from rich.text import Text

        from dsv4patch.report import console

        class Amount(ProgressColumn):
            """Sizes for a download, ``done/total unit`` for counted work, nothing for the rest."""

            def render(self, task: Any) -> Any:
                if task.total is None:
                    return Text("")
                if task.fields.get("unit") == "bytes":
                    return DownloadColumn().render(task)
                return Text(f"{int(task.completed)}/{int(task.total)} {task.fields.get('unit', '')}")

        # A description names a pin or a file: shown literally, never read as markup.
        self._bar = RichProgress(TextColumn("{task.description}", markup=False), BarColumn(), Amount(),
                                 TimeElapsedColumn(), console=console(stderr=True), transient=True,
                                 refresh_per_second=4, redirect_stdout=False, redirect_stderr=False)
        self._bar.start()
        return self._bar

    def note(self, message: str) -> None:
        from dsv4patch.report import literal

        if self.enabled:
            if self._bar is not None:  # above the live display, which stays below
                self._bar.console.print(literal(message), markup=False, highlight=False, soft_wrap=True)
            else:
                print(literal(message), file=sys.stderr)
        elif self.log:
            self._log(message)


def _size(n: int) -> str:
    value = float(n)
    for unit in ("bytes", "KiB", "MiB"):
        if value < 1024:
            return f"{n} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
