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


def _port_examples() -> list[tuple[str, ...]]:
    """Every ``dsv4patch port`` example the pages and ``port --help`` show without a placeholder."""
    found: list[tuple[str, ...]] = []
    texts = [p.read_text() for p in PAGES]
    help_text = main.build_parser("port").format_help()
    texts.append(f"`{help_text}`" if "dsv4patch port " in help_text else "")
    for text in texts:
        for line in _fenced_lines(text) + _inline_commands(text):
            for argv in _dsv4patch_argvs(line):
                if len(argv) > 1 and argv[0] == "port" and "PLACEHOLDER" not in argv and tuple(argv) not in found:
                    found.append(tuple(argv))
    return found


def _first_changed_line(text: str) -> tuple[str, int]:
    """The file and line number (in the unpatched file) of the first line a patch removes."""
    path, old = "", 0
    for ln in text.splitlines():
        if ln.startswith("--- a/"):
            path = ln[6:]
        elif ln.startswith("@@ "):
            old = int(ln.split()[1][1:].split(",")[0])
        elif old and ln.startswith("-") and not ln.startswith("---"):
            return path, old
        elif old and ln.startswith(" "):
            old += 1
    raise AssertionError("the patch removes no line")


def _git(repo: Path, *args: str, check: bool = True) -> str:
    import subprocess

    return subprocess.run(["git", "-C", str(repo), *args], check=check, capture_output=True,
                          text=True).stdout.strip()


def test_port_examples_run_as_typed(tmp_path, shared_cache, monkeypatch) -> None:
    """issue 28 item 3: each port example, run as typed (in a copy of this project, with the real
    vLLM sdists of the shared cache), does what the page next to it says."""
    import json
    import shutil
    import subprocess

    from dsv4patch import tree
    from dsv4patch.lock import load
    from dsv4patch.progress import Progress
    from dsv4patch.series import series_for_pin
    from dsv4patch.store import Store

    proj = tmp_path / "proj"
    for d in ("locks", "patches"):
        shutil.copytree(ROOT / d, proj / d)
    lock = proj / "locks" / "vllm.toml"
    before = lock.read_text()
    # ../vllm-acme: a fork checkout of 0.27.1's tree on its branch `acme`, with a commit of its
    # own that changes the first line 0001 changes (the page's --local and --workspace examples).
    pr = tree.materialize(load(lock).pin("0.27.1"), Store.open(shared_cache), Progress(False))
    acme = tmp_path / "vllm-acme"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(pr.repo), str(acme)], check=True)
    subprocess.run(["git", "-C", str(acme), "checkout", "-q", "-b", "acme", pr.base_commit], check=True)
    first = series_for_pin(load(lock), load(lock).pin("0.27.1")).patches[0]
    path, line = _first_changed_line(first.path.read_text())
    lines = (acme / path).read_text().split("\n")
    lines[line - 1] += " /* acme */"
    (acme / path).write_text("\n".join(lines))
    subprocess.run(["git", "-C", str(acme), "-c", "user.name=a", "-c", "user.email=a@a", "commit", "-qam",
                    "acme: our change"], check=True)
    acme_head = subprocess.run(["git", "-C", str(acme), "rev-parse", "HEAD"], check=True,
                               capture_output=True, text=True).stdout.strip()
    monkeypatch.chdir(proj)
    monkeypatch.delenv("DSV4PATCH_LOCK", raising=False)
    monkeypatch.setenv("DSV4PATCH_CACHE", str(shared_cache))
    want = {
        ("port", "--to", "0.28.0", "--dry-run"): 0,
        ("port", "--to", "0.26.0", "--name", "0.26.0-new"): 1,
        ("port", "--to", "0.26.0", "--name", "0.26.0-new", "--workspace", "../ws026"): 1,
        ("port", "--local", "../vllm-acme", "--workspace", "../vllm-acme"): 1,
        ("port", "--abort", "--workspace", "../vllm-acme"): 0,
        ("port", "--local", "../vllm-acme", "--dry-run"): 1,
    }
    examples = _port_examples()
    assert set(examples) == set(want), f"a port example without an expected result here: {examples}"
    for argv in examples:
        import io
        from contextlib import redirect_stdout

        buf = io.StringIO()
        with redirect_stdout(buf):
            rc = main.main([*argv, "--format", "json"])
        assert rc == want[argv], (argv, buf.getvalue()[-3000:])
        rep = json.loads(buf.getvalue())
        actions = {k[:4]: v["action"] for k, v in rep["patches"].items()}
        if argv[2] == "0.28.0":
            # the seven fixes and extra 1 are upstream; the later extras come from 0.28.0's variants
            assert {k: v for k, v in actions.items() if v == "drop"} == {f"000{i}": "drop" for i in range(1, 9)}
            assert actions["0009"] == "resolved"
            assert set(actions.values()) <= {"drop", "resolved", "keep", "refresh", "merge"}
            assert any("agrees with the locked pin 0.28.0" in n for n in rep["notes"])
        elif argv[1] == "--abort":
            assert rep["aborted"] is True and rep["head"] == acme_head
            assert _git(acme, "symbolic-ref", "HEAD") == "refs/heads/acme"
            assert _git(acme, "status", "--porcelain") == ""
        elif argv[1] == "--local":
            # the fork's own commit conflicts with 0001 (nothing is carried after a conflict)
            assert actions["0001"] == "conflict" and set(list(actions.values())[1:]) == {"not-ported"}
            if "--workspace" in argv:  # the fork's checkout itself, HEAD detached at its commit
                assert rep["workspace"]["own_checkout"] == {"base": acme_head, "branch": "refs/heads/acme"}
                assert rep["workspace"]["conflicts"] == [path]
                assert _git(acme, "rev-parse", "HEAD") == acme_head
                assert _git(acme, "symbolic-ref", "-q", "HEAD", check=False) == ""
                assert _git(acme, "rev-parse", "refs/heads/acme") == acme_head
        else:
            assert actions["0001"] == "refresh" and actions["0002"] == "merge"
            assert actions["0003"] == "conflict"
        assert lock.read_text() == before  # nothing written to the lock
    assert (tmp_path / "ws026" / ".git" / "dsv4patch-port.json").is_file()


def test_release_adoption_runs_as_typed(tmp_path, shared_cache, monkeypatch) -> None:
    """issue 38 item 4: docs/lock.md's three commands that adopt a new release, run as typed in a
    copy of this project whose lock lacks 0.28.0, against a package index on 127.0.0.1 that serves
    the real 0.28.0 sdist: the watcher lists it (exit 1: it needs a decision), --write adds the
    entry, and check accepts the new pin; the entry is the one the real lock has."""
    import io
    import json
    import os
    import shutil
    from contextlib import redirect_stdout

    from dsv4patch.lock import load
    from dsv4patch.progress import Progress
    from dsv4patch.store import Store
    from localindex import serve

    text = (ROOT / "docs" / "lock.md").read_text()
    block = re.search(r"^### Adopting a new release in three commands\n.*?^```sh\n(.*?)^```", text, re.M | re.S)
    assert block, "docs/lock.md has no 'Adopting a new release in three commands' block"
    argvs = [a for line in block.group(1).splitlines() for a in _dsv4patch_argvs(line)]
    assert [a[0] for a in argvs] == ["releases", "releases", "check"]
    real = load(ROOT / "locks" / "vllm.toml").pin("0.28.0")
    proj = tmp_path / "proj"
    for d in ("locks", "patches"):
        shutil.copytree(ROOT / d, proj / d)
    doc = tomlkit.parse((proj / "locks" / "vllm.toml").read_text())
    del doc["pins"]["0.28.0"]  # type: ignore[union-attr]
    (proj / "locks" / "vllm.toml").write_text(tomlkit.dumps(doc))
    sdist = Store.open(shared_cache).fetch_blob(real.source.url, real.source.sha256, real.source.size,
                                                "vllm 0.28.0", Progress(False))
    (tmp_path / "www" / "f").mkdir(parents=True)
    shutil.copyfile(sdist, tmp_path / "www" / "f" / "vllm-0.28.0.tar.gz")
    page = {"meta": {"api-version": "1.1"}, "name": "vllm", "files": [
        {"filename": "vllm-0.28.0.tar.gz", "url": "/f/vllm-0.28.0.tar.gz",
         "hashes": {"sha256": real.source.sha256}, "size": real.source.size}]}
    monkeypatch.chdir(proj)
    monkeypatch.delenv("DSV4PATCH_LOCK", raising=False)
    monkeypatch.setenv("DSV4PATCH_CACHE", str(shared_cache))
    with serve(tmp_path / "www") as idx:
        idx.pages["/simple/vllm/"] = ("application/vnd.pypi.simple.v1+json", json.dumps(page).encode())
        monkeypatch.setenv("DSV4PATCH_INDEX_URL", idx.url + "/simple")
        results = []
        for argv in argvs:
            buf = io.StringIO()
            with redirect_stdout(buf):
                rc = main.main([*argv, "--format", "json"])
            results.append((rc, json.loads(buf.getvalue())))
    (rc1, listed), (rc2, written), (rc3, checked) = results
    assert rc1 == 1 and listed["needs_decision"] == ["0.28.0"], listed
    assert listed["releases"]["0.28.0"]["decision"] == "adopt"
    assert rc2 == 0 and written["releases"]["0.28.0"]["written"] is True
    assert rc3 == 0 and checked["pins"]["0.28.0"]["ok"] is True
    pin = load(proj / "locks" / "vllm.toml").pin("0.28.0")
    assert (pin.base_tree, pin.patched_tree, pin.expect_patches) == (real.base_tree, real.patched_tree,
                                                                     real.expect_patches)
    assert {k: os.path.relpath(v, proj / "locks") for k, v in pin.variants.items()} == \
        {k: os.path.relpath(v, ROOT / "locks") for k, v in real.variants.items()}
