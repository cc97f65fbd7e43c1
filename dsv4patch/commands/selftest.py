"""``dsv4patch selftest``: prove the vLLM installed here, on this node's GPU, offline.

Parses the options, calls :func:`dsv4patch.selftest.runner.run_selftest` and
renders its report (a table, or ``--format json``).  What is checked and why
the oracle is exact: :mod:`dsv4patch.selftest` and docs/selftest.md.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from dsv4patch import report
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK, EXIT_UNEXPECTED, UsageError

HELP = ("run the installed vLLM's own check on this machine: installed files, the series' regression "
        "tests, and a tiny DeepSeek-V4 whose greedy output is known exactly (plain, MTP 1-3, DSpark)")
DESCRIPTION = HELP + """.

Cases: `installed` (what `status --installed` checks), `regression` (the series'
tests against the installed package; kernel tests only with a GPU), and one case
per engine and prompt set, ENGINE/SET, with engines plain, mtp1, mtp2, mtp3,
dspark5 (and mtp1-sm120topk with --force-sm120-topk) and prompt sets short_b5,
mid_b24, long_b3, short_b1, long_b1.  Verdicts: pass, differs (first request,
position, expected and generated token), hang, crash (the error), refused
(DSpark refused by the platform, with vLLM's message), inconclusive (drafts all
accepted or all rejected), not-run.  Exit 0 only when every selected case passes
(or is refused by the platform); 1 when any fails or did not run."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("selftest", help=HELP, description=DESCRIPTION)
    p.add_argument("--python", default=None,
                   help="interpreter of the environment whose vLLM is checked (default: $DSV4PATCH_VLLM_PYTHON, "
                        "else this one)")
    p.add_argument("--cases", action="append", default=None, metavar="CASE",
                   help="run only these (repeatable or comma-separated): installed, regression, ENGINE, "
                        "ENGINE/SET or */SET (default: all); --list shows them")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--force-sm120-topk", action="store_true",
                   help="DIAGNOSTIC: add the mtp1-sm120topk engine, whose indexer takes the decode top-k route "
                        "vLLM uses on SM120 GPUs (reaches fix 6/7's hang on any GPU)")
    p.add_argument("--deadline", type=float, default=1800.0, metavar="S",
                   help="seconds for the whole run; engines not finished by then are not-run (default: %(default)s)")
    p.add_argument("--start-deadline", type=float, default=420.0, metavar="S",
                   help="an engine's start (a cold node JIT-compiles kernels; default: %(default)s)")
    p.add_argument("--case-deadline", type=float, default=120.0, metavar="S",
                   help="one prompt set; the first gets twice this (default: %(default)s)")
    p.add_argument("--parallel", type=int, default=1, metavar="N",
                   help="engines at once on the GPU (each takes --kv-cache-gib; default: %(default)s)")
    p.add_argument("--kv-cache-gib", type=float, default=6.0, help="KV cache per engine (default: %(default)s)")
    p.add_argument("--work", type=Path, default=None,
                   help="directory for the tiny model, the engines' logs and events (default: a new temporary one, "
                        "kept and named in the report)")
    _common.add_lock(p, many=False, series=False)
    _common.add_output(p)
    _common.add_cache(p)


def _patterns(values: list[str] | None) -> list[str] | None:
    if values is None:
        return None
    out = [v.strip() for item in values for v in item.split(",") if v.strip()]
    return out or None


def run(args: argparse.Namespace) -> int:
    from dsv4patch.selftest import cases as casemod
    from dsv4patch.selftest import runner

    if args.parallel < 1:
        raise UsageError("--parallel must be at least 1")
    for opt, value in (("deadline", args.deadline), ("start-deadline", args.start_deadline),
                       ("case-deadline", args.case_deadline), ("kv-cache-gib", args.kv_cache_gib)):
        if value <= 0:
            raise UsageError(f"--{opt} must be positive")
    patterns = _patterns(args.cases)
    every = casemod.all_cases(force_sm120_topk=args.force_sm120_topk)
    if args.list:
        names = list(runner.CHECK_NAMES) + [c.name for c in every]
        if args.format == "json":
            report.emit(args.format, {"cases": names, "notes": []}, None, None)
        else:
            print("\n".join(names))
        return EXIT_OK
    checks = tuple(runner.CHECK_NAMES) if patterns is None else tuple(n for n in runner.CHECK_NAMES if n in patterns)
    engine_patterns = None if patterns is None else [p for p in patterns if p not in runner.CHECK_NAMES]
    chosen = every if engine_patterns is None else (casemod.select(every, engine_patterns) if engine_patterns else [])
    lock = _common.open_lock(args) if checks else None
    store = _common.open_store(args) if checks else None
    work = args.work or Path(tempfile.mkdtemp(prefix="dsv4patch-selftest-"))
    deadlines = runner.Deadlines(start=args.start_deadline, first_case=2 * args.case_deadline,
                                 case=args.case_deadline, total=args.deadline)
    rep = runner.run_selftest(lock=lock, pin=args.pin, python=runner.python_of(args.python), store=store,
                              progress=_common.progress(args), checks=checks, cases=chosen, work=work,
                              deadlines=deadlines, parallel=args.parallel, force_sm120_topk=args.force_sm120_topk,
                              kv_cache_gib=args.kv_cache_gib)
    out = rep.to_json()
    out["work"] = str(work)
    rows = [[c.name, "pass" if c.ok else ("not run" if c.ok is None else "FAIL"), c.note] for c in rep.checks]
    for c in rep.cases:
        acc = "" if c.acceptance is None else f"{c.acceptance.accepted}/{c.acceptance.drafted}"
        if c.acceptance is not None and c.acceptance.rate is not None:
            acc += f" ({c.acceptance.rate:.0%})"
        gap_text = "" if c.min_gap is None else f"gap {c.min_gap:.2f}"
        rows.append([c.case, c.verdict, "; ".join(x for x in (c.error, gap_text, acc and f"accepted {acc}") if x)])
    counts = rep.counts()
    gap = rep.min_gap()
    out["notes"] = [
        f"python {rep.python}; GPU: {'yes' if rep.gpu else 'no'}"
        + ("; DIAGNOSTIC: SM120 top-k route forced (mtp1-sm120topk)" if rep.force_sm120_topk else ""),
        "cases: " + ", ".join(f"{v} {n}" for v, n in counts.items() if n),
        "smallest top-1/top-2 logit gap: " + ("none measured" if gap is None else f"{gap:.3f} nats"),
        f"logs and events: {work}",
        "every selected case passed" if rep.ok else "SELFTEST FAILED",
    ]
    table, md = report.simple_table(f"dsv4patch selftest: {rep.python}", ["case", "verdict", "detail"], rows)
    report.emit(args.format, out, table, md)
    return EXIT_OK if rep.ok else EXIT_UNEXPECTED
