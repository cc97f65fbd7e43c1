"""Compile the changed kernel units and package them as a vLLM plugin wheel.

The stock vLLM wheel already ships ``_C_stable_libtorch`` with the op schemas;
only the patched kernels need to be rebuilt.  We compile the units found by
:mod:`sources` with nvcc (flags as vLLM's CMake uses them), plus a generated
bindings unit that re-registers just the changed ops' CUDA kernels with
``STABLE_TORCH_LIBRARY_IMPL(_C, CUDA, m)``.  The dispatcher keeps the last
kernel registered for a key, so loading our library *after*
``vllm._C_stable_libtorch`` makes ``torch.ops._C.<op>`` run the patched code.
The wheel's ``vllm.general_plugins`` entry point does exactly that, after
checking that the installed vLLM is the version it was built for.

Each unit is compiled for the archs vLLM's CMake gives it from the requested
``TORCH_CUDA_ARCH_LIST`` (by default the one of vLLM's release wheels, so the
plugin covers every GPU the stock wheel covers; see :mod:`sources`).  The
wheel is tagged for the build machine, requires the pin's vLLM, and is refused
when nvcc's CUDA major differs from torch's (a second ``libcudart`` major).

Objects are cached in ``<store>/kernels/<key>/``; the key hashes the unit and
every local header it includes, the arch list, flags, ``nvcc --version`` and
the torch version, so an unchanged second build compiles nothing.

``cublas_v2.h`` (included by vLLM's ``torch_utils.h``) is not in every CUDA
toolkit: it is looked up in the toolkit, in ``--extra-include`` dirs and in the
``nvidia`` wheels next to torch; failing that, the ``nvidia-cublas`` wheel for
the toolkit's CUDA version is downloaded once with ``pip download`` and only its
``include/`` directory is unpacked into ``<store>/kernels/cublas-headers/``.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import sys
import time
import zipfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4patch import childproc, safeio, zipcopy
from dsv4patch.errors import BuildError, param
from dsv4patch.hashing import sha256
from dsv4patch.kernels import sources
from dsv4patch.kernels.identity import dist_name
from dsv4patch.progress import Progress
from dsv4patch.records import frozen

if TYPE_CHECKING:
    from dsv4patch.kernels.sources import KernelPlan
    from dsv4patch.store import Store

# What vLLM's CMake passes for _C_stable_libtorch CUDA sources (RelWithDebInfo, without -g);
# the C++ standard comes first and is chosen per build (:func:`cxx_standard`).
BASE_FLAGS = (
    "--expt-relaxed-constexpr", "--expt-extended-lambda", "-O2", "-DNDEBUG",
    "-DUSE_CUDA", "-DENABLE_FP8",
    "-Xcompiler", "-fPIC",
)
DEFAULT_CXX_STANDARD = 17  # a tree without CMAKE_CUDA_STANDARD and a toolchain that names none
CACHE_VERSION = "2"  # 2: prefix maps, fixed module ids, stripped library
# No device link: the units are whole-program (no -rdc), and nvcc's device link would
# embed an empty cubin for its default arch (sm_75) in the library.
# --strip-all: the local symbols (.symtab) name nvcc's temp files (tmpxft_<pid>_...), so an
# unstripped library differs from run to run; .dynsym, which loading needs, stays.
LINK_FLAGS = ("-shared", "-nodlink", "-cudart", "shared", "-Xlinker", "--strip-all")
# Where nvcc is told each unit lives (cudafe++'s --orig_src_path_name): the module id nvcc
# hashes from it names every internal symbol of the unit, host and device, so the real path
# (tree or cache location) would change the library's bytes.
FIXED_SRC = "/dsv4patch/src"
LINK_MAP = "{ global: *; local: _edata; _end; __bss_start; };\n"
PLUGIN_GROUP = "vllm.general_plugins"
# Deadlines of the programs a build runs (docs/trust.md "Bounds"); each is ended with its whole tree past it.
NVCC_PROBE_DEADLINE = 30.0  # `nvcc --version`, `nvcc -dryrun`: answered in well under a second
COMPILE_DEADLINE = 3 * 3600.0  # one kernel unit (the largest take minutes per arch)
LINK_DEADLINE = 1800.0
PIP_DOWNLOAD_DEADLINE = 1800.0  # `pip download nvidia-cublas`


def gencode(arch: str) -> list[str]:
    """``9.0a`` -> ``-gencode arch=compute_90a,code=sm_90a``; ``12.0+PTX`` adds ``code=compute_120``.

    As vLLM's ``set_gencode_flags_for_srcs``: ``a`` (arch-specific) and ``f``
    (family) targets keep their suffix, ``+PTX`` embeds PTX next to the SASS.
    """
    m = re.fullmatch(r"(\d+)\.(\d+)([af]?)(\+PTX)?", arch)
    if not m:
        raise BuildError(f"bad CUDA arch {arch!r}; use the form 9.0a, 10.0f, 12.0 or 12.0+PTX")
    sm = f"{m.group(1)}{m.group(2)}{m.group(3)}"
    flags = ["-gencode", f"arch=compute_{sm},code=sm_{sm}"]
    if m.group(4):
        flags += ["-gencode", f"arch=compute_{sm},code=compute_{sm}"]
    return flags


def cuda_major(version: str) -> int:
    return int(version.split(".")[0])


@frozen
class Toolchain:
    nvcc: Path
    nvcc_version: str  # full `nvcc --version` output
    cuda_version: str  # "13.0"
    python: str
    torch_version: str
    torch_cuda_version: str | None  # torch.version.cuda; None for a CPU-only torch
    torch_include: Path
    torch_lib: Path
    include_dirs: tuple[Path, ...]  # extra dirs for cublas_v2.h etc.
    machine: str = platform.machine()  # the host nvcc compiles for (the wheel's platform)
    # What dsv4patch.kernels.toolchain chose and why (empty for a Toolchain made by detect_toolchain):
    torch_required: str = ""  # the torch version the pin's vLLM requires
    torch_required_origin: str = ""  # where that was read
    torch_origin: str = ""  # "--python X" or "provisioned <cache dir>"
    nvcc_origin: str = ""  # "--nvcc", "CUDA_HOME", "PATH", "NVIDIA wheels (...)"
    torch_cuda_expected: str | None = None  # CUDA the runtime torch has (a CPU torch: the lock's)
    notes: tuple[str, ...] = ()
    # What the torch's headers need (dsv4patch.kernels.toolchain, from the lock's toolchain): the
    # lowest C++ standard (None: no requirement known) and -D defines passed to every unit.
    cxx_standard: int | None = None
    cxx_standard_origin: str = ""
    defines: tuple[str, ...] = ()

    @property
    def torch_mismatch(self) -> bool:
        """Built against a torch other than the pin's (``--allow-torch``)."""
        return bool(self.torch_required) and self.torch_version.split("+")[0] != self.torch_required

    def describe(self) -> str:
        """One line for text output: which torch and nvcc."""
        torch = f"torch {self.torch_version}" + (f" ({self.torch_origin})" if self.torch_origin else "")
        nvcc = f"nvcc {self.cuda_version} {self.nvcc}" + (f" ({self.nvcc_origin})" if self.nvcc_origin else "")
        return f"toolchain: {torch}; {nvcc}"

    def prefix_maps(self, tree: Path, build_dir: Path, top: str | None) -> list[str]:
        """``-ffile-prefix-map`` flags: no cache, tree or toolkit path reaches the library.

        The host compiler (and nvcc's host preprocessing) gets them; a path
        with a comma cannot be passed through ``-Xcompiler`` and is left out.
        ``top``: :func:`nvcc_top` of this toolchain's nvcc, asked once per build by its caller.
        """
        # nvcc adds the toolkit's include dirs as "$(TOP)/targets/..." with TOP as nvcc.profile
        # spells it ("/usr/local/cuda-13.0/bin/.."): mapped literally, as the compiler sees it.
        maps: list[tuple[Path | str, str]] = [
            (tree, "/dsv4patch/src"), (build_dir, "/dsv4patch/build"),
            (self.torch_include.parent.parent, "/dsv4patch/torch"),
            *([(top, "/dsv4patch/cuda"), (os.path.normpath(top), "/dsv4patch/cuda")] if top else []),
            *((d, f"/dsv4patch/include{i}") for i, d in enumerate(self.include_dirs))]
        flags: list[str] = []
        for src, dst in maps:
            s = src if isinstance(src, str) else str(Path(src).absolute())
            if "," not in s and "=" not in s:
                flags += ["-Xcompiler", f"-ffile-prefix-map={s}={dst}"]
        return flags

    def includes(self) -> list[str]:
        args = ["-I", str(self.torch_include), "-I", str(self.torch_include / "torch/csrc/api/include")]
        # After nvcc's own headers: a CUDA torch's site-packages/nvidia/*/include (searched
        # for cublas_v2.h) also holds cuda_runtime.h etc. of another CUDA minor, which
        # must never shadow the toolkit's (`__cudaLaunch was not declared`).
        for d in self.include_dirs:
            args += ["-Xcompiler", f"-idirafter,{d}"]
        return args


def cxx_standard(tc: Toolchain, tree_standard: int | None) -> tuple[int, str]:
    """(C++ standard to compile with, why): the higher of the tree's and the torch's.

    vLLM compiles its CUDA sources with its ``CMAKE_CUDA_STANDARD``; a torch
    whose headers need a newer one (torch 2.14: C++20) raises it, never lowers it.
    """
    tree = tree_standard or DEFAULT_CXX_STANDARD
    need = tc.cxx_standard or DEFAULT_CXX_STANDARD
    if need > tree:
        return need, f"C++{need}: {tc.cxx_standard_origin or 'the toolchain'} (the tree's CMake says C++{tree})"
    origin = "the tree's CMAKE_CUDA_STANDARD" if tree_standard else "the default"
    return tree, f"C++{tree}: {origin}" + (f"; {tc.cxx_standard_origin}" if tc.cxx_standard_origin else "")


def nvcc_top(nvcc: Path) -> str | None:
    """The toolkit root nvcc.profile sets (``TOP``, e.g. ``/usr/local/cuda-13.0/bin/..``)."""
    try:
        res = childproc.run([str(nvcc), "-dryrun", "-c", "dsv4patch-probe.cu", "-o", "dsv4patch-probe.o"],
                            deadline=NVCC_PROBE_DEADLINE, what=f"{nvcc} -dryrun", cwd="/",
                            flood=childproc.PROBE_OUTPUT, keep=childproc.PROBE_OUTPUT)
    except childproc.ChildError:
        return None
    m = re.search(r"^#\$ TOP=(.+)$", res.stdout + "\n" + res.stderr, re.M)
    return m.group(1).strip() if m else None


def find_nvcc(nvcc: str | None = None) -> Path:
    cands = [nvcc] if nvcc else []
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            cands.append(str(Path(os.environ[env]) / "bin" / "nvcc"))
    cands += [shutil.which("nvcc") or "", "/usr/local/cuda/bin/nvcc"]
    for c in cands:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    raise BuildError("nvcc not found: install the CUDA toolkit, put nvcc on PATH or set CUDA_HOME")


def _torch_info(python: str) -> dict[str, str | None]:
    code = (
        "import json, os, site, sys, torch\n"
        "d = os.path.dirname(torch.__file__)\n"
        "print('DSV4PATCH-TORCH-INFO ' + json.dumps({'version': torch.__version__, 'include': os.path.join(d, 'include'),"
        " 'lib': os.path.join(d, 'lib'), 'site': os.path.dirname(d), 'cuda': torch.version.cuda}))\n"
    )
    # Imports torch (CUDA libraries load): a longer deadline than a probe that only locates it.
    res, data = childproc.ask_python(python, code, marker="DSV4PATCH-TORCH-INFO", label=f"{param('python')} {python}",
                                     deadline=300)
    if res.returncode != 0:
        raise BuildError(
            f"{python} cannot import torch ({res.stderr.strip().splitlines()[-1:] or ['?']}); "
            f"pass {param('python')} with the interpreter of the environment vLLM runs in "
            "(or set DSV4PATCH_TORCH_PYTHON)"
        )
    if not (isinstance(data, dict) and all(isinstance(data.get(k), str) for k in ("version", "include", "lib", "site"))
            and (data.get("cuda") is None or isinstance(data.get("cuda"), str))):
        raise BuildError(f"{python}: its answer about torch is not the object dsv4patch's probe prints; "
                         f"pass {param('python')} with the interpreter of the environment vLLM runs in")
    info: dict[str, str | None] = {k: data.get(k) for k in ("version", "include", "lib", "site", "cuda")}
    return info


def _has_cublas(d: Path) -> bool:
    return (d / "cublas_v2.h").is_file()


def cublas_candidates(nvcc: Path, site: Path | None) -> list[Path]:
    root = nvcc.resolve().parent.parent
    cands = [root / "include", *sorted(root.glob("targets/*/include"))]
    if site is not None:
        cands += sorted((site / "nvidia").glob("*/include")) + sorted((site / "nvidia").glob("*/*/include"))
    return cands


def cublas_headers_entry(store: Store, cuda_version: str, requirement: str | None = None) -> tuple[str, Path]:
    """(what :func:`fetch_cublas_headers` downloads, the cache entry it unpacks ``include/`` into)."""
    major, minor = (int(x) for x in cuda_version.split(".")[:2])
    pkg = "nvidia-cublas" if major >= 13 else f"nvidia-cublas-cu{major}"
    spec = f"{pkg}>={major}.{minor},<{major}.{minor + 1}"
    name = f"{pkg}-{major}.{minor}"
    if requirement is not None:
        spec = requirement.split()[0]
        name = f"{spec.replace('==', '-')}-{sha256(requirement.encode())[:12]}"
    return spec, store.root / "kernels" / "cublas-headers" / name


def cached_cublas_headers(store: Store, cuda_version: str, requirement: str | None = None) -> Path | None:
    """``include/`` of the cuBLAS headers :func:`fetch_cublas_headers` unpacked before, else None
    (nothing downloaded)."""
    include = cublas_headers_entry(store, cuda_version, requirement)[1] / "include"
    return include if (include / "cublas_v2.h").is_file() else None


def fetch_cublas_headers(store: Store, cuda_version: str, python: str = sys.executable,
                         requirement: str | None = None, progress: Progress | None = None) -> Path:
    """``include/`` of the nvidia-cublas wheel for ``cuda_version``, cached in the store.

    ``requirement``: a pinned, hashed requirements line (the lock's toolchain);
    the download is then checked with ``--require-hashes``.
    """
    spec, dest = cublas_headers_entry(store, cuda_version, requirement)
    with store.mutex(f"cublas-{dest.name}"):
        if (dest / "include" / "cublas_v2.h").is_file():
            return dest / "include"
        tmp = store.tmpdir("cublas-")
        try:
            if requirement is not None:
                (tmp / "req.txt").write_text(requirement + "\n", encoding="utf-8")
                args = ["--require-hashes", "-r", str(tmp / "req.txt")]
            else:
                args = [spec]
            with (progress or Progress(False)).task(f"downloading {spec} (for cublas_v2.h)", None):
                res = childproc.run(
                    [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                     "--disable-pip-version-check", "-d", str(tmp), *args],
                    deadline=PIP_DOWNLOAD_DEADLINE, what=f"pip download {spec}",
                )
            wheels = sorted(tmp.glob("*.whl"))
            if res.returncode != 0 or not wheels:
                raise BuildError(
                    f"cublas_v2.h is not in the CUDA toolkit and `pip download {spec}` failed "
                    f"({res.stderr.strip()[-300:]}); pass {param('extra_include')} DIR with a directory "
                    "that holds cublas_v2.h"
                )
            unpack = tmp / "include"
            with zipfile.ZipFile(wheels[0]) as zf:
                for name in zf.namelist():
                    parts = name.split("/")
                    if "include" in parts[:-1] and not name.endswith("/"):
                        rel = parts[parts.index("include") + 1:]
                        if ".." in rel:
                            continue
                        target = unpack.joinpath(*rel)
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(zf.read(name))
            if not (unpack / "cublas_v2.h").is_file():
                raise BuildError(f"{wheels[0].name} has no include/cublas_v2.h")
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            os.replace(unpack, dest / "include")
            (dest / "wheel.json").write_text(json.dumps(  # what was downloaded, kept for reports
                {"wheel": wheels[0].name, "size": wheels[0].stat().st_size}) + "\n")
        finally:
            store.remove_tmp(tmp)
    return dest / "include"


def nvcc_version(nvcc: Path) -> tuple[str, str]:
    """(full ``nvcc --version`` output, CUDA version such as ``13.0``)."""
    res = childproc.run([str(nvcc), "--version"], deadline=NVCC_PROBE_DEADLINE, what=f"{nvcc} --version",
                        flood=childproc.PROBE_OUTPUT, keep=childproc.PROBE_OUTPUT)
    ver = res.stdout  # decoded with errors="replace": bytes that are not UTF-8 are not a crash
    m = re.search(r"release (\d+\.\d+)", ver)
    if not m:
        raise BuildError(f"cannot read the CUDA version from `{nvcc} --version` ({res.status()}: "
                         f"{res.last_line(120)!r})")
    return ver.strip(), m.group(1)


def detect_toolchain(
    store: Store,
    *,
    nvcc: str | None = None,
    python: str | None = None,
    extra_includes: Sequence[Path] = (),
) -> Toolchain:
    nvcc_path = find_nvcc(nvcc)
    ver, cuda = nvcc_version(nvcc_path)
    py = python or sys.executable
    info = _torch_info(py)
    includes = [Path(p) for p in extra_includes]
    if not any(_has_cublas(d) for d in includes):
        found = next((d for d in cublas_candidates(nvcc_path, Path(str(info["site"])))
                      if _has_cublas(d)), None)
        if found is None:
            found = fetch_cublas_headers(store, cuda)
        if found != nvcc_path.resolve().parent.parent / "include":
            includes.append(found)
    return Toolchain(
        nvcc=nvcc_path, nvcc_version=ver, cuda_version=cuda, python=py,
        torch_version=str(info["version"]), torch_cuda_version=info.get("cuda"),
        torch_include=Path(str(info["include"])), torch_lib=Path(str(info["lib"])),
        include_dirs=tuple(includes),
    )


def check_cuda_match(tc: Toolchain) -> str | None:
    """Refuse an nvcc whose CUDA major differs from torch's; a note for a CPU-only torch.

    The library links ``libcudart.so.<nvcc major>``; next to a torch built for
    another CUDA major that library is missing or a second runtime gets loaded.
    """
    if tc.torch_cuda_version is None and tc.torch_cuda_expected:
        return (
            f"torch {tc.torch_version} is a CPU build: its headers and libraries are enough to "
            f"compile and link (docs/kernels.md); the library runs in torch "
            f"{tc.torch_version.split('+')[0]} built for CUDA {tc.torch_cuda_expected}"
        )
    if tc.torch_cuda_version is None:
        return (
            f"torch {tc.torch_version} at {tc.python} is a CPU-only build (torch.version.cuda "
            f"is None): the kernels are built with nvcc CUDA {tc.cuda_version} and must be "
            f"loaded into a torch built for CUDA {cuda_major(tc.cuda_version)}.x"
        )
    if cuda_major(tc.torch_cuda_version) != cuda_major(tc.cuda_version):
        raise BuildError(
            f"nvcc {tc.nvcc} is CUDA {tc.cuda_version} but torch {tc.torch_version} at "
            f"{tc.python} is built for CUDA {tc.torch_cuda_version}: the kernel library would "
            f"need libcudart.so.{cuda_major(tc.cuda_version)} next to torch's "
            f"libcudart.so.{cuda_major(tc.torch_cuda_version)}. Use an nvcc of CUDA "
            f"{cuda_major(tc.torch_cuda_version)}.x ({param('nvcc')} or CUDA_HOME), or {param('python')} with "
            f"a torch built for CUDA {cuda_major(tc.cuda_version)}.x"
        )
    return None


def wheel_tag(machine: str) -> str:
    """``py3-none-linux_<machine>``: the library is host code for the build machine.

    Not a manylinux tag: nothing here checks the glibc symbol versions the
    library needs (it is built against this host's glibc); pip installs a
    ``linux_*`` wheel on any Linux host of that machine type.
    """
    m = re.sub(r"[^A-Za-z0-9_]", "_", machine.lower())
    return f"py3-none-linux_{ {'amd64': 'x86_64', 'arm64': 'aarch64'}.get(m, m) }"


def generate_bindings(ops: Sequence[sources.Op], namespace: str = "_C", define: bool = False) -> str:
    """A bindings unit for ``ops``: IMPL override of ``namespace`` or, with ``define``, DEF+IMPL."""
    lines = [
        "// Generated by dsv4patch: registers only the rebuilt ops' CUDA kernels.",
        '#include "ops.h"',
        "#include <torch/csrc/stable/library.h>",
        "",
    ]
    if define:
        lines.append(f"STABLE_TORCH_LIBRARY({namespace}, m) {{")
        lines += [f"  m.def({json.dumps(op.schema)});" for op in ops]
        lines += ["}", ""]
    lines.append(f"STABLE_TORCH_LIBRARY_IMPL({namespace}, CUDA, m) {{")
    lines += [f'  m.impl("{op.name}", TORCH_BOX(&{op.function}));' for op in ops]
    lines += ["}", ""]
    return "\n".join(lines)


@dataclass
class UnitBuild:
    name: str
    source: str
    archs: tuple[str, ...]
    key: str  # "": planned before its toolchain is installed (:func:`planned_units`): no object, no command
    obj: Path
    command: list[str]
    text: str = ""  # source text of a generated unit
    ops: tuple[str, ...] = ()  # ops whose CUDA kernels this unit defines
    cached: bool = False
    seconds: float = 0.0


@dataclass
class BuildResult:
    plan: KernelPlan
    archs: tuple[str, ...]
    units: list[UnitBuild]
    ops: list[str]
    library: Path | None = None
    wheel: Path | None = None
    notes: list[str] = field(default_factory=list)
    arch_origin: str = ""  # where ``archs`` came from (lock, --arch, the tree's release list)

    @property
    def compiled(self) -> list[str]:
        return [u.name for u in self.units if not u.cached]

    def to_dict(self) -> dict[str, object]:
        return {
            "tree": str(self.plan.tree), "tree_id": self.plan.tree_id, "head": self.plan.head,
            "changed": list(self.plan.changed), "archs": list(self.archs), "ops": self.ops,
            "arch_origin": self.arch_origin,
            "units": [
                {"unit": u.source, "archs": list(u.archs), "ops": list(u.ops),
                 "sass": sources.split_ptx(u.archs)[0], "ptx": sources.split_ptx(u.archs)[1],
                 "key": u.key or None, "cached": u.cached, "seconds": round(u.seconds, 1),
                 "object": str(u.obj) if u.key else None}
                for u in self.units
            ],
            "compiled": self.compiled, "library": str(self.library) if self.library else None,
            "wheel": str(self.wheel) if self.wheel else None, "notes": self.notes,
        }


def _closure_hashes(tree: Path, rel: str, closure: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """(file, sha256) of ``rel`` and every local header it includes (``closure``: the plan's scan of
    them, else scanned here)."""
    files = [rel, *(sources.include_closure(tree, rel) if closure is None else closure)]
    return [(f, sha256((tree / f).read_bytes())) for f in files]


def _key(parts: dict[str, object]) -> str:
    return sha256(json.dumps(parts, sort_keys=True).encode())


def plan_build(
    plan: KernelPlan, archs: Sequence[str], tc: Toolchain, store: Store, nvcc_threads: int = 1
) -> tuple[list[UnitBuild], list[sources.Op], list[str]]:
    """Per-unit compile commands and cache keys (nothing runs)."""
    cmake = sources.cmake_target(plan.tree)
    archs = tuple(archs)
    chosen, notes = _unit_archs(plan, archs, tc.cuda_version, cmake)
    defines: list[str] = []
    target_archs = sources.cuda_archs(archs, tc.cuda_version, cmake)
    for var, flags in sorted(plan.defines.items()):
        opts = cmake.arch_lists.get(var, [])
        if opts and sources.loose_intersection(sources.select_arch_list(opts, tc.cuda_version),
                                               target_archs):
            defines += list(flags)
    std, _ = cxx_standard(tc, plan.cuda_standard)
    common = [f"-std=c++{std}", *BASE_FLAGS, *tc.defines, *defines]
    if plan.torch_target_version:
        common.append(f"-DTORCH_TARGET_VERSION={plan.torch_target_version}")
    if nvcc_threads > 1:
        common.append(f"--threads={nvcc_threads}")
    ident = {"v": CACHE_VERSION, "nvcc": tc.nvcc_version, "torch": tc.torch_version,
             "flags": common}
    cublas = next((d / "cublas_v2.h" for d in tc.include_dirs if _has_cublas(d)), None)
    if cublas is not None:
        ident["cublas_v2.h"] = sha256(cublas.read_bytes())
    top = nvcc_top(tc.nvcc)  # one `nvcc -dryrun` for every unit's prefix maps
    builds: list[UnitBuild] = []
    for u, ua in chosen:
        key = _key({**ident, "unit": u.path, "files": _closure_hashes(plan.tree, u.path, u.headers), "archs": ua})
        obj = store.root / "kernels" / key / (Path(u.path).stem + ".o")
        cmd = [str(tc.nvcc), *common]
        for a in ua:
            cmd += gencode(a)
        cmd += ["-I", "csrc", *tc.includes(), *tc.prefix_maps(plan.tree, obj.parent, top),
                "-Xcudafe", f"--orig_src_path_name={FIXED_SRC}/{u.path}", "-c", u.path, "-o", str(obj)]
        builds.append(UnitBuild(Path(u.path).stem, u.path, ua, key, obj, cmd,
                                ops=tuple(o.name for o in plan.ops if o.unit == u.path)))
    built = {b.source for b in builds}
    ops = [o for o in plan.ops if o.unit in built]
    if ops:
        text = generate_bindings(ops, ops[0].namespace)
        ops_h = (Path(plan.bindings).parent / "ops.h").as_posix() if plan.bindings else "csrc/ops.h"
        key = _key({**ident, "bindings": text, "files": _closure_hashes(plan.tree, ops_h)})
        obj = store.root / "kernels" / key / "dsv4patch_bindings.o"
        src = obj.with_suffix(".cpp")
        cmd = [str(tc.nvcc), *common, "-I", str(plan.tree / Path(ops_h).parent), "-I", "csrc",
               *tc.includes(), *tc.prefix_maps(plan.tree, obj.parent, top), "-c", str(src), "-o", str(obj)]
        builds.append(UnitBuild("dsv4patch_bindings", "<generated bindings>", (), key, obj, cmd, text))
    return builds, ops, notes


def _unit_archs(plan: KernelPlan, archs: tuple[str, ...], cuda_version: str,
                cmake: sources.CMakeTarget) -> tuple[list[tuple[sources.TranslationUnit, tuple[str, ...]]], list[str]]:
    """Each unit of ``plan`` that CMake builds for some of ``archs`` with an nvcc of ``cuda_version``, with
    those archs; a note for each unit it builds for none of them (skipped)."""
    chosen: list[tuple[sources.TranslationUnit, tuple[str, ...]]] = []
    notes: list[str] = []
    for u in plan.units:
        ua = sources.unit_archs(u, archs, cuda_version, cmake)
        if ua:
            chosen.append((u, ua))
        else:
            notes.append(f"{u.path}: CMake builds it for none of {', '.join(archs)}; skipped")
    return chosen, notes


def planned_units(plan: KernelPlan, archs: Sequence[str],
                  cuda_version: str) -> tuple[list[UnitBuild], list[sources.Op], list[str]]:
    """The units :func:`plan_build` would compile for ``archs`` with an nvcc of ``cuda_version``, before
    the toolchain that keys them is installed (a dry run installs nothing): each without a key
    (``""``), an object or a command."""
    chosen, notes = _unit_archs(plan, tuple(archs), cuda_version, sources.cmake_target(plan.tree))
    units = [UnitBuild(Path(u.path).stem, u.path, ua, "", Path(), [],
                       ops=tuple(o.name for o in plan.ops if o.unit == u.path)) for u, ua in chosen]
    built = {u.path for u, _ in chosen}
    ops = [o for o in plan.ops if o.unit in built]
    if ops:
        units.append(UnitBuild("dsv4patch_bindings", "<generated bindings>", (), "", Path(), [],
                               generate_bindings(ops, ops[0].namespace)))
    return units, ops, notes


def _tmp_name(path: Path) -> Path:
    """A fresh, unpredictable name beside ``path`` for a program's output (never a planted name)."""
    return path.with_name(f".{path.name}.{safeio.token()}.tmp")


def _compile(u: UnitBuild, cwd: Path, store: Store) -> None:
    with store.mutex(f"kernel-{u.key}"):
        if safeio.is_regular(u.obj):
            u.cached = True
            return
        store.subdir("kernels", u.obj.parent.name)
        if u.name == "dsv4patch_bindings":
            safeio.atomic_write(u.obj.with_suffix(".cpp"), u.text, durable=False)
        tmp = _tmp_name(u.obj)
        cmd = [*u.command[:-1], str(tmp)]
        t0 = time.monotonic()
        try:  # nvcc's output is removed whatever ends it (a failure, a deadline, an interrupt)
            res = childproc.run(cmd, cwd=cwd, deadline=COMPILE_DEADLINE, what=f"nvcc {u.source}")
            u.seconds = time.monotonic() - t0
            if res.returncode != 0:
                raise BuildError(
                    f"nvcc failed for {u.source}"
                    f" ({', '.join(u.archs) or 'host'}; {res.status()}):\n"
                    f"{(res.stderr or res.stdout).strip()[-4000:]}\ncommand: {' '.join(cmd)}"
                )
            os.replace(tmp, u.obj)
        finally:
            tmp.unlink(missing_ok=True)


def compile_units(units: list[UnitBuild], cwd: Path, store: Store, max_jobs: int,
                  progress: Progress | None = None) -> None:
    """Compile what is not cached, ``max_jobs`` at a time; a bar shows units done/total and elapsed."""
    todo = [u for u in units if not safeio.is_regular(u.obj)]
    for u in units:
        if safeio.is_regular(u.obj):
            u.cached = True
    if not todo:
        return
    prog = progress or Progress(False)
    with prog.task(f"compiling {len(todo)} kernel unit(s) with nvcc", len(todo), "units") as task, \
            ThreadPoolExecutor(max_workers=max(1, max_jobs)) as pool:
        futures = [pool.submit(_compile, u, cwd, store) for u in todo]
        try:
            for f in futures:
                f.result()
                task.advance(1)
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def _torch_cuda_stub(store: Store, tc: Toolchain, base_cmd: list[str]) -> Path:
    """A directory with a stand-in ``libtorch_cuda.so`` to link against a CPU torch.

    The library must *need* libtorch_cuda (the stable ABI's CUDA entry points,
    e.g. ``aoti_torch_get_current_cuda_stream``, live there, and torch loads it
    RTLD_LOCAL), and a CPU torch has none.  A trial link with
    ``--no-undefined`` names the symbols no linked library defines; the stub
    defines exactly those as functions (and nothing else), so the library's
    dynamic symbol table, and its bytes, are what a link against the CUDA
    torch gives.  At run time the CUDA torch's own libtorch_cuda.so, already
    loaded, satisfies them.
    """
    trial = childproc.run([*base_cmd, "-Xlinker", "--no-undefined"], deadline=LINK_DEADLINE,
                          what="the trial link (undefined symbols)", keep=16 << 20)
    names = sorted(set(re.findall(r"undefined reference to `([A-Za-z_][A-Za-z0-9_]*)'", trial.stderr)))
    text = "// dsv4patch: stands in for a CPU torch's missing libtorch_cuda.so at link time\n" + "".join(
        f'extern "C" void {n}(void) {{}}\n' for n in names)
    d = store.root / "kernels" / "stubs" / sha256((tc.nvcc_version + text).encode())[:16]
    lib = d / "libtorch_cuda.so"
    with store.mutex(f"kernel-stub-{d.name}"):
        if safeio.is_regular(lib):
            return d
        store.subdir("kernels", "stubs", d.name)
        src = d / "stub.cpp"
        safeio.atomic_write(src, text, durable=False)
        tmp = _tmp_name(lib)
        try:
            res = childproc.run([str(tc.nvcc), "-shared", "-Xcompiler", "-fPIC", "-Xlinker",
                                 "-soname=libtorch_cuda.so", "-o", str(tmp), str(src)],
                                deadline=LINK_DEADLINE, what="the libtorch_cuda link stub")
            if res.returncode != 0:
                raise BuildError(f"building the libtorch_cuda link stub failed ({res.status()}):\n"
                                 f"{res.stderr.strip()[-2000:]}")
            os.replace(tmp, lib)
        finally:
            tmp.unlink(missing_ok=True)
    return d


def link(units: list[UnitBuild], tc: Toolchain, store: Store) -> Path:
    key = _key({"objs": [u.key for u in units], "nvcc": tc.nvcc_version, "torch_lib": str(tc.torch_lib),
                "flags": LINK_FLAGS, "map": LINK_MAP})
    out = store.root / "kernels" / key / "libdsv4patch_kernels.so"
    with store.mutex(f"kernel-{key}"):
        if safeio.is_regular(out):
            return out
        store.subdir("kernels", key)
        tmp = _tmp_name(out)
        # ld exports _edata/_end/__bss_start unless a linked library defines them (a CUDA
        # torch's libc10 does, a CPU torch's does not): never exported, the bytes agree.
        vmap = store.root / "kernels" / "link-v1.map"
        if not safeio.is_regular(vmap) or safeio.read_bytes(vmap, 4096) != LINK_MAP.encode():
            safeio.atomic_write(vmap, LINK_MAP, durable=False)
        cmd = [str(tc.nvcc), *LINK_FLAGS, "-Xlinker", f"--version-script={vmap}", "-o", str(tmp),
               *[str(u.obj) for u in units], "-Xlinker", "-Bsymbolic",
               "-L", str(tc.torch_lib), "-lc10", "-ltorch", "-ltorch_cpu"]
        # The stable ABI's CUDA entry points (aoti_torch_get_current_cuda_stream, ...)
        # live in libtorch_cuda, which torch loads RTLD_LOCAL: the library must need it,
        # whether or not it uses a symbol of it (--no-as-needed), a CPU torch through a stub.
        if not (tc.torch_lib / "libtorch_cuda.so").exists():
            trial_out = tmp.with_name(tmp.name + ".trial")
            base = [c if c != str(tmp) else str(trial_out) for c in cmd]
            try:
                cmd += ["-L", str(_torch_cuda_stub(store, tc, base))]
            finally:
                trial_out.unlink(missing_ok=True)
        cmd += ["-Xlinker", "--no-as-needed", "-ltorch_cuda"]
        try:
            res = childproc.run(cmd, deadline=LINK_DEADLINE, what="linking the kernel library")
            if res.returncode != 0:
                raise BuildError(f"linking the kernel library failed ({res.status()}):\n{res.text[-4000:]}")
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    return out


DEFLATED_SUFFIX = ".deflate6"  # the library's deflated bytes (zipcopy.deflate's settings), kept beside it

# The plugin package's __init__.py: a plain module of this package, copied verbatim.
RUNTIME_SOURCE = Path(__file__).with_name("runtime.py")


def write_wheel(out_dir: Path, name: str, version: str, files: dict[str, bytes],
                entry_points: str, tag: str = "py3-none-linux_x86_64", summary: str = "",
                requires: Sequence[str] = (), stored: Mapping[str, Path] | None = None,
                final: bool = False) -> Path:
    """A wheel (zip + .dist-info) with ``files``; deterministic bytes for the same input.

    ``stored``: member -> a cache file that keeps its deflated bytes (:func:`zipcopy.deflate_reusing`);
    ``final``: the wheel is the run's result (:func:`dsv4patch.safeio.replacing`)."""
    info = f"{name}-{version}.dist-info"
    meta = {
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {summary}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires)
        ).encode(),
        f"{info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: dsv4patch\nRoot-Is-Purelib: false\nTag: {tag}\n"
        ).encode(),
        f"{info}/entry_points.txt": entry_points.encode(),
    }
    allf = {**files, **meta}
    allf[f"{info}/RECORD"] = zipcopy.record((zipcopy.record_row(p, d) for p, d in allf.items()),
                                            f"{info}/RECORD")
    out_dir.mkdir(parents=True, exist_ok=True)
    keep = stored or {}
    return zipcopy.write(out_dir / f"{name}-{version}-{tag}.whl",
                         (zipcopy.deflate_reusing(arc, data, keep[arc], _mode(arc)) if arc in keep
                          else zipcopy.deflate(arc, data, _mode(arc)) for arc, data in allf.items()),
                         final=final)


def _mode(arc: str) -> int:
    return 0o755 if arc.endswith(".so") else 0o644


def wheel_version(vllm_version: str, tree_id: str, info: dict[str, Any]) -> str:
    """``<vllm>+tree<12 hex>.b<10 hex>``: the patched tree, then a short hash of what else decides
    the library's content (the arch list, the torch and CUDA it is built for and with), so that two
    builds of one tree for other archs or another toolchain never share a file name in ``dist/``
    (a local version label: pip installs it as ``vllm==<vllm>`` requires)."""
    variant = {k: info.get(k) for k in ("archs", "torch_version", "torch_cuda_version", "cuda_version")}
    variant["archs"] = sorted(str(a) for a in info.get("archs") or [])
    digest = sha256(json.dumps(variant, sort_keys=True).encode())[:10]
    return f"{vllm_version}+tree{tree_id[:12]}.b{digest}"


def package(result: BuildResult, pin_name: str, vllm_version: str, tc: Toolchain, out_dir: Path,
            final: bool = False) -> Path:
    assert result.library is not None
    name = dist_name(pin_name)
    lib = "libdsv4patch_kernels.so"
    units = []
    for u in result.units:
        if u.name == "dsv4patch_bindings":
            continue
        sass, ptx = sources.split_ptx(u.archs)
        units.append({"unit": u.source, "ops": list(u.ops), "sass": sass, "ptx": ptx})
    info = {
        "vllm_version": vllm_version, "pin": pin_name, "tree_id": result.plan.tree_id,
        "head": result.plan.head, "base": result.plan.base, "archs": list(result.archs),
        "ops": result.ops, "units": units,
        # The torch release and the CUDA of the torch the library runs in. Not the local label
        # of the torch it was built against (+cpu / +cu130): both give the same library bytes
        # (docs/kernels.md, "The toolchain"), so the wheel is the same too.
        "torch_version": tc.torch_version.split("+", 1)[0],
        "torch_cuda_version": tc.torch_cuda_expected or tc.torch_cuda_version,
        "cuda_version": tc.cuda_version, "library": lib,
        # The torch the pin's vLLM requires; torch_mismatch: built against another one on
        # purpose (--allow-torch), which `status --installed` reports.
        "torch_required": tc.torch_required or None, "torch_mismatch": tc.torch_mismatch,
        "library_sha256": sha256(result.library.read_bytes()),
    }
    version = wheel_version(vllm_version, result.plan.tree_id, info)
    files = {
        f"{name}/__init__.py": RUNTIME_SOURCE.read_bytes(),
        f"{name}/__main__.py": b"import sys\n\nfrom . import main\n\nsys.exit(main())\n",
        f"{name}/build_info.json": (json.dumps(info, indent=2, sort_keys=True) + "\n").encode(),
        f"{name}/{lib}": result.library.read_bytes(),
    }
    eps = f"[{PLUGIN_GROUP}]\n{name} = {name}:register\n"
    # The library's deflated bytes are kept beside it in the link's cache entry: a warm build reuses them.
    return write_wheel(out_dir, name, version, files, eps, tag=wheel_tag(tc.machine),
                       summary=f"dsv4patch-rebuilt vLLM {vllm_version} kernels: {', '.join(result.ops)}",
                       requires=[f"vllm=={vllm_version}"],
                       stored={f"{name}/{lib}": result.library.with_name(lib + DEFLATED_SUFFIX)}, final=final)


def build(
    plan: KernelPlan,
    *,
    pin_name: str,
    vllm_version: str,
    archs: Sequence[str],
    store: Store,
    toolchain: Toolchain,
    out_dir: Path,
    max_jobs: int = 2,
    nvcc_threads: int = 1,
    progress: Progress | None = None,
    dry_run: bool = False,
    arch_origin: str = "",
    final: bool = False,
) -> BuildResult:
    """Compile, link and package; ``archs`` is the ``TORCH_CUDA_ARCH_LIST`` to build for; ``final``:
    the kernel wheel is the run's result (:func:`dsv4patch.safeio.replacing`)."""
    cpu_note = check_cuda_match(toolchain)
    units, ops, notes = plan_build(plan, archs, toolchain, store, nvcc_threads)
    notes[:0] = list(toolchain.notes)
    if cpu_note:
        notes.insert(0, cpu_note)
    result = BuildResult(plan, tuple(archs), units, [o.name for o in ops], notes=notes,
                         arch_origin=arch_origin)
    if plan.unmapped:
        notes.append(
            "changed kernel sources that no unit of the target includes (not rebuilt): "
            + ", ".join(plan.unmapped)
        )
    if not units:
        notes.append("the patches change no kernel unit: nothing to build")
        return result
    if dry_run:
        for u in units:
            u.cached = safeio.is_regular(u.obj)
        return result
    if progress is not None:
        progress.note(toolchain.describe())
    compile_units(units, plan.tree, store, max_jobs, progress)
    with (progress or Progress(False)).step(f"link {len(units)} unit(s) and write the kernel wheel"):
        result.library = link(units, toolchain, store)
        result.wheel = package(result, pin_name, vllm_version, toolchain, out_dir, final=final)
    return result


def full_build_env(arch_list: Sequence[str], max_jobs: int, nvcc_threads: int) -> dict[str, str]:
    """Environment for vLLM's own build (setup.py/CMake read these)."""
    return {
        "VLLM_TARGET_DEVICE": "cuda",
        # Space separated, as vLLM's Dockerfile sets it; torch's CMake also accepts ';'.
        "TORCH_CUDA_ARCH_LIST": " ".join(arch_list),
        "MAX_JOBS": str(max_jobs),
        "NVCC_THREADS": str(nvcc_threads),
    }


def full_build_command(tree: Path, arch_list: Sequence[str], max_jobs: int, nvcc_threads: int,
                       docker: bool = False, python: str = sys.executable,
                       image: str = "vllm-dsv4patch") -> tuple[list[str], dict[str, str]]:
    env = full_build_env(arch_list, max_jobs, nvcc_threads)
    if docker:
        cmd = [
            "docker", "build", "-f", "docker/Dockerfile", "--target", "vllm-openai",
            "--build-arg", f"torch_cuda_arch_list={env['TORCH_CUDA_ARCH_LIST']}",
            "--build-arg", f"max_jobs={max_jobs}", "--build-arg", f"nvcc_threads={nvcc_threads}",
            "-t", image, ".",
        ]
        return cmd, {}
    return [python, "-m", "pip", "install", "-v", "."], env


