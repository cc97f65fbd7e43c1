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
    names has its option in commands/_words.py."""
    from dsv4patch.commands._words import OPTIONS

    options = _option_names()
    assert set(OPTIONS.values()) <= options, "commands/_words.py names an option no command has"
    bad = []
    for m in _core():
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "param":
                name = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
                if name not in OPTIONS:
                    bad.append(_where(m, node.lineno, f"param({name!r}) has no word in commands/_words.py"))
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) \
                    and getattr(node.exc.func, "id", "") == "ParameterError":
                for sub in ast.walk(node.exc):
                    if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                        spelled = [o for o in options if re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", sub.value)]
                        if spelled:
                            bad.append(_where(m, node.lineno, f"ParameterError spells {spelled}"))
    assert bad == []


# Option names still spelled in the core's prose (messages, notes, next steps), by module: issue 37
# moves them to typed next steps rendered by commands/. The count may only go down.
OPTION_PROSE_LEFT = 193


def test_option_names_in_the_core_only_go_down() -> None:
    options = _option_names()
    pattern = re.compile(r"(?<![\w-])(" + "|".join(sorted(map(re.escape, options), key=len, reverse=True))
                         + r")(?![\w-])")
    found = sum(len(pattern.findall(text)) for m in _core() if m.path.name != "__init__.py"
                and m.path.as_posix() not in ("kernels/runtime.py", "proofs/cpu_pytest_plugin.py",
                                              "proofs/selftest/child.py")
                for _, text in _prose(m))
    assert found <= OPTION_PROSE_LEFT, f"{found} option names in the core's prose (was {OPTION_PROSE_LEFT})"
    print(f"option names left in the core's prose: {found}")


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
LONG_FUNCTIONS_LEFT = {
    "checkout/resolving.py:open_workspace",
    "checkout/transaction.py:recover",
    "checkout/treestatus.py:_tree_status",
    "childproc.py:run",
    "forks/porting.py:new_pin",
    "forks/porting.py:port_series",
    "kernels/sources.py:loose_intersection",
    "kernels/toolchain.py:resolve",
    "pins/lock.py:_parse_pin",
    "series/engine.py:check_one",
    "series/patches.py:git_headers",
    "series/patches.py:load_patch",
    "zipcopy.py:chunks",
}


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
    tests/test_checkout.py and tests/test_git.py)."""
    source = (PACKAGE / "git.py").read_text()
    assert "raise UnguardedCheckout(" in source and "_GUARDED.get(os.path.realpath(cwd))" in source
