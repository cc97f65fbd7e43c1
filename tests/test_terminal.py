"""The terminal: real width, colour only on a TTY and never with NO_COLOR, progress in files.

The CLI runs as a user runs it: in a pseudo-terminal of 80 columns (pty), or
with its output piped.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from conftest import LOCK, ROOT, pty_run
from dsv4patch import report
from test_resolve import fork_lock  # noqa: F401  (fixture)

SGR = re.compile(rb"\x1b\[[0-9;]*m")
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
TABLE = "┏┃┡│└━─╇╈┳┻"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES")}
    env.update(TERM="xterm-256color", PYTHONPATH=str(ROOT), **extra)
    return env


def run_pty(args: list[str], env: dict[str, str], cols: int = 80) -> tuple[int, bytes]:
    rc, reads, _ = pty_run(args, ROOT, env, cols)
    return rc, b"".join(data for _, data in reads)


def table_lines(out: bytes) -> list[str]:
    text = ANSI.sub(b"", out).decode("utf-8", "replace").replace("\r", "")
    return [line for line in text.split("\n") if line and line[0] in TABLE]


def _check_args(cache: Path) -> list[str]:
    return ["check", "--lock", str(LOCK), "--pin", "0.27.1", "--cache-dir", str(cache)]


def test_tables_fit_an_80_column_terminal_with_colour(shared_cache):
    rc, out = run_pty(_check_args(shared_cache), _env())
    assert rc == 0, out
    lines = table_lines(out)
    assert lines and max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert SGR.search(out)  # colour on a terminal


def test_no_color_and_pipes_get_no_escape_codes(shared_cache):
    rc, out = run_pty(_check_args(shared_cache), _env(NO_COLOR="1"))
    assert rc == 0 and not SGR.search(out), out[:400]
    piped = subprocess.run([sys.executable, "-m", "dsv4patch", *_check_args(shared_cache)],
                           env=_env(FORCE_COLOR="1", COLUMNS="80"), capture_output=True, cwd=ROOT)
    assert piped.returncode == 0 and b"\x1b[" not in piped.stdout + piped.stderr
    lines = table_lines(piped.stdout)
    assert lines and max(len(line) for line in lines) <= 80


def test_progress_for_git_import_and_fork_sources(tmp_path, fork_lock):
    rc, out = run_pty(["check", "--lock", str(fork_lock), "--pin", "fork", "--cache-dir", str(tmp_path / "c")],
                      _env())
    text = ANSI.sub(b"", out).decode("utf-8", "replace")
    assert rc == 1  # 0002 conflicts on the fork
    assert "fetch fork from" in text and "import fork into git" in text


def test_extraction_progress_counts_files(tmp_path, shared_cache):
    from dsv4patch.pins.lock import load

    pin = load(LOCK).pin("0.27.1")
    blobs = tmp_path / "c" / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    shutil.copyfile(shared_cache / "blobs" / "sha256" / pin.source.sha256, blobs / pin.source.sha256)
    rc, out = run_pty(["fetch", "--lock", str(LOCK), "--pin", "0.27.1", "--cache-dir", str(tmp_path / "c")],
                      _env(), cols=160)
    text = ANSI.sub(b"", out).decode("utf-8", "replace")
    assert rc == 0, text[-2000:]
    assert re.search(r"extract vllm-0\.27\.1\.tar\.gz.*\d+/\d+ files", text), text[-2000:]
    assert " kB" not in text and " MB" not in text


# --- tables that fit (issue 40) -----------------------------------------------------------------

BOX = "┏┓┗┛┃━┡┩╇┳┻╋│─└┘┌┐├┤┼┴┬╈╿╽"


def _tokens(text: str) -> Counter[str]:
    out: Counter[str] = Counter()
    for tok in text.translate({ord(c): " " for c in BOX}).split():
        out[tok] += 1
        if tok.endswith(":"):  # a column shown under its row: "detail: <its words>"
            out[tok[:-1]] += 1
    return out


def rendered(table: report.Table, width: int) -> str:
    """TABLE as the terminal shows it in WIDTH columns (no colour), title and legend aside."""
    from rich.console import Console

    con = Console(width=width, file=io.StringIO(), color_system=None, highlight=False)
    with con.capture() as cap:
        for part in table.to_rich(width):
            con.print(part)
    return cap.get()


def assert_no_word_split(table: report.Table, width: int, printed: str | None = None) -> str:
    """Every word of every cell (and header) whole on some line of the table rendered in WIDTH
    columns, as often as the cells hold it, and no line wider than WIDTH; PRINTED, when given,
    is what the command wrote, which must hold that table."""
    text = rendered(table, width)
    if printed is not None:
        assert text.strip() in printed, (text, printed)
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= width, text
    need: Counter[str] = Counter()
    for cell in [*table.columns, *(c for row in table.rows for c in row)]:
        need.update(report.literal(cell).split())
    have = _tokens(text)
    split = {w: f"{n} in cells, {have[w]} whole" for w, n in need.items() if have[w] < n}
    assert not split, f"words split at {width} columns: {split}\n{text}"
    return text


class _Spy:
    """report.emit, recording the table each call renders (the command is not changed)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tables: list[report.Table] = []
        real = report.emit

        def emit(fmt: str, rep: dict, table: report.Table | None, markdown: str | None) -> None:
            if table is not None:
                self.tables.append(table)
            real(fmt, rep, table, markdown)

        monkeypatch.setattr(report, "emit", emit)


def run_at(cli, monkeypatch: pytest.MonkeyPatch, width: int, *args: str | Path) -> tuple[int, str, list[report.Table]]:
    """The real command through its entry point with COLUMNS=WIDTH (output piped, as in CI)."""
    spy = _Spy(monkeypatch)
    monkeypatch.setenv("COLUMNS", str(width))
    res = cli(*args)
    monkeypatch.undo()
    assert spy.tables, res.out + res.err
    return res.rc, res.out, spy.tables


def test_word_split_detection_catches_what_the_issue_showed():
    """The check itself can fail: rich's own layout of the old check matrix split `clean` into
    `cle`/`an` at 80 columns; the same cells in this table's layout do not."""
    from rich.console import Console
    from rich.table import Table as RichTable

    cells = [["0.27.1", *(["clean"] * 10), "ec2fff2214be", "ok"]] * 3
    old = RichTable(title="dsv4patch check")
    for c in ["pin", *(f"{i:04d}" for i in range(1, 11)), "patched tree", "result"]:
        old.add_column(c, overflow="fold")
    for r in cells:
        old.add_row(*r)
    con = Console(width=80, file=io.StringIO(), color_system=None)
    with con.capture() as cap:
        con.print(old)
    assert _tokens(cap.get())["clean"] < 30  # split
    table = report.Table("dsv4patch check")
    for c in ["pin", *(f"{i:04d}" for i in range(1, 11)), "patched tree", "result"]:
        table.add_column(c)
    for r in cells:
        table.add_row(*r)
    for width in (80, 100, 60, 40):
        assert_no_word_split(table, width)


@pytest.mark.parametrize("width", [80, 100])
def test_check_and_verify_tables_keep_words_whole(cli, monkeypatch, shared_cache, width):
    rc, out, (table,) = run_at(cli, monkeypatch, width, "check", "--lock", LOCK, "--cache-dir", shared_cache)
    assert rc == 0, out
    assert_no_word_split(table, width, out)
    # Short status words, every patch number, the legend with the full names; the notes fold what
    # the lock expects into one line per status instead of one per pin and patch.
    assert "0001 = 0001-DSV4-fix-1-Carry-the-dense-SWA-index-width-for-DSpar.patch" in out
    upstream = [line for line in out.splitlines() if "fix already in the tree" in line or "as the lock expects" in line]
    assert len(upstream) == 1 and "0001-0008 on 0.28.0" in upstream[0], upstream
    rc, out, (table,) = run_at(cli, monkeypatch, width, "verify", "--lock", LOCK, "--pin", "0.27.1",
                               "--cache-dir", shared_cache)
    assert rc == 0, out
    assert_no_word_split(table, width, out)
    # exit 0, and the words say what did not run here
    assert "verify 0.27.1: 6 of 10 proven, 0 failed, 4 NOT PROVEN on this machine (0007-0010" in out
    assert "skipped here" not in out and out.count("not proven here") == 4


@pytest.mark.parametrize("width", [80, 100])
def test_status_and_port_tables_keep_words_whole(cli, monkeypatch, tmp_path, shared_cache, width):
    tree = tmp_path / "tree"
    assert cli("apply", "--lock", LOCK, "--pin", "0.27.1", "--tree", tree, "--no-build", "--cache-dir",
               shared_cache).rc == 0
    rc, out, (table,) = run_at(cli, monkeypatch, width, "status", "--tree", tree, "--lock", LOCK)
    assert rc == 0, out
    assert_no_word_split(table, width, out)
    project = tmp_path / "proj"
    shutil.copytree(ROOT / "patches", project / "patches")
    (project / "locks").mkdir()
    shutil.copyfile(LOCK, project / "locks" / "vllm.toml")
    rc, out, (table,) = run_at(cli, monkeypatch, width, "port", "--lock", project / "locks" / "vllm.toml",
                               "--to", "0.28.0", "--dry-run", "--cache-dir", shared_cache)
    assert rc == 0, out
    assert_no_word_split(table, width, out)
