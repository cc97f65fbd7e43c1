"""The Python environment that runs a patched vLLM tree's tests on this host.

A CPU-only venv, cached in the store and keyed by everything that decides its
contents (Python version, the pin's ``requirements/common.txt``, torch and
triton versions): torch (CPU build), triton, pytest and vLLM's common
requirements.  vLLM itself is imported from the source tree under test, with
no compiled extension: the fixes' Triton kernels run under the Triton
interpreter (``TRITON_INTERPRET=1``) on CPU tensors, and
``CUDA_VISIBLE_DEVICES`` is emptied, or vLLM replaces Triton with a
placeholder.  A small pytest plugin makes vLLM's GPU memory cleanup a no-op on
a CPU-only torch.

Pins whose requirements agree share one venv: when no venv exists for a tree's
exact key, a ready venv with the same Python, torch, triton and extras whose
installed packages already satisfy the tree's ``requirements/common.txt``
(pip resolves it against what is installed, offline) is used instead of
building another one (several minutes each).  The choice is recorded next to
the venvs (``<key>.same``), so it is made once.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dsv4patch import childproc, safeio
from dsv4patch.errors import BuildError, Interrupted, param
from dsv4patch.records import frozen

if TYPE_CHECKING:
    from dsv4patch.store import Store

# Deadlines (docs/trust.md "Bounds"): what making and checking a test venv may take.
VENV_DEADLINE = 600.0  # `python -m venv`
INSTALL_DEADLINE = 3 * 3600.0  # pip installing torch, triton and the pin's requirements
DRY_RUN_DEADLINE = 600.0  # `pip install --dry-run --no-index` against a venv
PIP_DEADLINE = 600.0  # `pip install pip` in a new venv (_current_pip)
PIP_FLOOR = "pip>=25.1"  # the oldest pip the test venv is installed with where the index has one

# Triton release that goes with each torch minor (what torch's CUDA wheels pin).
TRITON_FOR_TORCH = {"2.13": "3.7.1", "2.12": "3.7.0", "2.11": "3.6.0", "2.10": "3.5.1"}
EXTRA = ("pytest", "tblib")
PLUGIN_NAME = "dsv4patch_cpu_plugin"


@frozen
class TestEnv:
    python: Path
    plugin_dir: Path
    torch: str

    def env(self) -> dict[str, str]:
        # The plugin's own variables are set by the caller of each session, never inherited.
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DSV4PATCH_RESULTS", "DSV4PATCH_SELECT")}
        env.update(
            TRITON_INTERPRET="1",
            CUDA_VISIBLE_DEVICES="",
            PYTHONPATH=str(self.plugin_dir),
            PYTHONDONTWRITEBYTECODE="1",
            VLLM_LOGGING_LEVEL="WARNING",
        )
        return env

    def pytest_args(self) -> list[str]:
        return [str(self.python), "-m", "pytest", "-p", PLUGIN_NAME, "-p", "no:cacheprovider"]


def torch_version(tree: Path, override: str | None) -> str:
    if override:
        return override
    for req in ("requirements/cuda.txt", "requirements/common.txt"):
        f = tree / req
        if f.exists():
            m = re.search(r"^torch\s*==\s*([0-9.]+)", f.read_text(), re.M)
            if m:
                return m.group(1)
    raise BuildError(f"{tree}: cannot find the pinned torch version in requirements/cuda.txt")


def ensure(tree: Path, store: Store, torch: str | None = None, log: Path | None = None) -> TestEnv:
    """The cached test venv for the tree's requirements, created on first use."""
    common = tree / "requirements" / "common.txt"
    if not common.exists():
        raise BuildError(f"{tree}: requirements/common.txt not found; is this a vLLM tree?")
    tv = torch_version(tree, torch)
    triton = TRITON_FOR_TORCH.get(".".join(tv.split(".")[:2]))
    # Everything but the pin's requirements: venvs that agree on it may be shared.
    base = hashlib.sha256("\n".join([sys.version, tv, triton or "", *EXTRA, "v1"]).encode()).hexdigest()[:20]
    key_src = "\n".join(
        [sys.version, tv, triton or "", common.read_text(), *EXTRA, "v1"]
    ).encode()
    key = hashlib.sha256(key_src).hexdigest()[:20]
    venvs = store.subdir("venvs")  # a real directory: a link planted there is removed
    root = venvs / key
    with store.mutex(f"venv-{key}"):
        _no_link(root)  # a link planted at the entry is removed, never used
        if _ready(root):
            if not (root / ".base").exists():
                (root / ".base").write_text(base + "\n")
        else:
            shared = _shared_venv(venvs, key, base, common)
            if shared is not None:
                root = shared
            else:
                # venvs are not relocatable, so build in place; ".ready" is written last,
                # and a half-built venv left by a killed run is built again.
                shutil.rmtree(root, ignore_errors=True)
                _create(root, common, tv, triton, log)
                (root / ".base").write_text(base + "\n")
                (root / ".ready").write_text(tv + "\n")
    python = root / "bin" / "python"
    # One directory per plugin content: runs of different dsv4patch versions that share
    # the venv (one cache for several checkouts) never load each other's plugin.
    src = Path(__file__).with_name("cpu_pytest_plugin.py").read_bytes()
    plugin_dir = root / f"dsv4patch-plugin-{hashlib.sha256(src).hexdigest()[:16]}"
    target = plugin_dir / f"{PLUGIN_NAME}.py"
    if not target.exists() or target.read_bytes() != src:
        plugin_dir.mkdir(exist_ok=True)
        tmp = plugin_dir / f".{PLUGIN_NAME}.{os.getpid()}.tmp"
        tmp.write_bytes(src)
        os.replace(tmp, target)
    return TestEnv(python=python, plugin_dir=plugin_dir, torch=tv)


def _ready(root: Path) -> bool:
    """A complete venv: a real directory (not a link) with a regular ``.ready`` file."""
    try:
        return stat.S_ISDIR(os.lstat(root).st_mode) and safeio.is_regular(root / ".ready")
    except OSError:
        return False


def _no_link(root: Path) -> None:
    if os.path.islink(root):
        safeio.remove_file(root)


def _shared_venv(venvs: Path, key: str, base: str, common: Path) -> Path | None:
    """A ready venv of the same ``base`` that already satisfies ``common``, else None.

    ``pip install --dry-run --no-index`` resolves the requirements (markers, extras,
    nested ``-r`` files) against the venv's installed packages only: it succeeds
    exactly when nothing would have to be installed or changed."""
    alias = venvs / f"{key}.same"
    if safeio.is_regular(alias):
        name = safeio.read_text(alias, 4096, error=BuildError).strip()
        target = venvs / name
        if re.fullmatch(r"[0-9a-f]{20}", name) and _ready(target):  # a name of this directory, nothing else
            return target
    if not venvs.is_dir():
        return None
    for cand in sorted(venvs.iterdir()):
        if not _ready(cand) or not safeio.is_regular(cand / ".base"):
            continue
        if cand.name == key or safeio.read_text(cand / ".base", 4096, error=BuildError).strip() != base:
            continue
        res = childproc.run(
            [str(cand / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--no-index",
             "--quiet", "--disable-pip-version-check", "-r", str(common)],
            deadline=DRY_RUN_DEADLINE, what=f"pip install --dry-run in {cand}",
        )
        if res.returncode == 0 and "Would install" not in res.stdout:
            alias.write_text(cand.name + "\n")
            return cand
    return None


def _current_pip(python: str) -> bool:
    """Give the new venv a pip of at least :data:`PIP_FLOOR`, from the index the install uses; whether it has one.

    ``python -m venv`` puts in the pip this Python was released with: 3.11's pip 23.2 spent 25 CPU
    seconds resolving a pin's requirements against the index (matching every wheel the index lists
    against every supported tag) where pip 25.1 spends 12, and 61 CPU s on the whole install against
    45 (issue 39, a quiet 2-core machine like CI's; docs/benchmarks.md).  A venv whose pip is already new enough asks
    the index nothing; where the index has no newer pip (an offline mirror), the bundled one installs
    as before, only slower.  The test venv's packages come from the index anyway (not hash-pinned:
    torch, vLLM's requirements), so this trusts the index with nothing it was not trusted with."""
    res = childproc.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", PIP_FLOOR],
                        deadline=PIP_DEADLINE, what="pip install pip (the test environment)")
    if res.interrupted:
        raise Interrupted(childproc.interrupt_signal())
    return res.ok


def _create(root: Path, common: Path, torch: str, triton: str | None, log: Path | None) -> None:
    made = childproc.run([sys.executable, "-m", "venv", str(root)], deadline=VENV_DEADLINE, what="python -m venv")
    if not made.ok:
        raise BuildError(f"creating the test environment failed: `python -m venv` {made.status()}: "
                         f"{made.last_line()}")
    python = str(root / "bin" / "python")
    _current_pip(python)
    pkgs = [f"torch=={torch}", *EXTRA] + ([f"triton=={triton}"] if triton else [])
    cmd = [python, "-m", "pip", "install", "-q", *pkgs, "-r", str(common)]
    res = childproc.run(cmd, deadline=INSTALL_DEADLINE, what="pip install (the test environment)", output=log)
    if res.returncode != 0:
        raise BuildError(
            f"creating the test environment failed (pip {res.status()}):\n"
            f"{res.stderr.strip()[-2000:]}\nThe pin needs torch=={torch}; on a host without it "
            f"pass {param('torch')} VERSION (e.g. the CPU build available here)"
        )
