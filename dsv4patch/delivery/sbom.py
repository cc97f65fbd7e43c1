"""The patched wheel's SBOM: CycloneDX 1.6 JSON, where PEP 770 puts it.

Operators ask what exactly is in a patched engine, and their scanners and
registries read CycloneDX, not ``dsv4patch.json``.  The patched wheel carries
``<dist-info>/sboms/dsv4patch.cdx.json``: the vLLM component
(``pkg:pypi/vllm@<local version>``) whose ``pedigree`` names its ancestors
(the stock wheel and the pin's sdist, with their sha256, and the upstream
commit) and one ``patch`` per applied patch (its text, which hashes to the
lock's sha256, and the upstream pull request or issue it resolves, from the
patch's ``Origin:`` trailer), and the rebuilt kernel library as a component
(its sha256, archs, torch and nvcc CUDA versions).

The document is built with ``cyclonedx-python-lib`` (its model and its 1.6
serializer), and is byte-reproducible like the rest of the wheel: no
timestamp (``metadata.timestamp`` is optional and omitted), every ``bom-ref``
is a fixed name, and the serial number is a UUID derived from the document's
own content.

:func:`read` is the other direction, for ``status --installed``: the few
fields it checks, taken from an installed SBOM that is not trusted (shape
checked, bounded by the caller's read).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dsv4patch.errors import BuildError
from dsv4patch.records import frozen
from dsv4patch.seriesfile import read_patch_file

if TYPE_CHECKING:
    from cyclonedx.model import HashType
    from cyclonedx.model.component import Component

    from dsv4patch.pins import Pin, WheelFile
    from dsv4patch.series import Patch

SBOM_NAME = "dsv4patch.cdx.json"
SBOM_DIR = "sboms"  # PEP 770: <name>-<version>.dist-info/sboms/
SBOM_LIMIT = 8 << 20  # the most of an installed SBOM ``status --installed`` reads (docs/trust.md)
SPEC_VERSION = "1.6"
# The SBOM's own properties (CycloneDX property names are namespaced by the tool).
P_PIN, P_PATCH_SET, P_BASE, P_PATCHED = ("dsv4patch:pin", "dsv4patch:patch_set_sha256",
                                         "dsv4patch:base_tree", "dsv4patch:patched_tree")
P_PATCH = "dsv4patch:patch"  # "<patch file name> sha256:<hex>", one per applied patch
P_KPKG = "dsv4patch:kernels:package_sha256"
# An Origin: trailer names the upstream pull request first ("vllm-project/vllm#51538 (...)"), or says "none (...)".
_ORIGIN = re.compile(r"^([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)#(\d+)\b")
_SERIAL_NS = uuid.UUID("6b1f3f43-5d0e-4a51-9c1e-1d5f3c2f4a10")  # dsv4patch's namespace for uuid5


@frozen
class KernelLibrary:
    """The rebuilt kernel library the wheel adds (from the kernel wheel's ``build_info.json``)."""

    package: str  # dsv4patch_kernels_<pin>
    version: str  # the kernel wheel's version (<vllm>+tree<12 hex>)
    library: str  # file name inside the package
    library_sha256: str
    package_sha256: str  # vllm_wheel.kernels_hash: every member of the package
    info: dict[str, Any]  # build_info.json


@frozen
class WheelSbom:
    """Everything the SBOM says, as the patched wheel's builder knows it."""

    pin: Pin
    version: str  # the patched wheel's (local) version
    stock: WheelFile
    stock_filename: str
    patches: Sequence[Patch]  # the applied patches, in series order
    patch_set_sha256: str
    base_tree: str
    patched_tree: str
    kernels: KernelLibrary | None = None


def sbom_path(dist_info: str) -> str:
    """The SBOM's path in a wheel whose metadata directory is ``dist_info``."""
    return f"{dist_info}/{SBOM_DIR}/{SBOM_NAME}"


def purl(version: str) -> str:
    """The patched wheel's package URL, ``pkg:pypi/vllm@<version>`` (``+`` encoded as the purl spec says)."""
    from packageurl import PackageURL

    return str(PackageURL("pypi", name="vllm", version=version).to_string())


def _resolves(p: Patch) -> list[Any]:
    from cyclonedx.model import XsUri
    from cyclonedx.model.issue import IssueClassification, IssueType, IssueTypeSource

    origins = p.trailers.get("Origin", [])
    origin = " ".join(origins)
    fix = " ".join(p.trailers.get("Fix", [])) or p.name
    out = []
    found = sorted({m.groups() for m in (_ORIGIN.match(o) for o in origins) if m})
    for repo, number in found:
        out.append(IssueType(
            type=IssueClassification.DEFECT, id=f"{repo}#{number}", name=p.subject.splitlines()[0][:200],
            description=f"Origin: {origin}",
            source=IssueTypeSource(name="GitHub", url=XsUri(f"https://github.com/{repo}")),
            references=[XsUri(f"https://github.com/{repo}/pull/{number}")]))
    if not out:  # a fix of dsv4patch's own (no upstream pull request): the defect it fixes
        out.append(IssueType(type=IssueClassification.DEFECT, id=f"dsv4patch:{fix}",
                             name=p.subject.splitlines()[0][:200],
                             description=f"Origin: {origin or 'none'}"))
    return out


def _patch(p: Patch) -> Any:
    import base64

    from cyclonedx.model import AttachedText, Encoding
    from cyclonedx.model.component import Diff, PatchClassification
    from cyclonedx.model.component import Patch as CdxPatch

    raw = read_patch_file(p.path, p.name)  # bounded, a regular file (docs/trust.md)
    if hashlib.sha256(raw).hexdigest() != p.sha256:
        raise BuildError(f"patch {p.name}: {p.path} changed while the wheel was being built "
                         "(its sha256 is not the one the series was read with); run the command again")
    try:
        text = AttachedText(content=raw.decode("utf-8"), content_type="text/x-diff")
    except UnicodeDecodeError:
        text = AttachedText(content=base64.b64encode(raw).decode(), content_type="text/x-diff",
                            encoding=Encoding.BASE_64)
    upstream = any(_ORIGIN.match(o) for o in p.trailers.get("Origin", []))
    return CdxPatch(type=PatchClassification.BACKPORT if upstream else PatchClassification.UNOFFICIAL,
                    diff=Diff(text=text), resolves=_resolves(p))


_REPO_URL = "https://github.com/vllm-project/vllm"


def _sha(hexdigest: str) -> list[HashType]:
    from cyclonedx.model import HashAlgorithm, HashType

    return [HashType(alg=HashAlgorithm.SHA_256, content=hexdigest)]


def _document(w: WheelSbom, serial: uuid.UUID) -> str:
    """The SBOM's JSON text: the vLLM component (its pedigree: ancestors, commit, patches) and the
    kernel library it depends on; ``serial`` is the only part not fixed by ``w``."""
    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.output.json import JsonV1Dot6

    vllm = _vllm_component(w)
    components = [] if w.kernels is None else [_kernel_component(w.kernels)]
    bom = Bom(serial_number=serial, metadata=BomMetaData(component=vllm), components=components)
    bom.metadata.timestamp = None  # type: ignore[assignment]  # optional in 1.6; omitted: reproducible
    if components:
        bom.register_dependency(vllm, components)
    return JsonV1Dot6(bom).output_as_string(indent=2) + "\n"


def _ancestors(w: WheelSbom) -> list[Component]:
    """The pedigree's ancestors: the stock wheel, and the pin's sdist when the pin comes from PyPI."""
    from cyclonedx.model import ExternalReference, ExternalReferenceType, XsUri
    from cyclonedx.model.component import Component
    from packageurl import PackageURL

    pin = w.pin
    ancestors = [Component(
        name="vllm", version=pin.vllm_version, bom_ref="stock-wheel", hashes=_sha(w.stock.sha256),
        purl=PackageURL("pypi", name="vllm", version=pin.vllm_version,
                        qualifiers={"file_name": w.stock_filename}),
        description="the stock vLLM wheel the patched wheel is repacked from",
        external_references=[ExternalReference(type=ExternalReferenceType.DISTRIBUTION, url=XsUri(w.stock.url))])]
    src = pin.source
    if src.kind == "pypi-sdist":
        sdist_name = src.url.rsplit("/", 1)[-1] or f"{src.name}-{src.version}.tar.gz"
        ancestors.append(Component(
            name=src.name or "vllm", version=src.version or pin.vllm_version, bom_ref="sdist",
            hashes=_sha(src.sha256),
            purl=PackageURL("pypi", name=src.name or "vllm", version=src.version or pin.vllm_version,
                            qualifiers={"file_name": sdist_name}),
            description=f"the pin's source distribution (upstream commit {pin.commit})",
            external_references=[
                ExternalReference(type=ExternalReferenceType.DISTRIBUTION, url=XsUri(src.url)),
                ExternalReference(type=ExternalReferenceType.VCS, url=XsUri(f"{_REPO_URL}/commit/{pin.commit}"),
                                  comment=f"upstream commit {pin.commit}")]))
    return ancestors


def _vllm_component(w: WheelSbom) -> Component:
    """The patched vLLM: its purl, the pin's properties, and its pedigree (ancestors, commit, patches)."""
    from cyclonedx.model import Property, XsUri
    from cyclonedx.model.component import Commit, Component, ComponentType, Pedigree
    from packageurl import PackageURL

    pin = w.pin
    props = [Property(name=P_PIN, value=pin.name), Property(name=P_PATCH_SET, value=w.patch_set_sha256),
             Property(name=P_BASE, value=w.base_tree), Property(name=P_PATCHED, value=w.patched_tree)]
    props += [Property(name=P_PATCH, value=f"{p.name} sha256:{p.sha256}") for p in w.patches]
    return Component(
        name="vllm", version=w.version, bom_ref="vllm", type=ComponentType.LIBRARY,
        purl=PackageURL("pypi", name="vllm", version=w.version),
        description=f"vLLM {pin.vllm_version} with dsv4patch's patch set {w.patch_set_sha256[:12]}",
        pedigree=Pedigree(ancestors=_ancestors(w),
                          commits=[Commit(uid=pin.commit, url=XsUri(f"{_REPO_URL}/commit/{pin.commit}"))],
                          patches=[_patch(p) for p in w.patches],
                          notes=f"dsv4patch pin {pin.name}: base tree {w.base_tree}, patched tree "
                                f"{w.patched_tree}"),
        properties=props)


def _kernel_component(k: KernelLibrary) -> Component:
    """The rebuilt kernel library: its sha256, and what it was built for (archs, torch, CUDA, ops)."""
    from cyclonedx.model import Property
    from cyclonedx.model.component import Component, ComponentType

    info = k.info
    archs: list[Any] = info["archs"] if isinstance(info.get("archs"), list) else []
    kprops = [Property(name=P_KPKG, value=k.package_sha256),
              Property(name="dsv4patch:kernels:library", value=k.library),
              Property(name="dsv4patch:kernels:archs", value=" ".join(str(a) for a in archs)),
              Property(name="dsv4patch:kernels:torch_version", value=str(info.get("torch_version"))),
              Property(name="dsv4patch:kernels:torch_cuda_version",
                       value=str(info.get("torch_cuda_version"))),
              Property(name="dsv4patch:kernels:nvcc_cuda_version", value=str(info.get("cuda_version"))),
              Property(name="dsv4patch:kernels:tree_id", value=str(info.get("tree_id")))]
    ops = info.get("ops")
    if isinstance(ops, list):
        kprops += [Property(name="dsv4patch:kernels:op", value=str(o)) for o in ops]
    return Component(
        name=k.package, version=k.version, bom_ref="kernels", type=ComponentType.LIBRARY,
        hashes=_sha(k.library_sha256),
        description=f"{k.library}: vLLM's kernels rebuilt from the patched tree "
                    f"(torch {info.get('torch_version')}, nvcc CUDA {info.get('cuda_version')})",
        properties=kprops)


def build(w: WheelSbom) -> bytes:
    """The SBOM's bytes: the same inputs give the same bytes (serial number from the content)."""
    draft = _document(w, uuid.UUID(int=0))
    serial = uuid.uuid5(_SERIAL_NS, hashlib.sha256(draft.encode()).hexdigest())
    return _document(w, serial).encode()


@dataclass
class SbomFacts:
    """What ``status --installed`` checks in an installed SBOM."""

    version: str | None = None
    purl: str | None = None
    pin: str | None = None
    patch_set_sha256: str | None = None
    patched_tree: str | None = None
    patches: dict[str, str] = field(default_factory=dict)  # name -> sha256 (properties)
    diff_sha256: list[str] = field(default_factory=list)  # sha256 of each pedigree patch's text
    diffs: list[bytes] = field(default_factory=list)  # each pedigree patch's text, in the series' order
    ancestors: dict[str, str] = field(default_factory=dict)  # pedigree ancestor bom-ref -> sha256
    kernel_library_sha256: str | None = None
    kernel_package_sha256: str | None = None
    problems: list[str] = field(default_factory=list)  # the document is not what build() writes

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "purl": self.purl, "pin": self.pin,
                "patch_set_sha256": self.patch_set_sha256, "patched_tree": self.patched_tree,
                "patches": dict(self.patches), "kernel_library_sha256": self.kernel_library_sha256,
                "kernel_package_sha256": self.kernel_package_sha256, "problems": list(self.problems)}


def _props(obj: dict[str, Any]) -> list[tuple[str, str]]:
    props = obj.get("properties", [])
    if not isinstance(props, list):
        return []
    return [(p["name"], p["value"]) for p in props
            if isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("value"), str)]


def read(doc: Any) -> SbomFacts:
    """The facts of a parsed SBOM (an untrusted document: anything unexpected is a problem, not an error)."""
    facts = SbomFacts()
    if not isinstance(doc, dict) or doc.get("bomFormat") != "CycloneDX":
        facts.problems.append("not a CycloneDX document")
        return facts
    if doc.get("specVersion") != SPEC_VERSION:
        facts.problems.append(f"specVersion {str(doc.get('specVersion'))[:20]!r}, not {SPEC_VERSION}")
    meta = doc.get("metadata")
    comp = meta.get("component") if isinstance(meta, dict) else None
    if not isinstance(comp, dict):
        facts.problems.append("no metadata.component (the vLLM component)")
        return facts
    facts.version = comp.get("version") if isinstance(comp.get("version"), str) else None
    facts.purl = comp.get("purl") if isinstance(comp.get("purl"), str) else None
    _read_properties(facts, comp)
    ped = comp.get("pedigree")
    patches = ped.get("patches", []) if isinstance(ped, dict) else []
    for p in patches if isinstance(patches, list) else []:
        _read_patch(facts, p)
    for a in (ped.get("ancestors", []) if isinstance(ped, dict) else []):
        _read_ancestor(facts, a)
    comps = doc.get("components", [])
    for c in comps if isinstance(comps, list) else []:
        if isinstance(c, dict) and c.get("bom-ref") == "kernels":
            _read_kernels(facts, c)
    return facts


def _read_properties(facts: SbomFacts, comp: dict[str, Any]) -> None:
    """The vLLM component's dsv4patch properties: pin, patch set, patched tree, each patch's sha256."""
    for name, value in _props(comp):
        if name == P_PIN:
            facts.pin = value
        elif name == P_PATCH_SET:
            facts.patch_set_sha256 = value
        elif name == P_PATCHED:
            facts.patched_tree = value
        elif name == P_PATCH:
            pname, _, digest = value.partition(" sha256:")
            facts.patches[pname] = digest


def _read_patch(facts: SbomFacts, p: Any) -> None:
    """One pedigree patch: its diff text (plain or base64) and that text's sha256; else a problem."""
    import base64
    import binascii

    diff = p.get("diff") if isinstance(p, dict) else None
    text = diff.get("text") if isinstance(diff, dict) else None
    content = text.get("content") if isinstance(text, dict) else None
    if not isinstance(text, dict) or not isinstance(content, str):
        facts.problems.append("a pedigree patch has no diff text")
        return
    try:
        raw = (base64.b64decode(content, validate=True) if text.get("encoding") == "base64"
               else content.encode("utf-8"))
    except (binascii.Error, ValueError, UnicodeEncodeError):
        facts.problems.append("a pedigree patch's diff text is not valid")
        return
    facts.diff_sha256.append(hashlib.sha256(raw).hexdigest())
    facts.diffs.append(raw)


def _read_ancestor(facts: SbomFacts, a: Any) -> None:
    """One pedigree ancestor's bom-ref and SHA-256 (both cut to 64 characters), when it has them."""
    if isinstance(a, dict) and isinstance(a.get("bom-ref"), str) and isinstance(a.get("hashes"), list):
        found = [h["content"] for h in a["hashes"] if isinstance(h, dict) and h.get("alg") == "SHA-256"
                 and isinstance(h.get("content"), str)]
        if found:
            facts.ancestors[a["bom-ref"][:64]] = str(found[0])[:64]


def _read_kernels(facts: SbomFacts, c: dict[str, Any]) -> None:
    """The kernel library component: the library's SHA-256 and the package's hash property."""
    hashes = c.get("hashes", [])
    facts.kernel_library_sha256 = next(
        (h["content"] for h in hashes if isinstance(h, dict) and h.get("alg") == "SHA-256"
         and isinstance(h.get("content"), str)), None) if isinstance(hashes, list) else None
    facts.kernel_package_sha256 = dict(_props(c)).get(P_KPKG)
