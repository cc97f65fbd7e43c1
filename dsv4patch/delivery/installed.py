"""``dsv4patch status --installed``: does the vLLM installed in an environment carry the fixes?

Operators run vLLM on many nodes and in images; what matters there is the
installed package, not a source tree.  This module asks an interpreter
(``--python``, default this one) where its vLLM is, without importing vLLM
(no torch, no CUDA initialisation: it works in a health check), and compares
every shipped file each patch changes with the lock's patched tree, which is
recomputed from the cache (the lock's hashes are the trust anchor; the
``dsv4patch.json`` the patched wheel carries is reported, never trusted).

Per patch: ``present`` (every file it changes has the patched content),
``stock`` (a file has the pin's unpatched content), ``missing`` (a file is
absent), or ``other`` (anything else; a diff summary against the patched file
is given); the worst file decides (missing, other, stock) and each file's
state is listed.
A patch that changes only kernel sources is ``present`` when the rebuilt
kernel library of this patched tree is installed.  The kernel library is
reported with its archs and activation routes (the ``vllm/__init__.py`` hook
line or the ``vllm.general_plugins`` entry point); on a machine with a GPU,
``python -m <kernel package> check`` says whether its kernels are the ones
torch's dispatcher runs.  ``ok`` only when everything matches.

:func:`check` is the whole inspection (``dsv4patch status --installed`` renders
its :class:`InstalledReport`).  What it finds are the frozen records of
:mod:`.installed_state` (each writes its part of the JSON report); the probe's
answer is checked there on read.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Mapping
from dataclasses import field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from dsv4patch import childproc, report, safeio
from dsv4patch.delivery import sbom
from dsv4patch.delivery.installed_state import (
    KERNEL_LIBRARY,
    ActiveCheck,
    FileState,
    InstalledPackage,
    KernelCheck,
    KernelUnit,
    PatchState,
    Probe,
    SbomCheck,
    TorchFit,
    WheelProvenance,
)
from dsv4patch.errors import EXIT_UNEXPECTED, ChildError, Dsv4Error, LockFileError, ParameterError, param
from dsv4patch.hashing import hash_installed, sha256
from dsv4patch.kernels import KERNEL_MEMBER_LIMIT, hook_line, kernel_dist_name
from dsv4patch.nextstep import Blank, Step, mention
from dsv4patch.records import frozen
from dsv4patch.safeio import loads_json
from dsv4patch.series import patched_tree

if TYPE_CHECKING:
    from dsv4patch.delivery.installed_state import (
        JsonValue,
        ProbedKernels,
        ProbedVllm,
    )
    from dsv4patch.pins import Context, Lock, Pin
    from dsv4patch.series import ChangedFile, PatchedTree

# Runs in the target interpreter: standard library only, vLLM is located, not imported.
_PROBE = r"""
import importlib.util, json, os, sys
out = {"python": sys.executable, "vllm": None}
spec = importlib.util.find_spec("vllm")
if spec is not None and spec.submodule_search_locations:
    pkg = list(spec.submodule_search_locations)[0]
    out["vllm"] = {"package": pkg, "root": os.path.dirname(pkg)}
    try:
        from importlib import metadata
        dist = metadata.distribution("vllm")
        out["vllm"]["version"] = dist.version
        out["vllm"]["provenance"] = dist.read_text("dsv4patch.json")
        # PEP 770 SBOMs: <dist-info>/sboms/*, as the installed RECORD lists them (located, not read)
        out["vllm"]["sboms"] = sorted(str(dist.locate_file(f)) for f in (dist.files or [])
                                      if f.parent.name == "sboms" and f.parent.parent.name.endswith(".dist-info"))
    except Exception as exc:
        out["vllm"]["version"] = None
        out["vllm"]["error"] = repr(exc)
try:
    from importlib import metadata as _md
    out["torch"] = _md.version("torch")
except Exception:
    out["torch"] = None
kdist = sys.argv[1]
kspec = importlib.util.find_spec(kdist)
out["kernels"] = None
if kspec is not None and kspec.submodule_search_locations:
    d = list(kspec.submodule_search_locations)[0]
    info = None
    try:  # no link, no FIFO, at most 1 MiB (the installed package is not trusted)
        fd = os.open(os.path.join(d, "build_info.json"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            import stat
            if stat.S_ISREG(os.fstat(fd).st_mode):
                raw = os.read(fd, (1 << 20) + 1)
                info = json.loads(raw) if len(raw) <= 1 << 20 else None
        finally:
            os.close(fd)
    except (OSError, ValueError, RecursionError):
        pass
    eps = []
    try:
        from importlib.metadata import entry_points
        eps = [e.value for e in entry_points(group="vllm.general_plugins") if e.value.startswith(kdist)]
    except Exception:
        pass
    out["kernels"] = {"dir": d, "build_info": info, "entry_points": eps}
print("DSV4PATCH-PROBE " + json.dumps(out))
"""

STATES = ("present", "stock", "missing", "other")


class SbomError(Dsv4Error):
    """The installed vLLM has no readable SBOM to show (exit 1: it is not what the lock makes)."""

    exit_code = EXIT_UNEXPECTED
    kind = "integrity"

# Bounds (docs/trust.md): what the target interpreter and its installed files may make dsv4patch read.
OUTPUT_LIMIT = 16 << 20  # bytes of a child's stdout + stderr kept (the probe, the kernel check)
INIT_LIMIT = 16 << 20  # bytes of vllm/__init__.py read to look for the hook line
EDIT_SLACK = 1 << 20  # an installed file may be this much larger than the pin's copy and still be read


def run_bounded(cmd: list[str], timeout: float, env: dict[str, str] | None = None,
                cwd: str | None = None) -> tuple[int | None, str, str]:
    """(exit code or None when a signal ended it, stdout, stderr) of ``cmd``, through :mod:`dsv4patch.childproc`.

    Past ``timeout`` s or :data:`OUTPUT_LIMIT` bytes of output the child and every
    process it started are ended (:class:`~dsv4patch.errors.ChildError`, exit 8); an
    interpreter named by ``--python`` is not trusted to answer, nor to print little.
    """
    fin = childproc.run(cmd, deadline=timeout, what=f"{cmd[0]}", env=env, cwd=cwd, flood=OUTPUT_LIMIT,
                        keep=OUTPUT_LIMIT)
    return fin.returncode, fin.stdout, fin.stderr


def probe(python: str, kernel_dist: str) -> Probe:
    """What ``python`` has installed (vLLM, torch, the kernel package), located, not imported.

    Cannot run, not a Python, an answer that is not JSON or not the probe's shape: ParameterError (2);
    hangs or floods: ChildError (8).
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    label = f"{param('python')} {python}"
    fin, data = childproc.ask_python(python, _PROBE, kernel_dist, marker="DSV4PATCH-PROBE", label=label,
                                     env=env, cwd="/")
    if fin.returncode != 0 or data is None:
        raise ParameterError(f"{label}: not a working Python interpreter ({fin.status()}: "
                         f"{fin.last_line()})")
    return Probe.from_json(data, label=label)


def _diff_summary(have: bytes, want: bytes) -> str:
    a = want.decode("utf-8", "replace").splitlines()
    b = have.decode("utf-8", "replace").splitlines()
    added = removed = 0
    first = None
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        first = first or i1 + 1
        removed += i2 - i1
        added += j2 - j1
    return f"+{added} -{removed} lines against the patched file (first difference at line {first})"


def pick_pin(lock: Lock, name: str | None, version: str | None) -> Pin:
    if name:
        return lock.pin(name)
    public = (version or "").split("+", 1)[0]
    matches = [p for p in lock.pins.values() if p.vllm_version == public]
    if lock.default_pin and any(p.name == lock.default_pin for p in matches):
        return lock.pin(lock.default_pin)
    return matches[0] if matches else lock.pin(None)


# Why a patch is in each state (the ``status --installed`` note of that state).
_STATE_WHY = {
    "stock": "the installed files are the pin's own, unpatched",
    "missing": "a file it changes is not installed",
    "other": "a file it changes has content neither stock nor patched: changed after install",
}


def _no_vllm(python: str) -> str:
    """The note for an interpreter without vLLM, with the step that names the vLLM environment's own (dsv4patch
    installed apart from vLLM, as pipx or its own venv does, checks its own interpreter by default)."""
    step = Step.of("status", installed=True, python=Blank("PYTHON"))
    return (f"vLLM is not installed in {python}; if it is in another environment, name that environment's "
            f"interpreter: {mention(step)} (or set DSV4PATCH_VLLM_PYTHON)")


def inspect(pin_name: str | None, python: str, *, ctx: Context) -> InstalledReport:
    """The report (``ok`` and per-patch states) for the vLLM ``python`` sees.

    Without the kernel package's GPU check and the summary notes: :func:`check` adds them.
    """
    first = probe(python, "")
    pin = pick_pin(ctx.lock, pin_name, first.vllm.version if first.vllm else None)
    kdist = kernel_dist_name(pin.name)
    found = probe(python, kdist)
    vllm = found.vllm
    if vllm is None:
        return InstalledReport(found.python, pin.name, pin.vllm_version, None, {}, None, False,
                               notes=[_no_vllm(found.python)])
    notes = []
    version_ok = (vllm.version or "").split("+", 1)[0] == pin.vllm_version
    if not version_ok:
        notes.append(f"installed vLLM {vllm.version} is not pin {pin.name}'s "
                     f"{pin.vllm_version}")
    package = InstalledPackage(vllm.package, vllm.version,
                               WheelProvenance.from_text(vllm.provenance) if vllm.provenance else None)
    tree = patched_tree(ctx=ctx, pin=pin)
    root, top = Path(vllm.root), Path(vllm.package).name
    kernel = _kernels(found.kernels, tree.patched_tree, root / top / "__init__.py", kdist, found.torch)
    patches = _patch_states(tree, root, top, kernel_ok=kernel.ok)
    checked, document = check_sbom(vllm, tree, kernel)
    ok = (version_ok and all(p.state in ("present", "upstream") for p in patches.values())
          and (kernel.ok or not any(p.startswith("csrc/") for p in tree.by_path()))
          and checked.state != "mismatch")  # an SBOM that contradicts the installed files fails
    return InstalledReport(found.python, pin.name, pin.vllm_version, package, patches, kernel, ok, notes,
                           patch_set_sha256=tree.series.hash(), patched_tree=tree.patched_tree, sbom=checked,
                           sbom_document=document)


def _patch_states(tree: PatchedTree, root: Path, top: str, *, kernel_ok: bool) -> dict[str, PatchState]:
    """Each patch of the series in the installed files (in series order); ``upstream`` when not applied."""
    changes = tree.by_path()
    out: dict[str, PatchState] = {}
    for patch in tree.series.patches:
        paths = tree.patch_files.get(patch.name)
        # not applied: the lock expects it upstream already
        out[patch.name] = (PatchState("upstream") if paths is None
                           else _patch_state(paths, changes, root, top, kernel_ok=kernel_ok))
    return out


def _patch_state(paths: list[str], changes: dict[str, ChangedFile], root: Path, top: str, *,
                 kernel_ok: bool) -> PatchState:
    """One applied patch: each shipped file it changes, and the worst file's state as the patch's.

    A patch that changes only kernel sources is as present as the installed kernel library.
    """
    files: dict[str, FileState] = {}
    for rel in paths:
        change = changes.get(rel)
        if change is None or not rel.startswith(top + "/"):
            continue  # tests, kernel sources, files another patch restores: not shipped
        files[rel] = _file_state(root / rel, change)
    kernel_only = not files and any(p.startswith("csrc/") for p in paths)
    if kernel_only:
        files[KERNEL_LIBRARY] = FileState("present" if kernel_ok else "missing")
    states = {f.state for f in files.values()}
    # The worst file decides: missing, then other, then stock (the files say which).
    state = next((s for s in ("missing", "other", "stock") if s in states), "present")
    return PatchState(state, files)


def _file_state(target: Path, change: ChangedFile) -> FileState:
    """An installed file against the pin's patched and unpatched content: present, stock, missing, other."""
    if change.patched is None:
        return FileState("present" if not os.path.lexists(target) else "stock")
    # Bounded: the larger of the two contents it may rightly have, plus room for a local edit
    # (reported with its diff summary); anything larger is reported as too large, never read whole.
    limit = max(len(change.patched), len(change.base or b"")) + EDIT_SLACK
    try:
        have = safeio.read_bytes(target, limit, what=str(target))
    except FileNotFoundError:
        return FileState("missing")
    except (safeio.UnsafeFileError, OSError) as exc:
        return FileState("other", problem=str(exc) if isinstance(exc, safeio.UnsafeFileError)
                         else f"{target}: {exc.strerror or exc}")
    if have == change.patched:
        return FileState("present")
    if change.base is not None and have == change.base:
        return FileState("stock")
    return FileState("other", sha256=sha256(have), diff=_diff_summary(have, change.patched))


def check_sbom(vllm: ProbedVllm, tree: PatchedTree, kernel: KernelCheck) -> tuple[SbomCheck, str | None]:
    """The installed SBOM (``<dist-info>/sboms/dsv4patch.cdx.json``) against what is installed.

    (report, the document's text or None).  ``state``: ``ok``, ``mismatch`` (it
    contradicts the installed version, the lock's patch set or the installed
    kernel library: each ``problems`` line says which), ``unreadable`` (a link,
    too large, not JSON) or ``absent`` (vLLM installed another way: the
    patched tree plus a kernel wheel, or a stock wheel).
    """
    path, rep = _sbom_path(vllm)
    if path is None:
        return rep, None
    try:
        raw = safeio.read_bytes(path, sbom.SBOM_LIMIT, what=path)
        doc = loads_json(raw, label=path, limit=sbom.SBOM_LIMIT)
    except FileNotFoundError:
        return replace(rep, problems=(f"{path}: listed in RECORD but missing",)), None
    except (OSError, safeio.UnsafeFileError) as exc:
        return replace(rep, problems=(str(exc) if isinstance(exc, safeio.UnsafeFileError) else f"{path}: {exc}",)), None
    facts = sbom.read(doc)
    problems = list(facts.problems) + _sbom_against_install(facts, vllm.version, tree, kernel)
    return SbomCheck("mismatch" if problems else "ok", path, tuple(problems), facts=facts), raw.decode("utf-8", "replace")


def _sbom_path(vllm: ProbedVllm) -> tuple[str | None, SbomCheck]:
    """Our SBOM among the installed RECORD's ``sboms/`` files, and the report so far (unreadable until read).

    Only RECORD rows that stay in the site directory, in a .dist-info of it: a row
    ``../../../outside/evil-1.0.dist-info/sboms/...`` is never read (nor shown as vLLM's SBOM).
    None, with the final report, when there is none to read.
    """
    listed = list(vllm.sboms)
    outside = [p for p in listed if _outside_site(p, vllm.root)]
    paths = [p for p in listed if p not in outside]
    mine = [p for p in paths if Path(p).name == sbom.SBOM_NAME]
    if outside and not mine:
        return None, SbomCheck("unreadable", None, others=tuple(paths), problems=tuple(
            f"the installed RECORD lists {p!r} outside the site directory {vllm.root}; not read"
            for p in outside[:5]))
    if not mine:
        return None, SbomCheck("absent", None, others=tuple(paths), problems=(
            f"the installed vLLM has no {sbom.SBOM_DIR}/{sbom.SBOM_NAME} in its .dist-info "
            "(not installed from a `dsv4patch wheel` wheel)",))
    return mine[0], SbomCheck("unreadable", mine[0])


def _sbom_against_install(facts: sbom.SbomFacts, version: str | None, tree: PatchedTree,
                          kernel: KernelCheck) -> list[str]:
    """Where the SBOM contradicts the installed vLLM's version, the lock's applied patches or the
    installed kernel library (one line each)."""
    problems: list[str] = []
    if facts.version != version:
        problems.append(f"the SBOM describes vLLM {facts.version}, the installed vLLM is {version}")
    if version and facts.purl != sbom.purl(version):
        problems.append(f"the SBOM's purl is {facts.purl}, not {sbom.purl(version)}")
    applied = {p.name: p.sha256 for p in tree.series.patches if p.name in tree.patch_files}
    if facts.patch_set_sha256 != tree.series.hash():
        problems.append(f"the SBOM's patch set is {str(facts.patch_set_sha256)[:12]}, the lock's is "
                        f"{tree.series.hash()[:12]}")
    if facts.patches != applied:
        diff = sorted(set(facts.patches.items()) ^ set(applied.items()))
        problems.append("the SBOM's patches are not the lock's applied patches (differ: "
                        + ", ".join(n for n, _ in diff[:5]) + ")")
    if sorted(facts.diff_sha256) != sorted(applied.values()):
        problems.append("the SBOM's pedigree patch texts do not hash to the lock's patches")
    if kernel.installed:
        have = hash_installed(Path(kernel.library), KERNEL_MEMBER_LIMIT)
        if facts.kernel_library_sha256 is None:
            problems.append("the SBOM names no kernel library, one is installed")
        elif have != facts.kernel_library_sha256:
            problems.append(f"the installed kernel library {kernel.library} has sha256 "
                            f"{str(have)[:16]}, the SBOM says {facts.kernel_library_sha256[:16]}")
    elif facts.kernel_library_sha256 is not None:
        problems.append(f"the SBOM names the kernel library {facts.kernel_library_sha256[:16]}, none is installed")
    return problems


def _outside_site(path: str, root: str) -> bool:
    """Does ``path`` (a file an installed RECORD row names) leave the site directory ``root``?

    It must be ``<root>/<name>.dist-info/sboms/<file>`` as written (no ``..``, nothing
    absolute elsewhere) and stay there once links are resolved.
    """
    site = os.path.normpath(root)
    norm = os.path.normpath(path)
    rel = os.path.relpath(norm, site) if os.path.isabs(norm) == os.path.isabs(site) else ".."
    parts = Path(rel).parts
    if rel.startswith("..") or len(parts) != 3 or not parts[0].endswith(".dist-info") or parts[1] != "sboms":
        return True
    if os.path.normpath(os.path.join(site, rel)) != norm or ".." in Path(path).parts:
        return True
    real_site = os.path.realpath(site)
    return os.path.commonpath([real_site, os.path.realpath(norm)]) != real_site


def torch_problem(info: Mapping[str, object], installed_torch: str | None) -> str | None:
    """Why the kernel library does not fit this environment's torch, or None.

    The library is compiled and linked against one torch (``build_info.json``
    ``torch_version``); ``torch_mismatch`` says it was not the pin's on purpose
    (``--allow-torch``).  Either way the library is reported as built for
    another torch when it differs from the pin's or from the torch installed here.
    """
    built = str(info.get("torch_version") or "").split("+", 1)[0]
    required = str(info.get("torch_required") or "").split("+", 1)[0]
    if info.get("torch_mismatch") or (required and built and built != required):
        return (f"the kernel library was built for torch {built or '?'}, not torch {required or '?'} "
                f"that the pin's vLLM requires ({param('allow_torch')}); rebuild it without {param('allow_torch')}")
    have = (installed_torch or "").split("+", 1)[0]
    if built and have and built != have:
        return (f"the kernel library was built for torch {built}, this environment has torch {have}; "
                "install the pin's torch or rebuild the library against this one")
    return None


def _kernels(found: ProbedKernels | None, tree_id: str, init: Path, kdist: str,
             installed_torch: str | None = None) -> KernelCheck:
    """The installed kernel package (the probe's ``kernels``) against the pin's patched tree ``tree_id``."""
    if found is None:
        return KernelCheck(kdist, installed=False, ok=False,
                           note=f"{kdist} is not installed: the kernel fixes are not in effect")
    raw = found.build_info or {}
    shape = None
    info: dict[str, JsonValue] = {}
    if isinstance(raw, dict):
        info = raw
    else:
        shape = f"build_info.json is a {type(raw).__name__}, not an object"
    lib = _library(found.dir, info.get("library", ""))
    try:  # bytes, not text: a vllm/__init__.py that is not UTF-8 simply has no hook line
        hooked = hook_line(kdist).encode() in safeio.read_bytes(init, INIT_LIMIT)
    except (OSError, safeio.UnsafeFileError):
        hooked = False
    units = info.get("units", [])
    tree = info.get("tree_id")
    built_from = tree if isinstance(tree, str) else None
    present, entry_point = safeio.is_regular(lib), bool(found.entry_points)
    problem = torch_problem(info, installed_torch)
    note = f"built from tree {built_from}, the pin's patched tree is {tree_id}" if built_from != tree_id else problem
    return KernelCheck(
        kdist, installed=True, ok=bool(built_from == tree_id and present and (hooked or entry_point) and problem is None),
        note=shape or note, dir=found.dir, tree_id=built_from, library=str(lib), library_present=present,
        units=tuple(KernelUnit(u.get("unit"), u.get("sass"), u.get("ptx"))
                    for u in (units if isinstance(units, list) else []) if isinstance(u, dict)),
        hooked=hooked, entry_point=entry_point,
        torch=TorchFit(info.get("torch_version"), info.get("torch_required"), installed_torch))


def _library(package_dir: str, name: JsonValue) -> Path:
    """The library build_info.json names (the installed package's word): it must be a file in the package."""
    name = name if isinstance(name, str) else ""
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        return Path(package_dir) / "<no library named>"
    return Path(package_dir) / name


def _gpu_present() -> bool:
    return any(Path("/dev").glob("nvidia[0-9]*"))


def active_check(python: str, kdist: str) -> ActiveCheck:
    """On a GPU machine: the kernel package's own dispatcher check."""
    try:
        rc, stdout, stderr = run_bounded([python, "-m", kdist, "check", "--json"], 600)
    except ChildError as exc:
        return ActiveCheck(checked=True, active=False, exit_code=None, report={"output": str(exc)})
    data: JsonValue
    try:
        data = loads_json(stdout[stdout.index("{"):], label=f"{kdist} check --json")
    except (ValueError, safeio.UnsafeFileError):
        data = {"output": stdout[-2000:] + stderr[-2000:]}
    return ActiveCheck(checked=True, active=rc == 0, exit_code=rc, report=data)


def _activity(python: str, kernel: KernelCheck) -> ActiveCheck:
    """The installed kernel library's GPU check, or why it was not asked (no GPU here)."""
    if _gpu_present():
        return active_check(python, kernel.package)
    return ActiveCheck(checked=False, active=None, reason="no GPU on this machine")


@frozen
class InstalledReport:
    """Does the vLLM an interpreter sees carry the lock's patched files and kernels?"""

    python: str
    pin: str
    vllm_version: str
    installed: InstalledPackage | None  # package, version, provenance (the wheel's word)
    patches: dict[str, PatchState]  # patch -> state and per-file states
    kernels: KernelCheck | None
    ok: bool
    notes: list[str] = field(default_factory=list)
    patch_set_sha256: str | None = None  # None: vLLM is not installed (nothing compared)
    patched_tree: str | None = None
    sbom: SbomCheck | None = None  # the installed SBOM checked (check_sbom); None: no vLLM
    sbom_document: str | None = None  # its text, as installed (``status --installed --format cyclonedx``)

    def to_json(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {"python": self.python, "pin": self.pin, "vllm_version": self.vllm_version,
                               "installed": self.installed.to_json() if self.installed is not None else None,
                               "patches": {name: p.to_json() for name, p in self.patches.items()},
                               "kernels": self.kernels.to_json() if self.kernels is not None else None,
                               "ok": self.ok, "notes": list(self.notes)}
        if self.patch_set_sha256 is not None:
            out["patch_set_sha256"] = self.patch_set_sha256
            out["patched_tree"] = self.patched_tree
        if self.sbom is not None:
            out["sbom"] = self.sbom.to_json()
        return out

    def table(self) -> tuple[report.Table, str]:
        """The terminal table (one row per patch) and its markdown."""
        rows = []
        for name, p in self.patches.items():
            detail = ", ".join(f"{f}: {v.state}" + (f" ({v.diff})" if v.diff is not None else "")
                               for f, v in p.not_present().items())
            rows.append([name, p.state, detail])
        return report.simple_table(f"{mention(Step.of('status', installed=True))}: {self.python}",
                                   ["patch", "state", "files not present"], rows)


def check_from_sbom(*, python: str | None = None, lock: Lock | None = None,
                    pin_name: str | None = None) -> InstalledReport:
    """Without the lock's patch files (a node with only ``pip install dsv4patch``): the installed vLLM
    against its own SBOM (:mod:`dsv4patch.delivery.provenance`), and against ``lock``'s pin (``pin_name``, else
    the SBOM's) when a lock was given without its patches (a URL)."""
    from dsv4patch.delivery import provenance

    python = python or sys.executable
    first = probe(python, "")
    vllm = first.vllm
    if vllm is None:
        return InstalledReport(first.python, "?", "?", None, {}, None, False,
                               notes=[_no_vllm(first.python)])
    prov = provenance.read(list(vllm.sboms))
    lock_pin = None
    if lock is not None:
        lock_pin = lock.pin(pin_name) if pin_name else lock.pins.get(prov.pin or "")
        if lock_pin is None:
            raise LockFileError(f"the lock given has no pin {prov.pin} (the installed vLLM's); name the pin to "
                                "compare with")
    kdist = kernel_dist_name(prov.pin or "")
    found = probe(python, kdist)
    top = Path(vllm.package).name
    kernel = _kernels(found.kernels, str(prov.patched_tree), Path(vllm.root) / top / "__init__.py", kdist,
                      found.torch)
    rep = provenance.inspect(vllm, kernel.library if kernel.installed else None, lock_pin)
    ok = rep.ok and (kernel.ok or not kernel.installed and prov.kernel_library_sha256 is None)
    if kernel.installed:
        active = _activity(python, kernel)
        kernel = replace(kernel, active=active)
        ok = ok and (bool(active.active) or not active.checked)
    names = ", ".join(p.name for p in rep.provenance.patches)
    notes = [f"python {first.python}: vLLM {vllm.version} at {vllm.package}",
             f"checked against the installed wheel's own SBOM ({prov.path}): pin {prov.pin}, patched tree "
             f"{str(prov.patched_tree)[:12]}, patches {names}"]
    if lock_pin is None:
        notes.append("no lock here: the SBOM's own patches are the reference; give a lock (a path or a URL) to "
                     "check them against the series you expect")
    elif not provenance.lock_problems(prov, lock_pin):
        notes.append(f"the lock's pin {lock_pin.name} describes the same patched tree, sdist and stock wheel")
    notes += rep.problems
    return InstalledReport(first.python, str(prov.pin), (prov.version or "").split("+", 1)[0],
                           InstalledPackage(vllm.package, vllm.version, rep.provenance),
                           rep.patches, kernel, ok, notes, patched_tree=prov.patched_tree)


def check(
    *,
    ctx: Context,
    pin_name: str | None = None,
    python: str | None = None,
) -> InstalledReport:
    """Inspect the vLLM ``python`` (default: the interpreter running dsv4patch) sees against pin
    ``pin_name`` (default: the pin of the installed version); on a GPU machine, also ask
    the kernel package whether its kernels are the ones torch runs."""
    python = python or sys.executable
    rep = inspect(pin_name, python, ctx=ctx)
    kernel, ok = rep.kernels, rep.ok
    if kernel is not None and kernel.installed:
        active = _activity(python, kernel)
        kernel = replace(kernel, active=active)
        ok = ok and (bool(active.active) or not active.checked)
    inst = rep.installed
    notes = [*rep.notes]
    if inst or not any("not installed" in n for n in notes):  # said once
        notes.append(f"python {rep.python}: " + (f"vLLM {inst.version} at {inst.package}" if inst else
                                                 "no vLLM installed"))
    notes.append(f"pin {rep.pin} (vLLM {rep.vllm_version})"
                 + (f", patched tree {rep.patched_tree[:12]}" if rep.patched_tree is not None else ""))
    if kernel is not None:
        notes += _kernel_notes(kernel)
    patch_notes = _patch_notes(rep.patches, rep.pin, ours=inst is not None and inst.provenance is not None)
    notes += patch_notes
    if rep.sbom is not None:
        notes.append(_sbom_note(rep.sbom, patches_differ=bool(patch_notes)))
    if inst:
        # Files and kernels only: nothing here runs the engine (the selftest does, on a GPU).
        notes.append("the engine was not run: `dsv4patch selftest` runs a tiny DeepSeek-V4 through "
                     "this vLLM on this node's GPU (docs/selftest.md)")
    notes.append("everything matches the lock" if ok else "DOES NOT MATCH the lock")
    return replace(rep, kernels=kernel, ok=bool(ok), notes=notes)


def _words(value: JsonValue) -> str:
    """A build_info.json list (a unit's archs) as words, as it says them."""
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return str(value) if value else ""


def _kernel_notes(kernel: KernelCheck) -> list[str]:
    """The kernel library's lines: its state, routes, archs and whether it is active; or why it is absent."""
    if not kernel.installed:
        return [str(kernel.note)]
    routes = ", ".join(k for k, v in kernel.routes().items() if v) or "none"
    archs = "; ".join(f"{Path(str(u.unit)).name}: {_words(u.sass)}" for u in kernel.units)
    act = kernel.active
    notes = [f"kernel library {kernel.package}: "
             f"{'ok' if kernel.ok else 'NOT OK'} (tree {str(kernel.tree_id)[:12]}, "
             f"routes: {routes}; archs {archs}); active: "
             + (str(act.active) if act is not None and act.checked
                else f"not checked ({act.reason if act is not None else 'not asked'})")]
    if kernel.note:
        notes.append(f"kernel library {kernel.package}: {kernel.note}")
    return notes


def _patch_notes(patches: dict[str, PatchState], pin: str, *, ours: bool) -> list[str]:
    """One line per cause (the patches it touches by number; the table has their files), and one
    next step: installing the patched wheel, "again" only where one was installed (``ours``).
    No line when every patch is present or upstream."""
    by_state: dict[str, list[str]] = {}
    for name, p in patches.items():
        if p.state not in ("present", "upstream"):
            by_state.setdefault(p.state, []).append(name)
    notes = []
    for state, names in by_state.items():
        files = ["; ".join(f"{f}: {v.state}" for f, v in patches[n].not_present().items()) for n in names]
        notes.append(f"{state} ({_STATE_WHY.get(state, state)}): "
                     + ", ".join(f"{report.patch_key(n)} ({f or 'its kernels: see the kernel library line'})"
                                 for n, f in zip(names, files, strict=True)))
    if by_state:
        notes.append("  next: " + ("install the patched wheel again" if ours else
                                   "install the patched wheel (this vLLM is not one dsv4patch made)")
                     + f" (`{mention(Step.of('wheel', pin=pin))}`, then `pip install --force-reinstall "
                     "--no-deps <wheel>`)")
    return notes


def _sbom_note(rep: SbomCheck, *, patches_differ: bool) -> str:
    """The installed SBOM's line: it matches, or its state and problems (and the next step on a
    mismatch, unless the patches' line already gave it)."""
    if rep.state == "ok":
        return f"SBOM {rep.path}: matches the installed vLLM, patch set and kernel library"
    return (f"SBOM: {rep.state}" + (f" ({rep.path})" if rep.path else "")
            + "".join(f"\n  {line}" for line in rep.problems)
            + ("\n  next: install the patched wheel again (`dsv4patch wheel`)"
               if rep.state == "mismatch" and not patches_differ else ""))
