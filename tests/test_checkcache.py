"""check's result cache (checkcache.py): reused only when every input matches.

Each input of a pin's result is changed in turn (base tree, a patch's bytes,
the patches' order, a variant, git's version, dsv4patch's version) and the
cached result must not be reused; the result that comes back is the one the
changed inputs give.  Real git, a real git pin, through the CLI.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import dsv4patch
from conftest import MINI_FILES, git_pin, sh, write_lock
from dsv4patch.series import checkcache


def run(cli, lock: Path, cache: Path, *extra: str) -> dict:
    res = cli("check", "--lock", lock, "--cache-dir", cache, "--format", "json", *extra)
    assert res.out.strip().startswith("{"), res.err
    return json.loads(res.out)


def pin_state(rep: dict, pin: str = "p") -> tuple[bool, dict[str, str]]:
    p = rep["pins"][pin]
    return p["cached"], {k: v["status"] for k, v in p["patches"].items()}


@pytest.fixture
def setup(tmp_path, upstream):
    d = tmp_path / "lock"
    d.mkdir()
    upstream.patch(d / "0001-a.patch", "a", {"vllm/envs.py": MINI_FILES["vllm/envs.py"] + "A = 1\n"}, "a")
    upstream.patch(d / "0002-b.patch", "b", {"csrc/kernel.cuh": "int length = max(row_len, 0);\nint k = 4;\n"}, "b")
    return d, upstream


def test_cache_is_reused_only_when_every_input_matches(setup, tmp_path, cli, monkeypatch):
    d, upstream = setup
    cache = tmp_path / "cache"
    series = ["0001-a.patch", "0002-b.patch"]
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": series})
    clean = {"0001-a.patch": "clean", "0002-b.patch": "clean"}
    assert pin_state(run(cli, lock, cache)) == (False, clean)
    first = run(cli, lock, cache)
    assert pin_state(first) == (True, clean)
    assert list((cache / "checks").glob("*.json"))

    # 1. A patch's bytes: a hunk that no longer matches (the cached "clean" must not come back).
    a = d / "0001-a.patch"
    good = a.read_text()
    a.write_text(good.replace(" VAR_39 = 39", " VAR_39 = 40"))
    # (0002 touches other files, so it is still checked: a failure blocks only dependent patches)
    assert pin_state(run(cli, lock, cache)) == (False, {"0001-a.patch": "conflict", "0002-b.patch": "clean"})
    a.write_text(good)
    assert pin_state(run(cli, lock, cache)) == (True, clean)
    # ... also a change that does not change the outcome (the message only).
    a.write_text(good.replace("Subject: [PATCH] a", "Subject: [PATCH] a, reworded"))
    assert pin_state(run(cli, lock, cache)) == (False, clean)
    a.write_text(good)

    # 2. The order of the patches.
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": list(reversed(series))})
    cached, st = pin_state(run(cli, lock, cache))
    assert not cached and list(st) == list(reversed(series))
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": series})
    assert pin_state(run(cli, lock, cache)) == (True, clean)

    # 3. A variant for the pin (another file for 0002, same name in the series).
    variant = d / "variant-0002.patch"
    upstream.patch(variant, "v", {"csrc/kernel.cuh": "int length = row_len > 0 ? row_len : 0;\nint k = 4;\n"}, "b'")
    vlock = write_lock(d / "l.toml", {"p": git_pin("p", upstream, extra=f'variants = {{ "0002-b.patch" = "{variant.name}" }}')},
                       {"main": series})
    assert pin_state(run(cli, vlock, cache)) == (False, clean)
    assert pin_state(run(cli, vlock, cache)) == (True, clean)
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": series})
    assert pin_state(run(cli, lock, cache)) == (True, clean)

    # 4. The base tree: the pin moves to a commit whose envs.py already has the change.
    base = upstream.commit
    (upstream.path / "vllm/envs.py").write_text(MINI_FILES["vllm/envs.py"] + "A = 1\n")
    sh(upstream.path, "commit", "-qam", "moved")
    upstream.commit = sh(upstream.path, "rev-parse", "HEAD")
    moved = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": series})
    cached, st = pin_state(run(cli, moved, cache))
    assert not cached and st == {"0001-a.patch": "already-applied", "0002-b.patch": "clean"}
    upstream.commit = base
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": series})

    # 5. git's version: a git on PATH that reports another version (and is the same git otherwise).
    bindir = tmp_path / "bin"
    bindir.mkdir()
    git_real = next(Path(p) / "git" for p in os.environ["PATH"].split(os.pathsep) if (Path(p) / "git").exists())
    (bindir / "git").write_text(
        "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = --version ] && { echo 'git version 99.0.0'; exit 0; }; done\n"
        f"exec {git_real} \"$@\"\n")
    (bindir / "git").chmod(0o755)
    assert pin_state(run(cli, lock, cache)) == (True, clean)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    assert pin_state(run(cli, lock, cache)) == (False, clean)
    assert pin_state(run(cli, lock, cache)) == (True, clean)
    monkeypatch.undo()

    # 6. dsv4patch's version (and the source of the modules that decide a result).
    assert pin_state(run(cli, lock, cache)) == (True, clean)
    monkeypatch.setattr(dsv4patch, "__version__", "99.0")  # code_identity reads it at each call
    assert pin_state(run(cli, lock, cache)) == (False, clean)
    monkeypatch.undo()
    monkeypatch.setattr(checkcache, "DECIDING", checkcache.DECIDING[:-1])
    assert pin_state(run(cli, lock, cache)) == (False, clean)
    monkeypatch.undo()

    # --no-cache checks again; a damaged entry is recomputed, never trusted.
    assert pin_state(run(cli, lock, cache, "--no-cache")) == (False, clean)
    for f in (cache / "checks").glob("*.json"):
        f.write_text("{not json")
    assert pin_state(run(cli, lock, cache)) == (False, clean)
    assert run(cli, lock, cache)["pins"]["p"] == {**first["pins"]["p"], "cached": True}


def test_lock_expectations_are_compared_every_run(setup, tmp_path, cli):
    """Only the result is cached: an expectation changed in the lock is still checked."""
    d, upstream = setup
    cache = tmp_path / "cache"
    series = ["0001-a.patch", "0002-b.patch"]
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": series})
    assert run(cli, lock, cache)["ok"]
    strict = write_lock(d / "l.toml", {"p": git_pin("p", upstream, extra='expect = "upstream"')}, {"main": series})
    rep = run(cli, strict, cache)
    assert rep["pins"]["p"]["cached"] and not rep["ok"]


def test_a_cache_hit_imports_no_parser_or_terminal_library(setup, tmp_path):
    """rich, tomlkit and unidiff are not imported when every pin's result is cached."""
    import subprocess
    import sys

    from conftest import ROOT

    d, upstream = setup
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": ["0001-a.patch", "0002-b.patch"]})
    args = [sys.executable, "-X", "importtime", "-m", "dsv4patch", "check", "--lock", str(lock),
            "--cache-dir", str(tmp_path / "c"), "--format", "json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cold = subprocess.run(args, capture_output=True, text=True, env=env)
    warm = subprocess.run(args, capture_output=True, text=True, env=env)
    assert cold.returncode == 0 and warm.returncode == 0, warm.stderr
    assert json.loads(warm.stdout)["pins"]["p"]["cached"]
    loaded = {line.split("|")[-1].strip() for line in warm.stderr.splitlines() if line.startswith("import time:")}
    assert "unidiff" in {m.split(".")[0] for m in
                         (line.split("|")[-1].strip() for line in cold.stderr.splitlines()
                          if line.startswith("import time:"))}
    heavy = {m for m in loaded if m.split(".")[0] in ("rich", "tomlkit", "unidiff")}
    assert heavy == set()


def test_parallel_pins_share_one_identity_without_a_race(tmp_path, monkeypatch):
    """Cold pins are checked in threads; the cache identity must never be seen half set.

    (A fresh-clone CI run once stopped with an AssertionError: one thread had
    set the git version, another read the not-yet-set tool identity.)"""
    import threading
    import time
    from types import SimpleNamespace

    from conftest import LOCK
    from dsv4patch.pins import Context
    from dsv4patch.pins.lock import load
    from dsv4patch.progress import Progress
    from dsv4patch.series import checkcache as cc
    from dsv4patch.series.pincheck import CachedCheck
    from dsv4patch.store import Store

    real = cc.tool_identity

    def slow_identity() -> str:
        time.sleep(0.3)  # widen the window between the two assignments
        return real()

    monkeypatch.setattr(cc, "tool_identity", slow_identity)
    lock = load(LOCK)
    ctx = CachedCheck(Context(lock=lock, store=Store.open(tmp_path / "store"), progress=Progress(False)), use=True)
    pin = lock.pin("0.27.1")
    repo = SimpleNamespace(base_tree=pin.base_tree, base_commit="0" * 40)
    keys, errors = [], []

    def worker(delay: float) -> None:
        time.sleep(delay)
        try:
            keys.append(ctx._inputs(pin, repo).key())
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(d,)) for d in (0.0, 0.1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(keys) == 2 and keys[0] == keys[1]


def test_the_patched_tree_reads_checks_result_while_its_tree_is_in_the_pin_repository(setup, tmp_path, cli,
                                                                                     monkeypatch):
    """``wheel``/``image`` take the series' result as ``check`` does (pincheck.patched_tree): a cached
    result with its patched tree still an object of the pin's repository is read without running the
    series (the engine is made to fail here to show it); one that names a tree the repository no
    longer holds (pruned, or a forged entry) runs the series again, and the files are the right ones."""
    from dsv4patch.pins import Context
    from dsv4patch.pins.lock import load
    from dsv4patch.progress import Progress
    from dsv4patch.series import engine, pincheck
    from dsv4patch.store import Store

    d, upstream = setup
    cache = tmp_path / "cache"
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": ["0001-a.patch", "0002-b.patch"]})
    assert run(cli, lock, cache)["ok"]
    (entry,) = (cache / "checks").glob("*.json")
    ctx = Context(lock=load(lock), store=Store.open(cache), progress=Progress(False))
    real = engine.run_series

    def not_again(*args: object, **kwargs: object) -> object:
        raise AssertionError("the series ran again although check's result is cached")

    monkeypatch.setattr(engine, "run_series", not_again)
    first = pincheck.patched_tree(ctx=ctx, pin=ctx.lock.pin("p"))
    assert {f.path for f in first.files} == {"vllm/envs.py", "csrc/kernel.cuh"}
    assert next(f for f in first.files if f.path == "csrc/kernel.cuh").patched == \
        b"int length = max(row_len, 0);\nint k = 4;\n"

    forged = json.loads(entry.read_text())
    assert forged["patches"][-1]["tree"] == first.patched_tree, forged
    forged["patches"][-1]["tree"] = "1" * 40  # the series' last tree: one no repository holds
    entry.write_text(json.dumps(forged))
    calls = []

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "run_series", counted)
    again = pincheck.patched_tree(ctx=ctx, pin=ctx.lock.pin("p"))
    assert len(calls) == 1 and again.patched_tree == first.patched_tree
    assert [(f.path, f.patched) for f in again.files] == [(f.path, f.patched) for f in first.files]
    assert json.loads(entry.read_text())["patches"][-1]["tree"] == first.patched_tree  # the entry made anew


def test_a_planted_link_in_the_check_cache_is_never_followed(setup, tmp_path, cli):
    """`<cache>/checks` as a link to a directory elsewhere was followed (results written there, read from
    there), and an entry that is a link was read through; now the directory is replaced by a real one and an
    entry that is not a regular file is a miss, recomputed and replaced."""
    d, upstream = setup
    cache = tmp_path / "cache"
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": ["0001-a.patch", "0002-b.patch"]})
    clean = {"0001-a.patch": "clean", "0002-b.patch": "clean"}
    assert pin_state(run(cli, lock, cache)) == (False, clean)
    entry = next((cache / "checks").glob("*.json"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / entry.name).write_bytes(entry.read_bytes())
    for f in (cache / "checks").iterdir():
        f.unlink()
    (cache / "checks").rmdir()
    (cache / "checks").symlink_to(elsewhere)
    assert pin_state(run(cli, lock, cache)) == (False, clean)  # not read through the link
    assert not (cache / "checks").is_symlink() and (cache / "checks" / entry.name).is_file()
    assert os.listdir(elsewhere) == [entry.name]  # nothing written there
    (cache / "checks" / entry.name).unlink()
    (cache / "checks" / entry.name).symlink_to(elsewhere / entry.name)
    assert pin_state(run(cli, lock, cache)) == (False, clean)
    assert not (cache / "checks" / entry.name).is_symlink()
    assert pin_state(run(cli, lock, cache)) == (True, clean)
