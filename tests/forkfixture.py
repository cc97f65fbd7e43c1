"""A fork maintainer's lived-in checkout (issue 35), and what must never change in it.

:func:`make_fork` clones a source repository (the small upstream of conftest, or a real pin's
tree from the cache) and gives it what a fork someone lives in has, all at once: history of
its own, two branches and a tag, two remotes, a submodule, a linked worktree on the second
branch, a stash, ignored files (in the checkout, the worktree and the submodule), and a
hostile but legitimate config: hooks, fsmonitor, gpg signing, pagers, colour, mailmap,
``format.*`` and ``diff.*`` settings, submodule recursion, settings in included files
(``include.path``, ``includeIf``), no committer identity.  Every program that config names
writes a marker when it runs: :meth:`Fork.ran` lists them (none may ever run).

:meth:`Fork.snapshot` records what is the maintainer's (refs, HEADs, config files, reflogs,
stash, every untracked and ignored file, the submodule and the worktree);
:meth:`Fork.assert_kept` compares two snapshots: nothing lost or rewritten, only the refs
named may move (forward), new reflog entries are dsv4patch's.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

HOOKS = ("applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
         "prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout", "post-merge",
         "pre-push", "pre-receive", "update", "post-receive", "post-update", "reference-transaction",
         "push-to-checkout", "pre-auto-gc", "post-rewrite", "sendemail-validate", "fsmonitor-watchman",
         "post-index-change")
# What the test's own git (the maintainer's hands) runs with, so that only dsv4patch can leave a marker.
USER_OVERRIDES = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "commit.gpgSign=false",
                  "-c", "tag.gpgSign=false", "-c", "log.showSignature=false", "-c", "protocol.file.allow=always",
                  "-c", "submodule.recurse=false", "-c", "core.pager=cat", "-c", "color.ui=never")
IDENT = {"GIT_AUTHOR_NAME": "Acme Maintainer", "GIT_AUTHOR_EMAIL": "maint@acme.example",
         "GIT_COMMITTER_NAME": "Acme Maintainer", "GIT_COMMITTER_EMAIL": "maint@acme.example",
         "GIT_AUTHOR_DATE": "2002-02-02T00:00:00Z", "GIT_COMMITTER_DATE": "2002-02-02T00:00:00Z"}


def run_git(cwd: Path, *args: str, check: bool = True) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", **IDENT)
    res = subprocess.run(["git", "-c", "init.defaultBranch=main", *USER_OVERRIDES, *args], cwd=cwd, env=env,
                         capture_output=True, text=True)
    if check and res.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} in {cwd}: {res.stderr}")
    return res.stdout.strip()


def _marker_script(markers: Path, name: str) -> Path:
    script = markers / "bin" / name
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(f"#!/bin/sh\necho \"$0 $*\" >> '{markers / 'RAN'}'\ntouch '{markers / name}.RAN'\ncat\n")
    script.chmod(0o755)
    return script


def _sha(path: Path) -> str:
    if path.is_symlink():
        return "-> " + os.readlink(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Snapshot:
    refs: dict[str, str]
    heads: dict[str, str]  # checkout -> HEAD (symbolic ref or commit)
    config: dict[str, bytes]
    reflog: dict[str, bytes]
    stash: str
    loose: dict[str, str]  # untracked and ignored files (checkout, worktree, submodule) -> content hash


@dataclass(frozen=True)
class Fork:
    root: Path
    path: Path  # the maintainer's checkout
    worktree: Path  # a linked worktree of it, on branch release
    submodule: str  # the submodule's path in the checkout
    markers: Path

    def git(self, *args: str, cwd: Path | None = None) -> str:
        """The maintainer's own git (their hooks and signing off: they are not under test)."""
        return run_git(cwd or self.path, *args)

    def ran(self) -> list[str]:
        log = self.markers / "RAN"
        return log.read_text().splitlines() if log.exists() else []

    def _config_files(self) -> list[Path]:
        gitdir = self.path / ".git"
        found = [gitdir / "config", self.root / "acme.inc", self.root / "acme-main.inc",
                 gitdir / "modules" / self.submodule / "config"]
        found += sorted((gitdir / "worktrees").glob("*/config.worktree"))
        return [f for f in found if f.exists()]

    def snapshot(self) -> Snapshot:
        gitdir = self.path / ".git"
        refs = dict(line.split(" ", 1)[::-1] for line in
                    self.git("for-each-ref", "--format=%(objectname) %(refname)").splitlines())
        heads = {}
        for name, where in (("checkout", self.path), ("worktree", self.worktree),
                            ("submodule", self.path / self.submodule)):
            # One call: the commit, then the branch HEAD names ("HEAD" when detached: no branch).
            oid, sym = run_git(where, "rev-parse", "HEAD", "--symbolic-full-name", "HEAD").splitlines()
            heads[name] = f"{'' if sym == 'HEAD' else sym} {oid}"
        reflog = {}
        for logs in [gitdir / "logs", *sorted((gitdir / "worktrees").glob("*/logs")),
                     gitdir / "modules" / self.submodule / "logs"]:
            for f in sorted(logs.rglob("*")):
                if f.is_file():
                    reflog[str(f.relative_to(gitdir))] = f.read_bytes()
        loose = {}
        for name, where in (("checkout", self.path), ("worktree", self.worktree),
                            ("submodule", self.path / self.submodule)):
            # Without exclude options every untracked file is listed, ignored or not (one call, not two).
            out = run_git(where, "ls-files", "-z", "--others")
            for rel in sorted({p for p in out.split("\0") if p}):
                full = where / rel
                loose[f"{name}:{rel}"] = _sha(full) if full.is_file() or full.is_symlink() else "<dir>"
        return Snapshot(refs, heads, {str(f): f.read_bytes() for f in self._config_files()}, reflog,
                        self.git("stash", "list", "--format=%H %gs"), loose)

    def assert_kept(self, before: Snapshot, *, moved: frozenset[str] = frozenset(),
                    created: frozenset[str] = frozenset(), head: bool = False,
                    advance: bool = False, new_files: bool = False) -> Snapshot:
        """Nothing of the maintainer's lost or rewritten since ``before``: the config files, stash,
        untracked and ignored files, the worktree's and the submodule's state are the same; no ref
        is gone; only ``moved`` refs advanced (to descendants) and only ``created`` ones are new
        (``advance``: any branch may advance and new ones appear); reflogs only grew, by
        dsv4patch's entries; the checkout's HEAD moved only with ``head``; new untracked files
        only with ``new_files`` (an open conflict workspace's merged files).
        No program of the fork's config ran.  Returns the snapshot now."""
        now = self.snapshot()
        assert self.ran() == [], f"programs of the fork's config ran: {self.ran()}"
        assert now.config == before.config, "the fork's config changed"
        assert now.stash == before.stash, "the stash changed"
        lost = {k: v for k, v in before.loose.items() if now.loose.get(k) != v}
        assert lost == {}, f"untracked or ignored files lost or changed: {sorted(lost)}"
        new_loose = sorted(set(now.loose) - set(before.loose))
        assert new_files or new_loose == [], f"files left behind: {new_loose}"
        assert now.heads["worktree"] == before.heads["worktree"]
        assert now.heads["submodule"] == before.heads["submodule"]
        if not head:
            assert now.heads["checkout"] == before.heads["checkout"]
        for ref, oid in before.refs.items():
            assert ref in now.refs, f"{ref} was deleted"
            if ref in moved or (advance and ref.startswith("refs/heads/")):
                forward = subprocess.run(["git", "-C", str(self.path), "merge-base", "--is-ancestor", oid,
                                          now.refs[ref]], capture_output=True).returncode == 0
                assert forward, f"{ref} did not move forward"
            else:
                assert now.refs[ref] == oid, f"{ref} moved"
        fresh = set(now.refs) - set(before.refs)
        assert fresh <= set(created) or (advance and all(r.startswith("refs/heads/") for r in fresh)), sorted(fresh)
        for name, data in before.reflog.items():
            assert now.reflog.get(name, b"").startswith(data), f"reflog {name} was rewritten"
            added = now.reflog[name][len(data):].decode()
            assert all("dsv4patch" in line for line in added.splitlines()), (name, added)
        return now


HOSTILE = """[core]
\thooksPath = {hooks}
\tfsmonitor = {bin}/fsmonitor
\tpager = {bin}/pager
\teditor = {bin}/editor
\taskPass = {bin}/askpass
\tsshCommand = {bin}/ssh
\tuntrackedCache = true
[commit]
\tgpgSign = true
[tag]
\tgpgSign = true
[gpg]
\tprogram = {bin}/gpg
[log]
\tshowSignature = true
\tmailmap = true
[mailmap]
\tfile = {root}/mailmap
[credential]
\thelper = {bin}/credential
[pager]
\tlog = {bin}/pager
\tstatus = {bin}/pager
\tdiff = {bin}/pager
[alias]
\tstatus = !{bin}/alias
[format]
\tsignOff = true
\theaders = "X-Acme: fork\\n"
\tsubjectPrefix = ACME
\tnumbered = true
\tfrom = true
\tsignature = acme
\tcoverLetter = auto
\tthread = shallow
[diff]
\tnoprefix = true
\tmnemonicPrefix = true
\tcontext = 9
\talgorithm = histogram
\tignoreSubmodules = none
\torderFile = {root}/order
[color]
\tui = always
\tdiff = always
\tgrep = always
\tstatus = always
[status]
\tsubmoduleSummary = true
\tshowUntrackedFiles = no
[submodule]
\trecurse = true
[fetch]
\trecurseSubmodules = true
[grep]
\tpatternType = perl
\tlineNumber = true
[merge]
\tconflictStyle = zdiff3
[i18n]
\tcommitEncoding = ISO-8859-1
\tlogOutputEncoding = ISO-8859-1
[trailer]
\tseparators = "#"
[include]
\tpath = ../../acme.inc
[includeIf "onbranch:main"]
\tpath = ../../acme-main.inc
"""
# In the included files: more of the same, where a check of .git/config alone would not see it.
INCLUDED = """[core]
\tfsmonitor = {bin}/fsmonitor-included
\tabbrev = 16
[format]
\tsignOff = true
[diff]
\tsrcPrefix = SRC/
\tdstPrefix = DST/
"""
INCLUDED_MAIN = """[core]
\thooksPath = {hooks}
[log]
\tdecorate = full
\tabbrev = 20
"""


def make_fork(root: Path, source: Path, commit: str, *, hostile: bool = True) -> Fork:
    """A lived-in fork of ``source`` at ``commit`` in ``root/vllm-acme`` (see the module docstring).

    Branches: ``main`` (HEAD: the fork's own commits on ``commit``) and ``release`` (checked
    out in the linked worktree ``root/vllm-acme-release``); remotes ``origin`` (``source``) and
    ``mirror``; tag ``acme-1``; submodule ``third_party/acme-sub``; a stash; ignored files."""
    root.mkdir(parents=True, exist_ok=True)
    markers = root / "markers"
    markers.mkdir()
    sub_src = root / "acme-sub.git"
    sub_work = root / "acme-sub-src"
    sub_work.mkdir()
    run_git(sub_work, "init", "-q")
    (sub_work / "data.txt").write_text("vendored\n")
    run_git(sub_work, "add", "-A")
    run_git(sub_work, "commit", "-qm", "acme-sub")
    run_git(root, "clone", "-q", "--bare", str(sub_work), str(sub_src))
    path = root / "vllm-acme"
    run_git(root, "clone", "-q", "--no-checkout", str(source), str(path))
    run_git(path, "checkout", "-q", "-B", "main", commit)
    run_git(path, "remote", "add", "mirror", "https://git.example.com/acme/vllm.git")
    (path / "FORK.md").write_text("Acme's fork of vLLM\n")
    (path / ".gitignore").write_text("*.log\nbuild/\n__pycache__/\n")
    run_git(path, "add", "FORK.md", ".gitignore")
    run_git(path, "commit", "-qm", "acme: our readme and ignores")
    run_git(path, "submodule", "add", "-q", str(sub_src), "third_party/acme-sub")
    # The URL the fork publishes (the same commit ids wherever the fixture is made).
    run_git(path, "config", "-f", ".gitmodules", "submodule.third_party/acme-sub.url",
            "https://git.example.com/acme/acme-sub.git")
    run_git(path, "add", ".gitmodules")
    run_git(path, "commit", "-qm", "acme: vendor acme-sub")
    (path / "vllm" / "acme.py").write_text("ACME = True\n")
    run_git(path, "add", "vllm/acme.py")
    run_git(path, "commit", "-qm", "acme: our module")
    run_git(path, "tag", "acme-1")
    worktree = root / "vllm-acme-release"
    run_git(path, "worktree", "add", "-q", "-b", "release", str(worktree))
    (path / "FORK.md").write_text("Acme's fork of vLLM (work in progress)\n")
    run_git(path, "stash", "push", "-q", "-m", "wip readme")
    # Ignored files the maintainer keeps: nothing dsv4patch does may touch them.
    (path / "notes.log").write_text("my notes\n")
    (path / "build").mkdir()
    (path / "build" / "cache.bin").write_bytes(os.urandom(64))
    (path / "vllm" / "__pycache__").mkdir()
    (path / "vllm" / "__pycache__" / "acme.cpython-312.pyc").write_bytes(b"\x00pyc")
    (worktree / "release.log").write_text("release notes\n")
    (path / "third_party" / "acme-sub" / "local.log").write_text("in the submodule\n")
    subdir = path / ".git" / "modules" / "third_party" / "acme-sub"
    (subdir / "info").mkdir(exist_ok=True)
    (subdir / "info" / "exclude").write_text("*.log\n")
    fork = Fork(root, path, worktree, "third_party/acme-sub", markers)
    if hostile:
        make_hostile(fork)
    return fork


def make_hostile(fork: Fork) -> None:
    """The fork's config names programs everywhere a maintainer's might (all pinned off by dsv4patch)."""
    bin_ = fork.markers / "bin"
    hooks = fork.markers / "hooks"
    hooks.mkdir(exist_ok=True)
    for name in ("fsmonitor", "fsmonitor-included", "pager", "editor", "askpass", "ssh", "gpg", "credential",
                 "alias", "hook"):
        _marker_script(fork.markers, name)
    for hook in HOOKS:
        (hooks / hook).symlink_to(bin_ / "hook")
        (fork.path / ".git" / "hooks" / hook).unlink(missing_ok=True)
        (fork.path / ".git" / "hooks" / hook).symlink_to(bin_ / "hook")
    (fork.root / "mailmap").write_text("Somebody Else <else@example.com> dsv4patch <dsv4patch@localhost>\n"
                                       "Somebody Else <else@example.com> <maint@acme.example>\n")
    (fork.root / "order").write_text("vllm/worker.py\n*\n")
    fmt = {"hooks": hooks, "bin": bin_, "root": fork.root}
    with open(fork.path / ".git" / "config", "a") as fh:
        fh.write(HOSTILE.format(**fmt))
    (fork.root / "acme.inc").write_text(INCLUDED.format(**fmt))
    (fork.root / "acme-main.inc").write_text(INCLUDED_MAIN.format(**fmt))
    sub_config = fork.path / ".git" / "modules" / fork.submodule / "config"
    with open(sub_config, "a") as fh:
        fh.write(f"[core]\n\thooksPath = {hooks}\n\tfsmonitor = {bin_}/fsmonitor\n")
    run_git(fork.path, "config", "extensions.worktreeConfig", "true")
    run_git(fork.worktree, "config", "--worktree", "core.fsmonitor", str(bin_ / "fsmonitor"))


def series_patches(source: Path, out: Path, steps: list[tuple[str, dict[str, str], str]]) -> list[Path]:
    """``git format-patch`` files of ``steps`` (name, path -> new content, message), each made
    on the tree the steps before it left (so later patches may change lines earlier ones did)."""
    work = out / ".series-work"
    run_git(out, "clone", "-q", str(source), str(work))
    made = []
    for name, edits, message in steps:
        for rel, content in edits.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(content)
        run_git(work, "add", "-A")
        run_git(work, "commit", "-qm", message)
        produced = Path(run_git(work, "format-patch", "-1", "-o", str(out)))
        made.append(produced.rename(out / name))
    import shutil

    shutil.rmtree(work)
    return made


def make_project(root: Path, upstream: object, fork: Fork) -> Path:
    """A project (``root/proj``: ``locks/vllm.toml``, ``patches/``) whose series the fork takes.

    Patches of the small upstream (conftest.Upstream): 0001 adds to ``vllm/envs.py``, 0002
    changes a line of ``vllm/worker.py``, 0003 changes that line again and creates
    ``vllm/new.py`` (so 0002 is found in a tree that carries the series only once 0003 is
    taken off, as fix 7 and extra 2 of the real series).  Pins: ``up`` (git, the upstream
    commit) and ``acme`` (local: the fork's checkout at its HEAD, written as the docs' template
    writes it, the path relative to the lock); both read the one series ``main``."""
    from conftest import MINI_FILES, git_pin, local_pin, write_lock

    proj = root / "proj"
    (proj / "locks").mkdir(parents=True)
    (proj / "patches").mkdir()
    worker = MINI_FILES["vllm/worker.py"]
    series_patches(upstream.path, proj / "patches", [  # type: ignore[attr-defined]
        ("0001-envs.patch", {"vllm/envs.py": MINI_FILES["vllm/envs.py"] + "A = 1\n"}, "envs: add A\n\nFix: 1"),
        ("0002-worker.patch", {"vllm/worker.py": worker.replace("return 0", "return 2")}, "worker: return 2\n\nFix: 2"),
        ("0003-new.patch", {"vllm/worker.py": worker.replace("return 0", "return 3"), "vllm/new.py": "NEW = 1\n"},
         "new: a module, and return 3\n\nFix: 3"),
    ])
    head = fork.git("rev-parse", "HEAD")
    rel = os.path.relpath(fork.path, proj / "locks")
    return write_lock(proj / "locks/vllm.toml",
                      {"up": git_pin("up", upstream), "acme": local_pin("acme", rel, head)},  # type: ignore[arg-type]
                      {"main": ["0001-envs.patch", "0002-worker.patch",
                                "0003-new.patch"]}, series_dir="../patches")
