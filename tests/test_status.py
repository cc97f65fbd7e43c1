"""status tells the truth: decided by the tree's content, not by commit trailers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import LOCK, MINI_FILES, Upstream, applied_tree, git_pin, sh, validate_json, write_lock
from dsv4patch.errors import EXIT_TREE, EXIT_USAGE


def _lock(d: Path, upstream: Upstream, extra: str = "") -> Path:
    worker = MINI_FILES["vllm/worker.py"]
    upstream.patch(d / "0001-a.patch", "a", {"vllm/envs.py": MINI_FILES["vllm/envs.py"] + "A = 1\n"}, "first")
    # 0002 and 0003 touch the same line: 0003 must be peeled off before 0002 is judged.
    upstream.patch(d / "0002-b.patch", "b", {"vllm/worker.py": worker.replace("return 0", "return 2")}, "second")
    work = d / "stack"
    sh(d, "clone", "-q", str(upstream.path), str(work))
    sh(work, "am", "-q", str(d / "0002-b.patch"))
    (work / "vllm/worker.py").write_text(worker.replace("return 0", "return 3"))
    sh(work, "commit", "-qam", "third")
    produced = sh(work, "format-patch", "-1", "-o", str(d))
    Path(produced).rename(d / "0003-c.patch")
    return write_lock(d / "l.toml", {"p": git_pin("p", upstream, extra)},
                      {"main": ["0001-a.patch", "0002-b.patch", "0003-c.patch"]})


@pytest.fixture
def applied(tmp_path, upstream, cli):
    d = tmp_path / "lock"
    d.mkdir()
    lock = _lock(d, upstream)
    tree = tmp_path / "vllm-src"
    res = cli("apply", "--lock", lock, "--pin", "p", "--tree", tree, "--cache-dir", tmp_path / "c",
              "--format", "json")
    assert res.rc == 0, res.out + res.err
    return lock, tree


def _states(rep: dict) -> dict[str, str]:
    return {k: v["state"] for k, v in rep["patches"].items()}


def test_reverted_fix_is_missing_and_the_revert_is_foreign(applied, cli, tmp_path, upstream):
    lock, tree = applied
    st = cli("status", "--tree", tree, "--lock", lock, "--pin", "p", "--format", "json")
    rep = json.loads(st.out)
    # Stacked patches on one line are each found (peeled in reverse order).
    assert st.rc == 0 and _states(rep) == {
        "0001-a.patch": "applied", "0002-b.patch": "applied", "0003-c.patch": "applied"}, rep
    assert rep["foreign_commits"] == []
    good_tree = rep["tree_id"]

    # git revert of the first fix: its commit and trailers are still in the history.
    first = sh(tree, "log", "--format=%H", "--grep", "Dsv4patch-Patch: 0001-a.patch")
    sh(tree, "-c", "user.name=t", "-c", "user.email=t@t", "revert", "--no-edit", first)
    st = cli("status", "--tree", tree, "--lock", lock, "--pin", "p", "--format", "json")
    rep = json.loads(st.out)
    assert st.rc == 1
    assert _states(rep) == {
        "0001-a.patch": "missing", "0002-b.patch": "applied", "0003-c.patch": "applied"}, rep
    assert "no longer has it" in rep["patches"]["0001-a.patch"]["note"]
    assert [f["subject"] for f in rep["foreign_commits"]] == ['Revert "first"']

    # Text mode: the expected tree id next to the actual one, and the foreign commit.
    lock2 = write_lock(lock.parent / "l2.toml",
                       {"p": git_pin("p", upstream, f'patched_tree = "{good_tree}"')},
                       {"main": ["0001-a.patch", "0002-b.patch", "0003-c.patch"]})
    st = cli("status", "--tree", tree, "--lock", lock2, "--pin", "p")
    text = " ".join(st.out.split())
    assert f"the lock expects {good_tree} (DIFFERS)" in text, st.out
    assert "not made by dsv4patch" in text and "foreign" in text


def test_hand_edit_of_an_applied_fix_is_not_applied(applied, cli):
    lock, tree = applied
    worker = tree / "vllm/worker.py"
    worker.write_text(worker.read_text().replace("return 3", "return 4"))
    sh(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "tweak")
    rep = json.loads(cli("status", "--tree", tree, "--lock", lock, "--pin", "p", "--format", "json").out)
    # 0003 no longer reverse-applies, so 0002 below it cannot be peeled either.
    assert _states(rep)["0003-c.patch"] == "missing"
    assert _states(rep)["0001-a.patch"] == "applied"


def test_status_uses_the_default_lock_when_a_pin_has_the_tree_base(applied, cli, tmp_path, upstream,
                                                                   monkeypatch):
    lock, tree = applied
    base = sh(upstream.path, "rev-parse", f"{upstream.commit}^{{tree}}")
    root = tmp_path / "proj"
    (root / "locks").mkdir(parents=True)
    for p in lock.parent.glob("000*.patch"):
        (root / "locks" / p.name).write_bytes(p.read_bytes())
    write_lock(root / "locks/vllm.toml", {"p": git_pin("p", upstream, f'base_tree = "{base}"')},
               {"main": ["0001-a.patch", "0002-b.patch", "0003-c.patch"]})
    monkeypatch.chdir(root)
    rep = json.loads(cli("status", "--tree", tree, "--format", "json").out)
    assert rep.get("pin") == "p", rep
    assert _states(rep) == {
        "0001-a.patch": "applied", "0002-b.patch": "applied", "0003-c.patch": "applied"}


def test_moved_local_checkout_is_reported_as_changed(tmp_path, upstream, cli):
    d = tmp_path / "lock"
    d.mkdir()
    upstream.patch(d / "0001-a.patch", "a", {"vllm/envs.py": MINI_FILES["vllm/envs.py"] + "A = 1\n"}, "first")
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream, kind="local")}, {"main": ["0001-a.patch"]})
    tree = tmp_path / "vllm-src"
    assert cli("apply", "--lock", lock, "--pin", "p", "--tree", tree, "--cache-dir", tmp_path / "c").rc == 0
    rep = json.loads(cli("status", "--tree", tree, "--lock", lock, "--pin", "p", "--format", "json").out)
    assert rep["source"] == "unchanged" and rep["ok"]
    sh(upstream.path, "commit", "-q", "--allow-empty", "-m", "moved on")
    st = cli("status", "--tree", tree, "--lock", lock, "--pin", "p", "--format", "json")
    rep = json.loads(st.out)
    assert st.rc == 1 and rep["source"].startswith("changed:") and "check out that commit" in rep["source"]


def test_status_without_tree_uses_the_only_tree_apply_made(tmp_path, upstream, cli, monkeypatch):
    """issue 28 item 5: `apply` without --tree puts the tree at vllm-src/<pin>; `status` finds it.
    issue 40: in the lock's project (here the lock's own directory: it is not in a locks/), not
    wherever the command runs."""
    d = tmp_path / "lock"
    d.mkdir()
    lock = _lock(d, upstream)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    res = cli("status", "--lock", lock)
    assert res.rc == 2 and "give --tree DIR" in res.err and f"no {d / 'vllm-src'}/<pin>" in res.err
    assert cli("apply", "--lock", lock, "--pin", "p", "--cache-dir", tmp_path / "c").rc == 0
    assert (d / "vllm-src/p/.git").exists() and not (work / "vllm-src").exists()
    res = cli("status", "--lock", lock, "--format", "json")
    assert res.rc == 0, res.out + res.err
    rep = json.loads(res.out)
    assert set(_states(rep).values()) == {"applied"}
    assert rep["notes"][0].startswith(f"tree: {d / 'vllm-src/p'}")
    assert cli("status", "--lock", lock, "--pin", "p").rc == 0
    (d / "vllm-src/other").mkdir()
    res = cli("status", "--lock", lock)
    assert res.rc == 2 and f"2 trees under {d / 'vllm-src'}" in res.err
    assert f"--tree {d / 'vllm-src/other'}" in res.err
    assert cli("status", "--lock", lock, "--pin", "p").rc == 0  # --pin chooses


def test_a_tree_that_is_absent_or_not_a_checkout_is_named_as_such(applied, cli, tmp_path):
    lock, _tree = applied
    res = cli("status", "--tree", tmp_path / "missing", "--lock", lock, "--pin", "p")
    assert res.rc == EXIT_TREE and res.err.strip() == f"dsv4patch status: error: {tmp_path / 'missing'} does not exist"
    (tmp_path / "plain").mkdir()
    res = cli("status", "--tree", tmp_path / "plain", "--lock", lock, "--pin", "p")
    assert res.rc == EXIT_TREE and "is not a git repository made by dsv4patch apply" in res.err
    res = cli("refresh", "--tree", tmp_path / "plain", "--lock", lock, "--pin", "p")
    assert res.rc == EXIT_TREE and "creates the tree" not in res.err, res.err  # refresh creates none
    # inside the tree instead of at its root: the tree is named (status, refresh, build alike)
    for verb in ("status", "refresh", "build"):
        res = cli(verb, "--tree", _tree / "vllm", "--lock", lock, "--pin", "p")
        assert res.rc != 0 and f"(no .git; it is inside the checkout {_tree})" in res.err, (verb, res.err)
    (tmp_path / "plain" / "f").write_text("x")
    res = cli("apply", "--tree", tmp_path / "plain", "--lock", lock, "--pin", "p", "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_TREE and "or at a new (absent or empty) directory and dsv4patch creates the tree" in res.err


def test_status_names_the_lock_a_pin_needs_and_says_when_it_compared_nothing(applied, cli, tmp_path, upstream,
                                                                             monkeypatch):
    """--pin with no lock found is exit 2 naming --lock / DSV4PATCH_LOCK (as check and apply); without
    --pin a tree compared with no pin says so, in the notes and as "compared": false."""
    lock, tree = applied
    nowhere = tmp_path / "nowhere"
    nowhere.mkdir()
    monkeypatch.chdir(nowhere)
    monkeypatch.delenv("DSV4PATCH_LOCK", raising=False)
    res = cli("status", "--tree", tree, "--pin", "p")
    assert res.rc == EXIT_USAGE and res.out == "", res.out
    assert "no lock file" in res.err and "--lock FILE" in res.err and "DSV4PATCH_LOCK" in res.err
    res = cli("status", "--tree", tree, "--format", "json")
    rep = validate_json("status", res.out)
    assert res.rc == 0 and rep["compared"] is False and "pin" not in rep
    assert any(n.startswith("not compared with any pin: no lock file") and "--lock" in n for n in rep["notes"]), rep
    assert "not compared with any pin" in " ".join(cli("status", "--tree", tree).out.split())
    compared = validate_json("status", cli("status", "--tree", tree, "--lock", lock, "--pin", "p", "--format",
                                           "json").out)
    assert compared["compared"] is True and compared["pin"] == "p"

    # A fork's own checkout (here upstream's: HEAD is pin p's commit) never has a pin's base tree: with
    # the lock found and no --pin it is not compared, and the note names the pin whose commit it is on.
    monkeypatch.chdir(lock.parent)
    (lock.parent / "locks").mkdir()
    (lock.parent / "locks" / "vllm.toml").write_text(lock.read_text().replace('path = "', 'path = "../'))
    res = cli("status", "--tree", upstream.path, "--format", "json")
    rep = validate_json("status", res.out)
    assert res.rc == 0 and rep["compared"] is False, rep
    assert any("not compared with any pin" in n and "it is a tree of pin p: run `dsv4patch status --pin p "
               f"--tree {upstream.path}`" in n for n in rep["notes"]), rep["notes"]
    rep = validate_json("status", cli("status", "--tree", upstream.path, "--pin", "p", "--format", "json").out)
    assert rep["compared"] is True and rep["pin"] == "p"


@pytest.fixture(scope="module")
def tree271(tmp_path_factory, shared_cache) -> Path:
    return applied_tree(tmp_path_factory, shared_cache, "status271")


def test_status_with_another_pin_names_the_pin_of_the_tree(tree271, cli):
    """A 0.27.1 tree is intact, not a 0.26.0 tree with four patches changed: --pin 0.26.0 is refused
    with exit 5 as apply refuses it, naming the tree's pin and the command for it."""
    res = cli("status", "--lock", LOCK, "--pin", "0.26.0", "--tree", tree271)
    assert res.rc == EXIT_TREE and res.out == "", res.out
    err = " ".join(res.err.split())
    assert f"{tree271} is not a tree of pin 0.26.0: its base tree" in err, err
    assert f"it is a tree of pin 0.27.1: run `dsv4patch status --lock {LOCK} --pin 0.27.1 --tree {tree271}`" in err
    as_json = cli("status", "--lock", LOCK, "--pin", "0.26.0", "--tree", tree271, "--format", "json")
    error = validate_json("error", as_json.out)["error"]
    assert as_json.rc == EXIT_TREE and error["kind"] == "tree" and error["exit_code"] == EXIT_TREE
    res = cli("status", "--lock", LOCK, "--pin", "0.27.1", "--tree", tree271, "--format", "json")
    rep = validate_json("status", res.out)
    assert res.rc == 0 and rep["compared"] is True and set(_states(rep).values()) == {"applied"}, rep


def test_a_long_foreign_subject_is_cut_between_words() -> None:
    """status's table shows a commit of yours by its subject, cut to 60 characters between words (it cut
    mid-word: '... from quant con'); a single longer word stays whole."""
    from dsv4patch.checkout.treestatus import _shortened

    subject = "[DSV4 fix 4] Take MXFP4 SwiGLU params from quant config for the flashinfer path"
    assert _shortened(subject) == "[DSV4 fix 4] Take MXFP4 SwiGLU params from quant config ..."
    assert _shortened("short") == "short" and _shortened("x" * 80) == "x" * 80


def test_build_and_refresh_take_the_trees_own_pin_and_refuse_another(tmp_path, upstream, cli):
    """A tree of pin q (not the lock's default p): `build` and `refresh` with `--pin p` are refused
    before anything runs (exit 5, as apply refuses a tree of another pin), naming q, the pin
    `status --tree` finds; `refresh` without --pin works on q (checkout.tree_pin); q's own
    checkout (a fork's) is q's with --pin q although its root commit holds p's base."""
    d = tmp_path / "lock"
    d.mkdir()
    lock = _lock(d, upstream)
    base_p = sh(upstream.path, "rev-parse", f"{upstream.commit}^{{tree}}")
    (upstream.path / "q.txt").write_text("q\n")
    sh(upstream.path, "add", "q.txt")
    sh(upstream.path, "commit", "-qm", "q")
    q = Upstream(upstream.path, sh(upstream.path, "rev-parse", "HEAD"))
    base_q = sh(q.path, "rev-parse", "HEAD^{tree}")
    write_lock(lock, {"p": git_pin("p", upstream, f'base_tree = "{base_p}"'),
                      "q": git_pin("q", q, f'base_tree = "{base_q}"')},
               {"main": ["0001-a.patch", "0002-b.patch", "0003-c.patch"]}, extra_top='default_pin = "p"')
    tree = tmp_path / "vllm-src"
    cache = ("--cache-dir", tmp_path / "c")
    assert cli("apply", "--lock", lock, "--pin", "q", "--tree", tree, *cache, "--no-build").rc == 0
    assert json.loads(cli("status", "--lock", lock, "--tree", tree, "--format", "json").out)["pin"] == "q"
    for verb in (("build", "--dry-run"), ("refresh",)):
        res = cli(verb[0], "--lock", lock, "--pin", "p", "--tree", tree, *cache, *verb[1:])
        assert res.rc == EXIT_TREE, res.err
        assert (f"{tree} is not a tree of pin p: it is a tree of pin q (its root commit holds that pin's base "
                f"tree {base_q[:12]}, not pin p's {base_p[:12]}); pass --pin q, or leave --pin out") in res.err
    res = cli("refresh", "--lock", lock, "--tree", tree, *cache, "--format", "json")
    assert res.rc == 0, res.err
    assert json.loads(res.out)["pin"] == "q"
    # q's own history (a fork's checkout): its root commit holds p's base tree, but HEAD descends
    # from q's commit, so --pin q is taken.
    fork = tmp_path / "fork"
    sh(tmp_path, "clone", "-q", str(q.path), str(fork))
    res = cli("refresh", "--lock", lock, "--pin", "q", "--tree", fork, *cache, "--format", "json")
    assert res.rc != EXIT_TREE and json.loads(res.out)["pin"] == "q", res.err  # refreshed (q's commit, not ok)
