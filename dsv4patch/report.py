"""Results of a command as one JSON object, a Markdown table or a terminal table.

Every command builds a plain dict (``pins -> patches -> status`` with
hunk-level detail) and hands it here; ``--format`` only changes how it is
printed, never what was decided.  rich is imported only to print a terminal
table: a JSON or Markdown run (``check`` on a cache hit, a CI job) never loads it.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich is loaded only where a terminal table is printed (see console)
    from rich.console import Console, OverflowMethod
    from rich.table import Table as RichTable
    from rich.text import Text

OK_MARK = {True: "ok", False: "UNEXPECTED"}
# Version of every --format json object (schemas/*.schema.json); bump it when a
# field changes meaning or goes away (adding fields does not bump it).
SCHEMA_VERSION = 1


# C0 controls but tab and newline, DEL and the C1 controls (U+0080-U+009F, 8-bit CSI/OSC).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def literal(text: object) -> str:
    """TEXT with every control character shown as an escape (``\\x1b``, ``\\r``):
    text from a patch, a tree, a lock, an index or an error never moves the cursor,
    sets a colour or opens a link on the user's terminal (issue 28)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(text))


def plain(text: object) -> Text:
    """TEXT as a rich Text shown as it is: brackets are never read as markup
    (``[bold]``, ``[link=…]``, ``[/]`` stay on screen) and controls are escaped."""
    from rich.text import Text

    return Text(literal(text))


def console(stderr: bool = False) -> Console:
    """A rich console for the terminal: its real width (COLUMNS, else 80, off a terminal),
    colour only on a TTY and never with NO_COLOR set (https://no-color.org).

    rich is imported here, not at module level: a ``check`` answered from the
    result cache in JSON never loads it (issue 14)."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    colour = stream.isatty() and not os.environ.get("NO_COLOR")
    return Console(file=stream, stderr=stderr, color_system="auto" if colour else None,
                   force_terminal=stream.isatty(), no_color=not colour, highlight=False)


@dataclass
class Table:
    """A terminal table to print with rich (built only when a terminal table is printed)."""

    title: str
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    overflow: dict[str, OverflowMethod] = field(default_factory=dict)

    def add_column(self, name: str, overflow: OverflowMethod | None = None) -> None:
        self.columns.append(name)
        if overflow is not None:
            self.overflow[name] = overflow

    def add_row(self, *cells: str) -> None:
        self.rows.append(list(cells))

    def to_rich(self) -> RichTable:
        from rich.table import Table as RichTable

        # Every cell is a plain Text: pin names, paths, evidence quoted from a patch or a
        # tree (``params.lengths[row_idx]``) are shown literally, never read as markup.
        table = RichTable(title=plain(self.title))
        for c in self.columns:
            table.add_column(plain(c), overflow=self.overflow.get(c, "ellipsis"))
        for r in self.rows:
            table.add_row(*(plain(cell) for cell in r))
        return table


_EMITTED = [False]  # this process has written a command's result to stdout (main reads it)


def result_emitted() -> bool:
    """Has a command's result been written to stdout in this run?  Then an error that comes after it (an
    interrupt during the last cleanup) goes to stderr only: stdout holds one document, the result."""
    return _EMITTED[0]


def reset_emitted() -> None:
    _EMITTED[0] = False


def emit(fmt: str, report: dict[str, Any], table: Table | None, markdown: str | None) -> None:
    _emit(fmt, report, table, markdown)
    _EMITTED[0] = True


def _emit(fmt: str, report: dict[str, Any], table: Table | None, markdown: str | None) -> None:
    if fmt == "json":
        json.dump({"schema_version": SCHEMA_VERSION, **report}, sys.stdout, indent=2,
                  sort_keys=False, default=str)
        sys.stdout.write("\n")
    elif fmt == "markdown":
        # Postable as a PR comment as is: the table, then every note (conflicts, evidence,
        # next steps) as a list item.
        notes = [f"- {n}".replace("\n", "\n  ") for n in report.get("notes", [])]
        sys.stdout.write(literal((markdown or "") + ("\n\n" + "\n".join(notes) if notes else "")) + "\n")
    else:
        out = console()
        if table is not None:
            out.print(table.to_rich())
        for line in report.get("notes", []):
            # Notes are never cut or re-wrapped: commands in them must stay copy-pasteable.
            out.print(plain(line), markup=False, highlight=False, soft_wrap=True)


def matrix_table(report: dict[str, Any]) -> tuple[Table, str]:
    """pin x patch matrix for check (terminal and Markdown)."""
    pins = report["pins"]
    patch_names: list[str] = []
    for p in pins.values():
        for name in p["patches"]:
            if name not in patch_names:
                patch_names.append(name)
    short = [n.split("-", 1)[0] if n[:4].isdigit() else n[:12] for n in patch_names]
    table = Table(f"dsv4patch check: {report['lock']}")
    # fold, never "…": a narrow terminal wraps a cell instead of hiding its end.
    table.add_column("pin", overflow="fold")
    for s in short:
        table.add_column(s, overflow="fold")
    table.add_column("patched tree", overflow="fold")
    table.add_column("result", overflow="fold")
    md = ["| pin | " + " | ".join(short) + " | patched tree | result |",
          "|---" * (len(short) + 3) + "|"]
    for pin_name, p in pins.items():
        cells = []
        if p.get("status") == "not-fetched":
            cells = ["not-fetched"] * len(patch_names)
            tree, result = "-", "NOT FETCHED"
            table.add_row(pin_name, *cells, tree, result)
            md.append(f"| {pin_name} | " + " | ".join(cells) + f" | {tree} | {result} |")
            continue
        for name in patch_names:
            c = p["patches"].get(name)
            if c is None:
                cells.append("-")
            else:
                mark = "" if c["ok"] else f" (want {c['expected']})"
                cells.append(c["status"] + mark)
        tree = (p.get("patched_tree") or "-")[:12]
        result = OK_MARK[p["ok"]]
        table.add_row(pin_name, *cells, tree, result)
        md.append(f"| {pin_name} | " + " | ".join(cells) + f" | {tree} | {result} |")
    md.append("")
    md.append("Patches: " + ", ".join(f"`{s}` = {n}" for s, n in zip(short, patch_names, strict=True)))
    return table, "\n".join(md)


def simple_table(title: str, columns: list[str], rows: list[list[str]]) -> tuple[Table, str]:
    table = Table(title)
    for c in columns:
        table.add_column(c, overflow="fold")
    for r in rows:
        table.add_row(*r)
    md = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    return table, "\n".join(md)
