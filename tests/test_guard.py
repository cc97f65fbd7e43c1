"""dsv4patch.guard: the one guarded way to a user's checkout (issue 35).

Every command that touches a fork's checkout (``apply --tree``, ``refresh``, ``status --tree``,
``resolve``, ``port --local``, ``port --workspace``, ``build --tree``, and a ``local`` pin's
source for ``check``) refuses one whose settings name a program git would run, wherever the
setting lives: the repository's config, a file it includes (``include``/``includeIf``), a
submodule's own config; or whose attributes rewrite files, also in a linked worktree's common
directory.  Nothing runs (each program writes a marker), nothing of the fork changes
(forkfixture's snapshot), exit 5.  And a move never overwrites a file the user did not commit:
an ignored file where the series writes is refused by name.  Real git, a lived-in fork.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from dsv4patch.errors import EXIT_TREE, EXIT_USAGE
from forkfixture import Fork, make_fork, make_project, run_git


@pytest.fixture
def lived_in(tmp_path: Path, upstream) -> tuple[Fork, Path]:
    fork = make_fork(tmp_path / "acme", upstream.path, upstream.commit)
    return fork, make_project(tmp_path, upstream, fork)


def _program(fork: Fork, name: str) -> Path:
    """A program a setting names: it writes a marker when git runs it (and passes data through)."""
    script = fork.markers / "bin" / name
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(f"#!/bin/sh\necho \"{name} $*\" >> '{fork.markers / 'RAN'}'\ncat\n")
    script.chmod(0o755)
    return script


def _plant(fork: Fork, kind: str) -> None:
    """One setting (with what makes git use it) that must be refused."""
    git_dir = fork.path / ".git"
    prog = _program(fork, kind)
    attrs = git_dir / "info" / "attributes"
    attrs.parent.mkdir(exist_ok=True)
    if kind == "filter":
        with open(git_dir / "config", "a") as fh:
            fh.write(f'[filter "acme"]\n\tclean = {prog} %f\n\tsmudge = {prog} %f\n')
        attrs.write_text("*.py filter=acme\n")
    elif kind == "filter-process":
        with open(git_dir / "config", "a") as fh:
            fh.write(f'[filter "acme"]\n\tprocess = {prog}\n\trequired = true\n')
        attrs.write_text("* filter=acme\n")
    elif kind == "filter-in-include":
        with open(fork.root / "acme.inc", "a") as fh:
            fh.write(f'[filter "inc"]\n\tclean = {prog}\n')
        attrs.write_text("*.py filter=inc\n")
    elif kind == "filter-in-includeIf":
        with open(fork.root / "acme-main.inc", "a") as fh:
            fh.write(f'[filter "onbranch"]\n\tsmudge = {prog}\n\tclean = {prog}\n')
        attrs.write_text("*.py filter=onbranch\n")
    elif kind == "textconv":
        with open(git_dir / "config", "a") as fh:
            fh.write(f'[diff "acme"]\n\ttextconv = {prog}\n\tcommand = {prog}\n')
        attrs.write_text("*.py diff=acme\n")
    elif kind == "external-diff":
        with open(git_dir / "config", "a") as fh:
            fh.write(f"[diff]\n\texternal = {prog}\n")
    elif kind == "merge-driver":
        with open(git_dir / "config", "a") as fh:
            fh.write(f'[merge "acme"]\n\tdriver = {prog} %O %A %B\n')
        attrs.write_text("*.py merge=acme\n")
    elif kind == "submodule-filter":
        sub = git_dir / "modules" / fork.submodule
        with open(sub / "config", "a") as fh:
            fh.write(f'[filter "sub"]\n\tclean = {prog}\n\tsmudge = {prog}\n')
        (sub / "info" / "attributes").write_text("* filter=sub\n")
        (fork.path / fork.submodule / "data.txt").touch()  # stat-dirty: git status would clean it
    elif kind == "info-attributes-crlf":
        attrs.write_text("* text eol=crlf\n")
    elif kind == "tracked-ident":
        (fork.path / "vllm" / ".gitattributes").write_text("*.py ident\n")
        fork.git("add", "vllm/.gitattributes")
        fork.git("commit", "-qm", "acme: ident")
    else:
        raise AssertionError(kind)


KINDS = ["filter", "filter-process", "filter-in-include", "filter-in-includeIf", "textconv", "external-diff",
         "merge-driver", "submodule-filter", "info-attributes-crlf", "tracked-ident"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_command_refuses_a_fork_whose_settings_run_programs(tmp_path, upstream, cli, kind):
    fork = make_fork(tmp_path / "acme", upstream.path, upstream.commit)
    lock = make_project(tmp_path, upstream, fork)
    _plant(fork, kind)
    before = fork.snapshot()
    cache = ("--cache-dir", tmp_path / "c")
    f = str(fork.path)
    commands = [
        ("apply", "--lock", lock, "--pin", "acme", "--tree", f, "--branch", "dsv4", "--no-build", *cache),
        ("apply", "--lock", lock, "--pin", "up", "--tree", f, "--no-build", *cache),
        ("refresh", "--lock", lock, "--pin", "up", "--tree", f, *cache),
        ("status", "--lock", lock, "--pin", "up", "--tree", f),
        ("resolve", "--abort", "--tree", f),
        ("port", "--lock", lock, "--from", "up", "--local", f, "--dry-run", *cache),
        ("port", "--lock", lock, "--from", "up", "--local", f, "--workspace", f, *cache),
        ("check", "--lock", lock, "--pin", "acme", *cache),  # the local pin's source is the fork
        ("build", "--lock", lock, "--pin", "up", "--tree", f, "--dry-run", *cache),
    ]
    for argv in commands:
        res = cli(*argv)
        assert res.rc == EXIT_TREE, (argv, res.rc, res.out[-2000:], res.err[-2000:])
        assert "dsv4patch runs none of them" in res.err, (argv, res.err)
        fork.assert_kept(before)
    assert fork.ran() == []


def test_a_linked_worktree_is_refused_for_attributes_in_its_common_dir(tmp_path, upstream, cli):
    """issue 35: `* text eol=crlf` in the common .git/info/attributes of a `git worktree add` checkout
    was not seen (the worktree's private git dir was read): apply exited 0 with CRLF files."""
    fork = make_fork(tmp_path / "acme", upstream.path, upstream.commit, hostile=False)
    lock = make_project(tmp_path, upstream, fork)
    (fork.path / ".git" / "info").mkdir(exist_ok=True)
    (fork.path / ".git" / "info" / "attributes").write_text("* text eol=crlf\n")
    before = fork.snapshot()
    res = cli("apply", "--lock", lock, "--pin", "up", "--tree", fork.worktree, "--branch", "dsv4", "--no-build",
              "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_TREE and "eol=crlf" in res.err and str(fork.path / ".git" / "info" / "attributes") \
        in res.err, res.err
    fork.assert_kept(before)
    assert b"\r\n" not in (fork.worktree / "vllm" / "envs.py").read_bytes()
    # Without it the worktree takes the series (on a new branch; main's checkout is not touched).
    (fork.path / ".git" / "info" / "attributes").unlink()
    before = fork.snapshot()
    res = cli("apply", "--lock", lock, "--pin", "up", "--tree", fork.worktree, "--branch", "dsv4", "--no-build",
              "--cache-dir", tmp_path / "c", "--format", "json")
    assert res.rc == 0, res.out + res.err
    assert (fork.worktree / "vllm" / "new.py").read_text() == "NEW = 1\n"
    assert run_git(fork.worktree, "symbolic-ref", "HEAD") == "refs/heads/dsv4"
    assert run_git(fork.worktree, "status", "--porcelain") == ""
    assert (fork.path / "vllm" / "envs.py").read_text() == (fork.worktree / "vllm" / "envs.py").read_text()[:-6]
    # The worktree's own files (release.log) stay; the main checkout is where it was.
    now = fork.snapshot()
    assert now.loose == before.loose and now.heads["checkout"] == before.heads["checkout"]
    assert now.config == before.config and now.stash == before.stash


def _apply_within(tmp_path: Path, lock: Path, fork: Fork, what: str) -> tuple[int, str]:
    """``apply --tree FORK`` that must end by itself (a git blocked on a FIFO would not)."""
    proc = subprocess.Popen([sys.executable, "-m", "dsv4patch", "apply", "--lock", str(lock), "--pin", "up",
                             "--tree", str(fork.path), "--no-build", "--cache-dir", str(tmp_path / "c")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True)
    try:
        _out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # dsv4patch and the git blocked on the FIFO
        proc.communicate()
        raise AssertionError(f"apply blocked on {what}") from None
    return proc.returncode, err


def test_a_fifo_in_the_config_includes_is_refused_not_read(tmp_path, upstream):
    """git would block on an included FIFO forever; the guard checks every include is a regular file."""
    fork = make_fork(tmp_path / "acme", upstream.path, upstream.commit, hostile=False)
    lock = make_project(tmp_path, upstream, fork)
    fifo = tmp_path / "acme.fifo"
    os.mkfifo(fifo)
    with open(fork.path / ".git" / "config", "a") as fh:
        fh.write(f"[include]\n\tpath = {fifo}\n")
    code, err = _apply_within(tmp_path, lock, fork, "the FIFO the fork's config includes")
    assert code == EXIT_TREE and str(fifo) in err and "not a regular file" in err, err


@pytest.mark.parametrize("form", ["~user/", "~/"])
def test_a_fifo_included_through_a_home_directory_is_refused_not_read(tmp_path, upstream, form):
    """hostile probe D12: the guard expanded only `~/` in include.path; git also expands `~user/`, so an
    include of a FIFO named that way was never vetted and git blocked until DSV4PATCH_GIT_TIMEOUT (exit 8,
    an hour by default).  Both forms are vetted like any include: exit 5 at once, the file named."""
    import pwd

    fork = make_fork(tmp_path / "acme", upstream.path, upstream.commit, hostile=False)
    lock = make_project(tmp_path, upstream, fork)
    fifo = tmp_path / "acme.fifo"
    os.mkfifo(fifo)
    entry = pwd.getpwuid(os.getuid())
    home = entry.pw_dir if form == "~user/" else os.path.expanduser("~")
    value = (f"~{entry.pw_name}/" if form == "~user/" else "~/") + os.path.relpath(fifo, home)
    with open(fork.path / ".git" / "config", "a") as fh:
        fh.write(f"[include]\n\tpath = {value}\n")
    code, err = _apply_within(tmp_path, lock, fork, f"the FIFO the fork's config includes as {value}")
    assert code == EXIT_TREE and "not a regular file" in err, err
    assert os.path.realpath(err.split("includes, ")[1].split(" is not")[0]) == str(fifo), err


# Files git opens in its own directory or in the work tree without asking what they are: each
# hung `git status` (or every git call) when it was a FIFO (git 2.39, checked before the guard).
FIFO_PATHS = (".git/HEAD", ".git/index", ".git/packed-refs", ".git/shallow", ".git/info/grafts",
              ".git/info/exclude", ".git/objects/info/alternates", ".git/refs/heads/acme-topic",
              ".gitignore", "vllm/.gitignore")


@pytest.mark.parametrize("name", FIFO_PATHS)
def test_a_fifo_where_git_reads_is_refused_by_name_not_opened(tmp_path, upstream, name):
    """issue 35 (left open): a FIFO planted at a file git opens is named and refused, exit 5, never opened."""
    fork = make_fork(tmp_path / "acme", upstream.path, upstream.commit, hostile=False)
    lock = make_project(tmp_path, upstream, fork)
    fifo = fork.path / name
    fifo.parent.mkdir(parents=True, exist_ok=True)
    if fifo.exists():
        fifo.unlink()
    os.mkfifo(fifo)
    code, err = _apply_within(tmp_path, lock, fork, f"a FIFO at {name}")
    assert code == EXIT_TREE, err
    assert str(fifo) in err and ("FIFO" in err or "not a regular file" in err), err


def test_an_ignored_file_where_the_series_writes_is_refused_by_name(tmp_path, upstream, cli, lived_in):
    """issue 35: an ignored, untracked vllm/new.py (a patch creates it) was overwritten by apply
    with exit 0 and no word.  Refused (exit 5) by name, in apply, apply --3way and port --workspace."""
    fork, lock = lived_in
    cache = ("--cache-dir", tmp_path / "c")
    with open(fork.path / ".gitignore", "a") as fh:
        fh.write("/vllm/new.py\n")
    fork.git("commit", "-qam", "acme: ignore our scratch module")
    (fork.path / "vllm" / "new.py").write_text("MY WORK, NOT COMMITTED\n")
    before = fork.snapshot()
    res = cli("apply", "--lock", lock, "--pin", "up", "--tree", fork.path, "--branch", "dsv4", "--no-build", *cache)
    assert res.rc == EXIT_TREE and "vllm/new.py (ignored)" in res.err and "never overwrites" in res.err, res
    fork.assert_kept(before)
    assert (fork.path / "vllm" / "new.py").read_text() == "MY WORK, NOT COMMITTED\n"
    before = {"loose": {k: v for k, v in before.loose.items() if not k.endswith("vllm/new.py")}}
    # --3way: the fork changes the line 0002 changes.  The workspace opens at 0002 (the ignored
    # file is not on its paths and stays); resolve --continue goes on to 0003, which would write
    # vllm/new.py: refused by name, the file kept.
    (fork.path / "vllm" / "worker.py").write_text(
        (fork.path / "vllm" / "worker.py").read_text().replace("return 0", "return 1  # acme"))
    fork.git("commit", "-qam", "acme: return 1")
    res = cli("apply", "--lock", lock, "--pin", "up", "--tree", fork.path, "--3way", "--no-build", *cache)
    assert res.rc == 1 and "0002-worker.patch conflicts" in res.out, res
    assert (fork.path / "vllm" / "new.py").read_text() == "MY WORK, NOT COMMITTED\n"
    (fork.path / "vllm" / "worker.py").write_text(
        (fork.path / "vllm" / "worker.py").read_text().split("<<<<<<<")[0] + "    return 2\n")
    res = cli("resolve", "--continue", "--lock", lock, "--tree", fork.path, *cache)
    assert res.rc == EXIT_TREE and "vllm/new.py (ignored)" in res.err, res
    assert (fork.path / "vllm" / "new.py").read_text() == "MY WORK, NOT COMMITTED\n"
    assert fork.ran() == []
    # Moved away, the same command goes on and the series completes.
    (fork.path / "vllm" / "new.py").rename(tmp_path / "saved.py")
    res = cli("apply", "--lock", lock, "--pin", "up", "--tree", fork.path, "--3way", "--no-build", *cache)
    assert res.rc == 0, res
    assert fork.git("log", "-1", "--format=%s") == "new: a module, and return 3"
    assert fork.snapshot().loose == before["loose"]


def test_unguarded_git_on_a_checkout_is_an_internal_error_not_a_silent_run(tmp_path, upstream):
    """The runtime half of "a command cannot forget the guard": git refuses a work tree no guard holds."""
    from dsv4patch import git

    fork = make_fork(tmp_path / "acme", upstream.path, upstream.commit)
    with pytest.raises(git.UnguardedCheckout):
        git.dirty_paths(fork.path)
    assert fork.ran() == []


def test_branch_shorthands_are_usage_errors(tmp_path, upstream, cli, lived_in):
    """issue 35: `apply --branch '@{-1}'` exited 70 (check-ref-format --branch expands it, update-ref fails)."""
    fork, lock = lived_in
    before = fork.snapshot()
    for name in ("@{-1}", "@", "HEAD", "-b", "a..b", "x.lock", "has space", "@{upstream}"):
        res = cli("apply", "--lock", lock, "--pin", "acme", "--tree", fork.path, "--branch", name, "--no-build",
                  "--cache-dir", tmp_path / "c")
        assert res.rc == EXIT_USAGE and "--branch" in res.err, (name, res)
        fork.assert_kept(before)


def test_only_a_caller_that_creates_trees_offers_a_new_directory(tmp_path: Path) -> None:
    """A directory that is not a checkout: apply (``creatable``) may offer to create the tree there;
    build, refresh, resolve and the port workspace do not create one, so their message does not."""
    from dsv4patch import guard
    from dsv4patch.errors import TreeError

    d = tmp_path / "plain"
    (d / "sub").mkdir(parents=True)
    with pytest.raises(TreeError) as plain, guard.guarded(d):
        pass
    assert str(plain.value) == (f"--tree {d} is not the root of a git checkout (no .git); point --tree at the top "
                                "directory of a checkout")
    with pytest.raises(TreeError) as offered, guard.guarded(d, creatable=True):
        pass
    assert str(offered.value).endswith("; point --tree at the top directory of a checkout, or at a new (absent or "
                                       "empty) directory and dsv4patch creates the tree")
    assert os.listdir(d) == ["sub"]  # nothing written


def test_a_directory_inside_a_checkout_names_the_checkout_it_is_in(tmp_path: Path) -> None:
    """Pointed at ``vllm-src/0.27.1/vllm`` instead of the tree's root, the message names the checkout the
    directory is in (found by names alone: no git runs)."""
    from dsv4patch import guard
    from dsv4patch.errors import TreeError

    tree = tmp_path / "tree"
    (tree / "vllm" / "deep").mkdir(parents=True)
    run_git(tree, "init", "-q")
    assert guard.enclosing_checkout(tree / "vllm" / "deep") == tree
    with pytest.raises(TreeError) as inside, guard.guarded(tree / "vllm"):
        pass
    assert str(inside.value) == (f"--tree {tree / 'vllm'} is not the root of a git checkout (no .git; it is inside "
                                 f"the checkout {tree}); point --tree at the top directory of a checkout")


def _lose_blob(fork: Fork, path: str) -> str:
    """Delete the loose object of ``path``'s blob at HEAD (the fork's own hard-linked copy): what a
    partial clone (`git clone --filter=blob:none`) lacks until git fetches it on demand."""
    oid = fork.git("rev-parse", f"HEAD:{path}")
    (fork.path / ".git" / "objects" / oid[:2] / oid[2:]).unlink()
    return oid


def _fetch_program(fork: Fork, name: str) -> Path:
    """A program a fetch runs: it writes a marker and fails at once (no talk with git to wait on)."""
    script = _program(fork, name)
    script.write_text(f"#!/bin/sh\necho \"{name} $*\" >> '{fork.markers / 'RAN'}'\nexit 1\n")
    return script


# How a checkout makes git fetch an object it lacks (git 2.39: each one alone is enough), and the
# setting that names the fetch's command: its uploadpack for a file:// remote, core.sshCommand for ssh.
PARTIAL = {
    "extension": [("core.repositoryformatversion", "1"), ("extensions.partialClone", "acme"),
                  ("remote.acme.url", "file:///nonexistent/acme.git")],
    "promisor": [("remote.acme.promisor", "true"), ("remote.acme.url", "file:///nonexistent/acme.git")],
    "filter": [("remote.acme.partialCloneFilter", "blob:none"), ("remote.acme.url", "file:///nonexistent/acme.git")],
    "ssh": [("core.repositoryformatversion", "1"), ("extensions.partialClone", "acme"),
            ("remote.acme.promisor", "true"), ("remote.acme.url", "ssh://example.invalid/acme.git")],
}


@pytest.mark.parametrize("kind", sorted(PARTIAL))
def test_a_partial_clone_is_refused_before_git_fetches_what_it_lacks(tmp_path, upstream, cli, kind):
    """hostile probe D1: a checkout that is a partial clone made `status --tree` and `apply` run its
    `remote.<name>.uploadpack` (or `core.sshCommand`): git fetched the blob it lacked from the promisor
    remote, and apply then exited 70.  Refused (exit 5) before any git reads a blob, the setting named."""
    fork = make_fork(tmp_path / "acme", upstream.path, upstream.commit, hostile=False)
    lock = make_project(tmp_path, upstream, fork)
    for path in ("vllm/worker.py", "vllm/envs.py"):
        _lose_blob(fork, path)
    for key, value in PARTIAL[kind]:
        fork.git("config", key, value)
    fork.git("config", "remote.acme.uploadpack", str(_fetch_program(fork, "uploadpack")))
    fork.git("config", "core.sshCommand", str(_fetch_program(fork, "ssh")))
    before = fork.snapshot()
    f, cache = str(fork.path), ("--cache-dir", tmp_path / "c")
    for argv in (("status", "--lock", lock, "--pin", "up", "--tree", f),
                 ("apply", "--lock", lock, "--pin", "up", "--tree", f, "--branch", "dsv4", "--no-build", *cache)):
        res = cli(*argv)
        assert fork.ran() == [], (argv, fork.ran())
        assert res.rc == EXIT_TREE and "is a partial clone" in res.err, (argv, res.rc, res.err)
        setting = {"extension": "extensions.partialClone=acme", "promisor": "remote.acme.promisor=true",
                   "filter": "remote.acme.partialCloneFilter=blob:none", "ssh": "extensions.partialClone=acme"}[kind]
        assert f"{setting} in {fork.path / '.git' / 'config'}" in res.err, res.err
        assert f"git -C {fork.path} fetch --refetch acme" in res.err, res.err
        fork.assert_kept(before)


def test_a_checkout_that_lacks_an_object_is_a_tree_error(tmp_path, upstream, cli):
    """hostile probe D1: a checkout whose object store lacks a blob the series reads made apply exit 70
    (an internal error: `git cat-file blob ... failed`).  It is the checkout's to mend: exit 5, named."""
    fork = make_fork(tmp_path / "acme", upstream.path, upstream.commit, hostile=False)
    lock = make_project(tmp_path, upstream, fork)
    oid = _lose_blob(fork, "vllm/worker.py")
    before = fork.snapshot()
    res = cli("apply", "--lock", lock, "--pin", "up", "--tree", fork.path, "--branch", "dsv4", "--no-build",
              "--cache-dir", tmp_path / "c", "--format", "json")
    assert res.rc == EXIT_TREE, (res.rc, res.out, res.err)
    import json

    error = json.loads(res.out)["error"]
    assert error["kind"] == "tree" and error["exit_code"] == EXIT_TREE, error
    assert f"the git repository of {fork.path} lacks an object" in error["message"] and oid in error["message"]
    assert f"git -C {fork.path} fsck" in error["message"], error
    fork.assert_kept(before)


@pytest.mark.parametrize("flag", ["assume-unchanged", "skip-worktree"])
def test_an_edit_the_index_hides_is_refused_before_the_journal(tmp_path, upstream, cli, flag):
    """hostile probe D10a: a local edit hidden by `git update-index --assume-unchanged` (or --skip-worktree)
    on a file the series writes made apply fail inside `git read-tree -m` (exit 70) after it had written
    the move's journal, so every later apply was refused with advice (`git reset --hard`) that destroys
    the edit.  Refused (exit 5) before the journal or a branch, the file and flag named with how to clear it."""
    fork = make_fork(tmp_path / "acme", upstream.path, upstream.commit, hostile=False)
    lock = make_project(tmp_path, upstream, fork)
    worker = fork.path / "vllm" / "worker.py"
    mine = worker.read_text() + "# my local edit\n"
    worker.write_text(mine)
    fork.git("update-index", f"--{flag}", "vllm/worker.py")
    before = fork.snapshot()
    argv = ("apply", "--lock", lock, "--pin", "up", "--tree", fork.path, "--no-build", "--cache-dir", tmp_path / "c")
    for extra in (("--branch", "dsv4"), ("--branch", "dsv4", "--3way")):
        res = cli(*argv, *extra)
        assert res.rc == EXIT_TREE, (extra, res.rc, res.err)
        assert f"vllm/worker.py ({flag})" in res.err and "Nothing was changed" in res.err, res.err
        assert f"`git -C {fork.path} update-index --no-{flag} vllm/worker.py`" in res.err, res.err
        assert not (fork.path / ".git" / "dsv4patch-apply.json").exists()
        assert worker.read_text() == mine
        fork.assert_kept(before)
    # Cleared, the edit is what it is: a change git sees, refused as such; the edit kept.
    fork.git("update-index", f"--no-{flag}", "vllm/worker.py")
    res = cli(*argv, "--branch", "dsv4")
    assert res.rc == EXIT_TREE and "vllm/worker.py" in res.err and "not look at" not in res.err, res.err
    assert worker.read_text() == mine


def test_a_repository_of_another_object_format_is_refused_by_the_guard(tmp_path, upstream, cli):
    """hostile probe D10b: `extensions.objectFormat = sha256` on the checkout made apply exit 70 (git read
    its SHA-1 index as another format).  The guard refuses it (exit 5, the setting and its file named), as
    it does `core.repositoryformatversion = 99`."""
    fork = make_fork(tmp_path / "acme", upstream.path, upstream.commit, hostile=False)
    lock = make_project(tmp_path, upstream, fork)
    before = fork.snapshot()
    config = fork.path / ".git" / "config"
    mine = config.read_text()
    config.write_text(mine.replace("repositoryformatversion = 0", "repositoryformatversion = 1")
                      + "[extensions]\n\tobjectFormat = sha256\n")
    for argv in (("status", "--lock", lock, "--pin", "up", "--tree", fork.path),
                 ("apply", "--lock", lock, "--pin", "up", "--tree", fork.path, "--branch", "dsv4", "--no-build",
                  "--cache-dir", tmp_path / "c")):
        res = cli(*argv)
        assert res.rc == EXIT_TREE, (argv, res.rc, res.err)
        assert f"extensions.objectFormat=sha256 (in {fork.path / '.git' / 'config'})" in res.err, res.err
        assert "only SHA-1" in res.err and f"git -C {fork.path} config --unset extensions.objectFormat" in res.err
    config.write_text(mine)  # the test's own git cannot read the repository with it
    fork.assert_kept(before)


def test_a_checkout_path_with_a_newline_is_a_usage_error_before_anything_is_made(tmp_path, upstream, cli):
    """hostile probe D11: `apply --tree $'nl\\ntree'` created the tree, then refused it as "not the root of
    a git checkout" (the guard split git's answer on the newline), leaving an unpatched tree behind.
    A newline in --tree, --workspace, --local or a local pin's path is refused up front (exit 2, the path
    named) and nothing is created; a path with a carriage return (which splitlines() also split) works."""
    from dsv4patch import guard
    from dsv4patch.errors import ParameterError

    fork = make_fork(tmp_path / "acme", upstream.path, upstream.commit, hostile=False)
    lock = make_project(tmp_path, upstream, fork)
    cache = ("--cache-dir", tmp_path / "c")
    new = tmp_path / "nl\ntree"
    res = cli("apply", "--lock", lock, "--pin", "up", "--tree", new, "--no-build", *cache)
    assert res.rc == EXIT_USAGE and repr(str(new)) in res.err and "newline" in res.err, (res.rc, res.err)
    assert sorted(p.name for p in tmp_path.iterdir() if "nl" in p.name) == []
    moved = tmp_path / "acme\nmoved"
    fork.path.rename(moved)
    for argv in (("status", "--lock", lock, "--pin", "up", "--tree", moved),
                 ("apply", "--lock", lock, "--pin", "up", "--tree", moved, "--no-build", *cache),
                 ("port", "--lock", lock, "--from", "up", "--local", moved, "--dry-run", *cache),
                 ("port", "--lock", lock, "--from", "up", "--local", tmp_path, "--workspace", moved, *cache),
                 ("port", "--abort", "--workspace", moved)):
        res = cli(*argv)
        assert res.rc == EXIT_USAGE and "holds a newline" in res.err, (argv, res.rc, res.err)
    with pytest.raises(ParameterError, match="pin acme's local checkout '.*acme\\\\nmoved': the path holds a newline"):
        with guard.guarded(moved, role="pin acme's local checkout"):
            pass
    moved.rename(fork.path)
    odd = tmp_path / "cr\rtree"
    res = cli("apply", "--lock", lock, "--pin", "up", "--tree", odd, "--no-build", *cache)
    assert res.rc == 0, (res.rc, res.err)
    res = cli("status", "--lock", lock, "--pin", "up", "--tree", odd)
    assert res.rc == 0, (res.rc, res.err)
