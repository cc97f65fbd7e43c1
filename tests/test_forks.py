"""A fork maintainer's own checkout as the tree (issue 28): port --local with its conflict
resolved in a port --workspace that is the fork's checkout itself, apply onto the fork's
branch, a conflict through apply --3way / resolve --continue, refresh, and `git am` of the
refreshed patches onto the fork's second branch; at every step the fork's own history
(commits, branches, remote, config) is intact. Real git throughout (conftest's upstream)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import MINI_FILES, Upstream, git_pin, sh, validate_json, write_lock

ENVS = MINI_FILES["vllm/envs.py"]
WORKER = MINI_FILES["vllm/worker.py"]


def _fork(tmp_path: Path, upstream: Upstream) -> tuple[Path, Path]:
    root = tmp_path / "proj"
    (root / "locks").mkdir(parents=True)
    (root / "patches").mkdir()
    upstream.patch(root / "patches/0001-envs.patch", "a", {"vllm/envs.py": ENVS + "A = 1\n"},
                   "envs: add A\n\nFix: 1")
    upstream.patch(root / "patches/0002-worker.patch", "b",
                   {"vllm/worker.py": WORKER.replace("return 0", "return 2")}, "worker: return 2\n\nFix: 2")
    lock = write_lock(root / "locks/vllm.toml", {"old": git_pin("old", upstream)},
                      {"main": ["0001-envs.patch", "0002-worker.patch"]}, series_dir="../patches")
    fork = tmp_path / "fork"
    sh(tmp_path, "clone", "-q", str(upstream.path), str(fork))  # remote "origin"
    (fork / "FORK.md").write_text("our fork\n")
    sh(fork, "add", "FORK.md")
    sh(fork, "commit", "-qm", "fork: our readme")
    (fork / "vllm/fork.py").write_text("ACME = True\n")
    sh(fork, "add", "vllm/fork.py")
    sh(fork, "commit", "-qm", "fork: our module")
    sh(fork, "branch", "release")  # the second branch, at the fork's own commits
    sh(fork, "remote", "add", "mirror", "https://git.example.com/acme/vllm.git")
    sh(fork, "config", "acme.keep", "yes")
    return lock, fork


def _history(fork: Path) -> dict[str, str]:
    """What must never be rewritten: the fork's own commits, branches, remotes, config."""
    refs = sh(fork, "for-each-ref", "--format=%(refname) %(objectname)")
    return {"config": (fork / ".git/config").read_text(), "remotes": sh(fork, "remote", "-v"),
            "refs": refs, "own": "\n".join(sorted(sh(fork, "log", "--format=%H %s", "--grep=^fork:", "--all").splitlines()))}


def _intact(fork: Path, before: dict[str, str], moved: set[str] = frozenset()) -> None:
    now = _history(fork)
    assert now["config"] == before["config"] and now["remotes"] == before["remotes"]
    assert now["own"] == before["own"]
    old = dict(line.split(" ", 1) for line in before["refs"].splitlines())
    new = dict(line.split(" ", 1) for line in now["refs"].splitlines())
    for ref, oid in old.items():  # no ref deleted; only the branches named may move, forward
        assert ref in new, ref
        if ref in moved:
            assert sh(fork, "merge-base", "--is-ancestor", oid, new[ref]) == ""
        else:
            assert new[ref] == oid, ref


def _detached(fork: Path) -> bool:
    return subprocess.run(["git", "-C", str(fork), "symbolic-ref", "-q", "HEAD"], capture_output=True).returncode != 0


def _gitdir(fork: Path) -> Path:
    return Path(sh(fork, "rev-parse", "--absolute-git-dir"))


def _open_port_workspace(tmp_path: Path, upstream: Upstream, cli):  # type: ignore[no-untyped-def]
    """The fork's main branch has its own change of the line 0002 patches; the port to its HEAD
    conflicts there and opens its workspace in the fork's checkout itself."""
    lock, fork = _fork(tmp_path, upstream)
    (fork / "vllm/worker.py").write_text(WORKER.replace("return 0", "return 1  # acme"))
    sh(fork, "commit", "-qam", "fork: return 1")
    before = _history(fork)
    port = ("port", "--lock", lock, "--local", fork, "--cache-dir", tmp_path / "c", "--format", "json")
    res = cli(*port, "--workspace", fork)
    assert res.rc == 1, res.out + res.err
    return lock, fork, before, port, validate_json("port", res.out)


def test_fork_port_workspace_apply_3way_refresh_and_am_onto_its_second_branch(tmp_path, upstream, cli):
    lock, fork = _fork(tmp_path, upstream)
    cache = ("--cache-dir", tmp_path / "c")
    # The fork changed the line 0002 patches on its own main branch.
    (fork / "vllm/worker.py").write_text(WORKER.replace("return 0", "return 1  # acme"))
    sh(fork, "commit", "-qam", "fork: return 1")
    before = _history(fork)
    fork_head = sh(fork, "rev-parse", "HEAD")
    pin = f"fork-{fork_head[:12]}"
    lock_before = lock.read_text()

    # port --local: 0001 kept, 0002 conflicts; nothing is written.
    port = ("port", "--lock", lock, "--local", fork, *cache, "--format", "json")
    res = cli(*port)
    assert res.rc == 1, res.out + res.err
    assert {n: v["action"] for n, v in json.loads(res.out)["patches"].items()} == {
        "0001-envs.patch": "keep", "0002-worker.patch": "conflict"}
    assert lock.read_text() == lock_before
    _intact(fork, before)

    # port --workspace on the fork's own checkout: 0001 committed on the fork's HEAD (not on a
    # synthetic root commit), HEAD detached there, 0002 merged with markers; no branch moves.
    res = cli(*port, "--workspace", fork)
    assert res.rc == 1, res.out + res.err
    ws = validate_json("port", res.out)["workspace"]
    assert ws["own_checkout"] == {"base": fork_head, "branch": "refs/heads/main"}
    assert ws["conflicts"] == ["vllm/worker.py"] and ws["patch"] == "0002-worker.patch"
    assert ws["state"] == str(_gitdir(fork) / "dsv4patch-port.json") and Path(ws["state"]).is_file()
    assert _detached(fork) and sh(fork, "rev-parse", "HEAD") == ws["head"]
    assert sh(fork, "rev-parse", "HEAD~1") == fork_head
    assert sh(fork, "log", "-1", "--format=%s") == "envs: add A"
    assert (fork / "vllm/envs.py").read_text() == ENVS + "A = 1\n"
    text = (fork / "vllm/worker.py").read_text()
    assert "<<<<<<< target" in text and "return 1  # acme" in text and ">>>>>>> patch" in text
    _intact(fork, before)
    # A rerun with the markers still there names the file and changes nothing.
    res = cli(*port, "--workspace", fork)
    assert res.rc == 5 and "vllm/worker.py" in res.err and "conflict markers" in res.err, res.err
    assert _detached(fork) and lock.read_text() == lock_before
    _intact(fork, before)

    # Resolved and run again: 0002's resolution becomes the pin's variant, the port completes,
    # and the fork is back on main at its own commit, clean, with no state left.
    (fork / "vllm/worker.py").write_text(WORKER.replace("return 0", "return 2  # acme"))
    res = cli(*port, "--workspace", fork)
    assert res.rc == 0, res.out + res.err
    rep = validate_json("port", res.out)
    assert {n: v["action"] for n, v in rep["patches"].items()} == {
        "0001-envs.patch": "keep", "0002-worker.patch": "resolved"}
    detail = rep["patches"]["0002-worker.patch"]["detail"]
    assert detail == f"the resolution edited in --workspace {fork} (automatic 3-way merge conflicted (1 hunk(s)))"
    assert any("back where the port found it: on branch main" in n for n in rep["notes"]), rep["notes"]
    assert sh(fork, "symbolic-ref", "HEAD") == "refs/heads/main"
    assert sh(fork, "rev-parse", "HEAD") == fork_head and sh(fork, "status", "--porcelain") == ""
    assert not (_gitdir(fork) / "dsv4patch-port.json").exists()
    assert not (_gitdir(fork) / "dsv4patch-port").exists()
    variant = lock.parent.parent / f"patches/variants/{pin}/0002-worker.patch"
    assert "+    return 2  # acme" in variant.read_text() and "-    return 1  # acme" in variant.read_text()
    assert cli("check", "--lock", lock, "--pin", pin, *cache).rc == 0
    _intact(fork, before)

    # apply onto the fork itself, on a new branch: the series on top of the fork's commits.
    res = cli("apply", "--lock", lock, "--pin", pin, "--tree", fork, "--branch", "dsv4", "--no-build",
              *cache, "--format", "json")
    assert res.rc == 0, res.out + res.err
    assert sh(fork, "symbolic-ref", "HEAD") == "refs/heads/dsv4"
    assert sh(fork, "rev-parse", "HEAD~2") == fork_head
    assert "Dsv4patch-Patch: 0002-worker.patch" in sh(fork, "log", "-1", "--format=%B")
    assert (fork / "vllm/worker.py").read_text() == WORKER.replace("return 0", "return 2  # acme")
    _intact(fork, before)
    # Again: nothing to do; status and check see the fork's branch as patched.
    res = cli("apply", "--lock", lock, "--pin", pin, "--tree", fork, "--no-build", *cache, "--format", "json")
    assert res.rc == 0 and any("nothing to do" in n for n in json.loads(res.out)["notes"]), res.out
    res = cli("status", "--lock", lock, "--pin", pin, "--tree", fork, "--format", "json")
    assert res.rc == 0, res.out + res.err
    assert {v["state"] for v in json.loads(res.out)["patches"].values()} == {"applied"}

    # A conflict: the fork's main branch moves on with its own change of the patched line.
    sh(fork, "switch", "-q", "main")
    (fork / "vllm/worker.py").write_text(WORKER.replace("return 0", "return 3  # acme"))
    sh(fork, "commit", "-qam", "fork: return 3")
    before = _history(fork)
    res = cli("apply", "--lock", lock, "--pin", pin, "--tree", fork, "--3way", "--no-build", *cache,
              "--format", "json")
    assert res.rc == 1, res.out + res.err
    text = (fork / "vllm/worker.py").read_text()
    assert "<<<<<<<" in text
    (fork / "vllm/worker.py").write_text(WORKER.replace("return 0", "return 2  # acme, 3"))
    res = cli("resolve", "--continue", "--lock", lock, "--tree", fork, *cache, "--format", "json")
    assert res.rc == 0, res.out + res.err
    assert sh(fork, "symbolic-ref", "HEAD") == "refs/heads/main"
    main_base = sh(fork, "rev-parse", "HEAD~2")
    assert sh(fork, "log", "-1", "--format=%s", main_base) == "fork: return 3"
    _intact(fork, before, moved={"refs/heads/main"})

    # refresh on the fork's branch writes the patches (the pin's variants: --as-variant).
    sh(fork, "commit", "-q", "--amend", "-m", "worker: return 2 (acme)\n\nFix: 2\n\n"
       + "\n".join(line for line in sh(fork, "log", "-1", "--format=%B").splitlines()
                   if line.startswith("Dsv4patch-")))
    res = cli("refresh", "--lock", lock, "--pin", pin, "--tree", fork, "--as-variant", *cache,
              "--format", "json")
    assert res.rc == 0, res.out + res.err
    rep = json.loads(res.out)
    assert rep["patches"]["0002-worker.patch"]["action"] == "refreshed"
    worker_patch = Path(rep["patches"]["0002-worker.patch"]["file"])
    assert "worker: return 2 (acme)" in worker_patch.read_text()
    _intact(fork, before, moved={"refs/heads/main"})

    # The documented two lines: the refreshed patches onto the fork's second branch with git am.
    # (release first takes the fork's own `return 1`/`return 3` commits, which the refreshed 0002 is made on)
    sh(fork, "switch", "-q", "release")
    sh(fork, "merge", "-q", "--ff-only", main_base)
    sh(fork, "am", "-q", "--3way", str(lock.parent.parent / "patches/0001-envs.patch"), str(worker_patch))
    assert sh(fork, "rev-parse", "HEAD~2") == main_base
    assert sh(fork, "rev-parse", "HEAD^{tree}") == sh(fork, "rev-parse", "main^{tree}")
    assert (fork / "vllm/envs.py").read_text() == ENVS + "A = 1\n"
    assert "return 2  # acme, 3" in (fork / "vllm/worker.py").read_text()
    _intact(fork, before, moved={"refs/heads/main", "refs/heads/release"})

    # The other line: the commits as they are, cherry-picked onto a branch at the fork's commits.
    sh(fork, "switch", "-q", "-c", "release2", fork_head)
    sh(fork, "cherry-pick", f"{fork_head}..dsv4")
    assert sh(fork, "rev-parse", "HEAD^{tree}") == sh(fork, "rev-parse", "dsv4^{tree}")
    _intact(fork, before, moved={"refs/heads/main", "refs/heads/release"})


def test_fork_apply_refuses_an_existing_branch_and_a_checkout_not_on_the_pin(tmp_path, upstream, cli):
    lock, fork = _fork(tmp_path, upstream)
    cache = ("--cache-dir", tmp_path / "c")
    assert cli("port", "--lock", lock, "--local", fork, *cache).rc == 0
    pin = f"fork-{sh(fork, 'rev-parse', 'HEAD')[:12]}"
    before = _history(fork)
    res = cli("apply", "--lock", lock, "--pin", pin, "--tree", fork, "--branch", "release", "--no-build", *cache)
    assert res.rc == 5 and "branch release already exists" in res.err, res.err
    _intact(fork, before)
    assert sh(fork, "status", "--porcelain") == ""
    # A checkout that does not descend from the pin's commit is not a tree of the pin.
    sh(fork, "checkout", "-q", "--orphan", "elsewhere")
    sh(fork, "commit", "-qm", "fork: unrelated history")
    before = _history(fork)
    res = cli("apply", "--lock", lock, "--pin", "old", "--tree", fork, "--no-build", *cache)
    assert res.rc == 5 and "use a new directory for --tree" in res.err, res.err
    _intact(fork, before)


def test_port_abort_puts_the_forks_checkout_back_on_its_branch(tmp_path, upstream, cli):
    lock, fork, before, port, rep = _open_port_workspace(tmp_path, upstream, cli)
    head = rep["workspace"]["own_checkout"]["base"]
    (fork / "vllm/worker.py").write_text("half an edit\n")
    (fork / "scratch.txt").write_text("a file made while the workspace was open\n")
    lock_before = lock.read_text()
    res = cli("port", "--abort", "--workspace", fork, "--format", "json")
    assert res.rc == 0, res.out + res.err
    out = validate_json("port", res.out)
    assert out["aborted"] is True and out["head"] == head and out["to"] == f"fork-{head[:12]}"
    assert sh(fork, "symbolic-ref", "HEAD") == "refs/heads/main" and sh(fork, "rev-parse", "HEAD") == head
    assert sh(fork, "status", "--porcelain", "--untracked-files=all") == ""
    assert not (_gitdir(fork) / "dsv4patch-port.json").exists()
    assert lock.read_text() == lock_before
    _intact(fork, before)
    # Nothing left to abort; the same port opens the workspace again.
    res = cli("port", "--abort", "--workspace", fork)
    assert res.rc == 5 and "no port workspace" in res.err, res.err
    assert cli("port", "--abort").rc == 2
    assert cli(*port, "--workspace", fork).rc == 1 and _detached(fork)
    _intact(fork, before)


def test_port_workspace_on_the_fork_refuses_planted_state_and_other_checkouts(tmp_path, upstream, cli):
    """Refused (exit 5) before anything is touched: a link planted at the state's name, a checkout
    with uncommitted changes, a checkout that is not at the content of the pin ported to."""
    lock, fork = _fork(tmp_path, upstream)
    (fork / "vllm/worker.py").write_text(WORKER.replace("return 0", "return 1  # acme"))
    sh(fork, "commit", "-qam", "fork: return 1")
    cache = ("--cache-dir", tmp_path / "c")
    port = ("port", "--lock", lock, "--local", fork, "--workspace", fork, *cache)
    before = _history(fork)
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    state = _gitdir(fork) / "dsv4patch-port.json"
    os.symlink(outside, state)
    res = cli(*port)
    assert res.rc == 5 and "link" in res.err, res.err
    assert outside.read_text() == "{}" and state.is_symlink()
    state.unlink()
    _intact(fork, before)
    assert not _detached(fork) and sh(fork, "status", "--porcelain") == ""

    (fork / "vllm/envs.py").write_text("edited\n")
    res = cli(*port)
    assert res.rc == 5 and "uncommitted changes (vllm/envs.py)" in res.err, res.err
    sh(fork, "checkout", "--", "vllm/envs.py")
    _intact(fork, before)

    # A port to another pin (the upstream commit the fork descends from) does not get the
    # fork's checkout as its workspace: its branch is never reset to that pin's tree.
    res = cli("port", "--lock", lock, "--git", upstream.path, "--to", upstream.commit, "--name", "up2",
              "--workspace", fork, *cache)
    assert res.rc == 5 and "nothing was touched" in res.err, res.out + res.err
    _intact(fork, before)
    assert not _detached(fork) and sh(fork, "status", "--porcelain") == ""


# --- issue 35: a maintainer's real repository, their everyday flow -----------------------------

def _lived_in(tmp_path: Path, upstream: Upstream, hostile: bool = True):  # type: ignore[no-untyped-def]
    from forkfixture import make_fork, make_project

    fork = make_fork(tmp_path / "acme", upstream.path, upstream.commit, hostile=hostile)
    return fork, make_project(tmp_path, upstream, fork)


def test_everyday_flow_on_a_lived_in_fork(tmp_path, upstream, cli):
    """The issue's everyday flow on a fork with history, branches, a remote, a submodule, a linked
    worktree, a stash, ignored files and a hostile config: each step's exit code, and after each
    the fork's refs, config, reflog, stash and untracked/ignored files compared; nothing of its
    config runs."""
    fork, lock = _lived_in(tmp_path, upstream)
    cache = ("--cache-dir", tmp_path / "cold")  # the local pin is not in the cache yet
    # The pin was written from the docs' template at the fork's HEAD; the branch has moved on since.
    pinned = fork.git("rev-parse", "HEAD")
    (fork.path / "vllm" / "acme.py").write_text("ACME = 2\n")
    fork.git("commit", "-qam", "acme: bump")
    before = fork.snapshot()

    # 1. apply onto the fork's checkout on a new branch (exit 5 before: "is at ..., the lock pins ...").
    res = cli("apply", "--lock", lock, "--pin", "acme", "--tree", fork.path, "--branch", "dsv4", "--no-build",
              *cache, "--format", "json")
    assert res.rc == 0, res.out + res.err
    now = fork.assert_kept(before, created=frozenset({"refs/heads/dsv4"}), head=True)
    assert fork.git("symbolic-ref", "HEAD") == "refs/heads/dsv4"
    assert fork.git("log", "--format=%s", "-4").splitlines() == [
        "new: a module, and return 3", "worker: return 2", "envs: add A", "acme: bump"]
    assert fork.git("merge-base", "--is-ancestor", pinned, "HEAD") == ""

    # 2. status agrees.
    res = cli("status", "--lock", lock, "--pin", "acme", "--tree", fork.path, "--format", "json")
    assert res.rc == 0, res.out + res.err
    assert {v["state"] for v in json.loads(res.out)["patches"].values()} == {"applied"}
    # The fork's history before the pin's commit is the fork's: only what came after is listed.
    assert [f["subject"] for f in json.loads(res.out)["foreign_commits"]] == ["acme: bump"]
    now = fork.assert_kept(now)

    # 3. The maintainer commits on top of the series: apply agrees with status (exit 5 before).
    (fork.path / "vllm" / "acme.py").write_text("ACME = 3\n")
    fork.git("commit", "-qam", "acme: on top of the series")
    now = fork.snapshot()
    res = cli("apply", "--lock", lock, "--pin", "acme", "--tree", fork.path, "--no-build", *cache, "--format", "json")
    assert res.rc == 0 and any("1 commit(s) of yours above them" in n for n in json.loads(res.out)["notes"]), res
    now = fork.assert_kept(now)
    assert cli("status", "--lock", lock, "--pin", "acme", "--tree", fork.path).rc == 0

    # 4. refresh --as-variant: the maintainer's commit becomes a patch of pin acme's own series, never
    # of the series pin up shares (before: appended to it, and `check --pin up` failed from then on).
    patches = lock.parent.parent / "patches"  # the series and variants, laid out as the repository's
    shared = (patches / "main.series").read_text()
    res = cli("refresh", "--lock", lock, "--pin", "acme", "--tree", fork.path, "--as-variant", *cache,
              "--format", "json")
    assert res.rc == 0, res.out + res.err
    rep = json.loads(res.out)
    new = patches / "variants/acme/0004-acme-on-top-of-the-series.patch"
    assert rep["patches"]["0004-acme-on-top-of-the-series.patch"] == {"action": "new", "file": str(new)}
    assert any("own series 'acme'" in n and "up" in n for n in rep["notes"]), rep["notes"]
    assert (patches / "main.series").read_text() == shared
    assert (patches / "variants/acme/series").read_text().splitlines()[-1] == new.name
    assert 'series = ["main", "acme"]' in lock.read_text() and "default = false" in lock.read_text()
    assert "+ACME = 3" in new.read_text() and "Subject: [PATCH 1/1] acme: on top of the series" in new.read_text()
    assert cli("check", "--lock", lock, "--pin", "up", *cache).rc == 0
    now = fork.assert_kept(now)
    # Refreshed again: nothing changes (its own series now ends the pin's list).
    res = cli("refresh", "--lock", lock, "--pin", "acme", "--tree", fork.path, "--as-variant", *cache,
              "--format", "json")
    assert res.rc == 0, res.out
    assert json.loads(res.out)["patches"].get("0004-acme-on-top-of-the-series.patch", {}).get("action") \
        == "unchanged", res.out
    now = fork.assert_kept(now)
    # The refreshed series ends with the maintainer's own commit, which HEAD is: apply agrees with status, the
    # series' commits below and 0004 by content (exit 5 before: "neither pin acme's base commit nor ...").
    assert cli("status", "--lock", lock, "--pin", "acme", "--tree", fork.path).rc == 0
    res = cli("apply", "--lock", lock, "--pin", "acme", "--tree", fork.path, "--no-build", *cache, "--format", "json")
    assert res.rc == 0, res.out + res.err
    assert any("0004-acme-on-top-of-the-series.patch (found by content); nothing to do" in n
               for n in json.loads(res.out)["notes"]), res.out
    now = fork.assert_kept(now)

    # 5. port --local of the fork that carries the series as dsv4patch committed it: recognised by its
    # trailers and its content, every patch dropped (before: 0002 reported as a false conflict).
    res = cli("port", "--lock", lock, "--from", "up", "--local", fork.path, "--name", "acme-dsv4", *cache,
              "--format", "json")
    assert res.rc == 0, res.out + res.err
    rep = json.loads(res.out)
    assert {n: v["action"] for n, v in rep["patches"].items()} == {
        "0001-envs.patch": "drop", "0002-worker.patch": "drop", "0003-new.patch": "drop"}
    for v in rep["patches"].values():
        assert v["detail"].startswith("committed by dsv4patch in ") and "is the series' patch" in v["detail"]
        assert v["evidence"]["committed_by_dsv4patch"]
    assert set(rep["check"].values()) == {"already-applied"}
    assert cli("check", "--lock", lock, "--pin", "acme-dsv4", *cache).rc == 0
    res = cli("apply", "--lock", lock, "--pin", "acme-dsv4", "--tree", fork.path, "--no-build", *cache)
    assert res.rc == 0 and "nothing to do" in res.out, res
    now = fork.assert_kept(now)

    # 6. The maintainer reverts the commit pin acme's series now ends with: apply and status both say 0004 is
    # missing (exit 1), nothing is touched.
    fork.git("revert", "--no-edit", "HEAD")
    now = fork.snapshot()
    res = cli("apply", "--lock", lock, "--pin", "acme", "--tree", fork.path, "--no-build", *cache)
    assert res.rc == 1 and "which do not carry 0004-acme-on-top-of-the-series.patch; nothing was changed" \
        in res.out + res.err, res
    assert cli("status", "--lock", lock, "--pin", "acme", "--tree", fork.path).rc == 1
    fork.assert_kept(now)
    assert fork.ran() == []


def test_refresh_writes_the_same_bytes_whatever_the_forks_config(tmp_path, upstream, cli):
    """issue 35: format.signOff/headers/subjectPrefix, diff.noprefix/mnemonicPrefix, user.email,
    colour, no committer identity (exit 70 before): the refreshed patches are the same bytes."""
    import shutil

    from forkfixture import make_hostile

    fork, lock = _lived_in(tmp_path, upstream, hostile=False)
    proj = lock.parent.parent
    cache = ("--cache-dir", tmp_path / "c")
    assert cli("apply", "--lock", lock, "--pin", "acme", "--tree", fork.path, "--branch", "dsv4", "--no-build",
               *cache).rc == 0
    fork.git("commit", "-q", "--amend", "-m", "worker: return 3, and a module\n\nFix: 3\n\n" + "\n".join(
        line for line in fork.git("log", "-1", "--format=%B").splitlines() if line.startswith("Dsv4patch-")))
    (fork.path / "vllm" / "acme.py").write_text("ACME = 4\n")
    fork.git("commit", "-qam", "acme: a patch of ours")
    twin = tmp_path / "proj-twin"
    shutil.copytree(proj, twin)
    res = cli("refresh", "--lock", lock, "--pin", "acme", "--tree", fork.path, "--as-variant", *cache,
              "--format", "json")
    assert res.rc == 0, res.out + res.err
    plain = {n: Path(v["file"]).read_bytes() for n, v in json.loads(res.out)["patches"].items()}
    make_hostile(fork)
    res = cli("refresh", "--lock", twin / "locks/vllm.toml", "--pin", "acme", "--tree", fork.path, "--as-variant",
              *cache, "--format", "json")
    assert res.rc == 0, res.out + res.err
    hostile = {n: Path(v["file"]).read_bytes() for n, v in json.loads(res.out)["patches"].items()}
    assert hostile == plain and fork.ran() == []
    text = plain["0003-new.patch"].decode()
    assert "Subject: [PATCH 3/3] worker: return 3, and a module" in text and "--- a/vllm/worker.py" in text
    assert "Signed-off-by" not in text and "X-Acme" not in text and "ACME" not in text.split("\n", 5)[3]


def test_refresh_puts_the_pins_own_series_after_its_kin_not_under_the_next_tables_comment(tmp_path):
    """`refresh --as-variant` added `[series.acme]` between the comment that introduces the lock's
    `[toolchains...]` and that table (tomlkit keeps a table's leading comment in the table before it), so the
    comment described the wrong table; now the new series follows the last one and the comment stays with
    its table."""
    import shutil

    from conftest import ROOT
    from dsv4patch.forks import refreshing
    from dsv4patch.pins.lock import load

    shutil.copytree(ROOT / "locks", tmp_path / "locks")
    lock_path = tmp_path / "locks" / "vllm.toml"
    before = lock_path.read_text()
    refreshing._add_own_series(lock_path, load(lock_path).pin("0.27.1"), "acme",
                               tmp_path / "patches/variants/acme/series")
    text = lock_path.read_text()
    new = text.index('[series.acme]\npath = "../patches/variants/acme/series"')
    comment = text.index("# The kernel build toolchain")
    assert text.index("[series.extra]") < new < comment < text.index('[toolchains."torch2.13.0-cu13"]'), text[:3000]
    assert text[:new].rstrip() == before[:before.index("# The kernel")].rstrip()  # nothing above it moved
    assert "acme" in load(lock_path).series


def test_status_does_not_list_a_commit_refresh_made_a_patch_as_foreign(tmp_path, upstream, cli):
    """After `refresh --as-variant` folded the maintainer's commit into the pin's own series, status
    reports that commit as the series' patch (found by content) and no longer also as a foreign
    commit (before: listed both ways); a commit of yours that is no patch stays foreign."""
    fork, lock = _lived_in(tmp_path, upstream, hostile=False)
    cache = ("--cache-dir", tmp_path / "cold")
    (fork.path / "vllm" / "acme.py").write_text("ACME = 2\n")
    fork.git("commit", "-qam", "acme: bump")  # below the series: the fork's own, foreign
    assert cli("apply", "--lock", lock, "--pin", "acme", "--tree", fork.path, "--branch", "dsv4", "--no-build",
               *cache).rc == 0
    (fork.path / "vllm" / "acme.py").write_text("ACME = 3\n")
    fork.git("commit", "-qam", "acme: on top of the series")
    mine = fork.git("rev-parse", "HEAD")
    res = cli("refresh", "--lock", lock, "--pin", "acme", "--tree", fork.path, "--as-variant", *cache)
    assert res.rc == 0, res.out + res.err
    res = cli("status", "--lock", lock, "--pin", "acme", "--tree", fork.path, "--format", "json")
    assert res.rc == 0, res.out + res.err
    st = validate_json("status", res.out)
    assert [f["subject"] for f in st["foreign_commits"]] == ["acme: bump"]
    assert st["patches"]["0004-acme-on-top-of-the-series.patch"]["state"] == "applied"
    assert mine[:12] in st["patches"]["0004-acme-on-top-of-the-series.patch"]["note"]
    assert not any(mine[:12] in n for n in st["notes"] if "not made by dsv4patch" in n), st["notes"]
