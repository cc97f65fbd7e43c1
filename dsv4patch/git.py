"""The only module that runs git.

Everything else asks this module for plumbing operations on a repository
directory.  git's behaviour must depend only on the lock, the patches and the
pinned files, never on whoever runs dsv4patch, so every git process gets:

* an environment built from an allow-list (:data:`KEEP_ENV`), not from
  ``os.environ``: no ``GIT_DIR``, ``GIT_WORK_TREE``, ``GIT_INDEX_FILE``,
  ``GIT_CONFIG_*`` or ``GIT_CONFIG_PARAMETERS`` of the caller reaches git
  (GitPython's ``execute`` merges ``os.environ`` into the child's
  environment, so git is started with :mod:`subprocess` here);
* no system or global config (``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL``
  = ``/dev/null``), no system attributes, no replace refs;
* every setting that changes what ``git apply``, ``read-tree``, ``add`` or
  ``status`` do pinned on the command line (:data:`_CONFIG`), which beats a
  repository's own ``.git/config``; hooks and fsmonitor off;
* an explicit repository: ``GIT_DIR`` (and ``GIT_WORK_TREE``) point at the
  directory the caller named, and ``GIT_CEILING_DIRECTORIES`` stops discovery
  at it, so an enclosing repository can never be picked up;
* an absolute, existing working directory (a missing one is an error, never
  a silent fallback to the process's cwd);
* git's program-running and output-shaping settings pinned off for every call
  (hooks, fsmonitor, gpg signing, pagers, colour, mailmap, submodule recursion),
  so whatever a repository's config says, no program of its runs and the text
  we parse has one shape.

A repository with a work tree (a ``.git`` at ``cwd``) is a user's checkout:
git runs there only while :mod:`dsv4patch.guard` holds it vetted
(:func:`guarding`), else the call is refused as an internal error.  So a
command that forgets the guard fails in its first test instead of running a
fork's filter driver.  Bare repositories are dsv4patch's own (the cache).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from dsv4patch import childproc, settings
from dsv4patch.errors import ChildError, GitError, Interrupted, MissingObjectError
from dsv4patch.records import frozen

# Identity and date used for every commit dsv4patch makes: same inputs, same ids.
IDENTITY = {
    "GIT_AUTHOR_NAME": "dsv4patch",
    "GIT_AUTHOR_EMAIL": "dsv4patch@localhost",
    "GIT_COMMITTER_NAME": "dsv4patch",
    "GIT_COMMITTER_EMAIL": "dsv4patch@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
# The only variables of the caller's environment git sees: where programs
# are, a home for ssh's known_hosts and keys, temporary files, the ssh agent,
# proxies and CA bundles for https remotes.  None of them can change what
# git apply or checkout do.
# Every git call ends: a generous deadline (a git on the largest fork takes seconds), so a FIFO planted
# after the guard looked, or a hung disk, is an error (exit 8) and never a hang.
# The deadline is the run's setting (settings.Settings.git_timeout, from $DSV4PATCH_GIT_TIMEOUT).

KEEP_ENV = (
    "PATH", "HOME", "TMPDIR", "SSH_AUTH_SOCK",
    "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
    "SSL_CERT_FILE", "SSL_CERT_DIR",
)
# Variables dsv4patch itself may pass to one git call.
_ALLOWED_EXTRA = frozenset({*IDENTITY, "GIT_INDEX_FILE", "GIT_REFLOG_ACTION"})
_CONFIG = [
    # No program named by a repository's config ever runs.
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.fsmonitor=false",
    "-c", "credential.helper=",
    "-c", "log.showSignature=false",
    "-c", "commit.gpgSign=false",
    "-c", "tag.gpgSign=false",
    "-c", "core.pager=cat",
    # Submodules are never entered: no git runs inside one (its config is not ours to run).
    "-c", "diff.ignoreSubmodules=all",
    "-c", "status.submoduleSummary=false",
    "-c", "fetch.recurseSubmodules=false",
    # What git apply accepts and how it matches context.
    "-c", "apply.whitespace=nowarn",
    "-c", "apply.ignoreWhitespace=no",
    # What lands on disk and in the index: bytes as they are in the tree.
    "-c", "core.autocrlf=false",
    "-c", "core.eol=lf",
    "-c", "core.safecrlf=false",
    # Conflict markers as port's merge-file writes them (base included), whatever the tree's config says.
    "-c", "merge.conflictStyle=diff3",
    "-c", "core.filemode=true",
    "-c", "core.symlinks=true",
    "-c", "core.ignorecase=false",
    "-c", "core.precomposeUnicode=false",
    "-c", "core.sparseCheckout=false",
    "-c", "core.attributesFile=/dev/null",
    "-c", "core.excludesFile=/dev/null",
    "-c", "core.quotePath=false",
    "-c", "core.untrackedCache=false",
    "-c", "submodule.recurse=false",
    # Output we parse.
    "-c", "diff.noprefix=false",
    "-c", "diff.mnemonicPrefix=false",
    "-c", "diff.relative=false",
    "-c", "diff.renames=true",
    "-c", "diff.orderFile=/dev/null",
    "-c", "color.ui=never",
    "-c", "color.diff=never",
    "-c", "color.grep=never",
    "-c", "color.status=never",
    "-c", "log.mailmap=false",
    "-c", "i18n.commitEncoding=UTF-8",
    "-c", "i18n.logOutputEncoding=UTF-8",
    "-c", "trailer.separators=:",
    # Which remotes may be fetched from (see lock.check_git_url).
    "-c", "protocol.allow=never",
    "-c", "protocol.https.allow=always",
    "-c", "protocol.ssh.allow=always",
    "-c", "protocol.file.allow=always",
    # A repository's own ssh command never runs (a partial clone's lazy fetch would run it; the guard
    # refuses those): plain ``ssh`` from PATH, what git runs anyway with GIT_SSH* not passed on.
    "-c", "core.sshCommand=ssh",
    "-c", "gc.auto=0",
    "-c", "maintenance.auto=false",
    "-c", "init.defaultBranch=main",
    "-c", "advice.detachedHead=false",
]


@frozen
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


# The work trees git may run in now: realpath -> (its git directory, how many holders).
# Only dsv4patch.guard adds to it (tests/test_architecture.py checks that).
_GUARDED: dict[str, tuple[Path, int]] = {}
_GUARDED_LOCK = threading.Lock()  # check's threads hold one checkout at once (two local pins of one fork)


@contextmanager
def guarding(worktree: Path, gitdir: Path) -> Iterator[None]:
    """Let git run in the work tree ``worktree``, with ``gitdir`` as its git directory, while held.

    Called only by :mod:`dsv4patch.guard`, once it has vetted the checkout (or for a
    work tree dsv4patch itself has just made).  Holds of one tree are counted, also holds
    from threads that end in any order: the tree stays held until the last one ends."""
    key = os.path.realpath(worktree)
    with _GUARDED_LOCK:
        prev = _GUARDED.get(key)
        _GUARDED[key] = (Path(gitdir) if prev is None else prev[0], (prev[1] if prev else 0) + 1)
    try:
        yield
    finally:
        with _GUARDED_LOCK:
            held, count = _GUARDED[key]
            if count <= 1:
                del _GUARDED[key]
            else:
                _GUARDED[key] = (held, count - 1)


class UnguardedCheckout(GitError):
    """git was asked to run in a work tree that no :func:`guarding` holds (a bug: exit 70)."""


def _repo_env(cwd: Path, repo: bool) -> dict[str, str]:
    """GIT_DIR/GIT_WORK_TREE for the repository *at* ``cwd``, and a ceiling above it.

    ``repo=False`` is for commands that create a repository elsewhere
    (``clone``, ``init DIR``): git must not be told about the one at ``cwd``.
    A work tree (``cwd/.git`` exists: a directory, a linked worktree's or a
    submodule's ``.git`` file) must be held by :func:`guarding`, which names its
    git directory; a bare repository is used as it is.
    """
    env = {"GIT_CEILING_DIRECTORIES": str(cwd.parent)}
    if not repo:
        return env
    dotgit = cwd / ".git"
    if os.path.lexists(dotgit):
        held = _GUARDED.get(os.path.realpath(cwd))
        if held is None:
            raise UnguardedCheckout(
                f"internal: git would run in the checkout {cwd}, which dsv4patch.guard has not "
                "vetted; every command reaches a user's checkout through dsv4patch.guard")
        env["GIT_DIR"] = str(held[0])
        env["GIT_WORK_TREE"] = str(cwd)
    elif (cwd / "HEAD").is_file() and (cwd / "objects").is_dir():
        env["GIT_DIR"] = str(cwd)  # a bare repository
    return env


def environment(cwd: Path, extra: Mapping[str, str] | None = None, repo: bool = True) -> dict[str, str]:
    """git's whole environment for a command run in ``cwd`` (see the module docstring)."""
    env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
    env.setdefault("PATH", os.defpath)
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_ATTR_NOSYSTEM="1",
        GIT_NO_REPLACE_OBJECTS="1",
        GIT_NO_LAZY_FETCH="1",  # git >= 2.44: never fetch an object a partial clone lacks (the guard refuses those)
        GIT_TERMINAL_PROMPT="0",
        GIT_PAGER="cat",
        LC_ALL="C",
        LANG="C",
    )
    env.update(_repo_env(cwd, repo))
    if extra:
        unknown = set(extra) - _ALLOWED_EXTRA
        if unknown:
            raise GitError(f"internal: refusing git environment variables {sorted(unknown)}")
        env.update(extra)
    return env


@frozen
class _Raw:
    """One git process's exit status and undecoded output."""

    returncode: int
    stdout: bytes
    stderr: bytes


def _execute(cwd: Path, args: Sequence[str], env: Mapping[str, str] | None,
             input: bytes | None, repo: bool = True, tied: bool = False) -> _Raw:
    cwd = Path(os.path.abspath(cwd))
    if not cwd.is_dir():
        raise GitError(f"internal: git would run in {cwd}, which is not a directory")
    close_fds, preexec_fn = _child_options() if tied else (True, None)
    deadline = settings.active().git_timeout
    proc: subprocess.Popen[bytes] | None = None
    try:
        # An interrupt while git starts is raised once ``proc`` is bound, here where git is killed and
        # reaped: raised between the fork and this ``try`` it left git running on behind the caller's
        # cleanup (an interrupted apply's ``git clone`` re-made the half-made tree apply had removed).
        with childproc.starting():
            proc = subprocess.Popen(
                ["git", *_CONFIG, *args], cwd=cwd, env=environment(cwd, env, repo),
                stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=close_fds, preexec_fn=preexec_fn,
            )
        stdout, stderr = proc.communicate(input, timeout=deadline)
    except BaseException as exc:
        if proc is not None:  # never left running: ended and reaped before the error goes on
            _end(proc)
        if isinstance(exc, subprocess.TimeoutExpired):
            verb = next((a for a in args if not a.startswith("-")), "")
            raise ChildError(f"git {verb} in {cwd} did not finish within {deadline:g} s "
                             "(a file git opens there may block, e.g. a FIFO, or the disk hangs); look at that "
                             f"directory, or raise {settings.GIT_TIMEOUT_ENV}") from None
        if isinstance(exc, OSError):
            raise GitError(f"cannot run git ({exc.strerror}); install git and put it on PATH") from None
        raise
    # A git that failed or died while an interrupt arrived (a SIGINT to the group reaches it too) was
    # stopped by it: never read as a conflict or a failure (childproc.interrupted sees it in any thread).
    if proc.returncode != 0 and childproc.interrupted(0.2 if proc.returncode < 0 else 0.0):
        raise Interrupted(childproc.interrupt_signal())
    return _Raw(proc.returncode, stdout, stderr)


def _end(proc: subprocess.Popen[bytes]) -> None:
    """Kill a git that did not finish (interrupted, past its deadline) and reap it, its pipes closed."""
    with suppress(OSError):
        proc.kill()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with suppress(OSError):
                stream.close()
    proc.wait()


def _child_options() -> tuple[bool, Callable[[], None] | None]:
    """``(close_fds, preexec_fn)`` for Popen that tie a git child to this process's life (``run(tied=True)``).

    * ``close_fds=False``: the child keeps the descriptors this process marked
      inheritable, i.e. the tree lock (``transaction.exclusive_checkout``): the lock is released
      only when every git that may be writing the tree has exited.
    * ``PR_SET_PDEATHSIG``: on Linux the child gets SIGKILL when this process
      dies, so killing dsv4patch never leaves a git working on behind it.
    """
    if not sys.platform.startswith("linux"):
        return False, None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False, None
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return False, die_with_parent


def run(
    cwd: Path,
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    input: str | bytes | None = None,
    check: bool = True,
    repo: bool = True,
    tied: bool = False,
) -> Result:
    """Run ``git <args>`` on the repository at ``cwd``; raise GitError on failure if ``check``.

    ``repo=False``: ``cwd`` is only where git runs (``clone``, ``init DIR``).
    ``tied``: for commands that write a work tree, its index or refs; see
    :func:`_child_options` (not the default: it costs a fork, ~4 ms a call).
    """
    data = input.encode() if isinstance(input, str) else input
    raw = _execute(cwd, args, env, data, repo, tied)
    res = Result(raw.returncode, raw.stdout.decode(errors="surrogateescape"), raw.stderr.decode(errors="replace"))
    if check and not res.ok:
        raise _failed(cwd, args, res.stderr)
    return res


# What git says when a repository lacks an object it needs or holds a corrupt one (git 2.39 to 2.4x):
# ``cat-file``'s "bad file", ``read-tree``'s "invalid object", "bad object", "unable to read <id>",
# "missing blob object" (a partial clone with lazy fetching off), a corrupt or empty loose object.
_MISSING_OBJECT = re.compile(
    r"cat-file [0-9a-f]{7,}: bad file|invalid object|bad (tree )?object|unable to read\b.*\b[0-9a-f]{40}"
    r"|missing (blob|tree|commit|tag) object|object file \S+ is empty|loose object \S+ .*is corrupt"
    r"|could not read [0-9a-f]{40}", re.I)


def _failed(cwd: Path, args: Sequence[str], stderr: str) -> GitError:
    """The error for a git call that failed: in a user's checkout (a work tree :func:`guarding` holds)
    whose repository lacks an object, :class:`MissingObjectError` (exit 5, the checkout's to mend)."""
    text = stderr.strip()
    if _held_work_tree(cwd):
        hit = next((line for line in text.splitlines() if _MISSING_OBJECT.search(line)), None)
        if hit:
            return missing_object(cwd, hit.strip())
    return GitError(f"git {' '.join(args[:3])} failed in {cwd}:\n{text}")


def _held_work_tree(cwd: Path) -> bool:
    return os.path.realpath(os.path.abspath(cwd)) in _GUARDED


def missing_object(cwd: Path, what: str) -> MissingObjectError:
    return MissingObjectError(
        f"the git repository of {cwd} lacks an object git needs, or holds a damaged one (git: {what}). "
        f"Mend it first (`git -C {cwd} fsck` names what is missing or damaged; fetch it again from where "
        "it came, or use a full clone), then run the command again")


def out(cwd: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    return run(cwd, args, env=env).stdout.strip()


def init(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    run(path, ["init", "-q"])


def is_repo_root(path: Path) -> bool:
    if not (path / ".git").exists():
        return False
    res = run(path, ["rev-parse", "--show-toplevel"], check=False)
    return res.ok and Path(res.stdout.strip()).resolve() == path.resolve()


def head(path: Path) -> str | None:
    res = run(path, ["rev-parse", "--verify", "-q", "HEAD^{commit}"], check=False)
    return res.stdout.strip() if res.ok else None


def has_object(path: Path, oid: str) -> bool:
    return run(path, ["cat-file", "-e", oid], check=False).ok


def dirty_paths(path: Path) -> list[str]:
    """Tracked changes and untracked, non-ignored files."""
    # --no-optional-locks: looking never writes the index (nor leaves index.lock if killed).
    res = run(path, ["--no-optional-locks", "status", "--porcelain=v1", "--untracked-files=all",
                     "--ignore-submodules=all", "--no-renames"])
    return [line[3:] for line in res.stdout.splitlines() if line.strip()]


def add_all_and_commit_root(path: Path, message: str) -> str:
    """Commit every file under ``path`` (ignored ones too) as a root commit."""
    run(path, ["add", "-A", "-f", "."])
    tree = out(path, "write-tree")
    commit = out(path, "commit-tree", tree, "-m", message, env=IDENTITY)
    run(path, ["update-ref", "HEAD", commit])
    return commit


def commit_tree(
    path: Path, tree: str, parent: str | None, message: str, author: Mapping[str, str] | None = None
) -> str:
    env = dict(IDENTITY)
    if author:
        env.update(author)
    args = ["commit-tree", "--no-gpg-sign", tree]
    if parent:
        args += ["-p", parent]
    return run(path, args, env=env, input=message).stdout.strip()


def git_dir(repo: Path) -> Path:
    """The git directory of the repository at ``repo`` (``.git`` of a work tree, or a bare repo itself)."""
    return Path(out(repo, "rev-parse", "--absolute-git-dir"))


@contextmanager
def scratch_index(repo: Path, treeish: str) -> Iterator[dict[str, str]]:
    """A temporary index loaded with ``treeish``; yields the env to use it."""
    import tempfile  # here, not at start-up: tempfile brings shutil and random (issue 39)

    gitdir = git_dir(repo)
    fd, name = tempfile.mkstemp(prefix="dsv4patch-index-", dir=gitdir)
    os.close(fd)
    os.unlink(name)
    env = {"GIT_INDEX_FILE": name}
    try:
        run(repo, ["read-tree", treeish], env=env)
        yield env
    finally:
        if os.path.exists(name):
            os.unlink(name)


def apply(
    repo: Path,
    patch: Path,
    *,
    env: Mapping[str, str],
    reverse: bool = False,
    check_only: bool = False,
) -> Result:
    """``git apply --cached -v`` against the index in ``env``; never touches a work tree."""
    args = ["apply", "--cached", "-v", "--whitespace=nowarn"]
    if reverse:
        args.append("-R")
    if check_only:
        args.append("--check")
    args.append(os.path.abspath(patch))  # git runs in ``repo``: a relative path would be read from there
    return run(repo, args, env=env, check=False)


def write_tree(repo: Path, env: Mapping[str, str]) -> str:
    return out(repo, "write-tree", env=env)


@frozen
class TreeEntry:
    """One entry of a tree object (``git ls-tree``)."""

    mode: str  # "100644", "100755", "120000" (a link), "040000" (a tree), "160000" (a gitlink)
    type: str  # "blob", "tree", "commit"
    oid: str

    @property
    def is_blob(self) -> bool:
        return self.type == "blob"


def ls_tree_entry(repo: Path, treeish: str, path: str) -> TreeEntry | None:
    """The entry of ``path`` in ``treeish``, or None."""
    res = run(repo, ["ls-tree", treeish, "--", path], check=False)
    line = res.stdout.strip()
    if not res.ok or not line:
        return None
    meta, _name = line.split("\t", 1)
    mode, typ, oid = meta.split()
    return TreeEntry(mode, typ, oid)


def tree_entries(repo: Path, treeish: str, paths: Sequence[str]) -> dict[str, TreeEntry]:
    """The entries of ``paths`` in ``treeish``, each name taken literally (one ``git ls-tree``; a path it
    lacks is absent; a directory asked for is listed even when a path below it is asked too)."""
    if not paths:
        return {}
    res = run(repo, ["--literal-pathspecs", "ls-tree", "-z", "-t", "--full-tree", treeish, "--", *paths])
    wanted, found = set(paths), {}
    for item in res.stdout.split("\0"):
        if not item:
            continue
        meta, name = item.split("\t", 1)
        mode, typ, oid = meta.split()
        if name in wanted:
            found[name] = TreeEntry(mode, typ, oid)
    return found


def tree_files(repo: Path, treeish: str) -> dict[str, TreeEntry]:
    """Every file of ``treeish`` (recursively), by path."""
    res = run(repo, ["ls-tree", "-r", "-z", "--full-tree", treeish])
    files: dict[str, TreeEntry] = {}
    for item in res.stdout.split("\0"):
        if not item:
            continue
        meta, name = item.split("\t", 1)
        mode, typ, oid = meta.split()
        files[name] = TreeEntry(mode, typ, oid)
    return files


def hash_paths(repo: Path, names: Sequence[str]) -> list[str]:
    """Blob ids of the work-tree files ``names`` (``hash-object --stdin-paths``; nothing is written)."""
    if not names:
        return []
    res = run(repo, ["hash-object", "--stdin-paths"], input="\n".join(names) + "\n")
    return res.stdout.split()


def current_ref(repo: Path) -> str | None:
    """The branch HEAD is on (``refs/heads/...``), None when HEAD is detached."""
    return run(repo, ["symbolic-ref", "-q", "HEAD"], check=False).stdout.strip() or None


def index_is(repo: Path, commit: str) -> bool:
    """Whether the index holds exactly ``commit``'s tree."""
    return run(repo, ["diff-index", "--cached", "--quiet", "--no-renames", commit, "--"], check=False).ok


def staged_names(repo: Path, commit: str) -> list[str]:
    """Paths whose index entry differs from ``commit``."""
    return run(repo, ["diff-index", "--cached", "--name-only", "--no-renames", commit, "--"],
               check=False).stdout.split()


def status_paths(repo: Path) -> list[str]:
    """Every changed, staged or untracked path (``status -z``; never writes the index)."""
    res = run(repo, ["--no-optional-locks", "status", "--porcelain=v1", "-z", "--no-renames",
                     "--untracked-files=all", "--ignore-submodules=all"])
    return [item[3:] for item in res.stdout.split("\0") if item]


def index_blob(repo: Path, env: Mapping[str, str], path: str) -> bytes | None:
    res = run(repo, ["ls-files", "-s", "--", path], env=env, check=False)
    line = res.stdout.strip()
    if not line:
        return None
    oid = line.split()[1]
    return cat_blob(repo, oid)


def out_bytes(repo: Path, *args: str) -> bytes:
    """stdout of ``git <args>`` as bytes (file contents); GitError on failure."""
    raw = _execute(repo, args, None, None)
    if raw.returncode != 0:
        raise _failed(repo, args, raw.stderr.decode(errors="replace"))
    return raw.stdout


def cat_blob(repo: Path, oid: str) -> bytes:
    return out_bytes(repo, "cat-file", "blob", oid)


def cat_blobs(repo: Path, oids: Sequence[str]) -> dict[str, bytes]:
    """The content of each blob ``oids`` names, from one ``git cat-file --batch``; GitError for an
    object that is missing or not a blob."""
    wanted = list(dict.fromkeys(oids))
    if not wanted:
        return {}
    raw = _execute(repo, ["cat-file", "--batch"], None, "".join(f"{o}\n" for o in wanted).encode())
    if raw.returncode != 0:
        raise GitError(f"git cat-file --batch failed in {repo}: {raw.stderr.decode(errors='replace')}")
    data, pos, blobs = raw.stdout, 0, {}
    for oid in wanted:
        end = data.find(b"\n", pos)
        head = data[pos:end].decode(errors="replace").split() if end >= 0 else []
        if head[1:] == ["missing"] and _held_work_tree(repo):
            raise missing_object(repo, f"{oid} missing")
        if len(head) != 3 or head[1] != "blob" or not head[2].isdigit():
            raise GitError(f"git cat-file --batch in {repo}: {oid} is not a blob ({' '.join(head) or 'no answer'})")
        size = int(head[2])
        blobs[oid] = data[end + 1:end + 1 + size]
        if len(blobs[oid]) != size or data[end + 1 + size:end + 2 + size] != b"\n":
            raise GitError(f"git cat-file --batch in {repo}: the answer for {oid} is cut short")
        pos = end + 2 + size
    return blobs


def refresh_index(repo: Path) -> None:
    """Bring the index's stat data up to date with the work tree (``git update-index -q --refresh``).

    A tree copied with ``cp -a``, rsync or a Docker ``COPY`` keeps its files'
    content and mtimes but not their inodes and ctimes, so every index entry
    looks modified to ``read-tree -m -u`` ("not uptodate. Cannot merge.")
    although ``git status`` (which refreshes in memory) calls the tree clean.
    This rewrites only the index's stat cache, as ``git status`` does when it
    may; a file whose content differs stays modified.
    """
    run(repo, ["update-index", "-q", "--refresh"], check=False, tied=True)


def checkout_to(repo: Path, old: str, new: str) -> None:
    """Move a clean work tree and HEAD from ``old`` to ``new``."""
    run(repo, ["read-tree", "--no-recurse-submodules", "-m", "-u", old, new], tied=True)
    run(repo, ["update-ref", "-m", "dsv4patch apply", "HEAD", new, old], tied=True)


def reset_hard(repo: Path, commit: str) -> None:
    """``git reset --hard commit``; the reflog entry says dsv4patch moved HEAD (``dsv4patch: moving to``)."""
    run(repo, ["reset", "-q", "--hard", "--no-recurse-submodules", commit], tied=True,
        env={"GIT_REFLOG_ACTION": "dsv4patch"})


def detach_head(repo: Path, commit: str, why: str) -> None:
    """HEAD detached at ``commit``: no branch moves, the index and work tree are not touched."""
    run(repo, ["update-ref", "--no-deref", "-m", why, "HEAD", commit], tied=True)


def attach_head(repo: Path, ref: str, why: str) -> None:
    """HEAD back on branch ``ref`` (``refs/heads/...``): the branch itself does not move."""
    run(repo, ["symbolic-ref", "-m", why, "HEAD", ref], tied=True)


def ref_commit(repo: Path, ref: str) -> str | None:
    """The commit ``ref`` (a full ref name) points at, None when there is no such ref."""
    res = run(repo, ["rev-parse", "-q", "--verify", "--end-of-options", f"{ref}^{{commit}}"], check=False)
    return res.stdout.strip() if res.ok else None


def tree_of(repo: Path, commit: str) -> str:
    """The tree id of ``commit``."""
    return out(repo, "rev-parse", "--verify", "--end-of-options", f"{commit}^{{tree}}")


@frozen
class CommitTrailers:
    """A commit and its trailers (``Key: value`` lines at the end of its message)."""

    commit: str
    trailers: dict[str, list[str]]


def log_trailers(repo: Path, rev_range: str) -> list[CommitTrailers]:
    """Each commit of ``rev_range`` with its trailers, oldest first."""
    res = run(
        repo,
        ["log", "--reverse", "--format=%H%x00%(trailers:unfold,only)%x01", rev_range],
        check=False,
    )
    items: list[CommitTrailers] = []
    if not res.ok:
        return items
    for chunk in res.stdout.split("\x01"):
        chunk = chunk.strip("\n")
        if not chunk:
            continue
        sha, _, trailers = chunk.partition("\x00")
        parsed: dict[str, list[str]] = {}
        for line in trailers.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                parsed.setdefault(key.strip(), []).append(value.strip())
        items.append(CommitTrailers(sha.strip(), parsed))
    return items


def fetch_commit(repo: Path, url: str, commit: str) -> Result:
    return run(repo, ["fetch", "-q", "--no-tags", "--depth=1", "--", url, commit], check=False)


def fetch_all(repo: Path, url: str) -> Result:
    return run(repo, ["fetch", "-q", "--no-tags", "--", url, "+refs/*:refs/remotes/src/*"], check=False)


def clone_local(src: Path, dest: Path) -> None:
    run(dest.parent, ["clone", "-q", "--no-checkout", "--", str(Path(src).resolve()),
                      str(Path(dest).resolve())], repo=False, tied=True)


def new_branch_checkout(repo: Path, branch: str, commit: str) -> None:
    """A fresh clone's work tree checked out at ``commit`` on a new ``branch``, with no remote left."""
    run(repo, ["remote", "remove", "origin"], tied=True)
    run(repo, ["checkout", "-q", "-B", branch, commit], tied=True)


def describe(repo: Path, commit: str) -> str | None:
    """``git describe --tags --always`` of ``commit`` (None when git cannot say)."""
    res = run(repo, ["describe", "--tags", "--always", commit], check=False)
    return res.stdout.strip() or None if res.ok else None


def read_tree(repo: Path, treeish: str, env: Mapping[str, str]) -> None:
    """Load ``treeish`` into the (scratch) index of ``env``."""
    run(repo, ["read-tree", treeish], env=env)


def worktree_add(repo: Path, dest: Path, commit: str) -> None:
    run(repo, ["worktree", "add", "-q", "--detach", str(Path(dest).resolve()), commit])


def worktree_remove(repo: Path, dest: Path) -> None:
    run(repo, ["worktree", "remove", "--force", str(Path(dest).resolve())], check=False)
    run(repo, ["worktree", "prune"], check=False)


def symlinks_in_index(repo: Path, env: Mapping[str, str]) -> set[str]:
    res = run(repo, ["ls-files", "-s"], env=env)
    return {
        line.split("\t", 1)[1]
        for line in res.stdout.splitlines()
        if line.startswith("120000 ")
    }


def _plain_path(pathspec: str) -> bool:
    """A pathspec git matches as a path only: no magic, no wildcard, nothing for git to normalise."""
    return not pathspec.startswith(":") and not any(c in "*?[\\" or c.isspace() for c in pathspec) and all(
        part not in ("", ".", "..") for part in pathspec.split("/"))


def grep_index(repo: Path, env: Mapping[str, str], text: str, pathspec: str) -> str | None:
    """First indexed file matching ``pathspec`` (a path or a directory) that contains ``text``.

    Reads the blobs of the scratch index (there is no work tree).  A file path
    that is not in the index is also looked up by its name anywhere in the
    tree, so a marker survives upstream moving a file.
    """
    specs = [pathspec]
    if "/" in pathspec and not pathspec.endswith("/"):
        specs.append(f":(glob)**/{pathspec.rsplit('/', 1)[1]}")
        if _plain_path(pathspec):
            # One grep for both: git lists the hits in index order whichever pathspec matched, and
            # a plain path matches itself or what is below it.
            res = run(repo, ["grep", "--cached", "-F", "-l", "-e", text, "--", *specs], env=env, check=False)
            hits = res.stdout.split()
            exact = [h for h in hits if h == pathspec or h.startswith(pathspec + "/")]
            first = exact or hits
            return first[0] if first else None
    for spec in specs:
        res = run(repo, ["grep", "--cached", "-F", "-l", "-e", text, "--", spec], env=env, check=False)
        hits = res.stdout.split()
        if hits:
            return hits[0]
    return None


def changed_paths(repo: Path, base: str, head: str = "HEAD") -> list[str]:
    """Paths that differ between ``base`` and ``head`` (added, modified or deleted)."""
    res = run(repo, ["diff", "--name-only", "--no-renames", "--no-ext-diff", "--no-textconv", "-z",
                     f"{base}..{head}", "--"])
    return [p for p in res.stdout.split("\0") if p]


def root_commit(repo: Path, rev: str = "HEAD") -> str:
    """The first root commit reachable from ``rev`` (a dsv4patch tree's pristine pin)."""
    return out(repo, "rev-list", "--max-parents=0", rev).splitlines()[0]


@frozen
class Merge:
    """A 3-way file merge: whether it was clean, and the text (diff3 markers where it was not)."""

    clean: bool
    text: bytes


def merge_file(repo: Path, ours: bytes, base: bytes, theirs: bytes) -> Merge:
    """3-way merge of one file's contents."""
    import tempfile as _tf

    with _tf.TemporaryDirectory(prefix="dsv4patch-merge-") as d:
        paths = []
        for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            p = Path(d) / name
            p.write_bytes(data)
            paths.append(str(p))
        raw = _execute(
            repo,
            ["merge-file", "-p", "--diff3", "-L", "target", "-L", "base", "-L", "patch", *paths],
            None, None,
        )
    if raw.returncode < 0 or raw.returncode > 127:  # merge-file exits with the conflict count, or -1
        raise GitError(f"git merge-file failed in {repo}")
    return Merge(raw.returncode == 0, raw.stdout)


def hash_object(repo: Path, data: bytes) -> str:
    return run(repo, ["hash-object", "-w", "--stdin"], input=data).stdout.strip()


def update_index_blob(repo: Path, env: Mapping[str, str], path: str, oid: str, mode: str = "100644") -> None:
    run(repo, ["update-index", "--add", "--cacheinfo", f"{mode},{oid},{path}"], env=env)


def common_dir(repo: Path) -> Path:
    """The repository's common directory (objects, refs, config): ``.git`` of a checkout, the
    main ``.git`` of a linked worktree, a bare repository itself."""
    found = out(repo, "rev-parse", "--git-common-dir")  # relative to ``repo`` or absolute (git < 2.31 too)
    return Path(os.path.normpath(os.path.join(os.path.abspath(repo), found)))


def format_patch(repo: Path, commit: str, number: int, total: int) -> str:
    """``git format-patch`` text of one commit of ``repo``, numbered ``number``/``total``.

    The same bytes whatever ``repo``'s config says (``format.signOff``, ``format.headers``,
    ``format.subjectPrefix``, ``diff.noprefix``, ``core.abbrev``, ``user.email``, colour...):
    it runs in a private repository that borrows ``repo``'s objects and has no config but
    git's defaults and dsv4patch's pins, with dsv4patch's own identity."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dsv4patch-format-") as d:
        isolated = Path(d) / "format.git"
        init_with_alternates(isolated, [common_dir(repo)])
        text = run(isolated, ["format-patch", "-1", "--stdout", "--no-signature", "--subject-prefix=PATCH",
                              "--no-numbered", "--no-thread", "--no-notes", "--abbrev=7", "--no-color",
                              commit], env=IDENTITY).stdout
    return text.replace("Subject: [PATCH] ", f"Subject: [PATCH {number}/{total}] ", 1)


def _scratch_dir() -> Path:
    """Where a git call that reads no repository runs: the system's temporary directory (``tempfile`` is
    imported here, not at every start-up: it brings ``shutil`` and ``random``, issue 39)."""
    import tempfile

    return Path(tempfile.gettempdir())


def valid_branch_name(name: str) -> bool:
    """Whether ``name`` may name a new branch: ``refs/heads/NAME`` is a valid ref, and it is not
    a shorthand git expands (``@{-1}``, ``@``, ``HEAD``) or an option (a leading ``-``)."""
    if not name or name.startswith("-") or name in ("HEAD", "@") or "@{" in name or "\0" in name:
        return False
    return run(_scratch_dir(), ["check-ref-format", f"refs/heads/{name}"], check=False,
               repo=False).ok


def init_with_alternates(path: Path, others: Sequence[Path]) -> None:
    """A bare repository that can read the objects of ``others`` (one object store view)."""
    run(path.parent, ["init", "-q", "--bare", "--template=", str(Path(path).resolve())], repo=False)
    alt = path / "objects" / "info" / "alternates"
    alt.write_text("".join(f"{Path(o).resolve() / 'objects'}\n" for o in others))


# --- conflict workspace and refresh (resolving.py, refreshing.py) -------------------------


def apply_3way(tree: Path, patch: Path) -> Result:
    """``git apply --3way`` into the work tree and index of ``tree`` (conflicts leave markers)."""
    return run(tree, ["apply", "--3way", "-v", "--whitespace=nowarn", os.path.abspath(patch)], check=False,
               tied=True)


def add_all(tree: Path) -> None:
    """Stage every change of the work tree (``git add -A``)."""
    run(tree, ["add", "-A"], tied=True)


def unmerged_paths(tree: Path) -> list[str]:
    res = run(tree, ["ls-files", "-u", "-z"])
    return sorted({item.split("\t", 1)[1] for item in res.stdout.split("\0") if "\t" in item})


def resolve_blob(repo: Path, abbrev: str) -> str | None:
    """The full id of blob ``abbrev`` (possibly abbreviated) in ``repo``, or None."""
    res = run(repo, ["rev-parse", "--verify", "-q", f"{abbrev}^{{blob}}"], check=False)
    return res.stdout.strip() if res.ok else None


def rev_list(repo: Path, rev_range: str) -> list[str]:
    """Commits of ``rev_range``, oldest first."""
    return run(repo, ["rev-list", "--reverse", rev_range]).stdout.split()


def parents(repo: Path, commit: str) -> list[str]:
    return out(repo, "rev-list", "--parents", "-n", "1", commit).split()[1:]


def is_ancestor(repo: Path, ancestor: str, rev: str) -> bool:
    return run(repo, ["merge-base", "--is-ancestor", ancestor, rev], check=False).ok


@frozen
class CommitInfo:
    """What ``refresh`` reads of a commit."""

    message: str  # ends with one newline
    author: dict[str, str]  # GIT_AUTHOR_NAME / _EMAIL / _DATE, as commit_tree takes them
    tree: str


def commit_info(repo: Path, commit: str) -> CommitInfo:
    """Message, author and tree id of ``commit``."""
    res = run(repo, ["log", "-1", "--format=%an%x00%ae%x00%aI%x00%T%x00%B", commit])
    name, email, date, tree_id, message = res.stdout.split("\0", 4)
    author = {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_AUTHOR_DATE": date}
    return CommitInfo(message.rstrip("\n") + "\n", author, tree_id)


def config_list(repo: Path | None, *, file: Path | None = None, includes: bool = True) -> list[tuple[str, str, str]]:
    """``(origin, key, value)`` of each setting git reads for the repository at ``repo`` (its own
    config, ``config.worktree``, and with ``includes`` the files they include), or of ``file``
    alone.  System and global config are never read (see :func:`environment`); the pins of
    :data:`_CONFIG` (origin ``command line:``) are left out."""
    args = ["config", "--list", "-z", "--show-origin", "--includes" if includes else "--no-includes"]
    if file is not None:
        args += ["--file", str(file)]
    where = repo if repo is not None else _scratch_dir()
    res = run(where, args, check=False, repo=repo is not None)
    if not res.ok:
        raise GitError(f"git config cannot read the configuration of {file or repo}: {res.stderr.strip()}")
    fields = res.stdout.split("\0")
    found: list[tuple[str, str, str]] = []
    for origin, item in zip(fields[0::2], fields[1::2], strict=False):
        key, _, value = item.partition("\n")
        if not origin.startswith("command line:"):
            found.append((origin, key, value))
    return found


def ls_files(repo: Path, *args: str) -> list[str]:
    """``git ls-files -z ARGS``: one item per entry (``-s``: ``mode oid stage\tpath``)."""
    return [item for item in run(repo, ["ls-files", "-z", *args]).stdout.split("\0") if item]


def ignored(repo: Path, names: Sequence[str]) -> set[str]:
    """Which of ``names`` (paths in the work tree) git ignores (``.gitignore``, ``info/exclude``)."""
    if not names:
        return set()
    res = run(repo, ["check-ignore", "-z", "--no-index", "--stdin"], input="\0".join(names) + "\0",
              check=False)
    return {n for n in res.stdout.split("\0") if n}
