"""Options and setup shared by the subcommands (lock, cache, output format)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from dsv4patch import lock as lockmod
from dsv4patch.errors import UsageError
from dsv4patch.lock import DEFAULT_LOCK, Lock
from dsv4patch.progress import Progress
from dsv4patch.store import Store


def add_lock(p: argparse.ArgumentParser, pins: bool = True, many: bool = True,
             series: bool = True) -> None:
    p.add_argument("--lock", type=Path, default=None,
                   help=f"lock file (default: $DSV4PATCH_LOCK, else {DEFAULT_LOCK} in the current "
                        "directory or the nearest parent directory that has one)")
    if pins:
        if many:
            p.add_argument("--pin", action="append", help="pin name (repeatable; default: all)")
        else:
            p.add_argument("--pin", help="pin name (default: the lock's default_pin)")
    if series:
        p.add_argument(
            "--series", action="append", metavar="NAME",
            help="series to use instead of each pin's own (repeatable, in order; e.g. "
                 "`--series dsv4` for the seven fixes of #51538 alone); the lock's "
                 "patched_tree is then not compared",
        )


def add_output(p: argparse.ArgumentParser, markdown: bool = False) -> None:
    choices = ["text", "json"] + (["markdown"] if markdown else [])
    p.add_argument("--format", choices=choices, default="text", help="output format")


def add_cache(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="cache root (default: $DSV4PATCH_CACHE, else $XDG_CACHE_HOME/dsv4patch)",
    )


def open_lock(args: argparse.Namespace) -> Lock:
    """The lock named by ``--lock`` (or found), with ``--series`` applied; ``args`` is not changed."""
    return lockmod.open_lock(args.lock if "lock" in args else None, args.series if "series" in args else None)


def open_store(args: argparse.Namespace) -> Store:
    return Store.open(args.cache_dir)


def progress(args: argparse.Namespace) -> Progress:
    return Progress.for_output(getattr(args, "format", "text"))


def tree_path(args: argparse.Namespace) -> Path:
    """``--tree``: a directory, or a path that does not exist yet (apply creates it).

    Resolved once, to an absolute path: every later git call names this
    directory, so a relative --tree can never be resolved against another cwd
    (or reach the repository that encloses it)."""
    path = Path(os.path.abspath(args.tree))
    if path.exists() and not path.is_dir():
        raise UsageError(f"--tree {path}: not a directory; --tree names a vLLM source tree")
    if not path.exists() and path.is_symlink():
        raise UsageError(f"--tree {path}: a dangling symlink; point --tree at a directory")
    return path
