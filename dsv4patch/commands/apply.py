"""``dsv4patch apply``: check, then commit each patch into the tree, atomically.

The work is :func:`dsv4patch.checkout.applying.apply_pin` (the tree transaction is
:mod:`dsv4patch.checkout.transaction`, the ``--3way`` workspace :mod:`dsv4patch.checkout.resolving`);
this command reads its options, passes them on and renders the result.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dsv4patch.commands import _common
from dsv4patch.errors import UsageError

if TYPE_CHECKING:
    from dsv4patch.checkout import ApplyResult
    from dsv4patch.pins import Context, Pin

HELP = "apply a pin's patch series to a tree as commits (creates the tree if absent)"
DEFAULT_TREE_DIR = _common.DEFAULT_TREE_DIR  # without --tree: vllm-src/<pin> in the lock's project


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("apply", help=HELP, description=HELP)
    _common.add_lock(p, many=False)
    p.add_argument("--tree", type=Path, default=None,
                   help=f"the vLLM source tree to patch (default: {DEFAULT_TREE_DIR}/<pin> in the lock's project: the "
                        "directory that holds its locks/, wherever you run from)")
    p.add_argument(
        "--no-build", dest="build", action="store_false",
        help="do not rebuild the CUDA kernels the patches touch (then run `dsv4patch build` "
        "before shipping: without it the kernel fixes are not in effect)",
    )
    p.add_argument("--out", type=Path, default=None, help=f"where the kernel wheel goes (default: {_common.DEFAULT_OUT_DIR}/ in the lock's project)")
    _common.add_toolchain_options(p, prefix="kernel build: ")
    p.add_argument(
        "--3way", dest="three_way", action="store_true",
        help="on a conflict, commit the patches before it, apply the failing one 3-way with "
        "conflict markers and stop; then `dsv4patch resolve --continue` or `--abort`",
    )
    p.add_argument(
        "--branch", default=None, metavar="NAME",
        help="with --tree on your own checkout of a git or local pin (a fork): commit the series "
        "on a new branch NAME made at HEAD (default: on the current branch)",
    )
    _common.add_output(p)
    _common.add_cache(p)


def run(args: argparse.Namespace) -> int:
    from dsv4patch.checkout import branch_name_problem

    if args.branch is not None:
        problem = branch_name_problem(args.branch)
        if problem:
            raise UsageError(f"--branch {problem}")
    lock = _common.open_lock(args)
    pin = lock.pin(args.pin)
    default_tree = args.tree is None
    root = _common.project_dir(lock.path)
    path = _common.checked_tree(root / DEFAULT_TREE_DIR / pin.name if default_tree else args.tree)
    notes = []
    if default_tree:
        notes.append(f"tree: {path} (the default for pin {pin.name}: {DEFAULT_TREE_DIR}/{pin.name} in the "
                     f"project {root}, found from the lock; --tree to choose)")
    out, out_note = _common.default_out(args.out, lock.path, used=args.build)
    if out_note is not None and args.build:
        notes.append(out_note)
    ctx = _common.context(args, lock)
    shown: list[ApplyResult] = []

    prog = ctx.progress

    def before_build(done: ApplyResult) -> None:
        # Text output: what apply did is shown before the kernel step, which takes minutes.
        if args.format == "text":
            with prog.paused():
                _common.render_apply(args.format, done)
            shown.append(done)

    # One line on the terminal for the whole command, the steps below it: the screen never stands still.
    with prog.step(f"apply pin {pin.name} into {path}"):
        result = _apply(args, ctx, pin, path, before_build, notes, out)
    if shown:  # the table is out: only what the kernel step added
        return _common.render_notes(args.format, result.notes[len(shown[0].notes):], result)
    return _common.render_apply(args.format, result)


def _apply(args: argparse.Namespace, ctx: Context, pin: Pin, path: Path,
           before_build: Callable[[ApplyResult], None], notes: list[str], out: Path) -> ApplyResult:
    from dsv4patch.checkout import Invocation, apply_pin

    return apply_pin(
        ctx=ctx, pin=pin, tree_path=path,
        three_way=args.three_way,
        build=_common.kernel_build(ctx=ctx, out=out, python=args.python, nvcc=args.nvcc,
                                   allow_torch=args.allow_torch) if args.build else None,
        before_build=before_build,
        notes=notes,
        branch=args.branch,
        invocation=Invocation(series=tuple(args.series) if args.series else None,
                              cache_dir=args.cache_dir, build=args.build, out=args.out, python=args.python,
                              nvcc=args.nvcc, allow_torch=args.allow_torch),
    )
