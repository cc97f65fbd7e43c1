"""One pytest session per tree state, with its results cached in the store.

``verify`` used to start pytest twice per patch, and most of that time was
vLLM's import and pytest's start-up, not the tests.  Here every patch whose
tests run on the same tree state shares one session: their files are passed at
once, and the CPU plugin (cpu_pytest_plugin.py) runs just their node ids
(``--continue-on-collection-errors``: one test file that cannot be imported is a
collection error beside the others' results) and writes one JSON line per report,
mapped back to each patch by node id.

A session's results are a function of the tree it runs on (a git tree id,
which covers the test files), the node ids, the test venv (its packages,
listed from the dist-info directories), the plugin and the environment
testenv sets; they are stored under ``verify-results/<sha256 of all that>.json``
in the store and reused when every input matches.  Only complete sessions
(pytest exit 0 or 1) are cached.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dsv4patch import __version__, childproc, safeio
from dsv4patch.errors import BuildError
from dsv4patch.proofs import testenv
from dsv4patch.records import frozen

if TYPE_CHECKING:
    from dsv4patch.store import Store

SCHEMA = "testrun-v2"  # v2: files on the command line, the node ids chosen by the plugin
# pytest exit codes of a session that ran to the end (all passed / some failed).
COMPLETE = (0, 1)
SESSION_DEADLINE = 3 * 3600.0  # seconds one pytest session may take (CPU, Triton interpreted); then it is ended
RESULTS_LIMIT = 256 << 20  # bytes of the plugin's results file read back


@frozen
class TestResult:
    nodeid: str
    outcome: str  # "passed", "failed" or "skipped"
    message: str = ""  # first failure message, or the skip reason


def venv_fingerprint(env: testenv.TestEnv) -> str:
    """What is installed in the test venv: the sorted ``name-version.dist-info`` names."""
    root = env.python.parent.parent
    names = sorted(p.name for p in root.glob("lib/python*/site-packages/*.dist-info"))
    return hashlib.sha256("\n".join([env.torch, *names]).encode()).hexdigest()


def session_key(tree_id: str, nodeids: list[str], env: testenv.TestEnv) -> str:
    plugin = Path(testenv.__file__).with_name("cpu_pytest_plugin.py").read_bytes()
    settings = {k: v for k, v in env.env().items()
                if k in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "VLLM_LOGGING_LEVEL")}
    src = json.dumps({
        "schema": SCHEMA, "dsv4patch": __version__, "tree": tree_id,
        "nodeids": sorted(set(nodeids)), "venv": venv_fingerprint(env),
        "plugin": hashlib.sha256(plugin).hexdigest(), "env": settings,
        "args": env.pytest_args()[1:],
    }, sort_keys=True)
    return hashlib.sha256(src.encode()).hexdigest()


def run_session(env: testenv.TestEnv, cwd: Path, nodeids: list[str], results: Path) -> tuple[int, list[TestResult]]:
    """Run ``nodeids`` in one pytest session in ``cwd``; pytest's exit code and the results.

    pytest is given the node ids' files and the CPU plugin runs only the node ids
    (``$DSV4PATCH_SELECT``): a file that cannot be imported is one collection error
    beside the other files' results, where named node ids would end the session with
    nothing run ("found no collectors", exit 4)."""
    results.unlink(missing_ok=True)
    select = results.with_name(results.name + ".select")
    select.write_text("".join(f"{n}\n" for n in dict.fromkeys(nodeids)), encoding="utf-8")
    files = dict.fromkeys(n.split("::", 1)[0] for n in nodeids)
    cmd = env.pytest_args() + ["-q", "--continue-on-collection-errors", *files]
    run_env = env.env()
    run_env["DSV4PATCH_RESULTS"] = str(results)
    run_env["DSV4PATCH_SELECT"] = str(select)
    proc = childproc.run(cmd, cwd=cwd, env=run_env, deadline=SESSION_DEADLINE, what="the pytest session",
                         output=results.with_name(results.name + ".log"))
    # A session a signal ended is not complete (and is never cached): -1.
    return (proc.returncode if proc.returncode is not None else -1), _read(results)


def _read(path: Path) -> list[TestResult]:
    """Per test: failed if any phase failed, else skipped if a phase skipped, else passed."""
    merged: dict[str, TestResult] = {}
    if not os.path.lexists(path):
        return []
    text = safeio.read_bytes(path, RESULTS_LIMIT, error=BuildError, what="the pytest session's results")
    for line in text.decode("utf-8", errors="replace").splitlines():
        rec = safeio.loads_json(line, label=f"{path}: a result line", error=BuildError)
        if not (isinstance(rec, dict) and isinstance(rec.get("nodeid"), str) and isinstance(rec.get("outcome"), str)):
            raise BuildError(f"{path}: a result line is not what the CPU pytest plugin writes: {line[:200]!r}")
        nodeid, outcome = rec["nodeid"], rec["outcome"]
        prev = merged.get(nodeid)
        if outcome == "failed":
            if prev is None or prev.outcome != "failed":
                merged[nodeid] = TestResult(nodeid, "failed", str(rec.get("message", "")))
        elif outcome == "skipped":
            if prev is None or prev.outcome == "passed":
                merged[nodeid] = TestResult(nodeid, "skipped", str(rec.get("reason", "")))
        elif rec.get("when") == "call" and prev is None:
            merged[nodeid] = TestResult(nodeid, "passed")
    return list(merged.values())


def _entry(store: Store, key: str) -> Path:
    return store.root / "verify-results" / f"{key}.json"


def lookup(store: Store, env: testenv.TestEnv, tree_id: str, nodeids: list[str]) -> list[TestResult] | None:
    """The cached results of this session, or None."""
    entry = _entry(store, session_key(tree_id, nodeids, env))
    if not os.path.lexists(entry):
        return None
    try:  # no link, no FIFO, bounded: a damaged or planted entry is recomputed and replaced
        data = safeio.read_json(entry, RESULTS_LIMIT)
        return [TestResult(**r) for r in data["results"]]
    except (safeio.UnsafeFileError, OSError, ValueError, KeyError, TypeError):
        return None


def run_and_store(store: Store, env: testenv.TestEnv, tree_id: str, nodeids: list[str], cwd: Path,
                  results: Path) -> list[TestResult]:
    """Run the session in ``cwd`` (a checkout of ``tree_id``) and cache complete results."""
    rc, found = run_session(env, cwd, nodeids, results)
    if rc in COMPLETE and found:
        entry = _entry(store, session_key(tree_id, nodeids, env))
        store.subdir("verify-results")
        safeio.atomic_write(entry, json.dumps({"tree": tree_id, "nodeids": sorted(set(nodeids)), "rc": rc,
                                               "results": [r.__dict__ for r in found]}, indent=1), durable=False)
    return found


def cached_session(
    store: Store,
    env: testenv.TestEnv,
    tree_id: str,
    nodeids: list[str],
    checkout: Callable[[], Path],
    results: Path,
    use_cache: bool = True,
) -> tuple[list[TestResult], bool]:
    """The session's results, from the cache when every input matches (then ``checkout``
    is never called), else from a run in the directory ``checkout()`` returns.
    Returns the results and whether they came from the cache."""
    hit = lookup(store, env, tree_id, nodeids) if use_cache else None
    if hit is not None:
        return hit, True
    return run_and_store(store, env, tree_id, nodeids, checkout(), results), False


def select(results: list[TestResult], wanted: list[str]) -> list[TestResult]:
    """The results that belong to the node ids ``wanted`` (a patch's ``Test:`` lines): the
    tests themselves (parametrized ids included), or their file's collection error."""
    out: dict[str, TestResult] = {}
    for w in wanted:
        hit = [r for r in results if r.nodeid == w or r.nodeid.startswith((w + "[", w + "::"))]
        if not hit:
            file = w.split("::", 1)[0]
            hit = [r for r in results if r.nodeid == file and r.outcome == "failed"]
        for r in hit:
            out.setdefault(r.nodeid, r)
    return list(out.values())
