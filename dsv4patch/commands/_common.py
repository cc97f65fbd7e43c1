"""Options and setup shared by the subcommands (lock, cache, output format)."""

from __future__ import annotations

import argparse
import os
import dataclasses
from pathlib import Path

from dsv4patch.errors import LockFileError, UsageError
from dsv4patch.lock import Lock, load
from dsv4patch.progress import Progress
from dsv4patch.store import Store

DEFAULT_LOCK = Path("locks/vllm.toml")


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


def find_lock(given: Path | None, cwd: Path | None = None) -> Path:
    """``--lock``, else ``$DSV4PATCH_LOCK``, else ``locks/vllm.toml`` here or in a parent directory.

    So the card's ``dsv4patch apply`` works from any subdirectory of a checkout."""
    if given is not None:
        return given
    env = os.environ.get("DSV4PATCH_LOCK")
    if env:
        return Path(env)
    start = Path(os.path.abspath(cwd or Path.cwd()))
    for d in (start, *start.parents):
        if (d / DEFAULT_LOCK).is_file():
            return d / DEFAULT_LOCK
    raise UsageError(
        f"no lock file: {DEFAULT_LOCK} is not in {start} or any parent directory; pass --lock FILE "
        "or set DSV4PATCH_LOCK"
    )


def open_lock(args: argparse.Namespace) -> Lock:
    args.lock = find_lock(getattr(args, "lock", None))
    lock = load(args.lock)
    chosen = getattr(args, "series", None)
    if not chosen:
        return lock
    unknown = [s for s in chosen if s not in lock.series]
    if unknown:
        raise LockFileError(f"--series {', '.join(unknown)}: {lock.path} has no such [series.*] table "
                        f"(it has {', '.join(lock.series)})")
    pins = {n: dataclasses.replace(p, series=tuple(chosen), patched_tree=None)
            for n, p in lock.pins.items()}
    return dataclasses.replace(lock, pins=pins)


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
