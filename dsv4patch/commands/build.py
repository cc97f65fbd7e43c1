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
``--format json``, and runs, installs and downloads nothing (a toolchain not in
the cache yet is reported as what a build would install first).  The work is :mod:`dsv4patch.kernels.building`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dsv4patch import report
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK

HELP = "rebuild the CUDA kernels the applied patches change (or the whole tree with --full)"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("build", help=HELP, description=HELP)
    _common.add_lock(p, many=False, pin_help=_common.TREE_PIN_HELP)
    p.add_argument("--tree", type=Path, required=True, help="a tree made by dsv4patch apply")
    add_build_options(p)
    _common.add_output(p)
    _common.add_cache(p)


def add_build_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", action="append", default=None,
                   help="CUDA arch as in TORCH_CUDA_ARCH_LIST, e.g. 9.0a, 10.0f or 12.0+PTX "
                        "(repeatable; default: the pin's cuda_arch_list, else the list vLLM's "
                        "release wheels for this machine use, read from the tree)")
    p.add_argument("--out", type=Path, default=None,
                   help=f"directory for the kernel wheel (default: {_common.DEFAULT_OUT_DIR}/ in the lock's project: "
                        "the directory that holds its locks/)")
    p.add_argument("--full", action="store_true",
                   help="build the whole tree with vLLM's own build (pip install .)")
    p.add_argument("--docker", action="store_true",
                   help="with --full: docker build -f docker/Dockerfile instead of pip")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan and the compile commands; install, download and compile nothing "
                        "(a toolchain not in the cache yet: what a build would install first)")
    _common.add_toolchain_options(p)
    p.add_argument("--extra-include", type=Path, action="append", default=[],
                   help="extra include dir, e.g. one holding cublas_v2.h (repeatable)")
    p.add_argument("--base", default=None,
                   help="commit the patches start from (default: the tree's root commit)")


def run(args: argparse.Namespace) -> int:
    from dsv4patch.checkout import tree_pin
    from dsv4patch.kernels import build_tree, full_build

    path = _common.tree_path(args)
    lock = _common.open_lock(args)
    pin = tree_pin(path=path, lock=lock, pin=args.pin)
    store = _common.open_store(args)
    python = args.python or _common.settings().torch_python
    if args.full:
        full = full_build(tree=path, pin=pin, archs=args.arch, python=python, nvcc=args.nvcc,
                          docker=args.docker, dry_run=args.dry_run)
        report.emit(args.format, full.to_json(), None, None)
        return EXIT_OK
    out, out_note = _common.default_out(args.out, lock.path)
    built = build_tree(tree=path, pin=pin, store=store, progress=_common.progress(args),
                       archs=args.arch, python=python, nvcc=args.nvcc,
                       allow_torch=args.allow_torch, extra_include=args.extra_include,
                       out=out, base=args.base,
                       dry_run=args.dry_run)
    rep = built.to_json()
    if out_note is not None:
        rep["notes"] = [out_note, *rep.get("notes", [])]
    report.emit(args.format, rep, *built.table())
    return EXIT_OK
