"""dsv4patch.checkout.transaction on a real git tree: the journaled move, recovery, the tree lock.

tests/test_recovery.py kills real ``apply`` runs at each step; these call the
module directly with the states such a kill leaves.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import sh
from dsv4patch import git
from dsv4patch.checkout import states, transaction
from dsv4patch.checkout.states import ApplyJournal
from dsv4patch.errors import TreeError


def _tree(tmp_path: Path) -> tuple[Path, str, str]:
    """A tree at commit ``one``; ``two`` (a child changing a.txt, adding b.txt) exists as an object."""
    tree = tmp_path / "t"
    tree.mkdir()
    sh(tree, "init", "-q")
    (tree / "a.txt").write_text("one\n")
    sh(tree, "add", "a.txt")
    sh(tree, "commit", "-qm", "one")
    one = sh(tree, "rev-parse", "HEAD")
    (tree / "a.txt").write_text("two\n")
    (tree / "b.txt").write_text("new\n")
    sh(tree, "add", "-A")
    sh(tree, "commit", "-qm", "two")
    two = sh(tree, "rev-parse", "HEAD")
    sh(tree, "reset", "-q", "--hard", one)
    return tree, one, two


def test_move_tree_moves_head_index_and_files_and_leaves_no_journal(tmp_path: Path) -> None:
    tree, one, two = _tree(tmp_path)
    with transaction.exclusive_checkout(tree) as co:
        transaction.move_tree(co, one, two)
        assert git.head(tree) == two and git.index_is(tree, two)
        assert (tree / "a.txt").read_text() == "two\n" and (tree / "b.txt").read_text() == "new\n"
        assert not transaction.interrupted(co.gitdir) and git.status_paths(tree) == []
        assert transaction.recover(co) is None


@pytest.mark.parametrize("how", ["ignored", "untracked-dir", "file-above"])
def test_move_tree_never_overwrites_a_file_the_user_did_not_commit(tmp_path: Path, how: str) -> None:
    """issue 35: an ignored (or untracked) file where the move writes is refused by name, untouched."""
    tree, one, two = _tree(tmp_path)
    if how == "ignored":
        (tree / ".git" / "info" / "exclude").write_text("b.txt\n")
        (tree / "b.txt").write_text("mine\n")
        named, victim = "b.txt (ignored)", tree / "b.txt"
    elif how == "untracked-dir":
        (tree / ".git" / "info" / "exclude").write_text("b.txt/\n")
        (tree / "b.txt").mkdir()
        (tree / "b.txt" / "keep").write_text("mine\n")
        named, victim = "b.txt (ignored)", tree / "b.txt" / "keep"
    else:  # the move writes c/d; the user's ignored file c stands where git needs a directory
        work = tmp_path / "w"
        sh(tmp_path, "clone", "-q", str(tree), str(work))
        (work / "c").mkdir()
        (work / "c" / "d").write_text("d\n")
        sh(work, "add", "-A")
        sh(work, "commit", "-qm", "c/d")
        sh(tree, "fetch", "-q", str(work), "HEAD")
        two = sh(tree, "rev-parse", "FETCH_HEAD")
        (tree / ".git" / "info" / "exclude").write_text("c\n")
        (tree / "c").write_text("mine\n")
        named, victim = "c (ignored)", tree / "c"
    before = victim.read_text()
    with transaction.exclusive_checkout(tree) as co:
        with pytest.raises(TreeError, match=re.escape(f"the apply would overwrite files you have not committed: {named}.")):
            transaction.move_tree(co, one, two)
        assert not transaction.interrupted(co.gitdir)
    assert victim.read_text() == before and sh(tree, "rev-parse", "HEAD") == one


def test_recover_finishes_a_move_killed_before_the_work_tree_moved(tmp_path: Path) -> None:
    tree, one, two = _tree(tmp_path)
    with transaction.exclusive_checkout(tree) as co:
        gitdir = co.gitdir
        states.write(gitdir / transaction.JOURNAL, ApplyJournal(frm=one, to=two, ref=git.current_ref(tree)))
        (gitdir / "index.lock").write_text("")  # what a killed git leaves; no process has it open
        note = transaction.recover(co)
        assert note is not None and note.startswith(f"finished an interrupted apply: {one[:12]} -> {two[:12]}")
        assert "index.lock" in note and not (gitdir / "index.lock").exists()
        assert git.head(tree) == two and (tree / "b.txt").is_file() and not transaction.interrupted(gitdir)


def test_recover_touches_nothing_when_the_user_changed_the_tree(tmp_path: Path) -> None:
    tree, one, two = _tree(tmp_path)
    with transaction.exclusive_checkout(tree) as co:
        gitdir = co.gitdir
        states.write(gitdir / transaction.JOURNAL, ApplyJournal(frm=one, to=two, ref=git.current_ref(tree)))
        (tree / "a.txt").write_text("my edit\n")
        (tree / "mine.txt").write_text("x\n")
        with pytest.raises(TreeError, match=r"files the apply moves were edited: a\.txt.*not touch.*mine\.txt"):
            transaction.recover(co)
        assert (tree / "a.txt").read_text() == "my edit\n" and git.head(tree) == one
        assert transaction.interrupted(gitdir)


def test_an_unreadable_journal_is_refused(tmp_path: Path) -> None:
    tree, one, _two = _tree(tmp_path)
    with transaction.exclusive_checkout(tree) as co:
        (co.gitdir / transaction.JOURNAL).write_text(json.dumps({"from": one, "to": "HEAD"}))
        with pytest.raises(TreeError, match="journal of an interrupted apply.*unreadable"):
            transaction.recover(co)
        assert git.head(tree) == one


def test_exclusive_checkout_refuses_a_planted_link(tmp_path: Path) -> None:
    tree, _one, _two = _tree(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tree / ".git" / transaction.TREE_LOCK).symlink_to(victim)
    with pytest.raises(TreeError, match="symbolic link"), transaction.exclusive_checkout(tree):
        pass
    assert victim.read_text() == "keep"


def test_a_directory_that_is_not_a_repository_root_is_refused(tmp_path: Path) -> None:
    tree, _one, _two = _tree(tmp_path)
    (tree / "sub").mkdir()
    with pytest.raises(TreeError, match="is not the root of a git checkout"), transaction.exclusive_checkout(tree / "sub"):
        pass
