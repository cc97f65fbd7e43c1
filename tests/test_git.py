"""dsv4patch.git's typed records, read from a real repository."""

from __future__ import annotations

from pathlib import Path

from conftest import sh
from dsv4patch import git


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
