"""dsv4patch.git's typed records, read from a real repository; the guard it keeps on work trees;
format-patch bytes that a repository's config cannot change; branch names."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import sh
from dsv4patch import git, guard
from dsv4patch.errors import MissingObjectError


@pytest.fixture(autouse=True)
def _held(tmp_path: Path) -> Iterator[None]:
    """The repositories of these tests are work trees: git runs in them only while held."""
    with guard.owned(tmp_path / "r"):
        yield


def _repo(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "r"
    repo.mkdir()
    sh(repo, "init", "-q")
    (repo / "a.txt").write_text("one\ntwo\n")
    (repo / "bin").mkdir()
    (repo / "bin" / "run").write_text("#!/bin/sh\n")
    (repo / "bin" / "run").chmod(0o755)
    (repo / "link").symlink_to("a.txt")
    sh(repo, "add", "-A")
    sh(repo, "commit", "-qm",
       "Subject\n\nBody.\n\nFix: the thing\nFix: another\nOrigin: local")
    return repo, sh(repo, "rev-parse", "HEAD")


def test_tree_entries(tmp_path: Path) -> None:
    repo, head = _repo(tmp_path)
    entry = git.ls_tree_entry(repo, head, "a.txt")
    assert entry == git.TreeEntry("100644", "blob", sh(repo, "rev-parse", f"{head}:a.txt"))
    assert entry.is_blob and git.cat_blob(repo, entry.oid) == b"one\ntwo\n"
    assert git.ls_tree_entry(repo, head, "bin") == git.TreeEntry("040000", "tree",
                                                                 sh(repo, "rev-parse", f"{head}:bin"))
    assert git.ls_tree_entry(repo, head, "nope") is None
    files = git.tree_files(repo, head)
    assert sorted(files) == ["a.txt", "bin/run", "link"]
    assert (files["bin/run"].mode, files["link"].mode) == ("100755", "120000")


def test_tree_entries_and_blobs_in_one_call_each_take_names_literally(tmp_path: Path) -> None:
    """tree_entries and cat_blobs (the patched tree's reader: two git calls for every path) answer
    what ls_tree_entry and cat_blob answer one path at a time; a name that looks like a pattern or
    pathspec magic names only itself; a missing path is absent; a missing object is an error."""
    repo, _ = _repo(tmp_path)
    odd = ["a*", ":(glob)**", "sp ace/x [1].txt", "d\u00e9j\u00e0.py", "new\nline"]
    for name in odd:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(name.encode() * 3)
    (repo / "a-decoy").write_text("not asked for\n")
    sh(repo, "add", "-A")
    sh(repo, "commit", "-qm", "odd names")
    head = sh(repo, "rev-parse", "HEAD")
    asked = ["a.txt", "bin/run", "link", "bin", "nope", "bin/nope", *odd]
    got = git.tree_entries(repo, head, asked)
    plain = [p for p in asked if not p.startswith(":(")]  # ls_tree_entry reads pathspec magic as magic
    want = {p: e for p in plain if (e := git.ls_tree_entry(repo, head, p)) is not None}
    assert {p: e for p, e in got.items() if p in plain} == want
    assert got[":(glob)**"].oid == sh(repo, "rev-parse", f"{head}:./:(glob)**")
    assert set(got) == {"a.txt", "bin/run", "link", "bin", *odd}
    assert got["bin"].type == "tree" and got["link"].mode == "120000"
    blobs = git.cat_blobs(repo, [got[p].oid for p in ("a.txt", "link", *odd, "a.txt")])
    for p in ("a.txt", "link", *odd):
        assert blobs[got[p].oid] == git.cat_blob(repo, got[p].oid)
    assert blobs[got["a.txt"].oid] == b"one\ntwo\n" and blobs[got["link"].oid] == b"a.txt"
    assert git.tree_entries(repo, head, []) == {} and git.cat_blobs(repo, []) == {}
    with pytest.raises(MissingObjectError, match=f"lacks an object .*{'0' * 40} missing"):  # a work tree's: exit 5
        git.cat_blobs(repo, [got["a.txt"].oid, "0" * 40])
    with pytest.raises(git.GitError, match="is not a blob"):
        git.cat_blobs(repo, [got["bin"].oid])


def test_commit_info_and_trailers(tmp_path: Path) -> None:
    repo, head = _repo(tmp_path)
    info = git.commit_info(repo, head)
    assert info.message.startswith("Subject\n\nBody.") and info.message.endswith("Origin: local\n")
    assert info.author == {"GIT_AUTHOR_NAME": sh(repo, "log", "-1", "--format=%an"),
                           "GIT_AUTHOR_EMAIL": sh(repo, "log", "-1", "--format=%ae"),
                           "GIT_AUTHOR_DATE": sh(repo, "log", "-1", "--format=%aI")}
    assert info.tree == sh(repo, "rev-parse", f"{head}^{{tree}}")
    [only] = git.log_trailers(repo, "HEAD")
    assert only == git.CommitTrailers(head, {"Fix": ["the thing", "another"], "Origin": ["local"]})


def test_merge_file(tmp_path: Path) -> None:
    repo, _head = _repo(tmp_path)
    clean = git.merge_file(repo, b"a\nb\nc\n", b"a\nb\nc\n", b"a\nB\nc\n")
    assert clean == git.Merge(True, b"a\nB\nc\n")
    conflict = git.merge_file(repo, b"a\nX\nc\n", b"a\nb\nc\n", b"a\nY\nc\n")
    assert not conflict.clean and b"<<<<<<< target" in conflict.text and b">>>>>>> patch" in conflict.text


def test_work_tree_state(tmp_path: Path) -> None:
    repo, head = _repo(tmp_path)
    assert git.current_ref(repo) is not None and git.current_ref(repo).startswith("refs/heads/")
    assert git.index_is(repo, head)
    (repo / "a.txt").write_text("changed\n")
    (repo / "new.txt").write_text("n\n")
    assert sorted(git.status_paths(repo)) == ["a.txt", "new.txt"]
    assert git.hash_paths(repo, ["a.txt"]) == [sh(repo, "hash-object", "a.txt")]
    sh(repo, "add", "a.txt")
    assert not git.index_is(repo, head) and git.staged_names(repo, head) == ["a.txt"]
    sh(repo, "checkout", "-q", "--detach")
    assert git.current_ref(repo) is None


def test_git_refuses_a_work_tree_nobody_vetted(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    sh(other, "init", "-q")
    with pytest.raises(git.UnguardedCheckout, match="not\n?.*vetted"):
        git.head(other)
    with guard.guarded(other) as co:
        assert git.head(other) is None and co.gitdir == other / ".git"
    with pytest.raises(git.UnguardedCheckout):
        git.dirty_paths(other)


HOSTILE_FORMAT = """[format]
\tsignOff = true
\theaders = "X-Fork: acme"
\tsubjectPrefix = FORK
\tnumbered = true
\tcoverLetter = true
\tthread = shallow
\tsignature = acme
\tfrom = true
[diff]
\tnoprefix = true
\tmnemonicPrefix = true
\tcontext = 9
\talgorithm = patience
\texternal = /bin/false
[core]
\tabbrev = 20
[color]
\tui = always
\tdiff = always
[user]
\temail = fork@example.com
\tname = Fork Maintainer
[i18n]
\tcommitEncoding = ISO-8859-1
\tlogOutputEncoding = ISO-8859-1
"""


def test_format_patch_is_the_same_bytes_whatever_the_repositorys_config(tmp_path: Path) -> None:
    """issue 35: a maintainer's format.*, diff.*, core.abbrev, colour and identity never reach a patch."""
    repo, head = _repo(tmp_path)
    (repo / "a.txt").write_text("one\nTWO\n")
    sh(repo, "commit", "-qam", "change a\n\nFix: it")
    commit = sh(repo, "rev-parse", "HEAD")
    plain = git.format_patch(repo, commit, 2, 7)
    with open(repo / ".git" / "config", "a") as fh:
        fh.write(HOSTILE_FORMAT)
    # No committer identity anywhere (format.signOff needed one: exit 70 before).
    assert git.format_patch(repo, commit, 2, 7) == plain
    assert plain.startswith(f"From {commit} Mon Sep 17 00:00:00 2001\n")
    assert "Subject: [PATCH 2/7] change a\n" in plain and "--- a/a.txt\n+++ b/a.txt\n" in plain
    assert "Signed-off-by" not in plain and "X-Fork" not in plain and "\x1b[" not in plain
    index = next(line for line in plain.splitlines() if line.startswith("index "))
    assert [len(x) for x in index.split()[1].split("..")] == [7, 7]


@pytest.mark.parametrize("name, ok", [
    ("dsv4", True), ("acme/dsv4-0.27.1", True), ("@{-1}", False), ("@", False), ("HEAD", False),
    ("-f", False), ("a..b", False), ("a b", False), ("a~1", False), ("x.lock", False), ("", False),
    ("new\nline", False), ("a@{u}", False),
])
def test_branch_names(name: str, ok: bool) -> None:
    assert git.valid_branch_name(name) is ok


def test_a_git_call_that_blocks_ends_at_its_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A FIFO planted where git opens a file after the guard looked (here: the work tree's .gitignore, which
    `git status` opens) blocks git on open: the call ends at DSV4PATCH_GIT_TIMEOUT as a ChildError (exit 8)
    naming git's verb and the directory, and no git is left behind."""
    import os
    import time

    from dsv4patch.errors import EXIT_CHILD, ChildError

    repo, _head = _repo(tmp_path)
    os.mkfifo(repo / ".gitignore")
    from dsv4patch import settings

    start = time.monotonic()
    with settings.in_effect(settings.Settings.from_environ({"DSV4PATCH_GIT_TIMEOUT": "2"})), \
            pytest.raises(ChildError) as err:
        git.dirty_paths(repo)
    assert time.monotonic() - start < 30
    assert err.value.exit_code == EXIT_CHILD
    assert "git status" in str(err.value) and str(repo) in str(err.value) and "DSV4PATCH_GIT_TIMEOUT" in str(err.value)
    from dsv4patch.errors import ParameterError

    with pytest.raises(ParameterError, match="DSV4PATCH_GIT_TIMEOUT='inf'"):
        settings.Settings.from_environ({"DSV4PATCH_GIT_TIMEOUT": "inf"})


def test_holds_of_one_checkout_may_end_in_any_order(tmp_path):
    """check's threads hold one checkout at once (two local pins of one fork); the first hold to end took the
    tree from under the other (it restored what it found: nothing), whose next git call was refused as
    unguarded (exit 70). The tree stays held until the last hold ends."""
    repo = tmp_path / "mine"  # not this module's held "r"
    repo.mkdir()
    sh(repo, "init", "-q")
    first, second = git.guarding(repo, repo / ".git"), git.guarding(repo, repo / ".git")
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # not the last in, yet the first out (another thread's)
    assert git.out(repo, "rev-parse", "--is-inside-work-tree").strip() == "true"
    second.__exit__(None, None, None)
    with pytest.raises(git.UnguardedCheckout):
        git.out(repo, "rev-parse", "--is-inside-work-tree")


def test_a_lazy_fetch_runs_no_command_of_the_repositorys_and_a_missing_object_is_exit_5(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hostile probe D1, behind the guard (which refuses a partial clone): were one ever held unvetted, git's
    fetch of an object it lacks ran the repository's `core.sshCommand`.  git now runs plain `ssh` from PATH
    for it (what dsv4patch's own ssh fetches run, which still work), git >= 2.44 fetches nothing
    (GIT_NO_LAZY_FETCH), and the object that stays missing is the checkout's to mend (exit 5), not 70."""
    import os

    from dsv4patch.errors import EXIT_TREE

    repo, head = _repo(tmp_path)
    ran = tmp_path / "RAN"
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name in ("ssh", "repo-ssh"):
        (bin_ / name).write_text(f"#!/bin/sh\necho \"{name} $*\" >> '{ran}'\nexit 1\n")
        (bin_ / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    oid = sh(repo, "rev-parse", "HEAD:a.txt")
    (repo / ".git" / "objects" / oid[:2] / oid[2:]).unlink()
    for key, value in (("core.repositoryformatversion", "1"), ("extensions.partialClone", "acme"),
                       ("remote.acme.promisor", "true"), ("remote.acme.url", "ssh://example.invalid/acme.git"),
                       ("core.sshCommand", str(bin_ / "repo-ssh"))):
        sh(repo, "config", key, value)
    with pytest.raises(MissingObjectError) as err:
        git.cat_blob(repo, oid)
    assert err.value.exit_code == EXIT_TREE and oid in str(err.value) and f"git -C {repo} fsck" in str(err.value)
    lines = ran.read_text().splitlines() if ran.exists() else []
    assert not any(line.startswith("repo-ssh") for line in lines), lines
    # dsv4patch's own fetch over ssh (a `git` pin's URL, into the cache's bare repository) runs PATH's ssh.
    bare = tmp_path / "cache.git"
    git.run(tmp_path, ["init", "-q", "--bare", str(bare)], repo=False)
    ran.unlink(missing_ok=True)
    assert not git.fetch_commit(bare, "ssh://example.invalid/vllm.git", head).ok
    lines = ran.read_text().splitlines()
    assert lines and lines[0].startswith("ssh ") and "example.invalid" in lines[0] and "git-upload-pack" in lines[0]
