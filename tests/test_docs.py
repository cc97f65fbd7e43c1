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


FORKS = ROOT / "docs" / "forks-and-porting.md"


def _journey_items(text: str) -> list[tuple[str, str]]:
    """("toml", block) and ("sh", line) of a page, in page order (a line's ``\\``-continuations joined)."""
    items: list[tuple[str, str]] = []
    for m in re.finditer(r"^```([\w-]*)\n(.*?)^```", text, re.M | re.S):
        if m.group(1) == "toml":
            items.append(("toml", m.group(2)))
        elif m.group(1) in SHELL_FENCES:
            for line in m.group(2).replace("\\\n", " ").splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    items.append(("sh", line.strip()))
    return items


# The forks page as the test runs it: each shell line of the page, in order, and its exit code.
JOURNEY_EXITS = [
    ("dsv4patch check --pin acme", 0),
    ('git -C ../vllm-acme commit --allow-empty -m "acme: start the DeepSeek-V4 work"', 0),
    ("dsv4patch apply --pin acme --tree ../vllm-acme --branch dsv4 --no-build", 0),
    ("dsv4patch status --pin acme --tree ../vllm-acme", 0),
    ("$EDITOR ../vllm-acme/vllm/acme_router.py", 0),
    ("git -C ../vllm-acme add vllm/acme_router.py", 0),
    ('git -C ../vllm-acme commit -m "acme: route our traffic"', 0),
    ("dsv4patch apply --pin acme --tree ../vllm-acme --no-build", 0),
    ("dsv4patch status --pin acme --tree ../vllm-acme", 0),
    ("dsv4patch port --local ../vllm-acme --name acme-dsv4 --dry-run", 0),
    ("dsv4patch refresh --pin acme --tree ../vllm-acme --as-variant", 0),
    ("dsv4patch check --pin 0.27.1", 0),
    ("cat patches/000[1-7]-*.patch patches/extra/00*.patch patches/variants/acme/0011-*.patch | "
     "git -C ../vllm-acme-release am -q --3way", 0),
    ("git -C ../vllm-acme switch -q main", 0),
    ("$EDITOR ../vllm-acme/vllm/models/deepseek_v4/amd/rocm.py", 0),
    ('git -C ../vllm-acme commit -qam "acme: our ROCm reshape"', 0),
    ("dsv4patch check --pin acme-next", 1),
    ("dsv4patch apply --pin acme-next --tree build/acme-next --3way --no-build", 1),
    ("$EDITOR build/acme-next/vllm/models/deepseek_v4/amd/rocm.py", 0),
    ("dsv4patch resolve --continue --tree build/acme-next", 0),
    ("dsv4patch check --pin acme-next", 0),
    ("dsv4patch port --local ../vllm-acme --name acme-port --dry-run", 1),
    ("dsv4patch port --local ../vllm-acme --name acme-port --workspace ../vllm-acme", 1),
    ("dsv4patch port --abort --workspace ../vllm-acme", 0),
    ("dsv4patch port --local ../vllm-acme --name acme-port --workspace ../vllm-acme", 1),
    ("$EDITOR ../vllm-acme/vllm/models/deepseek_v4/amd/rocm.py", 0),
    ("dsv4patch port --local ../vllm-acme --name acme-port --workspace ../vllm-acme", 0),
    ("dsv4patch apply --pin acme-port --tree ../vllm-acme --branch dsv4-next --no-build", 0),
    ("dsv4patch port --to 0.28.0 --dry-run", 0),
    ("dsv4patch port --to 0.26.0 --name 0.26.0-new", 1),
    ("dsv4patch port --to 0.26.0 --name 0.26.0-new --resolutions patches/variants/0.26.0 --dry-run", 0),
    ("dsv4patch port --to 0.26.0 --name 0.26.0-new --workspace ../ws026", 1),
]

# $EDITOR for the journey: a new file gets a module; a file with conflict markers is resolved to
# the patch's side; fix 1's first line in rocm.py gets the fork's own change.
EDITOR = """import pathlib, sys
p = pathlib.Path(sys.argv[1])
if not p.exists():
    p.write_text('\"\"\"Acme: route our traffic.\"\"\"\\n\\nROUTE = "acme"\\n')
    sys.exit(0)
text = p.read_text()
if "<<<<<<<" in text:
    out, state = [], None
    for line in text.splitlines(keepends=True):
        if line.startswith("<<<<<<<"):
            state = "ours"
        elif line.startswith("=======") and state:
            state = "theirs"
        elif line.startswith(">>>>>>>") and state:
            state = None
        elif state != "ours":
            out.append(line)
    p.write_text("".join(out))
else:
    old = "base.decode_swa_indices.reshape(base.num_decode_tokens, -1),"
    assert old in text
    p.write_text(text.replace(old, old + "  # acme", 1))
"""


def test_the_forks_page_runs_as_typed_on_a_lived_in_fork(tmp_path, shared_cache, monkeypatch) -> None:
    """issue 35: the whole journey of docs/forks-and-porting.md, every shell line as typed and in
    order, from where the page says to run it (a copy of this project; the fork beside it), on a
    lived-in fork of the real 0.27.1 tree (tests/forkfixture.py: history, branches, remotes, a
    submodule, a linked worktree, a stash, ignored files, a hostile config).  Each command's exit
    code is the page's; after each, the fork's refs, config, reflogs, stash and untracked/ignored
    files are compared, and no program of its config ran.  The page's local pin tables are
    appended to the lock as written (their commit filled in); the maintainer's own `git` runs
    with their hooks and signing off (they are not under test), and `$EDITOR` is a script."""
    import dataclasses
    import io
    import os
    import shutil
    import subprocess
    import sys
    from contextlib import redirect_stderr, redirect_stdout

    from dsv4patch.pins import repository
    from dsv4patch.pins.lock import load
    from dsv4patch.progress import Progress
    from dsv4patch.store import Store
    from forkfixture import IDENT, USER_OVERRIDES, make_fork

    proj = tmp_path / "proj"
    for d in ("locks", "patches"):
        shutil.copytree(ROOT / d, proj / d)
    lock = proj / "locks" / "vllm.toml"
    pr = repository.materialize(load(lock).pin("0.27.1"), Store.open(shared_cache), Progress(False))
    fork = make_fork(tmp_path, pr.repo, pr.base_commit)
    editor = tmp_path / "editor.py"
    editor.write_text(EDITOR)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    overrides = [o for o in USER_OVERRIDES if o != "-c"]
    env.update(IDENT, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", EDITOR=f"{sys.executable} {editor}",
               GIT_CONFIG_COUNT=str(len(overrides)))
    for i, item in enumerate(overrides):
        key, _, value = item.partition("=")
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    monkeypatch.chdir(proj)
    monkeypatch.delenv("DSV4PATCH_LOCK", raising=False)
    monkeypatch.setenv("DSV4PATCH_CACHE", str(shared_cache))

    items = _journey_items(FORKS.read_text())
    lines = [text for kind, text in items if kind == "sh"]
    assert lines == [line for line, _rc in JOURNEY_EXITS], "the page's commands changed: update JOURNEY_EXITS"
    want = iter(JOURNEY_EXITS)
    before = fork.snapshot()
    workspace_files: set[str] = set()
    for kind, text in items:
        if kind == "toml":
            doc = tomlkit.parse(text)  # every table the page shows is valid TOML
            source = next(iter(doc["pins"].values()))["source"]
            if source["kind"] == "local":
                head = fork.git("rev-parse", "HEAD")
                lock.write_text(lock.read_text() + "\n" + re.sub(r"<40-hex[^>]*>", head, text))
            continue
        line, rc_wanted = next(want)
        if line.startswith("dsv4patch "):
            argv = shlex.split(line, comments=True)[1:]
            out, err = io.StringIO(), io.StringIO()
            with redirect_stdout(out), redirect_stderr(err):
                rc = main.main(argv)
            assert rc == rc_wanted, (line, rc, out.getvalue()[-3000:], err.getvalue()[-3000:])
            # A port workspace opened in the fork holds the conflicting patch's files until it closes.
            opens = line.endswith("--workspace ../vllm-acme") and rc_wanted == 1
            now = fork.assert_kept(before, advance=True, head=True, new_files=opens)
            if opens:
                workspace_files |= set(now.loose) - set(before.loose)
        else:
            res = subprocess.run(["bash", "-c", line], cwd=proj, env=env, capture_output=True, text=True)
            assert res.returncode == rc_wanted, (line, res.stdout[-2000:], res.stderr[-2000:])
            now = fork.snapshot()
        # The workspace's files are the port's until it closes (completed or aborted: then gone).
        before = dataclasses.replace(now, loose={k: v for k, v in now.loose.items() if k not in workspace_files})
        _journey_check(line, fork, proj, lock)
    assert fork.ran() == []


def _journey_check(line: str, fork, proj: Path, lock: Path) -> None:  # type: ignore[no-untyped-def]
    """What the page says a step does, beyond its exit code."""
    from dsv4patch.pins.lock import load
    from forkfixture import run_git

    if line == "dsv4patch apply --pin acme --tree ../vllm-acme --branch dsv4 --no-build":
        assert fork.git("symbolic-ref", "HEAD") == "refs/heads/dsv4"
        assert "\nDsv4patch-Patch: 0010-" in fork.git("log", "-1", "--format=%B")
    elif line == "dsv4patch refresh --pin acme --tree ../vllm-acme --as-variant":
        pin = load(lock).pin("acme")
        assert pin.series == ("dsv4", "extra", "acme")
        assert (proj / "patches/variants/acme/series").read_text().splitlines()[-1] == \
            "0011-acme-route-our-traffic.patch"
        assert "0011" not in (proj / "patches/extra/series").read_text()
    elif line.endswith("git -C ../vllm-acme-release am -q --3way"):
        assert fork.git("rev-parse", "release^{tree}") == fork.git("rev-parse", "dsv4^{tree}")
    elif line == "dsv4patch port --local ../vllm-acme --name acme-port --workspace ../vllm-acme" and \
            not (fork.path / ".git" / "dsv4patch-port.json").exists():
        assert fork.git("symbolic-ref", "HEAD") == "refs/heads/main"  # the port completed: back on main
    elif line == "dsv4patch port --local ../vllm-acme --name acme-port --workspace ../vllm-acme":
        assert run_git(fork.path, "symbolic-ref", "-q", "HEAD", check=False) == ""  # detached
        assert "<<<<<<<" in (fork.path / "vllm/models/deepseek_v4/amd/rocm.py").read_text()
    elif line == "dsv4patch port --abort --workspace ../vllm-acme":
        assert fork.git("symbolic-ref", "HEAD") == "refs/heads/main"
    elif line == "dsv4patch apply --pin acme-port --tree ../vllm-acme --branch dsv4-next --no-build":
        assert fork.git("symbolic-ref", "HEAD") == "refs/heads/dsv4-next"
        assert fork.git("log", "-2", "--format=%s", "main").splitlines()[0] == "acme: our ROCm reshape"
    elif line == "dsv4patch port --to 0.26.0 --name 0.26.0-new --workspace ../ws026":
        assert (proj.parent / "ws026" / ".git" / "dsv4patch-port.json").is_file()
        assert "0.26.0-new" not in load(lock).pins


def test_every_port_example_is_in_the_journey() -> None:
    """Every `dsv4patch port` example the pages and `port --help` show without a placeholder runs,
    as typed, in the forks page's journey above."""
    journey = {tuple(shlex.split(line)[1:]) for line, _rc in JOURNEY_EXITS if line.startswith("dsv4patch port ")}
    assert set(_port_examples()) <= journey


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

    from dsv4patch.pins.lock import load
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


def test_the_docs_count_the_series_right() -> None:
    """issue 40: every "N fixes" / "N extras" the README and docs/ say is the series files' count."""
    words = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}
    count = {name: sum(1 for ln in (ROOT / "patches" / rel).read_text().splitlines() if ln.strip()
                       and not ln.startswith("#")) for name, rel in (("dsv4", "series"), ("extra", "extra/series"))}
    number = "|".join(words.values())
    said = re.compile(rf"\b({number}) (top-k kernel fixes|extra kernel fixes|kernel fixes|extras\b|"
                      rf"DeepSeek-V4 sparse-MLA fixes|fixes of #51538)", re.I)
    found = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for m in said.finditer(page.read_text()):
            series = "dsv4" if "sparse-MLA" in m.group(2) or "#51538" in m.group(2) else "extra"
            found.append((page.name, m.group(0), m.group(1).lower() == words[count[series]]))
    assert found and all(ok for *_, ok in found), [f for f in found if not f[2]]
