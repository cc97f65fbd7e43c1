"""Benchmark: targeted kernel rebuild (``dsv4patch build``) vs. compiling the whole target.

Why
---
``dsv4patch build`` does not rebuild vLLM.  It compiles only the translation
units (TUs) of ``_C_stable_libtorch`` that the applied patches change (for the
0.27.1 DSV4 series: ``topk.cu`` and ``cooperative_topk.cu``) plus a small
generated bindings TU, for the pin's ``cuda_arch_list``, and caches the objects.
The claim to check is that this is much cheaper than rebuilding the target, and
that a second build with nothing changed compiles nothing.

What it measures (wall-clock, on whatever machine runs it)
-----------------------------------------------------------
1. ``targeted_cold``: ``dsv4patch build`` of the patched tree with a *fresh*
   cache directory (no kernel objects).  To stay offline, the cuBLAS headers
   that ``dsv4patch build`` would otherwise ``pip download`` are copied in
   from ``--seed-cache`` beforehand (they are not part of the measured time).
   Includes toolchain detection, compiling, linking and packaging the wheel,
   with the pin's ``max_jobs`` / ``nvcc_threads``.
2. ``incremental``: the same command again with the same cache; the script
   asserts that it compiled nothing.
3. ``baseline``: every source of ``VLLM_STABLE_EXT_SRC`` (as parsed by
   :mod:`dsv4patch.kernels.sources`, i.e. the literal entries of the 0.27.1
   ``CMakeLists.txt``) compiled standalone for ONE arch (``--baseline-arch``,
   default ``9.0a``), with the flags ``dsv4patch build`` uses (the commands
   come from :func:`dsv4patch.kernels.build.plan_build`) plus two things a
   CMake build adds that some TUs of the list need (Python's include dir and
   torch's ``--expt-extended-lambda``; ``--no-cmake-extras`` drops them), with
   the same parallelism (``max_jobs``).  First every TU is run through the
   preprocessor (``nvcc -E``): TUs that need CUTLASS or other third-party code
   that CMake fetches (not available offline) fail there and are recorded with
   their first error line.  Then a deterministic, evenly spaced sample of at
   most ``--sample`` of the TUs that preprocess is compiled (``--all``
   compiles all of them).  Unless every TU of the list compiled, the whole-list
   time is an ESTIMATE: ``mean per-TU compile time x number of TUs in the
   list`` (serial compile time), and that divided by ``max_jobs`` for wall
   time (perfect packing of the jobs).
   Because the TUs that cannot be compiled here are the CUTLASS-heavy ones,
   and the list leaves out the sources CMake appends through variables
   (CUTLASS, Marlin, Machete ...), the estimate is a LOWER bound on what
   rebuilding ``_C_stable_libtorch`` costs.

Ratios reported: targeted cold / whole-list (wall) and incremental / targeted cold.

Usage (from the repository root, with the project's virtualenv)::

    .venv/bin/python benchmarks/kernel_build.py --out benchmarks/results \\
        [--tree PATCHED_TREE] [--pin 0.27.1] [--lock locks/vllm.toml] \\
        [--python PYTHON_WITH_TORCH] [--seed-cache DIR] [--baseline-arch 9.0a] \\
        [--sample 8 | --all] [--max-jobs N] [--no-cmake-extras] [--skip-baseline] \\
        [--keep-tmp]

Without ``--tree`` a patched tree is made in a temporary directory with
``dsv4patch apply --pin PIN`` using ``--seed-cache`` as the cache (not timed).
Writes ``<out>/kernel_build.md`` and ``<out>/kernel_build.json``.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench_cli import run_cli, write_report  # noqa: E402
from dsv4patch.kernels import build as kbuild  # noqa: E402
from dsv4patch.kernels import sources  # noqa: E402
from dsv4patch.pins.lock import load as load_lock  # noqa: E402
from dsv4patch.settings import Settings  # noqa: E402
from dsv4patch.store import Store  # noqa: E402

# nvcc flags torch's CMake config (share/cmake/Caffe2/public/cuda.cmake) adds to every CUDA
# source of vLLM's build, which dsv4patch's BASE_FLAGS leave out.
CMAKE_EXTRA_FLAGS = ("--expt-extended-lambda",)


@dataclass
class TUResult:
    """One TU of the baseline list."""

    path: str
    archs: list[str]
    preprocess: str  # "ok" | "failed" | "skipped"
    preprocess_error: str | None = None
    compile: str = "not sampled"  # "ok" | "failed" | "not sampled"
    compile_error: str | None = None
    seconds: float | None = None


def log(msg: str) -> None:
    print(f"[kernel_build {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def first_error(text: str) -> str:
    """The first line of compiler output that reports an error (else the first line)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if re.search(r"\berror\b|fatal", ln, re.IGNORECASE):
            return ln[:400]
    return (lines[0] if lines else "(no output)")[:400]


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def find_python(seed_cache: Path) -> str:
    """An interpreter that imports torch: $DSV4PATCH_TORCH_PYTHON, a dsv4patch test venv, or this one."""
    cands = [os.environ.get("DSV4PATCH_TORCH_PYTHON", "")]
    cands += sorted(glob.glob(str(seed_cache / "venvs" / "*" / "bin" / "python")))
    cands.append(sys.executable)
    for c in cands:
        if c and subprocess.run([c, "-c", "import torch"], capture_output=True, check=False).returncode == 0:
            return c
    raise SystemExit("no interpreter with torch found: pass --python")


def cli(args: list[str], cache: Path) -> tuple[float, dict[str, Any]]:
    """Run ``dsv4patch ARGS --format json --cache-dir CACHE``; (wall seconds, parsed JSON)."""
    return run_cli([*args, "--cache-dir", str(cache)])


def seed_cublas(seed_cache: Path, cache: Path) -> list[str]:
    """Copy the cached cuBLAS headers into a fresh cache so ``dsv4patch build`` downloads nothing."""
    src = seed_cache / "kernels" / "cublas-headers"
    if not src.is_dir():
        return []
    dst = cache / "kernels" / "cublas-headers"
    shutil.copytree(src, dst)
    return sorted(p.name for p in dst.iterdir())


def make_tree(pin: str, lock: Path, seed_cache: Path, dest: Path) -> None:
    log(f"creating patched tree {dest} (dsv4patch apply --pin {pin}, cache {seed_cache})")
    cmd = [sys.executable, "-m", "dsv4patch", "apply", "--lock", str(lock), "--pin", pin,
           "--tree", str(dest), "--cache-dir", str(seed_cache)]
    # Newer `apply` also builds the kernels; the benchmark must start from an unbuilt tree.
    helptext = subprocess.run([*cmd[:4], "--help"], cwd=REPO, capture_output=True, text=True,
                              check=False).stdout
    if "--no-build" in helptext:
        cmd.append("--no-build")
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"`{' '.join(cmd)}` failed:\n{res.stderr[-4000:]}")


def targeted(tree: Path, lock: Path, pin: str, python: str, seed_cache: Path, work: Path) -> dict[str, Any]:
    cache = work / "cache-targeted"
    Store.open(cache)
    seeded = seed_cublas(seed_cache, cache)
    log(f"seeded {cache} with cublas headers {seeded or 'none (may download)'}")
    base = ["build", "--lock", str(lock), "--pin", pin, "--tree", str(tree), "--python", python,
            "--out", str(work / "dist")]
    out: dict[str, Any] = {"cache": str(cache), "seeded": seeded, "command": ["dsv4patch", *base]}
    for run in ("cold", "incremental"):
        log(f"targeted {run} build ...")
        load0 = loadavg()
        wall, rep = cli(base, cache)
        units = [{"unit": u["unit"], "archs": u["archs"], "cached": u["cached"], "seconds": u["seconds"]}
                 for u in rep["units"]]
        out[run] = {"wall_s": round(wall, 2), "compiled": rep["compiled"], "units": units,
                    "unit_seconds_sum": round(sum(u["seconds"] for u in units), 1),
                    "ops": rep["ops"], "archs": rep["archs"], "wheel": rep["wheel"],
                    "loadavg_before": load0, "loadavg_after": loadavg()}
        out["toolchain"] = rep["toolchain"]
        log(f"targeted {run}: {wall:.1f}s, compiled {rep['compiled']}")
    if out["incremental"]["compiled"]:
        raise SystemExit(f"incremental build compiled {out['incremental']['compiled']}: expected nothing")
    if len(out["cold"]["compiled"]) != len(out["cold"]["units"]):
        raise SystemExit("cold build found cached objects: the cache was not fresh")
    out["incremental"]["asserted_nothing_compiled"] = True
    return out


def _run(cmd: list[str], cwd: Path) -> tuple[int, str, float]:
    t0 = time.monotonic()
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    return res.returncode, (res.stderr or "") + (res.stdout or ""), time.monotonic() - t0


def pick_sample(items: list[str], n: int) -> list[str]:
    """``n`` items evenly spaced over ``items`` (all of them if n >= len)."""
    if n >= len(items):
        return list(items)
    if n <= 1:
        return items[:max(n, 0)]
    step = (len(items) - 1) / (n - 1)
    return [items[round(i * step)] for i in range(n)]


def baseline(tree: Path, arch: str, python: str, work: Path, seed_cache: Path, max_jobs: int,
             nvcc_threads: int, sample: int | None, cmake_extras: bool = True) -> dict[str, Any]:
    store = Store.open(work / "cache-baseline")
    seed_cublas(seed_cache, store.root)
    tc = kbuild.detect_toolchain(store, python=python)
    cmake = sources.cmake_target(tree)
    units = tuple(
        sources.TranslationUnit(s, sources.TARGET, (), (), cmake.arch_var.get(s))
        for s in cmake.sources if (tree / s).is_file()
    )
    missing = [s for s in cmake.sources if not (tree / s).is_file()]
    full = sources.plan(tree)
    plan = sources.KernelPlan(
        tree=tree, base=full.base, head=full.head, tree_id=full.tree_id, changed=(), units=units,
        ops=(), bindings=None, defines=full.defines, torch_target_version=full.torch_target_version,
    )
    builds, _ops, notes = kbuild.plan_build(plan, (arch,), tc, store, nvcc_threads)
    # What a CMake build adds that some TUs of the list need but dsv4patch's units do not:
    # Python's include dir (csrc/core/registration.h includes Python.h) and torch's
    # Caffe2/public/cuda.cmake `--expt-extended-lambda` (__device__ lambdas).
    pyinc = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
                           capture_output=True, text=True, check=False).stdout.strip()
    extra = ([*(["-I", pyinc] if pyinc else []), *CMAKE_EXTRA_FLAGS] if cmake_extras else [])
    for b in builds:
        b.command[-4:-4] = extra
    by_src = {b.source: b for b in builds}
    results: dict[str, TUResult] = {}
    for s in cmake.sources:
        ub = by_src.get(s)
        results[s] = TUResult(s, list(ub.archs) if ub else [], "ok" if ub else "skipped",
                              None if ub else ("missing from tree" if s in missing else "no arch for it"))

    def pre(b: kbuild.UnitBuild) -> None:
        assert b.command[-4] == "-c"  # [..., "-c", source, "-o", object]
        cmd = [*b.command[:-4], "-E", b.command[-3], "-o", os.devnull]
        rc, text, _ = _run(cmd, tree)
        r = results[b.source]
        r.preprocess = "ok" if rc == 0 else "failed"
        if rc:
            r.preprocess_error = first_error(text)
            r.compile = "not attempted"

    log(f"baseline: preprocessing {len(builds)} TUs for {arch} ...")
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, max_jobs)) as pool:
        list(pool.map(pre, builds))
    pre_wall = time.monotonic() - t0
    ok = [b.source for b in builds if results[b.source].preprocess == "ok"]
    chosen = ok if sample is None else pick_sample(ok, sample)
    log(f"baseline: {len(ok)}/{len(builds)} preprocess; compiling {len(chosen)}: {chosen}")

    def comp(src: str) -> None:
        b = by_src[src]
        obj = work / "baseline-objs" / (b.source.replace("/", "__") + ".o")
        obj.parent.mkdir(parents=True, exist_ok=True)
        rc, text, secs = _run([*b.command[:-1], str(obj)], tree)
        r = results[src]
        r.seconds = round(secs, 2)
        r.compile = "ok" if rc == 0 else "failed"
        if rc:
            r.compile_error = first_error(text)
        log(f"  {src}: {r.compile} {secs:.1f}s")

    load0 = loadavg()
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, max_jobs)) as pool:
        list(pool.map(comp, chosen))
    sample_wall = time.monotonic() - t0
    compiled_ok = [results[s] for s in chosen if results[s].compile == "ok"]
    n_list = len(cmake.sources)
    secs = [r.seconds or 0.0 for r in compiled_ok]
    mean = sum(secs) / len(secs) if secs else float("nan")
    measured = len(compiled_ok) == n_list
    serial = sum(secs) if measured else mean * n_list
    wall = sample_wall if measured else serial / max(1, max_jobs)
    return {
        "arch": arch,
        "n_tus_in_list": n_list,
        "n_planned": len(builds),
        "notes": notes,
        "n_preprocess_ok": len(ok),
        "preprocess_wall_s": round(pre_wall, 1),
        "sampled": chosen,
        "sample_rule": "all that preprocess" if sample is None
        else f"{len(chosen)} evenly spaced (list order) of the {len(ok)} TUs that preprocess",
        "n_compiled_ok": len(compiled_ok),
        "sample_wall_s": round(sample_wall, 1),
        "sample_serial_s": round(sum(secs), 1),
        "mean_tu_s": round(mean, 1),
        "whole_list_measured": measured,
        "whole_list_serial_s": round(serial, 1),
        "whole_list_wall_s": round(wall, 1),
        "loadavg_before": load0,
        "loadavg_after": loadavg(),
        "max_jobs": max_jobs,
        "extra_flags": extra,
        "command_example": by_src[chosen[0]].command if chosen else None,
        "tus": [asdict(results[s]) for s in cmake.sources],
    }


def render(data: dict[str, Any]) -> str:
    t, b = data["targeted"], data.get("baseline")
    env = data["environment"]
    est = "" if not b or b["whole_list_measured"] else " (ESTIMATE)"
    md = [
        "# Kernel build benchmark",
        "",
        f"Generated by `benchmarks/kernel_build.py {' '.join(data['argv'])}` on {data['date']}.",
        "",
        f"- machine: {env['cpus']} CPU(s) ({env['cpu']}), {env['platform']}",
        f"- nvcc: {env['nvcc']}; torch {t['toolchain']['torch']} ({data['python']})",
        f"- pin {data['pin']}, tree {data['tree']} (tree id {data['tree_id'][:12]}); "
        f"max_jobs={data['max_jobs']}, nvcc_threads={data['nvcc_threads']}",
        f"- load average before/after targeted cold: {t['cold']['loadavg_before']} / "
        f"{t['cold']['loadavg_after']}"
        + (f"; baseline compile: {b['loadavg_before']} / {b['loadavg_after']}" if b else "")
        + " (other work was running on the machine: times include that contention)",
        "",
        "## Results",
        "",
        "| measurement | archs | TUs compiled | wall (s) |",
        "|---|---|---|---|",
        f"| targeted rebuild, cold cache (`dsv4patch build`) | {' '.join(t['cold']['archs'])} | "
        f"{len(t['cold']['compiled'])} | {t['cold']['wall_s']:.1f} |",
        f"| incremental rebuild, nothing changed | {' '.join(t['incremental']['archs'])} | "
        f"{len(t['incremental']['compiled'])} | {t['incremental']['wall_s']:.1f} |",
    ]
    if b:
        md += [
            f"| `VLLM_STABLE_EXT_SRC`: the TUs compiled here (measured) | {b['arch']} | {b['n_compiled_ok']} | "
            f"{b['sample_wall_s']:.1f} |",
            f"| whole `VLLM_STABLE_EXT_SRC` ({b['n_tus_in_list']} TUs){est} | {b['arch']} | "
            f"{b['n_tus_in_list']} | {b['whole_list_wall_s']:.1f} |",
        ]
    md += ["", "Ratios:", ""]
    r = data["ratios"]
    if b:
        md.append(f"- targeted cold / whole list{est}: **{r['targeted_cold_over_whole_list']:.3f}** "
                  f"(whole list is ~{1 / r['targeted_cold_over_whole_list']:.1f}x the targeted build)")
        md.append(f"- targeted cold / the {b['n_compiled_ok']} TUs compiled here (measured wall): "
                  f"**{r['targeted_cold_over_compiled_part']:.3f}**")
    md.append(f"- incremental / targeted cold: **{r['incremental_over_targeted_cold']:.3f}**")
    md += ["", "## Targeted build units (cold)", "", "| unit | archs | compile (s) |", "|---|---|---|"]
    md += [f"| {u['unit']} | {' '.join(u['archs']) or 'host'} | {u['seconds']:.1f} |" for u in t["cold"]["units"]]
    md += ["", f"Sum of unit compile times {t['cold']['unit_seconds_sum']:.1f} s; the rest of the wall "
           "time is toolchain detection (importing torch), linking and writing the wheel. "
           f"Incremental: compiled {t['incremental']['compiled'] or 'nothing'} (asserted); its time is "
           "toolchain detection, planning/hashing, the cached link and rewriting the wheel.", ""]
    if b:
        md += [
            "## Baseline: every TU of `VLLM_STABLE_EXT_SRC` for one arch",
            "",
            f"Sources: the {b['n_tus_in_list']} literal entries of `VLLM_STABLE_EXT_SRC` in the tree's "
            "CMakeLists.txt, as `dsv4patch.kernels.sources` parses them (sources CMake appends through "
            "variables, e.g. CUTLASS scaled-mm/MoE, Marlin, Machete, are not in it). Flags: those of "
            f"`dsv4patch build` (`kernels.build.plan_build`) plus `{' '.join(b['extra_flags']) or 'nothing'}` "
            "(what CMake adds: Python's include dir, torch's `--expt-extended-lambda`), one `-gencode` for "
            f"{b['arch']}; {b['max_jobs']} parallel jobs. Each TU was first preprocessed (`nvcc -E`, "
            f"{b['preprocess_wall_s']:.0f} s for all); {b['n_preprocess_ok']} of {b['n_planned']} "
            f"preprocess. Compiled: {b['sample_rule']}.",
            "",
        ]
        if not b["whole_list_measured"]:
            md += [
                f"**Estimate:** mean per-TU compile time of the {b['n_compiled_ok']} compiled TUs "
                f"({b['mean_tu_s']:.1f} s) x {b['n_tus_in_list']} TUs = {b['whole_list_serial_s']:.0f} s "
                f"of compile time, / {b['max_jobs']} jobs = **{b['whole_list_wall_s']:.0f} s wall**. "
                "The TUs that cannot be compiled here are the CUTLASS ones, typically the slowest, "
                "so this is a lower bound for the list (and the real target has more sources).",
                "",
            ]
        md += ["| TU | preprocess | compile | s | first error |", "|---|---|---|---|---|"]
        for tu in b["tus"]:
            err = (tu["compile_error"] or tu["preprocess_error"] or "").replace("|", "\\|")
            secs = f"{tu['seconds']:.1f}" if tu["seconds"] is not None else ""
            md.append(f"| {tu['path']} | {tu['preprocess']} | {tu['compile']} | {secs} | {err} |")
        md.append("")
    if data["failures"]:
        md += ["## Failures", ""] + [f"- {f}" for f in data["failures"]] + [""]
    return "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results",
                   help="directory for kernel_build.md/.json (default: %(default)s)")
    p.add_argument("--tree", type=Path, default=None,
                   help="patched tree from `dsv4patch apply` (default: make one in a temp dir)")
    p.add_argument("--pin", default="0.27.1", help="pin to build (default: %(default)s)")
    p.add_argument("--lock", type=Path, default=REPO / "locks" / "vllm.toml", help="lock file")
    p.add_argument("--python", default=None,
                   help="interpreter with torch (default: $DSV4PATCH_TORCH_PYTHON, a venv under "
                        "<seed-cache>/venvs, else this one)")
    p.add_argument("--seed-cache", type=Path, default=None,
                   help="existing dsv4patch cache: source of the cuBLAS headers copied into the fresh "
                        "caches, and cache for making the tree (default: $DSV4PATCH_CACHE or "
                        "~/.cache/dsv4patch)")
    p.add_argument("--baseline-arch", default="9.0a", help="arch for the whole-list baseline")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--sample", type=int, default=8,
                   help="compile at most this many baseline TUs (default: %(default)s)")
    g.add_argument("--all", action="store_true", help="compile every baseline TU that preprocesses")
    p.add_argument("--max-jobs", type=int, default=None,
                   help="parallel compiles for the baseline (default: the pin's build.max_jobs)")
    p.add_argument("--no-cmake-extras", action="store_true",
                   help="baseline with dsv4patch's flags only, without the Python include dir and "
                        "--expt-extended-lambda that CMake adds (some TUs then fail)")
    p.add_argument("--skip-baseline", action="store_true", help="only the targeted measurements")
    p.add_argument("--keep-tmp", action="store_true", help="keep the temporary caches/objects")
    a = p.parse_args(argv)

    seed = (a.seed_cache or Settings.from_environ(os.environ).cache_root()).resolve()
    lock_path = a.lock.resolve()
    pin = load_lock(lock_path).pin(a.pin)
    max_jobs = a.max_jobs or pin.build.max_jobs
    python = a.python or find_python(seed)
    work = Path(tempfile.mkdtemp(prefix="dsv4patch-kbench-"))
    failures: list[str] = []
    try:
        tree = a.tree.resolve() if a.tree else work / "tree"
        if not tree.exists():
            make_tree(a.pin, lock_path, seed, tree)
        nvcc = kbuild.find_nvcc()
        nvcc_v = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=False).stdout
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), platform.processor())
        data: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv[1:] if argv is None else argv,
            "pin": a.pin, "tree": str(tree),
            "tree_id": sources.plan(tree).tree_id, "python": python, "max_jobs": max_jobs,
            "nvcc_threads": pin.build.nvcc_threads,
            "environment": {"cpus": os.cpu_count(), "cpu": cpu, "platform": platform.platform(),
                            "nvcc": (nvcc_v.strip().splitlines() or ["?"])[-1] + f" ({nvcc})"},
        }
        data["targeted"] = targeted(tree, lock_path, a.pin, python, seed, work)
        if not a.skip_baseline:
            data["baseline"] = baseline(tree, a.baseline_arch, python, work, seed, max_jobs,
                                        pin.build.nvcc_threads, None if a.all else a.sample,
                                        not a.no_cmake_extras)
            for tu in data["baseline"]["tus"]:
                if tu["preprocess"] == "failed":
                    failures.append(f"{tu['path']}: preprocess failed: {tu['preprocess_error']}")
                elif tu["compile"] == "failed":
                    failures.append(f"{tu['path']}: compile failed: {tu['compile_error']}")
        cold = data["targeted"]["cold"]["wall_s"]
        data["ratios"] = {"incremental_over_targeted_cold": data["targeted"]["incremental"]["wall_s"] / cold}
        if "baseline" in data:
            data["ratios"]["targeted_cold_over_whole_list"] = cold / data["baseline"]["whole_list_wall_s"]
            data["ratios"]["whole_list_is_estimate"] = not data["baseline"]["whole_list_measured"]
            data["ratios"]["targeted_cold_over_compiled_part"] = cold / data["baseline"]["sample_wall_s"]
        data["failures"] = failures
        write_report(a.out, "kernel_build", data, render(data))
        log(f"wrote {a.out / 'kernel_build.md'} and .json")
        print(render(data))
    finally:
        if a.keep_tmp:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
