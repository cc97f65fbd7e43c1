"""Benchmark: the card's command, ``dsv4patch apply --lock locks/vllm.toml``, cold and warm.

Why
---
On a fresh machine the card's command does everything: fetches the pinned
sdist, patches the tree, installs the pin's torch (and, without a system nvcc
of its CUDA major, NVIDIA's nvcc wheels) into the cache, compiles the patched
kernel units and writes the kernel wheel.  This measures that cold, then warm
(a second run: nothing to download, install or compile), and compares the
compile with what a user did before dsv4patch installed torch itself: make a
venv by hand (``pip install torch==<pin's torch>``), then ``dsv4patch build
--python`` it (fresh object cache, so the same units compile again).

Each run gets a fresh project directory (the checkout's ``locks/`` and
``patches/``, as a clone has them) and, for cold, a fresh ``DSV4PATCH_CACHE``.
``--arch A`` (repeatable) writes ``cuda_arch_list`` into the copied lock's pin
to compile for fewer archs than the default release list (say so in results).
``--no-nvcc`` hides the system toolkit (``unshare -m``, root) so the lock's
NVIDIA wheels are installed and timed too.

Usage::

    .venv/bin/python benchmarks/card_command.py --out benchmarks/results [--arch 9.0a ...] [--no-nvcc]

Writes ``<out>/card_command.json`` and ``<out>/card_command.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _project(base: Path, archs: list[str]) -> Path:
    proj = base / "proj"
    shutil.copytree(ROOT / "locks", proj / "locks")
    shutil.copytree(ROOT / "patches", proj / "patches")
    if archs:
        lock = proj / "locks" / "vllm.toml"
        text = lock.read_text()
        arch = "cuda_arch_list = [" + ", ".join(json.dumps(a) for a in archs) + "]\n"
        text = text.replace('[pins."0.27.1"]\n', '[pins."0.27.1"]\n' + arch, 1)
        lock.write_text(text)
    return proj


def _hide_prefix(tmp: Path) -> list[str]:
    empty = tmp / "empty"
    empty.mkdir(exist_ok=True)
    cmds = [f"mount --bind {empty} {Path('/usr/local/cuda').resolve()}"]
    cmds += [f"mount --bind /dev/null {p}" for p in ("/usr/local/bin/nvcc", "/usr/bin/nvcc") if Path(p).exists()]
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", " && ".join(cmds) + ' && exec "$@"', "sh"]


def _timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.monotonic()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    return time.monotonic() - t0, res


def _downloads(cache: Path) -> list[dict[str, object]]:
    """What the cold run fetched: the sdist blob, pip's downloads, the cublas wheel."""
    out: list[dict[str, object]] = []
    for blob in sorted((cache / "blobs" / "sha256").glob("*")):
        out.append({"what": f"blob {blob.name[:12]} (sdist)", "bytes": blob.stat().st_size})
    for log in sorted((cache / "toolchains").glob("*/pip.log")):
        text = log.read_text(errors="replace")
        for name, size, unit in re.findall(r"Downloading (\S+\.whl) \(([\d.]+) ([kMG]B)\)", text):
            mult = {"kB": 1e3, "MB": 1e6, "GB": 1e9}[unit]
            out.append({"what": f"{name} (pip, {log.parent.name})", "bytes": int(float(size) * mult)})
        for name in re.findall(r"Processing (\S+\.whl)", text):
            p = Path(name)
            out.append({"what": f"{p.name} (pip, from a local mirror, {log.parent.name})",
                        "bytes": p.stat().st_size if p.is_file() else None, "local": True})
    for rec in sorted((cache / "kernels" / "cublas-headers").glob("*/wheel.json")):
        info = json.loads(rec.read_text())
        out.append({"what": f"{info['wheel']} (pip download from the index or a local mirror; include/ kept)",
                    "bytes": info["size"]})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--arch", action="append", default=[])
    ap.add_argument("--no-nvcc", action="store_true")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="card-bench-"))
    dsv = [sys.executable, "-m", "dsv4patch"]
    base_env = {k: v for k, v in os.environ.items() if k not in ("DSV4PATCH_TORCH_PYTHON", "DSV4PATCH_LOCK")}
    prefix = _hide_prefix(tmp) if args.no_nvcc else []
    cache = tmp / "cache"
    env = {**base_env, "DSV4PATCH_CACHE": str(cache)}
    results: dict[str, object] = {
        "machine": f"{os.cpu_count()} CPU(s), {platform.platform()}",
        "archs": args.arch or "default (vLLM's release list for this machine)",
        "system_nvcc_hidden": args.no_nvcc, "load_before": list(os.getloadavg()),
    }
    proj = _project(tmp / "cold", args.arch)
    cold_s, cold = _timed([*prefix, *dsv, "apply", "--lock", "locks/vllm.toml", "--format", "json"], proj, env)
    if cold.returncode != 0:
        print(cold.stderr[-4000:], file=sys.stderr)
        return 1
    rep = json.loads(cold.stdout)["build"]
    results["cold"] = {"wall_s": round(cold_s, 1), "units": {u["unit"]: u["seconds"] for u in rep["units"]},
                       "toolchain": rep["toolchain"], "archs": rep["archs"]}
    results["downloads"] = _downloads(cache)
    # Warm: the same command again in the same project (nothing to do), then in a new project
    # (a new tree from the cached pin; the objects and the toolchain are cached).
    for key, where in (("warm", proj), ("warm_new_tree", _project(tmp / "warm", args.arch))):
        warm_s, warm = _timed([*prefix, *dsv, "apply", "--lock", "locks/vllm.toml", "--format", "json"], where, env)
        assert warm.returncode == 0, warm.stderr[-3000:]
        wrep = json.loads(warm.stdout)["build"]
        assert wrep["compiled"] == [], wrep["compiled"]
        results[key] = {"wall_s": round(warm_s, 1), "compiled": wrep["compiled"]}
    # The hand-made environment: a venv and `pip install torch==X` (with its dependencies, as a
    # user would), then `dsv4patch build --python` with a fresh object cache.
    torch = rep["toolchain"]["torch_required"]
    venv = tmp / "handmade"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"torch=={torch}"],
                         capture_output=True, text=True)
    env_s = time.monotonic() - t0
    assert pip.returncode == 0, pip.stderr[-3000:]
    du = subprocess.run(["du", "-sb", str(venv)], capture_output=True, text=True).stdout.split()[0]
    hand_env = {**base_env, "DSV4PATCH_CACHE": str(tmp / "cache-hand")}
    build_s, hand = _timed([*prefix, *dsv, "build", "--lock", str(proj / "locks" / "vllm.toml"), "--tree",
                            str(proj / "vllm-src" / "0.27.1"), "--python", str(venv / "bin" / "python"),
                            "--out", str(tmp / "hand-dist"), "--format", "json"], proj, hand_env)
    assert hand.returncode == 0, hand.stderr[-3000:]
    hrep = json.loads(hand.stdout)
    results["handmade"] = {"env_s": round(env_s, 1), "env_bytes": int(du), "build_wall_s": round(build_s, 1),
                           "units": {u["unit"]: u["seconds"] for u in hrep["units"]},
                           "torch": hrep["toolchain"]["torch"]}
    results["load_after"] = list(os.getloadavg())
    results["toolchain_bytes"] = int(subprocess.run(["du", "-sb", str(cache / "toolchains")], capture_output=True,
                                                    text=True).stdout.split()[0])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "card_command.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "card_command.md").write_text(_markdown(results, sys.argv[1:]))
    print(_markdown(results, sys.argv[1:]))
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _markdown(r: dict, argv: list[str]) -> str:
    cold, warm, hand = r["cold"], r["warm"], r["handmade"]
    tc = cold["toolchain"]
    dl = r["downloads"]
    net = sum(int(d["bytes"] or 0) for d in dl if not d.get("local"))
    local = sum(int(d["bytes"] or 0) for d in dl if d.get("local"))
    lines = [
        "# The card's command, cold and warm",
        "",
        f"Generated by `benchmarks/card_command.py {' '.join(argv)}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {r['machine']}; load average "
        f"before/after {r['load_before']} / {r['load_after']} (the machine is shared: times include contention).",
        "",
        f"- archs: {' '.join(cold['archs'])} ({'reduced with --arch' if isinstance(r['archs'], list) else r['archs']})",
        f"- torch {tc['torch']} ({tc['torch_origin']}); nvcc {tc['cuda']} {tc['nvcc']} ({tc['nvcc_origin']})",
        "",
        "| run | wall (s) | compiled |",
        "|---|---|---|",
        f"| cold: sdist + apply + toolchain + compile + wheel | {cold['wall_s']} | "
        + ", ".join(f"{Path(u).name} {s}s" for u, s in cold["units"].items()) + " |",
        f"| warm: the same command again (nothing to do) | {warm['wall_s']} | nothing |",
        f"| warm cache, new project (a new tree) | {r['warm_new_tree']['wall_s']} | nothing |",
        f"| hand-made env: venv + `pip install torch=={tc['torch_required']}` | {hand['env_s']} | "
        f"({hand['env_bytes'] / 1e9:.2f} GB, torch {hand['torch']}) |",
        f"| hand-made env: `dsv4patch build --python` (fresh object cache) | {hand['build_wall_s']} | "
        + ", ".join(f"{Path(u).name} {s}s" for u, s in hand["units"].items()) + " |",
        "",
        f"Downloads of the cold run: {net / 1e6:.0f} MB ({local / 1e6:.0f} MB more pip read from a local "
        f"wheel mirror); the toolchain in the cache takes {r['toolchain_bytes'] / 1e9:.2f} GB.",
        "",
        "| download | bytes |",
        "|---|---|",
        *[f"| {d['what']} | {d['bytes']} |" for d in dl],
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
