"""``dsv4patch build``: rebuild the CUDA kernels a patched tree changes.

Default (kernel mode): compile only the translation units the applied patches
touch and package them as a small plugin wheel ``dsv4patch_kernels_<pin>``
that overrides those ops in the stock vLLM wheel (see
:mod:`dsv4patch.kernels.build`).  The arch list is ``--arch``, else the pin's
``cuda_arch_list``, else the one vLLM's release wheels for this machine are
built with (read from the tree); each unit then gets the archs vLLM's CMake
gives it from that list, so the plugin covers what the stock wheel covers.  ``--full`` hands the whole tree
to vLLM's own build instead (``pip install .``, or ``docker build`` with
``--docker``) with ``TORCH_CUDA_ARCH_LIST``, ``MAX_JOBS`` and ``NVCC_THREADS``
from the lock.  ``--dry-run`` prints what would run, as JSON with
``--format json``, and runs nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from dsv4patch import report, toolchain
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK, BuildError
from dsv4patch.kernels import build as kbuild
from dsv4patch.kernels import sources
from dsv4patch.lock import Pin
from dsv4patch.store import Store

HELP = "rebuild the CUDA kernels the applied patches change (or the whole tree with --full)"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("build", help=HELP, description=HELP)
    _common.add_lock(p, many=False)
    p.add_argument("--tree", type=Path, required=True, help="a tree made by dsv4patch apply")
    add_build_options(p)
    _common.add_output(p)
    _common.add_cache(p)


def add_build_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", action="append", default=None,
                   help="CUDA arch as in TORCH_CUDA_ARCH_LIST, e.g. 9.0a, 10.0f or 12.0+PTX "
                        "(repeatable; default: the pin's cuda_arch_list, else the list vLLM's "
                        "release wheels for this machine use, read from the tree)")
    p.add_argument("--out", type=Path, default=Path("dist"),
                   help="directory for the kernel wheel (default: %(default)s)")
    p.add_argument("--full", action="store_true",
                   help="build the whole tree with vLLM's own build (pip install .)")
    p.add_argument("--docker", action="store_true",
                   help="with --full: docker build -f docker/Dockerfile instead of pip")
    p.add_argument("--dry-run", action="store_true", help="print the plan/commands, run nothing")
    _common.add_toolchain_options(p)
    p.add_argument("--extra-include", type=Path, action="append", default=[],
                   help="extra include dir, e.g. one holding cublas_v2.h (repeatable)")
    p.add_argument("--base", default=None,
                   help="commit the patches start from (default: the tree's root commit)")


def _opt(args: argparse.Namespace, name: str, default: Any = None) -> Any:
    return getattr(args, name, default)


def resolve_archs(
    path: Path, pin: Pin, args: argparse.Namespace, cuda_version: str | None
) -> tuple[tuple[str, ...], str]:
    """(TORCH_CUDA_ARCH_LIST to build for, where it came from)."""
    if _opt(args, "arch"):
        return tuple(_opt(args, "arch")), "--arch"
    if pin.cuda_arch_list:
        return pin.cuda_arch_list, f'lock: pins."{pin.name}".cuda_arch_list'
    rel = sources.release_arch_list(path, cuda_version, platform.machine())
    return rel.archs, f"vLLM release list for {platform.machine()} ({rel.origin})"


def _nvcc_version(args: argparse.Namespace) -> str | None:
    try:
        return kbuild.nvcc_version(kbuild.find_nvcc(_opt(args, "nvcc")))[1]
    except BuildError:
        return None


def build_tree(
    path: Path, pin: Pin, store: Store, args: argparse.Namespace, emit: bool = True
) -> tuple[int, dict[str, Any]]:
    """Build ``path`` for ``pin``; returns (exit code, report), printing it if ``emit``."""
    fmt = _opt(args, "format", "text") if emit else "none"
    if _opt(args, "full", False):
        archs, origin = resolve_archs(path, pin, args, _nvcc_version(args))
        return _full(path, pin, archs, origin, args, fmt)
    plan = sources.plan(path, _opt(args, "base"))
    tc = toolchain.resolve(
        store=store, pin=pin, tree=path, progress=_common.progress(args),
        nvcc=_opt(args, "nvcc"), python=_opt(args, "python"), allow_torch=_opt(args, "allow_torch"),
        extra_includes=_opt(args, "extra_include", []) or [],
    )
    archs, origin = resolve_archs(path, pin, args, tc.cuda_version)
    out_dir = Path(_opt(args, "out", Path("dist")) or Path("dist"))
    result = kbuild.build(
        plan, pin_name=pin.name, vllm_version=pin.vllm_version, archs=archs, store=store,
        toolchain=tc, out_dir=out_dir, max_jobs=pin.build.max_jobs,
        nvcc_threads=pin.build.nvcc_threads, progress=_common.progress(args),
        dry_run=_opt(args, "dry_run", False), arch_origin=origin,
    )
    out: dict[str, Any] = {
        "mode": "kernels", "pin": pin.name, "dry_run": bool(_opt(args, "dry_run", False)),
        "toolchain": {"nvcc": str(tc.nvcc), "cuda": tc.cuda_version, "torch": tc.torch_version,
                      "torch_cuda": tc.torch_cuda_version, "machine": tc.machine,
                      "torch_required": tc.torch_required, "torch_origin": tc.torch_origin,
                      "nvcc_origin": tc.nvcc_origin, "torch_mismatch": tc.torch_mismatch,
                      "include_dirs": [str(d) for d in tc.include_dirs]},
        **result.to_dict(),
    }
    if out["dry_run"]:
        out["commands"] = [u.command for u in result.units]
    rows = [[u.source, " ".join(u.archs) or "-", "cached" if u.cached else
             ("would compile" if out["dry_run"] else f"compiled {u.seconds:.0f}s")]
            for u in result.units]
    out["notes"] = [tc.describe(), *result.notes] + [
        f"archs: {' '.join(archs)} (from {origin})",
        f"ops: {', '.join(result.ops) or 'none'}",
        *([f"wheel: {result.wheel}"] if result.wheel else []),
    ]
    table, md = report.simple_table(f"dsv4patch build: {path}", ["unit", "archs", "result"], rows)
    if fmt != "none":
        report.emit(fmt, out, table, md)
    return EXIT_OK, out


def _full(
    path: Path, pin: Pin, archs: tuple[str, ...], origin: str, args: argparse.Namespace, fmt: str
) -> tuple[int, dict[str, Any]]:
    python = _opt(args, "python") or os.environ.get("DSV4PATCH_TORCH_PYTHON") or "python3"
    cmd, env = kbuild.full_build_command(
        path, archs, pin.build.max_jobs, pin.build.nvcc_threads,
        docker=_opt(args, "docker", False), python=python, image=f"vllm-dsv4patch:{pin.name}",
    )
    out: dict[str, Any] = {"mode": "full", "pin": pin.name, "tree": str(path), "cwd": str(path),
                           "command": cmd, "env": env, "archs": list(archs), "arch_origin": origin,
                           "dry_run": bool(_opt(args, "dry_run", False))}
    if out["dry_run"]:
        out["notes"] = [" ".join(f"{k}={v!r}" for k, v in env.items()) + " " + " ".join(cmd)]
        if fmt != "none":
            report.emit(fmt, out, None, None)
        return EXIT_OK, out
    res = subprocess.run(cmd, cwd=path, env={**os.environ, **env})
    if res.returncode != 0:
        raise BuildError(f"`{' '.join(cmd)}` failed in {path} (exit {res.returncode})")
    out["notes"] = [f"built {path} with {' '.join(cmd)}"]
    if fmt != "none":
        report.emit(fmt, out, None, None)
    return EXIT_OK, out


def run(args: argparse.Namespace) -> int:
    path = _common.tree_path(args)
    lock = _common.open_lock(args)
    pin = lock.pin(args.pin)
    store = _common.open_store(args)
    return build_tree(path, pin, store, args)[0]
