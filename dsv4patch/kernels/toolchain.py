"""The kernel build toolchain comes from the pin: exactly its torch, an nvcc of its CUDA.

Why: the kernel library is compiled against torch's headers and linked against
its libraries, and it is loaded next to the torch vLLM runs with.  Built
against another torch it can fail to load or misbehave, and the interpreter a
user runs dsv4patch with rarely has the right torch (usually none).  So by
default dsv4patch itself installs the torch the pin's vLLM requires (its
``requirements/cuda.txt``; the stock wheel's METADATA as a fallback) into a
cached build environment under ``<cache>/toolchains/``, from the lock's
hashed requirements file (``[toolchains.NAME].requirements``, pip
``--require-hashes --no-deps``: only the wheel whose files the build reads).

nvcc is the one ``--nvcc`` names (used or the build fails), else
``CUDA_HOME``/``CUDA_PATH``/``PATH``/``/usr/local/cuda``'s when its CUDA major
is the pin torch's; otherwise NVIDIA's toolkit wheels at the lock's versions
(``nvidia-cuda-nvcc`` with crt, nvvm, cccl, nvtx and the runtime headers) are
installed into the cache the same way.  A torch that differs from the pin's
(``--python``) is refused unless ``--allow-torch VERSION`` says so on purpose;
the kernel wheel's ``build_info.json`` then records it.

Every environment is built in ``<cache>/tmp`` and renamed into place complete
(a ``.ready`` record written last) under a store lock, so two runs share one
and a killed run leaves nothing half-made; a second run installs nothing.  An
entry of ``<cache>/toolchains/`` is used only when it is a real directory with
a regular ``.ready`` file: a link planted there is removed and the environment
made afresh, never used.  Every program (the ``--python`` probe, ``venv``,
pip) runs through :mod:`dsv4patch.childproc` with a deadline and bounded output.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import stat
import sys
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dsv4patch import childproc, safeio
from dsv4patch.errors import BuildError, ChildError, Interrupted, LockFileError, ParameterError, param
from dsv4patch.kernels import build as kbuild
from dsv4patch.nextstep import Step, mention
from dsv4patch.records import frozen

if TYPE_CHECKING:
    from dsv4patch.pins import Pin, ToolchainDef
    from dsv4patch.progress import Progress
    from dsv4patch.store import Store

ENV_VERSION = "1"
MAX_TEXT = 1 << 20  # requirements files, torch/version.py, METADATA: read at most this much
VENV_DEADLINE = 600.0  # seconds `python -m venv` may take
PIP_DEADLINE = 3600.0  # seconds one pip install of a toolchain may take (torch is ~1 GB)
# nvidia-nvtx: CCCL includes nvtx3 when it is there (a CUDA toolkit always has it), which
# changes the compiled code; without it the wheels' toolkit would differ from a system one.
CUDA_PACKAGES = ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-cccl",
                 "nvidia-cuda-runtime", "nvidia-nvtx")
CUBLAS_PACKAGE = "nvidia-cublas"
_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.+!-]*)$")
_HASH = re.compile(r"^--hash=sha256:([0-9a-f]{64})$")


def _read_bounded(path: Path, what: str) -> str:
    """At most :data:`MAX_TEXT` bytes of a regular file (a link is followed, a FIFO or device refused, never read)."""
    try:
        data = safeio.read_bytes(path, MAX_TEXT, error=BuildError, what=f"{what} {path}", follow=True)
    except OSError as exc:
        raise BuildError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    return data.decode("utf-8", errors="replace")


@frozen
class Requirement:
    """One ``name==version --hash=sha256:...`` entry of a toolchain requirements file."""

    name: str
    version: str
    hashes: tuple[str, ...]

    def line(self) -> str:
        return f"{self.name}=={self.version} " + " ".join(f"--hash=sha256:{h}" for h in self.hashes)


def read_requirements(path: Path) -> dict[str, Requirement]:
    """The pinned, hashed packages of a lock-side requirements file (nothing else allowed)."""
    text = _read_bounded(path, "toolchain requirements file")
    reqs: dict[str, Requirement] = {}
    for lineno, raw in enumerate(text.replace("\\\n", " ").splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        m = _REQ.match(words[0])
        hashes = [_HASH.match(w) for w in words[1:]]
        if not m or not hashes or not all(hashes):
            raise LockFileError(
                f"{path}: entry {lineno} ({raw.strip()[:80]!r}) is not `name==version "
                "--hash=sha256:<64 hex> ...`; every toolchain package is pinned and hashed")
        name = m.group(1).lower().replace("_", "-")
        reqs[name] = Requirement(name, m.group(2), tuple(h.group(1) for h in hashes if h))
    return reqs


def _need(reqs: dict[str, Requirement], name: str, path: Path) -> Requirement:
    if name not in reqs:
        raise LockFileError(f"{path}: no {name}==... entry; the kernel toolchain needs it")
    return reqs[name]


# The lowest C++ standard torch's headers compile with, from the first release that needs it:
# torch 2.14's headers use C++20 (concepts, std::span); earlier ones build as C++17.
TORCH_CXX_STANDARDS = (((2, 14), 20), ((0,), 17))


def _major_minor(version: str) -> tuple[int, ...]:
    """The first two numbers of a version string (fewer where it has fewer: ``"dev"`` is ``()``)."""
    return tuple(int(x) for x in re.findall(r"\d+", version)[:2])


def torch_cxx_standard(version: str, tdef: ToolchainDef | None) -> tuple[int, str]:
    """(the C++ standard ``torch==version``'s headers need, where that was decided).

    The lock's ``[toolchains.NAME].cxx_standard`` when it names one (it may not be
    lower than what dsv4patch knows that torch needs), else :data:`TORCH_CXX_STANDARDS`.
    """
    parts = _major_minor(public(version))
    known = next(std for since, std in TORCH_CXX_STANDARDS if parts >= since)
    if tdef is not None and tdef.cxx_standard is not None and public(version) == tdef.torch:
        if tdef.cxx_standard < known:
            raise LockFileError(f'[toolchains."{tdef.name}"].cxx_standard = {tdef.cxx_standard}, but torch '
                                f"{public(version)}'s headers need C++{known}")
        return tdef.cxx_standard, f'torch {public(version)} ([toolchains."{tdef.name}"].cxx_standard)'
    return known, f"torch {public(version)}'s headers"


def public(version: str) -> str:
    """``2.13.0+cpu`` -> ``2.13.0`` (a build's local label is not another release)."""
    return version.split("+", 1)[0]


@frozen
class TorchRequirement:
    version: str
    origin: str  # where it was read, for messages


def required_torch(tree: Path, stock_wheel: Path | None = None) -> TorchRequirement:
    """The torch version the pin's vLLM pins: ``requirements/cuda.txt``, else the wheel's METADATA."""
    for rel in ("requirements/cuda.txt", "requirements/common.txt"):
        f = tree / rel
        if f.is_file() and not f.is_symlink():
            m = re.search(r"^torch\s*==\s*([0-9][0-9.]*)\s*(?:#.*)?$", _read_bounded(f, "requirements file"), re.M)
            if m:
                return TorchRequirement(m.group(1), f"{rel} of the pinned tree")
    if stock_wheel is not None and stock_wheel.is_file():
        with zipfile.ZipFile(stock_wheel) as zf:
            meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
            if meta is not None and zf.getinfo(meta).file_size <= MAX_TEXT:
                m = re.search(r"^Requires-Dist: torch\s*\(?==\s*([0-9][0-9.]*)\)?\s*$",
                              zf.read(meta).decode("utf-8", "replace"), re.M)
                if m:
                    return TorchRequirement(m.group(1), f"{stock_wheel.name} METADATA")
    raise BuildError(
        f"{tree}: cannot tell which torch the pin's vLLM requires (no `torch==X` in "
        f"requirements/cuda.txt); pass {param('python')} with the environment to build against")


@frozen
class TorchEnv:
    """A torch whose headers and libraries the kernels build against."""

    version: str  # torch.__version__, e.g. 2.13.0+cpu
    cuda: str | None  # torch.version.cuda; None for a CPU build
    include: Path
    lib: Path
    site: Path  # the site-packages holding torch/
    python: str  # the interpreter (of the provisioned venv, or --python)
    origin: str  # "--python X" / "provisioned: <cache path>"


def _torch_env_from_site(site: Path, python: str, origin: str) -> TorchEnv:
    text = _read_bounded(site / "torch" / "version.py", "torch version file")
    ver = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    if not ver:
        raise BuildError(f"{site / 'torch' / 'version.py'}: no __version__; the build environment is broken")
    return TorchEnv(ver.group(1), cuda.group(1) if cuda else None, site / "torch" / "include",
                    site / "torch" / "lib", site, python, origin)


# Runs in the --python interpreter: finds torch without importing it (no CUDA init, works
# for a torch installed without its dependencies); the version is read from its files.
_TORCH_PROBE = r"""
import importlib.util, json
spec = importlib.util.find_spec("torch")
locs = list(spec.submodule_search_locations or []) if spec is not None else []
print("DSV4PATCH-TORCH " + json.dumps(locs[0] if locs else None))
"""


def torch_from_python(python: str) -> TorchEnv:
    """The torch ``python`` would import (located, not imported).

    An interpreter that cannot run or answers what is not JSON: ParameterError (2);
    one that hangs or floods: ChildError (8); one without torch: BuildError (7).
    """
    res, found = childproc.ask_python(python, _TORCH_PROBE, marker="DSV4PATCH-TORCH", label=f"{param('python')} {python}")
    if found is not None and not isinstance(found, str):
        raise ParameterError(f"{param('python')} {python}: its answer is not the path the torch probe prints; "
                         "is this a Python interpreter?")
    if res.returncode != 0 or not isinstance(found, str):
        raise BuildError(f"{param('python')} {python} has no torch (find_spec('torch') found nothing); leave "
                         f"{param('python')} out and dsv4patch installs the pin's torch for the build")
    return _torch_env_from_site(Path(found).parent, python, f"--python {python}")


def _pip_run(cmd: list[str], progress: Progress, what: str, log: Path) -> None:
    """Run pip (within :data:`PIP_DEADLINE`), its latest output line shown as the progress task's description."""
    t0 = time.monotonic()
    with progress.task(what, None) as task, \
            childproc.Child(cmd, what=what, log=log, env={**os.environ, "PIP_PROGRESS_BAR": "off"}) as child:
        while not child.wait(0.5):
            if time.monotonic() - t0 > PIP_DEADLINE:
                child.kill_tree()
                raise ChildError(f"{what}: pip did not finish within {PIP_DEADLINE:g} s; dsv4patch "
                                           f"ended it (its log: {log})")
            last = next((ln.strip() for ln in reversed(child.tail(2000).splitlines())
                         if ln.strip().startswith(("Processing", "Downloading", "Collecting", "Installing", "Saved"))),
                        None)
            if last:
                task.update(f"{what}: {last[:100]}")
        fin = child.finish()
    if fin.interrupted:
        raise Interrupted(childproc.interrupt_signal())
    if not fin.ok:
        tail = child.tail(3000)
        raise BuildError(f"{what} failed (pip {fin.status()}, {time.monotonic() - t0:.0f} s):\n{tail}\n"
                         "A hash mismatch means the package index served a file the lock does not "
                         "record; check the index, or update the lock's toolchain requirements")


def _env_dir(store: Store, kind: str, parts: Sequence[str]) -> tuple[str, Path]:
    key = hashlib.sha256("\n".join([ENV_VERSION, kind, *parts]).encode()).hexdigest()[:16]
    return key, store.root / "toolchains" / f"{kind}-{key}"


def _torch_parts(torch: Requirement) -> tuple[list[str], list[Requirement]]:
    """What keys the torch environment (the interpreter's version, the machine) and what it holds."""
    return [f"{sys.version_info.major}.{sys.version_info.minor}", platform.machine()], [torch]


def _cuda_parts(pkgs: list[Requirement]) -> tuple[list[str], list[Requirement]]:
    """What keys the NVIDIA nvcc wheels' environment (the machine) and what it holds."""
    return [platform.machine()], pkgs


def _env_key(parts: tuple[list[str], list[Requirement]]) -> list[str]:
    return [*parts[0], *(r.line() for r in parts[1])]


def _provision(store: Store, kind: str, parts: tuple[list[str], list[Requirement]], progress: Progress,
               what: str) -> Path:
    """A venv under ``<cache>/toolchains/`` holding exactly ``parts``' requirements (hash-checked, no deps)."""
    reqs = parts[1]
    key, root = _env_dir(store, kind, _env_key(parts))
    with store.mutex(f"toolchain-{kind}-{key}"):
        store.subdir("toolchains")  # a real directory (a link planted there is removed)
        if ready(root):
            return root
        _clear(root)  # a link planted there is removed at once, never used; a half-made entry too
        tmp = store.tmpdir(f"toolchain-{kind}-")
        try:
            env = tmp / "env"
            venv_flags, pip = _pip_for(env)
            with progress.task(f"{what}: creating the build environment", None):
                made = childproc.run([sys.executable, "-m", "venv", *venv_flags, str(env)], deadline=VENV_DEADLINE,
                                     what="python -m venv")
            if not made.ok:
                raise BuildError(f"{what}: `python -m venv` failed ({made.status()}): {made.last_line()}")
            req_file = tmp / "requirements.txt"
            req_file.write_text("".join(r.line() + "\n" for r in reqs), encoding="utf-8")
            _pip_run([*pip, "install", "--no-deps",
                      "--require-hashes", "--only-binary=:all:", "--no-compile",
                      "--disable-pip-version-check", "-r", str(req_file)],
                     progress, what, tmp / "pip.log")
            shutil.copyfile(tmp / "pip.log", env / "pip.log")  # what was downloaded, kept for reports
            (env / ".ready").write_text(json.dumps({"packages": [r.line() for r in reqs]}) + "\n")
            _clear(root)  # a half-made entry of an older layout, or a link planted there
            os.replace(env, root)
        finally:
            store.remove_tmp(tmp)
    return root


# pip's --python (pip 22.3+): run this pip in another interpreter, installing into its environment.
PIP_PYTHON_OPTION = (22, 3)


def _pip_for(env: Path) -> tuple[list[str], list[str]]:
    """(``python -m venv`` flags, the pip command) for the venv ``env`` made next: this interpreter's
    own pip (``pip --python ENV/bin/python``), the venv made without one (``--without-pip``: ensurepip
    unpacking pip and setuptools into every environment took ~3.5 of the ~6 CPU s of the nvcc wheels'
    install, for files nothing reads); where this interpreter has no pip that can, the venv's own,
    installed by ``venv`` as before.  Either way the same requirements and the same installed files."""
    from importlib import metadata

    try:
        found = _major_minor(metadata.version("pip"))
    except metadata.PackageNotFoundError:
        found = ()
    python = str(env / "bin" / "python")
    if len(found) == 2 and found >= PIP_PYTHON_OPTION:
        return ["--without-pip"], [sys.executable, "-m", "pip", "--python", python]
    return [], [python, "-m", "pip"]


def ready(root: Path) -> bool:
    """Is ``root`` a complete environment: a real directory (not a link) with a regular ``.ready`` file?"""
    try:
        if not stat.S_ISDIR(os.lstat(root).st_mode):
            return False
    except OSError:
        return False
    return safeio.is_regular(root / ".ready")


def _clear(root: Path) -> None:
    """Make way for a new ``root``: a planted link is removed (never followed), a half-made directory too."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(root, ignore_errors=True)
    else:
        safeio.remove_file(root)


def _site(root: Path) -> Path:
    found = sorted(root.glob("lib/python3*/site-packages"))
    if not found:
        raise BuildError(f"{root}: no site-packages; delete it and run again")
    return found[0]


def ensure_torch(store: Store, tdef: ToolchainDef, progress: Progress) -> TorchEnv:
    """The pin's torch, installed once into ``<cache>/toolchains/torch-<key>`` (no deps)."""
    reqs = read_requirements(tdef.requirements)
    torch = _need(reqs, "torch", tdef.requirements)
    if public(torch.version) != tdef.torch:
        raise LockFileError(f"{tdef.requirements}: pins torch=={torch.version}, but "
                            f'[toolchains."{tdef.name}"].torch is {tdef.torch}')
    root = _provision(store, "torch", _torch_parts(torch), progress, f"installing torch {torch.version}")
    return _torch_env_from_site(_site(root), str(root / "bin" / "python"), f"provisioned {root}")


def ensure_cuda_wheels(store: Store, tdef: ToolchainDef, progress: Progress) -> Path:
    """nvcc of NVIDIA's toolkit wheels, installed once into ``<cache>/toolchains/cuda-<key>``.

    The wheels put the toolkit in ``nvidia/cu<major>/``; nvcc.profile expects
    ``targets/<arch>-linux/{include,lib}`` and the link needs ``libcudart.so``:
    both are links inside the environment, made here.
    """
    reqs = read_requirements(tdef.requirements)
    pkgs = [_need(reqs, n, tdef.requirements) for n in CUDA_PACKAGES]
    root = _provision(store, "cuda", _cuda_parts(pkgs), progress,
                      f"installing CUDA {tdef.cuda} nvcc ({pkgs[0].version}, NVIDIA wheels)")
    major = tdef.cuda.split(".")[0]
    top = _site(root) / "nvidia" / f"cu{major}"
    nvcc = top / "bin" / "nvcc"
    if not nvcc.is_file():
        raise BuildError(f"{root}: the nvidia-cuda-nvcc wheel has no nvidia/cu{major}/bin/nvcc")
    target = top / "targets" / f"{platform.machine()}-linux"
    if not target.is_dir():
        target.mkdir(parents=True)
        (target / "include").symlink_to("../../include")
        (target / "lib").symlink_to("../../lib")
    cudart = top / "lib" / "libcudart.so"
    if not cudart.exists() and (top / "lib" / f"libcudart.so.{major}").is_file():
        cudart.symlink_to(f"libcudart.so.{major}")
    return nvcc


@frozen
class NvccChoice:
    path: Path
    version_text: str
    cuda: str
    origin: str  # "--nvcc", "CUDA_HOME", "PATH", ..., or the provisioned wheels


def system_nvccs() -> list[tuple[Path, str]]:
    """(nvcc, where it was found) from CUDA_HOME, CUDA_PATH, PATH and /usr/local/cuda."""
    cands: list[tuple[str, str]] = []
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            cands.append((str(Path(os.environ[env]) / "bin" / "nvcc"), env))
    cands += [(shutil.which("nvcc") or "", "PATH"), ("/usr/local/cuda/bin/nvcc", "/usr/local/cuda")]
    seen: set[str] = set()
    out: list[tuple[Path, str]] = []
    for c, origin in cands:
        if c and c not in seen and Path(c).is_file() and os.access(c, os.X_OK):
            seen.add(c)
            out.append((Path(c), origin))
    return out


def choose_nvcc(store: Store, tdef: ToolchainDef | None, cuda: str, explicit: str | None,
                progress: Progress, notes: list[str], missing: list[WouldInstall] | None = None) -> NvccChoice | None:
    """The nvcc to build with, for a torch of CUDA ``cuda`` (see the module docstring); ``missing``
    given (install nothing): None where the lock's NVIDIA wheels are not installed yet, noted there."""
    found = _found_nvcc(cuda, explicit, notes)
    if found is not None:
        return found
    if tdef is None:
        raise BuildError(f"no nvcc of CUDA {kbuild.cuda_major(cuda)}.x found ({param('nvcc')}, CUDA_HOME, PATH) "
                         "and the lock has no [toolchains.*] entry for this pin to install one from")
    if missing is not None:
        reqs = read_requirements(tdef.requirements)
        pkgs = [_need(reqs, n, tdef.requirements) for n in CUDA_PACKAGES]
        root = _env_dir(store, "cuda", _env_key(_cuda_parts(pkgs)))[1]
        if not ready(root):
            missing.append(WouldInstall(f"NVIDIA's CUDA {tdef.cuda} nvcc wheels",
                                        tuple(f"{r.name}=={r.version}" for r in pkgs), root))
            return None
    return _wheels_nvcc(store, tdef, progress)


def _wheels_nvcc(store: Store, tdef: ToolchainDef, progress: Progress) -> NvccChoice:
    """nvcc of the lock's NVIDIA wheels (installed once, :func:`ensure_cuda_wheels`)."""
    nvcc = ensure_cuda_wheels(store, tdef, progress)
    text, ver = kbuild.nvcc_version(nvcc)
    return NvccChoice(nvcc, text, ver, f"NVIDIA wheels ({tdef.requirements.name})")


def _found_nvcc(cuda: str, explicit: str | None, notes: list[str]) -> NvccChoice | None:
    """``explicit`` (``--nvcc``, refused unless of ``cuda``'s major), else the first system nvcc of
    that major; None: none, the lock's NVIDIA wheels are the way."""
    want = kbuild.cuda_major(cuda)
    if explicit:
        p = Path(explicit)
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise BuildError(f"{param('nvcc')} {explicit}: no such executable; pass the path of an nvcc of "
                             f"CUDA {want}.x, or leave {param('nvcc')} out")
        text, ver = kbuild.nvcc_version(p)
        if kbuild.cuda_major(ver) != want:
            raise BuildError(f"{param('nvcc')} {explicit} is CUDA {ver}, but the torch the kernels build "
                             f"against is built for CUDA {cuda}: use an nvcc of CUDA {want}.x, or "
                             f"leave {param('nvcc')} out")
        return NvccChoice(p, text, ver, "--nvcc")
    for p, origin in system_nvccs():
        try:
            text, ver = kbuild.nvcc_version(p)
        except ChildError as exc:  # hangs, floods or cannot start: not this one
            notes.append(f"{p} ({origin}) is not used: {exc}")
            continue
        except (BuildError, OSError):
            continue
        if kbuild.cuda_major(ver) == want:
            return NvccChoice(p, text, ver, origin)
        notes.append(f"{p} ({origin}) is CUDA {ver}, not CUDA {want}: not used")
    return None


def provisioned(store: Store, tdef: ToolchainDef, nvcc: str | None,
                progress: Progress) -> tuple[TorchEnv, NvccChoice] | None:
    """The lock toolchain's torch and the nvcc :func:`resolve` takes with it, when neither has to be
    installed (else None, nothing installed): what a kept kernel wheel is keyed by
    (:mod:`dsv4patch.kernels.wheelcache`).  ``nvcc``: ``--nvcc``'s."""
    reqs = read_requirements(tdef.requirements)
    torch_req = _need(reqs, "torch", tdef.requirements)
    if public(torch_req.version) != tdef.torch:
        return None  # ensure_torch says why
    _, root = _env_dir(store, "torch", _env_key(_torch_parts(torch_req)))
    if not ready(root):
        return None
    torch = _torch_env_from_site(_site(root), str(root / "bin" / "python"), f"provisioned {root}")
    cuda = torch.cuda or tdef.cuda
    chosen = _found_nvcc(cuda, nvcc, [])
    if chosen is None:
        pkgs = [_need(reqs, n, tdef.requirements) for n in CUDA_PACKAGES]
        if not ready(_env_dir(store, "cuda", _env_key(_cuda_parts(pkgs)))[1]):
            return None
        chosen = _wheels_nvcc(store, tdef, progress)  # installed already: nothing to install
    return torch, chosen


def cublas_include(store: Store, tdef: ToolchainDef | None, cuda: str, progress: Progress) -> Path:
    """``include/`` of the lock's nvidia-cublas wheel (hash-checked), unpacked once."""
    if tdef is None:
        return kbuild.fetch_cublas_headers(store, cuda)
    req = _need(read_requirements(tdef.requirements), CUBLAS_PACKAGE, tdef.requirements)
    return kbuild.fetch_cublas_headers(store, cuda, requirement=req.line(), progress=progress)


@frozen
class WouldInstall:
    """A part of the toolchain a build installs into the cache before it compiles, not there yet."""

    what: str  # "torch 2.13.0", "NVIDIA's CUDA 13.0 nvcc wheels", "cuBLAS headers"
    packages: tuple[str, ...]  # name==version, as the lock's requirements file pins them
    path: Path  # the cache entry it would be installed into
    download: bool = False  # only downloaded and unpacked (the cuBLAS headers), not installed

    def describe(self) -> str:
        verb = "download" if self.download else "install"
        return f"{verb} {self.what} ({', '.join(self.packages)}) into {self.path}"

    def to_json(self) -> dict[str, object]:
        return {"what": self.what, "packages": list(self.packages), "path": str(self.path),
                "action": "download" if self.download else "install"}


@frozen
class Unprovisioned:
    """The toolchain a build of the tree would use when part of it is not in the cache yet: what is
    there (a torch, an nvcc) and what the build would install first (a dry run installs nothing)."""

    torch_required: str
    torch_required_origin: str
    cuda_version: str  # the CUDA of the nvcc found, else the lock's toolchain's
    torch: TorchEnv | None  # --python's, or the cache's already provisioned one
    nvcc: NvccChoice | None  # --nvcc's or a system one (None: the lock's NVIDIA wheels, not installed)
    include_dirs: tuple[Path, ...]
    would_install: tuple[WouldInstall, ...]
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for text output: what is there and what a build installs first."""
        have = [f"torch {self.torch.version} ({self.torch.origin})"] if self.torch else []
        have += [f"nvcc {self.nvcc.cuda} {self.nvcc.path} ({self.nvcc.origin})"] if self.nvcc else []
        return ("toolchain: not all in the cache yet, a build would first " + "; ".join(
            w.describe() for w in self.would_install) + " (this dry run installed and downloaded nothing)"
                + (f"; found: {'; '.join(have)}" if have else ""))

    def to_json(self) -> dict[str, object]:
        return {"installed": False, "cuda": self.cuda_version,
                "torch": self.torch.version if self.torch else None,
                "torch_origin": self.torch.origin if self.torch else None,
                "nvcc": str(self.nvcc.path) if self.nvcc else None,
                "nvcc_origin": self.nvcc.origin if self.nvcc else None,
                "torch_required": self.torch_required,
                "include_dirs": [str(d) for d in self.include_dirs],
                "would_install": [w.to_json() for w in self.would_install]}


class NotProvisioned(Exception):
    """:func:`resolve` with ``install=False``: part of the toolchain is not in the cache (what: ``plan``)."""

    def __init__(self, plan: Unprovisioned) -> None:
        super().__init__("; ".join(w.describe() for w in plan.would_install))
        self.plan = plan


def resolve(
    *,
    store: Store,
    pin: Pin,
    tree: Path,
    progress: Progress,
    python: str | None = None,
    nvcc: str | None = None,
    allow_torch: str | None = None,
    extra_includes: Sequence[Path] = (),
    install: bool = True,
) -> kbuild.Toolchain:
    """The toolchain for building ``tree``'s kernels for ``pin`` (installing what is missing).

    ``python``: build against that interpreter's torch, which must be the pin's unless
    ``allow_torch`` names its version.  Without it, the lock's toolchain torch is installed.
    (The command passes ``$DSV4PATCH_TORCH_PYTHON`` here when ``--python`` is not given.)
    ``install`` False (a dry run): nothing is installed or downloaded; what would be is
    :class:`NotProvisioned`, raised once everything else was looked for.
    """
    req = required_torch(tree)
    tdef = pin.toolchain
    if tdef is not None and tdef.torch != req.version:
        raise LockFileError(
            f'pin {pin.name}: [toolchains."{tdef.name}"] is torch {tdef.torch}, but the pinned '
            f"tree requires torch=={req.version} ({req.origin}); give the pin a toolchain of torch "
            f"{req.version} (docs/kernels.md)")
    notes: list[str] = []
    missing: list[WouldInstall] | None = None if install else []
    if python:
        torch: TorchEnv | None = _given_torch(pin, req, python, allow_torch, notes)
    else:
        torch = _lock_torch(store, pin, tdef, req, allow_torch, progress, missing)
    cuda = (torch.cuda if torch is not None else None) or (tdef.cuda if tdef is not None else None)
    if cuda is None:
        raise BuildError(f"torch {torch.version if torch else req.version} is a CPU build and the lock names no "
                         f"CUDA for pin {pin.name}; pass {param('nvcc')} with the nvcc to build with")
    nv = choose_nvcc(store, tdef, cuda, nvcc, progress, notes, missing)
    includes = _include_dirs(store, tdef, nv, torch, extra_includes, progress, cuda, missing)
    if missing:
        raise NotProvisioned(Unprovisioned(req.version, req.origin, nv.cuda if nv else cuda, torch, nv,
                                           tuple(includes), tuple(missing), tuple(notes)))
    assert torch is not None and nv is not None  # installed above, or missing (raised)
    std, std_origin = torch_cxx_standard(torch.version, tdef)
    return kbuild.Toolchain(
        cxx_standard=std, cxx_standard_origin=std_origin,
        defines=tuple(f"-D{d}" for d in tdef.defines) if tdef is not None else (),
        nvcc=nv.path, nvcc_version=nv.version_text, cuda_version=nv.cuda, python=torch.python,
        torch_version=torch.version, torch_cuda_version=torch.cuda, torch_include=torch.include,
        torch_lib=torch.lib, include_dirs=tuple(includes), torch_required=req.version,
        torch_required_origin=req.origin, torch_origin=torch.origin, nvcc_origin=nv.origin,
        torch_cuda_expected=cuda, notes=tuple(notes),
    )


def _given_torch(pin: Pin, req: TorchRequirement, python: str, allow_torch: str | None,
                 notes: list[str]) -> TorchEnv:
    """The torch of the interpreter ``python``: the pin's, or another one on purpose
    (``allow_torch``, noted)."""
    torch = torch_from_python(python)
    if public(torch.version) != req.version:
        if allow_torch is None or public(allow_torch) != public(torch.version):
            raise BuildError(
                f"torch {torch.version} at {python} is not torch {req.version}, the version "
                f"pin {pin.name}'s vLLM requires ({req.origin}): a kernel library built against "
                f"it may not load or work with vLLM {pin.vllm_version}. Leave {param('python')} out "
                f"(dsv4patch installs torch {req.version}), point {param('python')} at a torch "
                f"{req.version}, or pass {param('allow_torch')} {public(torch.version)} to build against "
                "it on purpose (the wheel then records it)")
        notes.append(f"torch {torch.version} is not the pin's {req.version}: built on purpose "
                     f"({param('allow_torch')}); `{mention(Step.of('status', installed=True), bare=True)}` reports it")
    return torch


def _lock_torch(store: Store, pin: Pin, tdef: ToolchainDef | None, req: TorchRequirement,
                allow_torch: str | None, progress: Progress, missing: list[WouldInstall] | None) -> TorchEnv | None:
    """The pin's torch, installed from the lock's toolchain (which the pin must have); ``missing``
    given (install nothing): None where it is not installed yet, noted there."""
    if allow_torch is not None:
        raise ParameterError(f"{param('allow_torch')} VERSION goes with {param('python')}: without "
                             f"{param('python')} the pin's torch {req.version} is installed and used")
    if tdef is None:
        raise BuildError(
            f"pin {pin.name} has no toolchain in the lock ([toolchains.*] and the pin's "
            f"toolchain key) to install torch {req.version} from; pass {param('python')} with an "
            f"environment that has torch {req.version}")
    if missing is None:
        return ensure_torch(store, tdef, progress)
    reqs = read_requirements(tdef.requirements)
    torch = _need(reqs, "torch", tdef.requirements)
    if public(torch.version) != tdef.torch:
        return ensure_torch(store, tdef, progress)  # refuses the lock (nothing is installed)
    _, root = _env_dir(store, "torch", _env_key(_torch_parts(torch)))
    if ready(root):
        return _torch_env_from_site(_site(root), str(root / "bin" / "python"), f"provisioned {root}")
    missing.append(WouldInstall(f"torch {torch.version}", (f"{torch.name}=={torch.version}",), root))
    return None


def _include_dirs(store: Store, tdef: ToolchainDef | None, nv: NvccChoice | None, torch: TorchEnv | None,
                  extra_includes: Sequence[Path], progress: Progress, cuda: str,
                  missing: list[WouldInstall] | None) -> list[Path]:
    """``extra_includes``, plus cuBLAS's headers where none of them has them (torch's
    nvidia packages, the nvcc's CUDA, else installed) unless they sit beside nvcc's own.
    ``missing`` given (install nothing; ``nv`` and ``torch`` None where not installed yet): the
    cuBLAS headers are not downloaded, but noted there when the cache lacks them."""
    includes = [Path(p) for p in extra_includes]
    if not any(kbuild._has_cublas(d) for d in includes):
        cands = kbuild.cublas_candidates(nv.path, torch.site if torch else None) if nv is not None else []
        found = next((d for d in cands if kbuild._has_cublas(d)), None)
        if found is None and missing is not None:
            found = _cached_cublas(store, tdef, nv.cuda if nv else cuda, missing)
        elif found is None:
            assert nv is not None  # installed when missing is None
            found = cublas_include(store, tdef, nv.cuda, progress)
        if found is not None and (nv is None or found != nv.path.resolve().parent.parent / "include"):
            includes.append(found)
    return includes


def _cached_cublas(store: Store, tdef: ToolchainDef | None, cuda: str, missing: list[WouldInstall]) -> Path | None:
    """The cuBLAS headers :func:`cublas_include` unpacked before, else None, noted in ``missing``."""
    req = _need(read_requirements(tdef.requirements), CUBLAS_PACKAGE, tdef.requirements) if tdef else None
    line = req.line() if req is not None else None
    found = kbuild.cached_cublas_headers(store, cuda, line)
    if found is None:
        spec, dest = kbuild.cublas_headers_entry(store, cuda, line)
        missing.append(WouldInstall("cuBLAS headers", (spec,), dest, download=True))
    return found
