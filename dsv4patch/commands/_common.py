"""Options, setup and rendering shared by the subcommands (lock, cache, output format, tree).

Only option parsing and rendering helpers live here; the work is in the core.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dsv4patch import report
from dsv4patch.errors import EXIT_OK, EXIT_UNEXPECTED, ParameterError, UsageError
from dsv4patch.limits import parse_number
from dsv4patch.pins import DEFAULT_LOCK, project_root
from dsv4patch.pins import open_lock as open_lock_file
from dsv4patch.progress import Progress
from dsv4patch.safeio import in_the_way
from dsv4patch.settings import active as active_settings
from dsv4patch.store import Store

if TYPE_CHECKING:  # the apply and build machinery: imported by the commands that run it, not by check
    from dsv4patch.checkout import ApplyResult, KernelBuild
    from dsv4patch.kernels import TreeBuild
    from dsv4patch.pins import Context, Lock, Pin
    from dsv4patch.settings import Settings


def number(*, low: float, high: float, what: str = "value", low_inclusive: bool = False, integer: bool = False,
           example: str = "") -> Callable[[str], float]:
    """An argparse ``type`` for a number option: finite, ``low < value <= high`` (``low <= value`` with
    ``low_inclusive``), a whole number with ``integer`` (then an ``int``); ``inf``, ``nan``, ``1e999`` and
    out-of-range values are a usage error naming the range (:func:`dsv4patch.limits.parse_number`)."""

    def convert(text: str) -> float:
        try:
            value = parse_number(text, what=what, low=low, high=high, low_inclusive=low_inclusive, integer=integer,
                                 example=example)
        except ParameterError as exc:
            raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None
        return int(value) if integer else value

    convert.__name__ = "whole number" if integer else "number"  # argparse names the type in its message
    return convert


# --pin of a command that works on a --tree (build, refresh): checkout.tree_pin's choice.
TREE_PIN_HELP = ("the pin the tree belongs to (default: the tree's own pin, found as `status --tree` finds it: "
                 "the pin whose base tree its root commit holds; else the lock's default_pin); a tree of "
                 "another pin is refused (exit 5)")


def add_lock(p: argparse.ArgumentParser, pins: bool = True, many: bool = True,
             series: bool = True, url: bool = False, pin_help: str | None = None) -> None:
    p.add_argument("--lock", type=str if url else Path, default=None,
                   help=f"lock file (default: $DSV4PATCH_LOCK, else {DEFAULT_LOCK} in the current "
                        "directory or the nearest parent directory that has one)"
                        + ("; or an https URL of one (read without its patch files)" if url else ""))
    if pins:
        if many:
            p.add_argument("--pin", action="append", help="pin name (repeatable; default: all)")
        else:
            p.add_argument("--pin", help=pin_help or "pin name (default: the lock's default_pin)")
    if series:
        p.add_argument(
            "--series", action="append", metavar="NAME",
            help="series to use instead of each pin's own (repeatable, in order; e.g. "
                 "`--series dsv4` for the seven fixes of #51538 alone); the lock's "
                 "patched_tree is then not compared, and a pin's variants of patches outside them are "
                 "not used",
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


def settings() -> Settings:
    """The environment's defaults (``$DSV4PATCH_LOCK``, ``$DSV4PATCH_TORCH_PYTHON``, ...) of this run:
    read and validated once by ``main`` (:func:`dsv4patch.settings.in_effect`); the core gets each
    value as an explicit keyword, or in the :class:`dsv4patch.context.Context`."""
    return active_settings()


def open_lock(args: argparse.Namespace) -> Lock:
    """The lock named by ``--lock`` (else ``$DSV4PATCH_LOCK``, else found), with ``--series`` applied;
    ``args`` is not changed."""
    given = args.lock if "lock" in args else None
    return open_lock_file(given or settings().lock, args.series if "series" in args else None)


def open_store(args: argparse.Namespace) -> Store:
    """The cache: ``--cache-dir``, else ``$DSV4PATCH_CACHE``, else the XDG cache; never inside ``--tree``
    (downloads would land in the user's tree, which is then refused as dirty)."""
    root = args.cache_dir or settings().cache_root()
    tree = args.tree if "tree" in args else None
    if tree is not None:
        cache, top = os.path.realpath(root), os.path.realpath(tree)
        if cache == top or cache.startswith(top.rstrip("/") + "/"):
            raise UsageError(f"the cache {root} is inside --tree {tree}: dsv4patch would write its downloads "
                             "and trees into it; give --cache-dir (or DSV4PATCH_CACHE) a directory outside the tree")
    return Store.open(root)


def progress(args: argparse.Namespace) -> Progress:
    return Progress.for_output(args.format)


def context(args: argparse.Namespace, lock: Lock | None = None, prog: Progress | None = None) -> Context:
    """The run's :class:`dsv4patch.pins.Context`, built once here: ``lock`` (else the one ``--lock``
    names, :func:`open_lock`), the cache (:func:`open_store`), ``prog`` (else progress for ``--format``),
    the settings ``main`` read.  Opened in that order, so the first problem reported is the lock's."""
    from dsv4patch.pins import Context

    lock = open_lock(args) if lock is None else lock
    return Context(lock=lock, store=open_store(args), progress=progress(args) if prog is None else prog,
                   settings=settings())


def tree_path(args: argparse.Namespace) -> Path:
    """``--tree`` checked by :func:`checked_tree`."""
    return checked_tree(args.tree)


DEFAULT_TREE_DIR = "vllm-src"  # apply without --tree: vllm-src/<pin> in the lock's project
DEFAULT_OUT_DIR = "dist"  # kernel and vLLM wheels without --out: dist/ in the lock's project


def project_dir(lock: Path | None) -> Path:
    """Where relative defaults go: the lock's project (:func:`dsv4patch.lock.project_root`), else,
    with no lock, the current directory."""
    return project_root(lock) if lock is not None else Path(os.path.abspath("."))


def default_out(out: Path | None, lock: Path | None, *, used: bool = True) -> tuple[Path, str | None]:
    """``--out``, else ``dist/`` in the lock's project, with the line that says so.  Where the run writes
    there (``used``), refused at once (exit 2, before any build) when a file stands where the directory
    is, or above it."""
    path = out if out is not None else project_dir(lock) / DEFAULT_OUT_DIR
    found = in_the_way(path) if used else None
    if found is not None:
        named = "--out" if out is not None else f"--out (default {DEFAULT_OUT_DIR}/ in the project of {lock})"
        where = "is" if found.itself else f"cannot be made there: {found.path} is"
        raise UsageError(f"{named} {path} {where} {found.what}; name a directory for the wheels (made if absent)")
    if out is not None:
        return out, None
    return path, f"out: {path} (the default: {DEFAULT_OUT_DIR}/ in the project of {lock}; --out to choose)"


def default_tree(pin: str | None, lock: Path | None) -> Path:
    """The tree ``apply`` made without ``--tree``: ``vllm-src/<pin>`` (``--pin``) in the lock's
    project, else the one directory under it; none or several is a usage error naming what to give."""
    base = project_dir(lock) / DEFAULT_TREE_DIR
    if pin is not None:
        if (base / pin).is_dir():
            return checked_tree(base / pin)
        raise UsageError(f"no {base / pin} (where `dsv4patch apply --pin {pin}` puts "
                         f"its tree): give --tree DIR")
    found = sorted(d.name for d in base.iterdir() if d.is_dir() and not d.is_symlink()) if base.is_dir() else []
    if len(found) == 1:
        return checked_tree(base / found[0])
    if not found:
        raise UsageError(f"give --tree DIR (a tree made by dsv4patch apply) or --installed: "
                         f"there is no {base}/<pin>")
    choices = ", ".join(f"--tree {base / n}" for n in found[:20])
    raise UsageError(f"{len(found)} trees under {base}: choose one ({choices}) or give --pin")


def refuse_newline(option: str, path: Path | None) -> None:
    """UsageError (exit 2) for a checkout's path (``--tree``, ``--workspace``, ``--local``) holding a
    newline: git answers with one path a line, so such a checkout cannot be read (refused before
    anything is created there; the guard refuses one any other way too)."""
    if path is not None and "\n" in str(path):
        raise UsageError(f"{option} {str(path)!r}: the path holds a newline, which git's answers cannot carry "
                         f"(one path a line); give {option} a directory whose path has none")


def checked_tree(given: Path) -> Path:
    """A ``--tree``: a directory, or a path that does not exist yet (apply creates it).

    Resolved once, to an absolute path: every later git call names this
    directory, so a relative --tree can never be resolved against another cwd
    (or reach the repository that encloses it)."""
    path = Path(os.path.abspath(given))
    refuse_newline("--tree", path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--tree {path}: not a directory; --tree names a vLLM source tree")
    if not path.exists() and path.is_symlink():
        raise UsageError(f"--tree {path}: a dangling symlink; point --tree at a directory")
    return path


def render_apply(fmt: str, result: ApplyResult) -> int:
    """Print an apply's result (``apply``, ``resolve --continue``); its exit code."""
    out = result.to_json()
    table, md = report.matrix_table(out, title=f"dsv4patch apply: {result.tree}")
    report.emit(fmt, out, table, md)
    return EXIT_OK if result.ok else EXIT_UNEXPECTED


def render_notes(fmt: str, notes: list[str], result: ApplyResult) -> int:
    """The notes an apply added after its table was shown (text); its exit code."""
    report.emit(fmt, {"notes": notes}, None, None)
    return EXIT_OK if result.ok else EXIT_UNEXPECTED


def kernel_build(*, ctx: Context, out: Path | None, python: str | None = None, nvcc: str | None = None,
                 allow_torch: str | None = None) -> KernelBuild:
    """The kernel rebuild ``apply`` runs last (``dsv4patch build``'s kernel mode on the tree);
    ``python``: ``--python``, else ``$DSV4PATCH_TORCH_PYTHON``."""
    python = python or settings().torch_python

    def build(path: Path, pin: Pin) -> TreeBuild:
        from dsv4patch.kernels import DEFAULT_BUILD_OUT, build_tree  # the kernel build: only when apply builds

        return build_tree(tree=path, pin=pin, store=ctx.store, progress=ctx.progress,
                          python=python, nvcc=nvcc, allow_torch=allow_torch,
                          out=out or DEFAULT_BUILD_OUT)  # apply passes its default

    return build


def add_toolchain_options(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """--python, --allow-torch and --nvcc (build, apply and wheel share them)."""
    p.add_argument("--python", default=None,
                   help=prefix + "build against this interpreter's torch, which must be the version "
                        "the pin's vLLM requires (default: $DSV4PATCH_TORCH_PYTHON, else dsv4patch "
                        "installs that torch into the cache)")
    p.add_argument("--allow-torch", default=None, metavar="VERSION",
                   help=prefix + "with --python: accept its torch VERSION although the pin requires "
                        "another (recorded in the kernel wheel; `status --installed` reports it)")
    p.add_argument("--nvcc", default=None,
                   help=prefix + "the nvcc to use, or fail (default: $CUDA_HOME's, PATH's or "
                        "/usr/local/cuda's when of the pin torch's CUDA major, else NVIDIA's "
                        "toolkit wheels at the lock's versions, installed into the cache)")
