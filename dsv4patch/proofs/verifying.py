"""Proving the patches: each patch's tests fail on the unpatched pin and pass once patched.

``dsv4patch verify`` and ``dsv4patch port --verify`` call :func:`verify`.

For every patch of the pin's series (same engine as check/apply):

* *before*: the unpatched pin plus only that patch's new test files
  (``git apply --include='tests/*'``);
* *after*: the pin with the whole series applied.

Both run the node ids the patch header lists under ``Test:``, in the cached
CPU test environment (testenv.py).  All patches' tests of one tree state run in
one pytest session (testrun.py): one *before* state (the unpatched pin plus
every patch's test files; a patch whose test files do not combine with the
others' gets its own) and one *after* state, so vLLM is imported twice per
run, not twice per patch.  A session's results are cached in the store by tree
id, node ids and venv contents; with nothing changed no work tree is checked
out and no test runs (``--no-cache`` runs them anyway).  A patch is *proven* when every test fails
(or errors) before and passes after.  A test that passes on both is a defect
of the test.  Tests that skip for lack of CUDA are reported as such, with the
GPU script that proves them (tests/gpu/).

For a patch that ``check`` finds already upstream, its tests run on the
unpatched pin: all passing confirms the fix is there.  Tests written against
the old pin's internals may not run on a newer one; they are then reported
(pass count, failure kinds) without failing the command, since the markers
decided.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4patch import git, report
from dsv4patch.errors import TreeError
from dsv4patch.pins import materialize
from dsv4patch.progress import Progress
from dsv4patch.proofs import testenv, testrun
from dsv4patch.records import frozen
from dsv4patch.series import run_series, series_for_pin

if TYPE_CHECKING:
    from dsv4patch.pins import Context, Pin, PinRepo
    from dsv4patch.series import Patch, Status
    from dsv4patch.store import Store

UPSTREAM_CONFIRMED = "upstream: tests pass unpatched"
UPSTREAM_PARTIAL = "upstream by markers; tests inconclusive"
SKIPPED = "skipped here"  # every test skipped on this machine (a GPU test): not proven here


@dataclass
class Outcome:
    """One patch's test results in one tree state."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    total: int = 0
    skip_reasons: tuple[str, ...] = ()
    failure_kinds: tuple[str, ...] = ()  # exception type per failing test

    def __str__(self) -> str:
        parts = [f"{n} {w}" for n, w in ((self.passed, "passed"), (self.failed, "failed"),
                                          (self.skipped, "skipped")) if n]
        return ", ".join(parts) or "no tests ran"


def verdict(before: Outcome, after: Outcome) -> str:
    if after.total == 0:
        return "no tests"
    if after.skipped == after.total:
        return SKIPPED
    if after.passed == after.total and before.failed == before.total and before.total == after.total:
        return "proven"
    return "NOT PROVEN"


@frozen
class PatchProof:
    """What verify found for one patch (``patches.<name>`` of the JSON output)."""

    patch: str
    tests: tuple[str, ...]
    before: str
    after: str
    where: str
    verdict: str
    status: str | None = None  # the engine's status, for a patch found upstream
    failure_kinds: tuple[str, ...] | None = None  # for a patch found upstream

    @property
    def ok(self) -> bool:
        return not self.verdict.startswith("NOT PROVEN")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tests": list(self.tests)}
        if self.status is not None:
            out["status"] = self.status
        out.update(before=self.before, after=self.after, where=self.where, verdict=self.verdict)
        if self.failure_kinds is not None:
            out["failure_kinds"] = list(self.failure_kinds)
        return out


@dataclass
class VerifyResult:
    """The proofs of one pin's patches, with where the time went."""

    pin: str
    patched_tree: str
    torch: str
    patches: list[PatchProof] = field(default_factory=list)
    sessions_run: int = 0
    sessions_cached: int = 0
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.patches)

    def summary(self) -> dict[str, Any]:
        """Counts by what was shown here: proven, failed, not proven here (with why), found
        upstream, without tests (``summary`` in the JSON; :meth:`summary_line` says it)."""
        groups: dict[str, list[str]] = {"proven": [], "failed": [], "not_proven_here": [], "upstream": [],
                                        "no_tests": []}
        why: list[str] = []
        for p in self.patches:
            key = ("proven" if p.verdict == "proven" else "failed" if not p.ok
                   else "no_tests" if p.verdict == "no tests" else "upstream" if p.status is not None
                   and p.verdict != SKIPPED else "not_proven_here")
            groups[key].append(p.patch)
            if key == "not_proven_here":
                why += [w for w in p.where.removeprefix("gpu only: ").split("; ") if w not in why]
        return {**{k: len(v) for k, v in groups.items()}, "not_proven_here_patches": groups["not_proven_here"],
                "why": why}

    def summary_line(self) -> str:
        """``verify PIN: 6 of 10 proven, 0 failed, 4 NOT PROVEN on this machine (0007-0010: ...)``:
        exit 0 says nothing failed, this line says what was not shown here."""
        s = self.summary()
        line = f"verify {self.pin}: {s['proven']} of {len(self.patches)} proven, {s['failed']} failed"
        if s["not_proven_here"]:
            line += (f", {s['not_proven_here']} NOT PROVEN on this machine "
                     f"({report.key_ranges(s['not_proven_here_patches'])}: their tests need a GPU here: "
                     + "; ".join(s["why"]) + "; docs/gpu-proofs.md proves them)")
        if s["upstream"]:
            line += f", {s['upstream']} already upstream"
        if s["no_tests"]:
            line += f", {s['no_tests']} without tests"
        return line

    def to_json(self) -> dict[str, Any]:
        return {"pin": self.pin, "patched_tree": self.patched_tree,
                "patches": {p.patch: p.to_json() for p in self.patches}, "ok": self.ok,
                "torch": self.torch, "sessions": {"run": self.sessions_run, "cached": self.sessions_cached},
                "phases": self.phases, "summary": self.summary(), "notes": [self.summary_line()]}

    def table(self) -> tuple[report.Table, str]:
        """The terminal table and its markdown."""
        return report.simple_table(
            f"dsv4patch verify: pin {self.pin} (torch {self.torch} CPU, TRITON_INTERPRET=1; "
            f"pytest sessions: {self.sessions_run} run, {self.sessions_cached} cached)",
            ["patch", "tests", "before", "after", "verdict"],
            [[p.patch, str(len(p.tests)), p.before, p.after,
              _shown(p.verdict) + ("" if p.where in ("cpu", "-") else f" ({_why(p.where)})")] for p in self.patches],
            legend=["tests: the test functions the patch's Test: lines name; before: their results on the "
                    "unpatched pin with only the patch's tests added; after: on the patched pin (counts "
                    "are test cases: a parametrized test counts once per case)"],
        )



def _shown(verdict: str) -> str:
    """A verdict in the table: a proof that did not run here never reads like one that did."""
    return "not proven here" if verdict == SKIPPED else verdict


def _why(where: str) -> str:
    return where.replace("gpu only: ", "needs a GPU: ", 1)


def verify(
    *,
    ctx: Context,
    pin: Pin,
    patches: Sequence[str] | None = None,
    torch: str | None = None,
    keep: bool = False,
    use_cache: bool = True,
) -> VerifyResult:
    """Run the tests of ``pin``'s series (``patches``: only those, by file name or NNNN prefix)
    before and after, in the CPU test venv (``torch``: its version, default the pin's).

    ``keep`` leaves the work trees in the cache; ``use_cache=False`` runs every session
    even when its results are cached.  Raises TreeError when the series does not apply.
    """
    lock, store, progress = ctx.lock, ctx.store, ctx.progress
    clock = _Phases()
    with clock("prepare"):
        pinrepo = materialize(pin, store, progress)
        series = series_for_pin(lock, pin)
        result = run_series(pinrepo.repo, pinrepo.base_commit, series)
    final = result.final_tree
    if final is None:
        raise TreeError(
            f"pin {pin.name}: the series does not apply, nothing to verify; run dsv4patch check"
        )
    chosen = [p for p in series.patches if _selected(p, patches)]
    status = {r.patch: r.status for r in result.patches}
    work = store.tmpdir(f"verify-{pin.name}-")
    try:
        with clock("venv"), progress.step(f"verify {pin.name}: the CPU test venv (torch {torch or 'of the pin'}; "
                                          f"made once, then cached; pip log: {work / 'pip.log'})"):
            env = testenv.ensure(_requirements(pinrepo.repo, final, work / "requirements"), store,
                                 torch, log=work / "pip.log")
        sessions = Sessions(store, env, pinrepo, work, use_cache=use_cache, progress=progress)
        with_tests = [p for p in chosen if p.tests]
        with clock("prepare"):
            states = _before_states(pinrepo, with_tests)
        applying = [p for p in with_tests if status[p.name].applies]
        with clock("tests"):
            before, after = _run_sessions(sessions, states, final, applying)
        proofs = [_verify_patch(patch, status[patch.name], before.get(patch.name), after.get(patch.name))
                  for patch in chosen]
    finally:
        if keep:
            store.keep_tmp(work)  # the run's exit would remove it
        else:
            _remove_work(pinrepo, work, store)
    return VerifyResult(pin.name, final, env.torch, proofs, sessions.ran, sessions.cached, clock.seconds)


def _run_sessions(sessions: Sessions, states: list[tuple[str, list[Patch]]], final: str,
                  applying: list[Patch]) -> tuple[dict[str, Outcome], dict[str, Outcome]]:
    """Every patch's tests before (on the tree its tests were added to, one session per tree) and after
    (on the patched tree, one session for all that apply); the outcomes by patch."""
    plan = [(tree_id, [n for p in group for n in p.tests]) for tree_id, group in states]
    if applying:
        plan.append((final, [n for p in applying for n in p.tests]))
    sessions.run_all(plan)
    before: dict[str, Outcome] = {}
    for tree_id, group in states:
        for patch in group:
            before[patch.name] = _outcome(sessions.results(tree_id, group, patch))
    after = {patch.name: _outcome(sessions.results(final, applying, patch)) for patch in applying}
    return before, after


def _remove_work(pinrepo: PinRepo, work: Path, store: Store) -> None:
    """The run's work trees (git worktrees of the cache's pin repository) and its directory."""
    for d in sorted(work.iterdir()) if work.exists() else []:
        if (d / ".git").exists():
            git.worktree_remove(pinrepo.repo, d)
    store.remove_tmp(work)


class _Phases:
    """Wall seconds per phase of the run (reported as ``phases`` in the JSON output)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.monotonic() - t0, 3)


def _requirements(repo: Path, treeish: str, dest: Path) -> Path:
    """The requirement files testenv reads, from git (no checkout needed to pick the venv)."""
    for name in ("common.txt", "cuda.txt"):
        res = git.run(repo, ["cat-file", "blob", f"{treeish}:requirements/{name}"], check=False)
        if res.ok:
            (dest / "requirements").mkdir(parents=True, exist_ok=True)
            (dest / "requirements" / name).write_text(res.stdout)
    return dest


def _before_states(pinrepo: PinRepo, patches: list[Patch]) -> list[tuple[str, list[Patch]]]:
    """Tree states for the *before* runs: the unpatched pin plus the test files of as many
    patches as combine (normally all, one state); a patch whose test files do not apply
    on top of the others' gets a state of its own."""
    alone: list[tuple[str, list[Patch]]] = []
    together: list[Patch] = []
    with git.scratch_index(pinrepo.repo, pinrepo.base_commit) as env:
        for patch in patches:
            if _apply_tests(pinrepo.repo, env, patch).ok:
                together.append(patch)
                continue
            with git.scratch_index(pinrepo.repo, pinrepo.base_commit) as own:
                res = _apply_tests(pinrepo.repo, own, patch)
                if not res.ok:
                    raise TreeError(f"{patch.name}: its test files do not apply to the unpatched pin: "
                                    f"{res.stderr}")
                alone.append((git.write_tree(pinrepo.repo, own), [patch]))
        combined = git.write_tree(pinrepo.repo, env)
    return ([(combined, together)] if together else []) + alone


def _apply_tests(repo: Path, env: dict[str, str], patch: Patch) -> git.Result:
    return git.run(repo, ["apply", "--cached", "--include=tests/*", str(patch.path)], env=env,
                   check=False)


class Sessions:
    """pytest sessions per tree state (one for all the patches that share it, from the
    results cache when nothing changed); work trees are checked out only for a run."""

    def __init__(self, store: Store, env: testenv.TestEnv, pinrepo: PinRepo, work: Path,
                 use_cache: bool, progress: Progress | None = None) -> None:
        self.store, self.env, self.pinrepo, self.work, self.use_cache = store, env, pinrepo, work, use_cache
        self.progress = progress or Progress(False)
        self.ran = 0
        self.cached = 0
        self._trees: dict[str, Path] = {}
        self._results: dict[tuple[str, tuple[str, ...]], list[testrun.TestResult]] = {}

    def checkout(self, tree_id: str) -> Path:
        if tree_id not in self._trees:
            dest = self.work / f"tree-{len(self._trees)}"
            commit = git.commit_tree(self.pinrepo.repo, tree_id, self.pinrepo.base_commit,
                                     "verify: tree state\n")
            git.worktree_add(self.pinrepo.repo, dest, commit)
            self._trees[tree_id] = dest
        return self._trees[tree_id]

    def session(self, tree_id: str, nodeids: list[str]) -> list[testrun.TestResult]:
        key = (tree_id, tuple(dict.fromkeys(nodeids)))
        if key not in self._results:
            self.run_all([(tree_id, nodeids)])
        return self._results[key]

    def run_all(self, plan: list[tuple[str, list[str]]]) -> None:
        """Look up every session of ``plan`` in the cache; run the others at the same time
        (each is one process that mostly waits on one core: vLLM's import, the Triton
        interpreter), after checking their trees out one by one."""
        todo: list[tuple[tuple[str, tuple[str, ...]], str, list[str], Path]] = []
        for tree_id, nodeids in plan:
            key = (tree_id, tuple(dict.fromkeys(nodeids)))
            if key in self._results or any(k == key for k, *_ in todo):
                continue
            hit = testrun.lookup(self.store, self.env, tree_id, nodeids) if self.use_cache else None
            if hit is not None:
                self._results[key] = hit
                self.cached += 1
            else:
                todo.append((key, tree_id, nodeids, self.checkout(tree_id)))
        if not todo:
            return
        tests = sum(len(nodeids) for _k, _t, nodeids, _c in todo)
        with self.progress.task(f"pytest: {len(todo)} session(s), {tests} test id(s) (CPU, TRITON_INTERPRET=1; "
                                f"output: {self.work}/session-*.jsonl.log)", len(todo), unit="sessions") as task, \
                ThreadPoolExecutor(max_workers=min(len(todo), max(2, os.cpu_count() or 2))) as pool:
            futures = [pool.submit(testrun.run_and_store, self.store, self.env, tree_id, nodeids, cwd,
                                   self.work / f"session-{self.ran + i}.jsonl")
                       for i, (_key, tree_id, nodeids, cwd) in enumerate(todo)]
            for (key, *_), fut in zip(todo, futures, strict=True):
                self._results[key] = fut.result()
                task.advance(1)
        self.ran += len(todo)

    def results(self, tree_id: str, group: list[Patch], patch: Patch) -> list[testrun.TestResult]:
        """``patch``'s results from the session of ``group`` on ``tree_id``; if that session
        says nothing about them (pytest stopped early), from a session of its own."""
        found = testrun.select(self.session(tree_id, [n for p in group for n in p.tests]), patch.tests)
        if not found and len(group) > 1:
            found = testrun.select(self.session(tree_id, patch.tests), patch.tests)
        return found


def _outcome(results: list[testrun.TestResult]) -> Outcome:
    out = Outcome()
    reasons = []
    kinds = []
    for r in results:
        out.total += 1
        if r.outcome == "failed":
            out.failed += 1
            msg = r.message.strip()
            kinds.append("assert" if msg.startswith(("assert", "AssertionError")) else
                         msg.split(":", 1)[0][:40] or "error")
        elif r.outcome == "skipped":
            out.skipped += 1
            reasons.append(r.message)
        else:
            out.passed += 1
    out.skip_reasons = tuple(sorted(set(reasons)))
    out.failure_kinds = tuple(kinds)
    return out


def _selected(p: Patch, wanted: Sequence[str] | None) -> bool:
    return not wanted or any(p.name == w or p.name.startswith(w) for w in wanted)


def _verify_patch(
    patch: Patch,
    status: Status,
    before: Outcome | None,
    after: Outcome | None,
) -> PatchProof:
    if not patch.tests:
        return PatchProof(patch.name, (), "-", "-", "-", "no tests")
    tests = tuple(patch.tests)
    before = before or Outcome()
    if not status.applies:
        # Found upstream by check: the strongest signal is the patch's own tests
        # passing on the unpatched pin (the fix is present).
        if before.total and before.passed == before.total:
            v = UPSTREAM_CONFIRMED
        elif before.total and before.skipped == before.total:
            v = SKIPPED
        else:
            # Tests written against the old pin's internals may not run on a newer
            # one (changed signatures, fakes that no longer reach the code): the
            # markers decided, the tests are reported as they are.
            counts: dict[str, int] = {}
            for k in before.failure_kinds:
                counts[k] = counts.get(k, 0) + 1
            kinds = ", ".join(f"{k} x{n}" for k, n in sorted(counts.items()))
            v = f"{UPSTREAM_PARTIAL}: {before.passed}/{before.total} pass; failures: {kinds}"
        return PatchProof(patch.name, tests, str(before), "-", "cpu (unpatched pin)", v,
                          status=status.value, failure_kinds=before.failure_kinds)
    after = after or Outcome()
    v = verdict(before, after)
    where = "cpu" if v != SKIPPED else "gpu only: " + "; ".join(after.skip_reasons)[:80]
    return PatchProof(patch.name, tests, str(before), str(after), where, v)
