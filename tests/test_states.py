"""The state files in a tree's git directory are read only as what dsv4patch writes (dsv4patch.checkout.states)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import sh
from dsv4patch.checkout import states, transaction
from dsv4patch.checkout.states import ApplyJournal, PortState, ResolveState
from dsv4patch.errors import TreeError

A, B = "a" * 40, "b" * 40
RESOLVE = {"lock": "/l/vllm.toml", "pin": "p", "patch": "0001-x.patch", "orig_head": A, "at": B,
           "series": ["dsv4"], "patch_index": 2, "base_commit": A, "cache_dir": None, "build": True,
           "out": "/dist", "conflicts": ["vllm/x.py"], "python": "/venv/bin/python", "nvcc": None,
           "allow_torch": "2.9.0"}


def test_round_trip_each_state() -> None:
    for cls, data in ((ApplyJournal, {"from": A, "to": B, "ref": "refs/heads/vllm-p", "pid": 7}),
                      (ResolveState, RESOLVE),
                      (PortState, {"lock": "/l", "from": "a", "to": "b", "patch": "x.patch",
                                   "base_commit": A, "at": B, "conflicts": [], "own": True,
                                   "orig_ref": "refs/heads/main"})):
        state = cls.from_json(data)
        assert state.to_json() == data
        assert cls.from_json(state.to_json()) == state


def test_optional_fields_default() -> None:
    st = ResolveState.from_json({k: RESOLVE[k] for k in ("lock", "pin", "patch", "orig_head", "at")})
    assert (st.series, st.build, st.out, st.conflicts, st.base_commit) == (None, False, None, [], None)
    j = ApplyJournal.from_json({"from": A, "to": B})
    assert j.ref is None and j.pid is None


def test_a_resolve_state_an_older_dsv4patch_wrote_reads_without_the_toolchain_fields() -> None:
    """A workspace opened before the state recorded --python/--nvcc/--allow-torch: read, as not given."""
    old = {k: v for k, v in RESOLVE.items() if k not in ("python", "nvcc", "allow_torch")}
    st = ResolveState.from_json(old)
    assert (st.out, st.python, st.nvcc, st.allow_torch) == ("/dist", None, None, None)


@pytest.mark.parametrize(("cls", "bad", "why"), [
    (ResolveState, {"orig_head": "HEAD~1"}, "orig_head = 'HEAD~1' is not a full commit id"),
    (ResolveState, {"at": "--output=/tmp/x"}, "is not a full commit id"),
    (ResolveState, {"base_commit": "abc"}, "base_commit = 'abc' is not a full commit id"),
    (ResolveState, {"conflicts": ["../outside"]}, "not a path inside the tree"),
    (ResolveState, {"conflicts": [".GIT/config"]}, "not a path inside the tree"),
    (ResolveState, {"conflicts": "vllm/x.py"}, "conflicts is not a list"),
    (ResolveState, {"series": "dsv4"}, "series is not a list of names"),
    (ResolveState, {"python": ["/bin/sh"]}, "python is not a string"),
    (ResolveState, {"build": "yes"}, "build is not true or false"),
    (ResolveState, {"patch": 3}, "missing patch"),
    (ResolveState, {"lock": None}, "missing lock"),
    (ApplyJournal, {"ref": "refs/heads/../../config"}, "is not a branch"),
    (ApplyJournal, {"ref": "HEAD"}, "is not a branch"),
    (ApplyJournal, {"pid": True}, "pid is not a count"),
    (PortState, {"orig_ref": "refs/heads/../../config"}, "is not a branch"),
    (PortState, {"orig_ref": "main"}, "orig_ref = 'main' is not a branch"),
    (PortState, {"own": "yes"}, "own is not true or false"),
    (ApplyJournal, {"to": "b" * 39}, "to = "),
])
def test_values_dsv4patch_never_writes_are_refused(cls: type[states.State], bad: dict, why: str) -> None:
    good = RESOLVE if cls is ResolveState else {"from": A, "to": B} if cls is ApplyJournal else {
        "lock": "/l", "from": "a", "to": "b", "patch": "x.patch", "base_commit": A, "at": B, "conflicts": []}
    with pytest.raises(ValueError, match=why.replace("(", r"\(")):
        cls.from_json({**good, **bad})


def test_not_an_object() -> None:
    with pytest.raises(ValueError, match="not an object"):
        ApplyJournal.from_json([A, B])


def test_read_refuses_a_planted_link_and_a_fifo(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text(json.dumps({"from": A, "to": B}))
    assert states.read(ApplyJournal, real) == ApplyJournal(frm=A, to=B)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with pytest.raises(ValueError, match="symbolic link"):
        states.read(ApplyJournal, link)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="FIFO"):
        states.read(ApplyJournal, fifo)  # returns at once: never blocks on the FIFO


def test_write_replaces_a_planted_link_instead_of_writing_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    target = tmp_path / "state.json"
    target.symlink_to(victim)
    states.write(target, ApplyJournal(frm=A, to=B))
    assert victim.read_text() == "keep"
    assert not target.is_symlink() and states.read(ApplyJournal, target).to == B


def test_recovery_refuses_a_journal_whose_ref_leaves_the_git_dir(tmp_path: Path) -> None:
    """A journal whose branch is not under refs/heads (it names a lock file recovery may delete) is refused."""
    tree = tmp_path / "t"
    tree.mkdir()
    sh(tree, "init", "-q")
    (tree / "f").write_text("x\n")
    sh(tree, "add", "f")
    sh(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = sh(tree, "rev-parse", "HEAD")
    precious = tmp_path / "precious.lock"
    precious.write_text("mine")
    gitdir = tree / ".git"
    (gitdir / transaction.JOURNAL).write_text(json.dumps(
        {"from": head, "to": head, "ref": "refs/heads/../../../../precious"}))
    with pytest.raises(TreeError, match="unreadable"), transaction.exclusive_checkout(tree) as co:
        transaction.recover(co)
    assert precious.read_text() == "mine"
