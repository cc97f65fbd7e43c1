"""A patched vLLM wheel made from the pin's stock wheel: what people install.

vLLM is deployed with ``pip``/``uv`` from an index, in images and on many
nodes; a patched source tree is not something they can install.  This module
turns the pin's stock PyPI wheel (sha256 from the lock) into
``vllm-<version>+dsv4.<patch-set hash>-<same tags>.whl``:

* every file under the wheel's top-level packages (``vllm/``) that the
  series changes is replaced by its patched content (the lock's patched tree,
  recomputed from the cache), after checking that the stock wheel's copy is
  byte-for-byte the pin's unpatched file: a wheel that does not match its
  source tree is refused, never patched;
* the rebuilt kernel library and its runtime (the plugin package
  ``dsv4patch_kernels_<pin>/`` of ``dsv4patch build``) are added, and
  ``vllm/__init__.py`` gets the activation hook line (the ``install-hook``
  route), so every process that imports vLLM loads the rebuilt kernels;
* ``METADATA`` carries the local version, ``RECORD`` is rewritten (hash and
  size of every member), ``<dist-info>/dsv4patch.json`` names the pin,
  the patch-set hash, the patched tree and each replaced file, and
  ``<dist-info>/sboms/dsv4patch.cdx.json`` says the same in CycloneDX 1.6
  (:mod:`dsv4patch.delivery.sbom`; PEP 770's place for SBOMs).

Why repack rather than vLLM's ``VLLM_USE_PRECOMPILED=1`` route: that route
runs ``setup.py`` on the source tree, which needs ``setuptools-scm``
(the pin tree has no git tags, so the version would be wrong unless forced),
``setuptools-rust`` and the Rust frontend, CMake and the build requirements
(``torch==<pin>``) in the environment, regenerates ``vllm/_version.py`` and
every metadata file, and zips the whole package again with the build
machine's timestamps.  The result would differ from the stock wheel in far
more than the patched files and would not be byte-reproducible.  Tried here
offline (``pip wheel --no-build-isolation --no-index`` of the patched 0.27.1
tree with the cached stock wheel, the CPU test venv's torch and the build
requirements installed, 82 s): the result is
``vllm-0.1.dev10+gefb9855dd.d20261201.cpu-cp311-cp311-linux_x86_64.whl``
(version from the tree's git and today's date, ``.cpu`` from the CPU torch,
not the stock ``cp38-abi3-manylinux_2_28`` tags), which pip rejects as
invalid.  Repacking copies every unchanged member's compressed bytes as they
are (:mod:`zipcopy`), so the diff against the stock wheel is exactly the
patched files, the kernel package and the metadata, and two builds are
identical.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import mmap
import os
import platform as platform_module
import re
import shutil
import stat
import zipfile
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from dsv4patch import report, safeio, zipcopy
from dsv4patch.delivery import sbom
from dsv4patch.errors import BuildError, Dsv4Error, IntegrityError, ParameterError, TreeError, param
from dsv4patch.hashing import code_identity, record_b64, record_hash, sha256
from dsv4patch.kernels import (
    KERNEL_MEMBER_LIMIT,
    NotThatTree,
    build_tree,
    hook_line,
    keep_kernel_wheel,
    kept_kernel_wheel,
    kernel_dist_name,
    kernel_wheel_key,
    stock_wheel_for,
    stock_wheel_path,
)
from dsv4patch.nextstep import Step, mention
from dsv4patch.records import frozen
from dsv4patch.safeio import loads_json, read_stream
from dsv4patch.series import patched_tree

if TYPE_CHECKING:
    from dsv4patch.pins import Context, Pin, WheelFile
    from dsv4patch.series import ChangedFile, PatchedTree, Series

PROVENANCE = "dsv4patch.json"
LOCAL_PREFIX = "dsv4"


def member_digests(members: dict[str, bytes]) -> dict[str, bytes]:
    """Each member's sha256 digest: hashed once per run (the 21 MB library is most of a warm
    ``wheel``'s kernel step), then used for the package hash, RECORD rows and the SBOM."""
    return {name: hashlib.sha256(data).digest() for name, data in members.items()}


def kernels_hash(members: dict[str, bytes], digests: dict[str, bytes] | None = None) -> str:
    """sha256 over the kernel package's members (names and contents): library, build info, runtime.
    ``digests``: :func:`member_digests` of ``members``, where the caller has them."""
    digests = member_digests(members) if digests is None else digests
    h = hashlib.sha256()
    for name in sorted(members):
        h.update(name.encode() + b"\0" + digests[name])
    return h.hexdigest()


def local_version(pin: Pin, series: Series, kernels_sha256: str | None = None) -> str:
    """``<vllm>+dsv4.<patch set 12 hex>[.k<kernel package 12 hex>]`` (``kernels_sha256``:
    :func:`kernels_hash` of the kernel package).

    The stock wheel is fixed by the pin (lock sha256); what dsv4patch adds is the
    patch set and, when the patches change kernels, the kernel package: both are
    in the label, so two wheels with different contents never share a file name.
    """
    label = f"{pin.vllm_version}+{LOCAL_PREFIX}.{series.hash()[:12]}"
    return label + (f".k{kernels_sha256[:12]}" if kernels_sha256 else "")


@dataclass
class KernelPackage:
    dist: str
    members: dict[str, bytes]  # path in the wheel -> content
    info: dict[str, Any]
    source: Path
    # path -> the member as the kernel wheel stores it (compressed; its content is ``members``'s,
    # CRC-checked): copied into the vLLM wheel as is instead of compressed a second time
    raws: dict[str, zipcopy.Raw] = field(default_factory=dict)
    digests: dict[str, bytes] = field(default_factory=dict)  # member_digests(members), made once

    def __post_init__(self) -> None:
        if self.digests.keys() != self.members.keys():
            self.digests = member_digests(self.members)

    @property
    def package_sha256(self) -> str:
        """:func:`kernels_hash` of the package (from the digests, no member hashed again)."""
        return kernels_hash(self.members, self.digests)

    def record_row(self, path: str) -> tuple[str, str, str]:
        """The RECORD row of member ``path`` (``zipcopy.record_row``'s, from its digest)."""
        data = self.members[path]
        return path, record_hash(data, self.digests[path]), str(len(data))


_MACHINE = re.compile(r"linux_(x86_64|aarch64)\.whl$")


def read_kernels(path: Path, pin: Pin, tree_id: str, platform: str) -> KernelPackage:
    """The plugin package of a ``dsv4patch build`` wheel, checked against pin, tree and platform."""
    dist = kernel_dist_name(pin.name)
    if not path.name.startswith(dist + "-"):
        raise BuildError(f"{param('kernels')} {path}: not a kernel wheel of pin {pin.name} (expected {dist}-*.whl "
                         f"from `{mention(Step.of('build', pin=pin.name))}`)")
    m = _MACHINE.search(path.name)
    if not m or m.group(1) != platform:
        raise BuildError(f"{param('kernels')} {path}: built for {m.group(1) if m else 'an unknown platform'}, "
                         f"the wheel is for {platform}; build the kernels on a {platform} machine")
    members, raws = _kernel_members(path, dist)
    info = _kernel_build_info(path, dist, pin, tree_id, members)
    return KernelPackage(dist, members, info, path, raws)


def _kernel_members(path: Path, dist: str) -> tuple[dict[str, bytes], dict[str, zipcopy.Raw]]:
    """The plugin package's files (content, and the member as stored), each a bounded regular file.

    The ``--kernels`` wheel is not pinned by any hash: every member is refused unless it
    is a plain path, a regular file and at most ``KERNEL_MEMBER_LIMIT`` bytes.
    """
    members: dict[str, bytes] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for zi in zf.infolist():
                if zi.filename.startswith(dist + "/") and not zi.filename.endswith("/"):
                    members[zi.filename] = _kernel_file(path, zf, zi)
            with open(path, "rb") as wfh:
                raws = {zi.filename: zipcopy.read_raw(wfh, zi) for zi in zf.infolist() if zi.filename in members}
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        raise BuildError(f"{param('kernels')} {path}: not a readable wheel ({exc})") from None
    return members, raws


def _kernel_file(path: Path, zf: zipfile.ZipFile, zi: zipfile.ZipInfo) -> bytes:
    """One member of the plugin package, read within its declared size (CRC-checked)."""
    name = zi.filename
    problem = member_problem(name)
    if problem:
        raise BuildError(f"{param('kernels')} {path}: member {name!r} {problem}")
    if stat.S_IFMT(zi.external_attr >> 16) not in (0, stat.S_IFREG):
        raise BuildError(f"{param('kernels')} {path}: member {name!r} is not a regular file "
                         "(a symbolic link?); refused")
    if zi.file_size > KERNEL_MEMBER_LIMIT:
        raise BuildError(f"{param('kernels')} {path}: member {name!r} declares {zi.file_size} bytes, "
                         f"more than {KERNEL_MEMBER_LIMIT}; refused")
    with zf.open(zi) as fh:  # zipfile stops at the declared size, then checks the CRC
        return read_stream(fh, zi.file_size, label=f"{param('kernels')} {path}: {name}", error=BuildError)


def _kernel_build_info(path: Path, dist: str, pin: Pin, tree_id: str, members: dict[str, bytes]) -> dict[str, Any]:
    """``build_info.json`` of the plugin package: what ``dsv4patch build`` wrote, for this pin's tree."""
    raw = members.get(f"{dist}/build_info.json")
    if raw is None:
        raise BuildError(f"{param('kernels')} {path}: no {dist}/build_info.json")
    info = loads_json(raw, label=f"{param('kernels')} {path}: {dist}/build_info.json", error=BuildError)
    bad = ("it is not a JSON object" if not isinstance(info, dict) else next(
        (f'"{k}" is not a string' for k in ("tree_id", "vllm_version", "library")
         if not isinstance(info.get(k), str)), None))
    if bad:
        raise BuildError(f"{param('kernels')} {path}: {dist}/build_info.json is not what `dsv4patch build` writes "
                         f"({bad}); rebuild it with `{mention(Step.of('build', pin=pin.name))}`")
    if info.get("tree_id") != tree_id or info.get("vllm_version") != pin.vllm_version:
        raise BuildError(
            f"{param('kernels')} {path}: built from tree {info.get('tree_id')} for vLLM "
            f"{info.get('vllm_version')}, pin {pin.name} is tree {tree_id}, vLLM {pin.vllm_version}; "
            f"rebuild it with `{mention(Step.of('build', pin=pin.name))}` on a tree made by "
            f"`{mention(Step.of('apply'))}`"
        )
    if f"{dist}/{info.get('library')}" not in members:
        raise BuildError(f"{param('kernels')} {path}: the library {info.get('library')} is missing")
    return cast("dict[str, Any]", info)  # a JSON object, checked above


@dataclass
class WheelBuild:
    path: Path
    version: str
    replaced: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    not_shipped: list[str] = field(default_factory=list)
    hooked: str | None = None  # the file that got the kernels' activation line
    provenance: dict[str, Any] = field(default_factory=dict)
    sbom: str | None = None  # the CycloneDX SBOM's member (<dist-info>/sboms/...)
    sbom_size: int = 0


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def member_problem(name: str) -> str | None:
    """Why a wheel member ``name`` is not a plain path inside the wheel, or None.

    The stock wheel is pinned by sha256, the ``--kernels`` wheel is not; either
    way, what goes into the patched wheel must install under site-packages.
    """
    if not name or _CONTROL.search(name):
        return "is empty or has control characters"
    if name.startswith("/") or "\\" in name or re.match(r"^[A-Za-z]:", name):
        return "is an absolute or Windows path"
    parts = name.rstrip("/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "has an empty, '.' or '..' path component"
    if any(p.lower() == ".git" for p in parts):
        return "is under a .git directory"
    return None


_LEGACY_TMP = re.compile(r"^\.(.+\.whl)\.tmp(\d+)$")


def sweep_out(out_dir: Path) -> list[Path]:
    """Remove the partial wheels killed runs left in ``out_dir``; the removed paths.

    Owned partial files (:func:`dsv4patch.safeio.sweep_owned`), and the
    ``.<wheel>.tmp<pid>`` files of older dsv4patch versions whose process is gone.
    """
    removed = safeio.sweep_owned(out_dir)
    try:
        names = os.listdir(out_dir)
    except OSError:
        return removed
    for name in names:
        m = _LEGACY_TMP.match(name)
        if m is None or not safeio.is_regular(out_dir / name):
            continue
        try:
            os.kill(int(m.group(2)), 0)
            continue  # its process may still be writing it
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError, ValueError):
            continue
        safeio.remove_file(out_dir / name)
        removed.append(out_dir / name)
    return removed


VERIFY_WINDOW = 64 << 20  # compressed bytes of stock members whose RECORD check may be pending at once


class _Checks:
    """The stock members' RECORD checks, run on every core while the copy goes on.

    Inflating and hashing a member (zlib and hashlib release the GIL) is most of a
    warm ``wheel``'s time; the copy itself only moves compressed bytes.  Checks are
    awaited in member order, so the first member that fails is the one reported, as
    if they ran one after the other; at most ``VERIFY_WINDOW`` compressed bytes wait
    at once (bounded memory).
    """

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool = pool
        self.pending: deque[tuple[Future[None], int]] = deque()
        self.size = 0

    def submit(self, check: Callable[[], None], size: int) -> None:
        self.pending.append((self.pool.submit(check), size))
        self.size += size
        while self.size > VERIFY_WINDOW:
            self._next()

    def _next(self) -> None:
        fut, size = self.pending.popleft()
        self.size -= size
        fut.result()  # a failed check raises its IntegrityError here

    def drain(self) -> None:
        """Wait for every pending check; the first failure (in member order) raises."""
        while self.pending:
            self._next()


def _workers() -> int:
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def build(tree: PatchedTree, stock_path: Path, stock: WheelFile, kernels: KernelPackage | None,
          out_dir: Path, *, verdicts: Path | None = None, loaded: StockBytes | None = None) -> WheelBuild:
    """Write the patched wheel into ``out_dir`` (atomically) and return what it contains.

    The stock wheel is read once into memory (at most its locked size) and every byte
    written comes from that one read.  Every unchanged stock member is checked against the
    stock RECORD on a pool of threads (:class:`_Checks`), unless ``verdicts`` (a directory of
    the cache) holds this tool's verdict for the lock's sha256 and the bytes read hash to it
    (:func:`_known_good`); the wheel is published only when all checks passed.  With
    ``verdicts``, the bytes read must be the lock's (else IntegrityError), and a full check
    that passes is recorded there for the next run.  ``loaded``: :func:`load_stock` of
    ``stock_path`` made already (while the kernels were built).
    """
    pool = ThreadPoolExecutor(max_workers=_workers(), thread_name_prefix="dsv4patch-record")
    checks = _Checks(pool)
    try:
        loaded = loaded or load_stock(stock_path, stock, tree.pin, pool)
        return _build(tree, stock_path, stock, kernels, out_dir, checks, verdicts, loaded)
    except (IntegrityError, BuildError):
        checks.drain()  # a member before this one that failed its check is the one to report
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


VERDICT_SCHEMA = "wheel-record-v1"
VERDICTS = "wheel-records"  # the cache's directory of RECORD verdicts (make_wheel's)
_VERDICT_DECIDING = ("delivery/vllm_wheel.py", "zipcopy.py", "hashing.py")  # relative to dsv4patch/


@frozen
class RecordVerdict:
    """``<cache>/wheel-records/<stock sha256>.json``: every member of the stock wheel whose
    bytes hash to ``stock_sha256`` matched its RECORD, as checked by ``tool`` (this
    module's version and source): a pure function of those bytes, so a later run that
    hashed the very bytes it copies to ``stock_sha256`` need not inflate them again."""

    schema: str
    stock_sha256: str
    tool: str
    members: int

    @classmethod
    def from_json(cls, data: object) -> RecordVerdict | None:
        """The verdict, or None for anything of another shape (it is then recomputed)."""
        if not isinstance(data, dict) or set(data) != {f.name for f in fields(cls)}:
            return None
        if not all(isinstance(data[k], str) for k in ("schema", "stock_sha256", "tool")):
            return None
        if not isinstance(data["members"], int) or isinstance(data["members"], bool):
            return None
        return cls(data["schema"], data["stock_sha256"], data["tool"], data["members"])


def verdict_tool() -> str:
    """dsv4patch's version and the sha256 of the modules that decide a RECORD verdict."""
    return code_identity(_VERDICT_DECIDING)


def _known_good(verdicts: Path | None, stock_sha256: str, members: int) -> bool:
    """Is there a verdict (this tool's, same member count) that the wheel ``stock_sha256`` is true
    to its RECORD?  A missing, damaged, linked or foreign entry is no verdict."""
    if verdicts is None:
        return False
    try:
        data = safeio.read_json(verdicts / f"{stock_sha256}.json")
    except (OSError, Dsv4Error):
        return False
    verdict = RecordVerdict.from_json(data)
    return verdict == RecordVerdict(VERDICT_SCHEMA, stock_sha256, verdict_tool(), members)


def _save_verdict(verdicts: Path, stock_sha256: str, members: int) -> None:
    """Record a full check that passed (atomically; a full or read-only cache only loses it)."""
    verdict = RecordVerdict(VERDICT_SCHEMA, stock_sha256, verdict_tool(), members)
    try:
        verdicts.mkdir(parents=True, exist_ok=True)
        safeio.atomic_write(verdicts / f"{stock_sha256}.json",
                            json.dumps(asdict(verdict), sort_keys=True) + "\n", durable=False)
    except OSError:
        pass


def _read_stock_bytes(stock_path: Path, stock: WheelFile) -> bytes | mmap.mmap:
    """The stock wheel's bytes, read once (no link followed, at most the locked size or 4 GiB):
    what is hashed, parsed, checked and copied is this one buffer, which nothing writes to after
    the read (:func:`dsv4patch.safeio.read_whole`: a mapping of its own for a file this large)."""
    limit = stock.size if stock.size is not None else zipcopy.ARCHIVE_LIMIT
    return safeio.read_whole(stock_path, limit, error=IntegrityError, what=f"stock wheel {stock_path}")


@dataclass
class _Stock:
    """The stock wheel as its name and member list show it, checked before a byte is written."""

    filename: str  # e.g. vllm-0.27.1-cp38-abi3-manylinux_2_28_x86_64.whl
    dist: str
    tags: str
    old_info: str  # <dist>-<stock version>.dist-info
    infos: list[zipfile.ZipInfo]
    names: list[str]
    top: set[str]  # top-level packages (not the dist-info)

    @property
    def what(self) -> str:
        return f"stock wheel {self.filename}"


def _open_stock(blob: bytes | mmap.mmap, stock: WheelFile, pin: Pin) -> _Stock:
    """The stock wheel's name, tags and members; refused unless it is a plain wheel of the pin's vLLM.

    Every member name is checked first: a name that would install outside site-packages is
    refused before anything is copied, whatever the lock's sha256 says.
    """
    stock_name = PurePosixPath(stock.url).name
    m = re.fullmatch(r"([A-Za-z0-9_.]+)-([^-]+)-(.+)\.whl", stock_name)
    if not m or m.group(2) != pin.vllm_version:
        raise BuildError(f"stock wheel {stock_name}: not a wheel of vLLM {pin.vllm_version}")
    name, old_version, tags = m.groups()
    old_info = f"{name}-{old_version}.dist-info"
    # a mapping is read in place (seek, tell and read are all zipfile asks of a file); BytesIO shares bytes
    infos = zipcopy.open_members(io.BytesIO(blob) if isinstance(blob, bytes) else cast(BinaryIO, blob), stock_name)
    names = [i.filename for i in infos]
    for n in names:
        problem = member_problem(n)
        if problem:
            raise IntegrityError(f"stock wheel {stock_name}: member {n!r} {problem}; refusing to repack "
                                 "it (an installer would write it outside site-packages)")
    if f"{old_info}/RECORD" not in names:
        raise BuildError(f"stock wheel {stock_name} has no {old_info}/RECORD")
    top = {n.split("/", 1)[0] for n in names if "/" in n and not n.startswith(old_info + "/")}
    return _Stock(stock_name, name, tags, old_info, infos, names, top)


@frozen
class StockBytes:
    """The stock wheel read once: its bytes, their sha256, its name and members (checked)."""

    blob: bytes | mmap.mmap
    sha256: str
    wheel: _Stock


def load_stock(stock_path: Path, stock: WheelFile, pin: Pin, pool: ThreadPoolExecutor) -> StockBytes:
    """Read the stock wheel once and check its name and members (:func:`_open_stock`), hashing the
    bytes on ``pool`` beside the parse (hashlib releases the GIL)."""
    blob = _read_stock_bytes(stock_path, stock)
    whole = pool.submit(hashlib.sha256, blob)
    wheel = _open_stock(blob, stock, pin)
    return StockBytes(blob, whole.result().hexdigest(), wheel)


def _shipped(tree: PatchedTree, wheel: _Stock, kernels: KernelPackage | None,
             result: WheelBuild) -> dict[str, ChangedFile]:
    """The changed files the wheel ships (those under its top-level packages); the rest are noted
    in ``result.not_shipped``.  The kernel package must not overwrite anything of the stock wheel."""
    changes = tree.by_path()
    shipped = {p: f for p, f in changes.items() if p.split("/", 1)[0] in wheel.top}
    result.not_shipped = sorted(set(changes) - set(shipped))
    clash = [n for n in (kernels.members if kernels else {}) if n in wheel.names or n.split("/", 1)[0] in wheel.top]
    if clash:
        raise BuildError(f"the kernel package would overwrite {clash[0]} of the stock wheel")
    return shipped


def _file_row(path: str, change: ChangedFile) -> dict[str, Any]:
    """A changed file as the provenance lists it (sha256 of its unpatched and patched content)."""
    return {"path": path, "patches": list(change.patches),
            "base_sha256": sha256(change.base) if change.base is not None else None,
            "patched_sha256": sha256(change.patched) if change.patched is not None else None}


@dataclass
class _Repack:
    """What the repack's steps share: the inputs, the writer, and what has been written so far."""

    tree: PatchedTree
    wheel: _Stock
    stock: WheelFile
    kernels: KernelPackage | None
    shipped: dict[str, ChangedFile]
    result: WheelBuild
    checks: _Checks
    writer: zipcopy.Writer
    stock_record: dict[str, tuple[str, str]]  # the stock RECORD: member -> (hash, size)
    record: list[tuple[str, str, str]] = field(default_factory=list)  # the new RECORD's rows
    files: list[dict[str, Any]] = field(default_factory=list)  # the provenance's changed files
    seen: set[str] = field(default_factory=set)
    dist_info: list[zipcopy.Raw] = field(default_factory=list)  # the stock dist-info, written last
    known_good: bool = False  # a verdict covers these very bytes: no member is inflated again

    @property
    def new_info(self) -> str:
        return f"{self.wheel.dist}-{self.result.version}.dist-info"

    def hook_target(self) -> str:
        """The file that gets the kernels' activation line: the top package's ``__init__.py``."""
        return f"{top_package(self.wheel.top)}/__init__.py"

    def add(self, name: str, data: bytes, mode: int = 0o644,
            date_time: tuple[int, int, int, int, int, int] = zipcopy.FIXED_DATE) -> None:
        """A new or changed member: deflated, with its RECORD row."""
        self.writer.add(zipcopy.deflate(name, data, mode, date_time))
        self.record.append(zipcopy.record_row(name, data))

    def copy(self, raw: zipcopy.Raw, name: str) -> None:
        """An unchanged stock member, copied compressed as ``name`` with the stock RECORD's row."""
        self.writer.add(zipcopy.Raw(name, raw.data, raw.method, raw.crc, raw.size, raw.date_time,
                                    raw.external_attr))
        h, size = _row(self.stock_record, raw, self.wheel.what, self.checks)
        self.record.append((name, h, size))


def _build(tree: PatchedTree, stock_path: Path, stock: WheelFile, kernels: KernelPackage | None,
           out_dir: Path, checks: _Checks, verdicts: Path | None, loaded: StockBytes) -> WheelBuild:
    """The repack as named steps: the stock wheel (read and checked), plan, copy the members, add, seal."""
    blob, wheel = loaded.blob, loaded.wheel
    version = local_version(tree.pin, tree.series, kernels.package_sha256 if kernels else None)
    result = WheelBuild(out_dir / f"{wheel.dist}-{version}-{wheel.tags}.whl", version)
    shipped = _shipped(tree, wheel, kernels, result)
    is_locked = loaded.sha256 == stock.sha256
    known_good = is_locked and _known_good(verdicts, stock.sha256, len(wheel.infos))
    out_dir.mkdir(parents=True, exist_ok=True)
    sweep_out(out_dir)  # partial wheels of runs that were killed
    src = memoryview(blob)  # every member a view of the one buffer that was hashed
    # An owned partial file (never through a planted link; removed on an interrupt, swept if killed);
    # the run's result: once in place, an interrupt no longer ends the run, which reports it.
    with safeio.replacing(result.path, final=True) as dst:
        # The stock RECORD: hashes of every unchanged member (checked while copying:
        # the CRC is the zip's, so a member whose bytes differ from RECORD is refused).
        rec_info = wheel.infos[wheel.names.index(f"{wheel.old_info}/RECORD")]
        stock_record = read_record(zipcopy.raw_in(src, rec_info), wheel.what)
        rp = _Repack(tree, wheel, stock, kernels, shipped, result, checks, zipcopy.Writer(dst), stock_record,
                     known_good=known_good)
        for info in wheel.infos:
            _copy_stock_member(rp, info, zipcopy.raw_in(src, info), rec_info.filename)
        _add_new_files(rp)
        _add_kernel_package(rp)
        _seal(rp)
        checks.drain()  # every stock member matched RECORD, or the partial wheel goes
        if verdicts is not None and not is_locked:
            raise IntegrityError(f"{wheel.what} ({stock_path}) is not the file the lock pins (sha256 "
                                 f"{loaded.sha256[:16]}, the lock says {stock.sha256[:16]}); it "
                                 "changed after it was verified; run the command again to fetch it anew")
        rp.writer.close()
    if verdicts is not None and not known_good:
        _save_verdict(verdicts, stock.sha256, len(wheel.infos))
    missing = set(shipped) - set(result.replaced) - set(result.added) - set(result.removed)
    if missing:  # a deletion of a file the stock wheel lacks: nothing to do, but say so
        result.not_shipped += sorted(missing)
    return result


def _copy_stock_member(rp: _Repack, info: zipfile.ZipInfo, raw: zipcopy.Raw, record_name: str) -> None:
    """One stock member: copied as is (its RECORD check queued), patched, dropped or hooked.

    The dist-info is kept aside: it is renamed and rewritten once the new version is known.
    """
    rp.seen.add(info.filename)
    if info.filename != record_name and info.filename not in rp.shipped and not rp.known_good:
        rp.checks.submit(_check(raw, rp.stock_record, rp.wheel.what), len(raw.data))
    if info.filename.startswith(rp.wheel.old_info + "/"):
        rp.dist_info.append(raw)
        return
    change = rp.shipped.get(info.filename)
    new_data: bytes | None = None
    if change is not None:
        new_data = _patched_member(rp, raw, change)
        if new_data is None:
            return  # the series deletes it
    if rp.kernels and info.filename == rp.hook_target():
        base = new_data if new_data is not None else zipcopy.inflate(raw)
        new_data = (base if base.endswith(b"\n") else base + b"\n") + hook_line(rp.kernels.dist).encode()
        rp.result.hooked = info.filename
    if new_data is None:
        rp.writer.add(raw)
        if not info.filename.endswith("/"):  # verify_member checked it is in RECORD
            h, size = _row(rp.stock_record, raw, rp.wheel.what, rp.checks)
            rp.record.append((info.filename, h, size))
    else:
        rp.add(info.filename, new_data, (info.external_attr >> 16) & 0o777 or 0o644, info.date_time)


def _patched_member(rp: _Repack, raw: zipcopy.Raw, change: ChangedFile) -> bytes | None:
    """The patched content of a stock member the series changes, None when the series deletes it.

    The stock copy must be byte-for-byte the pin's unpatched file: a wheel that does not
    match its source tree is refused, never patched.
    """
    have = zipcopy.inflate(raw)
    if change.base is None or have != change.base:
        raise IntegrityError(
            f"{rp.wheel.what}: {raw.name} is not pin {rp.tree.pin.name}'s "
            f"unpatched file (sha256 {sha256(have)[:16]}, the pin's source tree has "
            f"{sha256(change.base)[:16] if change.base else 'no such file'}); refusing "
            "to patch a wheel that does not match its source tree"
        )
    verify_member(raw, rp.stock_record, rp.wheel.what)
    rp.files.append(_file_row(raw.name, change))
    (rp.result.removed if change.patched is None else rp.result.replaced).append(raw.name)
    return change.patched


def _add_new_files(rp: _Repack) -> None:
    """The files the series adds under the wheel's packages; one the source tree has (the patches
    change it) but the stock wheel lacks means the wheel is not the tree's: refused."""
    added = {p: f for p, f in rp.shipped.items() if p not in rp.seen}
    for path, change in sorted(added.items()):
        if change.base is not None:
            raise IntegrityError(
                f"{rp.wheel.what} lacks {path}, which pin {rp.tree.pin.name}'s source "
                "tree has and the patches change; refusing to patch it")
        if change.patched is None:
            continue
        rp.add(path, change.patched)
        rp.result.added.append(path)
        rp.files.append(_file_row(path, change))


def _add_kernel_package(rp: _Repack) -> None:
    """The rebuilt kernel package's members (the library executable), stored as the kernel wheel has them."""
    kernels = rp.kernels
    if kernels is None:
        return
    for path, data in sorted(kernels.members.items()):
        mode = 0o755 if path.endswith(".so") else 0o644
        rp.writer.add(_kernel_member(path, data, mode, kernels.raws.get(path)))
        rp.record.append(kernels.record_row(path))
        rp.result.added.append(path)


def _provenance(rp: _Repack) -> dict[str, Any]:
    """``<dist-info>/dsv4patch.json``: the pin, the patch set, the trees, each changed file, the kernels."""
    pin, series, tree, kernels = rp.tree.pin, rp.tree.series, rp.tree, rp.kernels
    return {
        "pin": pin.name, "vllm_version": pin.vllm_version, "version": rp.result.version,
        "vllm_commit": pin.commit, "series": list(pin.series),
        "patch_set_sha256": series.hash(),
        "patches": {p.name: {"sha256": p.sha256, "series": p.series,
                             "files": tree.patch_files.get(p.name, [])}
                    for p in series.patches},
        "base_tree": tree.base_tree, "patched_tree": tree.patched_tree,
        "stock_wheel": {"filename": rp.wheel.filename, "sha256": rp.stock.sha256},
        "files": sorted(rp.files, key=lambda f: f["path"]),
        "not_shipped": rp.result.not_shipped,
        "kernels": None if kernels is None else {
            "package": kernels.dist, "library": kernels.info.get("library"),
            "tree_id": kernels.info.get("tree_id"), "ops": kernels.info.get("ops"),
            "units": kernels.info.get("units"), "hook": rp.hook_target()},
    }


def _seal(rp: _Repack) -> None:
    """The new dist-info: the stock one renamed (METADATA with the local version), the provenance,
    the SBOM, then RECORD, which lists every member before it."""
    rp.result.provenance = _provenance(rp)
    prov = (json.dumps(rp.result.provenance, indent=2, sort_keys=True) + "\n").encode()
    old_info, new_info = rp.wheel.old_info, rp.new_info
    record_raw: zipcopy.Raw | None = None
    for raw in rp.dist_info:
        new = raw.name.replace(old_info + "/", new_info + "/", 1)
        rel = raw.name[len(old_info) + 1:]
        if rel == "RECORD":
            record_raw = raw
        elif rel == "METADATA":
            rp.add(new, _set_version(zipcopy.inflate(raw), rp.result.version, rp.wheel.filename), 0o644,
                   raw.date_time)
        else:
            rp.copy(raw, new)
    rp.add(f"{new_info}/{PROVENANCE}", prov)
    doc = sbom.build(wheel_sbom(rp.tree, rp.stock, rp.wheel.filename, rp.result.version, rp.kernels))
    rp.add(sbom.sbom_path(new_info), doc)
    rp.result.sbom = sbom.sbom_path(new_info)
    rp.result.sbom_size = len(doc)
    assert record_raw is not None
    rp.writer.add(zipcopy.deflate(f"{new_info}/RECORD", zipcopy.record(rp.record, f"{new_info}/RECORD"),
                                  0o644, record_raw.date_time))


def kernel_library(kernels: KernelPackage) -> sbom.KernelLibrary:
    """The kernel package as the SBOM describes it (its library's sha256, the package's hash)."""
    lib = str(kernels.info.get("library"))
    parts = kernels.source.name.split("-")
    return sbom.KernelLibrary(
        package=kernels.dist, version=parts[1] if len(parts) > 2 else "unknown", library=lib,
        library_sha256=kernels.digests[f"{kernels.dist}/{lib}"].hex(),
        package_sha256=kernels.package_sha256, info=dict(kernels.info))


def wheel_sbom(tree: PatchedTree, stock: WheelFile, stock_name: str, version: str,
               kernels: KernelPackage | None) -> sbom.WheelSbom:
    """What the patched wheel's SBOM says: the applied patches, the ancestors, the kernel library."""
    return sbom.WheelSbom(
        pin=tree.pin, version=version, stock=stock, stock_filename=stock_name,
        patches=[p for p in tree.series.patches if p.name in tree.patch_files],
        patch_set_sha256=tree.series.hash(), base_tree=tree.base_tree, patched_tree=tree.patched_tree,
        kernels=kernel_library(kernels) if kernels is not None else None)


def top_package(top: set[str]) -> str:
    return "vllm" if "vllm" in top else sorted(top)[0]


def _set_version(metadata: bytes, version: str, stock_name: str = "") -> bytes:
    try:
        text = metadata.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IntegrityError(f"stock wheel {stock_name}: METADATA is not UTF-8 (byte {exc.start}); "
                             "refusing to repack it") from None
    new, n = re.subn(r"^Version: .*$", f"Version: {version}", text, count=1, flags=re.M)
    if n != 1:
        raise BuildError("the stock wheel's METADATA has no Version field")
    return new.encode("utf-8")


_RECORD_HASHES = ("sha256", "sha384", "sha512", "sha3_256", "sha3_384", "sha3_512", "blake2b", "blake2s")


def read_record(raw: zipcopy.Raw, what: str) -> dict[str, tuple[str, str]]:
    """A wheel's RECORD: member -> (hash, size), every row checked (three columns, UTF-8)."""
    data = zipcopy.inflate(raw)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IntegrityError(f"{what}: {raw.name} is not UTF-8 (byte {exc.start}); refusing the wheel") from None
    record: dict[str, tuple[str, str]] = {}
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise IntegrityError(f"{what}: {raw.name} is not a CSV file ({exc}); refusing the wheel") from None
    for i, row in enumerate(rows, 1):
        if not row:
            continue
        if len(row) != 3:
            raise IntegrityError(f"{what}: {raw.name} row {i} has {len(row)} columns, not 3 (path, hash, "
                                 "size); refusing the wheel")
        record[row[0]] = (row[1], row[2])
    return record


def _row(record: dict[str, tuple[str, str]], raw: zipcopy.Raw, what: str, checks: _Checks) -> tuple[str, str]:
    """RECORD's (hash, size) of an unchanged member; one RECORD does not list fails its check, which
    may still be pending: the checks before it are awaited first, then its own refusal raised."""
    row = record.get(raw.name)
    if row is None:
        checks.drain()
        verify_member(raw, record, what)  # raises: not in RECORD
        raise IntegrityError(f"{what}: {raw.name} is not in RECORD")
    return row


def _check(raw: zipcopy.Raw, record: dict[str, tuple[str, str]], what: str) -> Callable[[], None]:
    return lambda: verify_member(raw, record, what)


def _kernel_member(path: str, data: bytes, mode: int, stored: zipcopy.Raw | None) -> zipcopy.Raw:
    """The kernel package's member ``path``: the kernel wheel's compressed bytes when they hold
    ``data`` (same size and CRC, deflated), else ``data`` deflated; the same bytes either way for
    a wheel of ``dsv4patch build``, which deflates with the same settings."""
    if (stored is not None and stored.method == zipfile.ZIP_DEFLATED and stored.size == len(data)
            and stored.crc == zlib.crc32(data) & 0xFFFFFFFF):
        return zipcopy.Raw(path, stored.data, stored.method, stored.crc, stored.size, zipcopy.FIXED_DATE,
                           (0o100000 | mode) << 16)
    return zipcopy.deflate(path, data, mode)


def verify_member(raw: zipcopy.Raw, record: dict[str, tuple[str, str]], what: str) -> None:
    """Refuse a member that RECORD does not list, or whose content is not RECORD's hash and size.

    The lock's sha256 covers the wheel file, not the truth of its RECORD: a
    member whose bytes differ from what RECORD says would carry the lie into
    the patched wheel.  Inflated piece by piece (bounded memory).
    """
    if raw.name.endswith("/"):
        return  # a directory entry: RECORD lists files only
    row = record.get(raw.name)
    if row is None:
        raise IntegrityError(f"{what}: {raw.name} is not in RECORD; refusing to repack a wheel whose RECORD "
                             "does not list every member")
    algo, _, want = row[0].partition("=")
    if algo not in _RECORD_HASHES or not want:
        raise IntegrityError(f"{what}: RECORD gives {raw.name} the hash {row[0][:40]!r}, not sha256=... "
                             "(or a stronger hashlib algorithm); refusing the wheel")
    got, size = zipcopy.digest(raw, algo)
    if record_b64(got) != want.rstrip("="):
        raise IntegrityError(f"{what}: {raw.name}'s {algo} is not the one its RECORD lists; refusing to "
                             "repack a wheel whose RECORD lies about its members")
    if row[1] and row[1] != str(size):
        raise IntegrityError(f"{what}: {raw.name} is {size} bytes, its RECORD says {row[1][:20]!r}; "
                             "refusing the wheel")


def check_record(path: Path) -> list[str]:
    """Problems with a wheel's RECORD (empty list: every member listed with its hash and size)."""
    problems: list[str] = []
    with zipfile.ZipFile(path) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        rec_name = next((n for n in names if n.endswith(".dist-info/RECORD")), None)
        if rec_name is None:
            return ["no RECORD"]
        rows = {r[0]: r for r in csv.reader(io.StringIO(zf.read(rec_name).decode())) if r}
        for n in names:
            row = rows.pop(n, None)
            if row is None:
                problems.append(f"{n}: not in RECORD")
            elif n != rec_name:
                data = zf.read(n)
                if row[1] != record_hash(data) or row[2] != str(len(data)):
                    problems.append(f"{n}: RECORD says {row[1]},{row[2]}")
        problems += [f"{n}: in RECORD, not in the wheel" for n in rows]
    return problems


def host_platform() -> str:
    """This machine as a wheel platform of the lock (``x86_64``, ``aarch64``)."""
    m = platform_module.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


@dataclass
class PatchedWheel:
    """What :func:`make_wheel` wrote: the wheel and what it changed against the stock one."""

    pin: Pin
    platform: str
    stock: WheelFile
    tree: PatchedTree
    built: WheelBuild
    kernels: KernelPackage | None
    kernels_given: bool  # from a --kernels wheel (else built here)
    kernel_sources: list[str]  # the kernel sources the patches change
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        built, tree, k = self.built, self.tree, self.kernels
        return {
            "pin": self.pin.name, "platform": self.platform, "wheel": str(built.path), "version": built.version,
            "patch_set_sha256": tree.series.hash(), "patched_tree": tree.patched_tree,
            "stock_wheel": {"url": self.stock.url, "sha256": self.stock.sha256},
            "replaced": built.replaced, "added": built.added, "removed": built.removed,
            "not_shipped": built.not_shipped, "hooked": built.hooked,
            "kernels": None if k is None else {"package": k.dist, "from": str(k.source)
                                               if self.kernels_given else "built here",
                                               "ops": k.info.get("ops")},
            "notes": self.notes + [
                f"wheel: {built.path}",
                f"version {built.version} (patch set {tree.series.hash()[:12]}, tree {tree.patched_tree[:12]})",
                f"SBOM (CycloneDX 1.6): {built.sbom} ({built.sbom_size} bytes)",
                f"not in the wheel (not shipped by vLLM's wheel): {len(built.not_shipped)} file(s)"
                + (" (kernel sources: in the kernel library)" if self.kernel_sources else ""),
            ],
        }

    def table(self) -> tuple[report.Table, str]:
        built = self.built
        rows = [[p, "replaced"] for p in built.replaced] + [[p, "added"] for p in built.added] + \
               [[p, "removed"] for p in built.removed] + \
               ([[built.hooked, "kernels hook line appended"]] if built.hooked else [])
        return report.simple_table(f"dsv4patch wheel: {self.pin.name} ({self.platform})", ["file", "change"], rows)


def make_wheel(
    *,
    ctx: Context,
    pin: Pin,
    out: Path,
    platform: str | None = None,
    kernels: Path | None = None,
    archs: Sequence[str] | None = None,
    python: str | None = None,
    nvcc: str | None = None,
    allow_torch: str | None = None,
    extra_include: Sequence[Path] = (),
) -> PatchedWheel:
    """The patched wheel of ``pin`` for ``platform`` (default: this machine's), written into ``out``.

    The kernel library comes from ``kernels`` (a ``dsv4patch build`` wheel of this pin and
    patched tree) or, when the patches change kernel sources, is built here: the patched
    tree is created in the cache and its kernels built (``archs``, ``python``, ``nvcc``,
    ``allow_torch``, ``extra_include`` as for :func:`dsv4patch.kernels.building.build_tree`).
    """
    plat = platform or host_platform()
    wheel = stock_wheel_for(pin, plat)
    tree = patched_tree(ctx=ctx, pin=pin)
    kernel_sources = [f.path for f in tree.files if f.path.startswith("csrc/")]
    # The stock wheel in the cache is read and checked while the kernels are built (git and nvcc
    # children, file reads): one thread, bounded work, done before the repack needs it.
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="dsv4patch-stock") as pre:
        cached = ctx.store.blob_path(wheel.sha256)
        preload = pre.submit(load_stock, cached, wheel, pin, pre) if safeio.is_regular(cached) else None
        kpkg, tmp_kernels, notes = _kernel_package(
            tree, plat, kernels, kernel_sources, ctx=ctx,
            how=_KernelBuild(archs, python, nvcc, allow_torch, tuple(extra_include)))
        try:
            built = _repack(tree, wheel, kpkg, out, ctx=ctx, preload=preload)
        finally:
            if tmp_kernels is not None:
                ctx.store.remove_tmp(tmp_kernels)
    return PatchedWheel(pin, plat, wheel, tree, built, kpkg, kernels is not None, kernel_sources, notes)


def _kernel_package(tree: PatchedTree, plat: str, kernels: Path | None, kernel_sources: list[str], *,
                    ctx: Context, how: _KernelBuild) -> tuple[KernelPackage | None, Path | None, list[str]]:
    """The kernel package the wheel adds (``kernels`` read, else built here when the patches change
    ``kernel_sources``), the cache tmp dir it was built in (to remove after the repack), and notes."""
    pin = tree.pin
    if kernels is not None:
        return read_kernels(kernels, pin, tree.patched_tree, plat), None, []
    if not kernel_sources:
        return None, None, ["the patches change no kernel source: no kernel library added"]
    if plat != host_platform():
        raise ParameterError(
            f"{param('platform')} {plat}: the kernel library is built for this machine "
            f"({host_platform()}); build it on a {plat} machine with `dsv4patch build {param('pin')} "
            f"{pin.name}` and pass the wheel with {param('kernels')}")
    # The lock's toolchain: the kernel wheel an earlier run built for the same key is read as it is.
    lock_toolchain = how.python is None and how.allow_torch is None and not how.extra_include

    def kept_key() -> str | None:
        if not lock_toolchain:
            return None
        return kernel_wheel_key(store=ctx.store, pin=pin, patched_tree=tree.patched_tree, archs=how.archs,
                                nvcc=how.nvcc, progress=ctx.progress)

    key = kept_key()
    kept = kept_kernel_wheel(ctx.store, key) if key is not None else None
    if kept is not None:
        try:
            kpkg = read_kernels(kept, pin, tree.patched_tree, plat)
        except BuildError:
            kept = None  # not what this pin's tree needs after all: built below
        else:
            return kpkg, None, [_built_here(kpkg)]
    kwheel = _build_kernels(pin, f"{tree.patched_tree[:12]}-{tree.series.hash()[:12]}", tree.patched_tree,
                            ctx=ctx, how=how)
    if kwheel is None:
        raise BuildError(f"pin {pin.name}: the patches change {', '.join(kernel_sources)} but "
                         "`dsv4patch build` produced no kernel library")
    try:
        kpkg = read_kernels(kwheel, pin, tree.patched_tree, plat)
    except BaseException:
        ctx.store.remove_tmp(kwheel.parent)  # an unreadable library (or an interrupt) leaves nothing in the cache
        raise
    key = key or kept_key()  # again where the build installed a part of the toolchain
    if key is not None:
        keep_kernel_wheel(ctx.store, key, kwheel)
    return kpkg, kwheel.parent, [_built_here(kpkg)]


def _built_here(kpkg: KernelPackage) -> str:
    return (f"kernel library built here for torch {kpkg.info.get('torch_version')}, "
            f"CUDA {kpkg.info.get('cuda_version')}")


def _repack(tree: PatchedTree, wheel: WheelFile, kpkg: KernelPackage | None, out: Path, *,
            ctx: Context, preload: Future[StockBytes] | None) -> WheelBuild:
    """:func:`build` from the cache's stock wheel (``preload``: read and checked from there already).
    The repack hashes the very bytes it copies and
    refuses them unless they are the lock's, so a cached file is not hashed a second time first; a
    repack that fails on a file the cache did not verify this run (a damaged entry) is made again
    from the verified (or fetched anew) file, whose refusal, if any, is the one reported."""
    verdicts = ctx.store.subdir(VERDICTS)  # a real directory: a link planted there is removed, never followed
    cached = ctx.store.blob_path(wheel.sha256)
    if preload is not None or safeio.is_regular(cached):
        try:
            loaded = preload.result() if preload is not None else None
            return build(tree, cached, wheel, kpkg, out, verdicts=verdicts, loaded=loaded)
        except IntegrityError:
            pass  # checked again below, from the file the cache verifies (or fetches anew)
    return build(tree, stock_wheel_path(ctx.store, wheel, ctx.progress), wheel, kpkg, out, verdicts=verdicts)


def _build_kernels(pin: Pin, key: str, patched: str, *, ctx: Context, how: _KernelBuild) -> Path | None:
    """Create the patched tree in the cache (as ``apply`` does) and build its kernels; the kernel wheel.

    The tree is the cache's own, keyed by the patched tree and the patch texts (``key``): one that
    still holds exactly the locked patched tree (``patched``: HEAD's tree, nothing changed in it,
    checked under the build's vetting) is built as it is, without checking the series into it a
    second time; one that an older dsv4patch or other patch texts left in a state ``apply`` does
    not take is made again.
    """
    path = ctx.store.root / "wheel-trees" / f"{pin.name}-{key}"
    if path.is_dir():
        try:
            return _kernel_wheel(pin, path, how, ctx=ctx, expect_tree=patched)
        except NotThatTree:
            pass  # not yet (or no longer) the patched tree: apply the series, as below
    from dsv4patch.checkout import apply_pin  # only when the cache's tree is not the patched tree (a warm wheel's is)

    try:
        applied = apply_pin(ctx=ctx, pin=pin, tree_path=path)
    except TreeError:
        shutil.rmtree(path, ignore_errors=True)
        applied = apply_pin(ctx=ctx, pin=pin, tree_path=path)
    if not applied.ok:
        raise BuildError(f"pin {pin.name}: apply into {path} failed: {'; '.join(applied.notes)[-2000:]}")
    return _kernel_wheel(pin, path, how, ctx=ctx, expect_tree=None)


@frozen
class _KernelBuild:
    """How the kernels are built (:func:`build_tree`'s options, as ``make_wheel`` got them)."""

    archs: Sequence[str] | None
    python: str | None
    nvcc: str | None
    allow_torch: str | None
    extra_include: tuple[Path, ...]


def _kernel_wheel(pin: Pin, path: Path, how: _KernelBuild, *, ctx: Context, expect_tree: str | None) -> Path | None:
    """The kernel wheel of the tree at ``path`` (:func:`build_tree` into a cache tmp dir), None when
    it builds none; a failed build leaves nothing in the cache."""
    store = ctx.store
    out_dir = store.tmpdir("kernels-wheel-")
    try:
        built = build_tree(tree=path, pin=pin, store=store, progress=ctx.progress, archs=how.archs,
                           python=how.python, nvcc=how.nvcc, allow_torch=how.allow_torch,
                           extra_include=how.extra_include, out=out_dir, expect_tree=expect_tree,
                           final=False)  # a step: the patched wheel is the run's result
    except BaseException:
        store.remove_tmp(out_dir)  # a failed build leaves nothing in the cache
        raise
    if built.wheel is None:
        store.remove_tmp(out_dir)
    return built.wheel
