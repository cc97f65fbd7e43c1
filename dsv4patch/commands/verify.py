"""``dsv4patch verify``: prove each patch's tests fail before and pass after.

For every patch of the pin's series (same engine as check/apply):

* *before*: the unpatched pin plus only that patch's new test files
  (``git apply --include='tests/*'``);
* *after*: the pin with the whole series applied.

Both run the node ids the patch header lists under ``Test:``, in the cached
CPU test environment (testenv.py).  A patch is *proven* when every test fails
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

import argparse
import shutil
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsv4patch import engine, git, report, testenv, tree, upstream_tests
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK, EXIT_UNEXPECTED, TreeError
from dsv4patch.series import Patch, series_for_pin

UPSTREAM_CONFIRMED = "upstream: tests pass unpatched"
UPSTREAM_PARTIAL = "upstream by markers; tests inconclusive"
HELP = "prove each patch's regression tests fail on the unpatched pin and pass once patched"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("verify", help=HELP, description=HELP)
    _common.add_lock(p, many=False)
    p.add_argument("--patch", action="append", help="only these patches (file name or NNNN prefix)")
    p.add_argument("--torch", default=None, help="torch version for the test venv (default: the pin's)")
    p.add_argument("--keep", action="store_true", help="keep the before/after work trees")
    upstream_tests.add_arguments(p)
    _common.add_output(p, markdown=True)
    _common.add_cache(p)


@dataclass
class Outcome:
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


def run_tests(env: testenv.TestEnv, cwd: Path, nodeids: list[str], xml: Path) -> Outcome:
    cmd = env.pytest_args() + ["-q", "--junitxml", str(xml), "-o", "junit_family=xunit1", *nodeids]
    subprocess.run(cmd, cwd=cwd, env=env.env(), capture_output=True, text=True)
    if not xml.exists():
        return Outcome()
    out = Outcome()
    reasons = []
    kinds = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        out.total += 1
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            out.failed += 1
            msg = (bad.get("message") or "").strip()
            kinds.append("assert" if msg.startswith(("assert", "AssertionError")) else
                         msg.split(":", 1)[0][:40] or "error")
        elif case.find("skipped") is not None:
            out.skipped += 1
            reasons.append(case.find("skipped").get("message", ""))  # type: ignore[union-attr]
        else:
            out.passed += 1
    out.skip_reasons = tuple(sorted(set(reasons)))
    out.failure_kinds = tuple(kinds)
    return out


def verdict(before: Outcome, after: Outcome) -> str:
    if after.total == 0:
        return "no tests"
    if after.skipped == after.total:
        return "skipped here"
    if after.passed == after.total and before.failed == before.total and before.total == after.total:
        return "proven"
    return "NOT PROVEN"


def run(args: argparse.Namespace) -> int:
    if args.upstream_tests:
        return upstream_tests.command(args)
    lock = _common.open_lock(args)
    pin = lock.pin(args.pin)
    store = _common.open_store(args)
    prog = _common.progress(args)
    pinrepo = tree.materialize(pin, store, prog)
    series = series_for_pin(lock, pin)
    result = engine.run_series(pinrepo.repo, pinrepo.base_commit, series)
    final = result.final_tree
    if final is None:
        raise TreeError(
            f"pin {pin.name}: the series does not apply, nothing to verify; run dsv4patch check"
        )
    patches = [p for p in series.patches if _selected(p, args.patch)]
    status = {r.patch: r.status for r in result.patches}
    work = store.tmpdir(f"verify-{pin.name}-")
    rows: list[list[str]] = []
    out: dict[str, Any] = {"pin": pin.name, "patched_tree": final, "patches": {}, "ok": True}
    try:
        after_dir = work / "after"
        after_commit = git.commit_tree(pinrepo.repo, final, pinrepo.base_commit, "verify: patched\n")
        git.worktree_add(pinrepo.repo, after_dir, after_commit)
        env = testenv.ensure(after_dir, store, args.torch, log=work / "pip.log")
        for patch in patches:
            entry = _verify_patch(pinrepo, patch, status[patch.name], env, work, after_dir)
            out["patches"][patch.name] = entry
            out["ok"] &= not entry["verdict"].startswith("NOT PROVEN")
            rows.append([patch.name, str(len(patch.tests)), entry["before"], entry["after"],
                         entry["where"], entry["verdict"]])
    finally:
        if not args.keep:
            for d in sorted(work.iterdir()) if work.exists() else []:
                if (d / ".git").exists():
                    git.worktree_remove(pinrepo.repo, d)
            shutil.rmtree(work, ignore_errors=True)
    out["torch"] = env.torch
    table, md = report.simple_table(
        f"dsv4patch verify: pin {pin.name} (torch {env.torch} CPU, TRITON_INTERPRET=1)",
        ["patch", "tests", "before (unpatched)", "after (patched)", "where", "verdict"], rows,
    )
    report.emit(args.format, out, table, md)
    return EXIT_OK if out["ok"] else EXIT_UNEXPECTED


def _selected(p: Patch, wanted: list[str] | None) -> bool:
    return not wanted or any(p.name == w or p.name.startswith(w) for w in wanted)


def _verify_patch(
    pinrepo: tree.PinRepo,
    patch: Patch,
    status: engine.Status,
    env: testenv.TestEnv,
    work: Path,
    after_dir: Path,
) -> dict[str, Any]:
    stem = patch.name.split("-", 1)[0]
    if not patch.tests:
        return {"tests": [], "before": "-", "after": "-", "where": "-", "verdict": "no tests"}
    before_dir = work / f"before-{stem}"
    git.worktree_add(pinrepo.repo, before_dir, pinrepo.base_commit)
    res = git.run(before_dir, ["apply", "--include=tests/*", str(patch.path)], check=False)
    if not res.ok:
        raise TreeError(f"{patch.name}: its test files do not apply to the unpatched pin: {res.stderr}")
    before = run_tests(env, before_dir, patch.tests, work / f"{stem}-before.xml")
    git.worktree_remove(pinrepo.repo, before_dir)
    if not status.applies:
        # Found upstream by check: the strongest signal is the patch's own tests
        # passing on the unpatched pin (the fix is present).
        if before.total and before.passed == before.total:
            v = UPSTREAM_CONFIRMED
        elif before.total and before.skipped == before.total:
            v = "skipped here"
        else:
            # Tests written against the old pin's internals may not run on a newer
            # one (changed signatures, fakes that no longer reach the code): the
            # markers decided, the tests are reported as they are.
            counts: dict[str, int] = {}
            for k in before.failure_kinds:
                counts[k] = counts.get(k, 0) + 1
            kinds = ", ".join(f"{k} x{n}" for k, n in sorted(counts.items()))
            v = f"{UPSTREAM_PARTIAL}: {before.passed}/{before.total} pass; failures: {kinds}"
        return {"tests": patch.tests, "status": status.value, "before": str(before),
                "after": "-", "where": "cpu (unpatched pin)", "verdict": v,
                "failure_kinds": list(before.failure_kinds)}
    after = run_tests(env, after_dir, patch.tests, work / f"{stem}-after.xml")
    v = verdict(before, after)
    where = "cpu" if v != "skipped here" else "gpu only: " + "; ".join(after.skip_reasons)[:80]
    return {"tests": patch.tests, "before": str(before), "after": str(after), "where": where,
            "verdict": v}
