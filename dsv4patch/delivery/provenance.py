"""An installed patched vLLM checked against its own SBOM: the node check without the repository.

Why: a serving node has ``pip install dsv4patch`` and the patched vLLM, not
this repository, its lock or the pin's sdist (and often no network).  The
patched wheel carries a CycloneDX SBOM (:mod:`.sbom`) with the text of every
patch applied, the patched tree id, the stock wheel's and sdist's sha256 and
the kernel library's sha256.  That is enough to check the installed files
without the source:

* **files**: the installed files each patch changes are loaded into a
  scratch git index and the patches are peeled off in reverse order
  (``git apply --cached -R``, limited to the shipped ``vllm/`` paths): a patch
  that peels cleanly is ``present``; one that does not, but whose forward
  application fits, finds the pin's unpatched content (``stock``); anything
  else is ``other``.  A patch that changes only kernel sources is ``present``
  when the installed kernel library has the SBOM's sha256;
* **tests**: the series' regression tests are new files in the patches'
  texts; applied to an empty directory they are the exact test files the
  self-test runs (:func:`series_tests`);
* **a lock given anyway** (a path, or one downloaded from a URL) must agree:
  same pin and vLLM version, the same patched tree id (the hash of the whole
  patched source, tests included), the same stock wheel and sdist sha256
  (:func:`lock_problems`).

What this does not prove: that the SBOM lists the patches the operator
expects.  Without a lock the report says it was checked against the SBOM's
own patches and names them, so a lock (or ``dsv4patch status --installed`` on
a machine with the repository) is what ties them to the team's series.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4patch import git, guard, safeio
from dsv4patch.delivery import sbom
from dsv4patch.delivery.installed_state import KERNEL_LIBRARY, FileState, PatchState
from dsv4patch.errors import Dsv4Error, GitError, PatchFileError
from dsv4patch.hashing import hash_installed, sha256
from dsv4patch.records import frozen
from dsv4patch.safeio import loads_json
from dsv4patch.series import load_patch

if TYPE_CHECKING:
    from dsv4patch.delivery.installed_state import ProbedVllm
    from dsv4patch.pins import Lock, Pin
    from dsv4patch.series import Patch

SHIPPED = "vllm/"  # the part of the tree a wheel installs
FILE_LIMIT = 32 << 20  # bytes of one installed file read into the scratch index
LIBRARY_LIMIT = 1 << 30  # bytes of the installed kernel library hashed


@frozen
class SbomPatch:
    """One patch as the installed SBOM carries it: its name (the SBOM's property) and text."""

    name: str
    sha256: str
    text: bytes


@dataclass
class Provenance:
    """The installed vLLM's own account of itself: its SBOM's facts and patch texts."""

    path: str
    version: str | None
    pin: str | None
    patched_tree: str | None
    patches: list[SbomPatch]
    kernel_library_sha256: str | None
    ancestors: dict[str, str]
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"sbom": self.path, "version": self.version, "pin": self.pin, "patched_tree": self.patched_tree,
                "patches": [{"name": p.name, "sha256": p.sha256} for p in self.patches],
                "kernel_library_sha256": self.kernel_library_sha256, "ancestors": dict(self.ancestors),
                "problems": list(self.problems)}


class ProvenanceError(Dsv4Error):
    """The installed vLLM has no dsv4patch SBOM that can be read (exit 1: not a dsv4patch wheel, or damaged)."""

    exit_code = 1
    kind = "integrity"


def read(sbom_paths: list[str]) -> Provenance:
    """The installed SBOM (``<dist-info>/sboms/dsv4patch.cdx.json``, as the RECORD lists it), read bounded."""
    mine = [p for p in sbom_paths if Path(p).name == sbom.SBOM_NAME]
    if not mine:
        raise ProvenanceError(f"the installed vLLM has no {sbom.SBOM_DIR}/{sbom.SBOM_NAME}: it was not installed "
                              "from a wheel `dsv4patch wheel` made, so there is nothing to check it against "
                              "without the lock")
    path = mine[0]
    try:
        raw = safeio.read_bytes(path, sbom.SBOM_LIMIT, what=path)
        facts = sbom.read(loads_json(raw, label=path, limit=sbom.SBOM_LIMIT))
    except (OSError, safeio.UnsafeFileError) as exc:
        raise ProvenanceError(f"{path}: cannot be read ({exc})") from None
    by_sha = {v: k for k, v in facts.patches.items()}
    patches = []
    problems = list(facts.problems)
    for text in facts.diffs:
        digest = sha256(text)
        name = by_sha.get(digest)
        if name is None:
            problems.append(f"a pedigree patch (sha256 {digest[:12]}) is not among the SBOM's named patches")
            continue
        patches.append(SbomPatch(name, digest, text))
    return Provenance(path, facts.version, facts.pin, facts.patched_tree, patches, facts.kernel_library_sha256,
                      dict(facts.ancestors), problems)


def lock_problems(prov: Provenance, pin: Pin) -> list[str]:
    """Where the SBOM and the lock's PIN disagree (empty: they describe the same patched tree)."""
    out = []
    if prov.pin != pin.name:
        out.append(f"the installed vLLM was made for pin {prov.pin}, not {pin.name}")
    if (prov.version or "").split("+", 1)[0] != pin.vllm_version:
        out.append(f"the installed vLLM is {prov.version}, pin {pin.name} is vLLM {pin.vllm_version}")
    if pin.patched_tree and prov.patched_tree != pin.patched_tree:
        out.append(f"the installed vLLM was patched to tree {str(prov.patched_tree)[:12]}, the lock expects "
                   f"{pin.patched_tree[:12]} (another patch series)")
    if pin.source.kind == "pypi-sdist" and prov.ancestors.get("sdist") not in (None, pin.source.sha256):
        out.append("the installed vLLM was made from another sdist than the lock's")
    wheels = {w.sha256 for w in pin.wheels.values()} if pin.wheels else set()
    if wheels and prov.ancestors.get("stock-wheel") not in wheels:
        out.append("the installed vLLM was repacked from a stock wheel the lock does not pin")
    return out


def _loaded(p: SbomPatch, where: Path) -> Patch:
    """The patch text parsed as a patch file (its paths checked as git reads them)."""
    path = where / f"{len(list(where.iterdir())):03d}.patch"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(p.text)
    return load_patch(path, name=p.name)


def series_tests(prov: Provenance) -> dict[str, bytes]:
    """The series' regression tests (new ``tests/**/test_*.py`` files), made by applying the SBOM's patch
    texts' test files to an empty directory in order."""
    out: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="dsv4patch-sbom-tests-") as tmp:
        root, texts = Path(tmp) / "tree", Path(tmp) / "patches"
        root.mkdir()
        texts.mkdir()
        git.init(root)
        with guard.owned(root):  # a work tree dsv4patch just made (git runs in one only while held)
            for p in prov.patches:
                loaded = _loaded(p, texts)
                if not any(f.path.startswith("tests/") for f in loaded.files):
                    continue
                res = git.run(root, ["apply", "--include=tests/*", "--whitespace=nowarn", str(loaded.path)],
                              check=False)
                if not res.ok:
                    raise PatchFileError(f"the SBOM's patch {p.name}: its tests do not apply to an empty tree "
                                         f"({res.stderr.strip()[:300]})")
        for f in sorted(root.rglob("test_*.py")):
            rel = f.relative_to(root).as_posix()
            if rel.startswith("tests/") and not f.is_symlink():
                out[rel] = safeio.read_bytes(f, FILE_LIMIT)
    return out


def check_files(prov: Provenance, site_root: Path, kernel_library_sha256: str | None) -> dict[str, PatchState]:
    """Each SBOM patch's state in the installed files (see the module docstring); the kernel library's too."""
    with tempfile.TemporaryDirectory(prefix="dsv4patch-sbom-check-") as tmp, \
            guard.owned(Path(tmp) / "repo"):  # a work tree dsv4patch makes (git runs in one only while held)
        repo, texts = Path(tmp) / "repo", Path(tmp) / "patches"
        texts.mkdir()
        git.init(repo)
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        loaded = [(p, _loaded(p, texts)) for p in prov.patches]
        shipped = sorted({f.path for _, lp in loaded for f in lp.files if f.path.startswith(SHIPPED)})
        absent = _index_installed(repo, env, site_root, shipped)
        patches: dict[str, PatchState] = {}
        for p, lp in reversed(loaded):  # peel the series off, last patch first
            patches[p.name] = _peeled(repo, env, lp, absent, kernel_ok=kernel_library_sha256 is not None
                                      and kernel_library_sha256 == prov.kernel_library_sha256)
    return patches


def _index_installed(repo: Path, env: dict[str, str], site_root: Path, shipped: list[str]) -> list[str]:
    """Put the installed files into the scratch index; the ones that are not installed.

    A file that cannot be read is left out of the index (its patch then does not peel off).
    """
    absent: list[str] = []
    for rel in shipped:
        try:
            data = safeio.read_bytes(site_root / rel, FILE_LIMIT, what=str(site_root / rel))
        except FileNotFoundError:
            absent.append(rel)
            continue
        except (OSError, safeio.UnsafeFileError):
            continue
        git.update_index_blob(repo, env, rel, git.hash_object(repo, data))
    return absent


def _peeled(repo: Path, env: dict[str, str], lp: Patch, absent: list[str], *, kernel_ok: bool) -> PatchState:
    """One patch peeled off the scratch index (``git apply --cached -R``): its state and its files'."""
    mine = [f.path for f in lp.files if f.path.startswith(SHIPPED)]
    if not mine:
        if any(f.path.startswith("csrc/") for f in lp.files):
            state = "present" if kernel_ok else "missing"
            return PatchState(state, {KERNEL_LIBRARY: FileState(state)})
        return PatchState("not-shipped")
    missing = [r for r in mine if r in absent and not any(f.is_added for f in lp.files if f.path == r)]
    args = ["apply", "--cached", f"--include={SHIPPED}*", "--whitespace=nowarn"]
    peel = git.run(repo, [*args, "-R", str(lp.path)], env=env, check=False)
    if missing:
        state = "missing"
    elif peel.ok:
        state = "present"
    elif git.run(repo, [*args, "--check", str(lp.path)], env=env, check=False).ok:
        state = "stock"
    else:
        state = "other"
    return PatchState(state, {r: FileState(state) for r in mine},
                      problem=peel.stderr.strip()[:300] if state == "other" else None)


@frozen
class SbomInspection:
    """The installed vLLM checked against its own SBOM (and a lock's pin, when one was given)."""

    provenance: Provenance
    patches: dict[str, PatchState]  # in the SBOM's order
    problems: list[str]
    ok: bool
    lock_checked: bool

    def to_json(self) -> dict[str, Any]:
        return {"source": "sbom", "provenance": self.provenance.to_json(),
                "patches": {n: p.to_json() for n, p in self.patches.items()}, "problems": list(self.problems),
                "ok": self.ok, "lock_checked": self.lock_checked}


def inspect(vllm: ProbedVllm, library: str | None, lock_pin: Pin | None = None) -> SbomInspection:
    """The installed vLLM (``installed.probe``'s answer) checked against its SBOM, and a lock's pin if given.

    ``library``: the installed kernel library (None: none is installed).
    """
    prov = read(list(vllm.sboms))
    lib_sha = hash_installed(Path(library), LIBRARY_LIMIT) if library is not None else None
    try:
        found = check_files(prov, Path(vllm.root), lib_sha)
    except (GitError, PatchFileError) as exc:
        raise ProvenanceError(f"{prov.path}: its patches cannot be checked ({exc})") from None
    states = {p.name: found[p.name] for p in prov.patches if p.name in found}
    problems = list(prov.problems)
    if (vllm.version or "") != (prov.version or ""):
        problems.append(f"the SBOM describes vLLM {prov.version}, the installed vLLM is {vllm.version}")
    if lock_pin is not None:
        problems += lock_problems(prov, lock_pin)
    ok = not problems and all(s.state in ("present", "not-shipped") for s in states.values())
    return SbomInspection(prov, states, problems, ok, lock_pin is not None)


def tests_for(vllm: ProbedVllm) -> dict[str, bytes]:
    """The series' regression tests from the installed vLLM's SBOM (the self-test's regression case)."""
    return series_tests(read(list(vllm.sboms)))


def pin_for(lock: Lock, prov: Provenance) -> Pin | None:
    return lock.pins.get(prov.pin or "")


LOCK_LIMIT = 1 << 20  # bytes of a lock read from a URL


def lock_from_url(url: str) -> Lock:
    """A lock downloaded from URL (bounded in size and time, as every download), parsed.

    It comes without its patch files: what it can say about an installed vLLM is
    which pin, patched tree, sdist and stock wheel to expect (:func:`lock_problems`).
    """
    from dsv4patch import index
    from dsv4patch.errors import FetchError
    from dsv4patch.pins import load_lock
    from dsv4patch.urls import http_url_problem, redact

    problem = http_url_problem(url)
    if problem:
        raise FetchError(f"lock {redact(url)}: {problem}")
    deadline = time.monotonic() + index.transfer_timeout()
    try:
        with index.open_url(url) as resp:
            data = b"".join(index.body_chunks(resp, limit=LOCK_LIMIT, deadline=deadline, label=f"lock {redact(url)}"))
    except OSError as exc:
        raise FetchError(f"lock {redact(url)}: cannot be downloaded ({index.redact_reason(exc)})") from None
    with tempfile.TemporaryDirectory(prefix="dsv4patch-lock-") as tmp:
        path = Path(tmp) / "vllm.toml"
        path.write_bytes(data)
        return load_lock(path)
