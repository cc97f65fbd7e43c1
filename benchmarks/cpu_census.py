"""Where the test suite's CPU goes, by program and by test module, from Linux process accounting.

pytest's own figures (the ``most CPU`` section of a ``.ci/run`` log) count a child's CPU only when the
worker reaps it and say nothing of what ran: a vLLM engine, pip, git, ptxas.  Process accounting
records every process that ends, with its command name, parent, start and CPU (the ``acct`` package:
``accton`` turns it on, ``dump-acct`` reads the file), so a run recorded that way can be split exactly:

    apt-get install acct                  # Debian; needs root
    accton /tmp/pacct && bash .ci/run > ci.log 2>&1; accton off
    python benchmarks/cpu_census.py /tmp/pacct --ci-log ci.log

It prints the run's CPU by program (the command name the kernel recorded: ``python``, ``git``,
``ptxas``, ...), the suite's CPU by test module (each process counted in the module its pytest worker
was running when it started, from the log's ``slowest modules`` windows; a worker is the pid the log's
``worker processes:`` line names for it, tests/conftest.py's; a log without that line (before 2026-12-06)
gets the old guess, the ``python`` processes that lived about as long as the run, numbered by start, which
can swap gw0 and gw1) and the largest processes.  Figures are CPU seconds, user + system.  Used for
issue 39's census (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

COMPILERS = frozenset({"ptxas", "cicc", "cc1plus", "cudafe++", "nvcc", "fatbinary", "nvlink", "ld", "as",
                       "collect2", "cc1", "g++", "gcc"})
MODULE_LINE = re.compile(r"\s*[\d.]+s\s+(gw\d+)\s+([\d.]+)\.\.\s*([\d.]+)\s+\S+\s+(\S+)")
WORKER_PID = re.compile(r"(gw\d+) pid (\d+)")


@dataclass(frozen=True)
class Proc:
    comm: str
    user: float  # CPU seconds
    system: float
    elapsed: float
    pid: int
    ppid: int
    start: float  # epoch seconds (whole seconds: what the record holds)

    @property
    def cpu(self) -> float:
        return self.user + self.system


def read(pacct: Path) -> list[Proc]:
    """Every record of ``pacct`` (``dump-acct``'s fields: times in clock ticks of 1/100 s)."""
    out = subprocess.run(["dump-acct", str(pacct)], capture_output=True, text=True, check=True).stdout
    procs = []
    for line in out.splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) < 15:
            continue
        start = datetime.strptime(f[14], "%a %b %d %H:%M:%S %Y").timestamp()
        procs.append(Proc(f[0], float(f[2]) / 100, float(f[3]) / 100, float(f[4]) / 100, int(f[9]), int(f[10]),
                          start))
    return procs


def category(comm: str) -> str:
    if comm.startswith("git"):
        return "git"
    if comm in COMPILERS:
        return "compile"
    if comm.startswith(("python", "pip", "dsv4patch")):
        return "python"
    if comm.startswith(("VLLM", "pt_", "ZMQ")):
        return "vllm"  # vLLM's workers and threads named by it (the comm of the thread that ended last)
    return "other"


class Tree:
    """Parents by pid and time: a pid is reused over a long run, so a child's parent is the process of that pid
    alive when the child started."""

    def __init__(self, procs: list[Proc]) -> None:
        self.by_pid: dict[int, list[Proc]] = defaultdict(list)
        for p in procs:
            self.by_pid[p.pid].append(p)

    def parent(self, p: Proc) -> Proc | None:
        return next((q for q in self.by_pid.get(p.ppid, []) if q.start <= p.start <= q.start + q.elapsed + 2), None)

    def ancestor_in(self, p: Proc, pids: dict[int, str]) -> str | None:
        q: Proc | None = p
        for _ in range(64):
            q = self.parent(q) if q is not None else None
            if q is None:
                return None
            if q.pid in pids:
                return pids[q.pid]
        return None


def modules(log: str) -> list[tuple[str, float, float, str]]:
    """(worker, from, to, module) of the log's ``slowest modules`` section (seconds after the first test)."""
    section = log.split("slowest modules", 1)[1].split("CPU of all modules", 1)[0] if "slowest modules" in log else ""
    rows = []
    for line in section.splitlines():
        m = MODULE_LINE.match(line)
        if m:
            rows.append((m.group(1), float(m.group(2)), float(m.group(3)), m.group(4)))
    return rows


def worker_pids(log: str) -> dict[str, int]:
    """``gwN`` -> pid, from the log's ``worker processes:`` line (tests/conftest.py); {} if it has none."""
    line = next((x for x in log.splitlines() if x.startswith("worker processes:")), "")
    return {w: int(pid) for w, pid in WORKER_PID.findall(line)}


def by_module(procs: list[Proc], tree: Tree, rows: list[tuple[str, float, float, str]],
              pids: dict[str, int] | None = None) -> tuple[dict[int, str], dict[str, dict[str, float]]]:
    """The pytest workers (pid -> ``gwN``) and the suite's CPU by test module and kind of program.

    A worker is the pid ``pids`` names for it (the log's), its longest-lived process of that pid; without
    them, a long-lived ``python`` process whose parent is one too (pytest-xdist's controller), numbered by
    start (a guess: two workers started in the same second can come out swapped).  Each other process
    counts in the module its worker ran when it started."""
    pythons = [p for p in procs if p.comm.startswith("python")]
    longest = max((p.elapsed for p in pythons), default=0.0)
    if pids:
        chosen = {w: max((p for p in pythons if p.pid == pid), key=lambda p: p.elapsed, default=None)
                  for w, pid in pids.items()}
        workers = [p for p in chosen.values() if p is not None]
        names = {p.pid: w for w, p in chosen.items() if p is not None}
    else:
        lived = {p.pid: p for p in pythons if p.elapsed > 0.5 * longest}
        count = len({w for w, *_ in rows})
        workers = sorted((p for p in lived.values() if p.ppid in lived), key=lambda p: (p.start, p.pid))[:count]
        names = {p.pid: f"gw{i}" for i, p in enumerate(workers)}
    t0 = min(p.start for p in workers) if workers else 0.0
    per: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for p in procs:
        if any(p is w for w in workers):
            per[f"{names[p.pid]}: the worker itself (in-process tests, pytest)"]["python"] += p.cpu
            continue
        worker = tree.ancestor_in(p, names)
        if worker is None:
            continue
        off = p.start - t0
        module = next((m for w, a, b, m in rows if w == worker and a - 1 <= off <= b + 1), f"{worker}: between modules")
        per[module][category(p.comm)] += p.cpu
    return names, per


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pacct", type=Path, help="the process accounting file (accton FILE ... accton off)")
    ap.add_argument("--ci-log", type=Path, help="the run's .ci/run log: the suite's CPU by test module")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)
    procs = read(args.pacct)
    tree = Tree(procs)
    print(f"{len(procs)} processes, CPU {sum(p.user for p in procs):.0f} s user + {sum(p.system for p in procs):.0f} s system")
    by_comm: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for p in procs:
        row = by_comm[p.comm]
        row[0] += 1
        row[1] += p.user
        row[2] += p.system
    print("\nby program (CPU s user + system, processes):")
    for comm, (n, user, system) in sorted(by_comm.items(), key=lambda x: -(x[1][1] + x[1][2]))[:args.top]:
        print(f"  {user + system:8.1f} = {user:7.1f} + {system:6.1f}  {int(n):6d}  {comm}")
    if args.ci_log is not None:
        log = args.ci_log.read_text(errors="replace")
        pids = worker_pids(log)
        names, per = by_module(procs, tree, modules(log), pids)
        if not pids:
            print("\n(the log names no worker processes: gw0 and gw1 guessed by start, possibly swapped)")
        print(f"\nthe suite by test module ({', '.join(f'{n} = pid {pid}' for pid, n in names.items())}; "
              "CPU s of the processes each started, by kind):")
        for module, kinds in sorted(per.items(), key=lambda x: -sum(x[1].values()))[:max(args.top, 25)]:
            parts = " ".join(f"{k} {v:.0f}" for k, v in sorted(kinds.items(), key=lambda x: -x[1]) if v >= 0.5)
            print(f"  {sum(kinds.values()):7.1f}  {module:55}  {parts}")
    print("\nlargest processes (CPU s, elapsed s, program, parent's program):")
    for p in sorted(procs, key=lambda p: -p.cpu)[:args.top]:
        parent = tree.parent(p)
        print(f"  {p.cpu:7.1f} {p.elapsed:8.1f}  {p.comm:16} (parent {parent.comm if parent else '?'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
