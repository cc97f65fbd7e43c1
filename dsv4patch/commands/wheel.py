"""``dsv4patch wheel``: the pin's stock vLLM wheel with the patches and rebuilt kernels in it.

The output installs like any vLLM wheel (``pip install --no-deps``, ``uv pip
install``, an index) and is what the Docker image installs; see
:mod:`dsv4patch.vllm_wheel` for what changes and why the wheel is repacked
rather than rebuilt with vLLM's ``VLLM_USE_PRECOMPILED`` route.

The kernel library comes from ``--kernels WHEEL`` (a ``dsv4patch build`` wheel
of the same pin and patched tree, e.g. from a CUDA machine) or, without it,
is built here: the patched tree is created in the cache (as ``apply`` does)
and ``dsv4patch build`` runs on it (needs nvcc and a torch, ``--python``).
"""

from __future__ import annotations

import argparse
import platform
import shutil
from pathlib import Path
from typing import Any

from dsv4patch import applying, building, report, vllm_wheel
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK, BuildError, UsageError
from dsv4patch.kernels import stock
from dsv4patch.lock import Lock, Pin
from dsv4patch.progress import Progress
from dsv4patch.store import Store

HELP = "make the patched vLLM wheel from the pin's stock wheel (patched files + rebuilt kernels)"
PLATFORMS = ("x86_64", "aarch64")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("wheel", help=HELP, description=HELP)
    _common.add_lock(p, many=False)
    p.add_argument("--out", type=Path, default=Path("dist"), help="output directory (default: %(default)s)")
    p.add_argument("--platform", choices=PLATFORMS, default=None,
                   help="which stock wheel of the lock to patch (default: this machine's)")
    p.add_argument("--kernels", type=Path, default=None,
                   help="the kernel wheel `dsv4patch build` made for this pin and platform "
                        "(default: build it here; needs nvcc and torch)")
    _common.add_toolchain_options(p, prefix="without --kernels: ")
    p.add_argument("--arch", action="append", default=None,
                   help="without --kernels: CUDA arch (repeatable; default as `dsv4patch build`)")
    p.add_argument("--extra-include", type=Path, action="append", default=[],
                   help="without --kernels: extra include dir (repeatable)")
    _common.add_output(p)
    _common.add_cache(p)


def host_platform() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def build_kernels(lock: Lock, pin: Pin, store: Store, args: argparse.Namespace,
                  patched_tree: str) -> Path | None:
    """Create the patched tree in the cache and run ``dsv4patch build`` on it; the kernel wheel."""
    tree = store.root / "wheel-trees" / f"{pin.name}-{patched_tree[:12]}"
    applied = applying.apply_pin(lock=lock, pin=pin, store=store, tree_path=tree,
                                 progress=_common.progress(args))
    if not applied.ok:
        raise BuildError(f"pin {pin.name}: apply into {tree} failed: {'; '.join(applied.notes)[-2000:]}")
    out_dir = store.tmpdir("kernels-wheel-")
    try:
        built = building.build_tree(tree=tree, pin=pin, store=store, progress=Progress.for_output("json"),
                                    archs=args.arch, python=args.python, nvcc=args.nvcc,
                                    allow_torch=args.allow_torch, extra_include=args.extra_include, out=out_dir)
    except BaseException:
        shutil.rmtree(out_dir, ignore_errors=True)  # a failed build leaves nothing in the cache
        raise
    if built.wheel is None:
        shutil.rmtree(out_dir, ignore_errors=True)
    return built.wheel


def run(args: argparse.Namespace) -> int:
    lock = _common.open_lock(args)
    pin = lock.pin(args.pin)
    store = _common.open_store(args)
    prog = _common.progress(args)
    plat = args.platform or host_platform()
    wheel = stock.wheel_for(pin, plat)
    tree = vllm_wheel.patched_tree(lock, pin, store, prog)
    kernel_sources = [f.path for f in tree.files if f.path.startswith("csrc/")]
    notes: list[str] = []
    kernels = None
    tmp_kernels: Path | None = None
    if args.kernels is not None:
        kernels = vllm_wheel.read_kernels(args.kernels, pin, tree.patched_tree, plat)
    elif kernel_sources:
        if plat != host_platform():
            raise UsageError(
                f"--platform {plat}: the kernel library is built for this machine "
                f"({host_platform()}); build it on a {plat} machine with `dsv4patch build --pin "
                f"{pin.name}` and pass the wheel with --kernels")
        kwheel = build_kernels(lock, pin, store, args, tree.patched_tree)
        if kwheel is None:
            raise BuildError(f"pin {pin.name}: the patches change {', '.join(kernel_sources)} but "
                             "`dsv4patch build` produced no kernel library")
        tmp_kernels = kwheel.parent
        kernels = vllm_wheel.read_kernels(kwheel, pin, tree.patched_tree, plat)
        notes.append(f"kernel library built here for torch {kernels.info.get('torch_version')}, "
                     f"CUDA {kernels.info.get('cuda_version')}")
    else:
        notes.append("the patches change no kernel source: no kernel library added")
    try:
        blob = stock.wheel_path(store, wheel, prog)
        built = vllm_wheel.build(tree, blob, wheel, kernels, args.out)
    finally:
        if tmp_kernels is not None:
            shutil.rmtree(tmp_kernels, ignore_errors=True)
    out: dict[str, Any] = {
        "pin": pin.name, "platform": plat, "wheel": str(built.path), "version": built.version,
        "patch_set_sha256": tree.series.hash(), "patched_tree": tree.patched_tree,
        "stock_wheel": {"url": wheel.url, "sha256": wheel.sha256},
        "replaced": built.replaced, "added": built.added, "removed": built.removed,
        "not_shipped": built.not_shipped, "hooked": built.hooked,
        "kernels": None if kernels is None else {"package": kernels.dist, "from": str(kernels.source)
                                                 if args.kernels else "built here",
                                                 "ops": kernels.info.get("ops")},
    }
    rows = [[p, "replaced"] for p in built.replaced] + [[p, "added"] for p in built.added] + \
           [[p, "removed"] for p in built.removed] + \
           ([[built.hooked, "kernels hook line appended"]] if built.hooked else [])
    out["notes"] = notes + [
        f"wheel: {built.path}",
        f"version {built.version} (patch set {tree.series.hash()[:12]}, tree {tree.patched_tree[:12]})",
        f"not in the wheel (not shipped by vLLM's wheel): {len(built.not_shipped)} file(s)"
        + (" (kernel sources: in the kernel library)" if kernel_sources else ""),
    ]
    table, md = report.simple_table(f"dsv4patch wheel: {pin.name} ({plat})", ["file", "change"], rows)
    report.emit(args.format, out, table, md)
    return EXIT_OK

