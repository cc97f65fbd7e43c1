"""``dsv4patch wheel``: the pin's stock vLLM wheel with the patches and rebuilt kernels in it.

The output installs like any vLLM wheel (``pip install --no-deps``, ``uv pip
install``, an index) and is what the Docker image installs; see
:mod:`dsv4patch.delivery.vllm_wheel` for what changes and why the wheel is repacked
rather than rebuilt with vLLM's ``VLLM_USE_PRECOMPILED`` route.

The kernel library comes from ``--kernels WHEEL`` (a ``dsv4patch build`` wheel
of the same pin and patched tree, e.g. from a CUDA machine) or, without it,
is built here: the patched tree is created in the cache (as ``apply`` does)
and its kernels are built (needs nvcc and a torch, ``--python``).  The work is
:func:`dsv4patch.delivery.vllm_wheel.make_wheel`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dsv4patch import report
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK
from dsv4patch.pins import WHEEL_PLATFORMS

HELP = "make the patched vLLM wheel from the pin's stock wheel (patched files + rebuilt kernels)"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("wheel", help=HELP, description=HELP)
    _common.add_lock(p, many=False)
    p.add_argument("--out", type=Path, default=None,
                   help=f"output directory (default: {_common.DEFAULT_OUT_DIR}/ in the lock's project: the directory "
                        "that holds its locks/)")
    p.add_argument("--platform", choices=WHEEL_PLATFORMS, default=None,
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


def run(args: argparse.Namespace) -> int:
    from dsv4patch.delivery import make_wheel

    lock = _common.open_lock(args)
    out, out_note = _common.default_out(args.out, lock.path)
    prog = _common.progress(args)
    with prog.step(f"wheel: pin {lock.pin(args.pin).name}"):  # the screen never stands still
        res = make_wheel(ctx=_common.context(args, lock, prog), pin=lock.pin(args.pin), out=out,
                         platform=args.platform,
                         kernels=args.kernels, archs=args.arch,
                         python=args.python or _common.settings().torch_python, nvcc=args.nvcc,
                         allow_torch=args.allow_torch, extra_include=args.extra_include)
    rep = res.to_json()
    if out_note is not None:
        rep["notes"] = [out_note, *rep.get("notes", [])]
    report.emit(args.format, rep, *res.table())
    return EXIT_OK
