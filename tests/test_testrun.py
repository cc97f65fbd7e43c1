"""One pytest session for several patches' tests, and its results cache (testrun.py).

Real pytest in the real CPU test venv (the one verify uses) on a small tree of
test files: every outcome is mapped back to the node ids that asked for it,
one file that cannot be imported does not hide the others, and the cache is
reused only when the tree, the node ids and the venv's contents all match.
"""

from __future__ import annotations

import dataclasses
import shutil
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import sh
from dsv4patch.pins.repository import PinRepo
from dsv4patch.proofs import testenv, testrun, verifying
from dsv4patch.store import Store

pytestmark = [pytest.mark.network, pytest.mark.slow]

FILES = {
    "tests/test_a.py": """\
        import pytest

        def test_pass():
            assert 1 + 1 == 2

        def test_fail():
            assert 1 + 1 == 3

        @pytest.mark.skip(reason="needs a GPU")
        def test_skip():
            pass

        @pytest.mark.parametrize("n", [1, 2])
        def test_param(n):
            assert n == 1
        """,
    "tests/test_b.py": "from nowhere import missing\n\ndef test_never():\n    pass\n",
    "tests/test_c.py": "def test_other():\n    raise KeyError('k')\n",
}
A_IDS = ["tests/test_a.py::test_pass", "tests/test_a.py::test_fail", "tests/test_a.py::test_skip",
         "tests/test_a.py::test_param"]
B_IDS = ["tests/test_b.py::test_never"]
C_IDS = ["tests/test_c.py::test_other"]


@pytest.fixture(scope="module")
def env(cpu_testenv: testenv.TestEnv) -> testenv.TestEnv:
    return cpu_testenv


def _tree(root: Path) -> Path:
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return root


def test_one_session_serves_every_patch(env: testenv.TestEnv, tmp_path: Path) -> None:
    rc, results = testrun.run_session(env, _tree(tmp_path / "t"), A_IDS + C_IDS, tmp_path / "r.jsonl")
    assert rc == 1
    got = {r.nodeid: r.outcome for r in testrun.select(results, A_IDS)}
    assert got == {"tests/test_a.py::test_pass": "passed", "tests/test_a.py::test_fail": "failed",
                   "tests/test_a.py::test_skip": "skipped", "tests/test_a.py::test_param[1]": "passed",
                   "tests/test_a.py::test_param[2]": "failed"}
    skip = next(r for r in results if r.nodeid.endswith("test_skip"))
    assert skip.message == "needs a GPU"
    fail = next(r for r in results if r.nodeid.endswith("test_fail"))
    assert fail.message.startswith("assert")
    other = testrun.select(results, C_IDS)
    assert [(r.outcome, r.message.split(":")[0]) for r in other] == [("failed", "KeyError")]


def test_a_file_that_cannot_be_imported_does_not_hide_the_others(env: testenv.TestEnv, tmp_path: Path) -> None:
    """pytest would stop a session whose named test sits in a file that cannot be imported (exit 4,
    'found no collectors'); the session names the files and the plugin picks the node ids, so that
    file is one failure for its patch, the other patches' tests run in the same session, and the
    complete session is cached."""
    src = _tree(tmp_path / "src")
    sh(src, "init", "-q")
    sh(src, "add", "-A")
    sh(src, "commit", "-qm", "tests")
    # a pin repository as the cache keeps one: bare (dsv4patch's own; git runs in no work tree of a user's)
    repo = tmp_path / "repo.git"
    sh(tmp_path, "clone", "-q", "--bare", str(src), str(repo))
    commit = sh(repo, "rev-parse", "HEAD")
    tree_id = sh(repo, "rev-parse", "HEAD^{tree}")
    pinrepo = PinRepo(pin=None, repo=repo, base_commit=commit, base_tree=tree_id)  # type: ignore[arg-type]
    work = tmp_path / "work"
    work.mkdir()
    store = Store.open(tmp_path / "store")
    sessions = verifying.Sessions(store, env, pinrepo, work, use_cache=True)
    patches = [SimpleNamespace(tests=ids) for ids in (A_IDS, B_IDS, C_IDS)]
    out = [sessions.results(tree_id, patches, p) for p in patches]  # type: ignore[arg-type]
    assert len(out[0]) == 5 and {r.outcome for r in out[0]} == {"passed", "failed", "skipped"}
    assert [(r.nodeid, r.outcome) for r in out[1]] == [("tests/test_b.py", "failed")]
    assert [r.outcome for r in out[2]] == ["failed"]
    assert sessions.ran == 1  # all together, none again alone
    assert len(list((store.root / "verify-results").glob("*.json"))) == 1


def test_results_cache_is_reused_only_when_every_input_matches(
        env: testenv.TestEnv, tmp_path: Path) -> None:
    store = Store.open(tmp_path / "store")
    tree = _tree(tmp_path / "t")
    calls: list[str] = []

    def session(tree_id: str, ids: list[str], e: testenv.TestEnv = env) -> bool:
        def checkout() -> Path:
            calls.append(tree_id)
            return tree
        _res, hit = testrun.cached_session(store, e, tree_id, ids, checkout, tmp_path / "r.jsonl")
        return hit

    assert not session("1" * 40, A_IDS)
    assert session("1" * 40, A_IDS)
    assert session("1" * 40, list(reversed(A_IDS)) + A_IDS[:1])  # order and repeats do not matter
    assert calls == ["1" * 40]  # a hit never checks a tree out
    # Each input in turn: another tree (other test files), other node ids, another venv.
    assert not session("2" * 40, A_IDS)
    assert not session("1" * 40, A_IDS[:2])
    fake = tmp_path / "venv"
    site = fake / "lib" / "python3.12" / "site-packages"
    shutil.copytree(env.python.parent.parent / "lib", fake / "lib", symlinks=True,
                    ignore=lambda d, names: [n for n in names if not n.endswith(".dist-info")
                                             and d.endswith("site-packages")])
    other = dataclasses.replace(env, python=fake / "bin" / "python")
    key = testrun.session_key("1" * 40, A_IDS, other)
    assert key == testrun.session_key("1" * 40, A_IDS, env)  # same packages, same key
    next(site.parent.parent.glob("python*/site-packages")).joinpath("extra_pkg-1.0.dist-info").mkdir()
    assert testrun.session_key("1" * 40, A_IDS, other) != key  # a package more: another key
    assert testrun.session_key("1" * 40, A_IDS, dataclasses.replace(env, torch="0.0")) != key
    # A session that ran no test (a node id that names none: pytest exit 5) is not cached.
    assert not session("3" * 40, ["tests/test_a.py::no_such_test"])
    assert not session("3" * 40, ["tests/test_a.py::no_such_test"])


FREEZE_FILES = {
    # vLLM's tests/conftest.py ends every test so: cleanup_dist_env_and_memory() unfreezes, then collects.
    "tests/conftest.py": """\
        import gc

        import pytest

        @pytest.fixture(autouse=True)
        def cleanup():
            yield
            gc.unfreeze()
            gc.collect()
        """,
    "tests/test_gc.py": """\
        import gc
        import weakref

        class Node:
            pass

        REFS = []
        IMPORTED_WITH_THE_COLLECTOR_ON = gc.isenabled()

        def test_0_imported_without_the_collector_then_it_is_on():
            assert not IMPORTED_WITH_THE_COLLECTOR_ON
            assert gc.isenabled()

        def test_1_the_imported_heap_is_frozen():
            assert gc.get_freeze_count() > 1000

        def test_2_a_cycle_a_test_drops():
            n = Node()
            n.me = n
            REFS.append(weakref.ref(n))

        def test_3_is_collected_by_the_cleanup_after_it():
            assert REFS[0]() is None
            assert gc.get_freeze_count() > 1000  # the cleanup's unfreeze left the heap frozen

        def test_4_a_test_that_freezes():
            gc.freeze()

        def test_5_gets_the_real_unfreeze():
            assert gc.get_freeze_count() == 0
        """,
}


def test_the_plugin_freezes_the_imported_heap_and_the_cleanup_still_collects(
        env: testenv.TestEnv, tmp_path: Path) -> None:
    """On a CPU-only host the test modules are imported with the cyclic collector off, and it is on for the
    tests; the plugin freezes the heap once the test modules are imported, so the full
    gc.collect() after every test (vLLM's cleanup) scans only what the tests made: a cycle a test drops
    is still collected by the cleanup after it, and once a test freezes objects itself vLLM's unfreeze
    is real again."""
    root = tmp_path / "t"
    for rel, text in FREEZE_FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    ids = [f"tests/test_gc.py::{name}" for name in (
        "test_0_imported_without_the_collector_then_it_is_on", "test_1_the_imported_heap_is_frozen", "test_2_a_cycle_a_test_drops",
        "test_3_is_collected_by_the_cleanup_after_it", "test_4_a_test_that_freezes",
        "test_5_gets_the_real_unfreeze")]
    rc, results = testrun.run_session(env, root, ids, tmp_path / "r.jsonl")
    assert rc == 0 and [(r.nodeid, r.outcome) for r in results] == [(i, "passed") for i in ids], results
