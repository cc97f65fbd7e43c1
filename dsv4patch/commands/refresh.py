"""``dsv4patch refresh``: the commits of a tree on top of its pin's base become the series.

The quilt-refresh step itself is :func:`dsv4patch.forks.refreshing.refresh`; this
command reads the options, calls it and renders what was written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dsv4patch import report
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK, EXIT_UNEXPECTED

HELP = "write a tree's commits on top of its pin's base back as the patch series (quilt refresh)"
def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("refresh", help=HELP, description=HELP)
    _common.add_lock(p, many=False, pin_help=_common.TREE_PIN_HELP)
    p.add_argument("--tree", type=Path, required=True, help="a tree made by `dsv4patch apply`, with your commits")
    p.add_argument("--as-variant", action="store_true",
                   help="write changed patches as the pin's variants (patches/variants/PIN/) "
                        "instead of over the series files other pins share")
    _common.add_output(p)
    _common.add_cache(p)


def run(args: argparse.Namespace) -> int:
    from dsv4patch.checkout import tree_pin
    from dsv4patch.forks import refresh

    path = _common.tree_path(args)
    lock = _common.open_lock(args)
    pin = tree_pin(path=path, lock=lock, pin=args.pin)
    res = refresh(ctx=_common.context(args, lock), pin=pin, tree_path=path, as_variant=args.as_variant,
                  chosen_series=args.series)
    rows = [[name, v["action"], v["file"]] for name, v in res.patches.items()]
    table, md = report.simple_table(f"dsv4patch refresh {path}", ["patch", "action", "file"], rows)
    report.emit(args.format, res.to_json(), table, md)
    return EXIT_OK if res.ok else EXIT_UNEXPECTED
