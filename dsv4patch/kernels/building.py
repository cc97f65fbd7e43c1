"""Building a patched tree: its changed CUDA kernels as a plugin wheel, or the whole tree.

``dsv4patch build``, ``apply`` (its last step) and ``wheel`` (the kernel
library it adds) call :func:`build_tree`; ``build --full`` calls
:func:`full_build`.  The compile and packaging steps are
:mod:`dsv4patch.kernels.build`; this module chooses the arch list (``archs``
given, else the pin's ``cuda_arch_list``, else the list vLLM's release wheels
for this machine use, read from the tree) and the toolchain, and returns what
was built as a typed result.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4patch import childproc, git, guard, report
from dsv4patch.errors import BuildError, ChildError, GitError
from dsv4patch.kernels import build as kbuild
from dsv4patch.kernels import plancache, sources, toolchain

if TYPE_CHECKING:
    from dsv4patch.pins import Pin
    from dsv4patch.progress import Progress
    from dsv4patch.store import Store

DEFAULT_OUT = Path("dist")
FULL_BUILD_DEADLINE = 12 * 3600.0  # seconds vLLM's own build (pip install . / docker build) may take


def resolve_archs(
    tree: Path, pin: Pin, archs: Sequence[str] | None, cuda_version: str | None
) -> tuple[tuple[str, ...], str]:
    """(TORCH_CUDA_ARCH_LIST to build for, where it came from)."""
    if archs:
        return tuple(archs), "--arch"
    if pin.cuda_arch_list:
        return pin.cuda_arch_list, f'lock: pins."{pin.name}".cuda_arch_list'
    rel = sources.release_arch_list(tree, cuda_version, platform.machine())
    return rel.archs, f"vLLM release list for {platform.machine()} ({rel.origin})"


@dataclass
class TreeBuild:
    """The kernels of one patched tree: what was (or, dry, would be) compiled and packaged."""

    pin: str
    dry_run: bool
    toolchain: kbuild.Toolchain | toolchain.Unprovisioned  # the latter: a dry run, not all installed yet
    result: kbuild.BuildResult

    @property
    def wheel(self) -> Path | None:
        return self.result.wheel

    @property
    def notes(self) -> list[str]:
        r = self.result
        return [self.toolchain.describe(), *r.notes] + [
            f"archs: {' '.join(r.archs)} (from {r.arch_origin})",
            f"ops: {', '.join(r.ops) or 'none'}",
            *([f"wheel: {r.wheel}"] if r.wheel else []),
        ]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": "kernels", "pin": self.pin, "dry_run": self.dry_run,
                               "toolchain": self._toolchain_json(), **self.result.to_dict()}
        if self.dry_run:
            out["commands"] = [u.command for u in self.result.units if u.command]
        out["notes"] = self.notes
        return out

    def _toolchain_json(self) -> dict[str, Any]:
        tc = self.toolchain
        if isinstance(tc, toolchain.Unprovisioned):
            return tc.to_json()
        return {"installed": True, "nvcc": str(tc.nvcc), "cuda": tc.cuda_version, "torch": tc.torch_version,
                "torch_cuda": tc.torch_cuda_version, "machine": tc.machine,
                "torch_required": tc.torch_required, "torch_origin": tc.torch_origin,
                "nvcc_origin": tc.nvcc_origin, "torch_mismatch": tc.torch_mismatch,
                "include_dirs": [str(d) for d in tc.include_dirs],
                "cxx_standard": kbuild.cxx_standard(tc, self.result.plan.cuda_standard)[1]}

    def table(self) -> tuple[report.Table, str]:
        rows = [[u.source, " ".join(u.archs) or "-", "cached" if u.cached else
                 ("would compile" if self.dry_run else f"compiled {u.seconds:.0f}s")]
                for u in self.result.units]
        return report.simple_table(f"dsv4patch build: {self.result.plan.tree}", ["unit", "archs", "result"], rows)


def build_tree(
    *,
    tree: Path,
    pin: Pin,
    store: Store,
    progress: Progress,
    archs: Sequence[str] | None = None,
    python: str | None = None,
    nvcc: str | None = None,
    allow_torch: str | None = None,
    extra_include: Sequence[Path] = (),
    out: Path = DEFAULT_OUT,
    base: str | None = None,
    dry_run: bool = False,
    expect_tree: str | None = None,
    final: bool = True,
) -> TreeBuild:
    """Compile the kernel units the patches of ``tree`` change (since ``base``, default the
    tree's root commit) and package them as the plugin wheel in ``out``; ``dry_run``: plan only,
    installing and downloading nothing (a toolchain not all in the cache yet is reported as what a
    build would install first, :class:`dsv4patch.kernels.toolchain.Unprovisioned`).

    ``expect_tree``: build only if ``tree``'s HEAD holds exactly that git tree and nothing in its
    work tree differs from it (no tracked change, no untracked file), checked under the same
    vetting as the build; else :class:`NotThatTree` before anything is built.  Such a tree's plan
    is kept per commit in the cache (:mod:`dsv4patch.kernels.plancache`).
    ``final``: the kernel wheel is the run's result (``--out``; an interrupt once it is in place no
    longer ends the run, :func:`dsv4patch.childproc.finishing`); False for a step of a larger run.

    The toolchain is :func:`dsv4patch.kernels.toolchain.resolve`'s: ``python`` builds
    against that interpreter's torch, which must be the pin's
    unless ``allow_torch`` names its version (else the lock's toolchain torch is installed
    into the cache); ``nvcc`` is the compiler to use, or fail.
    """
    with guard.guarded(tree):  # the user's checkout: vetted before git reads it
        if expect_tree is not None:  # exactly HEAD's tree: its plan may come from the cache
            _require_tree(tree, expect_tree)
            plan = plancache.plan(tree, base, store)
        else:
            plan = sources.plan(tree, base)
    with progress.step(f"kernels of pin {pin.name}: toolchain, {len(plan.units)} unit(s), link, wheel"):
        try:
            tc = toolchain.resolve(store=store, pin=pin, tree=tree, progress=progress, nvcc=nvcc, python=python,
                                   allow_torch=allow_torch, extra_includes=extra_include, install=not dry_run)
        except toolchain.NotProvisioned as missing:  # a dry run: the units, without what the toolchain keys
            return _unprovisioned(tree, pin, plan, archs, missing.plan)
        chosen, origin = resolve_archs(tree, pin, archs, tc.cuda_version)
        result = kbuild.build(
            plan, pin_name=pin.name, vllm_version=pin.vllm_version, archs=chosen, store=store,
            toolchain=tc, out_dir=out, max_jobs=pin.build.max_jobs,
            nvcc_threads=pin.build.nvcc_threads, progress=progress, dry_run=dry_run, arch_origin=origin,
            final=final,
        )
    return TreeBuild(pin.name, dry_run, tc, result)


def _unprovisioned(tree: Path, pin: Pin, plan: sources.KernelPlan, archs: Sequence[str] | None,
                   tc: toolchain.Unprovisioned) -> TreeBuild:
    """A dry run's plan while the toolchain is not (all) in the cache: the units and their archs for
    its CUDA, each to compile (its object is keyed by the toolchain), and what a build installs first."""
    chosen, origin = resolve_archs(tree, pin, archs, tc.cuda_version)
    units, ops, notes = kbuild.planned_units(plan, chosen, tc.cuda_version)
    result = kbuild.BuildResult(plan, chosen, units, [o.name for o in ops], notes=[*tc.notes, *notes],
                                arch_origin=origin)
    if not units:
        result.notes.append("the patches change no kernel unit: nothing to build")
    return TreeBuild(pin.name, True, tc, result)


class NotThatTree(Exception):
    """:func:`build_tree`'s ``expect_tree`` is not what the tree holds (why: the message)."""


def _require_tree(tree: Path, expect: str) -> None:
    """HEAD's tree is ``expect`` and the work tree is clean, or :class:`NotThatTree`."""
    try:
        held: str | None = git.tree_of(tree, "HEAD")
    except GitError:  # no commit yet
        held = None
    if held != expect:
        raise NotThatTree(f"{tree}: HEAD holds tree {held}, not {expect}")
    # The index's stat cache brought up to date first (what `git status` does when it may write): a tree
    # whose files were written in the same second as its index has every entry "racily clean", and a
    # status that may not write re-reads every file each time (0.3 s for vLLM's 6,400 files, every warm
    # wheel); a changed file stays changed.
    git.refresh_index(tree)
    dirty = git.dirty_paths(tree)
    if dirty:
        raise NotThatTree(f"{tree}: changed or untracked: {', '.join(dirty[:5])}")


@dataclass
class FullBuild:
    """vLLM's own build of the whole tree (``pip install .`` or ``docker build``)."""

    pin: str
    tree: Path
    command: list[str]
    env: dict[str, str]
    archs: tuple[str, ...]
    arch_origin: str
    dry_run: bool
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"mode": "full", "pin": self.pin, "tree": str(self.tree), "cwd": str(self.tree),
                "command": self.command, "env": self.env, "archs": list(self.archs),
                "arch_origin": self.arch_origin, "dry_run": self.dry_run, "notes": self.notes}


def _nvcc_version(nvcc: str | None) -> str | None:
    try:
        return kbuild.nvcc_version(kbuild.find_nvcc(nvcc))[1]
    except BuildError:
        return None
    except ChildError:
        if nvcc:  # the nvcc the user named hangs, floods or cannot start: say so
            raise
        return None


def full_build(
    *,
    tree: Path,
    pin: Pin,
    archs: Sequence[str] | None = None,
    python: str | None = None,
    nvcc: str | None = None,
    docker: bool = False,
    dry_run: bool = False,
    log: Path | None = None,
) -> FullBuild:
    """Run vLLM's own build of ``tree`` (``docker``: ``docker build``) with the lock's
    ``TORCH_CUDA_ARCH_LIST``, ``MAX_JOBS`` and ``NVCC_THREADS``; ``dry_run``: only say what.

    The build runs through :mod:`dsv4patch.childproc` within :data:`FULL_BUILD_DEADLINE`,
    its output streamed to ``log`` (default ``<tree>/../.<tree name>.dsv4patch-build.log``,
    a new file: a link planted there is replaced), capped at ``childproc.OUTPUT_CAP``."""
    chosen, origin = resolve_archs(tree, pin, archs, _nvcc_version(nvcc))
    python = python or "python3"
    cmd, env = kbuild.full_build_command(
        tree, chosen, pin.build.max_jobs, pin.build.nvcc_threads,
        docker=docker, python=python, image=f"vllm-dsv4patch:{pin.name}",
    )
    res = FullBuild(pin.name, tree, cmd, env, chosen, origin, dry_run)
    if dry_run:
        res.notes = [" ".join(f"{k}={v!r}" for k, v in env.items()) + " " + " ".join(cmd)]
        return res
    log = log or tree.parent / f".{tree.name}.dsv4patch-build.log"
    proc = childproc.run(cmd, cwd=tree, env={**os.environ, **env}, deadline=FULL_BUILD_DEADLINE,
                         what=f"the full build of {tree}", output=log, merge=True)
    if proc.returncode != 0:
        raise BuildError(f"`{' '.join(cmd)}` failed in {tree} ({proc.status()}); the end of its output:\n"
                         f"{proc.stdout[-3000:]}\nall of it: {log}")
    res.notes = [f"built {tree} with {' '.join(cmd)}; its output: {log}"]
    return res
