"""``dsv4patch status``: which patches a tree carries (``--tree``), or an installed vLLM (``--installed``).

The tree's status is :func:`dsv4patch.checkout.treestatus.tree_status` (decided by the
tree's content, not by commit trailers); this command reads the options, calls
it and renders the table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dsv4patch import report
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK, EXIT_UNEXPECTED, ParameterError, UsageError

if TYPE_CHECKING:
    from dsv4patch.delivery import InstalledReport

HELP = ("show which patches a tree carries, or (--installed) an installed vLLM, and whether "
        "they match the lock's series")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("status", help=HELP, description=HELP)
    p.add_argument("--tree", type=Path, default=None,
                   help=f"a tree made by dsv4patch apply (default: {_common.DEFAULT_TREE_DIR}/<pin> in the lock's "
                        f"project for --pin, else the only tree under {_common.DEFAULT_TREE_DIR}/ there)")
    p.add_argument("--lock", default=None, metavar="LOCK",
                   help="compare with this lock's series (default: $DSV4PATCH_LOCK, else locks/vllm.toml "
                        "here or in a parent directory; for --tree without --pin only when one of its pins has "
                        "this tree's base). With --installed it may be an https URL (then without its patch "
                        "files: the installed wheel's SBOM must describe the lock's patched tree); with "
                        "--installed and no lock anywhere, the installed wheel's own SBOM is the reference")
    p.add_argument("--pin", default=None,
                   help="pin to compare with; the tree must be one of its trees (its root is the pin's base_tree, "
                        "or a fork's checkout: HEAD descends from the pin's commit), else exit 5 naming the "
                        "tree's pin; no lock found is exit 2 (default: the pin whose base tree is this tree's "
                        "root, else with --lock the lock's default pin unless the tree is not one of its; else "
                        "none: the tree is not compared, which the notes and JSON's compared say; with "
                        "--installed: the pin of the installed vLLM's version)")
    p.add_argument("--installed", action="store_true",
                   help="instead of a tree: check the vLLM installed in --python's environment "
                        "(per patch present/stock/missing/other, the kernel library); exit 0 only "
                        "when everything matches the lock. It compares files and never runs the engine: "
                        "`dsv4patch selftest` does, on the node's GPU")
    p.add_argument("--python", default=None,
                   help="with --installed: the interpreter of the vLLM environment (default: "
                        "$DSV4PATCH_VLLM_PYTHON, else the one running dsv4patch)")
    p.add_argument("--format", choices=["text", "json", "cyclonedx"], default="text",
                   help="output format; cyclonedx (with --installed): print the installed vLLM's CycloneDX "
                        "SBOM as installed (exit 1 when it is absent, unreadable or does not match; on a "
                        "terminal its control characters are shown escaped)")
    _common.add_cache(p)


def _installed(args: argparse.Namespace) -> InstalledReport:
    """The full check against a lock and its patches; or, from a URL or with no lock here, the SBOM's."""
    from dsv4patch.delivery import check_from_sbom, check_installed, lock_from_url
    from dsv4patch.pins import find_lock, open_lock

    given: str | None = args.lock
    settings = _common.settings()
    python = args.python or settings.vllm_python
    if given is not None and given.startswith(("https://", "http://")):
        return check_from_sbom(python=python, lock=lock_from_url(given),
                               pin_name=args.pin)
    try:
        path = find_lock(Path(given) if given is not None else settings.lock)
    except ParameterError:  # no lock anywhere: a serving node with only dsv4patch installed
        return check_from_sbom(python=python)
    return check_installed(ctx=_common.context(args, open_lock(path)), pin_name=args.pin, python=python)


def _found_lock(args: argparse.Namespace) -> Path | None:
    """The lock whose project holds the default tree: --lock, else the one found; None: none."""
    from dsv4patch.pins import find_lock

    try:
        return find_lock(Path(args.lock) if args.lock is not None else _common.settings().lock)
    except UsageError:
        return None


def run(args: argparse.Namespace) -> int:
    if args.installed:
        if args.tree is not None:
            raise UsageError("--installed checks an installed vLLM, --tree a source tree: give one")
        from dsv4patch.delivery import SbomError

        inst = _installed(args)
        if args.format == "cyclonedx":
            if inst.sbom_document is None:
                reason = "; ".join((inst.sbom.problems if inst.sbom is not None else ()) or ["vLLM is not installed"])
                raise SbomError(f"status --installed --format cyclonedx: no SBOM to print ({reason}); "
                                       "run `dsv4patch status --installed` for the whole report")
            # As installed (byte for byte) into a file or a pipe; on a terminal its control characters
            # (an SBOM is input: U+009B is a CSI) are shown escaped (docs/trust.md).
            doc = inst.sbom_document
            sys.stdout.write(report.literal(doc) if sys.stdout.isatty() else doc)
            return EXIT_OK if inst.ok else EXIT_UNEXPECTED
        table, md = inst.table()
        report.emit(args.format, inst.to_json(), table if table.rows else None, md)  # no vLLM: no empty table
        return EXIT_OK if inst.ok else EXIT_UNEXPECTED
    if args.python is not None:
        raise UsageError("--python goes with --installed")
    if args.format == "cyclonedx":
        raise UsageError("--format cyclonedx goes with --installed (a tree has no SBOM)")
    from dsv4patch.checkout import tree_status  # a tree's: the checkout machinery, not --installed's

    path: Path = _common.tree_path(args) if args.tree is not None else _common.default_tree(args.pin, _found_lock(args))
    res = tree_status(path=path, lock=Path(args.lock) if args.lock is not None else None, pin=args.pin,
                      env_lock=_common.settings().lock)
    table, md = report.simple_table(f"dsv4patch status: {path}", ["patch", "state", "commit"], res.rows())
    out = res.to_json()
    if args.tree is None:
        out["notes"] = [f"tree: {path} (no --tree: the tree under {_common.DEFAULT_TREE_DIR}/ in the lock's project)",
                        *out.get("notes", [])]
    report.emit(args.format, out, table, md)
    return EXIT_OK if res.ok else EXIT_UNEXPECTED
