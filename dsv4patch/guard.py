"""A user's checkout, vetted once: the one way dsv4patch runs git on a tree it does not own.

``--tree``, ``--workspace``, ``port --local`` and a ``local`` pin's source are
repositories someone lives in: years of config, includes, attributes,
submodules, linked worktrees, ignored files.  git reads all of that, and some
of it names programs git runs (a filter's ``clean``/``smudge``/``process``, a
diff driver's ``textconv``/``command``, a merge driver) or rewrites the files it
writes (``eol=crlf``, ``ident``, ``working-tree-encoding``).  So before any
command touches such a checkout, :func:`guarded` vets it once:

* where its git directory is, read from the files (``.git`` a directory, or a
  linked worktree's or submodule's ``.git`` file), and its common directory
  (``commondir``: a linked worktree's config, ``info/attributes`` and objects
  live in the main repository's ``.git``), both confirmed by git;
* the config git reads for it (the repository's, ``config.worktree`` and every
  file they include, ``includeIf`` ones too, each a regular file: never a FIFO
  that would hang git): no filter, diff or merge driver; not a partial clone
  (whose fetch of a missing object runs the remote's command); SHA-1 objects;
* the attributes git applies to it (``info/attributes`` in the common directory
  and in its own git directory, every ``.gitattributes`` in the work tree,
  tracked, untracked or ignored): nothing that makes the files on disk differ
  from the blobs;
* its submodules (gitlinks in the index, ``modules/`` of the common directory,
  nested ones too), each one's own config the same way; git never enters a
  submodule (:data:`dsv4patch.git._CONFIG`, ``--ignore-submodules=all``,
  ``--no-recurse-submodules``), so nothing of theirs runs either way;
* its other worktrees and the branches they have checked out (a branch checked
  out elsewhere is never moved or re-attached here).

Anything found is refused (:class:`TreeError`, exit 5) with the setting and the
file it is in, before git has done anything but read.  While the guard is held,
:mod:`dsv4patch.git` runs in the checkout with the git directory the vetting
found and its program-running settings pinned off; without it, git refuses to
run in a work tree at all (an internal error), so a command cannot forget the
guard.  :func:`owned` is the same hold for a work tree dsv4patch has just made
itself (nothing of a user's in it yet).

:meth:`Checkout.in_the_way` is the second promise: a move never overwrites a
file the user did not commit.  Paths the move writes that hold an untracked or
ignored file (git's ``read-tree -m -u`` and ``reset --hard`` overwrite ignored
ones without a word) are refused with their names, and so is any index entry git is
told not to compare with the work tree (``assume-unchanged``, ``skip-worktree``:
:meth:`Checkout.hidden`), whose edit no clean check sees.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from dsv4patch import git, safeio
from dsv4patch.errors import GitError, ParameterError, TreeError
from dsv4patch.records import frozen

# Settings that name a program git runs on file contents (it cannot be pinned off by name:
# the driver's name is the repository's choice), per the config's (lower-cased) key.
_DRIVER = re.compile(r"^(filter\..+\.(clean|smudge|process)|diff\..+\.(textconv|command)|diff\.external"
                     r"|merge\..+\.driver)$")
_INCLUDE = re.compile(r"^(include|includeif\..+)\.path$")
_MAX_INCLUDE_DEPTH = 10  # git's own limit
_CONFIG_LIMIT = 1 << 20  # a config or attributes file larger than this is not one a person wrote
_PROBLEMS_SHOWN = 6


@frozen
class Worktree:
    """Another worktree of the checkout's repository and the branch it has checked out."""

    path: Path
    branch: str | None  # refs/heads/..., None when detached


@frozen
class Checkout:
    """A vetted user checkout: where its git directory and common directory are."""

    path: Path  # the work tree (absolute)
    gitdir: Path  # its git directory: .git, or a linked worktree's private one
    commondir: Path  # objects, refs, config and info/ of the repository
    worktrees: tuple[Worktree, ...]  # the repository's other worktrees
    submodules: tuple[str, ...]  # paths of the gitlinks in its index

    def branch_elsewhere(self, ref: str) -> Path | None:
        """The other worktree that has branch ``ref`` checked out, if any."""
        return next((w.path for w in self.worktrees if w.branch == ref), None)

    def in_the_way(self, target: str, extra: Sequence[str] = ()) -> list[str]:
        """Files the user did not commit that moving the work tree to commit ``target`` would overwrite.

        Every path of ``target`` that the index does not track (plus ``extra``: paths a
        step writes outside ``target``, e.g. a 3-way merge's new files) must be absent
        from the work tree, and no directory above it may be an untracked file or link.
        Returns those paths, each with `` (ignored)`` when git ignores it."""
        tracked = {item.split("\t", 1)[1] for item in git.ls_files(self.path, "-s")}
        dirs = {d for p in tracked for d in _parents(p)}
        written = set(git.tree_files(self.path, target)) | set(extra)
        found: set[str] = set()
        for name in written - tracked:
            if os.path.lexists(self.path / name):
                found.add(name)
                continue
            for d in _parents(name):
                if d in dirs or d in tracked:
                    continue
                full = self.path / d
                if os.path.islink(full) or (os.path.lexists(full) and not full.is_dir()):
                    found.add(d)
                    break
        if not found:
            return []
        names = sorted(found)
        hidden = git.ignored(self.path, names)
        return [f"{n} (ignored)" if n in hidden else n for n in names]

    def hidden(self) -> list[tuple[str, str]]:
        """Index entries git is told not to compare with the work tree, with the flag:
        ``assume-unchanged`` (``git update-index --assume-unchanged``: ``ls-files -v`` tags it in lower
        case) or ``skip-worktree`` (tag ``S``; ``s`` when both).  An edit in such a file is invisible
        to ``git status``, ``read-tree -m -u`` refuses the move ("not uptodate") and ``reset --hard``
        overwrites or skips it."""
        found = []
        for item in git.ls_files(self.path, "-v"):
            tag, _, name = item.partition(" ")
            if tag in ("S", "s"):
                found.append((name, "skip-worktree" + (" and assume-unchanged" if tag == "s" else "")))
            elif tag.islower():
                found.append((name, "assume-unchanged"))
        return found

    def refuse_hidden(self, what: str) -> None:
        """TreeError (exit 5) naming the files :meth:`hidden` finds and how to clear each flag."""
        found = self.hidden()
        if not found:
            return
        shown = ", ".join(f"{n} ({flag})" for n, flag in found[:10]) + (
            f", ... ({len(found)} in all)" if len(found) > 10 else "")
        flags = sorted({f for _n, flag in found for f in flag.split(" and ")})
        name = shlex.quote(found[0][0]) if len(found) == 1 else "FILE"
        how = " and ".join(f"`git -C {shlex.quote(str(self.path))} update-index --no-{f} {name}`" for f in flags)
        raise TreeError(
            f"{self.path}: {what} would move files the index tells git not to look at: {shown}. git cannot "
            "see an edit in them (nor can dsv4patch's check that the tree is clean), and a move would "
            "refuse, skip or overwrite them. Nothing was changed. Keep what you changed there (commit it, or "
            f"copy it aside), clear the flag ({how}" + (", for each file named" if len(found) > 1 else "")
            + "), then run the command again")

    def refuse_in_the_way(self, target: str, what: str, extra: Sequence[str] = ()) -> None:
        """TreeError (exit 5) naming the files :meth:`in_the_way` finds, or the index entries :meth:`hidden`
        finds; nothing is touched."""
        self.refuse_hidden(what)
        found = self.in_the_way(target, extra)
        if found:
            shown = ", ".join(found[:10]) + (f", ... ({len(found)} in all)" if len(found) > 10 else "")
            raise TreeError(
                f"{self.path}: {what} would overwrite files you have not committed: {shown}. Nothing was "
                "changed; dsv4patch never overwrites a file it did not write (an ignored one included). "
                "Move them out of the way (or commit them), then run the command again")


def _parents(name: str) -> list[str]:
    parts = name.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


# Checkouts held now (realpath -> the Checkout): a nested hold reuses the vetting.
_HELD: dict[str, Checkout] = {}


@contextmanager
def guarded(path: Path, *, role: str = "--tree", creatable: bool = False) -> Iterator[Checkout]:
    """Vet the checkout at ``path`` (see the module docstring) and hold it for git while inside.

    ``role`` names the checkout in messages (``--tree``, ``--workspace``, ``pin acme's local
    checkout``...).  TreeError (exit 5) when ``path`` is not the root of a git checkout or
    its settings name programs or rewrite files; nothing has been written then.  ``creatable``: the
    caller creates a tree at an absent or empty ``path`` (apply), which the message then offers."""
    path = Path(os.path.abspath(path))
    if "\n" in str(path):  # git answers one path a line (rev-parse): refused before any git runs
        raise ParameterError(f"{role} {str(path)!r}: the path holds a newline, which git's answers cannot "
                             f"carry (one path a line); use a checkout whose path has none")
    key = os.path.realpath(path)
    held = _HELD.get(key)
    if held is not None:
        with git.guarding(held.path, held.gitdir):
            yield held
        return
    co = _vet(path, role, creatable)
    _HELD[key] = co
    try:
        with git.guarding(path, co.gitdir):
            yield co
    finally:
        _HELD.pop(key, None)


@contextmanager
def owned(path: Path) -> Iterator[None]:
    """Hold a work tree dsv4patch has just created (a clone it made, an import directory) for git.

    Nothing of a user's is in it, so nothing is vetted.  Only the modules that create work
    trees call this (tests/test_architecture.py checks which)."""
    path = Path(os.path.abspath(path))
    with git.guarding(path, path / ".git"):
        yield


def is_checkout_root(path: Path) -> bool:
    """Whether ``path`` looks like the root of a git checkout (a ``.git`` entry); vetting decides."""
    return os.path.lexists(Path(path) / ".git")


def enclosing_checkout(path: Path) -> Path | None:
    """The nearest directory above ``path`` that looks like a checkout's root, if any: named in a
    message when a command is pointed inside a tree (``vllm-src/0.27.1/vllm``) instead of at its root.
    Only names are looked up: no git runs, nothing is opened or followed."""
    return next((p for p in Path(os.path.abspath(path)).parents if is_checkout_root(p)), None)


def inside_note(path: Path) -> str:
    """``"; it is inside the checkout ROOT"`` when :func:`enclosing_checkout` finds one, else ``""``."""
    above = enclosing_checkout(path)
    return f"; it is inside the checkout {above}" if above is not None else ""


def _not_a_checkout(path: Path, role: str, why: str, creatable: bool) -> TreeError:
    return TreeError(f"{role} {path} is not the root of a git checkout ({why}); point {role} at the "
                     "top directory of a checkout" + (", or at a new (absent or empty) directory and dsv4patch "
                                                      "creates the tree" if creatable else ""))


def _small_file(path: Path, what: str, problems: list[str]) -> bool:
    """Whether ``path`` (which git will read) is a regular file of bounded size; else a problem."""
    try:
        st = os.stat(path)  # follows a link: git reads what it points to
    except FileNotFoundError:
        return False
    except OSError as exc:
        problems.append(f"{what} {path} cannot be read ({exc.strerror})")
        return False
    if not stat.S_ISREG(st.st_mode):
        problems.append(f"{what} {path} is not a regular file (git would block or read without end on it)")
        return False
    if st.st_size > _CONFIG_LIMIT:
        problems.append(f"{what} {path} is {st.st_size} bytes (more than {_CONFIG_LIMIT})")
        return False
    return True


_WALK_LIMIT = 2_000_000  # entries under one git directory; more is not a repository a person keeps


def _special_files(root: Path, what: str, problems: list[str]) -> None:
    """Name every FIFO, socket or device under ``root`` (a git directory), links followed to files only.

    git opens the files of its own directory without asking what they are, and ``open`` of a FIFO
    blocks until a writer comes: a planted FIFO at ``HEAD``, ``index``, ``packed-refs``, a loose ref
    or ``info/exclude`` would hang every git call on the checkout.  The walk is ``os.walk``'s (top
    down, a directory's other entries before its subdirectories, never into a linked directory) and
    stops at ``_WALK_LIMIT`` entries; an entry the directory listing already types as a regular file
    or a directory costs no ``stat`` (a link, or a listing that does not type, is stat'ed through).
    """
    seen = 0
    stack = [str(root)]
    while stack:
        try:
            with os.scandir(stack.pop()) as listing:
                entries = list(listing)
        except OSError:
            continue  # as os.walk: a directory that cannot be listed is passed over
        typed = [(e, _is_dir(e)) for e in entries]
        dirs = [e for e, is_dir in typed if is_dir]
        for entry in [e for e, is_dir in typed if not is_dir] + dirs:
            seen += 1
            if seen > _WALK_LIMIT:
                problems.append(f"{what} has more than {_WALK_LIMIT} entries; not vetted")
                return
            kind = _special_kind(entry)
            if kind:
                problems.append(f"{what}: {entry.path} is {kind} (git would block or read without end on it); "
                                "remove it")
        stack += reversed([e.path for e in dirs if not e.is_symlink()])


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _special_kind(entry: os.DirEntry[str]) -> str | None:
    """What git would open at ``entry`` when it is neither a regular file nor a directory (a link is
    judged by what it points to; a dangling one is nothing: git finds nothing there either)."""
    if not entry.is_symlink() and (entry.is_file(follow_symlinks=False) or entry.is_dir(follow_symlinks=False)):
        return None  # typed by the listing: no stat
    try:
        st = os.stat(entry.path)
    except OSError:
        return None
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return None
    return "a FIFO" if stat.S_ISFIFO(st.st_mode) else "not a regular file"


def _ignore_files(path: Path, problems: list[str]) -> None:
    """Check every ``.gitignore`` in the work tree like an attributes file: ``git status`` opens one in each
    directory it walks, and ``ls-files`` never lists a FIFO, so the tree is walked here (no ``.git``
    directory, no linked directory entered, at most ``_WALK_LIMIT`` entries)."""
    seen = 0
    for top, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d != ".git"]
        seen += len(dirs) + len(files)
        if seen > _WALK_LIMIT:
            problems.append(f"the work tree {path} has more than {_WALK_LIMIT} entries; its ignore files "
                            "were not all vetted")
            return
        if ".gitignore" in files:
            _small_file(Path(top) / ".gitignore", "the repository: ignore file", problems)


def _git_dirs(path: Path, role: str, creatable: bool) -> tuple[Path, Path]:
    """(git directory, common directory) of the checkout at ``path``, read from its files."""
    dotgit = path / ".git"
    if dotgit.is_symlink():
        raise TreeError(f"{role} {path}: .git is a symbolic link; dsv4patch does not follow it (point "
                        f"{role} at the checkout it belongs to)")
    if dotgit.is_dir():
        gitdir = dotgit
    elif dotgit.is_file():
        try:
            text = safeio.read_text(dotgit, limit=4096, error=TreeError)
        except TreeError as exc:
            raise _not_a_checkout(path, role, creatable=creatable,
                                  why=f"its .git file cannot be read: {exc}") from None
        m = re.fullmatch(r"gitdir: (.+?)\s*", text)
        if not m:
            raise _not_a_checkout(path, role, creatable=creatable,
                                  why="its .git file does not name a git directory")
        gitdir = Path(os.path.normpath(path / m.group(1)))
    else:
        raise _not_a_checkout(path, role, creatable=creatable, why="no .git" + inside_note(path))
    if not gitdir.is_dir():
        raise _not_a_checkout(path, role, creatable=creatable,
                              why=f"its git directory {gitdir} does not exist")
    common = gitdir
    commondir_file = gitdir / "commondir"
    if os.path.lexists(commondir_file):
        try:
            rel = safeio.read_text(commondir_file, limit=4096, error=TreeError).strip()
        except TreeError as exc:
            raise _not_a_checkout(path, role, creatable=creatable,
                                  why=f"{commondir_file} cannot be read: {exc}") from None
        common = Path(os.path.normpath(gitdir / rel))
    return gitdir, common


def _includes(entries: list[tuple[str, str, str]], problems: list[str], what: str) -> list[Path]:
    """The files ``entries`` (one config file's settings, without includes) include."""
    found = []
    for origin, key, value in entries:
        if not _INCLUDE.match(key.lower()) or not value:
            continue
        base = Path(origin.removeprefix("file:")).parent
        if value.startswith("~"):  # `~/` and `~user/`, as git expands them (HOME is passed on to git)
            target = Path(os.path.expanduser(value))
        elif value.startswith("%(prefix)/"):
            continue  # relative to git's install prefix: git's own files
        else:
            target = base / value
        if _small_file(target, f"{what}: the file {key} includes,", problems):
            found.append(target)
    return found


def _config_problems(files: list[Path], repo: Path | None, what: str, problems: list[str]) -> None:
    """Vet config files (and everything they include, read file by file) for drivers; FIFOs and
    huge files refused.  With ``repo``: also what git assembles for it (:func:`_repo_config_problems`)."""
    seen: set[str] = set()
    queue = [(f, 0) for f in files if _small_file(f, f"{what}: config", problems)]
    while queue:
        f, depth = queue.pop()
        key = os.path.realpath(f)
        if key in seen or depth > _MAX_INCLUDE_DEPTH:
            continue
        seen.add(key)
        try:
            entries = git.config_list(None, file=f, includes=False)
        except GitError as exc:
            problems.append(f"{what}: {exc}")
            continue
        queue += [(inc, depth + 1) for inc in _includes(entries, problems, what)]
        for origin, name, _value in entries:
            if _DRIVER.match(name.lower()):
                problems.append(f"{what}: config {name} (in {origin.removeprefix('file:')})")
    if repo is not None and not problems:
        _repo_config_problems(repo, problems)


def _repo_config_problems(repo: Path, problems: list[str], *, role: str = "--tree",
                          creatable: bool = False) -> None:
    """What git itself assembles for ``repo`` (includeIf conditions evaluated, config.worktree):
    the same rule, once every file it reads is known to be a regular one.  A partial clone is
    refused outright (:func:`_partial_clone`)."""
    if problems:
        return
    entries = git.config_list(repo, includes=True)
    _object_format(repo, entries, role)
    _partial_clone(repo, entries, role, creatable)
    for origin, name, _value in entries:
        if _DRIVER.match(name.lower()):
            problems.append(f"the repository: config {name} (in {origin.removeprefix('file:')})")


_FALSE = ("false", "no", "off", "0")


def _object_format(path: Path, entries: list[tuple[str, str, str]], role: str) -> None:
    """TreeError (exit 5) when the repository's objects are not SHA-1 (``extensions.objectFormat``): the
    lock's commits and tree ids are SHA-1 ones, and git reads a SHA-1 index or object store under another
    format as garbage or fails."""
    for origin, name, value in entries:
        if name.lower() == "extensions.objectformat" and value.lower() != "sha1":
            where = origin.removeprefix("file:")
            raise TreeError(
                f"{role} {path}: extensions.objectFormat={value} (in {where}): dsv4patch reads only SHA-1 "
                "repositories (the lock's commits and tree ids are SHA-1) and touched nothing. Point "
                f"{role} at a SHA-1 clone; if this repository is a SHA-1 one and the setting a mistake, "
                f"remove it (`git -C {path} config --unset extensions.objectFormat`)")


def _partial_clone(path: Path, entries: list[tuple[str, str, str]], role: str, creatable: bool) -> None:
    """TreeError (exit 5) when the checkout is a partial clone: ``extensions.partialClone``, or a remote
    that is a promisor (``remote.<name>.promisor`` true, or a ``remote.<name>.partialCloneFilter``, which
    makes it one).  git fetches every object such a repository lacks from that remote the moment it
    reads it, and the fetch runs what the repository's config names (``remote.<name>.uploadpack`` for a
    ``file://`` remote, ``core.sshCommand`` for ``ssh://``; a request to any https host).  No git call
    of dsv4patch has read a blob yet when this is asked (only ``rev-parse`` and ``config`` ran)."""
    found: list[str] = []
    remotes: list[str] = []
    for origin, name, value in entries:
        where = origin.removeprefix("file:")
        key = name.lower()
        section, _, rest = key.partition(".")
        sub, _, leaf = rest.rpartition(".")
        if key == "extensions.partialclone":
            found.append(f"extensions.partialClone={value} in {where}")
            remotes.append(value)
        elif section == "remote" and sub and leaf == "promisor" and value.lower() not in _FALSE:
            remote = name[len("remote."):-len(".promisor")]
            found.append(f"remote.{remote}.promisor={value or 'true'} in {where}")
            remotes.append(remote)
        elif section == "remote" and sub and leaf == "partialclonefilter":
            remote = name[len("remote."):-len(".partialclonefilter")]
            found.append(f"remote.{remote}.partialCloneFilter={value} in {where}")
            remotes.append(remote)
    if not found:
        return
    remote = next((r for r in remotes if r), "origin")
    raise TreeError(
        f"{role} {path} is a partial clone ({'; '.join(found)}): git would fetch each object it lacks from "
        "that remote while dsv4patch reads the tree, running the fetch command the repository's config names "
        "(remote.<name>.uploadpack, core.sshCommand); dsv4patch runs none of it and touched nothing. Make it a "
        f"full clone first (`git -C {path} config --unset remote.{remote}.partialclonefilter; "
        f"git -C {path} fetch --refetch {remote}`, then unset the settings named with `git -C {path} config "
        f"--unset`), or point {role} at a full clone (`git clone` without --filter)"
        + (", or at a new (absent or empty) directory and dsv4patch creates the tree" if creatable else ""))


def rewriting_attribute(line: str) -> str | None:
    """The attribute of a gitattributes line that makes a checked-out file differ from its blob.

    ``eol=crlf``, ``ident`` and ``working-tree-encoding`` rewrite what checkout writes
    (``text``/``eol=lf`` do not: dsv4patch pins ``core.eol=lf``, ``core.autocrlf=false``);
    a ``filter=NAME`` does nothing without a configured driver, and a driver is refused."""
    fields = line.split()
    if not fields or fields[0].startswith("#"):
        return None
    for attr in fields[1:]:
        name, _, value = attr.partition("=")
        if name in ("ident", "working-tree-encoding") or (name == "eol" and value == "crlf"):
            return attr
    return None


def _attribute_problems(files: list[Path], problems: list[str], what: str) -> None:
    for f in files:
        if not _small_file(f, f"{what}: attributes file", problems):
            continue
        for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
            attr = rewriting_attribute(line)
            if attr:
                problems.append(f"{what}: {f}: {line.strip()!r} ({attr} rewrites files on checkout)")


def _worktrees(path: Path) -> tuple[Worktree, ...]:
    res = git.run(path, ["worktree", "list", "--porcelain", "-z"], check=False)
    found: list[Worktree] = []
    here = os.path.realpath(path)
    for block in res.stdout.split("\0\0"):
        fields = dict(item.partition(" ")[::2] for item in block.split("\0") if item)
        where = fields.get("worktree")
        if where and os.path.realpath(where) != here:
            found.append(Worktree(Path(where), fields.get("branch") or None))
    return tuple(found)


def _vet(path: Path, role: str, creatable: bool) -> Checkout:
    gitdir, common = _git_dirs(path, role, creatable)
    problems: list[str] = []
    # The files git reads before anything else: a FIFO here would hang every git call.
    configs = [common / "config"] + ([gitdir / "config.worktree"] if gitdir != common else
                                     [common / "config.worktree"])
    # Each read as a file of its own first (never the repository's config as git assembles it), so
    # an include that is a FIFO is found before any git would open it.
    _config_problems(configs, None, "the repository", problems)
    # Every file git may open in its own directories (HEAD, index, packed-refs, refs, shallow,
    # info/exclude, info/grafts, objects/info/alternates, loose objects, ...): a FIFO, socket or
    # device there would block git on open, before any git call.
    for d in sorted({gitdir, common}):
        _special_files(d, f"the repository's git directory {d}", problems)
    if problems:
        raise _refused(path, role, problems)
    with git.guarding(path, gitdir):
        try:
            found = git.run(path, ["rev-parse", "--absolute-git-dir", "--git-common-dir",
                                   "--is-inside-work-tree"], check=False)
        except GitError as exc:
            raise _not_a_checkout(path, role, creatable=creatable, why=str(exc)) from None
        if not found.ok:
            why = found.stderr.strip().splitlines()[-1] if found.stderr.strip() else "git does not read it as one"
            raise _not_a_checkout(path, role, creatable=creatable, why=why)
        # One answer a line; only "\n" ends one (a path may hold "\r", "\v"... that splitlines would split).
        real_gitdir, real_common, inside = (found.stdout.split("\n") + ["", "", ""])[:3]
        real_common = os.path.normpath(os.path.join(path, real_common))  # relative to the tree, or absolute
        if (os.path.realpath(real_gitdir) != os.path.realpath(gitdir)
                or os.path.realpath(real_common) != os.path.realpath(common) or inside != "true"):
            raise _not_a_checkout(path, role, creatable=creatable,
                                  why=f"git reads {real_gitdir} (common {real_common}) for it, not {gitdir}")
        _repo_config_problems(path, problems, role=role, creatable=creatable)
        attributes = [common / "info" / "attributes"]
        if gitdir != common:
            attributes.append(gitdir / "info" / "attributes")
        attributes += [path / n for n in git.ls_files(path, "--cached", "--others", "--",
                                                      ":(glob)**/.gitattributes")]
        _attribute_problems(sorted(set(attributes)), problems, "the repository")
        _ignore_files(path, problems)
        entries = git.ls_files(path, "-s")
        submodules = tuple(sorted({e.split("\t", 1)[1] for e in entries if e.startswith("160000 ")}))
        sub_configs = sorted(p / "config" for p in _submodule_gitdirs(common, path, submodules))
        for cfg in sub_configs:
            _config_problems([cfg], None, f"submodule {cfg.parent}", problems)
            _special_files(cfg.parent, f"submodule {cfg.parent}", problems)
        worktrees = _worktrees(path)
    if problems:
        raise _refused(path, role, problems)
    return Checkout(path, Path(real_gitdir), Path(real_common), worktrees, submodules)


def _submodule_gitdirs(common: Path, path: Path, submodules: Sequence[str]) -> set[Path]:
    """The git directories of the checkout's submodules: ``modules/**`` of the common directory
    (nested ones too) and a submodule's own ``.git`` directory in the work tree (old layout)."""
    found: set[Path] = set()
    modules = common / "modules"
    if modules.is_dir() and not modules.is_symlink():
        for root, dirs, files in os.walk(modules):
            if "HEAD" in files and "config" in files:
                found.add(Path(root))
            dirs[:] = [d for d in dirs if d not in ("objects", "refs", "logs", "hooks", "info")]
    for sub in submodules:
        d = path / sub / ".git"
        if d.is_dir() and not d.is_symlink():
            found.add(d)
    return found


def _refused(path: Path, role: str, problems: list[str]) -> TreeError:
    shown = "; ".join(problems[:_PROBLEMS_SHOWN]) + (f"; ... ({len(problems)} in all)"
                                                     if len(problems) > _PROBLEMS_SHOWN else "")
    return TreeError(
        f"{role} {path}: its git settings name programs git would run, or rewrite the files on disk "
        f"so they differ from the tree ids ({shown}); dsv4patch runs none of them and touched nothing. "
        f"Remove them, or use a clean clone (`git clone {path} NEW`) as {role}")
