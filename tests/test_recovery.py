"""A killed apply always recovers, and recovery never discards what a user did.

Real processes are killed with SIGKILL (the whole process group, or only the
main process) at points made deterministic through the caller's PATH (see
``git_stop``: dsv4patch runs hooks and filters of no repository, but the
``git`` it runs is the one PATH names), and at random moments of a run
(seeded; ``DSV4PATCH_TEST_SEED=N`` adds N to every seed, to try moments the
suite's own seeds do not: docs/contributing.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

import git_stop
from conftest import LOCK, MINI_FILES, ROOT, git_pin, sh, write_lock
from dsv4patch import store
from dsv4patch.errors import EXIT_BUSY, EXIT_OK, EXIT_TREE
from dsv4patch.store import Store

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
# Added to every seed of the random kills and interrupts (0: the suite's own moments).
SEED = int(os.environ.get("DSV4PATCH_TEST_SEED", "0"))


@pytest.fixture
def lock5(tmp_path, upstream):
    """Five patches over the mini upstream: a move touches several files."""
    d = tmp_path / "lock"
    d.mkdir()
    files = {
        "vllm/envs.py": MINI_FILES["vllm/envs.py"] + "A = 1\n",
        "vllm/worker.py": MINI_FILES["vllm/worker.py"] + "B = 2\n",
        "csrc/kernel.cuh": "int length = row_len < 0 ? 0 : row_len;\nint k = 4;\n",
        "vllm/new_module.py": "NEW = True\n",
        "vllm/__init__.py": None,
    }
    names = []
    for i, (path, content) in enumerate(files.items(), 1):
        name = f"000{i}-p{i}.patch"
        upstream.patch(d / name, f"p{i}", {path: content}, f"patch {i}")
        names.append(name)
    return write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": names})


@pytest.fixture
def wide_lock(tmp_path, upstream):
    """Two patches, the second adding 800 files: the work tree move takes a while."""
    d = tmp_path / "wide"
    d.mkdir()
    upstream.patch(d / "0001-a.patch", "a", {"vllm/envs.py": MINI_FILES["vllm/envs.py"] + "A = 1\n"}, "a")
    many: dict[str, str | None] = {f"vllm/gen/m{i:04d}.py": f"X = {i}\n" for i in range(800)}
    upstream.patch(d / "0002-many.patch", "many", many, "many files")
    return write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": ["0001-a.patch", "0002-many.patch"]})


def apply_args(lock: Path, tree: Path, cache: Path, pin: str = "p") -> list[str]:
    return ["apply", "--lock", str(lock), "--pin", pin, "--tree", str(tree), "--cache-dir", str(cache),
            "--no-build"]


def spawn(args: list[str], **env: str) -> subprocess.Popen[bytes]:
    """dsv4patch in its own process group (so the whole group can be killed)."""
    return subprocess.Popen([sys.executable, "-m", "dsv4patch", *args], env={**ENV, **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def killpg(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"apply ended (rc {proc.returncode}) before {path.name}: "
                                 f"{proc.stderr.read().decode() if proc.stderr else ''}")
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.02)


def state(tree: Path) -> tuple[str, str]:
    return sh(tree, "rev-parse", "HEAD"), sh(tree, "status", "--porcelain", "--ignored",
                                             "--untracked-files=all")


def leftovers(tree: Path) -> list[str]:
    gitdir = tree / ".git"
    names = ["index.lock", "HEAD.lock", "dsv4patch-apply.json", "dsv4patch-apply.tmp"]
    found = [n for n in names if (gitdir / n).exists()]
    found += [p.name for p in gitdir.glob("dsv4patch-index-*")]
    found += [p.name for p in gitdir.glob(".dsv4patch-apply.json.*")]  # the journal's temporary file
    found += [str(p) for p in (gitdir / "refs").rglob("*.lock")]
    return found


def stop_git(tmp_path: Path, tree: Path, sub: str) -> tuple[Path, dict[str, str]]:
    """(flag directory, env for ``spawn``): that run's first ``sub`` on ``tree`` stops.

    ``update-ref``: stops where git's ref transaction is prepared.
    ``read-tree`` (``-m -u``): stops half-way through writing the work tree.
    See ``git_stop`` for the exact state each leaves; ``flags/started`` tells
    that it is reached, ``flags/go`` lets it go on, ``flags/disarmed`` turns it off.
    """
    flags = tmp_path / "flags"
    return flags, git_stop.install(tmp_path / "stop-bin", flags, tree, sub)


def make_base_tree(cli, lock: Path, tree: Path, cache: Path) -> tuple[str, str]:
    """A tree created by apply, reset to the pin's base; returns (base, final) commits."""
    res = cli(*apply_args(lock, tree, cache), "--format", "json")
    assert res.rc == 0, res.err
    final = json.loads(res.out)["head"]
    base = sh(tree, "rev-list", "--max-parents=0", "HEAD")
    sh(tree, "reset", "-q", "--hard", base)
    return base, final


def test_exclusive_checkout_is_in_the_tree_and_held_until_git_children_exit(tmp_path, cli, lock5, monkeypatch):
    """Two caches, one tree: the second run waits; killing only the first's main
    process keeps the tree locked while its git children still run; afterwards
    the next run removes the stale ref lock and finishes the move.

    The first run's ``git update-ref`` (a stand-in first on its PATH) takes
    HEAD.lock and the branch's ref lock as git does, then blocks in a child
    process, as a ``reference-transaction`` hook would: index and work tree
    are moved, HEAD is at the base, the journal exists.  Killing the main
    process kills the stand-in (it is tied to dsv4patch); the child lives on
    with the tree lock's descriptor until the test lets it go, leaving the ref
    locks of a killed git behind."""
    tree = tmp_path / "t"
    base, final = make_base_tree(cli, lock5, tree, tmp_path / "c1")
    flags, env = stop_git(tmp_path, tree, "update-ref")
    first = spawn(apply_args(lock5, tree, tmp_path / "c1"), **env)
    try:
        wait_for(flags / "started", first)
        monkeypatch.setenv("DSV4PATCH_LOCK_TIMEOUT", "0.2")
        other = cli(*apply_args(lock5, tree, tmp_path / "c2"))  # another cache
        assert other.rc == EXIT_BUSY, other.err
        assert f"tree {tree}" in other.err
        os.kill(first.pid, signal.SIGKILL)  # only the main process
        first.wait()
        time.sleep(0.3)
        again = cli(*apply_args(lock5, tree, tmp_path / "c2"))
        assert again.rc == EXIT_BUSY, "the lock was released while git children still ran"
        assert sh(tree, "rev-parse", "HEAD") == base
        assert (tree / ".git" / "HEAD.lock").exists()
        (flags / "disarmed").touch()
        (flags / "go").touch()
        monkeypatch.setenv("DSV4PATCH_LOCK_TIMEOUT", "30")
        res = cli(*apply_args(lock5, tree, tmp_path / "c2"), "--format", "json")
        assert res.rc == EXIT_OK, res.err
        assert any("finished an interrupted apply" in n for n in json.loads(res.out)["notes"])
        assert state(tree) == (final, "")
        assert leftovers(tree) == []
    finally:
        (flags / "go").touch()
        killpg(first)


def test_two_runs_with_different_caches_create_one_tree(tmp_path, lock5, cli):
    """Both runs start before the tree exists: one creates and patches it, the other
    waits and then finds nothing to do."""
    tree = tmp_path / "t"
    for round_ in range(3):
        if tree.exists():
            subprocess.run(["rm", "-rf", str(tree)], check=True)
        procs = [spawn(apply_args(lock5, tree, tmp_path / f"c{i}")) for i in range(2)]
        errs = [p.communicate()[1].decode() for p in procs]
        assert [p.returncode for p in procs] == [0, 0], (round_, errs)
        assert state(tree)[1] == "" and leftovers(tree) == []
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".t.")) == []


def test_group_kill_while_the_work_tree_moves_is_finished_by_the_next_run(tmp_path, cli, lock5):
    """SIGKILL the process group while ``git read-tree -m -u`` writes the work tree:
    index.lock is left behind, HEAD at the base, the tree half-moved.  The next
    plain run removes the stale lock and reaches the locked tree.

    The run's ``git read-tree -m -u`` (a stand-in first on its PATH) takes
    index.lock, has the real git write the work tree part-way (files the move
    deletes removed, the first file it writes written, the second unlinked and
    not yet rewritten; the index itself still at the base), then blocks; the
    test kills the process group there."""
    tree, cache = tmp_path / "t", tmp_path / "c"
    base, final = make_base_tree(cli, lock5, tree, cache)
    flags, env = stop_git(tmp_path, tree, "read-tree")
    proc = spawn(apply_args(lock5, tree, cache), **env)
    try:
        wait_for(flags / "started", proc)
        killpg(proc)
    finally:
        (flags / "go").touch()
        killpg(proc)
    assert (tree / ".git" / "index.lock").exists()
    assert sh(tree, "rev-parse", "HEAD") == base
    half = sh(tree, "status", "--porcelain")
    assert half, "the kill should leave a half-moved work tree"
    (flags / "disarmed").touch()
    res = cli(*apply_args(lock5, tree, cache))
    assert res.rc == EXIT_OK, res.err
    assert "index.lock" in res.out
    assert state(tree) == (final, "")
    assert leftovers(tree) == []


def _killed_at_update_ref(tmp_path, cli, lock5) -> tuple[Path, Path, str, str]:
    """The process group killed inside ``git update-ref`` (see ``stop_git``): index
    and work tree moved, HEAD at the base, HEAD.lock and the ref lock left, journal there."""
    tree, cache = tmp_path / "t", tmp_path / "c"
    base, final = make_base_tree(cli, lock5, tree, cache)
    flags, env = stop_git(tmp_path, tree, "update-ref")
    proc = spawn(apply_args(lock5, tree, cache), **env)
    try:
        wait_for(flags / "started", proc)
    finally:
        killpg(proc)
        (flags / "disarmed").touch()
    assert (tree / ".git" / "dsv4patch-apply.json").exists()
    assert sh(tree, "rev-parse", "HEAD") == base
    assert (tree / ".git" / "HEAD.lock").exists()
    return tree, cache, base, final


def _commit_on_top(tree: Path) -> str:
    (tree / "mine.txt").write_text("my work\n")
    sh(tree, "add", "mine.txt")
    sh(tree, "commit", "-qm", "my work")
    return "mine.txt"


def _edit_untouched(tree: Path) -> str:
    (tree / "vllm" / "worker.py").write_text("my edit of a file the apply does not move\n")
    return "vllm/worker.py"


def _edit_moved(tree: Path) -> str:
    (tree / "vllm" / "envs.py").write_text("my edit of a file the apply moves\n")
    return "vllm/envs.py"


def _new_file(tree: Path) -> str:
    (tree / "notes.txt").write_text("my notes\n")
    return "notes.txt"


def _staged(tree: Path) -> str:
    (tree / "vllm" / "new_module.py").write_text("staged by me\n")
    sh(tree, "add", "vllm/new_module.py")
    return "vllm/new_module.py"


@pytest.mark.parametrize("change", [_commit_on_top, _edit_untouched, _edit_moved, _new_file, _staged])
def test_recovery_refuses_a_tree_the_user_changed(tmp_path, cli, lock5, change):
    """After a kill mid-move, the user commits, edits, adds or stages: the next
    run refuses (exit 5) with what to do, and the user's change is intact."""
    tree, cache, _base, final = _killed_at_update_ref(tmp_path, cli, lock5)
    # The ref lock the killed update-ref left would make the user's own commit
    # fail; like git tells them, they remove it.
    for stale in (tree / ".git").rglob("*.lock"):
        if stale.name != "dsv4patch.lock":
            stale.unlink()
    path = change(tree)
    before = (sh(tree, "rev-parse", "HEAD"), sh(tree, "status", "--porcelain"),
              (tree / path).read_bytes())
    res = cli(*apply_args(lock5, tree, cache), "--format", "json")
    assert res.rc == EXIT_TREE, (res.out, res.err)
    assert "interrupted" in res.err and "Nothing was touched" in res.err
    assert json.loads(res.out)["error"]["exit_code"] == EXIT_TREE
    after = (sh(tree, "rev-parse", "HEAD"), sh(tree, "status", "--porcelain"),
             (tree / path).read_bytes())
    assert after == before
    assert sh(tree, "rev-parse", "HEAD") != final or change is not _commit_on_top


def test_a_foreign_index_lock_is_left_alone(tmp_path, cli, lock5):
    """An index.lock with no interrupted apply is someone else's: exit 5, name the file."""
    tree, cache = tmp_path / "t", tmp_path / "c"
    base, _final = make_base_tree(cli, lock5, tree, cache)
    (tree / ".git" / "index.lock").write_bytes(b"")
    res = cli(*apply_args(lock5, tree, cache))
    assert res.rc == EXIT_TREE and "index.lock" in res.err and "delete the file" in res.err
    assert (tree / ".git" / "index.lock").exists()
    assert state(tree) == (base, "")


def test_recovery_without_user_changes_finishes(tmp_path, cli, lock5):
    """Killed inside update-ref, nothing changed since: the next run removes the
    stale ref locks and finishes the move."""
    tree, cache, _base, final = _killed_at_update_ref(tmp_path, cli, lock5)
    st = cli("status", "--tree", tree, "--format", "json")
    assert st.rc == 1 and json.loads(st.out)["interrupted_apply"] is True
    res = cli(*apply_args(lock5, tree, cache))
    assert res.rc == EXIT_OK, res.err
    assert state(tree) == (final, "")
    assert leftovers(tree) == []


def _random_kills(tmp_path: Path, cli, lock: Path, pin: str, cache: Path, kills: int, seed: int,
                  fresh_every: int) -> dict[str, int]:
    """Kill apply's process group after random delays; check what the next runs do."""
    rng = random.Random(seed + SEED)
    tree = tmp_path / f"kill-{pin}"
    ref = cli(*apply_args(lock, tree, cache, pin), "--format", "json")
    assert ref.rc == 0, ref.err
    final = json.loads(ref.out)["head"]
    base = sh(tree, "rev-list", "--max-parents=0", "HEAD")
    # The run's length, the shorter of two timed runs: one slowed by a burst of other work would
    # put the late kills after the run's end, where no kill lands while the tree moves.
    durations = []
    for _ in range(2):
        t0 = time.monotonic()
        sh(tree, "reset", "-q", "--hard", base)
        timing = spawn(apply_args(lock, tree, cache, pin))
        timing.wait()
        durations.append(time.monotonic() - t0)
        assert timing.returncode == 0
    duration = min(durations)
    seen = {"reruns-1": 0, "reruns-2": 0, "user-refused": 0, "journal-left": 0, "index-lock-left": 0,
            "finished": 0}
    for i in range(kills):
        if i % fresh_every == 0:
            subprocess.run(["rm", "-rf", str(tree)], check=True)
        elif tree.exists():
            sh(tree, "reset", "-q", "--hard", base)
        # Half the kills anywhere in the run, half in its last third (where the tree moves); and every
        # sixth aimed at the moving tree itself: sent within 2 ms of the apply's journal appearing (timed
        # kills alone can miss that window when the machine's speed changes between the timing runs and
        # the kills: ci73 had 30 kills and none while the journal existed).
        delay = rng.uniform(0.0, duration * 1.1) if i % 2 else rng.uniform(duration * 0.6, duration)
        proc = spawn(apply_args(lock, tree, cache, pin))
        if i % 6 == 4:
            journal, until = tree / ".git" / "dsv4patch-apply.json", time.monotonic() + 3 * duration + 5
            while proc.poll() is None and not journal.exists() and time.monotonic() < until:
                time.sleep(0.0005)
            delay = rng.uniform(0.0, 0.002)
        time.sleep(delay)
        killed = proc.poll() is None
        killpg(proc)
        if not killed:
            seen["finished"] += 1
        seen["journal-left"] += (tree / ".git" / "dsv4patch-apply.json").exists()
        seen["index-lock-left"] += (tree / ".git" / "index.lock").exists()
        user = tree.exists() and (tree / ".git").exists() and i % 4 == 3
        if user:
            # The user adds a file (and, half the time, commits it when git lets
            # them: a stale git lock file makes their commit fail) before re-running.
            mine = tree / "USER_NOTES.txt"
            mine.write_text(f"user change {i}\n")
            git_locks = [q for q in (tree / ".git").rglob("*.lock") if q.name != "dsv4patch.lock"]
            if rng.random() < 0.5 and not git_locks:
                sh(tree, "add", "USER_NOTES.txt")
                sh(tree, "commit", "-qm", "user commit")
            before = sh(tree, "rev-parse", "HEAD")
            res = cli(*apply_args(lock, tree, cache, pin))
            # Refused; or, where the kill came after the apply had finished and the user committed
            # on top of the series, nothing to do (apply agrees with status, issue 35).
            above = res.rc == EXIT_OK and subprocess.run(
                ["git", "-C", str(tree), "merge-base", "--is-ancestor", final, "HEAD"]).returncode == 0 \
                and before != final and "of yours above them" in res.out
            assert res.rc == EXIT_TREE or above, (i, delay, res.rc, res.err)
            assert mine.read_text() == f"user change {i}\n"
            assert sh(tree, "rev-parse", "HEAD") == before, (i, delay)
            seen["user-refused"] += 1
            subprocess.run(["rm", "-rf", str(tree)], check=True)  # start the next kill afresh
            continue
        for attempt in (1, 2):  # noqa: B007 (read after the loop: which rerun succeeded)
            res = cli(*apply_args(lock, tree, cache, pin))
            if res.rc == 0:
                break
        assert res.rc == 0, (i, delay, res.err)
        seen[f"reruns-{attempt}"] += 1
        assert state(tree) == (final, ""), (i, delay)
        assert leftovers(tree) == [], (i, delay)
    return seen


def test_random_sigkills_of_the_process_group_small_tree(tmp_path, cli, wide_lock):
    """30 kills at seeded random moments (tree creation included): one or two plain
    re-runs always reach the locked tree with a clean status, and a user's change
    made after a kill is never discarded."""
    seen = _random_kills(tmp_path, cli, wide_lock, "p", tmp_path / "c", kills=30, seed=1234,
                         fresh_every=5)
    print(seen)
    assert seen["reruns-1"] + seen["reruns-2"] + seen["user-refused"] == 30
    assert seen["journal-left"] >= 1  # some kills did land while the tree moved


def test_random_sigkills_real_pin(tmp_path, cli, shared_cache):
    """A handful of kills on the real 0.27.1 tree (seven patches, the vLLM sdist)."""
    seen = _random_kills(tmp_path, cli, LOCK, "0.27.1", shared_cache, kills=6, seed=7, fresh_every=6)
    print(seen)
    assert seen["reruns-1"] + seen["reruns-2"] + seen["user-refused"] == 6


# ---------------------------------------------------------------------------
# Random SIGINT / SIGTERM (issue 36): to the process or its group, with SIGINT inherited as
# ignored half the time (a background job of a non-interactive shell, as CI runners start
# commands): exit 130 with "interrupted" or the complete, right result; never a result that
# was not computed; no temporary file or process left; the next plain run reaches the lock.

SIGNALS = [(signal.SIGINT, True), (signal.SIGTERM, True), (signal.SIGINT, False), (signal.SIGTERM, False)]


def _volleys(rng: random.Random, n: int, duration: float) -> list[tuple[float, int, bool, bool]]:
    """``n`` (delay, signal, to the group, SIGINT ignored), seeded: one delay drawn at random in each
    of ``n`` equal slices of 0.05 s .. 1.1 x ``duration`` (so a few shots still reach every part
    of the run: start-up, the work, the cleanup, after the end), in random order; the signal, its
    target and SIGINT's disposition cycle through all 8 combinations in a random order."""
    lo, hi = 0.05, duration * 1.1
    width = (hi - lo) / n
    delays = [rng.uniform(lo + i * width, lo + (i + 1) * width) for i in range(n)]
    rng.shuffle(delays)
    kinds = [(sig, group, ignored) for sig, group in SIGNALS for ignored in (False, True)]
    rng.shuffle(kinds)
    return [(d, *kinds[i % len(kinds)]) for i, d in enumerate(delays)]


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _carriers(mark: str) -> list[str]:
    """Live processes whose environment carries ``mark`` (every process a run started inherits it)."""
    needle = f"DSV4PATCH_TEST_MARK={mark}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes()
            stat = Path(f"/proc/{name}/stat").read_bytes()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ")[:200].decode(errors="replace")
        except OSError:
            continue
        if needle in env.split(b"\0") and stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X"):
            found.append(f"{name}: {cmd}")
    return found


def _no_process_left(mark: str) -> list[str]:
    end = time.monotonic() + 3
    while (left := _carriers(mark)) and time.monotonic() < end:
        time.sleep(0.05)
    return left


@dataclass
class Shot:
    """One run of a command signalled after ``delay`` seconds."""

    rc: int
    out: str
    err: str
    delay: float
    sig: int
    group: bool
    ignored: bool


def _shoot(argv: list[str], delay: float, sig: int, group: bool, ignored: bool, mark: str,
           cwd: Path | None = None) -> Shot:
    proc = subprocess.Popen([sys.executable, "-m", "dsv4patch", *argv], env={**ENV, "DSV4PATCH_TEST_MARK": mark},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, cwd=cwd,
                            preexec_fn=_ignore_sigint if ignored else None)
    time.sleep(delay)
    try:
        if group:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
    except ProcessLookupError:
        pass
    out, err = proc.communicate(timeout=300)
    print(f"{argv[0]}: {signal.Signals(sig).name} to the {'group' if group else 'process'} after {delay:.2f} s"
          f"{' (SIGINT ignored)' if ignored else ''}: exit {proc.returncode}", file=sys.__stderr__, flush=True)
    return Shot(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"), delay, sig, group,
                ignored)


def _timed(argv: list[str], mark: str) -> float:
    """Seconds a plain run of ``argv`` takes as the shots run it (a fresh interpreter, its start-up
    included): their delays are drawn up to 1.1 x this, so the last ones land after its end."""
    t0 = time.monotonic()
    proc = spawn(argv, DSV4PATCH_TEST_MARK=mark)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:].decode(errors="replace")
    return time.monotonic() - t0


def _judge(shot: Shot, reference: dict, seen: dict[str, int]) -> dict | None:
    """The shot's result if it finished (it must be the reference's), None if it was interrupted."""
    where = (shot.delay, signal.Signals(shot.sig).name, "group" if shot.group else "process",
             "SIGINT ignored" if shot.ignored else "", shot.rc, shot.err[-800:])
    if shot.rc == 0:
        data = json.loads(shot.out)
        assert {k: data.get(k) for k in reference} == reference, where
        seen["finished"] += 1
        return data
    if shot.rc == -shot.sig:  # killed while the interpreter itself started, before dsv4patch ran: no result
        assert shot.out == "", where
        seen["before-start"] += 1
        return None
    assert shot.rc == 130, where
    assert "error: interrupted; " in shot.err.strip().splitlines()[-1], where
    data = json.loads(shot.out)  # one document on stdout: the error, or the result finished before the signal
    if "error" not in data:  # the signal came after the result was written (while the command cleaned up)
        assert {k: data.get(k) for k in reference} == reference, where
        seen["interrupted after its result"] = seen.get("interrupted after its result", 0) + 1
        return data
    assert data["error"]["kind"] == "interrupted", where  # never a result it did not compute
    if data["error"]["command"] == "apply":  # what to do: apply's rerun finishes or refuses what this one began
        assert "run the same apply again" in data["error"]["message"], where
    seen["interrupted"] += 1
    return None


def test_random_interrupts_of_apply_port_and_wheel(tmp_path, cli, wide_lock, upstream, shared_cache):
    """24 SIGINT/SIGTERM at seeded random moments over apply, port and wheel, off a terminal: each
    command's run cut in as many slices as it gets shots, one random moment in each (10 for
    apply and port, 4 for the costly wheel), every signal, target and SIGINT disposition used."""
    rng = random.Random(36 + SEED)
    seen = {"finished": 0, "interrupted": 0, "before-start": 0}
    mark = uuid.uuid4().hex
    shots = 0

    # apply: a new tree or one reset to the base; the next plain run reaches the locked tree.
    tree, cache = tmp_path / "apply-tree", tmp_path / "apply-cache"
    ref = cli(*apply_args(wide_lock, tree, cache), "--format", "json")
    assert ref.rc == 0, ref.err
    final = json.loads(ref.out)["head"]
    base = sh(tree, "rev-list", "--max-parents=0", "HEAD")
    subprocess.run(["rm", "-rf", str(tree)], check=True)
    duration = _timed(apply_args(wide_lock, tree, cache), mark)
    for i, (delay, sig, group, ignored) in enumerate(_volleys(rng, 10, duration)):
        if i % 3 == 0:
            subprocess.run(["rm", "-rf", str(tree)], check=True)
        else:
            sh(tree, "reset", "-q", "--hard", base)
        shot = _shoot([*apply_args(wide_lock, tree, cache), "--format", "json"], delay, sig, group, ignored, mark)
        _judge(shot, {"head": final}, seen)
        assert _no_process_left(mark) == [], shot
        # The half-made new tree is removed (its creation lock file may stay: the next run takes and removes it).
        assert not (tmp_path / ".apply-tree.dsv4patch-tmp").exists(), shot
        res = cli(*apply_args(wide_lock, tree, cache))
        assert res.rc == 0, (shot, res.err)
        assert state(tree) == (final, "") and leftovers(tree) == [], shot
        shots += 1

    # port: a git pin carried to a new upstream commit (one refresh, one 3-way merge).
    proj = tmp_path / "proj"
    (proj / "locks").mkdir(parents=True)
    (proj / "patches").mkdir()
    worker = MINI_FILES["vllm/worker.py"]
    upstream.patch(proj / "patches/0001-off.patch", "a", {"vllm/worker.py": worker.replace("return 0", "return 2")},
                   "one")
    upstream.patch(proj / "patches/0002-merge.patch", "b",
                   {"vllm/envs.py": MINI_FILES["vllm/envs.py"].replace("VAR_20 = 20", "VAR_20 = 200")}, "two")
    write_lock(proj / "locks/vllm.toml", {"old": git_pin("old", upstream)},
               {"main": ["0001-off.patch", "0002-merge.patch"]}, series_dir="../patches")
    (upstream.path / "vllm/worker.py").write_text("# 1\n# 2\n# 3\n# 4\n" + worker)
    (upstream.path / "vllm/envs.py").write_text(MINI_FILES["vllm/envs.py"].replace("VAR_17 = 17", "VAR_17 = 17  # on"))
    sh(upstream.path, "commit", "-qam", "drift")
    new_commit = sh(upstream.path, "rev-parse", "HEAD")
    pristine = tmp_path / "proj-pristine"
    shutil.copytree(proj, pristine, symlinks=True)
    port_cache = tmp_path / "port-cache"
    port = ["port", "--lock", str(proj / "locks/vllm.toml"), "--from", "old", "--to", new_commit, "--git",
            str(upstream.path), "--name", "new", "--cache-dir", str(port_cache), "--format", "json"]

    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    ref = cli(*port)
    assert ref.rc == 0, ref.err
    ref_port = {k: v for k, v in json.loads(ref.out).items() if k in ("patches", "check")}
    ported = files(proj)
    shutil.rmtree(proj)
    shutil.copytree(pristine, proj, symlinks=True)
    duration = _timed(port, mark)
    assert files(proj) == ported
    for i, (delay, sig, group, ignored) in enumerate(_volleys(rng, 10, duration)):
        shutil.rmtree(proj)
        shutil.copytree(pristine, proj, symlinks=True)
        if i % 2:
            shutil.rmtree(port_cache, ignore_errors=True)
        shot = _shoot(port, delay, sig, group, ignored, mark)
        done = _judge(shot, ref_port, seen)
        assert _no_process_left(mark) == [], shot
        now = files(proj)
        assert now in (ported, files(pristine)), (shot, sorted(set(now.items()) ^ set(ported.items())))
        if done is None and now != ported:
            res = cli(*port)
            assert res.rc == 0, (shot, res.err)
            assert files(proj) == ported, shot
        shots += 1

    # wheel: the real 0.27.1 pin from the shared cache; no partial wheel, no temporary directory left.
    out = tmp_path / "dist"
    wheel = ["wheel", "--lock", str(LOCK), "--pin", "0.27.1", "--out", str(out), "--cache-dir", str(shared_cache),
             "--format", "json"]
    ref = cli(*wheel)
    assert ref.rc == 0, ref.err
    duration = _timed(wheel, mark)
    ref_wheel = {k: v for k, v in json.loads(ref.out).items() if k in ("wheel", "version", "sha256")}
    digest = hashlib.sha256(Path(ref_wheel["wheel"]).read_bytes()).hexdigest()
    # The costly command (a 313 MB wheel verified and written each time): 4 shots, one in each
    # quarter of its run.
    for delay, sig, group, ignored in _volleys(rng, 4, duration):
        shutil.rmtree(out, ignore_errors=True)
        shot = _shoot(wheel, delay, sig, group, ignored, mark)
        done = _judge(shot, ref_wheel, seen)
        assert _no_process_left(mark) == [], shot
        left = sorted(p.name for p in out.iterdir()) if out.exists() else []
        assert left == ([Path(ref_wheel["wheel"]).name] if done else []), (shot, left)
        if done:
            assert hashlib.sha256(Path(ref_wheel["wheel"]).read_bytes()).hexdigest() == digest
        assert store.stale_tmp(Store(shared_cache)) == [], shot  # not Store.open: it would sweep them
        shots += 1
    res = cli(*wheel)  # the next plain run makes the same wheel
    assert res.rc == 0, res.err
    assert hashlib.sha256(Path(ref_wheel["wheel"]).read_bytes()).hexdigest() == digest
    print(seen, file=sys.__stderr__)
    assert shots == 24
    assert seen["interrupted"] >= 12 and seen["finished"] >= 1


# dsv4patch's entry point with one SIGTERM to itself at a chosen point of a run: at the first fork
# (of a git) made while the function ARM is on the stack, the profiler is armed; it sends the signal
# at the next call after the fork (FIRE empty: in the parent between git's fork and what follows) or
# at the next call of the function FIRE.  The signal's handler runs inside the profiler, so the
# interrupt is raised in that frame, as a real signal landing there is.  Once the run is over, a child
# it left (alive or unreaped) is named on stderr and waited for.
_SIGNAL_AT = r"""
import os, signal, sys
arm, fire = sys.argv[1], sys.argv[2]
armed = []

def shoot(frame, event, arg):
    if frame.f_code is arming.__code__ or (fire and (event != "call" or frame.f_code.co_name != fire)):
        return
    sys.setprofile(None)
    os.kill(os.getpid(), signal.SIGTERM)

def arming():
    f = sys._getframe(1)
    while f is not None and not armed:
        if f.f_code.co_name == arm:
            armed.append(arm)
            sys.setprofile(shoot)
        f = f.f_back

os.register_at_fork(after_in_parent=arming)
from dsv4patch.__main__ import entry
sys.argv[1:] = sys.argv[3:]
code = entry()
left = []  # children the run left running (or unreaped): waited for, so what they do is seen
for stat in os.listdir("/proc"):
    try:
        with open(f"/proc/{stat}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        continue
    if int(fields[1]) == os.getpid():
        left.append(int(stat))
        os.waitpid(int(stat), 0)
if left:
    print(f"children left: {left}", file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.parametrize(("arm", "fire"), [("clone_local", ""), ("new_branch_checkout", "file_mutex")],
                         ids=["as-git-clone-starts", "as-the-new-tree-is-locked"])
def test_an_interrupt_while_apply_makes_a_new_tree_leaves_no_half_made_tree(tmp_path, cli, lock5, arm, fire):
    """A SIGTERM (SIGINT ignored, as in the random volleys) at two fixed points of making a new tree:
    between the fork of its ``git clone`` and the code that ends that git (the git ran on after apply
    had removed ``.TREE.dsv4patch-tmp`` and cloned into it again: seen by the random interrupts, 0.90 s
    into apply), and as the finished clone's tree lock is taken, before its rename (outside the block
    that removed it).  Either way: exit 130, no half-made tree, nothing running; the next run makes it."""
    tree, cache, mark = tmp_path / "t", tmp_path / "c", uuid.uuid4().hex
    proc = subprocess.run([sys.executable, "-c", _SIGNAL_AT, arm, fire, *apply_args(lock5, tree, cache)],
                          env={**ENV, "DSV4PATCH_TEST_MARK": mark}, capture_output=True, text=True, timeout=120,
                          start_new_session=True, preexec_fn=_ignore_sigint)
    assert proc.returncode == 130 and "error: interrupted; " in proc.stderr, proc.stderr[-2000:]
    assert "children left" not in proc.stderr and _no_process_left(mark) == [], proc.stderr[-2000:]
    assert not (tmp_path / ".t.dsv4patch-tmp").exists(), sorted(p.name for p in tmp_path.iterdir())
    assert not tree.exists() or not any(tree.iterdir())
    # beside the tree only the flock file that keeps two creators apart (docs/how-it-works.md)
    assert {p.name for p in tmp_path.iterdir() if p.name.startswith(".t")} <= {".t.dsv4patch-create.lock"}
    res = cli(*apply_args(lock5, tree, cache))
    assert res.rc == 0, res.err
    assert leftovers(tree) == [] and not (tmp_path / ".t.dsv4patch-tmp").exists()
    assert not (tmp_path / ".t.dsv4patch-create.lock").exists()  # the run that made the tree removed it
