"""The layering rules of docs/ARCHITECTURE.md, checked on the real package's source.

``main.py`` parses and dispatches; ``commands/<verb>.py`` parses its options, calls the
typed core with explicit keywords and renders; the core never imports ``commands/``.
Every import is read from the syntax tree (``ast``), lazy imports inside functions
included, so a rule cannot be dodged by importing late. Each rule is its own test: a
failure names the module and the line.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dsv4patch"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
ARGPARSE_ALLOWED = ("main.py", "commands/", "kernels/runtime.py")
COMMAND_MAY_IMPORT = {"dsv4patch.commands._common"}


@dataclass(frozen=True)
class Module:
    path: Path  # relative to dsv4patch/, e.g. commands/apply.py
    name: str  # dotted, e.g. dsv4patch.commands.apply
    tree: ast.Module

    @property
    def is_command(self) -> bool:
        return self.path.parts[0] == "commands"

    @property
    def package(self) -> str:
        return self.name if self.path.name == "__init__.py" else self.name.rsplit(".", 1)[0]


def _modules() -> list[Module]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        parts = ["dsv4patch", *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found.append(Module(rel, ".".join(parts), ast.parse(path.read_text(), str(path))))
    return found


MODULES = _modules()
PACKAGES = {m.name for m in MODULES if m.path.name == "__init__.py"}


def _imports(module: Module) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of everything the module imports, at any depth."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.package.split(".")
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            found.append((node.lineno, prefix))
            if prefix in PACKAGES:  # `from dsv4patch.commands import apply` imports the submodule
                found += [(node.lineno, f"{prefix}.{alias.name}") for alias in node.names]
    return sorted(set(found))


def _where(module: Module, line: int, what: str) -> str:
    return f"dsv4patch/{module.path.as_posix()}:{line}: {what}"


def test_the_scan_sees_the_package() -> None:
    names = {m.name for m in MODULES}
    assert {"dsv4patch.main", "dsv4patch.series.engine", "dsv4patch.commands.apply"} <= names
    apply = next(m for m in MODULES if m.name == "dsv4patch.commands.apply")
    assert any(name.startswith("dsv4patch.") for _, name in _imports(apply))


def test_argparse_only_in_main_commands_and_the_kernel_entry_point() -> None:
    bad = [_where(m, line, name) for m in MODULES for line, name in _imports(m)
           if name.split(".")[0] == "argparse"
           and not any(m.path.as_posix().startswith(allowed) for allowed in ARGPARSE_ALLOWED)]
    assert bad == []


def test_no_command_imports_another_command() -> None:
    bad = []
    for m in MODULES:
        if not m.is_command:
            continue
        for line, name in _imports(m):
            if (name.startswith("dsv4patch.commands.") and name not in COMMAND_MAY_IMPORT
                    and name != m.name):
                bad.append(_where(m, line, name))
    assert bad == []


def test_no_core_module_imports_commands() -> None:
    bad = [_where(m, line, name) for m in MODULES if not m.is_command and m.name != "dsv4patch.main"
           for line, name in _imports(m)
           if name == "dsv4patch.commands" or name.startswith("dsv4patch.commands.")]
    assert bad == []


def test_no_code_builds_a_namespace_or_captures_stdout() -> None:
    """Commands call the core with explicit keywords: no argparse.Namespace, no redirect_stdout."""
    bad = []
    for m in MODULES:
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in {"Namespace", "redirect_stdout"}:
                    bad.append(_where(m, node.lineno, name))
    assert bad == []


def test_no_hidden_attributes_read_from_args() -> None:
    """No ``getattr(args, ...)``: an option a command reads is one its parser defines."""
    bad = []
    for m in MODULES:
        if m.name == "dsv4patch.main":
            continue  # reads the parsed --format/--debug before any command exists
        for node in ast.walk(m.tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                    and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "args"):
                bad.append(_where(m, node.lineno, "getattr(args, ...)"))
    assert bad == []


PIPELINE = ("pins", "series", "kernels", "checkout", "forks", "delivery", "proofs")


def _domain(name: str) -> str | None:
    """The domain package of a dotted module name; None for a foundation (a top-level module)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PIPELINE else None


def test_the_page_lists_the_packages_in_pipeline_order() -> None:
    assert f"Package order: {', '.join(PIPELINE)}." in ARCHITECTURE.read_text()
    on_disk = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()} - {"commands"}
    assert on_disk == set(PIPELINE)


def test_packages_import_only_foundations_and_earlier_packages() -> None:
    """pins < series < kernels < checkout < forks < delivery < proofs: a package never reaches a later one,
    and a foundation (a top-level module other than main.py) reaches no package."""
    bad = []
    for m in MODULES:
        if m.is_command or m.name in ("dsv4patch.main", "dsv4patch.__main__"):
            continue
        own = _domain(m.name)
        for line, name in _imports(m):
            other = _domain(name)
            if other is None or other == own:
                continue
            if own is None or PIPELINE.index(other) > PIPELINE.index(own):
                bad.append(_where(m, line, f"{own or 'foundation'} imports {name} ({other})"))
    assert bad == []


def test_the_import_chain_from_commands_to_the_foundations_is_at_most_seven_long() -> None:
    """Measured on packages (a domain package, commands/, or the foundations as one), every import
    counted, lazy ones included: commands -> ... -> foundations, the longest path, at most 7 nodes."""
    node = {m.name: ("commands" if m.is_command else _domain(m.name) or "foundations") for m in MODULES
            if m.name not in ("dsv4patch.main", "dsv4patch.__main__")}
    edges: dict[str, set[str]] = {}
    for m in MODULES:
        if m.name not in node:
            continue
        for _line, name in _imports(m):
            target = next((node[n] for n in (name, name.rsplit(".", 1)[0]) if n in node), None)
            if target is not None and target != node[m.name]:
                edges.setdefault(node[m.name], set()).add(target)

    def longest(n: str, seen: tuple[str, ...] = ()) -> list[str]:
        paths = [longest(m, (*seen, n)) for m in edges.get(n, ()) if m not in seen]
        return [n, *max(paths, key=len, default=[])]

    chain = longest("commands")
    assert chain[-1] == "foundations" and len(chain) <= 7, " -> ".join(chain)


def _runtime_imports(module: Module) -> list[ast.Import | ast.ImportFrom]:
    """The import statements the interpreter runs (any depth, lazy ones included; not under TYPE_CHECKING)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(module.tree)
    return found


def _module_edges() -> dict[str, set[str]]:
    """module -> the modules of ours it loads at run time; a name taken from a package's face counts as
    an import of the module the face loads it from (faces are pass-throughs)."""
    by_name = {m.name: m for m in MODULES}
    faces = {p: _face(p)[0] for p in PIPELINE}
    edges: dict[str, set[str]] = {}
    for m in MODULES:
        out: set[str] = set()
        for node in _runtime_imports(m):
            if isinstance(node, ast.Import):
                pairs = [(a.name, "") for a in node.names]
            else:
                base = m.package.split(".")[: len(m.package.split(".")) - node.level + 1] if node.level else []
                prefix = ".".join([*base, node.module] if node.module else base) if node.level else node.module or ""
                pairs = [(prefix, a.name) for a in node.names]
            for mod, name in pairs:
                parts = mod.split(".")
                if len(parts) == 2 and parts[1] in faces and name in faces[parts[1]]:
                    out.add(f"{mod}.{faces[parts[1]][name].split(':')[0]}")
                elif f"{mod}.{name}" in by_name:
                    out.add(f"{mod}.{name}")
                elif mod in by_name and by_name[mod].path.name != "__init__.py":
                    out.add(mod)
        out.discard(m.name)
        edges[m.name] = out
    return edges


# issue 37: the longest run-time import chain from a command to the first foundation module, counted in
# modules (both ends included): 11 at the issue's branch point; 8 once the series' records and patched
# tree moved; 7 once every import used only in annotations went under TYPE_CHECKING (ruff TC001, strict).
MODULE_CHAIN_MOST = 7


def test_the_import_chain_by_module_from_a_command_to_a_foundation() -> None:
    """Measured on modules: from any commands/ module, through the modules it loads at run time (faces
    resolved to the module behind each name; imports under TYPE_CHECKING are not run, so not counted), to
    the first foundation module reached; the longest such path."""
    edges = _module_edges()
    commands = {m.name for m in MODULES if m.is_command}
    foundation = {m.name for m in MODULES if _domain(m.name) is None and m.name not in commands
                  and m.name not in ("dsv4patch.main", "dsv4patch.__main__", "dsv4patch")}
    memo: dict[str, tuple[str, ...]] = {}

    def longest(name: str, seen: frozenset[str]) -> tuple[str, ...]:
        if name in foundation:
            return (name,)
        if name in memo:
            return memo[name]
        paths = [longest(n, seen | {name}) for n in edges.get(name, ()) if n not in seen
                 and (n not in commands or name in commands)]
        best = (name, *max(paths, key=len, default=()))
        memo[name] = best
        return best

    chain = max((longest(c, frozenset()) for c in sorted(commands)), key=len)
    shown = " -> ".join(n.removeprefix("dsv4patch.") for n in chain)
    print(f"longest import chain by module ({len(chain)}): {shown}")
    assert len(chain) <= MODULE_CHAIN_MOST, shown


def _face(package: str) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(FACE, {public name: "module:attribute"} of the TYPE_CHECKING imports, __all__) of a package's __init__."""
    init = next(m for m in MODULES if m.name == f"dsv4patch.{package}" and m.path.name == "__init__.py")
    table: dict[str, str] = {}
    typed: dict[str, str] = {}
    listed: list[str] = []
    for node in init.tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id == "FACE":
                table = ast.literal_eval(node.value)
            elif node.targets[0].id == "__all__":
                listed = ast.literal_eval(node.value)
        elif isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module, ast.dump(imp)
                assert imp.module.startswith(f"dsv4patch.{package}."), imp.module
                for alias in imp.names:
                    typed[alias.asname or alias.name] = f"{imp.module[len(package) + 11:]}:{alias.name}"
    return table, typed, listed


def test_each_package_has_one_face_that_agrees_with_itself() -> None:
    """FACE (what the interpreter loads), the TYPE_CHECKING imports (what mypy sees) and __all__ name the
    same things; no public name shadows a module of the package; each name loads for real."""
    import importlib

    for package in PIPELINE:
        table, typed, listed = _face(package)
        assert table, f"dsv4patch/{package}/__init__.py has no FACE"
        assert table == typed, f"{package}: FACE and the TYPE_CHECKING imports differ"
        assert sorted(listed) == sorted(table), f"{package}: __all__ and FACE differ"
        modules = {p.stem for p in (PACKAGE / package).iterdir()}
        assert not set(table) & modules, f"{package}: a public name shadows a module"
        loaded = importlib.import_module(f"dsv4patch.{package}")
        for name, where in table.items():
            module, _, attr = where.partition(":")
            assert getattr(loaded, name) is getattr(importlib.import_module(f"dsv4patch.{package}.{module}"), attr)


def test_packages_reach_each_other_only_through_their_face() -> None:
    """Outside a package (other packages, commands/, main.py) only ``from dsv4patch.<package> import <public
    name>``: never one of its modules, never a name its face does not list."""
    faces = {package: set(_face(package)[0]) for package in PIPELINE}
    bad = []
    for m in MODULES:
        own = _domain(m.name)
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Import):
                targets = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [(node.module, alias.name) for alias in node.names]
            else:
                continue
            for module, name in targets:
                parts = module.split(".")
                if parts[0] != "dsv4patch" or len(parts) < 2 or parts[1] not in PIPELINE or parts[1] == own:
                    continue
                if len(parts) > 2 or name not in faces[parts[1]]:
                    bad.append(_where(m, node.lineno, f"{module}{'.' + name if name else ''} is not "
                                                      f"dsv4patch.{parts[1]}'s face"))
    assert bad == []


CORE_EXEMPT = ("commands/", "main.py", "errors.py")  # the command line, and where UsageError is defined


def _core() -> list[Module]:
    return [m for m in MODULES if not m.path.as_posix().startswith(CORE_EXEMPT)]


def test_no_usage_error_below_commands() -> None:
    """The core raises ParameterError (same exit code 2); UsageError is the command line's."""
    bad = [_where(m, node.lineno, "UsageError") for m in _core() for node in ast.walk(m.tree)
           if (isinstance(node, ast.Name) and node.id == "UsageError")
           or (isinstance(node, ast.alias) and node.name == "UsageError")]
    bad += [_where(m, node.lineno, "imports UsageError") for m in _core() for node in ast.walk(m.tree)
            if isinstance(node, ast.ImportFrom) and any(a.name == "UsageError" for a in node.names)]
    assert bad == []


def _option_names() -> set[str]:
    from dsv4patch.main import build_parser

    parser = build_parser()
    names = {o for a in parser._actions for o in a.option_strings}
    for action in parser._actions:
        for sub in getattr(action, "choices", None) or {}:
            names |= {o for a in action.choices[sub]._actions for o in a.option_strings}
    return {n for n in names if n.startswith("--")}


def _prose(module: Module) -> list[tuple[int, str]]:
    """The string constants of a module that are prose (not a docstring, not one argv word)."""
    docs = {id(n.body[0].value) for n in ast.walk(module.tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(module.tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs and " " in n.value]


def test_the_core_names_parameters_and_commands_render_them() -> None:
    """A ParameterError spells no option (it names parameters with errors.param); every parameter the core
    names (``param``, ``Step.of``) has its option in commands/_words.py, every step is a command."""
    from dsv4patch.commands._words import OPTIONS
    from dsv4patch.main import COMMANDS

    options = _option_names()
    assert set(OPTIONS.values()) <= options, "commands/_words.py names an option no command has"
    bad = []
    for m in _core():
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "param":
                name = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
                if name not in OPTIONS:
                    bad.append(_where(m, node.lineno, f"param({name!r}) has no word in commands/_words.py"))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "of" \
                    and getattr(node.func.value, "id", "") == "Step":
                action = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
                if action not in COMMANDS:
                    bad.append(_where(m, node.lineno, f"Step.of({action!r}): not a command"))
                bad += [_where(m, node.lineno, f"Step.of(..., {k.arg}=) has no word in commands/_words.py")
                        for k in node.keywords if k.arg not in OPTIONS]
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) \
                    and getattr(node.exc.func, "id", "") == "ParameterError":
                for sub in ast.walk(node.exc):
                    if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                        spelled = [o for o in options if re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", sub.value)]
                        if spelled:
                            bad.append(_where(m, node.lineno, f"ParameterError spells {spelled}"))
    assert bad == []


NEXT_STEP_MARKERS = ("\u27e6", "\u27e7", "\u27e8", "\u27e9")  # nextstep.mention's and errors.param's


def test_no_marker_reaches_the_user(tmp_path, capsys):
    """Real commands whose messages name next steps and parameters: the user reads options and
    command lines, on stderr and in JSON, never a marker."""
    import json
    import shutil
    import subprocess

    from dsv4patch.main import main

    plain = tmp_path / "plain"
    plain.mkdir()
    subprocess.run(["git", "init", "-q", str(plain)], check=True)
    lock = tmp_path / "locks" / "vllm.toml"
    lock.parent.mkdir()
    shutil.copyfile(ROOT / "locks" / "vllm.toml", lock)
    shutil.copytree(ROOT / "patches", tmp_path / "patches")
    runs = [
        (["resolve", "--continue", "--tree", str(plain), "--lock", str(lock)],
         f"`dsv4patch apply --pin P --tree {plain} --3way` opens one"),
        (["port", "--abort", "--workspace", str(tmp_path / "empty")], f"--workspace {tmp_path / 'empty'}"),
        (["port", "--lock", str(lock), "--to", "0.27.1"], "pass --name NEW to add another pin; `--dry-run`"),
    ]
    (tmp_path / "empty").mkdir()
    for argv, shown in runs:
        for fmt in ("text", "json"):
            capsys.readouterr()
            code = main([*argv, "--format", fmt])
            out, err = capsys.readouterr()
            assert code != 0, (argv, out, err)
            assert not any(c in out + err for c in NEXT_STEP_MARKERS), (argv, fmt, out, err)
            assert shown in err, (argv, err)
            if fmt == "json":
                assert shown in json.loads(out)["error"]["message"]


# Option names in the core's prose that are not ours to render (issue 37 moved every other one to a
# parameter mark or a typed next step that commands/ renders): (module, text), why.
OPTION_PROSE_ALLOWED = {
    ("checkout/forkcheckout.py", "dsv4patch apply --branch"):
        "the reflog record `apply --branch` writes into the user's repository: stored by git, never rendered",
    ("forks/portspace.py", "dsv4patch port --workspace: the fork's branch stays where it is"):
        "the reflog record of a port workspace: stored by git, never rendered",
    ("checkout/treestatus.py", "--format=%H %s"): "git log's own option",
    ("kernels/build.py", " --version"): "nvcc's own option",
    ("kernels/build.py", " --version` ("): "nvcc's own option, quoted in a message",
    ("proofs/testenv.py", "pip install --dry-run in "): "pip's own option, quoted in a message",
    ("series/patches.py", "diff --git "): "git's diff header, which a patch file must contain",
    ("series/patches.py", " contains no diff (no 'diff --git' sections)"): "git's diff header, named",
    ("kernels/toolchain.py", "--python "): "TorchEnv.origin, recorded as is in the kernel wheel's build info",
}
# Modules with a command line of their own: they run inside vLLM, pytest or the engine child.
OWN_COMMAND_LINE = ("kernels/runtime.py", "proofs/cpu_pytest_plugin.py", "proofs/selftest/child.py")


def test_no_option_name_in_the_core_prose() -> None:
    """No option of ours is spelled below commands/ (messages, notes, titles, next steps): a parameter is
    marked with errors.param, a command with nextstep.mention; commands/_words.py renders both."""
    options = _option_names()
    pattern = re.compile(r"(?<![\w-])(" + "|".join(sorted(map(re.escape, options), key=len, reverse=True))
                         + r")(?![\w-])")
    found = [f"dsv4patch/{m.path.as_posix()}:{line}: {text!r}" for m in _core() if m.path.name != "__init__.py"
             and m.path.as_posix() not in OWN_COMMAND_LINE for line, text in _prose(m)
             if pattern.search(text) and (m.path.as_posix(), text) not in OPTION_PROSE_ALLOWED]
    assert found == []
    used = {(m.path.as_posix(), text) for m in _core() for _, text in _prose(m)}
    assert set(OPTION_PROSE_ALLOWED) <= used, "an allowed text that is gone: take it off the list"


def _branchy() -> dict[tuple[str, int], int]:
    """(path, line) -> complexity of each function over 12, as ruff's C901 (McCabe) measures it."""
    import json
    import subprocess
    import sys

    ruff = Path(sys.executable).with_name("ruff")
    res = subprocess.run([str(ruff), "check", "--isolated", "--select", "C901", "--config",
                          "lint.mccabe.max-complexity=12", "--output-format", "json", "--exit-zero", str(PACKAGE)],
                         capture_output=True, text=True, check=True)
    out = {}
    for d in json.loads(res.stdout):
        cc = int(re.search(r"\((\d+) > 12\)", d["message"]).group(1))
        out[(Path(d["filename"]).resolve().relative_to(PACKAGE).as_posix(), d["location"]["row"])] = cc
    return out


def _functions_over(max_lines: int) -> list[str]:
    branchy = _branchy()
    out = []
    for m in _core():
        for node in ast.walk(m.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                cc = branchy.get((m.path.as_posix(), node.lineno))
                if lines > max_lines or cc is not None:
                    out.append(f"dsv4patch/{m.path.as_posix()}:{node.name} ({lines} lines, complexity {cc or '<= 12'})")
    return sorted(out)


# Functions below commands/ over 60 lines or complexity 12, written before issue 37 (which rewrites
# them as named steps): the list may only shrink; any other function over the limits fails.
LONG_FUNCTIONS_LEFT: set[str] = set()  # none left: issue 37 wrote them all as named steps


def test_no_new_long_or_branchy_function_in_the_core() -> None:
    over = _functions_over(60)
    new = sorted({o.split(" ", 1)[0].removeprefix("dsv4patch/") for o in over} - LONG_FUNCTIONS_LEFT)
    assert new == [], "over 60 lines or complexity 12 below commands/: write it as named steps"
    print(f"{len(over)} functions below commands/ over the limits:\n" + "\n".join(over))


LAYERS = ("foundation", "input", "mechanism", "operation", "command", "entry")


def _table() -> dict[str, str]:
    """module path -> layer, from the table of docs/ARCHITECTURE.md."""
    section = ARCHITECTURE.read_text().split("\n## Which module owns what", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| `")]
    return {cells[1].strip().strip("`"): cells[2].strip() for cells in rows if len(cells) > 3}


def test_imports_follow_the_layers() -> None:
    """A module imports only from its own layer or below; a standalone module imports nothing of ours."""
    layer = {f"dsv4patch.{p[:-3].replace('/', '.')}": name for p, name in _table().items() if p.endswith(".py")}
    assert set(layer.values()) <= {*LAYERS, "standalone"}, "a layer the page does not define"
    bad = []
    for m in MODULES:
        if m.path.name == "__init__.py" or m.name not in layer:
            continue  # package markers; a module missing from the table fails the test below
        own = layer[m.name]
        for line, name in _imports(m):
            if not name.startswith("dsv4patch.") or name not in layer or name == m.name:
                continue  # outside the package, or a package marker (version, docstring)
            if own == "standalone":
                bad.append(_where(m, line, f"standalone module imports {name}"))
            elif layer[name] != "standalone" and LAYERS.index(layer[name]) > LAYERS.index(own):
                bad.append(_where(m, line, f"{own} imports {name} ({layer[name]})"))
    assert bad == []


def test_every_module_is_in_the_architecture_page() -> None:
    table = _table()
    missing = [m.path.as_posix() for m in MODULES
               if m.path.name != "__init__.py" and m.path.as_posix() not in table]
    assert missing == [], "name each module of dsv4patch/ in docs/ARCHITECTURE.md"


def test_every_test_file_is_in_the_map() -> None:
    """The map of which test covers which module lists every tests/test_*.py, and only those."""
    section = ARCHITECTURE.read_text().split("\n## Which test covers which module", 1)[1]
    named = set(re.findall(r"`(tests/test_[\w]+\.py)`", section))
    files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py")}
    assert sorted(files - named) == [] and sorted(named - files) == []


def test_every_module_has_a_test_in_the_map() -> None:
    """Each module of dsv4patch/ is named by at least one row of the test map (the test that covers it)."""
    section = ARCHITECTURE.read_text().split("\n## Which test covers which module", 1)[1]
    covered = set(re.findall(r"`([\w/]+\.py)`", section))
    missing = [m.path.as_posix() for m in MODULES if m.path.name != "__init__.py" and m.path.as_posix() not in covered]
    assert missing == [], "name the test that covers each module in docs/ARCHITECTURE.md's test map"


def _tested_elsewhere() -> dict[str, str]:
    """module path -> reason, from the page's table of modules tested through another suite."""
    section = ARCHITECTURE.read_text().split("\n## Modules tested through another suite", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| `")]
    return {cells[1].strip().strip("`"): cells[2] + cells[3] for cells in rows if len(cells) > 4}


def _own_tests(path: Path) -> list[Path]:
    """The test modules that would be named after module ``path`` (relative to the package)."""
    names = [f"test_{path.stem}.py"]
    if len(path.parts) > 1:
        names.append(f"test_{path.parts[-2]}_{path.stem}.py")
    return [ROOT / "tests" / n for n in names]


def test_every_core_module_has_a_test_named_after_it_or_a_stated_reason() -> None:
    """issue 37: one test module per core module, or the page says where it is tested and why."""
    elsewhere = _tested_elsewhere()
    missing, stale, vague = [], [], []
    for m in _core():
        if m.path.name in ("__init__.py", "__main__.py"):
            continue
        rel = m.path.as_posix()
        own = any(p.is_file() for p in _own_tests(m.path))
        if own and rel in elsewhere:
            stale.append(rel)
        elif not own and rel not in elsewhere:
            missing.append(rel)
        elif not own:
            named = re.findall(r"`(tests/test_\w+\.py)`", elsewhere[rel])
            if not named or not all((ROOT / n).is_file() for n in named):
                vague.append(rel)
    assert missing == [], "write tests/test_<module>.py, or say in docs/ARCHITECTURE.md where it is tested and why"
    assert stale == [], "these have a test module of their own: take them off the page's list"
    assert vague == [], "each reason names the existing test modules"
    assert set(elsewhere) <= {m.path.as_posix() for m in _core()}, "the list names a module that is gone"


def test_the_architecture_page_names_no_module_that_is_gone() -> None:
    """Each module the table names (`x.py`, `commands/x.py`) exists: the page follows the code."""
    gone = sorted(n for n in _table() if not (PACKAGE / n).is_file())
    assert gone == []


def _calls(module: Module, owner: str, name: str) -> list[int]:
    """Lines where ``module`` calls ``owner.name(...)`` (``from dsv4patch import owner`` style)."""
    return [node.lineno for node in ast.walk(module.tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name
            and isinstance(node.func.value, ast.Name) and node.func.value.id == owner]


def test_only_the_checkout_guard_lets_git_into_a_work_tree() -> None:
    """issue 35: one guarded way to a user's checkout.  git.py runs in a work tree only while
    git.guarding holds it, and only guard.py calls that (after vetting, or guard.owned for a
    tree dsv4patch itself creates: only where trees are created)."""
    bad = []
    for m in MODULES:
        for line in _calls(m, "git", "guarding"):
            if m.name != "dsv4patch.guard":
                bad.append(_where(m, line, "git.guarding outside guard.py"))
        for line in _calls(m, "guard", "owned"):
            if m.name not in ("dsv4patch.pins.repository", "dsv4patch.checkout.transaction",
                              "dsv4patch.delivery.provenance"):
                bad.append(_where(m, line, "guard.owned outside the modules that create a work tree"))
        for node in ast.walk(m.tree):
            if isinstance(node, ast.ImportFrom) and node.module == "dsv4patch.git":
                names = {a.name for a in node.names}
                if names & {"guarding", "_GUARDED"}:
                    bad.append(_where(m, node.lineno, "imports git's guard directly"))
    assert bad == []
    assert _calls(next(m for m in MODULES if m.name == "dsv4patch.guard"), "git", "guarding")


def test_git_refuses_a_work_tree_the_guard_does_not_hold() -> None:
    """The runtime half: git._repo_env raises for a work tree no guard holds (exercised for real in
    tests/test_guard.py and tests/test_git.py)."""
    source = (PACKAGE / "git.py").read_text()
    assert "raise UnguardedCheckout(" in source and "_GUARDED.get(os.path.realpath(cwd))" in source


def _environment_reads(m: Module) -> dict[str, int]:
    """``path:function`` -> first line where it reads one environment variable by name: ``os.environ[...]``,
    ``os.environ.get(...)``, ``"X" in os.environ``, ``os.getenv(...)`` or ``limits.env_number(...)``.
    Copying the whole environment (``dict(os.environ)``, ``{**os.environ, ...}``) is not a read:
    that is how a child's environment is built."""
    found: dict[str, int] = {}

    def is_environ(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "environ"
                and isinstance(node.value, ast.Name) and node.value.id == "os")

    def is_read(node: ast.AST) -> bool:
        if isinstance(node, ast.Subscript) and is_environ(node.value):
            return True
        if isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            return True
        if not isinstance(node, ast.Call):
            return False
        f = node.func
        if isinstance(f, ast.Attribute):
            return ((f.attr == "get" and is_environ(f.value)) or f.attr == "env_number"
                    or (f.attr == "getenv" and isinstance(f.value, ast.Name) and f.value.id == "os"))
        return isinstance(f, ast.Name) and f.id == "env_number"

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            if is_read(child):
                found.setdefault(f"{m.path.as_posix()}:{function}", child.lineno)
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            visit(child, inner)

    visit(m.tree, "<module>")
    return found


# Where the core may read an environment variable by name, and why it is not a setting of ours.
ENVIRONMENT_READS_ALLOWED = {
    "git.py:environment": "git's own environment: the variables a git child keeps (HOME, PATH, ...)",
    "index.py:_pip_config_files": "pip's configuration files, found as pip finds them (the index is pip's)",
    "index.py:_configured": "pip's index settings (PIP_INDEX_URL, ...), read as pip reads them",
    "kernels/build.py:find_nvcc": "CUDA_HOME/CUDA_PATH: where a system CUDA lives, as PATH says where nvcc is",
    "kernels/toolchain.py:system_nvccs": "CUDA_HOME/CUDA_PATH: where a system CUDA lives, as PATH says where nvcc is",
    "kernels/runtime.py:_strict": "runs inside vLLM (the installed kernel plugin), not in dsv4patch",
    "kernels/runtime.py:_visible": "runs inside vLLM (the installed kernel plugin), not in dsv4patch",
    "kernels/runtime.py:_activate": "runs inside vLLM (the installed kernel plugin), not in dsv4patch",
    "kernels/runtime.py:_entry_point_route": "runs inside vLLM (the installed kernel plugin), not in dsv4patch",
    "proofs/cpu_pytest_plugin.py:_record": "runs inside the pytest child, told where to write by its parent",
    "proofs/cpu_pytest_plugin.py:pytest_collection_modifyitems": "runs inside the pytest child, told which tests to "
                                                                  "run by its parent",
    "proofs/selftest/child.py:run": "runs in the engine child under test: sets vLLM's switches for itself",
    "proofs/selftest/child.py:main": "runs in the engine child under test, told its paths by the runner",
    "proofs/selftest/child.py:<module>": "runs in the engine child under test, told its paths by the runner",
}
# Environment settings still read in the core: none (issue 37 moved the bounds and NO_COLOR into
# dsv4patch/settings.py, read once by main); an entry here needs a reason that holds.
ENVIRONMENT_SETTINGS_LEFT: set[str] = set()


def test_the_core_reads_no_setting_from_the_environment() -> None:
    """Environment defaults are read once, at the edge (``settings.Settings``, built by ``commands/``) and
    passed down with explicit keywords; the core reads a variable only for the reasons listed above."""
    reads = {k: line for m in _core() for k, line in _environment_reads(m).items()}
    bad = sorted(f"dsv4patch/{k} (line {line})" for k, line in reads.items()
                 if k not in ENVIRONMENT_READS_ALLOWED and k not in ENVIRONMENT_SETTINGS_LEFT)
    assert bad == [], "read the setting in dsv4patch/settings.py and pass it down (or say why above)"
    stale = sorted((set(ENVIRONMENT_READS_ALLOWED) | ENVIRONMENT_SETTINGS_LEFT) - set(reads))
    assert stale == [], "these no longer read the environment: take them off the lists"
    print("environment settings left in the core:", ", ".join(sorted(ENVIRONMENT_SETTINGS_LEFT)))


def test_the_environment_scan_sees_each_kind_of_read() -> None:
    """The scan above must see every form of a read (else it passes vacuously)."""
    src = ("import os\nfrom dsv4patch import limits\n"
           "def a(): return os.environ.get('X')\ndef b(): return os.environ['X']\n"
           "def c(): return 'X' in os.environ\ndef d(): return os.getenv('X')\n"
           "def e(): return limits.env_number('X', 1, low=0, high=2)\n"
           "def child(): return {**os.environ, 'Y': '1'}, dict(os.environ)\n")
    m = Module(Path("probe.py"), "dsv4patch.probe", ast.parse(src))
    assert sorted(_environment_reads(m)) == ["probe.py:a", "probe.py:b", "probe.py:c", "probe.py:d", "probe.py:e"]


# --- One context object (issue 37) -------------------------------------------------------------------------
SHARED = ("lock", "store", "progress")  # what every operation of a run shares: dsv4patch.pins.Context


def _shared_parameters(m: Module) -> dict[str, list[str]]:
    """``path:function`` (``path:Class.method`` for a method) -> the names of ``SHARED`` it takes as
    separate parameters, for each function that takes two or more."""
    found: dict[str, list[str]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                names = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
                shared = [s for s in SHARED if s in names]
                if len(shared) >= 2:
                    found[f"{m.path.as_posix()}:{prefix}{child.name}"] = shared
                visit(child, f"{prefix}{child.name}.")

    visit(m.tree, "")
    return found


# Core functions that still take two of (lock, store, progress) apart, and why; may only shrink.
# Both chains are mechanisms on the cache below the lock: they take a pin (or its toolchain, a wheel) and never
# read the lock, so a Context would hand them a lock file they must not depend on (tests and benchmarks call
# them with a store alone). The operations above them take ctx and pass ctx.store and ctx.progress down.
_KERNEL_CHAIN = ("the kernel build's chain (build_tree -> kernels.build -> toolchain, the stock wheel's "
                 "members): a cache mechanism on a tree, a pin and its toolchain; no lock")
_SOURCE_CHAIN = ("the pin repository (materialize -> a SourceKind's fetch_files, the sdist extractor): a "
                 "cache mechanism on one pin; no lock (the check cache's lookup, tests and benchmarks call "
                 "materialize with a store alone)")
SHARED_PARAMETERS_LEFT = {
    "checkout/resolving.py:continue_workspace":
        "the lock is not known until the workspace's state names it (read under the tree lock): "
        "commands/resolve.py builds the Context from what this returns",
    "kernels/build.py:fetch_cublas_headers": _KERNEL_CHAIN,
    "kernels/build.py:compile_units": _KERNEL_CHAIN,
    "kernels/build.py:build": _KERNEL_CHAIN,
    "kernels/building.py:build_tree": _KERNEL_CHAIN,
    "kernels/stock.py:wheel_path": _KERNEL_CHAIN,
    "kernels/stock.py:member": _KERNEL_CHAIN,
    "kernels/toolchain.py:_provision": _KERNEL_CHAIN,
    "kernels/toolchain.py:ensure_torch": _KERNEL_CHAIN,
    "kernels/toolchain.py:ensure_cuda_wheels": _KERNEL_CHAIN,
    "kernels/toolchain.py:choose_nvcc": _KERNEL_CHAIN,
    "kernels/toolchain.py:cublas_include": _KERNEL_CHAIN,
    "kernels/toolchain.py:resolve": _KERNEL_CHAIN,
    "kernels/toolchain.py:_lock_torch": _KERNEL_CHAIN,
    "kernels/toolchain.py:_include_dirs": _KERNEL_CHAIN,
    "kernels/toolchain.py:provisioned": _KERNEL_CHAIN,
    "kernels/toolchain.py:_wheels_nvcc": _KERNEL_CHAIN,
    "kernels/wheelcache.py:key": _KERNEL_CHAIN,
    "pins/gitsource.py:GitSource.fetch_files": _SOURCE_CHAIN,
    "pins/localsource.py:LocalSource.fetch_files": _SOURCE_CHAIN,
    "pins/repository.py:materialize": _SOURCE_CHAIN,
    "pins/repository.py:_build": _SOURCE_CHAIN,
    "pins/sdist.py:extract_sdist": _SOURCE_CHAIN,
    "pins/sdist.py:SdistSource.fetch_files": _SOURCE_CHAIN,
    "pins/source.py:SourceKind.fetch_files": _SOURCE_CHAIN,
    "proofs/verifying.py:Sessions.__init__": "the pytest sessions of one tree state: a cache mechanism (results "
                                                "cache, work trees), no lock; verify builds it from ctx.store "
                                                "and ctx.progress",
}


def test_no_core_function_takes_the_lock_the_store_and_progress_apart() -> None:
    """What a run shares travels as one ``ctx: Context`` (``dsv4patch/pins/context.py``), built once by
    ``commands/``: a core function that takes two or more of lock, store and progress as separate
    parameters is refused, unless listed above with its reason."""
    found = {k: v for m in _core() for k, v in _shared_parameters(m).items()}
    bad = sorted(f"dsv4patch/{k} takes {', '.join(v)}" for k, v in found.items() if k not in SHARED_PARAMETERS_LEFT)
    assert bad == [], "take ctx: Context instead (or say why in SHARED_PARAMETERS_LEFT)"
    stale = sorted(set(SHARED_PARAMETERS_LEFT) - set(found))
    assert stale == [], "these take one Context now: take them off SHARED_PARAMETERS_LEFT"
    print(f"{len(found)} core function(s) still take two of lock/store/progress apart")


def test_the_shared_parameter_scan_sees_functions_and_methods() -> None:
    """The scan above must see a plain function, a method and a nested function (else it passes vacuously),
    and not count a function that takes a Context."""
    src = ("def a(lock, pin, store): ...\n"
           "def b(*, ctx, pin): ...\n"
           "class K:\n    def m(self, store, progress): ...\n"
           "def outer(ctx):\n    def inner(lock, progress): ...\n")
    m = Module(Path("probe.py"), "dsv4patch.probe", ast.parse(src))
    assert _shared_parameters(m) == {"probe.py:a": ["lock", "store"], "probe.py:K.m": ["store", "progress"],
                                     "probe.py:outer.inner": ["lock", "progress"]}
