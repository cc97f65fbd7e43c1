"""Forks as pins: apply --3way conflict workspace, resolve --continue/--abort, refresh.

Every test builds a real fork repository (a clone of the upstream fixture
with its own commit) and a lock with the upstream pin (the series is made
for it) and the fork as a ``local`` pin, then drives the CLI as a user would.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import MINI_FILES, Upstream, git_pin, local_pin, sh, write_lock
from dsv4patch.errors import EXIT_TREE, EXIT_UNEXPECTED, EXIT_USAGE

WORKER = MINI_FILES["vllm/worker.py"]
# The fork changed the very line patch 0002 changes: a real conflict.
FORK_WORKER = WORKER.replace("    z = y * 2\n", "    z = y * 2  # fork: keep the doubling\n")
PATCHED_WORKER = WORKER.replace("    z = y * 2\n", "    z = y * 2 + 1\n")
RESOLVED_WORKER = WORKER.replace("    z = y * 2\n", "    z = y * 2 + 1  # fork: keep the doubling\n")


@pytest.fixture
def fork_lock(tmp_path: Path, upstream: Upstream) -> Path:
    fork = tmp_path / "fork"
    sh(tmp_path, "clone", "-q", str(upstream.path), str(fork))
    (fork / "vllm/worker.py").write_text(FORK_WORKER)
    sh(fork, "commit", "-qam", "fork: annotate the doubling")
    fork_head = sh(fork, "rev-parse", "HEAD")
    d = tmp_path / "lock"
    d.mkdir()
    upstream.patch(d / "0001-envs.patch", "a", {"vllm/envs.py": MINI_FILES["vllm/envs.py"] + "A = 1\n"},
                   "envs: add A\n\nFix: 1\nTest: tests/test_a.py::test_a")
    upstream.patch(d / "0002-worker.patch", "b", {"vllm/worker.py": PATCHED_WORKER},
                   "worker: add one\n\nFix: 2\nOrigin: local\nTest: tests/test_b.py::test_b")
    upstream.patch(d / "0003-kernel.patch", "c", {"csrc/kernel.cuh": "int length = row_len;\nint k = 8;\n"},
                   "kernel: k = 8\n\nFix: 3")
    fork_pin = local_pin("fork", fork, fork_head, version="0.0.1+fork")
    return write_lock(d / "vllm.toml", {"upstream": git_pin("upstream", upstream), "fork": fork_pin},
                      {"main": ["0001-envs.patch", "0002-worker.patch", "0003-kernel.patch"]},
                      extra_top='default_pin = "upstream"')


def _status(tree: Path) -> str:
    return sh(tree, "status", "--porcelain", "--untracked-files=all")


def test_conflict_workspace_continue_gives_a_variant_check_reports_clean(tmp_path, cli, fork_lock):
    tree = tmp_path / "fork-tree"
    cache = tmp_path / "cache"
    base = ("--lock", fork_lock, "--pin", "fork", "--cache-dir", cache)
    assert cli("check", *base).rc == EXIT_UNEXPECTED  # 0002 conflicts on the fork
    res = cli("apply", *base, "--tree", tree, "--3way", "--no-build", "--format", "json")
    assert res.rc == EXIT_UNEXPECTED, res.err
    rep = json.loads(res.out)
    assert rep["workspace"]["patch"] == "0002-worker.patch"
    assert rep["workspace"]["conflicts"] == ["vllm/worker.py"]
    assert any("resolve --continue" in n for n in rep["notes"])
    # The patches before the conflict are committed, the failing one is applied with markers.
    log = sh(tree, "log", "--format=%s", "-2")
    assert log.splitlines()[0] == "envs: add A"
    assert (tree / "vllm/envs.py").read_text().endswith("A = 1\n")
    text = (tree / "vllm/worker.py").read_text()
    assert "<<<<<<<" in text and ">>>>>>>" in text and "z = y * 2 + 1" in text
    # diff3 markers, as port --workspace writes them: the base's line between ||||||| and =======
    assert "\n|||||||" in text and text.split("|||||||", 1)[1].split("=======", 1)[0].count("    z = y * 2\n") == 1
    assert (tree / ".git" / "dsv4patch-resolve.json").is_file()
    st = cli("status", "--tree", tree, "--format", "json")
    assert st.rc == EXIT_UNEXPECTED and json.loads(st.out)["conflict_workspace"] is True
    assert any("resolve --continue" in n for n in json.loads(st.out)["notes"])
    # apply refuses while the workspace is open; continue refuses while markers are left.
    again = cli("apply", *base, "--tree", tree, "--no-build")
    assert again.rc == EXIT_TREE and "resolve --continue" in again.err
    early = cli("resolve", "--continue", "--tree", tree, "--lock", fork_lock, "--cache-dir", cache)
    assert early.rc == EXIT_TREE and "vllm/worker.py" in early.err and "conflict markers" in early.err
    # The maintainer resolves, then continues: variant written, lock updated, the rest applied.
    (tree / "vllm/worker.py").write_text(RESOLVED_WORKER)
    done = cli("resolve", "--continue", "--tree", tree, "--lock", fork_lock, "--cache-dir", cache,
               "--format", "json")
    assert done.rc == 0, done.err + done.out
    out = json.loads(done.out)
    assert out["ok"] is True
    variant = fork_lock.parent / "variants" / "fork" / "0002-worker.patch"
    assert variant.is_file() and any(str(variant) in n for n in out["notes"])
    vtext = variant.read_text()
    assert "worker: add one" in vtext and "Test: tests/test_b.py::test_b" in vtext
    assert "+    z = y * 2 + 1  # fork: keep the doubling" in vtext
    lock_text = fork_lock.read_text()
    assert 'variants/fork/0002-worker.patch"' in lock_text and "patched_tree" in lock_text
    assert not (tree / ".git" / "dsv4patch-resolve.json").exists()
    assert _status(tree) == ""
    assert sh(tree, "log", "--format=%s", "-3").splitlines() == [
        "kernel: k = 8", "worker: add one", "envs: add A"]
    assert (tree / "vllm/worker.py").read_text() == RESOLVED_WORKER
    # check now reports the variant clean, and the patched tree the lock records.
    chk = cli("check", *base, "--format", "json")
    assert chk.rc == 0, chk.out
    pin = json.loads(chk.out)["pins"]["fork"]
    assert {n: c["status"] for n, c in pin["patches"].items()} == {
        "0001-envs.patch": "clean", "0002-worker.patch": "clean", "0003-kernel.patch": "clean"}
    assert pin["patched_tree"] == sh(tree, "rev-parse", "HEAD^{tree}")
    # The upstream pin keeps the original patch and still checks clean.
    assert cli("check", "--lock", fork_lock, "--pin", "upstream", "--cache-dir", cache).rc == 0
    # A plain apply of the updated lock on a fresh tree gives the same commits.
    fresh = cli("apply", *base, "--tree", tmp_path / "fresh", "--no-build", "--format", "json")
    assert fresh.rc == 0 and json.loads(fresh.out)["head"] == sh(tree, "rev-parse", "HEAD")


def test_abort_returns_the_tree_to_where_it_was(tmp_path, cli, fork_lock):
    tree = tmp_path / "fork-tree"
    base = ("--lock", fork_lock, "--pin", "fork", "--cache-dir", tmp_path / "cache")
    before_lock = fork_lock.read_text()
    assert cli("apply", *base, "--tree", tree, "--3way", "--no-build").rc == EXIT_UNEXPECTED
    orig = sh(tree, "rev-list", "--max-parents=0", "HEAD")
    assert sh(tree, "rev-parse", "HEAD") != orig and _status(tree) != ""
    res = cli("resolve", "--abort", "--tree", tree)
    assert res.rc == 0, res.err
    assert sh(tree, "rev-parse", "HEAD") == orig and _status(tree) == ""
    assert not (tree / ".git" / "dsv4patch-resolve.json").exists()
    assert fork_lock.read_text() == before_lock
    nothing = cli("resolve", "--abort", "--tree", tree)
    assert nothing.rc == EXIT_TREE and "apply --pin P" in nothing.err


def test_continue_keeps_the_kernel_build_options_the_apply_was_given(tmp_path, cli, fork_lock):
    """`apply --3way --out D --python P` stopped on a conflict: `resolve --continue` without them no
    longer builds with the defaults (./dist, another interpreter) but refuses (exit 2, nothing written)
    naming the command that gives them again, which the apply's next step already is; an option given
    otherwise is resolve's choice (noted). The state file records them (never used: the tree's)."""
    (fork_lock.parent / "main.series").write_text("0001-envs.patch\n0002-worker.patch\n")  # no kernel to build
    tree, cache, dist = tmp_path / "fork-tree", tmp_path / "cache", tmp_path / "D"
    python = str(tmp_path / "venv" / "bin" / "python")
    res = cli("apply", "--lock", fork_lock, "--pin", "fork", "--cache-dir", cache, "--tree", tree, "--3way",
              "--out", dist, "--python", python, "--allow-torch", "2.9.0", "--format", "json")
    assert res.rc == EXIT_UNEXPECTED, res.err
    nxt = next(n for n in json.loads(res.out)["notes"] if "resolve --continue" in n)
    assert f"--out {dist}" in nxt and f"--python {python}" in nxt and "--allow-torch 2.9.0" in nxt, nxt
    state = json.loads((tree / ".git" / "dsv4patch-resolve.json").read_text())
    assert (state["out"], state["python"], state["allow_torch"], state["nvcc"]) == (str(dist), python, "2.9.0", None)
    (tree / "vllm/worker.py").write_text(RESOLVED_WORKER)
    before, lock_before = _status(tree), fork_lock.read_text()
    plain = ("resolve", "--continue", "--tree", tree, "--lock", fork_lock, "--cache-dir", cache)
    bare = cli(*plain, "--python", python)
    assert bare.rc == EXIT_USAGE, bare.err + bare.out
    err = " ".join(bare.err.split())
    assert f"--out {dist}" in err and "--allow-torch 2.9.0" in err and "Nothing was changed" in err, err
    assert f"resolve --continue --tree {tree} --lock {fork_lock} --cache-dir {cache} --out {dist} " \
        f"--python {python} --allow-torch 2.9.0" in err, err
    assert _status(tree) == before and fork_lock.read_text() == lock_before
    assert not (fork_lock.parent / "variants").exists()
    other = tmp_path / "D2"
    done = cli(*plain, "--out", other, "--python", python, "--allow-torch", "2.9.0", "--format", "json")
    assert done.rc == 0, done.err + done.out
    notes = json.loads(done.out)["notes"]
    assert any(f"uses --out {other} (the workspace was opened with {dist})" in n for n in notes), notes
    assert not any("--python" in n for n in notes), notes  # the same interpreter: nothing to say
    assert (fork_lock.parent / "variants" / "fork" / "0002-worker.patch").is_file()


def test_3way_refuses_a_tree_whose_config_names_a_merge_driver(tmp_path, cli, fork_lock):
    tree = tmp_path / "fork-tree"
    base = ("--lock", fork_lock, "--pin", "fork", "--cache-dir", tmp_path / "cache")
    assert cli("apply", *base, "--tree", tree, "--3way", "--no-build").rc == EXIT_UNEXPECTED
    assert cli("resolve", "--abort", "--tree", tree).rc == 0
    flag = tmp_path / "ran"
    sh(tree, "config", "merge.evil.driver", f"touch {flag}; false")
    (tree / ".git" / "info").mkdir(exist_ok=True)
    (tree / ".git" / "info" / "attributes").write_text("* merge=evil\n")
    res = cli("apply", *base, "--tree", tree, "--3way", "--no-build")
    assert res.rc == EXIT_TREE and "merge.evil.driver" in res.err
    assert not flag.exists() and _status(tree) == ""


def test_3way_markers_are_diff3_whatever_the_trees_config_says(tmp_path, cli, fork_lock):
    """The tree's own merge.conflictStyle (here git's two-way default) does not choose the markers."""
    tree = tmp_path / "fork-tree"
    base = ("--lock", fork_lock, "--pin", "fork", "--cache-dir", tmp_path / "cache")
    assert cli("apply", *base, "--tree", tree, "--3way", "--no-build").rc == EXIT_UNEXPECTED
    assert cli("resolve", "--abort", "--tree", tree).rc == 0
    sh(tree, "config", "merge.conflictStyle", "merge")
    assert cli("apply", *base, "--tree", tree, "--3way", "--no-build").rc == EXIT_UNEXPECTED
    text = (tree / "vllm/worker.py").read_text()
    assert "\n<<<<<<< " in text and "\n||||||| " in text and "\n>>>>>>> " in text


def test_refresh_writes_commits_back_as_the_series(tmp_path, cli, fork_lock):
    tree = tmp_path / "up-tree"
    cache = tmp_path / "cache"
    base = ("--lock", fork_lock, "--pin", "upstream", "--cache-dir", cache)
    assert cli("apply", *base, "--tree", tree, "--no-build").rc == 0
    d = fork_lock.parent
    before = {n: (d / n).read_bytes() for n in ("0001-envs.patch", "0002-worker.patch", "0003-kernel.patch")}
    unchanged = cli("refresh", *base, "--tree", tree, "--format", "json")
    assert unchanged.rc == 0, unchanged.err + unchanged.out
    assert {n: v["action"] for n, v in json.loads(unchanged.out)["patches"].items()} == {
        "0001-envs.patch": "unchanged", "0002-worker.patch": "unchanged", "0003-kernel.patch": "unchanged"}
    assert {n: (d / n).read_bytes() for n in before} == before
    # The maintainer amends 0003's commit and adds a commit of their own.
    (tree / "csrc/kernel.cuh").write_text("int length = row_len;\nint k = 16;\n")
    sh(tree, "commit", "-q", "--amend", "--no-edit", "-a")
    (tree / "vllm/new_mod.py").write_text("X = 1\n")
    sh(tree, "add", "vllm/new_mod.py")
    sh(tree, "commit", "-qm", "Add new_mod")
    res = cli("refresh", *base, "--tree", tree, "--format", "json")
    assert res.rc == 0, res.err + res.out
    rep = json.loads(res.out)
    actions = {n: v["action"] for n, v in rep["patches"].items()}
    assert actions == {"0001-envs.patch": "unchanged", "0002-worker.patch": "unchanged",
                       "0003-kernel.patch": "refreshed", "0004-Add-new_mod.patch": "new"}
    k = (d / "0003-kernel.patch").read_text()
    assert "+int k = 16;" in k and "Subject: [PATCH 3/4] kernel: k = 8" in k
    assert "From: t <t@t>" in k and "Fix: 3" in k and "Dsv4patch-" not in k
    new = (d / "0004-Add-new_mod.patch").read_text()
    assert "Fix: TODO" in new and "Origin: TODO" in new and "+X = 1" in new
    assert (d / "main.series").read_text().splitlines()[-1] == "0004-Add-new_mod.patch"
    assert {n: (d / n).read_bytes() for n in ("0001-envs.patch", "0002-worker.patch")} == {
        n: before[n] for n in ("0001-envs.patch", "0002-worker.patch")}
    # The lock's derived field follows, and check reports the new series clean.
    head_tree = sh(tree, "rev-parse", "HEAD^{tree}")
    assert rep["patched_tree"] == head_tree and f'patched_tree = "{head_tree}"' in fork_lock.read_text()
    chk = cli("check", *base, "--format", "json")
    assert chk.rc == 0, chk.out
    assert set(json.loads(chk.out)["pins"]["upstream"]["patches"]) == set(actions)


def test_refresh_after_amending_an_early_commit(tmp_path, cli, upstream):
    """Amend patch 1 and rebase: only patch 1 is rewritten (the later ones are byte-identical),
    each series is numbered on its own, and every pin that reads patch 1 gets its tree id."""
    d = tmp_path / "lock"
    d.mkdir()
    upstream.patch(d / "0001-envs.patch", "a", {"vllm/envs.py": MINI_FILES["vllm/envs.py"] + "A = 1\n"},
                   "envs: add A\n\nFix: 1")
    upstream.patch(d / "0002-worker.patch", "b", {"vllm/worker.py": PATCHED_WORKER}, "worker: add one\n\nFix: 2")
    upstream.patch(d / "0003-kernel.patch", "c", {"csrc/kernel.cuh": "int length = row_len;\nint k = 8;\n"},
                   "kernel: k = 8\n\nFix: 3")
    both = 'series = ["main", "extra"]'
    lock = write_lock(d / "vllm.toml", {"a": git_pin("a", upstream, both), "b": git_pin("b", upstream, both)},
                      {"main": ["0001-envs.patch", "0002-worker.patch"], "extra": ["0003-kernel.patch"]},
                      extra_top='default_pin = "a"')
    base = ("--lock", lock, "--pin", "a", "--cache-dir", tmp_path / "cache")
    assert cli("lock", "--update", "--lock", lock, "--cache-dir", tmp_path / "cache").rc == 0
    tree = tmp_path / "t"
    assert cli("apply", *base, "--tree", tree, "--no-build").rc == 0
    later = {n: (d / n).read_bytes() for n in ("0002-worker.patch", "0003-kernel.patch")}
    first = sh(tree, "rev-list", "--reverse", "HEAD~3..HEAD").split()[0]
    (tree / "vllm/envs.py").write_text(MINI_FILES["vllm/envs.py"] + "A = 2\n")
    sh(tree, "commit", "-qa", "--fixup", first)
    sh(tree, "-c", "sequence.editor=:", "rebase", "-q", "-i", "--autosquash", "HEAD~4")
    res = cli("refresh", *base, "--tree", tree, "--format", "json")
    assert res.rc == 0, res.err + res.out
    rep = json.loads(res.out)
    assert {n: v["action"] for n, v in rep["patches"].items()} == {
        "0001-envs.patch": "refreshed", "0002-worker.patch": "unchanged", "0003-kernel.patch": "unchanged"}
    assert {n: (d / n).read_bytes() for n in later} == later
    text = (d / "0001-envs.patch").read_text()
    assert "+A = 2" in text and "Subject: [PATCH 1/2] envs: add A" in text
    head_tree = sh(tree, "rev-parse", "HEAD^{tree}")
    assert any(n.startswith("pin b also reads a rewritten patch") for n in rep["notes"])
    assert cli("check", "--lock", lock, "--cache-dir", tmp_path / "cache").rc == 0  # a and b agree with the lock
    assert lock.read_text().count(f'patched_tree = "{head_tree}"') == 2


def test_refresh_as_variant_leaves_the_shared_series_alone(tmp_path, cli, fork_lock):
    tree = tmp_path / "up-tree"
    base = ("--lock", fork_lock, "--pin", "upstream", "--cache-dir", tmp_path / "cache")
    assert cli("apply", *base, "--tree", tree, "--no-build").rc == 0
    shared = (fork_lock.parent / "0003-kernel.patch").read_bytes()
    (tree / "csrc/kernel.cuh").write_text("int length = row_len;\nint k = 32;\n")
    sh(tree, "commit", "-q", "--amend", "--no-edit", "-a")
    dirty = tree / "scratch.txt"
    dirty.write_text("x")
    refused = cli("refresh", *base, "--tree", tree)
    assert refused.rc == EXIT_TREE and "scratch.txt" in refused.err
    dirty.unlink()
    res = cli("refresh", *base, "--tree", tree, "--as-variant", "--format", "json")
    assert res.rc == 0, res.err + res.out
    variant = fork_lock.parent / "variants" / "upstream" / "0003-kernel.patch"
    assert "+int k = 32;" in variant.read_text()
    assert (fork_lock.parent / "0003-kernel.patch").read_bytes() == shared
    assert 'variants/upstream/0003-kernel.patch"' in fork_lock.read_text()
    assert cli("check", *base).rc == 0


def test_offset_on_a_fork_becomes_an_exact_variant(tmp_path, cli, upstream):
    fork = tmp_path / "fork"
    sh(tmp_path, "clone", "-q", str(upstream.path), str(fork))
    (fork / "vllm/worker.py").write_text("# fork header\n# two\n" + WORKER)
    sh(fork, "commit", "-qam", "fork: a header")
    d = tmp_path / "lock"
    d.mkdir()
    upstream.patch(d / "0001-worker.patch", "a", {"vllm/worker.py": WORKER.replace("return 0", "return 1")},
                   "worker: other returns 1\n\nFix: 1")
    fork_pin = local_pin("fork", fork, sh(fork, "rev-parse", "HEAD"))
    lock = write_lock(d / "vllm.toml", {"fork": fork_pin}, {"main": ["0001-worker.patch"]})
    base = ("--lock", lock, "--pin", "fork", "--cache-dir", tmp_path / "c")
    chk = cli("check", *base, "--format", "json")
    cell = json.loads(chk.out)["pins"]["fork"]["patches"]["0001-worker.patch"]
    assert chk.rc == EXIT_UNEXPECTED and cell["status"] == "offset"
    assert "--3way" in cell["next"] and "refresh" in cell["next"]
    tree = tmp_path / "t"
    assert cli("apply", *base, "--tree", tree, "--no-build").rc == EXIT_UNEXPECTED  # plain apply refuses
    res = cli("apply", *base, "--tree", tree, "--no-build", "--3way", "--format", "json")
    assert res.rc == 0, res.err + res.out
    assert any("applied with offsets" in n for n in json.loads(res.out)["notes"])
    ref = cli("refresh", *base, "--tree", tree, "--as-variant", "--format", "json")
    assert ref.rc == 0, ref.err + ref.out
    assert json.loads(ref.out)["patches"]["0001-worker.patch"]["action"] == "refreshed"
    assert (d / "variants/fork/0001-worker.patch").is_file()
    assert cli("check", *base).rc == 0


def test_abort_after_a_continue_returns_to_before_the_first_apply(tmp_path, cli, upstream):
    fork = tmp_path / "fork"
    sh(tmp_path, "clone", "-q", str(upstream.path), str(fork))
    (fork / "vllm/worker.py").write_text(FORK_WORKER)
    (fork / "csrc/kernel.cuh").write_text("int length = row_len;\nint k = 4; // fork\n")
    sh(fork, "commit", "-qam", "fork")
    d = tmp_path / "lock"
    d.mkdir()
    upstream.patch(d / "0001-worker.patch", "a", {"vllm/worker.py": PATCHED_WORKER}, "worker")
    upstream.patch(d / "0002-kernel.patch", "b", {"csrc/kernel.cuh": "int length = row_len;\nint k = 8;\n"}, "kernel")
    fork_pin = local_pin("fork", fork, sh(fork, "rev-parse", "HEAD"))
    lock = write_lock(d / "vllm.toml", {"up": git_pin("up", upstream), "fork": fork_pin},
                      {"main": ["0001-worker.patch", "0002-kernel.patch"]}, extra_top='default_pin = "up"')
    base = ("--lock", lock, "--pin", "fork", "--cache-dir", tmp_path / "c")
    tree = tmp_path / "t"
    assert cli("apply", *base, "--tree", tree, "--3way", "--no-build").rc == EXIT_UNEXPECTED
    start = sh(tree, "rev-parse", "HEAD")  # the base: nothing committed before 0001
    (tree / "vllm/worker.py").write_text(RESOLVED_WORKER)
    second = cli("resolve", "--continue", "--tree", tree, "--lock", lock, "--cache-dir", tmp_path / "c",
                 "--format", "json")
    assert second.rc == EXIT_UNEXPECTED, second.err
    assert json.loads(second.out)["workspace"]["patch"] == "0002-kernel.patch"
    assert sh(tree, "log", "--format=%s", "-1") == "worker"
    assert cli("resolve", "--abort", "--tree", tree).rc == 0
    assert sh(tree, "rev-parse", "HEAD") == start and _status(tree) == ""
    # The first resolution stays recorded: applying again stops at 0002 only.
    again = cli("apply", *base, "--tree", tree, "--3way", "--no-build", "--format", "json")
    assert json.loads(again.out)["workspace"]["patch"] == "0002-kernel.patch"
