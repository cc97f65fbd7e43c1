"""``dsv4patch selftest``: prove the vLLM installed here, on this node's GPU, offline.

Parses the options, calls :func:`dsv4patch.proofs.selftest.runner.run_selftest` and
renders its report (a table, or ``--format json``).  What is checked and why
the oracle is exact: :mod:`dsv4patch.proofs.selftest` and docs/selftest.md.
"""

from __future__ import annotations

import argparse
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from dsv4patch import report
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK, EXIT_UNEXPECTED, ParameterError, UsageError

HELP = ("run the installed vLLM's own check on this machine: installed files, the series' regression "
        "tests, and a tiny DeepSeek-V4 whose greedy output is known exactly (plain, MTP 1-3, DSpark)")
DESCRIPTION = HELP + """.

Cases: `installed` (what `status --installed` checks), `regression` (the series'
tests against the installed package, each file in its own process: on the GPU
when there is one, else on CPU under Triton's interpreter), and one case
per engine and prompt set, ENGINE/SET, with engines plain, mtp1, mtp2, mtp3,
dspark5 (and mtp1-sm120topk with --force-sm120-topk) and prompt sets short_b5,
mid_b24, long_b3, short_b1, long_b1.  Verdicts: pass, differs (first request,
position, expected and generated token), null-block (DSpark's draft wrote KV
into the KV pool's null block: fix 3b's debug check), hang, crash (the error), refused
(DSpark refused by the platform, or a draft under pipeline parallelism, with
vLLM's message), inconclusive (drafts all
accepted or all rejected), not-run, needs-gpu (no CUDA device here: the engine
cases are listed at once, the checks still run).  Engines are sized from the
GPU's free memory and started one first (it fills the JIT caches), then the
rest at once; --tensor-parallel-size N and --pipeline-parallel-size M spread
every engine over N x M GPUs as a node serves (the report says the topology
each engine ran; a node that sees fewer GPUs is refused with exit 2, nothing
started); a hang is probed (Python stacks, py-spy, nvidia-smi, cuda-gdb when
present) before its engine is killed.  Exit 0 when nothing failed (a case
refused by the platform, or needing a GPU this node lacks, is not a failure: the
summary line says what was not proven here); 1 when any check or case failed or
did not run; 2 for a bad command line, an --python that cannot be run, or
fewer GPUs than the topology asks for."""


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
    p.add_argument("--deadline", type=_seconds, default=1800.0, metavar="S",
                   help="seconds for the whole run; engines not finished by then are not-run (default: %(default)s)")
    p.add_argument("--start-deadline", type=_seconds, default=900.0, metavar="S",
                   help="the first engine's start (a cold node JIT-compiles kernels: over 10 minutes measured on "
                        "an H200; default: %(default)s); "
                        "engines started after it get a warm deadline from its measured start, never more")
    p.add_argument("--case-deadline", type=_seconds, default=120.0, metavar="S",
                   help="one prompt set; the first gets twice this (default: %(default)s)")
    p.add_argument("--parallel", type=_count, default=6, metavar="N",
                   help="engines at once at most; fewer when the GPU's free memory holds fewer "
                        "(default: %(default)s)")
    p.add_argument("--kv-cache-gib", type=_gib, default=6.0,
                   help="KV cache per engine (per GPU of an engine), GiB (default: %(default)s)")
    p.add_argument("--tensor-parallel-size", type=_tensor_parallel, default=1, metavar="N",
                   help="spread every engine over N GPUs by tensor parallelism, as vLLM's --tensor-parallel-size: "
                        "1, 2, 4 or 8 (what the tiny model's heads, experts and vocabulary split into; "
                        "default: %(default)s)")
    p.add_argument("--pipeline-parallel-size", type=_pipeline_parallel, default=1, metavar="M",
                   help="and over M pipeline stages, as vLLM's --pipeline-parallel-size: 1 to 4 (the tiny model "
                        "has 4 layers; default: %(default)s). Each engine takes N x M GPUs, engines of more than "
                        "one GPU run on disjoint groups of them; a node that sees fewer GPUs is refused (exit 2). vLLM "
                        "0.26.0 refuses MTP and DSpark with M > 1 (refused, docs/selftest.md)")
    p.add_argument("--work", type=Path, default=None,
                   help="directory for the tiny model, the engines' logs, stacks and events and the tests' output "
                        "(a new private directory is made inside it, or it is made if absent; default: a new "
                        "temporary one, kept and named in the report)")
    _common.add_lock(p, many=False, series=False, url=True)
    _common.add_output(p)
    _common.add_cache(p)


def _number(text: str, low: float, high: float, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or not low < value <= high:
        raise argparse.ArgumentTypeError(f"{what} must be a finite number above {low:g} and at most {high:g}, "
                                         f"not {text!r}")
    return value


def _seconds(text: str) -> float:
    return _number(text, 0, 7 * 86400, "seconds")


def _gib(text: str) -> float:
    return _number(text, 0, 4096, "GiB")


def _tensor_parallel(text: str) -> int:
    from dsv4patch.proofs import TENSOR_PARALLEL_SIZES

    value = _whole(text)
    if value not in TENSOR_PARALLEL_SIZES:
        raise argparse.ArgumentTypeError(
            f"must be one of {', '.join(str(n) for n in TENSOR_PARALLEL_SIZES)}, not {text!r}")
    return value


def _pipeline_parallel(text: str) -> int:
    from dsv4patch.proofs import MAX_PIPELINE_PARALLEL_SIZE

    value = _whole(text)
    if not 1 <= value <= MAX_PIPELINE_PARALLEL_SIZE:
        raise argparse.ArgumentTypeError(f"must be 1 to {MAX_PIPELINE_PARALLEL_SIZE}, not {text!r}")
    return value


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"must be 1 to 64, not {text!r}")
    return value


def _interpreter(given: str | None) -> str:
    """--python as given: it must name an executable file (a missing one, a directory: a usage error)."""
    from dsv4patch.proofs import python_of

    python = python_of(given, _common.settings().vllm_python)
    try:
        st = os.stat(python)
    except OSError as exc:
        raise UsageError(f"--python {python}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode) or not os.access(python, os.X_OK):
        raise UsageError(f"--python {python}: not an executable file")
    return python


def _lock_here() -> bool:
    """Is there a lock to use ($DSV4PATCH_LOCK, or locks/vllm.toml here or above)?  Without one the checks
    take the installed wheel's own SBOM (a serving node with only ``pip install dsv4patch``)."""
    from dsv4patch.pins import find_lock

    try:
        find_lock(_common.settings().lock)
    except ParameterError:
        return False
    return True


def work_dir(given: Path | None) -> Path:
    """Where this run writes: a new private directory (inside GIVEN when it exists; GIVEN itself when absent).

    Never a directory someone else could have prepared: a link planted at
    ``plain.log`` or ``tiny-dsv4`` in an existing ``--work`` is never written
    through, because nothing is written directly in it.
    """
    if given is None:
        return Path(tempfile.mkdtemp(prefix="dsv4patch-selftest-"))
    try:
        given.mkdir(mode=0o700)
        return given
    except FileExistsError:
        pass
    except OSError as exc:
        raise UsageError(f"--work {given}: {exc.strerror or exc}") from None
    if not given.is_dir():
        raise UsageError(f"--work {given}: not a directory")
    try:
        return Path(tempfile.mkdtemp(prefix="selftest-", dir=given))
    except OSError as exc:
        raise UsageError(f"--work {given}: {exc.strerror or exc}") from None


def _patterns(values: list[str] | None) -> list[str] | None:
    if values is None:
        return None
    out = [v.strip() for item in values for v in item.split(",") if v.strip()]
    return out or None


def _check_rows(rep: Any) -> list[list[str]]:
    rows = [[c.name, "pass" if c.ok else ("not run" if c.ok is None else "FAIL"), c.note] for c in rep.checks]
    for c in rep.checks:
        if c.name != "regression":
            continue
        for f in c.data.get("files", []):
            counts = f["counts"]
            detail = f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
            if f.get("devices"):
                detail += f" on {', '.join(f['devices'])}"
            bad = [t for t in f["tests"] if t["outcome"] == "failed"]
            if bad:
                detail += f"; {bad[0]['test'].split('::')[-1]}: {bad[0]['message']}"
            elif f.get("error"):
                detail += f"; {f['error']}"
            rows.append([f"  {f['file'].rsplit('/', 1)[-1]}", f["status"], detail])
    return rows


def run(args: argparse.Namespace) -> int:
    from dsv4patch.proofs import CHECK_NAMES, FAILING, Deadlines, Topology, all_cases, run_selftest, select_cases

    patterns = _patterns(args.cases)
    every = all_cases(force_sm120_topk=args.force_sm120_topk)
    if args.list:
        names = list(CHECK_NAMES) + [c.name for c in every]
        if args.format == "json":
            report.emit(args.format, {"cases": names, "notes": []}, None, None)
        else:
            print("\n".join(names))
        return EXIT_OK
    checks = tuple(CHECK_NAMES) if patterns is None else tuple(n for n in CHECK_NAMES if n in patterns)
    engine_patterns = None if patterns is None else [p for p in patterns if p not in CHECK_NAMES]
    chosen = every if engine_patterns is None else (select_cases(every, engine_patterns) if engine_patterns else [])
    python = _interpreter(args.python)
    prog = _common.progress(args)
    ctx = sbom_lock = None
    if checks and args.lock is not None and args.lock.startswith(("https://", "http://")):
        from dsv4patch.delivery import lock_from_url

        sbom_lock = lock_from_url(args.lock)  # without its patches: matched against the installed SBOM
    elif checks and (args.lock is not None or _lock_here()):
        from dsv4patch.pins import open_lock

        lock = open_lock(Path(args.lock) if args.lock is not None else _common.settings().lock)
        ctx = _common.context(args, lock, prog)
    work = work_dir(args.work)
    deadlines = Deadlines(start=args.start_deadline, first_case=2 * args.case_deadline,
                          case=args.case_deadline, total=args.deadline)
    topology = Topology(args.tensor_parallel_size, args.pipeline_parallel_size)
    rep = run_selftest(ctx=ctx, sbom_lock=sbom_lock, pin=args.pin, python=python,
                       progress=prog, checks=checks, cases=chosen, work=work,
                       deadlines=deadlines, parallel=args.parallel, force_sm120_topk=args.force_sm120_topk,
                       kv_cache_gib=args.kv_cache_gib, topology=topology)
    out = rep.to_json()
    out["work"] = str(work)
    rows = _check_rows(rep)
    unrun: dict[tuple[str, str], list[str]] = {}  # cases not run for one reason: one row, not one each
    for c in rep.cases:
        acc = "" if c.acceptance is None else f"{c.acceptance.accepted}/{c.acceptance.drafted}"
        if c.acceptance is not None and c.acceptance.rate is not None:
            acc += f" ({c.acceptance.rate:.0%})"
        gap_text = "" if c.min_gap is None else f"gap {c.min_gap:.2f}"
        detail = "; ".join(x for x in (c.error, gap_text, acc and f"accepted {acc}") if x)
        if c.verdict in ("needs-gpu", "not-run") and detail:
            unrun.setdefault((c.verdict, detail), []).append(c.case)
            continue
        rows.append([c.case, c.verdict, detail])
    for (verdict, detail), names in unrun.items():
        rows.append([names[0], verdict, detail] if len(names) == 1 else
                    [f"{len(names)} engine cases", verdict, f"{detail} (each case: --format json)"])
    counts = rep.counts()
    gap = rep.min_gap()
    proven = [c.name for c in rep.checks if c.ok] + [f"{counts['pass']} engine case(s)"] * bool(counts["pass"])
    failed = [c.name for c in rep.checks if c.ok is False] + [
        f"{n} {v}" for v, n in counts.items() if n and v in FAILING + ("not-run",)]
    out["notes"] = [
        f"python {rep.python}: " + (rep.node.describe() if rep.node is not None else "not probed")
        + ("; DIAGNOSTIC: SM120 top-k route forced (mtp1-sm120topk)" if rep.force_sm120_topk else ""),
        f"topology: {rep.topology.describe()}",
        *([f"engines: {rep.sizing.describe()}"] if rep.sizing is not None else []),
        "cases: " + (", ".join(f"{v} {n}" for v, n in counts.items() if n) or "none selected"),
        "smallest top-1/top-2 logit gap: " + ("none measured" if gap is None else f"{gap:.3f} nats"),
        f"logs, stacks, events and test output: {work}",
        "summary: proven here: " + (", ".join(proven) or "nothing")
        + ("; FAILED: " + ", ".join(failed) if failed else "")
        + ("; not proven here: " + "; ".join(rep.not_proven()) if rep.not_proven() else ""),
        "every selected check and case passed" if rep.ok else "SELFTEST FAILED",
    ]
    table, md = report.simple_table(f"dsv4patch selftest: {rep.python}", ["case", "verdict", "detail"], rows)
    report.emit(args.format, out, table, md)
    return EXIT_OK if rep.ok else EXIT_UNEXPECTED
