"""``dsv4patch resolve``: finish or undo the conflict workspace that ``apply --3way`` opens.

The workspace and its state are :mod:`dsv4patch.checkout.resolving`.  ``--continue``
writes the resolution as the pin's variant (:func:`resolving.continue_workspace`)
and applies the rest with ``--3way`` (:func:`applying.apply_pin`): the next
conflict opens the next workspace, or the series completes.  ``--abort`` puts
the tree back at the commit it had before ``apply --3way``.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from dsv4patch import report
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK

HELP = "finish (--continue) or undo (--abort) the conflict workspace `apply --3way` left in a tree"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("resolve", help=HELP, description=HELP)
    _common.add_lock(p, pins=False, series=False)
    p.add_argument("--tree", type=Path, required=True, help="the tree `apply --3way` left a conflict in")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--continue", dest="cont", action="store_true",
                      help="write the resolution as the pin's variant, update the lock, go on applying")
    what.add_argument("--abort", action="store_true",
                      help="put the tree back at the commit it had before `apply --3way`")
    p.add_argument("--out", type=Path, default=None,
                   help=f"--continue: where the kernel wheel goes when apply builds (default: "
                        f"{_common.DEFAULT_OUT_DIR}/ in the lock's project, as apply's). The build takes this "
                        "command's --out, --python, --nvcc and --allow-torch, never values read from the tree: "
                        "one the `apply --3way` was given must be given again (its next step does) or another "
                        "value chosen, else exit 2 naming the command, nothing written")
    _common.add_toolchain_options(p, prefix="--continue: kernel build: ")
    _common.add_output(p)
    _common.add_cache(p)


def run(args: argparse.Namespace) -> int:
    from dsv4patch.checkout import Invocation, abort_workspace, apply_pin, continue_workspace
    from dsv4patch.pins import Context

    path = _common.tree_path(args)
    if args.cont:
        if args.out is not None:
            _common.default_out(args.out, None)  # a file where --out's directory goes: refused before anything runs
        store = _common.open_store(args)
        prog = _common.progress(args)
        given = Invocation(cache_dir=args.cache_dir, out=args.out, python=args.python, nvcc=args.nvcc,
                           allow_torch=args.allow_torch)
        done = continue_workspace(path=path, lock_path=args.lock or _common.settings().lock, store=store,
                                  progress=prog, given=given)
        state = done.state
        # The lock is the one the workspace's state names (read under the tree lock): the run's context now.
        ctx = Context(lock=done.lock, store=store, progress=prog, settings=_common.settings())
        wheel_dir, out_note = _common.default_out(args.out, done.lock.path)  # apply's default
        notes = done.notes + ([out_note] if out_note is not None and state.build else [])
        result = apply_pin(
            ctx=ctx, pin=done.pin, tree_path=path, three_way=True,
            build=_common.kernel_build(ctx=ctx, out=wheel_dir, python=args.python, nvcc=args.nvcc,
                                       allow_torch=args.allow_torch) if state.build else None,
            notes=notes, orig_head=state.orig_head,
            invocation=dataclasses.replace(given, series=tuple(state.series) if state.series else None,
                                           build=state.build),
        )
        return _common.render_apply(args.format, result)
    state = abort_workspace(path)
    out = {"tree": str(path), "ok": True, "head": state.orig_head, "notes": [
        f"aborted the conflict workspace of {state.patch} (pin {state.pin}): {path} is back "
        f"at {state.orig_head[:12]}"]}
    table, md = report.simple_table("dsv4patch resolve --abort", ["tree", "head"],
                                    [[str(path), state.orig_head[:12]]])
    report.emit(args.format, out, table, md)
    return EXIT_OK
