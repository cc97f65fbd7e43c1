"""dsv4patch-rebuilt vLLM kernels: load them over vLLM's own, safely, and say so.

This file is copied verbatim into the kernel wheel ``dsv4patch build`` makes
(``<dist>/__init__.py``, next to ``build_info.json`` and the library).  It runs
inside a user's vLLM install, so it uses only the standard library until it
has decided to load (then torch, and vLLM's logger and NVML wrapper).

Two routes activate the kernels; both end in :func:`activate`:

* ``entry-point``: the wheel's ``vllm.general_plugins`` entry point
  (:func:`register`), for a plain ``pip install`` of the wheel.  vLLM skips it
  when ``VLLM_PLUGINS`` names other plugins only.
* ``vllm-hook``: where dsv4patch builds the install (the Docker image), one
  line appended to ``vllm/__init__.py`` calls :func:`activate`, which imports
  the stock ``vllm._C_stable_libtorch`` and then loads the rebuilt library
  (``python -m <dist> install-hook``).  Every process that imports anything
  of vLLM (the engine, spawned workers, a test's child that only imports
  ``vllm._C_stable_libtorch``) then runs the rebuilt kernels, whatever
  ``VLLM_PLUGINS`` says.

Guards: nothing is loaded (and nothing raises) without ``libcuda`` or a CUDA
device; the library is registered only when every visible GPU's compute
capability is covered by the code it carries (SASS or PTX), else the stock
kernels stay and an error goes to vLLM's log; a vLLM of another version is
refused the same way.  ``DSV4PATCH_KERNELS_STRICT=1`` turns every refusal into
an exception; ``DSV4PATCH_KERNELS=0`` disables the kernels (with a warning).

``python -m <dist> check`` reads torch's dispatcher for every rebuilt op and
says which kernel is active (the CUDA kernel's registration site names the
generated ``dsv4patch_bindings`` unit), for which archs, from which tree, and
which route did it.  Exit codes: 0 all ops run the dsv4patch kernels, 1 a stock
kernel is active, 3 nothing could be read (no CUDA libraries).
``python -m <dist> install-hook``: 0 the line was added or is there already,
1 with a one-line message when it cannot be (no vLLM; ``vllm/__init__.py`` a
symbolic link, not a regular file, not UTF-8, or not writable).  It writes a
new file beside ``__init__.py`` (random name, created exclusively, never
through a link) and renames it over ``__init__.py``.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import json
import logging
import os
import re
import sys
from collections.abc import Iterable
from types import ModuleType
from typing import TypedDict

_HERE = os.path.dirname(os.path.abspath(__file__))
_DIST = os.path.basename(_HERE)
HOOK_MARK = "# dsv4patch kernels hook"
HOOK_FILE = "__init__.py"  # of the vllm package
Capability = tuple[int, int]  # (major, minor) of a GPU


class Unit(TypedDict):
    """One compiled unit of the library, as kernels/build.py's package() records it."""

    unit: str
    ops: list[str]
    sass: list[str]  # archs with cubins
    ptx: list[str]  # archs with PTX


class BuildInfo(TypedDict, total=False):
    """build_info.json, written by kernels/build.py's package() ({} outside a built wheel)."""

    vllm_version: str
    pin: str
    tree_id: str
    head: str
    base: str
    archs: list[str]
    ops: list[str]
    units: list[Unit]
    torch_version: str
    torch_cuda_version: str
    cuda_version: str
    library: str


class State(TypedDict):
    """Per-process record of what activate() did."""

    route: str | None
    outcome: str | None
    attempts: list[str]  # every route that called activate(), in order


class OpState(TypedDict):
    kernel: str  # dsv4patch | stock | none
    registered_at: str | None


class CheckReport(TypedDict, total=False):
    """What ``python -m <dist> check`` prints (as JSON with --json)."""

    dist: str
    tree_id: str
    vllm_version_built: str
    vllm_version: str
    units: list[Unit]
    devices: list[str] | None
    ops: dict[str, OpState]
    routes: dict[str, dict[str, bool]]
    activated_by: str | None
    outcome: str | None
    status: str  # dsv4patch | stock | unknown
    reason: str


def _load_info() -> BuildInfo:
    """The wheel's build_info.json ({} where this module is not inside a built wheel)."""
    try:
        with open(os.path.join(_HERE, "build_info.json"), encoding="utf-8") as fh:
            info: BuildInfo = json.load(fh)
            return info
    except FileNotFoundError:
        return {}


BUILD_INFO = _load_info()

_STATE: State = {"route": None, "outcome": None, "attempts": []}


class KernelsError(RuntimeError):
    """Raised instead of logging when DSV4PATCH_KERNELS_STRICT=1."""


def _logger() -> logging.Logger:
    """vLLM's logger (so messages show with vLLM's handlers), else a plain one."""
    try:
        from vllm.logger import init_logger

        logger: logging.Logger = init_logger(f"vllm.{_DIST}")
        return logger
    except Exception:  # vLLM absent or half-imported: still log somewhere
        return logging.getLogger(f"vllm.{_DIST}")


def _strict() -> bool:
    return os.environ.get("DSV4PATCH_KERNELS_STRICT", "0") == "1"


def _refuse(msg: str) -> None:
    """A reason not to load: an exception in strict mode, else an error in vLLM's log."""
    if _strict():
        raise KernelsError(msg)
    _logger().error("%s", msg)


# ---------------------------------------------------------------------------
# Coverage: which compute capabilities the library's code runs on.

def _parse_arch(arch: str) -> tuple[int, int, str] | None:
    m = re.fullmatch(r"(\d+)\.(\d+)([af]?)", arch)
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), m.group(3)


def covers(sass: Iterable[str], ptx: Iterable[str], capability: Capability) -> bool:
    """True when SASS (cubins) or PTX of these archs runs on ``capability`` (major, minor).

    ``X.Ya`` cubins run on X.Y only; ``X.Yf`` and plain ``X.Y`` cubins on X.Y'
    with Y' >= Y (same major); plain PTX is JIT-compiled for any later device,
    ``a``/``f`` PTX only where its cubin would run.
    """
    major, minor = capability
    for arch in sass:
        p = _parse_arch(arch)
        if p and p[0] == major and (minor == p[1] if p[2] == "a" else minor >= p[1]):
            return True
    for arch in ptx:
        p = _parse_arch(arch)
        if not p:
            continue
        if p[2] == "a" and (major, minor) == p[:2]:
            return True
        if p[2] == "f" and major == p[0] and minor >= p[1]:
            return True
        if p[2] == "" and (major, minor) >= p[:2]:
            return True
    return False


def uncovered_units(capability: Capability, info: BuildInfo | None = None) -> list[str]:
    """Units of the library whose code does not run on ``capability``."""
    info = info or BUILD_INFO
    return [u["unit"] for u in info.get("units", [])
            if isinstance(u, dict) and not covers(u.get("sass", []), u.get("ptx", []), capability)]


def _libcuda(compat: bool = False) -> bool:
    """True when the CUDA driver library can be loaded (the stock kernels need it).

    ``compat``: also the CUDA images' forward-compatibility copy, which loads
    without a driver (image builds read the dispatcher with it, never run code).
    """
    names = ["libcuda.so.1", "libcuda.so"]
    if compat:
        names.append("/usr/local/cuda/compat/libcuda.so.1")
    for name in names:
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            return True
        except OSError:
            continue
    return False


def _visible(count: int) -> list[int]:
    """NVML indices of the devices CUDA_VISIBLE_DEVICES exposes (plain indices only)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return list(range(count))
    out = []
    for part in env.split(","):
        part = part.strip()
        if not part:
            break
        if not part.isdigit():  # UUIDs or MIG names: check every device
            return list(range(count))
        if int(part) < count:
            out.append(int(part))
    return out


def _pynvml() -> ModuleType | None:
    """vLLM's NVML wrapper, else the pynvml module, else None."""
    try:
        from vllm.utils.import_utils import import_pynvml

        wrapped: ModuleType = import_pynvml()
        return wrapped
    except Exception:
        try:
            return importlib.import_module("pynvml")
        except Exception:
            return None


def device_capabilities() -> list[Capability] | None:
    """Compute capabilities of the visible GPUs through NVML (never initialises CUDA,
    so vLLM can still fork workers); ``None`` when there is no NVML or no GPU."""
    pynvml = _pynvml()
    if pynvml is None:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        caps: list[Capability] = []
        for i in _visible(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            caps.append((major, minor))
        return caps or None
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


# ---------------------------------------------------------------------------
# Dispatcher: which kernel torch runs for each op.

def _qualified(op: str) -> str:
    return op if "::" in op else f"_C::{op}"


def dispatch_state(op: str) -> tuple[str, str | None]:
    """(``dsv4patch`` | ``stock`` | ``none``, registration site) of ``op``'s CUDA kernel."""
    import torch

    try:
        table: str = torch._C._dispatch_dump_table(_qualified(op))
    except RuntimeError:
        return "none", None
    for line in table.splitlines():
        if line.startswith("CUDA:"):
            m = re.search(r"registered at (\S+)", line)
            site = m.group(1) if m else line[5:].strip()
            if "dsv4patch_bindings" in site:
                return "dsv4patch", site
            if "fallthrough" in line or "fallback" in line:
                return "none", site
            return "stock", site
    return "none", None


def _active_ops() -> dict[str, tuple[str, str | None]]:
    return {op: dispatch_state(op) for op in BUILD_INFO["ops"]}


# ---------------------------------------------------------------------------
# Activation.

def _load_library() -> None:
    import torch

    # The stable ABI's CUDA entry points live in libtorch_cuda, which torch loads
    # RTLD_LOCAL; a library built against a CPU-only torch does not name it.
    cuda = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so")
    if os.path.exists(cuda):
        ctypes.CDLL(cuda, mode=ctypes.RTLD_GLOBAL)
    # The stock library must register first: the last CUDA kernel registered wins.
    import vllm._C_stable_libtorch  # noqa: F401

    torch.ops.load_library(os.path.join(_HERE, BUILD_INFO["library"]))


def activate(route: str = "entry-point", require_device: bool = True) -> str:
    """Load the rebuilt kernels over the stock ones if it is safe; never raises unless strict.

    Returns the outcome: ``active``, ``already-active``, ``disabled``, ``no-cuda``,
    ``no-device``, ``uncovered``, ``version-mismatch`` or ``failed``.
    """
    _STATE["attempts"].append(route)
    try:
        outcome = _activate(route, require_device)
    except KernelsError:
        raise
    except Exception as exc:  # a plugin must never take vLLM down unless asked to
        if _strict():
            raise
        _logger().error("dsv4patch kernels (%s route) failed to load: %r; the stock kernels "
                        "(without the dsv4patch fixes) stay active", route, exc)
        outcome = "failed"
    if _STATE["outcome"] not in ("active", "already-active"):
        _STATE["outcome"] = outcome
        _STATE["route"] = route
    return outcome


def _activate(route: str, require_device: bool) -> str:
    log = _logger()
    tree = BUILD_INFO["tree_id"][:12]
    if os.environ.get("DSV4PATCH_KERNELS", "1") == "0":
        log.warning("dsv4patch kernels disabled by DSV4PATCH_KERNELS=0: the stock kernels of %s "
                    "run WITHOUT the dsv4patch fixes", ", ".join(BUILD_INFO["ops"]))
        return "disabled"
    import vllm

    want = BUILD_INFO["vllm_version"]
    if vllm.__version__ != want:
        _refuse(f"dsv4patch kernels were built for vLLM {want} (tree {tree}), this is vLLM "
                f"{vllm.__version__}: not loading them; the stock kernels stay (rebuild with "
                f"`dsv4patch build` for this vLLM)")
        return "version-mismatch"
    if not _libcuda():
        log.debug("dsv4patch kernels: no libcuda here, nothing to load")
        return "no-cuda"
    caps = device_capabilities()
    if caps is None and require_device:
        log.debug("dsv4patch kernels: no CUDA device visible, nothing to load")
        return "no-device"
    for cap in caps or []:
        missing = uncovered_units(cap)
        if missing:
            _refuse(f"dsv4patch kernels (tree {tree}) carry no code for this GPU "
                    f"(compute capability {cap[0]}.{cap[1]}) in {', '.join(missing)}: not loading "
                    f"them; the stock kernels run WITHOUT the dsv4patch fixes (rebuild with "
                    f"`dsv4patch build --arch {cap[0]}.{cap[1]}` or the pin's default arch list)")
            return "uncovered"
    if all(kind == "dsv4patch" for kind, _ in _active_ops().values()):
        return "already-active"
    _load_library()
    states = _active_ops()
    stock = [op for op, (kind, _) in states.items() if kind != "dsv4patch"]
    if stock:
        _refuse(f"dsv4patch kernels loaded but the dispatcher still runs other kernels for "
                f"{', '.join(stock)}: {states}")
        return "failed"
    log.info("dsv4patch kernels active for %s (patched tree %s, %s route, archs %s)",
             ", ".join(BUILD_INFO["ops"]), tree, route, ", ".join(BUILD_INFO.get("archs", [])))
    return "active"


def register() -> None:
    """``vllm.general_plugins`` entry point."""
    activate("entry-point")


# ---------------------------------------------------------------------------
# The vllm-hook route and the check.

def _vllm_file(rel: str) -> str:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("dsv4patch kernels: vllm is not installed in this python")
    return os.path.join(list(spec.submodule_search_locations)[0], rel)


def hook_line() -> str:
    return f"__import__({_DIST!r}).activate('vllm-hook')  {HOOK_MARK}\n"


_INIT_LIMIT = 16 << 20  # the most install-hook reads of vllm/__init__.py


def _read_init(path: str) -> str:
    """vllm/__init__.py's text: a regular file (no link, no FIFO), at most 16 MiB, UTF-8; else SystemExit."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise SystemExit(f"{path}: cannot open it ({exc.strerror or exc}); a symbolic link is not followed, "
                         "reinstall vLLM") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SystemExit(f"{path} is not a regular file; reinstall vLLM")
        data = os.read(fd, _INIT_LIMIT + 1)
    finally:
        os.close(fd)
    if len(data) > _INIT_LIMIT:
        raise SystemExit(f"{path} is larger than {_INIT_LIMIT} bytes: not vLLM's __init__.py")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SystemExit(f"{path} is not UTF-8: not vLLM's __init__.py; reinstall vLLM") from None


def hook_installed() -> bool:
    path = _vllm_file(HOOK_FILE)
    try:
        return hook_line() in _read_init(path)
    except SystemExit:
        return False


def _replace(path: str, text: str) -> None:
    """Write ``text`` over ``path`` through a new temporary file (``O_EXCL | O_NOFOLLOW``), then rename.

    A link planted at any name near ``path`` is never written through: the
    temporary name is random and created exclusively, and the rename
    replaces ``path`` itself.  The file keeps its permission bits.
    """
    import secrets

    directory, name = os.path.split(path)
    mode = os.lstat(path).st_mode & 0o777
    dfd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        tmp = f".{name}.{secrets.token_hex(6)}.dsv4patch-tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
        try:
            try:
                view = memoryview(text.encode("utf-8"))
                while view:
                    view = view[os.write(fd, view):]
                os.fchmod(fd, mode)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
    finally:
        os.close(dfd)


def install_hook() -> tuple[str, bool]:
    """Append the activation line to the installed vllm/__init__.py (idempotent)."""
    path = _vllm_file(HOOK_FILE)
    text = _read_init(path)
    if hook_line() in text:
        return path, False
    if HOOK_MARK in text:
        raise SystemExit(f"{path} carries another dsv4patch kernels hook; reinstall vLLM first")
    if "__version__" not in text:
        raise SystemExit(f"{path} does not define vLLM's __version__: not the vLLM the kernels "
                         "were built for")
    text = (text if text.endswith("\n") else text + "\n") + hook_line()
    try:
        _replace(path, text)
    except OSError as exc:
        raise SystemExit(f"cannot write {path} ({exc.strerror or exc}); run install-hook as the user "
                         "that owns the vLLM install, or on a writable site-packages") from None
    return path, True


def _entry_point_route() -> dict[str, bool]:
    from importlib.metadata import entry_points

    names = [e.name for e in entry_points(group="vllm.general_plugins") if e.value.startswith(_DIST)]
    allowed = os.environ.get("VLLM_PLUGINS")
    allowed_names = None if allowed is None else [p for p in allowed.split(",") if p]
    return {
        "installed": bool(names),
        "allowed_by_VLLM_PLUGINS": bool(names) and (allowed_names is None
                                                   or any(n in allowed_names for n in names)),
        "ran": "entry-point" in _STATE["attempts"],
    }


def check(no_device: bool = False) -> tuple[CheckReport, int]:
    """Load vLLM the way it starts (platform, then general plugins) and read the dispatcher."""
    report: CheckReport = {"dist": _DIST, "tree_id": BUILD_INFO["tree_id"], "vllm_version_built": BUILD_INFO["vllm_version"],
              "units": BUILD_INFO.get("units", []), "devices": None, "ops": {}, "routes": {}}
    compat = _libcuda(compat=no_device)  # before vllm: its hook needs libcuda to load
    import vllm  # the vllm-hook route runs here if installed

    report["vllm_version"] = vllm.__version__
    if not compat:
        report["status"] = "unknown"
        report["reason"] = "libcuda cannot be loaded here: the CUDA kernels cannot be registered or read"
        return report, 3
    caps = device_capabilities()
    report["devices"] = [f"{c[0]}.{c[1]}" for c in caps] if caps else []
    if no_device and not caps and hook_installed():
        # No GPU (an image build): do what the hook does on a GPU host, minus the device guard.
        activate("vllm-hook", require_device=False)
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    states = _active_ops()
    report["ops"] = {op: {"kernel": k, "registered_at": site} for op, (k, site) in states.items()}
    report["routes"] = {
        "vllm-hook": {"installed": hook_installed(), "ran": "vllm-hook" in _STATE["attempts"]},
        "entry-point": _entry_point_route(),
    }
    report["activated_by"] = _STATE["route"] if _STATE["outcome"] in ("active", "already-active") else None
    report["outcome"] = _STATE["outcome"]
    for name, route in report["routes"].items():
        route["active"] = report["activated_by"] == name
    ok = all(k == "dsv4patch" for k, _ in states.values())
    report["status"] = "dsv4patch" if ok else "stock"
    return report, 0 if ok else 1


def _print_report(report: CheckReport) -> None:
    print(f"dsv4patch kernels {report['dist']} (patched tree {report['tree_id'][:12]}, "
          f"built for vLLM {report['vllm_version_built']}; installed vLLM {report.get('vllm_version')})")
    if report.get("reason"):
        print(f"  unknown: {report['reason']}")
    for op, st in report["ops"].items():
        print(f"  _C::{op}: {st['kernel']} kernel (registered at {st['registered_at']})")
    for u in report["units"]:
        print(f"  {u.get('unit')}: sass {' '.join(u.get('sass', []))}; ptx {' '.join(u.get('ptx', [])) or '-'}")
    if report["devices"] is not None:
        print(f"  devices: {', '.join(report['devices']) or 'none'}")
    for name, route in report["routes"].items():
        print(f"  route {name}: " + ", ".join(f"{k}={v}" for k, v in route.items()))
    print(f"  status: {report['status']}")


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog=f"python -m {_DIST}", description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="which kernel torch's dispatcher runs for each rebuilt op")
    c.add_argument("--json", action="store_true")
    c.add_argument("--no-device", action="store_true",
                   help="register and read the kernels even without a GPU (image builds)")
    sub.add_parser("install-hook", help="make the installed vllm/__init__.py activate the kernels itself")
    args = ap.parse_args(argv)
    if args.cmd == "install-hook":
        path, changed = install_hook()
        print(f"dsv4patch kernels hook {'added to' if changed else 'already in'} {path}")
        return 0
    report, code = check(no_device=args.no_device)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        _print_report(report)
    return code


if __name__ == "__main__":
    sys.exit(main())
