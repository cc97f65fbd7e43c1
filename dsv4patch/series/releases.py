"""The release watcher: vLLM releases on the index that the lock does not pin, and what each needs.

Why: a new vLLM release is otherwise noticed only when someone adds it by hand,
and a maintainer on it cannot learn from ``check`` which patches they still
need.  :func:`watch` asks the configured package index (:mod:`dsv4patch.index`,
the one pip/uv use, read within its bounds) which releases exist, and for each
one the lock does not pin (newer than ``[watch].since``, not in
``[watch].ignore``; pre-releases only when asked; yanked ones listed, not
checked) it downloads the sdist, verified against the sha256 the index lists
(and recorded), checks the series against it, classifies every patch
(``upstream`` by marker, ``clean``, ``offset``, ``conflict``, ...), and builds
the lock entry it would add.  A patch that does not apply as the series has
it is tried with the variants the lock already has for its nearest pins (a
variant written for 0.28.0 may carry the same hunks to 0.29.0); the entry
names the one that applies.  Pinned releases the index has since yanked, or
lists with another sha256, are flagged too.  A pinned release asked for by
name is checked the same way, from its own pin's series and settings, and
compared with the pin's lock entry (state ``pinned``): nothing to decide when
the index's sdist gives the entry's commit, toolchain and trees, else what
differs; it never has an entry to add.

Nothing is written unless the caller asks (:func:`write_entry`), and then only
an entry whose every patch is settled (``upstream`` or ``clean``) with a
toolchain for the kernels its patches change; a release that needs a port
(``offset``, ``conflict``) or a new toolchain is left to the maintainer, with
the step to take as a typed decision.
"""

from __future__ import annotations

import os
import re
import tarfile
from collections import Counter
from dataclasses import field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomlkit
from packaging.version import InvalidVersion, Version

from dsv4patch import git, index, safeio
from dsv4patch.errors import FetchError, IntegrityError, LockFileError
from dsv4patch.pins import Pin, Source, load_lock, materialize, read_lock_text, version_commit
from dsv4patch.records import frozen
from dsv4patch.series import engine
from dsv4patch.series.patches import load_patch, series_for_pin
from dsv4patch.urls import redact

if TYPE_CHECKING:
    from dsv4patch.pins import Context, Lock, PinRepo
    from dsv4patch.series.patches import Patch

PROJECT = "vllm"
# What a release's state asks of the maintainer (rendered as next steps by commands/releases.py).
ADOPT = "adopt"  # every patch settled: the entry can be written as it is
PORT = "port"  # a patch applies only at an offset or conflicts: carry the series over (port)
TOOLCHAIN = "toolchain"  # the series changes kernels there and no toolchain has that torch
INVESTIGATE = "investigate"  # the sdist could not be had or verified (hash, missing, yanked pin)
NONE = "none"  # listed for information only (yanked, pre-release, ignored)
SETTLED = (engine.Status.UPSTREAM, engine.Status.ALREADY_APPLIED, engine.Status.CLEAN)
_WHEEL = re.compile(r"^vllm-(?P<v>[^-]+)-cp\d+-(?:abi3|cp\d+)-manylinux_\d+_\d+_(?P<plat>x86_64|aarch64)\.whl$")


@frozen
class Release:
    """One vLLM version on the index: its sdist and stock wheels as the simple page lists them."""

    version: str
    prerelease: bool
    yanked: str | None  # None: not yanked; else the reason (possibly empty)
    sdist: str | None  # filename
    sdist_file: index.IndexFile | None
    wheels: dict[str, tuple[str, index.IndexFile]] = field(default_factory=dict)  # platform -> (name, file)


def _version(v: str) -> Version | None:
    try:
        return Version(v)
    except InvalidVersion:
        return None


def list_releases(index_url: str, project: str = PROJECT) -> list[Release]:
    """Every release of ``project`` on the index's simple page, oldest first (bounded read)."""
    files = index.project_page(index_url, project)
    by_version: dict[str, dict[str, Any]] = {}
    sdist_re = re.compile(rf"^{re.escape(project)}-(?P<v>[^-/]+)\.tar\.gz$")
    for name, f in files.items():
        m = sdist_re.match(name)
        w = _WHEEL.match(name)
        version = m.group("v") if m else (w.group("v") if w else None)
        if version is None or _version(version) is None:
            continue
        entry = by_version.setdefault(version, {"sdist": None, "wheels": {}, "yanked": []})
        entry["yanked"].append(f.yanked)
        if m:
            entry["sdist"] = (name, f)
        elif w:
            # Prefer the abi3 wheel when a platform has several (one per Python before abi3).
            plat = w.group("plat")
            if plat not in entry["wheels"] or "abi3" in name:
                entry["wheels"][plat] = (name, f)
    out = []
    for version, e in by_version.items():
        parsed = _version(version)
        assert parsed is not None
        yanks = [y for y in e["yanked"] if y is not None]
        # A release is yanked when all its files are (PEP 592); the sdist's reason is shown.
        yanked = (e["sdist"][1].yanked if e["sdist"] and e["sdist"][1].yanked is not None
                  else (yanks[0] if yanks else None)) if len(yanks) == len(e["yanked"]) else None
        out.append(Release(version, parsed.is_prerelease or parsed.is_devrelease, yanked,
                           e["sdist"][0] if e["sdist"] else None, e["sdist"][1] if e["sdist"] else None,
                           dict(e["wheels"])))
    return sorted(out, key=lambda r: _version(r.version) or Version("0"))


@frozen
class PatchClass:
    """One patch of the series on a release: as the series has it, and with the best variant."""

    patch: str
    series_status: str  # the series' own patch file on the release
    status: str  # the file the entry would use (the series' own, or a pin's variant)
    variant_of: str | None = None  # the pin whose variant gives ``status``
    variant: Path | None = None
    message: str = ""
    touches_kernels: bool = False  # it changes csrc/ (the kernel build's input)

    def to_json(self) -> dict[str, Any]:
        return {"series_status": self.series_status, "status": self.status, "variant_of": self.variant_of,
                "variant": str(self.variant) if self.variant else None, "message": self.message,
                "touches_kernels": self.touches_kernels}


@frozen
class ReleaseReport:
    """What the watcher found for one release, and the decision it needs."""

    version: str
    # new | pinned | yanked | pre-release | ignored | pinned-yanked | pinned-changed | hash-mismatch | fetch-failed
    # | no-sdist
    state: str
    decision: str  # ADOPT | PORT | TOOLCHAIN | INVESTIGATE | NONE
    detail: str = ""
    sdist: dict[str, Any] | None = None  # filename, url, sha256 (the index's, verified), size
    commit: str | None = None  # from the sdist's vllm/_version.py
    torch: str | None = None  # requirements/cuda.txt of the release
    toolchain: str | None = None  # the lock's toolchain for that torch
    reference: str | None = None  # the pin whose series and settings the entry starts from
    patches: list[PatchClass] = field(default_factory=list)
    base_tree: str | None = None
    patched_tree: str | None = None
    entry: str | None = None  # the lock entry (TOML) it would add
    written: bool = False

    @property
    def needs_decision(self) -> bool:
        return self.decision != NONE

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "decision": self.decision, "needs_decision": self.needs_decision,
                "detail": self.detail, "sdist": self.sdist, "commit": self.commit, "torch": self.torch,
                "toolchain": self.toolchain, "reference": self.reference, "base_tree": self.base_tree,
                "patched_tree": self.patched_tree,
                "patches": {p.patch: p.to_json() for p in self.patches}, "entry": self.entry,
                "written": self.written}


@frozen
class WatchResult:
    lock: Path
    index: str  # credentials redacted
    releases: list[ReleaseReport]
    pinned: list[str]  # releases on the index the lock pins, oldest first
    older: int  # releases before [watch].since, not looked at

    @property
    def needs_decision(self) -> list[str]:
        return [r.version for r in self.releases if r.needs_decision]

    def to_json(self) -> dict[str, Any]:
        return {"lock": str(self.lock), "index": self.index, "ok": not self.needs_decision,
                "needs_decision": self.needs_decision, "pinned": self.pinned, "older_than_since": self.older,
                "releases": {r.version: r.to_json() for r in self.releases}}


def _pinned_versions(lock: Lock) -> dict[str, Pin]:
    return {p.source.version: p for p in lock.pins.values() if p.source.kind == "pypi-sdist"
            and p.source.name == PROJECT}


def _since(lock: Lock) -> Version | None:
    if lock.watch.since is not None:
        return _version(lock.watch.since)
    pinned = [v for v in (_version(s) for s in _pinned_versions(lock)) if v is not None]
    return min(pinned) if pinned else None


def watch(*, ctx: Context, pre: bool = False, only: list[str] | None = None) -> WatchResult:
    """The releases on the configured index that the lock does not pin, each checked (see module doc).

    ``only``: just these versions; a pinned one is checked as if it were new and compared with its pin's
    lock entry (:func:`check_pinned`).
    """
    where = index.index_url()
    releases = list_releases(where, PROJECT)
    lock = ctx.lock
    pinned = _pinned_versions(lock)
    since = _since(lock)
    reports: list[ReleaseReport] = []
    older = 0
    wanted = set(only or [])
    missing = wanted - {r.version for r in releases}
    if missing:
        raise FetchError(f"the index {redact(where)} has no vLLM release {', '.join(sorted(missing))}")
    for rel in releases:
        parsed = _version(rel.version)
        if wanted:
            if rel.version in wanted:
                reports.append(check_pinned(ctx=ctx, release=rel, pin=pinned[rel.version])
                               if rel.version in pinned else check_release(ctx=ctx, release=rel))
            continue
        if rel.version in pinned:
            flag = _pinned_flag(pinned[rel.version], rel)
            if flag is not None:
                reports.append(flag)
            continue
        if since is not None and parsed is not None and parsed < since:
            older += 1
            continue
        if rel.version in lock.watch.ignore:
            reports.append(ReleaseReport(rel.version, "ignored", NONE, lock.watch.ignore[rel.version]))
        elif rel.yanked is not None:
            reports.append(ReleaseReport(rel.version, "yanked", NONE,
                                         f"yanked on the index{': ' + rel.yanked if rel.yanked else ''}"))
        elif rel.prerelease and not pre:
            reports.append(ReleaseReport(rel.version, "pre-release", NONE, "a pre-release: not checked"))
        else:
            reports.append(check_release(ctx=ctx, release=rel))
    return WatchResult(lock.path, redact(where), reports, [r.version for r in releases if r.version in pinned],
                       older)


def _pinned_flag(pin: Pin, rel: Release) -> ReleaseReport | None:
    """A pinned release whose sdist the index now yanks or lists with another sha256."""
    if rel.yanked is not None:
        return ReleaseReport(rel.version, "pinned-yanked", INVESTIGATE,
                             f"pin {pin.name} is yanked on the index"
                             + (f" ({rel.yanked})" if rel.yanked else "") + ": decide whether to keep it")
    if rel.sdist_file is not None and rel.sdist_file.sha256 and rel.sdist_file.sha256 != pin.source.sha256:
        return ReleaseReport(rel.version, "pinned-changed", INVESTIGATE,
                             f"the index lists {rel.sdist} with sha256 {rel.sdist_file.sha256}, pin "
                             f"{pin.name} has {pin.source.sha256}: the file on the index is not the pinned one")
    return None


def _sdist_commit(blob: Path, version: str) -> str:
    """The commit prefix in the sdist's ``vllm/_version.py`` (read from the archive, bounded)."""
    what = f"vllm {version} sdist"
    try:
        with tarfile.open(blob, "r:gz") as tar:
            info = tar.getmember(f"vllm-{version}/vllm/_version.py")
            if not info.isfile() or info.size > 1 << 16:
                raise FetchError(f"{what}: vllm/_version.py is not a small regular file")
            member = tar.extractfile(info)
            data = member.read() if member else b""
    except (tarfile.TarError, EOFError, OSError, KeyError) as exc:
        raise FetchError(f"{what}: cannot read vllm/_version.py ({exc})") from None
    return version_commit(data, f"{what}: vllm/_version.py")


def _reference(lock: Lock, version: str) -> Pin:
    """The pinned release the new one starts from: the newest older one, else the oldest newer one."""
    v = _version(version) or Version("0")
    pins = sorted(((_version(p.source.version) or Version("0"), p) for p in _pinned_versions(lock).values()),
                  key=lambda t: t[0])
    if not pins:
        return lock.pin(None)
    older = [p for pv, p in pins if pv < v]
    return older[-1] if older else pins[0][1]


def _variant_order(lock: Lock, version: str) -> list[Pin]:
    """Pins with variants, nearest release first (older before newer at the same distance)."""
    v = _version(version) or Version("0")
    pins = [(_version(p.source.version) or Version("0"), p) for p in _pinned_versions(lock).values() if p.variants]

    def distance(t: tuple[Version, Pin]) -> tuple[int, int]:
        rel = t[0].release + (0,) * 3
        own = v.release + (0,) * 3
        d = abs((rel[0] * 10000 + rel[1]) * 10000 + rel[2] - ((own[0] * 10000 + own[1]) * 10000 + own[2]))
        return d, 0 if t[0] < v else 1

    return [p for _, p in sorted(pins, key=distance)]


def _torch(repo: PinRepo) -> str | None:
    for rel in ("requirements/cuda.txt", "requirements/common.txt"):
        entry = git.ls_tree_entry(repo.repo, repo.base_commit, rel)
        if entry is None:
            continue
        m = re.search(r"^torch\s*==\s*([0-9][0-9.]*)\s*(?:#.*)?$",
                      git.cat_blob(repo.repo, entry.oid)[: 1 << 20].decode("utf-8", "replace"), re.M)
        if m:
            return m.group(1)
    return None


def _touches_kernels(patch: Patch) -> bool:
    return any(f.path.startswith("csrc/") or (f.source_path or "").startswith("csrc/") for f in patch.files)


def _rank(status: engine.Status) -> int:
    """Settled first, then a patch that applies at an offset (a refresh away), then the rest."""
    return 0 if status in SETTLED else (1 if status is engine.Status.OFFSET else 2)


def _candidates(lock: Lock, pin: Pin, name: str) -> list[tuple[str, Path]]:
    """(whose, file) to try for patch ``name`` after the series' own: a variant already written
    for this release (``patches/variants/<version>/``), then the nearest pins' variants."""
    out: list[tuple[str, Path]] = []
    own = lock.path.parent.parent / "patches" / "variants" / pin.name / name
    if own.is_file() and not own.is_symlink():
        out.append((pin.name, own))
    for other in _variant_order(lock, pin.vllm_version):
        vpath = other.variants.get(name)
        if vpath is not None and vpath.is_file() and all(vpath != p for _, p in out):
            out.append((other.name, vpath))
    return out


def classify(lock: Lock, pin: Pin, repo: PinRepo) -> tuple[list[PatchClass], dict[str, Path]]:
    """Each patch of ``pin``'s series on ``repo``: as it is, then with the candidate variants.

    Patches are tried in order in one scratch index, as the series applies:
    the first file that is settled (upstream, clean) wins, else the first that
    applies at an offset, else the series' own; the chosen file stays applied
    for the patches after it.  Returns the classes and the variants the entry needs.
    """
    base = series_for_pin(lock, replace(pin, variants={}))
    classes: list[PatchClass] = []
    chosen: dict[str, Path] = {}
    with git.scratch_index(repo.repo, repo.base_commit) as env:
        for patch in base.patches:
            before = git.write_tree(repo.repo, env)
            own = engine.check_one(repo.repo, env, patch)
            best, via, path, best_patch = own, None, None, patch
            if own.status not in SETTLED:
                for whose, vpath in _candidates(lock, pin, patch.name):
                    git.read_tree(repo.repo, before, env)
                    vpatch = load_patch(vpath, patch.series, patch.name, below=lock.project)
                    res = engine.check_one(repo.repo, env, vpatch)
                    if _rank(res.status) < _rank(best.status):
                        best, via, path, best_patch = res, whose, vpath, vpatch
                    if res.status in SETTLED:
                        break
                git.read_tree(repo.repo, before, env)
                engine.check_one(repo.repo, env, best_patch)  # the index as the chosen file leaves it
            if path is not None:
                chosen[patch.name] = path
            classes.append(PatchClass(patch.name, own.status.value, best.status.value, via, path,
                                      best.message, _touches_kernels(patch)))
    return classes, chosen


def check_pinned(*, ctx: Context, release: Release, pin: Pin) -> ReleaseReport:
    """A release the lock pins (``pin``), asked for by name: flagged as the watch flags it where the
    index yanks it or lists another file, else checked as a new release from the pin's own series and
    settings and compared with the pin's entry (state ``pinned``; no entry to add, so nothing to write)."""
    flag = _pinned_flag(pin, release)
    if flag is not None:
        return flag
    fresh = check_release(ctx=ctx, release=release, reference=pin)
    if fresh.state != "new":  # no sdist, a hash mismatch, a failed fetch: as found
        return fresh
    differs = _differences(pin, fresh)
    if differs:
        decision, detail = INVESTIGATE, (f"pin {pin.name}'s lock entry is not what the series gives on the "
                                         f"index's sdist: {'; '.join(differs)}")
    else:
        decision, detail = NONE, (f"pin {pin.name}'s lock entry agrees: the index's sdist, checked as a new "
                                  "release, gives its commit, toolchain, base and patched trees")
    return replace(fresh, state="pinned", decision=decision, detail=detail, entry=None)


def _differences(pin: Pin, fresh: ReleaseReport) -> list[str]:
    """How ``pin``'s lock entry differs from the check of its release (``fresh``), each in words."""
    out = []
    if fresh.decision != ADOPT:
        out.append(f"the check is not settled ({fresh.decision}: {fresh.detail})")
    if fresh.commit and not (pin.commit.startswith(fresh.commit) or fresh.commit.startswith(pin.commit)):
        out.append(f"commit {pin.commit} in the lock, {fresh.commit} in the sdist's vllm/_version.py")
    toolchain = pin.toolchain.name if pin.toolchain else None
    if fresh.toolchain != toolchain:
        out.append(f"toolchain {toolchain or '(none)'} in the lock, {fresh.toolchain or '(none)'} by its torch "
                   f"{fresh.torch or '(unknown)'}")
    for what, locked, found in (("base_tree", pin.base_tree, fresh.base_tree),
                                ("patched_tree", pin.patched_tree, fresh.patched_tree)):
        if locked != found:
            out.append(f"{what} {locked or '(none)'} in the lock, {found or '(none)'} from the check")
    return out


def check_release(*, ctx: Context, release: Release, reference: Pin | None = None) -> ReleaseReport:
    """Fetch ``release``'s sdist (the index's sha256), check the series on it, build the entry.

    ``reference``: the pin whose series and settings the check starts from (default: the nearest
    older pinned release, :func:`_reference`)."""
    lock, store, progress = ctx.lock, ctx.store, ctx.progress
    v = release.version
    f = release.sdist_file
    if f is None or release.sdist is None:
        return ReleaseReport(v, "no-sdist", INVESTIGATE, "the index has no sdist for it (wheels only)")
    if not f.sha256:
        return ReleaseReport(v, "no-sdist", INVESTIGATE,
                             f"the index lists {release.sdist} without a sha256: it cannot be verified")
    url = f.url
    sdist = {"filename": release.sdist, "url": redact(url), "sha256": f.sha256, "size": f.size}
    try:
        blob = store.fetch_blob(url, f.sha256, f.size, f"vllm {v} sdist", progress)
        commit = _sdist_commit(blob, v)
    except IntegrityError as exc:  # the bytes are not the ones the index lists
        return ReleaseReport(v, "hash-mismatch", INVESTIGATE, str(exc), sdist=sdist)
    except FetchError as exc:  # the index links a file it does not serve, or not an sdist of vLLM
        return ReleaseReport(v, "fetch-failed", INVESTIGATE, str(exc), sdist=sdist)
    ref = _reference(lock, v) if reference is None else reference
    source = Source(kind="pypi-sdist", name=PROJECT, version=v, sha256=f.sha256, size=f.size,
                    url=_plain_url(url))
    pin = Pin(name=v, vllm_version=v, commit=commit, source=source, cuda_arch_list=ref.cuda_arch_list,
              series=ref.series, expect="clean", build=ref.build)
    repo = materialize(pin, store, progress)
    classes, variants = classify(lock, pin, repo)
    torch = _torch(repo)
    tdef = next((t for t in lock.toolchains.values() if t.torch == torch), None)
    statuses = Counter(c.status for c in classes)
    expect = statuses.most_common(1)[0][0] if classes else "clean"
    final_pin = replace(pin, variants=variants, expect=expect,
                        expect_patches={c.patch: c.status for c in classes if c.status != expect},
                        toolchain=tdef)
    result = engine.run_series(repo.repo, repo.base_commit, series_for_pin(lock, final_pin))
    kernels = any(c.touches_kernels and c.status in ("clean", "offset") for c in classes)
    unsettled = [c for c in classes if engine.Status(c.status) not in SETTLED]
    if unsettled:
        decision = PORT
        detail = "; ".join(f"{c.patch}: {c.status}" for c in unsettled)
    elif kernels and tdef is None:
        decision, detail = TOOLCHAIN, (f"its series changes kernels and the lock has no toolchain of "
                                       f"torch {torch or '(unknown)'}")
    else:
        decision, detail = ADOPT, "every patch is upstream or applies cleanly"
    entry = _entry(lock, final_pin, release, repo.base_tree, result.final_tree, ref) if not unsettled else None
    return ReleaseReport(v, "new", decision, detail, sdist, commit, torch, tdef.name if tdef else None, ref.name,
                         classes, repo.base_tree, result.final_tree, entry)


def _plain_url(url: str) -> str:
    """The URL without credentials (the lock records it so; downloads go through the index first)."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _entry_table(lock: Lock, pin: Pin, release: Release, base_tree: str, patched: str | None,
                 ref: Pin) -> Any:
    entry = tomlkit.table()
    entry.add(tomlkit.comment(f"Added by `dsv4patch releases` from the index (series and settings of {ref.name})."))
    entry["vllm_version"] = pin.vllm_version
    if pin.toolchain is not None:
        entry["toolchain"] = pin.toolchain.name
    # The sdist records only a commit prefix (vllm/_version.py); its sha256 is the trust anchor.
    entry["commit" if len(pin.commit) == 40 else "commit_abbrev"] = pin.commit
    if pin.cuda_arch_list is not None:
        entry["cuda_arch_list"] = list(pin.cuda_arch_list)
    entry["series"] = list(pin.series)
    entry["expect"] = pin.expect
    entry["base_tree"] = base_tree
    if patched is not None:
        entry["patched_tree"] = patched
    if pin.expect_patches:
        entry["expect_patches"] = dict(pin.expect_patches)
    if pin.variants:
        entry["variants"] = {n: os.path.relpath(p, lock.path.parent) for n, p in pin.variants.items()}
    src = tomlkit.table()
    src["kind"], src["name"], src["version"] = "pypi-sdist", PROJECT, pin.vllm_version
    src["sha256"], src["url"] = pin.source.sha256, pin.source.url
    if pin.source.size is not None:
        src["size"] = pin.source.size
    entry["source"] = src
    wheels = tomlkit.table()
    for plat in ("x86_64", "aarch64"):
        if plat in release.wheels and release.wheels[plat][1].sha256:
            w = release.wheels[plat][1]
            item = tomlkit.inline_table()
            item["url"], item["sha256"] = _plain_url(w.url), w.sha256
            if w.size is not None:
                item["size"] = w.size
            wheels[plat] = item
    if wheels:
        entry["wheels"] = wheels
    if ref.build != type(ref.build)():
        entry["build"] = {"max_jobs": ref.build.max_jobs, "nvcc_threads": ref.build.nvcc_threads}
    return entry


def _entry(lock: Lock, pin: Pin, release: Release, base_tree: str, patched: str | None, ref: Pin) -> str:
    doc = tomlkit.document()
    doc.add("pins", tomlkit.table(is_super_table=True))
    doc["pins"][pin.name] = _entry_table(lock, pin, release, base_tree, patched, ref)
    return tomlkit.dumps(doc).strip() + "\n"


def write_entry(lock_path: Path, report: ReleaseReport) -> ReleaseReport:
    """Add ``report``'s entry to the lock file (layout and comments kept); only a settled one.

    The entry is parsed back with the rest of the lock before the file is
    replaced, so a lock that would not load is never written.
    """
    if report.decision != ADOPT or report.entry is None:
        raise LockFileError(f"vLLM {report.version} is not settled ({report.decision}: {report.detail}); "
                            "its entry is not written")
    text = read_lock_text(Path(lock_path))
    doc = tomlkit.parse(text)
    if report.version in doc["pins"]:
        raise LockFileError(f"{lock_path}: pin {report.version!r} exists already")
    new = tomlkit.parse(report.entry)
    doc["pins"][report.version] = new["pins"][report.version]
    out = tomlkit.dumps(doc)
    tmp = Path(lock_path).with_name(f".{Path(lock_path).name}.releases-tmp")
    safeio.atomic_write(tmp, out, durable=False)  # a new file: a link planted at the name is replaced
    try:
        load_lock(tmp)  # the whole lock, with the new entry, must load (paths resolve beside the lock)
        os.replace(tmp, lock_path)
    finally:
        tmp.unlink(missing_ok=True)
    return replace(report, written=True)
