"""Source kinds: git remote at an exact commit, local checkout, progress output."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, git_pin, sh, write_lock
from dsv4patch.errors import EXIT_FETCH, EXIT_TREE
from localindex import serve


def test_git_remote_fetches_exact_commit_from_bare_repo(tmp_path, upstream, cli):
    bare = tmp_path / "remote.git"
    sh(tmp_path, "clone", "-q", "--bare", str(upstream.path), str(bare))
    pinned = upstream.commit
    # The remote moves on after the pin: the pin must still get its commit.
    (upstream.path / "vllm/envs.py").write_text("MOVED = 1\n")
    sh(upstream.path, "commit", "-qam", "later")
    sh(upstream.path, "push", "-q", str(bare), "HEAD:main")
    d = tmp_path / "l"
    d.mkdir()
    upstream.path, upstream.commit = bare, pinned
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": []})
    res = cli("fetch", "--lock", lock, "--cache-dir", tmp_path / "c", "--format", "json")
    assert res.rc == 0, res.err
    repo = Path(json.loads(res.out)["pins"]["p"]["repo"])
    assert "MOVED" not in sh(repo, "show", "HEAD:vllm/envs.py")
    tree = json.loads(res.out)["pins"]["p"]["base_tree"]
    assert tree == sh(bare, "rev-parse", f"{pinned}^{{tree}}")


def test_git_remote_missing_commit(tmp_path, upstream, cli):
    d = tmp_path / "l"
    d.mkdir()
    upstream.commit = "1" * 40
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": []})
    res = cli("fetch", "--lock", lock, "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_FETCH and "1111111111" in res.err and "pin p" in res.err


def test_local_checkout_must_be_clean_and_at_commit(tmp_path, upstream, cli):
    d = tmp_path / "l"
    d.mkdir()
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream, kind="local")}, {"main": []})
    (upstream.path / "vllm/envs.py").write_text("dirty\n")
    res = cli("fetch", "--lock", lock, "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_TREE and "uncommitted changes" in res.err and "vllm/envs.py" in res.err
    sh(upstream.path, "commit", "-qam", "moved on")
    res = cli("fetch", "--lock", lock, "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_TREE and "check out that commit" in res.err
    sh(upstream.path, "checkout", "-q", upstream.commit)
    assert cli("fetch", "--lock", lock, "--cache-dir", tmp_path / "c").rc == 0


def test_local_checkout_is_revalidated_with_a_warm_cache(tmp_path, upstream, cli):
    """A warm cache must not say ok for a checkout that has moved or has edits."""
    d = tmp_path / "l"
    d.mkdir()
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream, kind="local")}, {"main": []})
    cache = tmp_path / "c"
    assert cli("fetch", "--lock", lock, "--cache-dir", cache).rc == 0  # cache now warm
    sh(upstream.path, "commit", "-q", "--allow-empty", "-m", "moved on")
    res = cli("fetch", "--lock", lock, "--cache-dir", cache)
    assert res.rc == EXIT_TREE and "check out that commit" in res.err, (res.rc, res.err)
    sh(upstream.path, "checkout", "-q", upstream.commit)
    (upstream.path / "vllm/envs.py").write_text("edited\n")
    res = cli("fetch", "--lock", lock, "--cache-dir", cache)
    assert res.rc == EXIT_TREE and "uncommitted changes" in res.err, (res.rc, res.err)
    sh(upstream.path, "checkout", "-q", "--", "vllm/envs.py")
    assert cli("fetch", "--lock", lock, "--cache-dir", cache).rc == 0


def _served_lock(tmp_path: Path, url: str) -> Path:
    """A lock whose one sdist pin downloads from URL (its sha256 matches nothing: only the download matters)."""
    (tmp_path / "s.series").write_text("x.patch\n")
    lock = tmp_path / "l.toml"
    lock.write_text(
        'schema = 1\n[series.s]\npath = "s.series"\n[pins."s"]\nvllm_version = "0"\n'
        f'commit = "{"a" * 40}"\n[pins."s".source]\nkind = "pypi-sdist"\nname = "vllm"\n'
        f'version = "0"\nsha256 = "{"0" * 64}"\n'
        f'url = "{url}"\n'
    )
    return lock


def test_progress_on_a_tty_and_plain_lines_otherwise(tmp_path):
    with serve() as idx:
        idx.pages["/x.tar.gz"] = ("application/octet-stream", b"y" * (3 << 20))
        lock = _served_lock(tmp_path, f"{idx.url}/x.tar.gz")
        cmd = [sys.executable, "-m", "dsv4patch", "fetch", "--lock", str(lock), "--cache-dir"]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100", "TERM": "xterm"}
        # Not a TTY (issue 40): each step one plain line on stderr, no bar, no cursor control, then the error.
        plain = subprocess.run(cmd + [str(tmp_path / "c1")], capture_output=True, text=True, env=env)
        steps = [line for line in plain.stderr.splitlines() if line.startswith("dsv4patch: ")]
        assert any("download pin s: vllm-0.tar.gz" in line for line in steps), plain.stderr
        assert "\r" not in plain.stderr and "\x1b" not in plain.stderr, plain.stderr
        assert "sha256 mismatch" in plain.stderr
        # A TTY: the download shows a progress bar.
        pid, fd = pty.fork()
        if pid == 0:
            os.execvpe(cmd[0], cmd + [str(tmp_path / "c2")], env)
        chunks = []
        while True:
            try:
                data = os.read(fd, 4096)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        os.waitpid(pid, 0)
        text = b"".join(chunks).decode(errors="replace")
        assert "download pin s: vllm-0.tar.gz" in text
        assert "sha256 mismatch" in text  # and it still fails safely afterwards
