"""Results of a command as one JSON object, a Markdown table or a terminal table.

Every command builds a plain dict (``pins -> patches -> status`` with
hunk-level detail) and hands it here; ``--format`` only changes how it is
printed, never what was decided.  rich is imported only to print a terminal
table: a JSON or Markdown run (``check`` on a cache hit, a CI job) never loads it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dsv4patch import settings
from dsv4patch.records import frozen

if TYPE_CHECKING:  # rich is loaded only where a terminal table is printed (see console)
    from rich.console import Console, OverflowMethod, RenderableType
    from rich.table import Table as RichTable
    from rich.text import Text

OK_MARK = {True: "ok", False: "UNEXPECTED"}
# Version of every --format json object (schemas/*.schema.json); bump it when a
# field changes meaning or goes away (adding fields does not bump it).
SCHEMA_VERSION = 1


# C0 controls but tab and newline, DEL and the C1 controls (U+0080-U+009F, 8-bit CSI/OSC).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


# The command line's renderer of the parameters and next steps the core names (errors.param,
# nextstep.mention): installed by main.py once at start (use_words), applied to all output.
_WORDS: list[Callable[[str], str]] = []


def use_words(render: Callable[[str], str]) -> None:
    """Show every parameter and next step the core names as ``render`` spells it (``main.py`` installs
    ``commands/_words.render`` once, at start: no command can forget it)."""
    _WORDS[:] = [render]


def words(text: str) -> str:
    """``text`` as the user reads it: parameters and next steps in the command line's words, and the user
    part of every URL hidden (``https://***@host``: a token as a git URL's user name, in a progress line, a
    note or a JSON field, is never printed, nor the password of an scp-like ``user:pw@host:path``;
    :func:`dsv4patch.urls.redact_text`)."""
    if "@" in text and ":" in text:
        from dsv4patch.urls import redact_text

        text = redact_text(text)
    return _WORDS[0](text) if _WORDS else text


def _words_in(value: Any) -> Any:
    """A JSON value with :func:`words` applied to every string in it (keys too)."""
    if isinstance(value, str):
        return words(value)
    if isinstance(value, dict):
        return {words(k) if isinstance(k, str) else k: _words_in(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_words_in(v) for v in value]
    return value


def literal(text: object) -> str:
    """TEXT with every control character shown as an escape (``\\x1b``, ``\\r``):
    text from a patch, a tree, a lock, an index or an error never moves the cursor,
    sets a colour or opens a link on the user's terminal (issue 28).  Parameters and next
    steps the core names are shown in the command line's words first (:func:`words`)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], words(str(text)))


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
    global _CONSOLE
    if _CONSOLE is None:
        from rich.console import Console

        class _Console(Console):
            def on_broken_pipe(self) -> None:
                """rich's own ends the program with exit 1 ("a result differs from the lock"); a reader
                that closed stdout (``| head``) is ``main``'s exit 141, as with JSON."""
                self.quiet = True
                raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

        _CONSOLE = _Console
    stream = sys.stderr if stderr else sys.stdout
    colour = stream.isatty() and not settings.active().no_color
    return _CONSOLE(file=stream, stderr=stderr, color_system="auto" if colour else None,
                    force_terminal=stream.isatty(), no_color=not colour, highlight=False)


_CONSOLE: type[Console] | None = None  # report.console's class, made on first use (rich loads there)


# The layouts a terminal table tries, roomiest first: (name, extra width for n columns).
# ``boxed`` draws every border; ``compact`` only the rule under the header, columns
# three spaces apart; ``tight`` one space apart.
_LAYOUTS: tuple[tuple[str, Callable[[int], int]], ...] = (
    ("boxed", lambda n: 3 * n + 1),
    ("compact", lambda n: 3 * (n - 1)),
    ("tight", lambda n: max(n - 1, 0)),
)


def words_kept(text: str, width: int | None, indent: int = 0) -> Text:
    """``text`` (shown literally) wrapped between words to ``width`` less ``indent``, each line indented; a word
    longer than that (a path, a patch's file name) stays whole on a line of its own, past the width, for the
    terminal to soft-wrap (printed with ``soft_wrap``: rich would split it)."""
    import textwrap

    from rich.text import Text

    lines: list[str] = []
    for para in literal(text).split("\n"):
        lines += textwrap.wrap(para, max(1, (width or 1 << 16) - indent), break_long_words=False,
                               break_on_hyphens=False) or [""]
    return Text("\n".join(" " * indent + line for line in lines), overflow="ignore")


def _longest_word(text: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(w) for w in text.split()), default=0)


def _longest_line(text: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(line) for line in text.split("\n")), default=0)


@frozen
class Fitted:
    """A table laid out for a width, so that no column is narrower than its longest word and
    rich wraps a cell between words, never inside one.

    ``layout``: ``boxed``, ``compact`` or ``tight`` (:data:`_LAYOUTS`).  A table too wide
    even when tight is either cut into ``parts`` that each repeat the first column (many
    narrow columns: a pins x patches matrix), or shows its columns of long words ``below``
    each row, indented, at the full width (a detail that quotes a path)."""

    layout: str
    parts: list[list[int]]  # column indexes of each part
    widths: list[dict[int, int]]  # each part's column widths
    below: list[int] = field(default_factory=list)  # columns shown under each row


@dataclass
class Table:
    """A terminal table to print with rich (built only when a terminal table is printed).

    ``optional`` columns are left out where the width is short (the JSON has them);
    ``legend`` lines, printed under the table, say what short cells stand for."""

    title: str
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    overflow: dict[str, OverflowMethod] = field(default_factory=dict)
    optional: set[str] = field(default_factory=set)
    legend: list[str] = field(default_factory=list)

    def add_column(self, name: str, overflow: OverflowMethod | None = None, optional: bool = False) -> None:
        self.columns.append(name)
        if overflow is not None:
            self.overflow[name] = overflow
        if optional:
            self.optional.add(name)

    def add_row(self, *cells: str) -> None:
        self.rows.append(list(cells))

    def cells(self, column: int) -> list[str]:
        """The header and every cell of ``column``, as printed (literally)."""
        return [literal(self.columns[column])] + [literal(r[column]) for r in self.rows]

    def fit(self, width: int) -> Fitted:
        """The roomiest layout in which every column is at least as wide as its longest word."""
        n = len(self.columns)
        mins = {i: max(1, *(_longest_word(c) for c in self.cells(i))) for i in range(n)}
        maxs = {i: max(mins[i], *(_longest_line(c) for c in self.cells(i))) for i in range(n)}
        keep = list(range(n))
        droppable = [i for i in keep if self.columns[i] in self.optional]
        while True:
            for name, extra in _LAYOUTS:
                if sum(mins[i] for i in keep) + extra(len(keep)) <= width:
                    return Fitted(name, [keep], [_spread(keep, mins, maxs, width - extra(len(keep)))])
            if not droppable:
                break
            keep.remove(droppable.pop())
        tight = _LAYOUTS[-1][1]
        if len(keep) > 2 and all(mins[keep[0]] + mins[i] + tight(2) <= width // 2 for i in keep[1:]):
            # Many narrow columns: parts led by the first column, each as wide as fits.
            parts: list[list[int]] = []
            for i in keep[1:]:
                if parts and sum(mins[j] for j in parts[-1] + [i]) + tight(len(parts[-1]) + 1) <= width:
                    parts[-1].append(i)
                else:
                    parts.append([keep[0], i])
            return Fitted("tight", parts, [_spread(p, mins, maxs, width - tight(len(p))) for p in parts])
        # Columns of long words go under each row, the longest first, until the rest fits.
        below: list[int] = []
        while len(keep) > 1 and sum(mins[i] for i in keep) + tight(len(keep)) > width:
            longest = max(keep[1:], key=lambda i: mins[i])
            keep.remove(longest)
            below.append(longest)
        below.sort()
        return Fitted("tight", [keep], [_spread(keep, mins, maxs, width - tight(len(keep)))], below)

    def to_rich(self, width: int | None = None) -> list[RenderableType]:
        """What shows this table in ``width`` columns (None: as wide as its cells, one boxed
        table): rich tables, and with columns shown under each row, those lines."""
        fitted = self.fit(width) if width is not None else Fitted(
            "boxed", [list(range(len(self.columns)))], [{}])
        out: list[RenderableType] = []
        for n, part in enumerate(fitted.parts):
            title = self._title(fitted.layout, part, fitted.widths[n], width) if n == 0 else None
            if title is not None and title.overflow == "ignore":  # a word of it is wider than the table
                out.append(title)
                title = None
            if not fitted.below:
                out.append(self._rich(fitted.layout, title, part, fitted.widths[n], self.rows, header=True))
                continue
            # One table per row, all of the same column widths (so they line up), each followed
            # by its long cells, indented: ``column: text``, wrapped between words.
            for k, row in enumerate(self.rows):
                out.append(self._rich(fitted.layout, title if k == 0 else None, part, fitted.widths[n], [row],
                                      header=k == 0))
                for i in fitted.below:
                    if row[i].strip():
                        out.append(words_kept(f"{self.columns[i]}: {row[i]}", width, indent=4))
        return out

    def _title(self, layout: str, part: list[int], widths: dict[int, int], width: int | None) -> Text:
        """The title, centred over the table and wrapped between words as rich does, unless a word of it
        (a path) is wider than the table: then left at the table's left, its words whole (words_kept)."""
        if width is None or not widths:
            return plain(self.title)
        table = sum(widths.get(i, 0) for i in part) + dict(_LAYOUTS)[layout](len(part))
        return plain(self.title) if _longest_word(literal(self.title)) <= table else words_kept(self.title, width)

    def _rich(self, layout: str, title: Text | None, part: list[int], widths: dict[int, int],
              rows: list[list[str]], header: bool) -> RichTable:
        from rich import box
        from rich.table import Table as RichTable

        # Every cell is a plain Text: pin names, paths, evidence quoted from a patch or a
        # tree (``params.lengths[row_idx]``) are shown literally, never read as markup.
        if layout == "boxed":
            table = RichTable(title=title, show_header=header)
        else:
            table = RichTable(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                              show_header=header, padding=(0, 1) if layout == "compact" else (0, 0))
        for i in part:
            c = self.columns[i]
            table.add_column(plain(c), overflow=self.overflow.get(c, "fold"), width=widths.get(i))
        for r in rows:
            table.add_row(*(plain(r[i]) for i in part))
        return table


def _spread(cols: list[int], mins: dict[int, int], maxs: dict[int, int], room: int) -> dict[int, int]:
    """Widths for ``cols`` in ``room``: each its minimum, then what is left to the columns that
    wrap, the narrowest need first, up to each one's widest line."""
    widths = {i: mins[i] for i in cols}
    left = room - sum(widths.values())
    for i in sorted(cols, key=lambda i: maxs[i] - mins[i]):
        if left <= 0:
            break
        give = min(maxs[i] - widths[i], left)
        widths[i] += give
        left -= give
    return widths


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
        json.dump(_words_in({"schema_version": SCHEMA_VERSION, **report}), sys.stdout, indent=2,
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
            # Never a word split (a path, a patch's name): the parts fit the width or keep their long words
            # whole (words_kept), so rich must not wrap or crop what it prints.
            from rich.text import Text

            for part in table.to_rich(out.width):
                out.print(part, soft_wrap=isinstance(part, Text))  # a table is as wide as it fits
            for line in table.legend:  # wrapped between words
                out.print(words_kept(line, out.width), markup=False, highlight=False, soft_wrap=True)
        for line in report.get("notes", []):
            # Notes are never cut or re-wrapped: commands in them must stay copy-pasteable.
            out.print(plain(line), markup=False, highlight=False, soft_wrap=True)


# A patch's status in one short word for the terminal matrix (pins x patches), with
# what it stands for in the legend under the table.
STATUS_WORD = {
    "clean": ("ok", "applies cleanly"),
    "offset": ("offs", "applies at an offset"),
    "upstream": ("up", "the fix is already in the tree (upstream)"),
    "already-applied": ("done", "already applied"),
    "conflict": ("CONF", "conflicts"),
    "missing-file": ("MISS", "a file it changes is missing"),
    "not-checked": ("skip", "not checked (an earlier patch stopped the series)"),
}
UNEXPECTED_SUFFIX = "!"


def patch_key(name: str) -> str:
    """A patch file's short name in a table: its number (``0007``), else the name itself."""
    head = name.split("-", 1)[0]
    return head if head.isdigit() else name


def patch_legend(names: list[str]) -> list[str]:
    """``0001 = 0001-DSV4-fix-1-….patch`` for every patch a table shows by number only."""
    return [f"{patch_key(n)} = {n}" for n in names if patch_key(n) != n]


def key_ranges(names: list[str]) -> str:
    """Patches by number, runs shortened: ``0001-0008, 0010``."""
    keys = [patch_key(n) for n in names]
    out: list[str] = []
    run: list[str] = []
    for k in keys + [""]:
        if run and k.isdigit() and run[-1].isdigit() and int(k) == int(run[-1]) + 1:
            run.append(k)
            continue
        if run:
            out.append(run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [k]
    return ", ".join(out)


def folded(status: str, pins: dict[str, list[str]], evidence: str = "") -> str:
    """One line for a status many pins share as the lock expects (``upstream``): the patches
    once per set of pins with the same ones, instead of a line per pin and patch; ``evidence``:
    where the per-patch evidence is (the command names its option)."""
    groups: dict[str, list[str]] = {}
    for pin, names in pins.items():
        groups.setdefault(key_ranges(names), []).append(pin)
    word, _ = STATUS_WORD.get(status, (status, status))  # what it stands for: the legend says so
    return (f"{status} ({word}), as the lock expects: "
            + "; ".join(f"{keys} on {', '.join(p)}" for keys, p in groups.items())
            + (f" (evidence: {evidence})" if evidence else ""))


def matrix_table(report: dict[str, Any], title: str | None = None) -> tuple[Table, str]:
    """pin x patch matrix for check and apply (terminal and Markdown).

    On the terminal a cell is one short word (legend under the table) so that the
    matrix fits 80 columns; Markdown keeps the full status words."""
    pins = report["pins"]
    patch_names: list[str] = []
    for p in pins.values():
        for name in p["patches"]:
            if name not in patch_names:
                patch_names.append(name)
    short = [n.split("-", 1)[0] if n[:4].isdigit() else n[:12] for n in patch_names]
    table = Table(title or f"dsv4patch check: {report['lock']}")
    table.add_column("pin")
    for s in short:
        table.add_column(s)
    table.add_column("patched tree", optional=True)
    table.add_column("result")
    md = ["| pin | " + " | ".join(short) + " | patched tree | result |",
          "|---" * (len(short) + 3) + "|"]
    seen: set[str] = set()
    unexpected = False
    for pin_name, p in pins.items():
        cells: list[str] = []
        if p.get("status") in ("not-fetched", "source-moved"):
            cells = [p["status"]] * len(patch_names)
            tree, result = "-", p["status"].replace("-", " ").upper()
            table.add_row(pin_name, *(["-"] * len(patch_names)), tree, p["status"].replace("-", " "))
            md.append(f"| {pin_name} | " + " | ".join(cells) + f" | {tree} | {result} |")
            continue
        words: list[str] = []
        for name in patch_names:
            c = p["patches"].get(name)
            if c is None:
                cells.append("-")
                words.append("-")
            else:
                mark = "" if c["ok"] else f" (want {c['expected']})"
                cells.append(c["status"] + mark)
                word = STATUS_WORD.get(c["status"], (c["status"], ""))[0]
                seen.add(c["status"])
                unexpected |= not c["ok"]
                words.append(word + ("" if c["ok"] else UNEXPECTED_SUFFIX))
        tree = (p.get("patched_tree") or "-")[:12]
        result = OK_MARK[p["ok"]]
        table.add_row(pin_name, *words, tree, result)
        md.append(f"| {pin_name} | " + " | ".join(cells) + f" | {tree} | {result} |")
    if seen:
        table.legend = [", ".join(f"{w} = {what}" for st, (w, what) in STATUS_WORD.items() if st in seen)
                        + (f"; {UNEXPECTED_SUFFIX} not what the lock expects (see below)" if unexpected else "")]
    table.legend += patch_legend(patch_names)
    md.append("")
    md.append("Patches: " + ", ".join(f"`{s}` = {n}" for s, n in zip(short, patch_names, strict=True)))
    return table, "\n".join(md)


def simple_table(title: str, columns: list[str], rows: list[list[str]],
                 legend: list[str] | None = None) -> tuple[Table, str]:
    """A table of ``columns`` (terminal and Markdown).  On the terminal a ``patch`` column shows
    the patch's number and the legend its file name; Markdown shows the names."""
    table = Table(title)
    for c in columns:
        table.add_column(c)
    keyed = [i for i, c in enumerate(columns) if c == "patch"]
    names: list[str] = []
    for r in rows:
        cells = list(r)
        for i in keyed:
            if cells[i] not in names:
                names.append(cells[i])
            cells[i] = patch_key(cells[i])
        table.add_row(*cells)
    table.legend = list(legend or []) + patch_legend(names)
    md = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    return table, "\n".join(md)
