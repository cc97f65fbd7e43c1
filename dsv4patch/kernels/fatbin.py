"""What device code a CUDA library carries, read with ``cuobjdump``.

The plugin wheel must run on every GPU the stock vLLM wheel runs the same
kernels on.  That is a property of the built binaries, not of the flags we
meant to pass, so it is checked on the binaries: for each kernel (by mangled
name) the SASS archs of the cubins that define it, and the PTX archs whose PTX
has it as an ``.entry``.

``--list-elf`` / ``--list-ptx`` name the embedded files, but ``--list-elf``
drops the family suffix (a ``sm_100f`` cubin is listed as ``...sm_100.cubin``),
so the arch of each cubin is taken from the ``arch =`` header that
``--dump-elf-symbols`` prints before its symbol table.

``cuobjdump`` ships with the CUDA toolkit and as the ``nvidia-cuda-cuobjdump``
wheel (``nvidia/cu13/bin/cuobjdump``); :func:`find_cuobjdump` looks in both.
"""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dsv4patch import childproc
from dsv4patch.errors import BuildError

_ARCH_LINE = re.compile(r"^arch = (sm_\d+[af]?)\s*$")
_ENTRY = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([\w$.]+)")


def find_cuobjdump(nvcc: Path | None = None) -> Path | None:
    """``cuobjdump`` on PATH, next to ``nvcc``, or from an ``nvidia-cuda-cuobjdump`` wheel."""
    cands: list[Path] = []
    if shutil.which("cuobjdump"):
        cands.append(Path(str(shutil.which("cuobjdump"))))
    if nvcc is not None:
        cands += [nvcc.parent / "cuobjdump", nvcc.resolve().parent / "cuobjdump"]
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        if base.is_dir():
            cands += sorted(base.glob("*/bin/cuobjdump"), reverse=True)
    return next((c for c in cands if c.is_file()), None)


def sm_to_arch(sm: str) -> str:
    """``sm_100f`` -> ``10.0f``, ``compute_75`` -> ``7.5`` (CMake's spelling)."""
    m = re.fullmatch(r"(?:sm|compute)_(\d+)(\d)([af]?)", sm)
    if not m:
        raise ValueError(f"not a CUDA arch name: {sm!r}")
    return f"{m.group(1)}.{m.group(2)}{m.group(3)}"


@dataclass
class Fatbin:
    """Device code of one library: per mangled kernel name, its SASS and PTX archs."""

    path: Path
    elf_files: list[str] = field(default_factory=list)  # --list-elf names
    ptx_files: list[str] = field(default_factory=list)  # --list-ptx names
    sass: dict[str, set[str]] = field(default_factory=dict)  # kernel -> archs ("10.0f")
    ptx: dict[str, set[str]] = field(default_factory=dict)  # kernel -> PTX archs

    def archs(self, pattern: str) -> tuple[set[str], set[str]]:
        """(SASS archs, PTX archs) over every kernel whose mangled name matches ``pattern``."""
        rx = re.compile(pattern)
        sass = {a for k, v in self.sass.items() if rx.search(k) for a in v}
        ptx = {a for k, v in self.ptx.items() if rx.search(k) for a in v}
        return sass, ptx

    def kernels(self, pattern: str) -> set[str]:
        rx = re.compile(pattern)
        return {k for k in (*self.sass, *self.ptx) if rx.search(k)}


CUOBJDUMP_DEADLINE = 1800.0  # seconds one cuobjdump run over a library may take
LISTING_LIMIT = 256 << 20  # bytes of a listing kept (symbols of a large library are tens of MB)


def _run(cuobjdump: Path, *args: str) -> str:
    res = childproc.run([str(cuobjdump), *args], deadline=CUOBJDUMP_DEADLINE, what=f"cuobjdump {args[0]}",
                        keep=LISTING_LIMIT, flood=LISTING_LIMIT)
    if res.returncode != 0:
        raise BuildError(f"`cuobjdump {' '.join(args)}` failed ({res.status()}): {res.stderr.strip()[-1000:]}")
    return res.stdout


def read(cuobjdump: Path, lib: Path) -> Fatbin:
    """Everything :class:`Fatbin` holds, from four cuobjdump runs over ``lib``."""
    fb = Fatbin(Path(lib))
    listing = _run(cuobjdump, "--list-elf", "--list-ptx", str(lib))
    for line in listing.splitlines():
        m = re.match(r"^(ELF|PTX) file\s+\d+:\s+(\S+)", line)
        if m:
            (fb.elf_files if m.group(1) == "ELF" else fb.ptx_files).append(m.group(2))
    arch = None
    for line in _run(cuobjdump, "--dump-elf-symbols", str(lib)).splitlines():
        m = _ARCH_LINE.match(line)
        if m:
            arch = sm_to_arch(m.group(1))
        elif arch and " FUNC " in f" {line} ":
            name = line.split()[-1]
            # Kernels only: device functions are local symbols, kernels global ones.
            if "GLOBAL" in line.split():
                fb.sass.setdefault(name, set()).add(arch)
    if fb.ptx_files:
        # Streamed, nothing kept: a big library has hundreds of MB of PTX.
        scan = _PtxEntries(fb)
        res = childproc.run([str(cuobjdump), "--dump-ptx", str(lib)], deadline=CUOBJDUMP_DEADLINE,
                            what="cuobjdump --dump-ptx", keep=4096, on_chunk=scan)
        if res.returncode != 0:
            raise BuildError(f"`cuobjdump --dump-ptx {lib}` failed ({res.status()})")
        scan.finish()
    return fb


_LINE = 1 << 20  # a line longer than this (never in PTX) is scanned in pieces of about this size


class _PtxEntries:
    """``cuobjdump --dump-ptx`` as it streams (:func:`childproc.run`'s ``on_chunk``): each PTX file's arch
    (its ``arch =`` line) and the ``.entry`` kernels after it, into ``fb.ptx``.

    The stock 0.27.1 library prints 219 MB of PTX in 9.7 million lines, of which about 2,000 are
    ``arch =`` or ``.entry`` lines: only the lines holding either (found with ``bytes.find``) are
    decoded and matched, so the others never cost a Python call (they took seconds of CPU a read).
    """

    def __init__(self, fb: Fatbin) -> None:
        self.fb = fb
        self.arch: str | None = None
        self.partial = b""  # the last line so far, not yet ended by a newline

    def __call__(self, chunk: bytes) -> None:
        data = self.partial + chunk
        end = data.rfind(b"\n") + 1
        if len(data) - end > _LINE:  # one endless line: scanned as it is
            end = len(data)
        self.partial = data[end:]
        self._scan(data[:end])

    def finish(self) -> None:
        """The output ended: its last line, if no newline ended it."""
        self._scan(self.partial)
        self.partial = b""

    def _scan(self, text: bytes) -> None:
        starts: set[int] = set()
        for needle in (b"arch = ", b".entry"):  # no line without one of them can match either pattern
            at = text.find(needle)
            while at >= 0:
                starts.add(text.rfind(b"\n", 0, at) + 1)
                at = text.find(needle, at + len(needle))
        for start in sorted(starts):
            stop = text.find(b"\n", start)
            line = text[start:len(text) if stop < 0 else stop].decode("utf-8", errors="replace") + "\n"
            m = _ARCH_LINE.match(line)
            if m:
                self.arch = sm_to_arch(m.group(1))
                continue
            m = _ENTRY.match(line)
            if m and self.arch:
                self.fb.ptx.setdefault(m.group(1), set()).add(self.arch)
