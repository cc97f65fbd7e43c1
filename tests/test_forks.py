"""A fork maintainer's own checkout as the tree (issue 28): port --local, apply onto the fork's
branch, a conflict through apply --3way / resolve --continue, refresh, and `git am` of the
refreshed patches onto the fork's second branch; at every step the fork's own history
(commits, branches, remote, config) is intact. Real git throughout (conftest's upstream)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import MINI_FILES, Upstream, git_pin, sh, write_lock

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
                      {"main": ["../patches/0001-envs.patch", "../patches/0002-worker.patch"]})
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


def test_fork_port_apply_3way_refresh_and_am_onto_its_second_branch(tmp_path, upstream, cli):
    lock, fork = _fork(tmp_path, upstream)
    cache = ("--cache-dir", tmp_path / "c")
    before = _history(fork)
    fork_head = sh(fork, "rev-parse", "HEAD")

    # port --local: a pin of the fork's HEAD, every patch kept.
    res = cli("port", "--lock", lock, "--local", fork, *cache, "--format", "json")
    assert res.rc == 0, res.out + res.err
    pin = f"fork-{fork_head[:12]}"
    assert {v["action"] for v in json.loads(res.out)["patches"].values()} == {"keep"}
    _intact(fork, before)

    # apply onto the fork itself, on a new branch: the series on top of the fork's commits.
    res = cli("apply", "--lock", lock, "--pin", pin, "--tree", fork, "--branch", "dsv4", "--no-build",
              *cache, "--format", "json")
    assert res.rc == 0, res.out + res.err
    assert sh(fork, "symbolic-ref", "HEAD") == "refs/heads/dsv4"
    assert sh(fork, "rev-parse", "HEAD~2") == fork_head
    assert "Dsv4patch-Patch: 0002-worker.patch" in sh(fork, "log", "-1", "--format=%B")
    assert (fork / "vllm/worker.py").read_text() == WORKER.replace("return 0", "return 2")
    _intact(fork, before)
    # Again: nothing to do; status and check see the fork's branch as patched.
    res = cli("apply", "--lock", lock, "--pin", pin, "--tree", fork, "--no-build", *cache, "--format", "json")
    assert res.rc == 0 and any("nothing to do" in n for n in json.loads(res.out)["notes"]), res.out
    res = cli("status", "--lock", lock, "--pin", pin, "--tree", fork, "--format", "json")
    assert res.rc == 0, res.out + res.err
    assert {v["state"] for v in json.loads(res.out)["patches"].values()} == {"applied"}

    # A conflict: the fork's main branch moves on with its own change of the patched line.
    sh(fork, "switch", "-q", "main")
    (fork / "vllm/worker.py").write_text(WORKER.replace("return 0", "return 1  # acme"))
    sh(fork, "commit", "-qam", "fork: return 1")
    before = _history(fork)
    res = cli("apply", "--lock", lock, "--pin", pin, "--tree", fork, "--3way", "--no-build", *cache,
              "--format", "json")
    assert res.rc == 1, res.out + res.err
    text = (fork / "vllm/worker.py").read_text()
    assert "<<<<<<<" in text
    (fork / "vllm/worker.py").write_text(WORKER.replace("return 0", "return 2  # acme"))
    res = cli("resolve", "--continue", "--lock", lock, "--tree", fork, *cache, "--format", "json")
    assert res.rc == 0, res.out + res.err
    assert sh(fork, "symbolic-ref", "HEAD") == "refs/heads/main"
    main_base = sh(fork, "rev-parse", "HEAD~2")
    assert sh(fork, "log", "-1", "--format=%s", main_base) == "fork: return 1"
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
    # (release first takes the fork's own `return 1` commit, which the refreshed 0002 is made on)
    sh(fork, "switch", "-q", "release")
    sh(fork, "merge", "-q", "--ff-only", main_base)
    sh(fork, "am", "-q", "--3way", str(lock.parent.parent / "patches/0001-envs.patch"), str(worker_patch))
    assert sh(fork, "rev-parse", "HEAD~2") == main_base
    assert sh(fork, "rev-parse", "HEAD^{tree}") == sh(fork, "rev-parse", "main^{tree}")
    assert (fork / "vllm/envs.py").read_text() == ENVS + "A = 1\n"
    assert "return 2  # acme" in (fork / "vllm/worker.py").read_text()
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


def test_port_workspace_on_the_fork_itself_is_refused_untouched(tmp_path, upstream, cli):
    """A port conflict's workspace is a directory of its own: pointed at the fork's checkout, it
    is refused (exit 5) and the fork's branch is never reset to the new pin's tree."""
    lock, fork = _fork(tmp_path, upstream)
    (fork / "vllm/worker.py").write_text(WORKER.replace("return 0", "return 1  # acme"))
    sh(fork, "commit", "-qam", "fork: return 1")
    before = _history(fork)
    res = cli("port", "--lock", lock, "--local", fork, "--workspace", fork, "--cache-dir", tmp_path / "c")
    assert res.rc == 5 and "use a new directory" in res.err, res.out + res.err
    _intact(fork, before)
    assert sh(fork, "status", "--porcelain") == ""
