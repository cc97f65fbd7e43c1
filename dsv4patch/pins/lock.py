"""The lock file: pinned vLLM trees, where each comes from, and what is expected.

``locks/vllm.toml`` is the single source of truth for a build.  This module
turns it into frozen dataclasses and refuses anything it does not understand
(unknown keys, wrong types, a commit that is not 40 hex digits...), naming the
file, the pin and the key.  Derived fields (download URL and size, base and
patched tree ids) are written back only by ``dsv4patch lock --update``
through :func:`update_derived`, which keeps comments and layout.
"""

from __future__ import annotations

import enum
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

from dsv4patch import safeio
from dsv4patch.errors import LockFileError, ParameterError, did_you_mean, param
from dsv4patch.nextstep import Step, mention
from dsv4patch.records import frozen

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HEX40 = re.compile(r"^[0-9a-f]{40}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
HEXABBREV = re.compile(r"^[0-9a-f]{7,39}$")
PIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
# What a lock may expect of a patch on a pin (see engine.Status).
EXPECTABLE = ("clean", "offset", "upstream", "already-applied", "conflict", "missing-file")
ARCH = re.compile(r"^\d+\.\d+[af]?(\+PTX)?$")
WHEEL_PLATFORMS = ("x86_64", "aarch64")


MAX_FILE_SIZE = 1 << 40  # a pinned file's size in the lock: at most 1 TiB (vLLM's sdist ~40 MB, wheels ~400 MB)

@frozen
class Source:
    kind: str
    # pypi-sdist
    name: str = ""
    version: str = ""
    sha256: str = ""
    size: int | None = None
    url: str = ""
    # git / local
    path: Path | None = None



@frozen
class WheelFile:
    """The pin's stock vLLM wheel on PyPI for one platform (verified by sha256)."""

    platform: str  # "x86_64" / "aarch64"
    url: str
    sha256: str
    size: int | None = None


@frozen
class BuildSettings:
    max_jobs: int = 2
    nvcc_threads: int = 1


@frozen
class ToolchainDef:
    """A ``[toolchains.NAME]`` table: the kernel build toolchain a pin's torch needs.

    ``requirements`` is a pip requirements file beside the lock with every
    package pinned and hashed (torch, nvidia-cublas for its headers, the CUDA
    toolkit wheels); :mod:`dsv4patch.kernels.toolchain` installs from it with
    ``--require-hashes``.
    """

    name: str
    torch: str  # the torch version, as the pin's requirements/cuda.txt pins it
    cuda: str  # CUDA major.minor of that torch's PyPI build; nvcc's major must match
    requirements: Path
    # The lowest C++ standard that torch's headers compile with (torch 2.14: 20); None: the
    # one dsv4patch.kernels.toolchain knows for that torch.  The build uses the higher of it and the
    # tree's CMAKE_CUDA_STANDARD.
    cxx_standard: int | None = None
    defines: tuple[str, ...] = ()  # -D macros torch's headers need, as NAME or NAME=VALUE


@frozen
class SeriesDef:
    name: str
    path: Path  # the series file
    description: str = ""
    default: bool = True  # enabled on a pin unless the pin lists its series explicitly


@frozen
class Pin:
    name: str
    vllm_version: str
    commit: str  # 40 hex, or a prefix for sdist pins locked with commit_abbrev
    source: Source
    # TORCH_CUDA_ARCH_LIST for the kernel build; None: the tree's release list (kernels/sources.py)
    cuda_arch_list: tuple[str, ...] | None
    series: tuple[str, ...]
    expect: str
    expect_patches: dict[str, str] = field(default_factory=dict)
    variants: dict[str, Path] = field(default_factory=dict)
    base_tree: str | None = None
    patched_tree: str | None = None
    build: BuildSettings = BuildSettings()
    wheels: dict[str, WheelFile] = field(default_factory=dict)  # platform -> stock wheel
    toolchain: ToolchainDef | None = None  # the kernel build toolchain ([toolchains.*])
    # The pin's own series from the lock where the run chose others (Lock.with_series); None: ``series``
    # are its own.  Its variants are checked against these: a variant no series of the pin contains is
    # the lock's error, one of a patch outside the run's series is just not used.
    own_series: tuple[str, ...] | None = None

    @property
    def lock_series(self) -> tuple[str, ...]:
        """The series the lock gives the pin, whichever series the run uses."""
        return self.series if self.own_series is None else self.own_series

    def expected_status(self, patch_name: str) -> str:
        return self.expect_patches.get(patch_name, self.expect)


@frozen
class WatchSettings:
    """``[watch]``: which releases on the index the release watcher (``dsv4patch releases``) reports.

    ``since``: releases before it are not looked at (default: the oldest pinned
    release); ``ignore``: version -> why it is not pinned (a decision taken).
    """

    since: str | None = None
    ignore: dict[str, str] = field(default_factory=dict)


# The parameters a pin's name is given by (Lock.pin's given_as): pins the command runs on, port's source, verify's
# upstream release.
PinParameter = Literal["pin", "from_pin", "upstream_from"]
_PIN_PARAMETERS: dict[str, str] = {"pin": param("pin"), "from_pin": param("from_pin"),
                                   "upstream_from": param("upstream_from")}


@frozen
class Lock:
    path: Path
    default_pin: str
    series: dict[str, SeriesDef]
    pins: dict[str, Pin]
    toolchains: dict[str, ToolchainDef] = field(default_factory=dict)
    watch: WatchSettings = WatchSettings()

    def pin(self, name: str | None, *, given_as: PinParameter | None = "pin") -> Pin:
        """The pin ``name``, else the lock's default.  A ``name`` the lock lacks is a wrong value of the
        caller's parameter ``given_as`` (exit 2, the nearest pin names suggested); with ``given_as=None``
        (a name read from a state file or a lock just written) it is the lock that lacks it (exit 3)."""
        chosen = name or self.default_pin
        found = self.pins.get(chosen)
        if found is not None:
            return found
        text = (f"{chosen!r}: no such pin in {self.path}; its pins are: {', '.join(self.pins)}"
                + did_you_mean([chosen], list(self.pins), most=2, quote=True))
        if name and given_as:
            raise ParameterError(f"{_PIN_PARAMETERS[given_as]} {text}")
        raise LockFileError(f"pin {text}")

    @property
    def project(self) -> Path:
        """The project the lock belongs to (:func:`project_root`): its series files and variants must lie in
        it (read through :func:`dsv4patch.safeio.open_beneath`: no link below it)."""
        return project_root(self.path)

    def select(self, names: list[str] | None) -> list[Pin]:
        if not names:
            return list(self.pins.values())
        return [self.pin(n) for n in names]

    def with_series(self, chosen: list[str] | tuple[str, ...] | None) -> Lock:
        """This lock with every pin running ``chosen`` series instead of its own.

        The lock's patched_tree is then not compared (it was recorded for the
        pin's own series); a pin's variants of patches outside ``chosen`` are not used, and are
        still checked against its own series (:attr:`Pin.lock_series`)."""
        if not chosen:
            return self
        unknown = [s for s in chosen if s not in self.series]
        if unknown:
            raise LockFileError(f"{param('series')} {', '.join(unknown)}: {self.path} has no such [series.*] table "
                                f"(it has {', '.join(self.series)})")
        pins = {n: replace(p, series=tuple(chosen), patched_tree=None, own_series=p.lock_series) for n, p in self.pins.items()}
        return replace(self, pins=pins)


DEFAULT_LOCK = Path("locks/vllm.toml")


def find_lock(given: Path | None, cwd: Path | None = None) -> Path:
    """``given``, else ``locks/vllm.toml`` here or in a parent directory.

    So the card's ``dsv4patch apply`` works from any subdirectory of a checkout.  (A
    command passes ``--lock``, else ``$DSV4PATCH_LOCK``, as ``given``.)"""
    if given is not None:
        return given
    start = Path(os.path.abspath(cwd or Path.cwd()))
    for d in (start, *start.parents):
        if (d / DEFAULT_LOCK).is_file():
            return d / DEFAULT_LOCK
    raise ParameterError(
        f"no lock file: {DEFAULT_LOCK} is not in {start} or any parent directory; pass {param('lock')} FILE "
        "or set DSV4PATCH_LOCK"
    )


def project_root(lock_path: Path) -> Path:
    """The project a lock belongs to, where relative defaults (a tree under ``vllm-src/``, wheels in
    ``dist/``) go, wherever the command runs from, as git puts things in the repository it found:
    the directory holding the lock's ``locks/`` directory (``<root>/locks/vllm.toml``), else the
    lock's own directory."""
    parent = Path(os.path.abspath(lock_path)).parent
    return parent.parent if parent.name == DEFAULT_LOCK.parent.name else parent


def open_lock(given: Path | None, series: list[str] | tuple[str, ...] | None = None) -> Lock:
    """Find (:func:`find_lock`) and load the lock, with ``series`` chosen instead of each pin's own."""
    return load(find_lock(given)).with_series(series)


_T = TypeVar("_T")
_D = TypeVar("_D")


class _Required(enum.Enum):
    """The default of a key that must be present (a value None cannot stand for)."""

    KEY = 0


MAX_BUILD_JOBS = 256  # parallel compiles a lock may ask for (a node's cores, not a fork bomb)
MAX_NVCC_THREADS = 64


def checked_path(value: str, where: str) -> str:
    """``value`` if it has no NUL or other control character (C0, DEL, C1); else a :class:`LockFileError`
    naming ``where``."""
    bad = next((c for c in value if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0), None)
    if bad is not None:
        raise LockFileError(f"{where} = {value!r}: the path contains a NUL/control character ({bad!r}); "
                            "a path in a lock is plain text")
    return value


class LockTable:
    """Typed access to one TOML table with the error context for messages."""

    def __init__(self, lock_path: Path, where: str, data: object, allowed: set[str]) -> None:
        if not isinstance(data, dict):
            raise LockFileError(f"{lock_path}: {where} must be a table")
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise LockFileError(
                f"{lock_path}: unknown key(s) {', '.join(unknown)} in {where}; "
                f"allowed: {', '.join(sorted(allowed))}"
            )
        self.lock_path, self.where = lock_path, where
        self.data: dict[str, object] = data

    @overload
    def get(self, key: str, typ: type[_T]) -> _T: ...
    @overload
    def get(self, key: str, typ: type[_T], default: _D) -> _T | _D: ...

    def get(self, key: str, typ: type[_T], default: object = _Required.KEY) -> object:
        if key not in self.data:
            if default is _Required.KEY:
                raise LockFileError(f"{self.lock_path}: missing key {key!r} in {self.where}")
            return default
        value = self.data[key]
        if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
            raise LockFileError(
                f"{self.lock_path}: {self.where}.{key} must be {typ.__name__}, got {value!r}"
            )
        return value

    def count(self, key: str, default: int, most: int) -> int:
        """An optional whole number in ``1..most`` (a job or thread count: 0, negative or huge is refused)."""
        value = self.get(key, int, default)
        if not 1 <= value <= most:
            raise LockFileError(f"{self.lock_path}: {self.where}.{key} must be between 1 and {most}, got {value}")
        return value

    def byte_size(self, key: str) -> int | None:
        """An optional size in bytes, 1 byte to 1 TiB (a download's bound: negative, zero or absurd is refused)."""
        value = self.get(key, int, None)
        if value is not None and not 1 <= value <= MAX_FILE_SIZE:
            raise LockFileError(f"{self.lock_path}: {self.where}.{key} must be a size in bytes between 1 and "
                                f"{MAX_FILE_SIZE}, got {value}")
        return value

    def path(self, key: str) -> str:
        """``key``'s value, a path (relative to the lock, or absolute): a string with no NUL or other control
        character (one would reach the file system as an internal ValueError, or name a file no one can
        type)."""
        return checked_path(self.get(key, str), f"{self.lock_path}: {self.where}.{key}")

    @overload
    def hexid(self, key: str, pattern: re.Pattern[str], what: str) -> str: ...
    @overload
    def hexid(self, key: str, pattern: re.Pattern[str], what: str, default: None) -> str | None: ...

    def hexid(self, key: str, pattern: re.Pattern[str], what: str,
              default: None | _Required = _Required.KEY) -> str | None:
        if key not in self.data:
            # optional and absent: the default; required: get names the missing key
            return self.get(key, str) if default is _Required.KEY else default
        value = self.get(key, str)
        if not pattern.match(value):
            raise LockFileError(
                f"{self.lock_path}: {self.where}.{key} = {value!r} is not {what} "
                f"(lowercase hex); copy the full value, or run `{mention(Step.of('lock', update=True))}` "
                "for derived fields"
            )
        return value


# The most of a lock file dsv4patch reads (the repository's is about 15 KiB): docs/trust.md "Bounds".
LOCK_LIMIT = 16 << 20


def read_lock_bytes(path: Path) -> bytes:
    """The lock file's bytes, through :mod:`dsv4patch.safeio`: a regular file (never a FIFO or a device:
    no read blocks or runs on), at most :data:`LOCK_LIMIT` bytes.  A link the user names as the lock
    (``--lock``, ``DSV4PATCH_LOCK``, ``locks/vllm.toml``) is followed, as for any file named on the
    command line; what it reaches must be a regular file.  Every reader of a lock goes through here."""
    path = Path(path)
    try:
        return safeio.read_bytes(path, LOCK_LIMIT, error=LockFileError, what=f"{path}: the lock file", follow=True)
    except FileNotFoundError:
        raise LockFileError(f"{path}: lock file not found (pass {param('lock')} PATH)") from None
    except OSError as exc:
        raise LockFileError(f"{path}: cannot read lock file: {exc.strerror or exc}") from None


def read_lock_text(path: Path) -> str:
    """:func:`read_lock_bytes` decoded: a lock file is TOML in UTF-8."""
    raw = read_lock_bytes(path)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LockFileError(
            f"{path}: not UTF-8 text (byte {exc.start}); a lock file is TOML in UTF-8"
        ) from None


def load(path: Path) -> Lock:
    path = Path(path)
    text = read_lock_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # The message carries "(at line L, column C)".
        raise LockFileError(f"{path}: malformed TOML: {exc}") from None
    except RecursionError:
        # tomllib parses nested arrays and inline tables recursively: 100,000 `[` is not a crash.
        raise LockFileError(f"{path}: arrays or inline tables nested too deep; a lock file nests a few "
                            "levels (a pin's tables), refused") from None
    return parse(path, data)


def parse(path: Path, data: dict[str, Any]) -> Lock:
    base = path.resolve().parent  # relative paths are the lock file's, also when ``path`` is a link to it
    top = LockTable(path, "the top level", data, {"schema", "default_pin", "series", "pins", "toolchains", "watch"})
    schema = top.get("schema", int)
    if schema != 1:
        raise LockFileError(f"{path}: schema = {schema} is not supported (this dsv4patch reads 1)")
    series_tab = top.get("series", dict)
    series: dict[str, SeriesDef] = {}
    for name, raw in series_tab.items():
        t = LockTable(path, f"[series.{name}]", raw, {"path", "description", "default"})
        series[name] = SeriesDef(
            name=name,
            path=(base / t.path("path")).resolve(),
            description=t.get("description", str, ""),
            default=t.get("default", bool, True),
        )
    toolchains = {name: _parse_toolchain(path, name, raw)
                  for name, raw in top.get("toolchains", dict, {}).items()}
    pins_tab = top.get("pins", dict)
    if not pins_tab:
        raise LockFileError(f"{path}: [pins] is empty; add at least one pin")
    pins = {name: _parse_pin(path, name, raw, series, toolchains) for name, raw in pins_tab.items()}
    default_pin = top.get("default_pin", str, next(iter(pins)))
    if default_pin not in pins:
        raise LockFileError(f"{path}: default_pin = {default_pin!r} is not a pin of this lock")
    return Lock(path=path.resolve(), default_pin=default_pin, series=series, pins=pins, toolchains=toolchains,
                watch=_parse_watch(path, top.get("watch", dict, {})))


def _parse_watch(path: Path, raw: object) -> WatchSettings:
    t = LockTable(path, "[watch]", raw, {"since", "ignore"})
    since = t.get("since", str, None)
    if since is not None and not VERSION.match(since):
        raise LockFileError(f"{path}: [watch].since = {since!r} is not a release such as \"0.26.0\"")
    ignore = t.get("ignore", dict, {})
    for version, why in ignore.items():
        if not isinstance(why, str) or not why.strip():
            raise LockFileError(f"{path}: [watch].ignore.\"{version}\" must say why the release is not "
                                f"pinned (a string), got {why!r}")
    return WatchSettings(since=since, ignore=dict(ignore))


def valid_pin_name(name: str) -> bool:
    """Pin names become parts of file names and branches: no '/', spaces or '..'."""
    return bool(PIN_NAME.match(name)) and ".." not in name


VERSION = re.compile(r"^\d+(\.\d+)+$")
CXX_STANDARDS = (17, 20, 23)
DEFINE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.]*)?$")


def _parse_toolchain(path: Path, name: str, raw: object) -> ToolchainDef:
    where = f'[toolchains."{name}"]'
    t = LockTable(path, where, raw, {"torch", "cuda", "requirements", "cxx_standard", "defines"})
    torch, cuda = t.get("torch", str), t.get("cuda", str)
    for key, value in (("torch", torch), ("cuda", cuda)):
        if not VERSION.match(value):
            raise LockFileError(f"{path}: {where}.{key} = {value!r} is not a version such as \"2.13.0\"")
    req = (path.resolve().parent / t.path("requirements")).resolve()
    std = t.get("cxx_standard", int, None)
    if std is not None and std not in CXX_STANDARDS:
        raise LockFileError(f"{path}: {where}.cxx_standard = {std!r}; one of "
                            f"{', '.join(map(str, CXX_STANDARDS))} (the N of -std=c++N)")
    defines = t.get("defines", list, [])
    for d in defines:
        # Only macros reach nvcc from the lock: never an option that names a program or a path.
        if not (isinstance(d, str) and DEFINE.match(d)):
            raise LockFileError(f"{path}: {where}.defines has {d!r}; each entry is a macro NAME or "
                                "NAME=VALUE (letters, digits, '_', '.'), passed to nvcc as -DNAME")
    return ToolchainDef(name=name, torch=torch, cuda=cuda, requirements=req, cxx_standard=std,
                        defines=tuple(defines))


_PIN_KEYS = {
    "vllm_version", "commit", "commit_abbrev", "source", "cuda_arch_list", "series", "expect",
    "expect_patches", "variants", "base_tree", "patched_tree", "build", "wheels",
    "toolchain",
}


def _parse_pin(path: Path, name: str, raw: object, series: dict[str, SeriesDef],
               toolchains: dict[str, ToolchainDef] | None = None) -> Pin:
    """One ``[pins."name"]`` table, each key checked in the order the table reads (the first
    problem is the one reported)."""
    where = f'[pins."{name}"]'
    if not valid_pin_name(name):
        # Pin names become parts of file names (cache, variants, branches).
        raise LockFileError(
            f"{path}: pin name {name!r} is not allowed; use letters, digits, '.', '_', '+' "
            "and '-' (no '/', spaces or '..'), e.g. \"0.27.1\""
        )
    t = LockTable(path, where, raw, _PIN_KEYS)
    src = _parse_source(path, f'[pins."{name}".source]', t.get("source", dict))
    commit = _pin_commit(t, src)
    arch = _pin_arch(t, path, where)
    series_names = _pin_series(t, path, where, series)
    expect, expect_patches = _pin_expect(t, path, where)
    variants = _pin_variants(t, path, where)
    bt = LockTable(path, f"{where}.build", t.get("build", dict, {}), {"max_jobs", "nvcc_threads"})
    toolchain = _pin_toolchain(t, path, where, toolchains or {})
    return Pin(
        name=name,
        vllm_version=t.get("vllm_version", str),
        commit=commit,
        source=src,
        cuda_arch_list=tuple(arch) if arch is not None else None,
        series=tuple(series_names),
        expect=expect,
        expect_patches=expect_patches,
        variants=variants,
        base_tree=t.hexid("base_tree", HEX40, "a 40-hex tree id", None),
        patched_tree=t.hexid("patched_tree", HEX40, "a 40-hex tree id", None),
        build=BuildSettings(
            max_jobs=bt.count("max_jobs", 2, MAX_BUILD_JOBS), nvcc_threads=bt.count("nvcc_threads", 1, MAX_NVCC_THREADS)
        ),
        wheels=_parse_wheels(path, f"{where}.wheels", t.get("wheels", dict, {})),
        toolchain=toolchain,
    )


def _pin_commit(t: LockTable, src: Source) -> str:
    """The pin's commit: a full id, or (an sdist pin only) the prefix its sdist names."""
    if "commit" not in t.data and "commit_abbrev" in t.data and src.kind == "pypi-sdist":
        # Only the sdist's 9-hex prefix is known (no access to the git host to
        # resolve it); the sdist sha256 stays the trust anchor.
        return t.hexid("commit_abbrev", HEXABBREV, "a 7..39-hex commit prefix")
    return t.hexid("commit", HEX40, "a full 40-hex commit id")


def _pin_arch(t: LockTable, path: Path, where: str) -> list[str] | None:
    """``cuda_arch_list``: None (vLLM's release archs) or a non-empty list of arch names."""
    arch = t.get("cuda_arch_list", list, None)
    if arch is not None and (not arch or not all(isinstance(a, str) and ARCH.match(a) for a in arch)):
        raise LockFileError(
            f"{path}: {where}.cuda_arch_list must be like [\"9.0a\", \"10.0f\", \"12.0+PTX\"]; "
            "leave it out to build for the archs vLLM's release wheels use"
        )
    return arch


def _pin_series(t: LockTable, path: Path, where: str, series: dict[str, SeriesDef]) -> list[str]:
    """``series``: names of ``[series.*]`` tables (default: the default series)."""
    default_series = [s.name for s in series.values() if s.default]
    series_names = t.get("series", list, default_series)
    for s in series_names:
        if not isinstance(s, str):
            raise LockFileError(f"{path}: {where}.series must be a list of series names, got {s!r}")
        if s not in series:
            raise LockFileError(
                f"{path}: {where}.series names {s!r}, which is not a [series.*] table"
            )
    return series_names


def _pin_expect(t: LockTable, path: Path, where: str) -> tuple[str, dict[str, str]]:
    """``expect`` and ``expect_patches``: statuses a check may expect."""
    expect = t.get("expect", str, "clean")
    if expect not in EXPECTABLE:
        raise LockFileError(f"{path}: {where}.expect = {expect!r}; one of {', '.join(EXPECTABLE)}")
    expect_patches = dict(t.get("expect_patches", dict, {}))
    for patch, status in expect_patches.items():
        if status not in EXPECTABLE:
            raise LockFileError(
                f"{path}: {where}.expect_patches.{patch} = {status!r}; one of {', '.join(EXPECTABLE)}"
            )
    return expect, expect_patches


def _pin_variants(t: LockTable, path: Path, where: str) -> dict[str, Path]:
    """``variants``: patch name -> variant file, relative to the lock."""
    raw_variants = t.get("variants", dict, {})
    for k, v in raw_variants.items():
        if not isinstance(v, str) or not v:
            raise LockFileError(
                f"{path}: {where}.variants.{k} must be a path (string) to the variant patch "
                f"file, relative to the lock, got {v!r}"
            )
    return {k: (path.resolve().parent / checked_path(v, f"{path}: {where}.variants.{k}")).resolve()
            for k, v in raw_variants.items()}


def _pin_toolchain(t: LockTable, path: Path, where: str,
                   toolchains: dict[str, ToolchainDef]) -> ToolchainDef | None:
    """``toolchain``: the name of a ``[toolchains.*]`` table, or none."""
    tc_name = t.get("toolchain", str, None)
    if tc_name is not None and tc_name not in toolchains:
        raise LockFileError(f"{path}: {where}.toolchain = {tc_name!r} is not a [toolchains.*] table "
                            f"(the lock has {', '.join(toolchains) or 'none'})")
    return toolchains[tc_name] if tc_name is not None else None


def _parse_wheels(path: Path, where: str, raw: dict[str, Any]) -> dict[str, WheelFile]:
    unknown = sorted(set(raw) - set(WHEEL_PLATFORMS))
    if unknown:
        raise LockFileError(
            f"{path}: {where} has platform(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(WHEEL_PLATFORMS)}"
        )
    wheels = {}
    for plat, entry in raw.items():
        t = LockTable(path, f"{where}.{plat}", entry, {"url", "sha256", "size"})
        wheels[plat] = WheelFile(
            platform=plat, url=download_url(path, f"{where}.{plat}", t.get("url", str)),
            sha256=t.hexid("sha256", HEX64, "a 64-hex sha256"), size=t.byte_size("size"),
        )
    return wheels


def download_url(path: Path, where: str, url: str) -> str:
    """A lock URL dsv4patch downloads from: http(s) to a host only (urllib also opens file:, ftp:)."""
    from dsv4patch.urls import http_url_problem, redact

    problem = http_url_problem(url) if url else None
    if problem:
        raise LockFileError(f"{path}: {where}.url = {redact(url)!r} is refused: {problem}; use the "
                            "https:// URL of the file on the package index")
    return url


def _parse_source(path: Path, where: str, raw: object) -> Source:
    """The source table, read by its kind (:mod:`dsv4patch.pins.source`)."""
    from dsv4patch.pins.source import kinds, source_kind  # the kinds import this module's types

    kind = raw.get("kind") if isinstance(raw, dict) else None
    if not isinstance(kind, str) or kind not in kinds():
        raise LockFileError(f"{path}: {where}.kind = {kind!r}; one of {', '.join(kinds())}")
    impl = source_kind(kind)
    return impl.parse(LockTable(path, where, raw, {"kind", *impl.keys}))


_URL_SCHEMES = ("https", "ssh", "git+ssh", "ssh+git", "file")
_SCP_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*$")
_SCP_USER = re.compile(r"^[A-Za-z0-9._~-]+$")
_URL_HOST = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9.-]*|\[[0-9A-Fa-f:.]+\])(?::\d+)?$")
_URL_USER = re.compile(r"^[A-Za-z0-9._~%-]+$")


def git_url_problem(url: str) -> str | None:
    """Why ``url`` may not be handed to git as a remote, or None if it may.

    git reads a URL that starts with ``-`` as an option (``--upload-pack=CMD``
    runs CMD) and ``<transport>::<address>`` as a remote helper (``ext::CMD``
    runs CMD), so only plain https/ssh/file URLs, scp-like ``host:path`` and
    local paths pass.
    """
    if not url:
        return "it is empty"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        return "it contains control characters"
    if url.startswith("-"):
        return "it starts with '-', which git would read as an option"
    if "::" in url:
        return "'<transport>::' remote helpers (ext::, fd::, ...) can run commands"
    if "://" in url:
        scheme, rest = url.split("://", 1)
        if scheme.lower() not in _URL_SCHEMES:
            return f"scheme {scheme!r} is not one of {', '.join(_URL_SCHEMES)}"
        return None if scheme.lower() == "file" else _authority_problem(rest)
    if url.startswith("/") or url.startswith("."):
        return None
    head, colon, rest = url.partition(":")
    if colon and "/" not in head:
        # scp-like [user@]host:path (git reads it so when no '/' comes before ':')
        if "@" not in head and "@" in rest:
            # 'user:password@host:path': git takes 'user' for the host and hands the password on as part
            # of the path, into ssh's and git's messages. Neither is ever quoted (redact() shows ***@host)
            return ("its user part holds a password (a ':' before the '@'), which a lock (shared, and printed) "
                    "must not hold, and git would not send either: it reads an scp-like URL up to its first ':' "
                    "as the host; use user@host:path with an ssh key, or an https:// URL with a git credential "
                    "helper (an '@' that belongs to the path: write ssh://host/~/path)")
        user, at, host = head.rpartition("@")
        if not _SCP_HOST.match(host):
            return f"host {host!r} is not a host name"
        if at and not _SCP_USER.match(user):  # never quoted, as in _authority_problem
            return "its user name holds characters other than letters, digits and . _ ~ -"
    return None


def _authority_problem(rest: str) -> str | None:
    """Why the ``[user@]host[:port]`` that starts ``rest`` (a URL after ``scheme://``) is refused, or None.

    The host is what follows the authority's LAST ``@`` (a password may hold ``@``);
    the user part is never quoted: it may be a password, and messages are printed.
    """
    from dsv4patch.urls import slashed_credential

    authority = rest.split("/", 1)[0]
    user, at, host = authority.rpartition("@")
    if not _URL_HOST.match(host) or (not at and slashed_credential(rest)):
        if not at and "@" in rest:  # 'https://user:to/ken@host/', 'https://to/ken@host/': '/' ended the authority early
            return "its host is not a host name, or its user part holds a '/' (a password, which a lock must not hold)"
        return f"host {host!r} is not a host name"
    if at and ":" in user:
        return "it holds a password (user:password@), which a lock (shared, and printed) must not hold"
    if at and not _URL_USER.match(user):
        return "its user name holds characters other than letters, digits and . _ ~ % -"
    return None


def update_derived(path: Path, pin: str, values: Mapping[str, object], source_values: Mapping[str, object]) -> bool:
    """Write derived fields of one pin back into the lock, keeping its layout."""
    import tomlkit  # only lock --update writes TOML (keeps comments and layout)

    doc = tomlkit.parse(read_lock_text(Path(path)))
    table = doc["pins"][pin]
    changed = False
    for key, value in values.items():
        if value is not None and table.get(key) != value:
            table[key] = value
            changed = True
    src = table["source"]
    for key, value in source_values.items():
        if value is not None and src.get(key) != value:
            src[key] = value
            changed = True
    if changed:
        safeio.atomic_write(path, tomlkit.dumps(doc))  # never a half-written lock
    return changed


def set_variant(path: Path, pin: str, patch: str, variant: Path) -> None:
    """Record ``variant`` as pin's variant of ``patch`` (path relative to the lock), keeping layout.

    The variant is made to apply, so the patch is expected ``clean``: its
    ``expect_patches`` entry is removed where the pin's ``expect`` is ``clean``
    already, and set to ``clean`` otherwise (a pin that expects ``upstream``
    keeps a variant of a fix it still needs, e.g. extra 2 on 0.28.0).
    """
    import tomlkit  # writing TOML only (keeps comments and layout); not loaded by read-only commands

    path = Path(path)
    doc = tomlkit.parse(read_lock_text(path))
    table = doc["pins"][pin]
    if "variants" not in table:
        table["variants"] = tomlkit.table()
    table["variants"][patch] = os.path.relpath(Path(variant).resolve(), path.resolve().parent)
    expect = table.get("expect_patches")
    if str(table.get("expect", "clean")) == "clean":
        if expect is not None and patch in expect:
            del expect[patch]
    else:
        if expect is None:
            table["expect_patches"] = expect = tomlkit.table()
        expect[patch] = "clean"
    safeio.atomic_write(path, tomlkit.dumps(doc))
