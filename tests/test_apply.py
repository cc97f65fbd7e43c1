"""apply and status on real git trees: atomic, idempotent, refuses unsafe states."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import MINI_FILES, ROOT, git_pin, sh, write_lock
from dsv4patch.errors import EXIT_BUILD, EXIT_TREE, EXIT_UNEXPECTED


@pytest.fixture
def two_patch_lock(tmp_path, upstream):
    d = tmp_path / "lock"
    d.mkdir()
    upstream.patch(d / "0001-a.patch", "a", {"vllm/envs.py": MINI_FILES["vllm/envs.py"] + "A = 1\n"},
                   "first\n\nFix: 1\nTest: tests/x.py::test_a")
    upstream.patch(d / "0002-b.patch", "b", {"vllm/worker.py": MINI_FILES["vllm/worker.py"] + "B = 2\n"}, "second")
    return write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": ["0001-a.patch", "0002-b.patch"]})


def snapshot(tree: Path) -> tuple[str, str, str]:
    return (sh(tree, "rev-parse", "HEAD"), sh(tree, "status", "--porcelain", "--ignored"),
            sh(tree, "rev-parse", "HEAD^{tree}"))


def test_apply_creates_commits_with_trailers_and_is_idempotent(tmp_path, cli, two_patch_lock):
    tree = tmp_path / "vllm-src"
    args = ("apply", "--lock", two_patch_lock, "--pin", "p", "--tree", tree, "--cache-dir", tmp_path / "c")
    first = cli(*args, "--format", "json")
    assert first.rc == 0, first.err
    head = json.loads(first.out)["head"]
    log = sh(tree, "log", "--format=%s%n%(trailers:only)", "-2")
    assert "Dsv4patch-Patch: 0002-b.patch" in log and "Dsv4patch-Patch: 0001-a.patch" in log
    assert "Test: tests/x.py::test_a" in log
    assert (tree / "vllm/envs.py").read_text().endswith("A = 1\n")
    before = snapshot(tree)
    second = cli(*args, "--format", "json")
    assert second.rc == 0 and json.loads(second.out)["head"] == head
    assert "nothing to do" in " ".join(json.loads(second.out)["notes"])
    assert snapshot(tree) == before
    st = cli("status", "--tree", tree, "--lock", two_patch_lock, "--pin", "p", "--format", "json")
    rep = json.loads(st.out)
    assert st.rc == 0 and {k: v["state"] for k, v in rep["patches"].items()} == {
        "0001-a.patch": "applied", "0002-b.patch": "applied"}
    # git revert works on the commits.
    sh(tree, "revert", "--no-edit", "HEAD")
    assert "B = 2" not in (tree / "vllm/worker.py").read_text()


def test_same_inputs_same_commit_ids(tmp_path, cli, two_patch_lock):
    heads = []
    for name in ("one", "two"):
        res = cli("apply", "--lock", two_patch_lock, "--pin", "p", "--tree", tmp_path / name,
                  "--cache-dir", tmp_path / f"c-{name}", "--format", "json")
        heads.append(json.loads(res.out)["head"])
    assert heads[0] == heads[1]


def test_failure_leaves_tree_exactly_as_before(tmp_path, upstream, cli):
    d = tmp_path / "lock"
    d.mkdir()
    upstream.patch(d / "0001-a.patch", "a", {"vllm/envs.py": "A = 1\n"}, "a")
    upstream.patch(d / "0002-bad.patch", "b", {"vllm/worker.py": "B\n"}, "b")
    (d / "0002-bad.patch").write_text((d / "0002-bad.patch").read_text().replace("-def step(x):", "-def stop(x):"))
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": ["0001-a.patch", "0002-bad.patch"]})
    tree = tmp_path / "t"
    # Create the tree with the good patch first, then try the failing series on top.
    ok_lock = write_lock(d / "ok.toml", {"p": git_pin("p", upstream)}, {"ok": ["0001-a.patch"]})
    assert cli("apply", "--lock", ok_lock, "--pin", "p", "--tree", tree, "--cache-dir", tmp_path / "c").rc == 0
    before = snapshot(tree)
    res = cli("apply", "--lock", lock, "--pin", "p", "--tree", tree, "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_UNEXPECTED
    assert "0002-bad.patch" in res.out and "left unchanged" in res.out
    # and from the unpatched base as well
    tree2 = tmp_path / "t2"
    base_lock = write_lock(d / "b.toml", {"p": git_pin("p", upstream)}, {"b": ["0001-a.patch"]})
    assert cli("apply", "--lock", base_lock, "--pin", "p", "--tree", tree2, "--cache-dir", tmp_path / "c").rc == 0
    sh(tree2, "reset", "-q", "--hard", "HEAD~1")
    before2 = snapshot(tree2)
    assert cli("apply", "--lock", lock, "--pin", "p", "--tree", tree2, "--cache-dir", tmp_path / "c").rc == EXIT_UNEXPECTED
    assert snapshot(tree2) == before2
    assert snapshot(tree) == before


def test_refuses_dirty_tree_and_other_commit(tmp_path, cli, two_patch_lock):
    tree = tmp_path / "t"
    base = ("apply", "--lock", two_patch_lock, "--pin", "p", "--tree", tree, "--cache-dir", tmp_path / "c")
    assert cli(*base).rc == 0
    (tree / "vllm/worker.py").write_text("local edit\n")
    res = cli(*base)
    assert res.rc == EXIT_TREE and "uncommitted changes" in res.err and "vllm/worker.py" in res.err
    sh(tree, "checkout", "vllm/worker.py")
    (tree / "new.txt").write_text("x")
    sh(tree, "add", "new.txt")
    sh(tree, "commit", "-qm", "mine")
    # Your own commit above the series (issue 35): apply agrees with status, nothing to do.
    res = cli(*base, "--format", "json")
    assert res.rc == 0 and any("1 commit(s) of yours above them" in n for n in json.loads(res.out)["notes"]), res
    assert cli("status", "--lock", two_patch_lock, "--pin", "p", "--tree", tree).rc == 0
    # Your commit that takes a patch out again: both say so (exit 1), nothing is touched.
    (tree / "vllm/worker.py").write_text(sh(tree, "show", "HEAD~2:vllm/worker.py") + "\n")
    sh(tree, "commit", "-qam", "mine: revert the worker change")
    head = sh(tree, "rev-parse", "HEAD")
    res = cli(*base)
    assert res.rc == 1 and "take out what 0002" in res.out, res
    assert cli("status", "--lock", two_patch_lock, "--pin", "p", "--tree", tree).rc == 1
    assert sh(tree, "rev-parse", "HEAD") == head
    # A branch of yours off the middle of the series: the commits above 0001 do not carry 0002; both say
    # so (exit 1), nothing is touched.
    sh(tree, "checkout", "-q", "-b", "side", "HEAD~3")
    (tree / "side.txt").write_text("x")
    sh(tree, "add", "side.txt")
    sh(tree, "commit", "-qm", "mine, on 0001")
    head = sh(tree, "rev-parse", "HEAD")
    res = cli(*base)
    assert res.rc == 1 and "which do not carry 0002" in res.out, res
    assert cli("status", "--lock", two_patch_lock, "--pin", "p", "--tree", tree).rc == 1
    assert sh(tree, "rev-parse", "HEAD") == head
    # A commit that descends from none of it: neither the base nor a state dsv4patch made (exit 5).
    sh(tree, "checkout", "-q", "--orphan", "elsewhere")
    sh(tree, "commit", "-qm", "not vLLM at all")
    res = cli(*base)
    assert res.rc == EXIT_TREE and "neither the commit pin p's series starts from" in res.err, res


def test_refuses_a_foreign_repository(tmp_path, cli, two_patch_lock):
    tree = tmp_path / "foreign"
    tree.mkdir()
    sh(tree, "init", "-q")
    (tree / "f").write_text("x")
    sh(tree, "add", "f")
    sh(tree, "commit", "-qm", "x")
    res = cli("apply", "--lock", two_patch_lock, "--pin", "p", "--tree", tree, "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_TREE and "lacks the pin's base commit" in res.err


def test_sigkill_mid_apply_is_finished_by_next_run(tmp_path, cli, two_patch_lock):
    """Kill apply at several points; the next run always ends at the same final state."""
    cache = tmp_path / "c"
    ref = tmp_path / "ref"
    assert cli("apply", "--lock", two_patch_lock, "--pin", "p", "--tree", ref, "--cache-dir", cache).rc == 0
    final = snapshot(ref)[0]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for i, delay in enumerate([0.05, 0.15, 0.3, 0.45, 0.6, 0.8]):
        tree = tmp_path / f"k{i}"
        assert cli("apply", "--lock", two_patch_lock, "--pin", "p", "--tree", tree,
                   "--cache-dir", cache).rc == 0
        sh(tree, "reset", "-q", "--hard", "HEAD~2")
        proc = subprocess.Popen(
            [sys.executable, "-m", "dsv4patch", "apply", "--lock", str(two_patch_lock), "--pin", "p",
             "--tree", str(tree), "--cache-dir", str(cache)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        res = cli("apply", "--lock", two_patch_lock, "--pin", "p", "--tree", tree, "--cache-dir", cache)
        assert res.rc == 0, (delay, res.err)
        head, status, _ = snapshot(tree)
        assert head == final and status == "", delay


def test_two_applies_on_one_tree_do_not_interleave(tmp_path, cli, two_patch_lock, monkeypatch):
    from dsv4patch.checkout.transaction import exclusive_checkout
    from dsv4patch.errors import EXIT_BUSY

    tree = tmp_path / "t"
    cache = tmp_path / "c"
    assert cli("apply", "--lock", two_patch_lock, "--pin", "p", "--tree", tree, "--cache-dir", cache).rc == 0
    sh(tree, "reset", "-q", "--hard", "HEAD~1")
    before = snapshot(tree)
    monkeypatch.setenv("DSV4PATCH_LOCK_TIMEOUT", "0.3")
    with exclusive_checkout(tree):
        res = cli("apply", "--lock", two_patch_lock, "--pin", "p", "--tree", tree, "--cache-dir", cache)
    assert res.rc == EXIT_BUSY and f"tree {tree}" in res.err
    assert snapshot(tree) == before
    assert cli("apply", "--lock", two_patch_lock, "--pin", "p", "--tree", tree, "--cache-dir", cache).rc == 0


@pytest.mark.network
def test_a_failed_kernel_step_names_the_pin_and_its_build_command_works(tmp_path, cli, shared_cache):
    """The kernel step of `apply --pin 0.26.0` fails (an interpreter without torch): exit 7, and the
    `build` it tells you to run names the pin (not the lock's default, 0.27.1); that command, dry,
    plans the kernels of pin 0.26.0 (and without --pin too: the tree's own pin)."""
    tree = tmp_path / "t"
    common = ("--lock", ROOT / "locks" / "vllm.toml", "--cache-dir", shared_cache)
    res = cli("apply", *common, "--pin", "0.26.0", "--tree", tree, "--python", "/usr/bin/python3",
              "--out", tmp_path / "dist")
    assert res.rc == EXIT_BUILD, res.err
    hint = f"`dsv4patch build --tree {tree} --pin 0.26.0`"
    assert hint in " ".join(res.err.split()), res.err
    for pin in (("--pin", "0.26.0"), ()):
        built = cli("build", *common, "--tree", tree, *pin, "--dry-run", "--format", "json")
        assert built.rc == 0, built.err
        assert json.loads(built.out)["pin"] == "0.26.0"


def test_a_cache_inside_the_tree_is_refused_before_anything_is_written(tmp_path, cli, monkeypatch):
    """`--cache-dir TREE` (or TREE/.git, or DSV4PATCH_CACHE there) put the downloads into the user's tree,
    which apply then refused as dirty (or built the cache inside .git); now exit 2 at once, nothing made."""
    from conftest import LOCK

    tree = tmp_path / "t"
    for cache in (tree, tree / ".git", tree / "sub" / "cache"):
        res = cli("apply", "--lock", LOCK, "--pin", "0.27.1", "--tree", tree, "--cache-dir", cache, "--no-build")
        assert res.rc == 2 and "is inside --tree" in res.err and not tree.exists(), res
    monkeypatch.setenv("DSV4PATCH_CACHE", str(tree / "c"))
    res = cli("apply", "--lock", LOCK, "--pin", "0.27.1", "--tree", tree, "--no-build")
    assert res.rc == 2 and "DSV4PATCH_CACHE" in res.err and not tree.exists(), res


def test_no_build_says_the_kernel_fixes_are_not_in_effect(tmp_path, cli, shared_cache):
    """`apply --no-build` left no trace that the CUDA kernels the series changes were not rebuilt; now a note
    names them and the build command (with the pin) that puts the kernel fixes in effect."""
    from conftest import LOCK

    tree = tmp_path / "t"
    res = cli("apply", "--lock", LOCK, "--pin", "0.27.1", "--tree", tree, "--cache-dir", shared_cache, "--no-build",
              "--format", "json")
    assert res.rc == 0, res.err
    notes = [n for n in json.loads(res.out)["notes"] if "were not rebuilt" in n]
    assert len(notes) == 1 and f"dsv4patch build --tree {tree} --pin 0.27.1" in notes[0], notes
    assert "csrc/" in notes[0]
