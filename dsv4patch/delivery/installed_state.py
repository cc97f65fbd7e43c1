"""What ``status --installed`` finds in a node's vLLM, as values: files, patches, kernels, SBOM, package.

Why: these results travel from :mod:`.installed` and :mod:`.provenance` to
``commands/status.py`` and the self-test's ``installed`` case.  As plain dicts a
misspelt key was a ``KeyError`` on a node (or a silent ``None``), and what an
untrusted interpreter printed was indexed wherever it was used.  Here each
result is a frozen value with a ``to_json()`` that writes the JSON of
``status --installed --format json`` and of the self-test report, key for key
and in order (``tests/test_installed_state.py`` pins the keys), and what comes
from outside (the probe's answer, printed by the interpreter under test) is
checked once, on read (:meth:`Probe.from_json`, refused with
:class:`~dsv4patch.errors.ParameterError` as before).

What the installed package says of itself (its ``dsv4patch.json``, its
``build_info.json`` units and torch versions) is reported as it says it, never
trusted: those fields are :data:`JsonValue`, echoed unchanged.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any, Literal, Protocol, TypeAlias

from dsv4patch import safeio
from dsv4patch.errors import ParameterError
from dsv4patch.records import frozen
from dsv4patch.safeio import loads_json

# A JSON value as read (a foreign document's field, reported and never trusted).
JsonValue: TypeAlias = "str | int | float | bool | None | list[JsonValue] | dict[str, JsonValue]"

KERNEL_LIBRARY = "<kernel library>"  # the file key of a patch that changes only kernel sources


class Reported(Protocol):
    """A record of a later layer carried as it reports itself: the SBOM's facts (``sbom.SbomFacts``), the
    installed wheel's SBOM account (``provenance.Provenance``)."""

    def to_json(self) -> dict[str, JsonValue]: ...


# --- the probe's answer (the interpreter under test prints it: checked on read) --------------------


@frozen
class ProbedVllm:
    """Where the probed interpreter's vLLM is (located, not imported), and what its metadata says."""

    package: str  # the ``vllm`` package directory
    root: str  # the site directory that holds it
    version: str | None = None
    provenance: str | None = None  # the text of its dist-info ``dsv4patch.json``, if any
    sboms: tuple[str, ...] = ()  # PEP 770 SBOM files, as its RECORD lists them
    error: str | None = None  # why its metadata could not be read


@frozen
class ProbedKernels:
    """The kernel package the probed interpreter finds."""

    dir: str
    build_info: JsonValue  # its build_info.json as read (None: absent or unreadable); checked by the reader
    entry_points: tuple[str, ...] = ()


def _strings(value: object) -> tuple[str, ...] | None:
    """``value`` as a tuple of strings, or None when it is not a list of strings."""
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        return None
    return tuple(value)


def _vllm_problem(v: object) -> str | None:
    if not isinstance(v, dict) or not all(isinstance(v.get(k), str) for k in ("package", "root")):
        return "\"vllm\" has no string \"package\" and \"root\""
    if any(v.get(k) is not None and not isinstance(v.get(k), str) for k in ("version", "provenance")):
        return "\"vllm\" has a version or provenance that is not a string"
    if _strings(v.get("sboms", [])) is None:
        return "\"vllm\".sboms is not a list of strings"
    return None


def _probe_problem(data: object) -> str | None:
    """Why the probe's answer is not the shape the probe prints, or None."""
    if not isinstance(data, dict) or not isinstance(data.get("python"), str):
        return "the answer is not an object with a \"python\" string"
    if data.get("vllm") is not None and (problem := _vllm_problem(data["vllm"])):
        return problem
    if data.get("torch") is not None and not isinstance(data.get("torch"), str):
        return "\"torch\" is not a version string"
    k = data.get("kernels")
    if k is not None:
        if not isinstance(k, dict) or not isinstance(k.get("dir"), str):
            return "\"kernels\" has no string \"dir\""
        if _strings(k.get("entry_points", [])) is None:
            return "\"kernels\".entry_points is not a list of strings"
    return None


@frozen
class Probe:
    """What an interpreter has installed (vLLM, torch, the kernel package), as its probe answered."""

    python: str
    vllm: ProbedVllm | None
    torch: str | None
    kernels: ProbedKernels | None

    @classmethod
    def from_json(cls, data: Any, *, label: str) -> Probe:
        """The probe's parsed answer; a wrong shape is :class:`ParameterError` (``label``: who answered)."""
        problem = _probe_problem(data)
        if problem:
            raise ParameterError(f"{label}: the probe's answer is not what it prints ({problem}); "
                                 "is this a Python interpreter?")
        v, k = data.get("vllm"), data.get("kernels")
        vllm = None if v is None else ProbedVllm(
            package=v["package"], root=v["root"], version=v.get("version"), provenance=v.get("provenance"),
            sboms=_strings(v.get("sboms", [])) or (), error=v["error"] if isinstance(v.get("error"), str) else None)
        kernels = None if k is None else ProbedKernels(k["dir"], k.get("build_info"),
                                                       _strings(k.get("entry_points", [])) or ())
        return cls(data["python"], vllm, data.get("torch"), kernels)


# --- the results ----------------------------------------------------------------------------------


@frozen
class FileState:
    """One shipped file a patch changes, against the pin's patched and unpatched content."""

    state: str  # present, stock, missing, other
    problem: str | None = None  # other: why it could not be read
    sha256: str | None = None  # other: the installed content's
    diff: str | None = None  # other: a summary against the patched file

    def to_json(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {"state": self.state}
        for key, value in (("problem", self.problem), ("sha256", self.sha256), ("diff", self.diff)):
            if value is not None:
                out[key] = value
        return out


@frozen
class PatchState:
    """One patch: the worst of its files' states (or ``upstream``, ``not-shipped``), and each file's."""

    state: str  # present, stock, missing, other; upstream (not applied); not-shipped (SBOM check)
    files: dict[str, FileState] = field(default_factory=dict)
    problem: str | None = None  # the SBOM check's ``other``: why the patch does not peel off

    def to_json(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {"state": self.state, "files": {k: v.to_json() for k, v in self.files.items()}}
        if self.problem is not None:
            out["problem"] = self.problem
        return out

    def not_present(self) -> dict[str, FileState]:
        """The files that are not ``present`` (the table's and the notes' detail)."""
        return {name: f for name, f in self.files.items() if f.state != "present"}


@frozen
class KernelUnit:
    """One compiled unit of the kernel library, as its build_info.json names it (reported as read)."""

    unit: JsonValue
    sass: JsonValue
    ptx: JsonValue

    def to_json(self) -> dict[str, JsonValue]:
        return {"unit": self.unit, "sass": self.sass, "ptx": self.ptx}


@frozen
class ActiveCheck:
    """Whether the kernel package's own check says torch's dispatcher runs its kernels (on a GPU)."""

    checked: bool
    active: bool | None  # None: not checked
    exit_code: int | None = None
    report: JsonValue = None  # the check's JSON answer, or its output
    reason: str | None = None  # why it was not checked

    def to_json(self) -> dict[str, JsonValue]:
        if not self.checked:
            return {"checked": False, "active": self.active, "reason": self.reason}
        return {"checked": True, "exit_code": self.exit_code, "report": self.report, "active": self.active}


@frozen
class TorchFit:
    """The torch the kernel library was built for and the pin requires (its build_info.json's word,
    reported as read), and the torch installed here."""

    built: JsonValue
    required: JsonValue
    installed: str | None

    def to_json(self) -> dict[str, JsonValue]:
        return {"built": self.built, "required": self.required, "installed": self.installed}


@frozen
class KernelCheck:
    """The installed kernel library against the pin's patched tree (absent: ``installed`` False)."""

    package: str
    installed: bool
    ok: bool
    note: str | None = None
    dir: str = ""
    tree_id: str | None = None
    library: str = ""
    library_present: bool = False
    units: tuple[KernelUnit, ...] = ()
    hooked: bool = False  # route: the vllm/__init__.py hook line
    entry_point: bool = False  # route: a vllm.general_plugins entry point
    torch: TorchFit | None = None
    active: ActiveCheck | None = None  # asked only by check() and the self-test

    def to_json(self) -> dict[str, JsonValue]:
        if not self.installed:
            return {"package": self.package, "installed": False, "ok": self.ok, "note": self.note}
        out: dict[str, JsonValue] = {
            "package": self.package, "installed": True, "dir": self.dir, "tree_id": self.tree_id,
            "library": self.library, "library_present": self.library_present,
            "units": [u.to_json() for u in self.units], "routes": dict(self.routes()),
            "torch": self.torch.to_json() if self.torch is not None else None,
            "ok": self.ok}
        if self.note is not None:
            out["note"] = self.note
        if self.active is not None:
            out["active"] = self.active.to_json()
        return out

    def routes(self) -> dict[str, bool]:
        """Each activation route and whether the installed files take it."""
        return {"vllm-hook": self.hooked, "entry-point": self.entry_point}


@frozen
class SbomCheck:
    """The installed SBOM against what is installed: ``ok``, ``mismatch``, ``unreadable`` or ``absent``."""

    state: str
    path: str | None
    problems: tuple[str, ...] = ()
    others: tuple[str, ...] | None = None  # absent or outside the site: the other SBOM files listed
    facts: Reported | None = None  # read: what it says (``sbom.SbomFacts``)

    def to_json(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {"state": self.state, "path": self.path}
        if self.others is not None:
            out["others"] = list(self.others)
        out["problems"] = list(self.problems)
        if self.facts is not None:
            out["facts"] = self.facts.to_json()
        return out


_WHEEL_KEYS = ("pin", "version", "patch_set_sha256", "patched_tree")


@frozen
class WheelProvenance:
    """What the installed wheel's ``dsv4patch.json`` says it is (reported as it says it, never trusted)."""

    pin: JsonValue
    version: JsonValue
    patch_set_sha256: JsonValue
    patched_tree: JsonValue

    @classmethod
    def from_text(cls, text: str) -> WheelProvenance | Literal["unreadable"]:
        """Its four fields (absent: None); "unreadable" when the text is not a JSON object."""
        try:
            prov = loads_json(text, label="dsv4patch.json")
        except safeio.UnsafeFileError:
            return "unreadable"
        if not isinstance(prov, dict):
            return "unreadable"
        return cls(*(prov.get(k) for k in _WHEEL_KEYS))

    def to_json(self) -> dict[str, JsonValue]:
        return dict(zip(_WHEEL_KEYS, (self.pin, self.version, self.patch_set_sha256, self.patched_tree),
                        strict=True))


@frozen
class InstalledPackage:
    """The installed vLLM: where, which version, and its own account of itself."""

    package: str
    version: str | None
    # its dsv4patch.json (or "unreadable"); from the SBOM check: the SBOM's (``provenance.Provenance``);
    # None: it has none
    provenance: WheelProvenance | Reported | Literal["unreadable"] | None = None

    def to_json(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {"package": self.package, "version": self.version}
        if self.provenance is not None:
            out["provenance"] = self.provenance if isinstance(self.provenance, str) else self.provenance.to_json()
        return out
