"""The README and docs/ stay true: the commands they show parse, the links resolve, the README stays short.

Every ``dsv4patch ...`` command in a fenced shell block of README.md or docs/*.md is
parsed by the real CLI parser (``main.build_parser().parse_args``) and must parse: a
renamed option or verb, or a missing required one, fails here. Inline code that starts
with ``dsv4patch`` often names a verb or an option in prose (`dsv4patch build`,
`wheel --kernels`): it must name real verbs, options and choices, but may leave out
what a full command needs. A placeholder is written ``<like-this>`` or in capitals
(``DIR``, ``PIN``) and stands for one word; an inline synopsis with ``[optional]``
parts or ``a | b`` choices is skipped.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
import tomlkit

from dsv4patch import main
from dsv4patch.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 400
SHELL_FENCES = {"", "sh", "bash", "shell", "console"}
PLACEHOLDER = re.compile(r"<[^<>\s]+>|\b[A-Z][A-Z0-9_]*\b")
OPERATORS = {"&&", "||", ";", "|", "(", ")", "&", ">", ">>", "<", "2>", "$"}


def _fenced_lines(text: str) -> list[str]:
    lines: list[str] = []
    for m in re.finditer(r"^```([\w-]*)\n(.*?)^```", text, re.M | re.S):
        if m.group(1) in SHELL_FENCES:
            lines += m.group(2).replace("\\\n", " ").splitlines()
    return lines


def _inline_commands(text: str) -> list[str]:
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    spans = re.findall(r"`([^`\n]+)`", text)
    return [s for s in spans if re.search(r"(^|[\s/])dsv4patch ", s) and not re.search(r"[\[\]|…]|\.\.\.", s)]


def _dsv4patch_argvs(line: str) -> list[list[str]]:
    """The argument lists of every dsv4patch invocation on one shell line."""
    line = PLACEHOLDER.sub("PLACEHOLDER", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError as exc:  # an unclosed quote: not a command a shell would run
        return [[f"(line does not split: {exc}: {line.strip()})"]] if "dsv4patch" in line else []
    argvs: list[list[str]] = []
    current: list[str] = []
    for word in [*words, ";"]:
        if word in OPERATORS or set(word) <= set("();<>|&"):
            while current and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", current[0]):
                current.pop(0)  # VAR=value before the command
            if current and Path(current[0]).name == "dsv4patch":
                argvs.append(current[1:])
            current = []
        else:
            current.append(word)
    return argvs


def _commands() -> list[tuple[str, list[str], bool]]:
    """(page, argv, fenced) for every dsv4patch invocation the pages show."""
    found: list[tuple[str, list[str], bool]] = []
    for page in PAGES:
        text = page.read_text()
        name = page.relative_to(ROOT).as_posix()
        for fenced, lines in ((True, _fenced_lines(text)), (False, _inline_commands(text))):
            for line in lines:
                found += [(name, argv, fenced) for argv in _dsv4patch_argvs(line)]
    return found


COMMANDS = _commands()


def _parser(verb: str | None) -> argparse.ArgumentParser:
    """The CLI's parser, taking only full option names (the docs must not rely on abbreviations)."""
    parser = main.build_parser(verb)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.allow_abbrev = False
    parser.allow_abbrev = False
    return parser


def test_the_docs_show_commands() -> None:
    """The scan finds the README's commands (a broken scan would pass everything below)."""
    readme = [argv for page, argv, fenced in COMMANDS if page == "README.md" and fenced]
    assert ["apply", "--lock", "locks/vllm.toml"] in readme  # the first command: the card's
    assert len(readme) >= 7 and len(COMMANDS) >= 20


@pytest.mark.parametrize("page,argv,fenced", COMMANDS,
                         ids=[f"{p}:{' '.join(a)}" + ("" if f else " (inline)") for p, a, f in COMMANDS])
def test_command_parses(page: str, argv: list[str], fenced: bool) -> None:
    try:
        args = _parser(argv[0] if argv else None).parse_args(argv)
    except UsageError as exc:
        incomplete = re.search(r"arguments are required|expected one argument|one of the arguments .* is required", str(exc))
        if fenced or not incomplete:
            pytest.fail(f"{page}: `dsv4patch {' '.join(argv)}` does not parse: {exc}")
        return
    assert args.command == argv[0]


def test_placeholder_substitution_still_catches_a_wrong_option() -> None:
    with pytest.raises(UsageError):
        _parser("apply").parse_args(_dsv4patch_argvs("dsv4patch apply --tree DIR --no-such-option")[0])
    with pytest.raises(UsageError):  # an abbreviation of --no-build
        _parser("apply").parse_args(_dsv4patch_argvs("dsv4patch apply --no-bui")[0])


def test_readme_is_short() -> None:
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail into docs/"


def _links(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    heads = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_links_resolve(page: Path) -> None:
    """Every relative link names a file that exists, and an anchor a heading of that file."""
    broken = []
    for link in _links(page):
        if re.match(r"^[a-z]+:", link):
            continue  # https:, mailto:
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists() or (anchor and target.suffix == ".md" and anchor not in _anchors(target)):
            broken.append(link)
    assert broken == []


def test_readme_links_every_docs_page() -> None:
    links = {(ROOT / link.partition("#")[0]).resolve() for link in _links(README)}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in links]
    assert missing == []


def test_every_dependency_is_explained() -> None:
    """docs/dependencies.md names every runtime and test dependency of pyproject.toml."""
    project = tomlkit.parse((ROOT / "pyproject.toml").read_text()).unwrap()["project"]
    specs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        specs += extra
    names = {re.match(r"[A-Za-z0-9._-]+", s).group(0).lower() for s in specs}  # type: ignore[union-attr]
    text = (ROOT / "docs" / "dependencies.md").read_text().lower()
    assert sorted(n for n in names if f"**{n}**" not in text) == []
