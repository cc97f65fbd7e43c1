#!/usr/bin/env python3
"""Every speed goal in one run, quiet and under a load it makes; writes docs/benchmarks.md's table.

Two phases, the same measurements in each: **quiet** (no load of ours; the machine's own
load average is recorded) and **loaded** (``--load`` busy processes on the cores, default 6,
started by this script and ended after the phase).  In each phase, alternating rounds,
medians, every ratio against its baseline measured in the same phase:

* start-up: ``python -X importtime -m dsv4patch --version`` and warm ``check --pin 0.27.1``,
  as JSON (``--format json``) and as typed (its terminal table, to a pipe), the sum of the
  top-level imports minus ``python -X importtime -c pass``'s (the interpreter's own), the least
  disturbed of the rounds of each: goal <= 80 ms; beside them the floors: the standard library
  modules ``check`` cannot start without, alone (FLOOR), and the same printing its table with rich
  (FLOOR_TEXT, as typed's floor);
* warm ``check --pin 0.27.1`` (the CLI as a subprocess, start-up included), as JSON and as typed,
  against a bare ``git apply --cached --check`` loop over the same patches on the same tree
  (benchmarks/check_speed.py's baseline): goal <= 0.7 quiet, <= 1.0 loaded; beside them, in the
  same rounds, the floor of each against the same loop: a bare interpreter importing FLOOR, and
  FLOOR_TEXT (the same printing ``check``'s table with rich);
* warm ``check`` of the whole lock against the bare loop over every pin: goal <= 0.5;
* warm ``wheel --pin 0.27.1`` against copying the stock wheel (313 MB) it starts from:
  goal <= 12 (every stock member still checked against RECORD);
* with ``--ci-log LOG``: the test suite's time and counts from a ``.ci/run`` log (pytest's
  last line) and its 15 slowest tests: goal <= 12 min.

Bytecode is compiled as after ``pip install`` (PYTHONDONTWRITEBYTECODE is dropped).  Writes
``benchmarks/results/run_all.{json,md}`` and the block between the markers in
``docs/benchmarks.md``.  Usage::

    python benchmarks/run_all.py [--rounds 7] [--load 6] [--ci-log ci.log]
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_cli import ENV, run_cli, write_report  # noqa: E402
from check_speed import baseline  # noqa: E402
from dsv4patch.kernels import stock  # noqa: E402
from dsv4patch.pins import repository  # noqa: E402
from dsv4patch.pins.lock import load  # noqa: E402
from dsv4patch.progress import Progress  # noqa: E402
from dsv4patch.series.patches import series_for_pin  # noqa: E402
from dsv4patch.settings import Settings  # noqa: E402
from dsv4patch.store import Store  # noqa: E402

ONE = "0.27.1"
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- benchmarks/run_all.py: begin -->", "<!-- benchmarks/run_all.py: end -->"
# The standard library `check` cannot start without: its options (argparse), its records
# (dataclasses, as the project's rules ask), the lock (tomllib), git (subprocess), hashes and JSON.
# Imported alone in a bare interpreter, they are the floor of any `check` in Python 3.
FLOOR = "import argparse, dataclasses, hashlib, json, subprocess, tomllib"
# The same with the table `check` as typed prints (rich, as the project's rules ask; the title, 13
# columns, one row, the 11 lines under it), to a pipe: the least a `check` as typed can take in Python.
FLOOR_TEXT = FLOOR + """
from rich import box
from rich.console import Console
from rich.table import Table
console = Console(color_system=None, no_color=True, highlight=False)
table = Table(title="dsv4patch check: locks/vllm.toml", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
              padding=(0, 0))
names = ["pin", *[f"{i:04d}" for i in range(1, 11)], "patched tree", "result"]
cells = ["0.27.1", *["ok"] * 10, "ec2fff2214be", "ok"]
for name, cell in zip(names, cells):
    table.add_column(name, overflow="fold", width=max(len(name), len(cell)))
table.add_row(*cells)
console.print(table)
for i in range(1, 11):
    console.print(f"{i:04d} = {i:04d}-DSV4-fix-{i}-Carry-the-dense-SWA-index-width-for-DSpar.patch")
console.print("ok = applies cleanly")
"""
GOALS = {"startup_ms": 80.0, "check_one_quiet": 0.7, "check_one_loaded": 1.0, "check_lock": 0.5,
         "wheel_over_copy": 12.0, "suite_s": 12 * 60.0}


def load_avg() -> float:
    return round(os.getloadavg()[0], 2)


@contextmanager
def busy(n: int) -> Iterator[None]:
    """``n`` busy-looping processes of our own for the duration (ended by their pid after)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(2.0 if n else 0.0)
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def import_ms(args: list[str]) -> float:
    """Milliseconds of top-level imports of ``python -X importtime ARGS`` (its stderr)."""
    res = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True,
                         cwd=ROOT, env=ENV)
    if res.returncode != 0:
        raise SystemExit(f"python -X importtime {' '.join(args)} failed:\n{res.stderr[-3000:]}")
    total = 0
    for line in res.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = line[len("import time:"):].split("|", 2)
            if cumulative.strip().isdigit() and not name.startswith("  "):  # top level: one space
                total += int(cumulative)
    return total / 1000.0


def cpu() -> float:
    """CPU seconds (user + system) of this process and its finished children: unlike wall time, what
    a run costs whatever else the machine runs (our own busy processes are not waited for until the
    phase ends)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn: Callable[[], object], cpu_log: list[float] | None = None) -> float:
    t0, c0 = time.perf_counter(), cpu()
    fn()
    if cpu_log is not None:
        cpu_log.append(cpu() - c0)
    return time.perf_counter() - t0


def ratio(entry: dict[str, Any], ours: str, base: str, data: dict[str, Any] | None = None) -> None:
    """The wall and CPU ratios (medians) of ``data[ours]`` over ``data[base]`` (``data``: ``entry``), into
    ``entry``."""
    d = entry if data is None else data
    entry["ratio"] = statistics.median(d[ours]) / statistics.median(d[base])
    entry["cpu_ratio"] = statistics.median(d[ours + "_cpu"]) / statistics.median(d[base + "_cpu"])


def run_text(args: list[str]) -> None:
    """``dsv4patch ARGS`` as typed (no ``--format``: the terminal table, here to a pipe)."""
    res = subprocess.run([sys.executable, "-m", "dsv4patch", *args], capture_output=True, text=True, cwd=ROOT,
                         env=ENV)
    if res.returncode != 0 or "applies cleanly" not in res.stdout:
        raise SystemExit(f"`dsv4patch {' '.join(args)}` failed (exit {res.returncode}):\n{res.stdout[-2000:]}"
                         f"\n{res.stderr[-3000:]}")


def run_floor(code: str) -> None:
    """A bare interpreter (this one, the same as ``python -m dsv4patch``'s) running ``code``, its output
    to a pipe: what any ``check`` in Python, with the project's rules, cannot go below."""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=ENV)
    if res.returncode != 0:
        raise SystemExit(f"the floor failed (exit {res.returncode}):\n{res.stderr[-3000:]}")


def phase(name: str, load_procs: int, ctx: dict[str, Any], rounds: int) -> dict[str, Any]:
    lock_path, store = ctx["lock"], ctx["store"]
    cache = str(store.root)
    with busy(load_procs):
        out: dict[str, Any] = {"phase": name, "load_processes": load_procs, "loadavg_start": load_avg()}
        # Start-up (imports only; the interpreter's own subtracted).
        version_args = ["-m", "dsv4patch", "--version"]
        check_args = ["-m", "dsv4patch", "check", "--lock", str(lock_path), "--pin", ONE, "--cache-dir", cache,
                      "--format", "json"]
        interp, ver, chk, txt, floor, floor_text = [], [], [], [], [], []
        for _ in range(rounds):
            interp.append(import_ms(["-c", "pass"]))
            ver.append(import_ms(version_args))
            chk.append(import_ms(check_args))
            txt.append(import_ms(check_args[:-2]))  # as typed: no --format, the table (rich) to a pipe
            floor.append(import_ms(["-c", FLOOR]))
            floor_text.append(import_ms(["-c", FLOOR_TEXT]))  # as typed's floor: the same with rich's table
        # The least disturbed run of each (the minimum): on a shared machine the others' load only adds.
        out["startup"] = {"interpreter_ms": interp, "version_ms": ver, "check_ms": chk, "check_text_ms": txt,
                          "floor_ms": floor, "floor_text_ms": floor_text,
                          "version_over_interpreter_ms": min(ver) - min(interp),
                          "check_over_interpreter_ms": min(chk) - min(interp),
                          "check_text_over_interpreter_ms": min(txt) - min(interp),
                          "floor_over_interpreter_ms": min(floor) - min(interp),
                          "floor_text_over_interpreter_ms": min(floor_text) - min(interp),
                          "loadavg": load_avg()}
        # check vs the bare loop (one pin, the whole lock).
        one: dict[str, Any] = {k: [] for k in ("bare_s", "check_s", "text_s", "floor_s", "floor_text_s",
                                               "bare_s_cpu", "check_s_cpu", "text_s_cpu", "floor_s_cpu",
                                               "floor_text_s_cpu")}
        lock: dict[str, Any] = {k: [] for k in ("bare_s", "check_s", "bare_s_cpu", "check_s_cpu")}
        check_one = ["check", "--lock", str(lock_path), "--pin", ONE, "--cache-dir", cache]
        check_lock = ["check", "--lock", str(lock_path), "--cache-dir", cache]
        for _ in range(rounds):
            one["bare_s"].append(timed(lambda: baseline(ctx["one"]), one["bare_s_cpu"]))
            one["check_s"].append(timed(lambda: run_cli(check_one, env=ENV), one["check_s_cpu"]))
            one["text_s"].append(timed(lambda: run_text(check_one), one["text_s_cpu"]))
            one["floor_s"].append(timed(lambda: run_floor(FLOOR), one["floor_s_cpu"]))
            one["floor_text_s"].append(timed(lambda: run_floor(FLOOR_TEXT), one["floor_text_s_cpu"]))
            lock["bare_s"].append(timed(lambda: baseline(ctx["pins"]), lock["bare_s_cpu"]))
            lock["check_s"].append(timed(lambda: run_cli(check_lock, env=ENV), lock["check_s_cpu"]))
        for entry in (one, lock):
            ratio(entry, "check_s", "bare_s")
            entry["loadavg"] = load_avg()
        one["text"], one["floor"], one["floor_text"] = {}, {}, {}
        ratio(one["text"], "text_s", "bare_s", one)
        ratio(one["floor"], "floor_s", "bare_s", one)
        ratio(one["floor_text"], "floor_text_s", "bare_s", one)
        out["check_one"], out["check_lock"] = one, lock
        # wheel vs copying the stock wheel.
        wheel: dict[str, Any] = {k: [] for k in ("copy_s", "wheel_s", "copy_s_cpu", "wheel_s_cpu")}
        with tempfile.TemporaryDirectory(prefix="dsv4-bench-wheel-") as d:
            for i in range(max(1, rounds // 2)):
                dest, wout = Path(d) / f"copy-{i}.whl", Path(d) / f"w-{i}"
                wheel["copy_s"].append(timed(lambda dest=dest: shutil.copyfile(ctx["stock_wheel"], dest),
                                             wheel["copy_s_cpu"]))
                dest.unlink()
                wheel["wheel_s"].append(timed(lambda wout=wout: run_cli(
                    ["wheel", "--lock", str(lock_path), "--pin", ONE, "--cache-dir", cache, "--out", str(wout)],
                    env=ENV), wheel["wheel_s_cpu"]))
                shutil.rmtree(wout)
        ratio(wheel, "wheel_s", "copy_s")
        wheel["loadavg"] = load_avg()
        out["wheel"] = wheel
        out["loadavg_end"] = load_avg()
    return out


_PYTEST_LAST = re.compile(r"^=+ (?P<counts>.*?) in (?P<secs>[\d.]+)s(?: \((?P<hms>[\d:]+)\))? =+$")


def suite(log: Path) -> dict[str, Any]:
    """The suite's counts, seconds and 15 slowest tests from a ``.ci/run`` (pytest) log."""
    lines = log.read_text(errors="replace").splitlines()
    last = next((m for m in (_PYTEST_LAST.match(line.strip()) for line in reversed(lines)) if m), None)
    if last is None:
        raise SystemExit(f"{log}: no pytest summary line ('=== N passed ... in S s ===')")
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)",
                                               last["counts"])}
    slow: list[str] = []
    if any("slowest 15 durations" in line for line in lines):
        start = next(i for i, line in enumerate(lines) if "slowest 15 durations" in line)
        slow = [line.strip() for line in lines[start + 1:start + 16] if re.match(r"^\s*[\d.]+s ", line)]
    return {"log": str(log), "counts": counts, "seconds": float(last["secs"]), "slowest": slow,
            "log_mtime": datetime.datetime.fromtimestamp(log.stat().st_mtime, datetime.timezone.utc).isoformat()}


def table(res: dict[str, Any]) -> str:
    q, ld = res["phases"]["quiet"], res["phases"]["loaded"]

    def ok(value: float, goal: float) -> str:
        return f"**{value:.2f}** (goal <= {goal:g}: {'met' if value <= goal else 'NOT met'})"

    def cell(data: dict[str, Any], ours: str, base: str, goal: float, digits: int = 3,
             entry: dict[str, Any] | None = None) -> str:
        m, r = statistics.median, data if entry is None else entry
        return (f"{m(data[ours]):.{digits}f} s / {m(data[base]):.{digits}f} s = {ok(r['ratio'], goal)}; "
                f"CPU {m(data[ours + '_cpu']):.{digits}f} s / {m(data[base + '_cpu']):.{digits}f} s = "
                f"{r['cpu_ratio']:.2f}")

    rows = [
        f"Measured {res['date']} by `python benchmarks/run_all.py --rounds {res['rounds']} --load {res['load']}` "
        f"on {res['cpus']} CPUs, Python {res['python']}, on a machine shared with other work: "
        "**quiet** adds no load of ours (the load average shown is the machine's own), **loaded** adds "
        f"{res['load']} busy processes; each ratio's baseline ran in the same phase, alternating. "
        "Wall-time ratios are the goals; the CPU seconds (user + system, children included) show what "
        "each run costs whatever else the machine runs.",
        "",
        "| what | quiet | loaded |", "|---|---|---|",
        "| load average (1 min) at the start / end of the phase | "
        f"{q['loadavg_start']} / {q['loadavg_end']} | {ld['loadavg_start']} / {ld['loadavg_end']} |",
    ]
    for key, label in (("version_over_interpreter_ms", "`--version`"),
                       ("check_over_interpreter_ms", f"warm `check --pin {ONE} --format json`"),
                       ("check_text_over_interpreter_ms", f"warm `check --pin {ONE}` as typed (its table)")):
        if key not in q["startup"]:
            continue
        rows.append(f"| start-up of {label}: imports beyond the interpreter's own, ms (goal <= 80) | "
                    f"{ok(q['startup'][key], GOALS['startup_ms'])} | {ok(ld['startup'][key], GOALS['startup_ms'])} |")
    if "floor_over_interpreter_ms" in q["startup"]:
        rows.append("| the floor: the standard library `check` needs, alone (`python -X importtime -c "
                    f"\"{FLOOR}\"`), ms beyond the interpreter's own | "
                    f"{q['startup']['floor_over_interpreter_ms']:.2f} | {ld['startup']['floor_over_interpreter_ms']:.2f} |")
    if "floor_text_over_interpreter_ms" in q["startup"]:
        rows.append("| the floor of `check` as typed: the same standard library and rich printing its table "
                    "(`FLOOR_TEXT` in benchmarks/run_all.py), alone, ms beyond the interpreter's own | "
                    f"{q['startup']['floor_text_over_interpreter_ms']:.2f} | "
                    f"{ld['startup']['floor_text_over_interpreter_ms']:.2f} |")
    rows.append(f"| warm `check --pin {ONE} --format json` / bare `git apply --cached --check` loop "
                f"({res['one_patches']} patches) | "
                f"{cell(q['check_one'], 'check_s', 'bare_s', GOALS['check_one_quiet'])} | "
                f"{cell(ld['check_one'], 'check_s', 'bare_s', GOALS['check_one_loaded'])} |")
    if "text" in q["check_one"]:
        rows.append(f"| warm `check --pin {ONE}` as typed (its table, rich, to a pipe) / the same bare loop | "
                    f"{cell(q['check_one'], 'text_s', 'bare_s', GOALS['check_one_quiet'], entry=q['check_one']['text'])} | "
                    f"{cell(ld['check_one'], 'text_s', 'bare_s', GOALS['check_one_loaded'], entry=ld['check_one']['text'])} |")
    if "floor" in q["check_one"]:
        def floor(d: dict[str, Any]) -> str:
            m = statistics.median
            return (f"{m(d['floor_s']):.3f} s = {d['floor']['ratio']:.2f} / {m(d['floor_text_s']):.3f} s = "
                    f"{d['floor_text']['ratio']:.2f}")
        rows.append("| the floor, in the same rounds, against the same bare loop: a bare interpreter importing the "
                    "standard library `check` needs (`FLOOR` above) / the same printing `check`'s table with rich "
                    "(`FLOOR_TEXT` in benchmarks/run_all.py) | "
                    f"{floor(q['check_one'])} | {floor(ld['check_one'])} |")
    rows.append(f"| warm `check`, whole lock ({res['pins']} pins, {res['patch_checks']} patch checks) / bare loop | "
                f"{cell(q['check_lock'], 'check_s', 'bare_s', GOALS['check_lock'])} | "
                f"{cell(ld['check_lock'], 'check_s', 'bare_s', GOALS['check_lock'])} |")
    rows.append(f"| warm `wheel --pin {ONE}` / copy of the stock wheel ({res['stock_mb']:.0f} MB) | "
                f"{cell(q['wheel'], 'wheel_s', 'copy_s', GOALS['wheel_over_copy'], 2)} | "
                f"{cell(ld['wheel'], 'wheel_s', 'copy_s', GOALS['wheel_over_copy'], 2)} |")
    s = res.get("suite")
    if s:
        counts = ", ".join(f"{v} {k}" for k, v in s["counts"].items())
        minutes = s["seconds"] / 60
        rows += ["", f"The README's test command in `{s['log']}` (written {s['log_mtime'][:16]} UTC): {counts} in "
                 f"{minutes:.1f} min (goal <= 12 min: {'met' if s['seconds'] <= GOALS['suite_s'] else 'NOT met'}); "
                 "its 15 slowest:", "", "```", *s["slowest"], "```"]
    else:
        rows += ["", "The test suite's time is not in this run (pass `--ci-log` with a `.ci/run` log)."]
    return "\n".join(rows) + "\n"


def write_doc(text: str) -> None:
    doc = DOC.read_text()
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lock", type=Path, default=ROOT / "locks" / "vllm.toml")
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--load", type=int, default=6, help="busy processes in the loaded phase (default 6)")
    ap.add_argument("--ci-log", type=Path, default=None, help="a .ci/run log: the suite's time and slowest tests")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--no-doc", action="store_true", help="do not rewrite docs/benchmarks.md's table")
    args = ap.parse_args()
    store = Store.open(args.cache_dir or Settings.from_environ(os.environ).cache_root())
    lock = load(args.lock)
    quiet = Progress(False)
    pins = []
    for pin in lock.pins.values():  # warm the cache (untimed)
        repo = repository.materialize(pin, store, quiet)
        pins.append((repo.repo, repo.base_commit, [p.path for p in series_for_pin(lock, pin).patches]))
    one = [p for p, name in zip(pins, lock.pins, strict=True) if name == ONE]
    stock_wheel = stock.wheel_path(store, stock.wheel_for(lock.pin(ONE), "x86_64"), quiet)
    for extra in (["--pin", ONE], []):  # warm-up: the check cache
        run_cli(["check", "--lock", str(args.lock), "--cache-dir", str(store.root), *extra], env=ENV)
    with tempfile.TemporaryDirectory(prefix="dsv4-bench-wheel-") as d:  # warm-up: the wheel's tree, kernels
        run_cli(["wheel", "--lock", str(args.lock), "--pin", ONE, "--cache-dir", str(store.root), "--out", d], env=ENV)
    ctx = {"lock": args.lock, "store": store, "pins": pins, "one": one, "stock_wheel": stock_wheel}
    res: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "rounds": args.rounds, "load": args.load, "cpus": os.cpu_count(), "python": sys.version.split()[0],
        "pins": len(pins), "patch_checks": sum(len(p[2]) for p in pins), "one_patches": len(one[0][2]),
        "stock_mb": stock_wheel.stat().st_size / 1e6, "goals": GOALS,
        "phases": {"quiet": phase("quiet", 0, ctx, args.rounds),
                   "loaded": phase("loaded", args.load, ctx, args.rounds)},
    }
    if args.ci_log is not None:
        res["suite"] = suite(args.ci_log)
    text = table(res)
    write_report(args.out, "run_all", res, "# All benchmarks (benchmarks/run_all.py)\n\n" + text)
    if not args.no_doc:
        write_doc(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
