"""Which kernel translation units and ops the applied patches change.

vLLM builds ``_C_stable_libtorch`` from the source lists in ``CMakeLists.txt``
(``VLLM_STABLE_EXT_SRC`` plus sources appended under an arch condition, such as
``cooperative_topk.cu``).  This module reads those lists instead of knowing
file names: it takes the files a tree's patches changed (``git diff
base..HEAD``), keeps the kernel sources under ``csrc/``, follows ``#include``
transitively from every ``.cu`` of the target to find the units that include
them, and reads the bindings file to name the ops whose implementations those
units define.  Everything is read from the work tree of a clean dsv4patch tree.

It also answers which archs each unit is built for, the way vLLM's release
build decides it: the release ``TORCH_CUDA_ARCH_LIST`` (from the tree's
release pipeline), filtered by ``CUDA_SUPPORTED_ARCHS`` for the nvcc version,
then by the unit's own arch variable (``cuda_archs_loose_intersection``,
ported from ``cmake/utils.cmake``).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import field
from pathlib import Path

from dsv4patch import git
from dsv4patch.errors import BuildError, param
from dsv4patch.records import frozen

TARGET = "_C_stable_libtorch"
SRC_VAR = "VLLM_STABLE_EXT_SRC"
KERNEL_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".cpp", ".cc")
INCLUDE_ROOTS = ("csrc",)

_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


@frozen
class TranslationUnit:
    """One ``.cu`` of the target, the local headers it includes, the archs it builds for."""

    path: str
    target: str
    headers: tuple[str, ...]
    changed: tuple[str, ...]  # the changed files among itself and its headers
    # CMake variable that restricts this unit's archs (e.g. COOPERATIVE_TOPK_ARCHS), if any
    arch_var: str | None = None


@frozen
class Op:
    """A registered op whose CUDA implementation lives in a changed unit."""

    name: str
    function: str
    schema: str
    unit: str
    namespace: str
    guard: str | None = None  # #ifdef macro around its registration


@frozen
class KernelPlan:
    tree: Path
    base: str
    head: str
    tree_id: str
    changed: tuple[str, ...]  # kernel sources changed by the patches
    units: tuple[TranslationUnit, ...]
    ops: tuple[Op, ...]
    bindings: str | None
    defines: dict[str, tuple[str, ...]] = field(default_factory=dict)  # arch var -> -D flags
    torch_target_version: str | None = None
    unmapped: tuple[str, ...] = ()  # changed kernel sources no unit of the target includes
    cuda_standard: int | None = None  # CMAKE_CUDA_STANDARD of the tree's CMakeLists.txt

    def to_dict(self) -> dict[str, object]:
        return {
            "tree": str(self.tree),
            "base": self.base,
            "head": self.head,
            "tree_id": self.tree_id,
            "changed": list(self.changed),
            "units": [
                {"path": u.path, "target": u.target, "changed": list(u.changed),
                 "arch_var": u.arch_var}
                for u in self.units
            ],
            "ops": [{"name": o.name, "function": o.function, "unit": o.unit} for o in self.ops],
            "bindings": self.bindings,
            "unmapped": list(self.unmapped),
        }


def is_kernel_source(path: str) -> bool:
    return path.startswith("csrc/") and path.endswith(KERNEL_SUFFIXES)


def _strip_cmake_comments(text: str) -> str:
    return "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in text.splitlines())


def _enclosed(text: str, start: int, opening: str, closing: str) -> str:
    """Text from ``start`` (just past an opening bracket) to its matching close."""
    depth = 1
    for m in re.compile(f"[{re.escape(opening + closing)}]").finditer(text, start):  # only the brackets
        depth += 1 if m.group() == opening else -1
        if not depth:
            return text[start:m.start()]
    return text[start:len(text) - 1]  # never closed: the rest but its last character, as before


def _calls(text: str, name: str) -> list[tuple[int, str]]:
    """(offset, argument text) of every ``name(...)`` call in CMake ``text``."""
    return [(m.start(), _enclosed(text, m.end(), "(", ")"))
            for m in re.finditer(rf"\b{name}\s*\(", text)]


@frozen
class CMakeTarget:
    sources: tuple[str, ...]  # literal source paths, in list order
    arch_var: dict[str, str]  # source -> arch variable it is restricted to
    arch_lists: dict[str, list[tuple[str | None, tuple[str, ...]]]]  # var -> [(min cuda, archs)]
    defines: dict[str, tuple[str, ...]]  # arch var -> flags added when it is non-empty
    torch_target_version: str | None
    # CUDA_SUPPORTED_ARCHS per nvcc version [(min cuda, archs)]; empty: no filter
    supported: list[tuple[str | None, tuple[str, ...]]] = field(default_factory=list)
    cuda_standard: int | None = None  # set(CMAKE_CUDA_STANDARD N): the C++ standard vLLM compiles CUDA with


_BRANCH = re.compile(r"\b(if|elseif|else)\s*\(")


def _branches(text: str) -> tuple[list[int], list[re.Match[str]]]:
    """Every ``if(``/``elseif(``/``else(`` of ``text`` and where each ends, in order: read once, so
    :func:`_min_cuda_before` looks one up instead of scanning the text before each call again."""
    found = list(_BRANCH.finditer(text))
    return [m.end() for m in found], found


def _min_cuda_before(text: str, off: int, branches: tuple[list[int], list[re.Match[str]]]) -> str | None:
    """The nvcc version the closest enclosing ``if()``/``elseif()`` before ``off`` requires.

    ``None`` for an ``else()`` branch or a condition that does not test
    ``CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL X`` (conditions may span lines).
    ``branches``: :func:`_branches` of ``text``.
    """
    ends, found = branches
    at = bisect.bisect_right(ends, off)  # the branches that end at or before ``off``
    if not at:
        return None
    last = found[at - 1]
    if last.group(1) == "else":
        return None
    cond = _enclosed(text, last.end(), "(", ")")
    v = re.search(r"CMAKE_CUDA_COMPILER_VERSION\}?\s+VERSION_GREATER_EQUAL\s+\"?([\d.]+)", cond)
    return v.group(1) if v else None


def parse_cmake(text: str) -> CMakeTarget:
    """The literal sources of ``VLLM_STABLE_EXT_SRC`` and their arch restrictions."""
    text = _strip_cmake_comments(text)
    branches = _branches(text)
    sources: list[str] = []
    for fn in ("set", "list"):
        for _off, args in _calls(text, fn):
            words = args.split()
            if fn == "set" and words[:1] == [SRC_VAR]:
                items = _STRING.findall(args)
            elif fn == "list" and words[:2] == ["APPEND", SRC_VAR]:
                items = _STRING.findall(args)
            else:
                continue
            sources += [s for s in items if "${" not in s and s not in sources]
    arch_var: dict[str, str] = {}
    for _off, args in _calls(text, "set_gencode_flags_for_srcs"):
        m = re.search(r'SRCS\s+"([^"$]+)"\s+CUDA_ARCHS\s+"\$\{(\w+)\}"', args)
        if m and m.group(2) != "CUDA_ARCHS":
            arch_var[m.group(1)] = m.group(2)
    arch_lists: dict[str, list[tuple[str | None, tuple[str, ...]]]] = {}
    for off, args in _calls(text, "cuda_archs_loose_intersection"):
        m = re.match(r'\s*(\w+)\s+"([^"]*)"', args)
        if not m:
            continue
        # The closest enclosing if()/else() decides the nvcc version this list is for.
        archs = tuple(a for a in m.group(2).split(";") if a)
        arch_lists.setdefault(m.group(1), []).append((_min_cuda_before(text, off, branches), archs))
    supported: list[tuple[str | None, tuple[str, ...]]] = []
    for off, args in _calls(text, "set"):
        m = re.match(r'\s*CUDA_SUPPORTED_ARCHS\s+"([^"]*)"', args)
        if m:
            supported.append((_min_cuda_before(text, off, branches), tuple(a for a in m.group(1).split(";") if a)))
    defines: dict[str, tuple[str, ...]] = {}
    for m in re.finditer(r"\bif\s*\(\s*(\w+)\s*\)\s*list\s*\(\s*APPEND\s+VLLM_GPU_FLAGS\s+([^)]*)\)", text):
        defines[m.group(1)] = tuple(_STRING.findall(m.group(2)))
    ttv = re.search(r"TORCH_TARGET_VERSION=(0x[0-9A-Fa-f]+ULL)", text)
    std = re.search(r"\bset\s*\(\s*CMAKE_CUDA_STANDARD\s+(\d+)\s*\)", text)
    return CMakeTarget(tuple(sources), arch_var, arch_lists, defines, ttv.group(1) if ttv else None,
                       supported, int(std.group(1)) if std else None)


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.replace("+PTX", "")))


def select_arch_list(
    options: list[tuple[str | None, tuple[str, ...]]], cuda_version: str
) -> tuple[str, ...]:
    """The source arch list CMake uses for ``cuda_version`` (its if/elseif/else on the version)."""
    for min_cuda, archs in options:
        if min_cuda is not None and _version_tuple(cuda_version) >= _version_tuple(min_cuda):
            return archs
    for min_cuda, archs in options:
        if min_cuda is None:
            return archs
    return ()


def _major(arch: str) -> str:
    return arch.split(".")[0]


def loose_intersection(src: tuple[str, ...], tgt: tuple[str, ...]) -> tuple[str, ...]:
    """vLLM's ``cuda_archs_loose_intersection`` (cmake/utils.cmake), ``+PTX`` included.

    For each target arch the highest source arch of the same major version that
    is not newer (any major for a ``+PTX`` source); ``a``/``f`` suffixes match
    their base arch, an ``f`` source matches any target of its family.  The steps
    follow cmake's passes in order; each takes what it matched off both lists.
    """
    ptx = {a[:-4] for a in src if a.endswith("+PTX")}
    src_l: list[str] = []
    for a in src:
        base = a[:-4] if a.endswith("+PTX") else a
        if base not in src_l:
            src_l.append(base)
    tgt_l: list[str] = list(tgt)
    out = _suffixed_sources_exact(src_l, tgt_l)
    out += _suffixed_sources(src_l, tgt_l)
    out += _suffixed_targets(src_l, tgt_l)
    out += _best_plain(src_l, tgt_l, ptx)
    final = [a + "+PTX" if a in ptx else a for a in dict.fromkeys(out)]
    return tuple(sorted(final, key=_version_tuple))


def _suffixed_sources_exact(src_l: list[str], tgt_l: list[str]) -> list[str]:
    """A source ``9.0a``/``10.0f`` whose plain arch (``9.0``) is a target: the source."""
    out = []
    for a in list(src_l):
        if a[-1] in "af" and a[:-1] in tgt_l:
            src_l.remove(a)
            tgt_l.remove(a[:-1])
            out.append(a)
    return out


def _suffixed_sources(src_l: list[str], tgt_l: list[str]) -> list[str]:
    """Each other suffixed source: the target of its base with ``a`` or ``f``, or (an ``f``
    source) the first target of its major version; the source is used up either way."""
    out = []
    for a in list(src_l):
        if a[-1] not in "af":
            continue
        src_l.remove(a)
        base = a[:-1]
        if base + "a" in tgt_l:
            tgt_l.remove(base + "a")
            out.append(base + "a")
        elif base + "f" in tgt_l:
            tgt_l.remove(base + "f")
            out.append(base + "f")
        elif a.endswith("f"):
            family = next((t for t in tgt_l if _major(t.rstrip("af")) == _major(base)), None)
            if family is not None:
                tgt_l.remove(family)
                out.append(family)
    return out


def _suffixed_targets(src_l: list[str], tgt_l: list[str]) -> list[str]:
    """A suffixed target whose plain arch is a source: the target."""
    out = []
    for t in list(tgt_l):
        if t[-1] in "af" and t[:-1] in src_l:
            tgt_l.remove(t)
            src_l.remove(t[:-1])
            out.append(t)
    return out


def _best_plain(src_l: list[str], tgt_l: list[str], ptx: set[str]) -> list[str]:
    """For each target left, the highest source not newer than it, of its major version (any
    major for a ``+PTX`` source)."""
    src_l.sort(key=_version_tuple)
    out = []
    for t in tgt_l:
        best = None
        for s in src_l:
            if _version_tuple(s) > _version_tuple(t):
                break
            if s in ptx or _major(s) == _major(t):
                best = s
        if best is not None:
            out.append(best)
    return out


def strip_ptx(archs: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(a[:-4] if a.endswith("+PTX") else a for a in archs))


def cuda_archs(requested: tuple[str, ...], cuda_version: str, cmake: CMakeTarget | None) -> tuple[str, ...]:
    """vLLM's ``CUDA_ARCHS`` for a ``TORCH_CUDA_ARCH_LIST``: ``+PTX`` dropped (vLLM's
    ``clear_cuda_arches`` does), then filtered by ``CUDA_SUPPORTED_ARCHS`` for this nvcc."""
    plain = strip_ptx(requested)
    if cmake is None or not cmake.supported:
        return plain
    return loose_intersection(select_arch_list(cmake.supported, cuda_version), plain)


def unit_archs(unit: TranslationUnit, archs: tuple[str, ...], cuda_version: str,
               cmake: CMakeTarget | None = None) -> tuple[str, ...]:
    """The archs CMake builds ``unit`` for, given the requested ``TORCH_CUDA_ARCH_LIST``.

    Plain sources get ``CUDA_ARCHS``; a source under an arch variable gets that
    variable's loose intersection with it.  A ``+PTX`` entry of the request (which
    vLLM's build drops) is kept here on purpose: the unit's arch of the same base
    version then also gets PTX, so a narrowed lock can still JIT on newer GPUs.
    """
    base = cuda_archs(archs, cuda_version, cmake)
    if unit.arch_var is not None and cmake is not None:
        base = loose_intersection(select_arch_list(cmake.arch_lists.get(unit.arch_var, []), cuda_version), base)
    want_ptx = {a[:-4].rstrip("af") for a in archs if a.endswith("+PTX")}
    return tuple(a + "+PTX" if not a.endswith("+PTX") and a.rstrip("af") in want_ptx else a
                 for a in base)


def split_ptx(archs: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(SASS archs, PTX archs) of a unit arch list (``12.0+PTX`` is both)."""
    sass = [a[:-4] if a.endswith("+PTX") else a for a in archs]
    return sass, [a[:-4] for a in archs if a.endswith("+PTX")]


# Where a vLLM tree records the TORCH_CUDA_ARCH_LIST of its release wheels.
RELEASE_PIPELINE = ".buildkite/release-pipeline.yaml"
DOCKERFILE = "docker/Dockerfile"


@frozen
class ReleaseArchs:
    archs: tuple[str, ...]
    origin: str  # "file: VARIABLE", for reports


def release_arch_list(tree: Path, cuda_version: str | None, machine: str) -> ReleaseArchs:
    """The ``TORCH_CUDA_ARCH_LIST`` vLLM's release wheels for ``machine`` are built with.

    Read from the tree's release pipeline (``CUDA_ARCH_X86`` / ``CUDA_ARCH_AARCH64``,
    the ``_CU129`` lists for nvcc older than 13), else the ``torch_cuda_arch_list``
    default of ``docker/Dockerfile``.
    """
    arch = {"x86_64": "X86", "amd64": "X86", "aarch64": "AARCH64", "arm64": "AARCH64"}.get(machine.lower())
    pipe = Path(tree) / RELEASE_PIPELINE
    if arch and pipe.is_file():
        text = pipe.read_text(encoding="utf-8", errors="replace")
        names = [f"CUDA_ARCH_{arch}"]
        if cuda_version is not None and _version_tuple(cuda_version) < (13,):
            major_minor = "".join(cuda_version.split(".")[:2])
            names = [f"CUDA_ARCH_{arch}_CU{major_minor}", f"CUDA_ARCH_{arch}_CU129", *names]
        for name in names:
            m = re.search(rf'^\s*{name}\s*:\s*["\']?([^"\'\n#]*)', text, re.M)
            if m and m.group(1).split():
                return ReleaseArchs(tuple(m.group(1).replace(";", " ").split()), f"{RELEASE_PIPELINE}: {name}")
    docker = Path(tree) / DOCKERFILE
    if docker.is_file():
        m = re.search(r"^\s*ARG\s+torch_cuda_arch_list\s*=\s*[\"']?([^\"'\n]*)",
                      docker.read_text(encoding="utf-8", errors="replace"), re.M)
        if m and m.group(1).split():
            return ReleaseArchs(tuple(m.group(1).replace(";", " ").split()),
                                f"{DOCKERFILE}: ARG torch_cuda_arch_list")
    raise BuildError(
        f"{tree}: cannot find vLLM's release CUDA arch list ({RELEASE_PIPELINE} "
        f"CUDA_ARCH_* or {DOCKERFILE} torch_cuda_arch_list); set cuda_arch_list in the "
        f"lock for this pin or pass {param('arch')}"
    )


def includes_of(root: Path, rel: str) -> list[str]:
    """Local files (relative to ``root``) that ``rel`` includes directly."""
    path = root / rel
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    found = []
    real_root = root.resolve()
    for name in _INCLUDE.findall(text):
        for base in (path.parent, *(root / r for r in INCLUDE_ROOTS)):
            cand = (base / name).resolve()
            try:
                relc = cand.relative_to(real_root).as_posix()
            except ValueError:
                continue
            if cand.is_file():
                found.append(relc)
                break
    return found


def include_closure(root: Path, rel: str, memo: dict[str, list[str]] | None = None) -> tuple[str, ...]:
    """Every local header ``rel`` includes, transitively (sorted, without ``rel``).

    ``memo``: each file's direct includes, shared by the calls of one scan of a tree (the
    units of a tree include the same headers; each is read once).
    """
    memo = {} if memo is None else memo
    seen: set[str] = set()
    todo = [rel]
    while todo:
        cur = todo.pop()
        if cur not in memo:
            memo[cur] = includes_of(root, cur)
        for inc in memo[cur]:
            if inc not in seen and inc != rel:
                seen.add(inc)
                todo.append(inc)
    return tuple(sorted(seen))


def _blocks(text: str, macro: str) -> list[tuple[tuple[str, ...], str]]:
    """(macro args, body) of every ``MACRO(args) { body }`` in C++ ``text``."""
    return [(tuple(a.strip() for a in m.group(1).split(",")), _enclosed(text, m.end(), "{", "}"))
            for m in re.finditer(rf"\b{macro}\s*\(([^)]*)\)\s*\{{", text)]


def _guards(body: str) -> list[tuple[int, str | None]]:
    """(offset, innermost #ifdef macro) at each preprocessor line of ``body``."""
    stack: list[str | None] = []
    marks: list[tuple[int, str | None]] = [(0, None)]
    for m in re.finditer(r"^\s*#\s*(ifdef|ifndef|if|endif|else)\b\s*(\w*)", body, re.M):
        kind, name = m.group(1), m.group(2)
        if kind in ("ifdef",):
            stack.append(name)
        elif kind in ("ifndef", "if"):
            stack.append(None)
        elif kind == "endif" and stack:
            stack.pop()
        marks.append((m.start(), next((g for g in reversed(stack) if g), None)))
    return marks


def _guard_at(marks: list[tuple[int, str | None]], off: int) -> str | None:
    g = None
    for pos, guard in marks:
        if pos <= off:
            g = guard
    return g


def defines_function(text: str, func: str) -> bool:
    """Whether C++ ``text`` defines ``func`` at top level (not just declares it)."""
    return re.search(rf"^[A-Za-z_][\w:<>,\s\*&]*\b{re.escape(func)}\s*\([^;{{}}]*\)\s*\{{", text, re.M) is not None


def parse_bindings(text: str) -> tuple[dict[str, str], list[tuple[str, str, str, str | None]]]:
    """(op name -> schema, [(namespace, op, function, guard)]) for the CUDA impls."""
    schemas: dict[str, str] = {}
    for macro in ("STABLE_TORCH_LIBRARY_FRAGMENT", "STABLE_TORCH_LIBRARY"):
        for args, body in _blocks(text, macro):
            var = args[1] if len(args) > 1 else "m"
            for m in re.finditer(rf"\b{re.escape(var)}\.def\(\s*((?:\"(?:[^\"\\]|\\.)*\"\s*)+)", body):
                schema = "".join(_STRING.findall(m.group(1)))
                schemas.setdefault(schema.split("(", 1)[0].strip(), schema)
    impls = []
    for args, body in _blocks(text, "STABLE_TORCH_LIBRARY_IMPL"):
        if len(args) < 3 or args[1] != "CUDA":
            continue
        marks = _guards(body)
        for m in re.finditer(
            rf"\b{re.escape(args[2])}\.impl\(\s*\"([^\"]+)\"\s*,\s*TORCH_BOX\(\s*&?\s*([\w:]+)\s*\)", body
        ):
            impls.append((args[0], m.group(1), m.group(2), _guard_at(marks, m.start())))
    return schemas, impls


def plan(tree: Path, base: str | None = None) -> KernelPlan:
    """What the patches between ``base`` (default: the root commit) and HEAD change."""
    tree = Path(tree)
    if not git.is_repo_root(tree):
        from dsv4patch.guard import inside_note  # only for the message

        where = "" if (tree / ".git").exists() else f" (no .git{inside_note(tree)})"
        raise BuildError(f"{tree} is not a git repository made by `dsv4patch apply`{where}")
    head = git.head(tree)
    if head is None:
        raise BuildError(f"{tree} has no commits")
    base = base or git.root_commit(tree)
    tree_id = git.out(tree, "rev-parse", "HEAD^{tree}")
    changed = tuple(p for p in git.changed_paths(tree, base) if is_kernel_source(p))
    cmake_file = tree / "CMakeLists.txt"
    if not cmake_file.is_file():
        raise BuildError(f"{tree} has no CMakeLists.txt; is it a vLLM source tree?")
    cmake = parse_cmake(cmake_file.read_text(encoding="utf-8"))
    if not cmake.sources:
        raise BuildError(f"{cmake_file}: found no literal sources in {SRC_VAR}")
    units: list[TranslationUnit] = []
    covered: set[str] = set()
    memo: dict[str, list[str]] = {}
    for src in cmake.sources:
        if not src.endswith(".cu") or not (tree / src).is_file():
            continue
        headers = include_closure(tree, src, memo)
        hit = tuple(p for p in (src, *headers) if p in changed)
        if hit:
            covered.update(hit)
            var = cmake.arch_var.get(src)
            units.append(TranslationUnit(src, TARGET, headers, hit, var))
    bindings = next(
        (s for s in cmake.sources if s.endswith(".cpp") and (tree / s).is_file()
         and "STABLE_TORCH_LIBRARY_IMPL" in (tree / s).read_text(encoding="utf-8", errors="replace")
         and ".impl(" in (tree / s).read_text(encoding="utf-8", errors="replace")),
        None,
    )
    ops: list[Op] = []
    if bindings and units:
        schemas, impls = parse_bindings((tree / bindings).read_text(encoding="utf-8"))
        texts = {u.path: (tree / u.path).read_text(encoding="utf-8", errors="replace") for u in units}
        for ns, name, func, guard in impls:
            for u in units:
                if defines_function(texts[u.path], func.split("::")[-1]) and name in schemas:
                    ops.append(Op(name, func, schemas[name], u.path, ns, guard))
    unmapped = tuple(p for p in changed if p not in covered)
    return KernelPlan(
        tree=tree, base=base, head=head, tree_id=tree_id, changed=changed, units=tuple(units),
        ops=tuple(ops), bindings=bindings, defines=cmake.defines,
        torch_target_version=cmake.torch_target_version, unmapped=unmapped,
        cuda_standard=cmake.cuda_standard,
    )


def cmake_target(tree: Path) -> CMakeTarget:
    return parse_cmake((Path(tree) / "CMakeLists.txt").read_text(encoding="utf-8"))
