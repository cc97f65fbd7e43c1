"""Stop one git command of a spawned dsv4patch at a chosen point, through PATH.

dsv4patch runs git with hooks, fsmonitor, filters and attributes off, so a
test cannot use git's own extension points to pause it.  What a caller does
decide is which ``git`` runs: PATH is one of the few variables dsv4patch
passes on (``git.KEEP_ENV``).  :func:`install` writes a ``git`` script into a
directory the test puts first on the spawned process's PATH.  The script
runs the real git (resolved when the test sets it up) for everything except
the first ``update-ref`` or ``read-tree -u`` on the tree under test; for that
one it runs this file as a child (:func:`main`), which brings the repository
into the state a git killed at that point leaves, touches ``FLAGS/started``
and blocks until ``FLAGS/go`` exists.

* ``update-ref``: what git holds once its ref transaction is prepared (the
  moment a ``reference-transaction`` hook would see "prepared", checked with
  git 2.39): ``HEAD.lock`` (empty) and the branch's ``<ref>.lock`` holding
  the new commit id.  Index and work tree were already moved by the real
  ``read-tree -m -u``; HEAD is still at the old commit.
* ``read-tree -m -u OLD NEW``: git's ``index.lock`` (created first, as git
  does), then the work tree written part-way the way git's ``check_updates``
  writes it: every file NEW deletes removed, the first file NEW adds or
  changes (index order) written, the second removed (git unlinks a file
  before it writes the new one), the rest untouched.  The files are moved by
  the real git: ``read-tree -m -u OLD MID`` on a copy of the index, MID being
  OLD with exactly those changes; the repository's index stays at OLD.

The blocked helper is a child of the script that stands in for git, so it
lives on when that "git" is killed (like a hook would) and keeps the
descriptors git inherited (dsv4patch's tree lock).  If the stand-in is still
alive when ``go`` appears, the helper removes what it created and lets the
real command run; if it was killed, what it held stays behind, as it would
after a real kill.  ``FLAGS/disarmed`` turns the stop off.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

STOPPABLE = ("update-ref", "read-tree")

_SCRIPT = """#!/bin/sh
# git for a test: stop the first {sub} on {tree}; any other command is the real git.
sub=; skip=
for a in "$@"; do
  if [ -n "$skip" ]; then skip=; continue; fi
  case "$a" in
    -c|-C) skip=1 ;;
    -*) ;;
    *) sub=$a; break ;;
  esac
done
if [ "$sub" = {sub} ] && [ ! -e {flags}/disarmed ] && [ ! -e {flags}/started ] \\
   && [ "$(cd "$GIT_WORK_TREE" 2>/dev/null && pwd -P)" = {tree} ]; then
  case "$sub $* " in
    "read-tree "*" -u "*|update-ref*)
      {python} {helper} {real} {flags} "$@" || exit $? ;;
  esac
fi
exec {real} "$@"
"""


def install(bin_dir: Path, flags: Path, tree: Path, sub: str) -> dict[str, str]:
    """Write the ``git`` stand-in into ``bin_dir``; returns the env for the spawned run."""
    if sub not in STOPPABLE:
        raise ValueError(f"can stop {STOPPABLE}, not {sub!r}")
    real = shutil.which("git")
    assert real, "git is not on PATH"
    bin_dir.mkdir(parents=True, exist_ok=True)
    flags.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "git"
    q = shlex.quote
    script.write_text(_SCRIPT.format(
        sub=q(sub), tree=q(os.path.realpath(tree)), flags=q(str(flags)), python=q(sys.executable),
        helper=q(str(Path(__file__).resolve())), real=q(real)))
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"}


def _split(args: list[str]) -> tuple[list[str], str, list[str]]:
    """(global options, subcommand, its arguments) of a git command line."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in ("-c", "-C") else 1
    return args[:i], args[i], args[i + 1:]


def _create(path: Path, data: bytes = b"") -> Path:
    """A git lock file: O_EXCL like git's lockfile.c, written and closed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return path


def _hold_ref_locks(gitdir: Path, sub_args: list[str]) -> list[Path]:
    rest = list(sub_args)
    positional: list[str] = []
    while rest:
        a = rest.pop(0)
        if a == "-m":
            rest.pop(0)
        elif not a.startswith("-"):
            positional.append(a)
    ref, new = positional[0], positional[1]
    made = []
    if ref == "HEAD":
        head = (gitdir / "HEAD").read_text().strip()
        made.append(_create(gitdir / "HEAD.lock"))
        if head.startswith("ref: "):
            ref = head[5:]
    if ref != "HEAD":
        made.append(_create(gitdir / f"{ref}.lock", f"{new}\n".encode()))
    return made


def _half_move(real: str, gitdir: Path, options: list[str], sub_args: list[str], flags: Path) -> list[Path]:
    old, new = [a for a in sub_args if not a.startswith("-")][-2:]
    made = [_create(gitdir / "index.lock")]

    def git(*args: str, index: Path | None = None) -> str:
        env = dict(os.environ)
        if index is not None:
            env["GIT_INDEX_FILE"] = str(index)
        return subprocess.run([real, *options, *args], env=env, check=True, capture_output=True,
                              text=True).stdout

    def entries(commit: str) -> dict[str, tuple[str, str]]:
        out = {}
        for line in git("ls-tree", "-r", "-z", "--full-tree", commit).split("\0"):
            if line:
                meta, name = line.split("\t", 1)
                mode, _typ, oid = meta.split()
                out[name] = (mode, oid)
        return out

    before, after = entries(old), entries(new)
    deleted = sorted(n for n in before if n not in after)
    written = sorted(n for n in after if before.get(n) != after[n])
    assert len(written) >= 2, f"read-tree {old}..{new} writes {written}: too few to stop half-way"
    mid_index, work_index = flags / "mid.index", flags / "work.index"
    git("read-tree", old, index=mid_index)
    mode, oid = after[written[0]]
    git("update-index", "--add", "--cacheinfo", f"{mode},{oid},{written[0]}", index=mid_index)
    for name in [*deleted, written[1]]:
        git("update-index", "--force-remove", "--", name, index=mid_index)
    mid = git("write-tree", index=mid_index).strip()
    shutil.copyfile(gitdir / "index", work_index)
    git("read-tree", "-m", "-u", old, mid, index=work_index)
    mid_index.unlink()
    work_index.unlink()
    return made


def main(argv: list[str]) -> int:
    real, flags, args = argv[0], Path(argv[1]), argv[2:]
    options, sub, sub_args = _split(args)
    gitdir = Path(os.environ["GIT_DIR"])
    if sub == "update-ref":
        made = _hold_ref_locks(gitdir, sub_args)
    else:
        made = _half_move(real, gitdir, options, sub_args, flags)
    stand_in = os.getppid()
    (flags / "started").touch()
    while not (flags / "go").exists():
        time.sleep(0.05)
    if os.getppid() != stand_in:
        return 1  # "git" was killed while stopped: what it held stays, as after a real kill
    for path in made:
        path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
