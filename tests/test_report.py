"""Literal text (issue 28): what comes from a patch, a tree, a lock or an error reaches the
terminal as it is: brackets are never read as rich markup, control characters (ANSI CSI,
OSC 8 links) are shown escaped (``\\x1b``) and never written raw.

The CLI runs in a real pseudo-terminal (colour on) and with its output piped, against a real
git upstream and a real port.
"""

from __future__ import annotations

from pathlib import Path

from conftest import MINI_FILES, git_pin, sh, write_lock
from dsv4patch.report import literal, simple_table
from test_terminal import SGR, _env, run_pty

HOSTILE = '[bold]B[/] [link=https://x]L[/link] \x1b[31mRED\x1b]8;;https://evil\x07X\x1b]8;;\x07 a[i]'
SHOWN = '[bold]B[/] [link=https://x]L[/link] \\x1b[31mRED\\x1b]8;;https://evil\\x07X\\x1b]8;;\\x07 a[i]'


def test_literal_escapes_every_control_character():
    assert literal(HOSTILE) == SHOWN
    assert literal("a\tb\nc") == "a\tb\nc"
    assert literal("\x9b31m\x7f\r") == "\\x9b31m\\x7f\\r"


def test_table_cells_are_never_markup():
    from rich.console import Console

    table, md = simple_table("t [bold]x[/]", ["c[/]"], [["params.lengths[row_idx];"], [HOSTILE]])
    con = Console(width=200, color_system="truecolor", force_terminal=True)
    with con.capture() as cap:
        con.print(*table.to_rich())
    text = SGR.sub(b"", cap.get().encode()).decode()
    assert "params.lengths[row_idx];" in text and "t [bold]x[/]" in text and "c[/]" in text
    assert SHOWN in text
    assert "\x1b]" not in cap.get() and "\x07" not in cap.get()


def _hostile_port(tmp_path: Path, upstream) -> tuple[Path, str]:
    root = tmp_path / "proj"
    (root / "locks").mkdir(parents=True)
    (root / "patches").mkdir()
    worker = MINI_FILES["vllm/worker.py"]
    changed = worker.replace("return 0", f"return 2  # {HOSTILE} params.lengths[row_idx];")
    upstream.patch(root / "patches/0001-x.patch", "a", {"vllm/worker.py": changed}, "one")
    lock = write_lock(root / "locks/vllm.toml", {"old": git_pin("old", upstream)},
                      {"main": ["0001-x.patch"]}, series_dir="../patches")
    # upstream changed the same line its own way: a conflict quoting both lines
    (upstream.path / "vllm/worker.py").write_text(worker.replace("return 0", "return 1  # [b]up[/b] params.lengths[row] > 0 \x1b[32mG"))
    sh(upstream.path, "commit", "-qam", "upstream's own")
    return lock, sh(upstream.path, "rev-parse", "HEAD")


def test_port_table_shows_patch_text_literally(tmp_path, upstream, shared_cache):
    lock, new = _hostile_port(tmp_path, upstream)
    args = ["port", "--lock", str(lock), "--to", new, "--git", str(upstream.path), "--name", "new",
            "--dry-run", "--cache-dir", str(tmp_path / "c")]
    for env in (_env(), _env(NO_COLOR="1")):  # colour on a pty, and without
        rc, out = run_pty(args, env, cols=400)
        assert rc == 1, out  # the conflict, reported with both lines quoted
        assert b"\x1b]" not in out and b"\x07" not in out and b"\x1b[31m" not in out and b"\x1b[32m" not in out
        text = SGR.sub(b"", out).decode()
        assert "params.lengths[row_idx];" in text and "[bold]B[/]" in text
        assert "[b]up[/b] params.lengths[row] > 0 \\x1b[32mG" in text
        assert "[link=https://x]L[/link]" in text and "\\x1b[31mRED" in text
    for fmt in ("markdown", "text"):
        import subprocess
        import sys

        from conftest import ROOT
        p = subprocess.run([sys.executable, "-m", "dsv4patch", *args, "--format", fmt], env=_env(),
                           cwd=ROOT, capture_output=True, text=True)
        assert p.returncode == 1, p.stderr
        assert "\x1b" not in p.stdout and "\x07" not in p.stdout and "[bold]B[/]" in p.stdout
        assert "params.lengths[row_idx];" in p.stdout and "[b]up[/b] params.lengths[row] > 0" in p.stdout


def test_a_lock_pin_name_with_markup_and_escapes_is_shown_literally(tmp_path, upstream):
    lock = write_lock(tmp_path / "vllm.toml", {"x": git_pin("[bold]p[/]\\u001b[31m\\u001b]8;;x\\u0007", upstream)})
    rc, out = run_pty(["check", "--lock", str(lock), "--cache-dir", str(tmp_path / "c")], _env())
    assert rc != 0
    assert b"\x1b]" not in out and b"\x07" not in out and b"\x1b[31m" not in out
    assert b"[bold]p[/]" in out and b"\\x1b[31m" in out


def test_a_table_into_a_closed_pipe_is_exit_141_like_json(tmp_path: Path, shared_cache: Path) -> None:
    """`dsv4patch check | head`: the terminal table's writer is rich, whose own broken-pipe handling ends the
    program with exit 1, which scripts read as "a result differs from the lock"; every format is exit 141
    ("stdout was closed by its reader") with nothing on stderr but progress."""
    import os
    import subprocess
    import sys

    from conftest import LOCK

    for fmt in ([], ["--format", "markdown"], ["--format", "json"]):
        r, w = os.pipe()
        os.close(r)  # the reader went away
        proc = subprocess.run([sys.executable, "-m", "dsv4patch", "check", "--lock", str(LOCK), "--pin", "0.27.1",
                               "--cache-dir", str(shared_cache), *fmt], stdout=w, stderr=subprocess.PIPE, text=True,
                              timeout=120)
        os.close(w)
        assert proc.returncode == 141, (fmt, proc.returncode, proc.stderr)
        assert "Traceback" not in proc.stderr and "error" not in proc.stderr, proc.stderr


def test_a_word_wider_than_its_room_is_never_split() -> None:
    """Tables never split a word (README): a path under its row, a title with a path wider than the table and
    a legend's patch file name each stay whole on a line of their own, past the width (the terminal soft-wraps
    them; copied, they are whole), and the rest still wraps between words.  rich alone folds them mid-word."""
    import io

    from rich.console import Console

    from dsv4patch import report

    path = "/work/cache/trees/sdist-eec2d54d137ac1e59cb4c39226dfee1943eefc8f4788f5821d7300d6acbdb646.git"
    table, _ = simple_table(f"dsv4patch fetch: {path}", ["pin", "cache"], [["0.27.1", f"kept in {path} now"]],
                            legend=[f"x = a legend line that names {path} and then more words"])
    for width in (40, 80):
        buf = io.StringIO()
        con = Console(file=buf, width=width, color_system=None)
        saved = report.console
        report.console = lambda stderr=False, con=con: con  # type: ignore[assignment]
        try:
            report.emit("text", {"notes": []}, table, None)
        finally:
            report.console = saved
        lines = buf.getvalue().splitlines()
        assert sum(path in line for line in lines) == 3, buf.getvalue()  # title, cell, legend: each whole
        for line in lines:
            if path not in line:
                assert len(line.rstrip()) <= width, (width, line)


def test_a_token_in_a_urls_user_part_is_never_shown() -> None:
    """A git URL may carry a token as its user name (`https://TOKEN@host/...`), which the lock accepts; every
    line the user reads (progress, notes, tables, JSON) goes through report.words, which hides it."""
    from dsv4patch import report

    line = "fetch p from https://ghp_SECRET123@github.com/acme/vllm.git"
    assert "SECRET" not in report.words(line) and "https://***@github.com/acme/vllm.git" in report.words(line)
    assert "SECRET" not in report.literal(line)
    shown = report._words_in({"url": "ssh://tok:SECRET@h/x", "notes": [line]})
    assert "SECRET" not in str(shown)
    assert report.words("mail a@b.example about https://h/r@v1") == "mail a@b.example about https://h/r@v1"
