"""The terminal: real width, colour only on a TTY and never with NO_COLOR, progress in files.

The CLI runs as a user runs it: in a pseudo-terminal of 80 columns (pty), or
with its output piped.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

from conftest import LOCK, ROOT
from test_resolve import fork_lock  # noqa: F401  (fixture)

SGR = re.compile(rb"\x1b\[[0-9;]*m")
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
TABLE = "┏┃┡│└━─╇╈┳┻"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES")}
    env.update(TERM="xterm-256color", PYTHONPATH=str(ROOT), **extra)
    return env


def run_pty(args: list[str], env: dict[str, str], cols: int = 80) -> tuple[int, bytes]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, cols, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "dsv4patch", *args], stdin=slave, stdout=slave,
                            stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    out = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        out += data
    os.close(master)
    return proc.wait(), out


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
