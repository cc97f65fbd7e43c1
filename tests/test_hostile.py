"""Hostile inputs: what an attacker controls stays data, and the caller's environment cannot steer git.

dsv4patch trusts the lock's hashes and commits and the reviewed patch files;
everything else (sdist contents, source URLs, the environment, the target
tree's own git config) may be hostile.  Each case builds its small hostile
input here and checks the invariants: the hostile command never runs (its
marker file does not exist), nothing is written outside the tree and the
cache, an enclosing repository is untouched, and the error names the culprit
with the documented exit code.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from conftest import MINI_FILES, git_pin, pin_table, sdist_pin, sh, write_lock
from dsv4patch.errors import EXIT_FETCH, EXIT_INPUT, EXIT_OK, EXIT_TREE, EXIT_UNEXPECTED
from test_recovery import wide_lock  # noqa: F401 (fixture)

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOP = "vllm-0.0.1"
VERSION_PY = f"__version__ = version = '0.0.1'\n__commit_id__ = commit_id = 'g{COMMIT[:9]}'\n"
HOOKS = ("post-checkout", "pre-commit", "post-commit", "reference-transaction",
         "post-index-change", "pre-auto-gc", "post-rewrite")


def marker_script(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """An executable that creates a marker file: (script, marker)."""
    marker = tmp_path / f"{name}.RAN"
    script = tmp_path / f"{name}.sh"
    script.write_text(f"#!/bin/sh\ntouch '{marker}'\nexit 0\n")
    script.chmod(0o755)
    return script, marker


def hooks_dir(tmp_path: Path, name: str) -> tuple[Path, Path]:
    script, marker = marker_script(tmp_path, name)
    d = tmp_path / f"{name}-hooks"
    d.mkdir()
    for h in HOOKS:
        (d / h).symlink_to(script)
    return d, marker


def snapshot_dir(root: Path) -> dict[str, bytes]:
    """Every file (and symlink target) under ``root``, by content."""
    out: dict[str, bytes] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = b"->" + os.readlink(p).encode()
        elif p.is_file():
            out[rel] = p.read_bytes()
        else:
            out[rel] = b"<dir>"
    return out


# --- sdists ---------------------------------------------------------------


class Sdist:
    """A small sdist built member by member (hostile ones included)."""

    def __init__(self) -> None:
        self.members: list[tuple[tarfile.TarInfo, bytes | None]] = []
        self.dir(TOP)
        self.dir(f"{TOP}/vllm")
        self.file(f"{TOP}/vllm/__init__.py", b"")
        self.file(f"{TOP}/vllm/_version.py", VERSION_PY.encode())

    def dir(self, name: str) -> None:
        ti = tarfile.TarInfo(name)
        ti.type, ti.mode = tarfile.DIRTYPE, 0o755
        self.members.append((ti, None))

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        ti = tarfile.TarInfo(name)
        ti.size, ti.mode = len(data), mode
        self.members.append((ti, data))

    def link(self, name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> None:
        ti = tarfile.TarInfo(name)
        ti.type, ti.linkname = kind, target
        self.members.append((ti, None))

    def special(self, name: str, kind: bytes) -> None:
        ti = tarfile.TarInfo(name)
        ti.type = kind
        self.members.append((ti, None))

    def replace(self, name: str, data: bytes) -> None:
        self.members = [(t, d) for t, d in self.members if t.name != name]
        self.file(name, data)

    def bytes(self) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
            for ti, data in self.members:
                tar.addfile(ti, io.BytesIO(data) if data is not None else None)
        return buf.getvalue()


def sdist_lock(tmp_path: Path, data: bytes, commit: str = COMMIT) -> tuple[Path, Path, Path]:
    """(lock, cache, sdist file): a pin whose sdist ``data`` is already in a fresh cache."""
    sha = hashlib.sha256(data).hexdigest()
    d = tmp_path / "lock"
    d.mkdir(exist_ok=True)
    pin = sdist_pin("s", commit, sha)
    lock = write_lock(d / "l.toml", {"s": pin}, {"main": []})
    cache = tmp_path / "cache"
    (cache / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (cache / "blobs" / "sha256" / sha).write_bytes(data)
    sdist = tmp_path / f"{TOP}.tar.gz"
    sdist.write_bytes(data)
    return lock, cache, sdist


def fetch(cli, lock: Path, cache: Path, *extra: str | Path):
    return cli("fetch", "--lock", lock, "--cache-dir", cache, *extra)


def assert_nothing_materialized(cache: Path) -> None:
    assert not list((cache / "trees").glob("*.git")), list((cache / "trees").iterdir())
    assert list((cache / "tmp").iterdir()) == []


def test_sdist_with_its_own_git_dir_is_refused(tmp_path, cli):
    script, marker = marker_script(tmp_path, "fsmonitor")
    hooks, hook_marker = hooks_dir(tmp_path, "sdisthook")
    s = Sdist()
    s.dir(f"{TOP}/.git")
    s.file(f"{TOP}/.git/config", (
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n"
        f'\tfsmonitor = "{script}"\n\thooksPath = {hooks}\n').encode())
    s.file(f"{TOP}/.git/HEAD", b"ref: refs/heads/main\n")
    lock, cache, _ = sdist_lock(tmp_path, s.bytes())
    res = fetch(cli, lock, cache)
    assert res.rc == EXIT_FETCH, res
    assert f"{TOP}/.git" in res.err and "pin s" in res.err
    assert not marker.exists() and not hook_marker.exists()
    assert_nothing_materialized(cache)


def test_sdist_with_nested_git_dir_is_refused(tmp_path, cli):
    s = Sdist()
    s.file(f"{TOP}/vllm/sub/.GIT/config", b"[core]\n\tbare = false\n")
    lock, cache, _ = sdist_lock(tmp_path, s.bytes())
    res = fetch(cli, lock, cache)
    assert res.rc == EXIT_FETCH and f"{TOP}/vllm/sub/.GIT/config" in res.err


def test_sdist_hardlink_member_extracts(tmp_path, cli):
    s = Sdist()
    s.file(f"{TOP}/vllm/a.py", b"A = 1\n", mode=0o755)
    s.link(f"{TOP}/vllm/b.py", f"{TOP}/vllm/a.py", kind=tarfile.LNKTYPE)
    s.link(f"{TOP}/vllm/c.py", "a.py")
    lock, cache, _ = sdist_lock(tmp_path, s.bytes())
    res = fetch(cli, lock, cache, "--format", "json")
    assert res.rc == EXIT_OK, res.err
    repo = Path(json.loads(res.out)["pins"]["s"]["repo"])
    assert sh(repo, "show", "HEAD:vllm/b.py") == "A = 1"
    assert sh(repo, "ls-tree", "HEAD", "vllm/b.py").startswith("100755 blob")
    assert sh(repo, "ls-tree", "HEAD", "vllm/c.py").startswith("120000 blob")


def test_version_commit_in_a_comment_does_not_count(tmp_path, cli):
    s = Sdist()
    s.replace(f"{TOP}/vllm/_version.py", (
        f"# commit_id = 'g{COMMIT[:9]}' was the old one\n"
        "__version__ = version = '0.0.1'\n__commit_id__ = commit_id = 'gfedcba987'\n").encode())
    lock, cache, _ = sdist_lock(tmp_path, s.bytes())
    res = fetch(cli, lock, cache)
    assert res.rc == EXIT_FETCH and "fedcba987" in res.err and "pin s" in res.err


def _outside(tmp_path: Path) -> Path:
    d = tmp_path / "outside"
    d.mkdir(exist_ok=True)
    return d


@pytest.mark.parametrize("case", [
    "dotdot", "absolute", "symlink-abs", "symlink-up", "symlink-then-write", "symlink-chain",
    "hardlink-outside", "hardlink-abs", "chardev", "fifo", "truncated", "not-gzip", "not-utf8",
    "version-not-python",
])
def test_hostile_sdist_members(tmp_path, cli, case):
    outside = _outside(tmp_path)
    s = Sdist()
    data: bytes | None = None
    rel = os.path.relpath(outside, tmp_path / "cache" / "tmp" / "x" / "files" / "vllm")
    needle = {
        "dotdot": f"{TOP}/../../../../outside/pwned",
        "absolute": str(outside / "pwned"),
        "symlink-abs": f"{TOP}/vllm/evil",
        "symlink-up": f"{TOP}/vllm/evil",
        "symlink-then-write": f"{TOP}/vllm/evil",
        "symlink-chain": f"{TOP}/vllm/esc",
        "hardlink-outside": f"{TOP}/vllm/evil",
        "hardlink-abs": f"{TOP}/vllm/evil",
        "chardev": f"{TOP}/vllm/dev",
        "fifo": f"{TOP}/vllm/fifo",
        "truncated": "cannot read the sdist",
        "not-gzip": "cannot read the sdist",
        "not-utf8": "vllm/_version.py",
        "version-not-python": "vllm/_version.py",
    }[case]
    if case in ("dotdot", "absolute"):
        s.file(needle, b"pwned\n")
    elif case == "symlink-abs":
        s.link(needle, str(outside))
    elif case == "symlink-up":
        s.link(needle, rel)
    elif case == "symlink-then-write":
        s.link(needle, rel)
        s.file(f"{TOP}/vllm/evil/pwned", b"pwned\n")
    elif case == "symlink-chain":
        s.link(f"{TOP}/vllm/up", ".")
        s.link(needle, "up/../../../outside")
    elif case == "hardlink-outside":
        s.link(needle, f"{TOP}/../../outside/secret", kind=tarfile.LNKTYPE)
        (outside / "secret").write_text("secret\n")
    elif case == "hardlink-abs":
        (outside / "secret").write_text("secret\n")
        s.link(needle, str(outside / "secret"), kind=tarfile.LNKTYPE)
    elif case == "chardev":
        s.special(needle, tarfile.CHRTYPE)
    elif case == "fifo":
        s.special(needle, tarfile.FIFOTYPE)
    elif case == "truncated":
        data = s.bytes()[:-200]
    elif case == "not-gzip":
        data = b"PK\x03\x04 this is a zip, not a tar.gz" * 10
    elif case == "not-utf8":
        s.replace(f"{TOP}/vllm/_version.py", b"commit_id = 'g" + COMMIT[:9].encode() + b"'\n# \xff\xfe\n")
    elif case == "version-not-python":
        s.replace(f"{TOP}/vllm/_version.py", b"commit_id = 'g" + COMMIT[:9].encode() + b"\n")
    before = snapshot_dir(outside)
    lock, cache, _ = sdist_lock(tmp_path, data if data is not None else s.bytes())
    res = fetch(cli, lock, cache)
    assert res.rc == EXIT_FETCH, res
    assert needle in res.err and "pin s" in res.err
    assert snapshot_dir(outside) == before
    assert not (tmp_path / "pwned").exists()
    assert_nothing_materialized(cache)


# --- fetch --sdist ----------------------------------------------------------


def test_fetch_sdist_seed_leaves_no_temp_dir_and_names_the_pin(tmp_path, cli):
    data = Sdist().bytes()
    lock, cache, sdist = sdist_lock(tmp_path, data)
    (cache / "blobs" / "sha256" / hashlib.sha256(data).hexdigest()).unlink()
    assert fetch(cli, lock, cache).rc == EXIT_FETCH  # not in the cache, no url: proves the seed matters
    listing = sorted(os.listdir(cache / "tmp"))
    res = fetch(cli, lock, cache, "--sdist", sdist, "--format", "json")
    assert res.rc == EXIT_OK, res.err
    out = json.loads(res.out)
    assert out["seeded"] == {str(sdist): ["s"]}
    assert any("pin s" in n and str(sdist) in n for n in out["notes"])
    assert sorted(os.listdir(cache / "tmp")) == listing
    again = fetch(cli, lock, cache, "--sdist", sdist)  # text output names the pin too
    assert again.rc == EXIT_OK and "the sdist of pin s" in again.out
    assert sorted(os.listdir(cache / "tmp")) == listing


# --- source URLs ------------------------------------------------------------


@pytest.mark.parametrize("url", [
    "--upload-pack=touch {marker};:",
    "-uploadpack",
    "ext::sh -c touch% {marker}",
    "fd::3",
    "foo::bar",
    "ssh://-oProxyCommand=touch%20{marker}/repo",
    "-oProxyCommand=touch {marker}:repo",
    "git://example.org/vllm.git",
])
def test_hostile_git_url_is_refused(tmp_path, upstream, cli, url):
    marker = tmp_path / "url.RAN"
    url = url.format(marker=marker)
    d = tmp_path / "l"
    d.mkdir()
    pin = git_pin("p", upstream).replace(f'url = "{upstream.path}"', f"url = {json.dumps(url)}")
    lock = write_lock(d / "l.toml", {"p": pin}, {"main": []})
    res = fetch(cli, lock, tmp_path / "c")
    assert res.rc == EXIT_INPUT, res
    assert 'pins."p"' in res.err and "refused" in res.err
    assert not marker.exists()


@pytest.mark.parametrize("url", [
    "https://github.com/vllm-project/vllm.git", "ssh://git@example.org:22/vllm.git",
    "git@github.com:vllm-project/vllm.git", "file:///srv/vllm.git", "/srv/vllm", "../vllm",
    "vllm-src",
])
def test_ordinary_git_urls_are_accepted(tmp_path, url):
    from dsv4patch.pins.lock import load

    lock = write_lock(tmp_path / "l.toml", {"p": pin_table("p", COMMIT, {"kind": "git", "url": url})})
    assert load(lock).pin("p").source.url


# --- the caller's environment -------------------------------------------------


def whitespace_conflict_lock(tmp_path: Path, upstream) -> Path:
    """A lock whose one patch really conflicts, but only by whitespace in a context line."""
    d = tmp_path / "lock"
    d.mkdir()
    worker = MINI_FILES["vllm/worker.py"]
    patch = upstream.patch(d / "0001-ws.patch", "ws",
                           {"vllm/worker.py": worker.replace("return z", "return z + 1")}, "ws")
    text = patch.read_text()
    assert "\n     y = x + 1\n" in text
    patch.write_text(text.replace("\n     y = x + 1\n", "\n     y = x  +  1\n"))
    return write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": ["0001-ws.patch"]})


def check_status(cli, lock: Path, cache: Path) -> tuple[int, str]:
    res = cli("check", "--lock", lock, "--cache-dir", cache, "--format", "json")
    rep = json.loads(res.out)
    return res.rc, rep["pins"]["p"]["patches"]["0001-ws.patch"]["status"]


def test_git_config_from_the_environment_does_not_reach_git(tmp_path, upstream, cli, monkeypatch):
    lock = whitespace_conflict_lock(tmp_path, upstream)
    assert check_status(cli, lock, tmp_path / "c0") == (EXIT_UNEXPECTED, "conflict")
    hooks, hook_marker = hooks_dir(tmp_path, "envhook")
    fsmon, fs_marker = marker_script(tmp_path, "envfsmonitor")
    monkeypatch.setenv("GIT_CONFIG_COUNT", "2")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "apply.ignoreWhitespace")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "change")
    monkeypatch.setenv("GIT_CONFIG_KEY_1", "core.hooksPath")
    monkeypatch.setenv("GIT_CONFIG_VALUE_1", str(hooks))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'core.fsmonitor'='{fsmon}'")
    assert check_status(cli, lock, tmp_path / "c1") == (EXIT_UNEXPECTED, "conflict")
    res = cli("apply", "--lock", lock, "--pin", "p", "--tree", tmp_path / "t", "--no-build",
              "--cache-dir", tmp_path / "c1")
    assert res.rc == EXIT_UNEXPECTED, res
    assert not hook_marker.exists() and not fs_marker.exists()


def test_git_dir_from_the_environment_is_not_used(tmp_path, upstream, cli, monkeypatch):
    lock = whitespace_conflict_lock(tmp_path, upstream)
    other = tmp_path / "unrelated"
    other.mkdir()
    sh(other, "init", "-q")
    (other / "f").write_text("f\n")
    sh(other, "add", "f")
    sh(other, "commit", "-qm", "unrelated")
    sh(other, "branch", "vllm-p")
    before = snapshot_dir(other / ".git")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    monkeypatch.setenv("GIT_INDEX_FILE", str(other / ".git" / "index"))
    monkeypatch.setenv("GIT_OBJECT_DIRECTORY", str(other / ".git" / "objects"))
    tree = tmp_path / "t"
    res = cli("apply", "--lock", lock, "--pin", "p", "--tree", tree, "--no-build",
              "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_UNEXPECTED, res  # the real conflict, found in the new tree
    assert (tree / ".git").is_dir() and (tree / "vllm/worker.py").read_text() == MINI_FILES["vllm/worker.py"]
    assert snapshot_dir(other / ".git") == before


def test_target_tree_config_does_not_change_results(tmp_path, upstream, cli):
    lock = whitespace_conflict_lock(tmp_path, upstream)
    cache = tmp_path / "c"
    tree = tmp_path / "t"
    args = ("apply", "--lock", lock, "--pin", "p", "--tree", tree, "--no-build", "--cache-dir", cache)
    assert cli(*args).rc == EXIT_UNEXPECTED  # creates the tree at the base commit, conflict
    hooks, hook_marker = hooks_dir(tmp_path, "treehook")
    fsmon, fs_marker = marker_script(tmp_path, "treefsmonitor")
    with open(tree / ".git" / "config", "a") as fh:
        fh.write(f"[apply]\n\tignoreWhitespace = change\n\twhitespace = fix\n"
                 f"[core]\n\tautocrlf = true\n\thooksPath = {hooks}\n\tfsmonitor = {fsmon}\n"
                 "\tsparseCheckout = true\n")
    for name in ("post-checkout", "reference-transaction"):
        (tree / ".git" / "hooks" / name).symlink_to(fsmon)
    before = snapshot_dir(tree / ".git")
    assert check_status(cli, lock, cache) == (EXIT_UNEXPECTED, "conflict")
    res = cli(*args, "--format", "json")
    assert res.rc == EXIT_UNEXPECTED, res
    assert json.loads(res.out)["pins"]["p"]["patches"]["0001-ws.patch"]["status"] == "conflict"
    assert not hook_marker.exists() and not fs_marker.exists()
    assert snapshot_dir(tree / ".git") == before


# --- --tree inside another repository --------------------------------------------


@pytest.mark.parametrize("rel", ["build/vllm", "vllm-tree"])
def test_relative_tree_inside_a_clone_leaves_the_enclosing_repo_alone(tmp_path, upstream, cli, monkeypatch, rel):
    d = tmp_path / "lock"
    d.mkdir()
    upstream.patch(d / "0001-a.patch", "a", {"vllm/envs.py": MINI_FILES["vllm/envs.py"] + "A = 1\n"}, "a")
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": ["0001-a.patch"]})
    clone = tmp_path / "clone"
    sh(tmp_path, "clone", "-q", str(upstream.path), str(clone))
    sh(clone, "fetch", "-q", "origin")
    assert sh(clone, "branch", "-r")  # remote-tracking branches exist
    before = snapshot_dir(clone / ".git")
    monkeypatch.chdir(clone)
    res = cli("apply", "--lock", lock, "--pin", "p", "--tree", rel, "--no-build",
              "--cache-dir", tmp_path / "c", "--format", "json")
    assert res.rc == EXIT_OK, res.err
    tree = clone / rel
    assert (tree / ".git").is_dir() and (tree / "vllm/envs.py").read_text().endswith("A = 1\n")
    assert sh(tree, "remote") == ""
    assert snapshot_dir(clone / ".git") == before
    assert sh(clone, "remote") == "origin" and sh(clone, "branch", "-r")
    assert sorted(p.name for p in tree.parent.iterdir() if "dsv4patch" in p.name) == []


# --- patches ------------------------------------------------------------------


def raw_patch_lock(tmp_path: Path, upstream, body: str) -> Path:
    d = tmp_path / "l"
    d.mkdir()
    (d / "0001-evil.patch").write_text(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: x <x@x>\nDate: Mon, 1 Jan 2001 00:00:00 +0000\nSubject: [PATCH] evil\n\n---\n" + body)
    return write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": ["0001-evil.patch"]})


def new_file(path: str, content: str, mode: str = "100644", quoted: bool = False) -> str:
    a, b = (f'"a/{path}"', f'"b/{path}"') if quoted else (f"a/{path}", f"b/{path}")
    lines = content.split("\n")
    return (f"diff --git {a} {b}\nnew file mode {mode}\nindex 0000000..1111111\n--- /dev/null\n"
            f"+++ {b}\n@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{x}\n" for x in lines)
            + ("\\ No newline at end of file\n" if mode == "120000" else ""))


@pytest.mark.parametrize("case, body, needle", [
    ("symlink-abs", new_file("vllm/evil", "/etc", mode="120000"), "vllm/evil"),
    ("symlink-up", new_file("vllm/evil", "../../..", mode="120000"), "vllm/evil"),
    # read lexically s2 is the root; on disk s1/.. is the parent of what s1 points at: the tree's parent
    ("symlink-down-up", new_file("dsv4probe/s1", ".", mode="120000")
     + new_file("dsv4probe/s2", "s1/../..", mode="120000"), "dsv4probe/s2"),
    ("symlink-down-up-inside", new_file("vllm/evil", "../vllm/../vllm", mode="120000"), "vllm/evil"),
    # a link's target changed (no 'new mode' line, the mode is on the index line) is checked as a new one
    ("symlink-retarget", new_file("vllm/l", "worker.py", mode="120000")
     + "diff --git a/vllm/l b/vllm/l\nindex 1111111..2222222 120000\n--- a/vllm/l\n+++ b/vllm/l\n"
       "@@ -1 +1 @@\n-worker.py\n\\ No newline at end of file\n+../../..\n\\ No newline at end of file\n",
     "vllm/l"),
    ("attr-ident", new_file(".gitattributes", "*.py ident"), ".gitattributes"),
    ("attr-filter", new_file("vllm/.gitattributes", "*.py filter=evil"), "vllm/.gitattributes"),
    ("attr-eol", new_file(".gitattributes", "# hi\n* eol=crlf"), ".gitattributes"),
    ("attr-wte", new_file(".gitattributes", "*.py working-tree-encoding=UTF-16"), ".gitattributes"),
    # a .gitattributes whose lines the patch does not show: renamed or copied from a file an earlier
    # section (or patch) wrote, written by a binary patch; and one spelt in another case
    ("attr-rename", new_file("notes-probe.txt", "*.py ident eol=crlf")
     + "diff --git a/notes-probe.txt b/vllm/.gitattributes\nsimilarity index 100%\n"
       "rename from notes-probe.txt\nrename to vllm/.gitattributes\n", "vllm/.gitattributes"),
    ("attr-rename-edit", "diff --git a/vllm/envs.py b/vllm/.gitattributes\nsimilarity index 97%\n"
                         "rename from vllm/envs.py\nrename to vllm/.gitattributes\n--- a/vllm/envs.py\n"
                         "+++ b/vllm/.gitattributes\n@@ -1,2 +1,2 @@\n-VAR_0 = 0\n+*.txt binary\n VAR_1 = 1\n",
     "vllm/.gitattributes"),
    ("attr-copy", "diff --git a/vllm/envs.py b/.gitattributes\nsimilarity index 100%\n"
                  "copy from vllm/envs.py\ncopy to .gitattributes\n", ".gitattributes"),
    ("attr-binary", "diff --git a/vllm/.gitattributes b/vllm/.gitattributes\nnew file mode 100644\n"
                    "index 0000000000000000000000000000000000000000..575a87bbcec16e56916fa2e5fb1b3c73bc3fd617\n"
                    "GIT binary patch\nliteral 21\nccmdPWE2vb+Oi9fvQAo|tu}v<@N#kMw08GyY!~g&Q\n\n"
                    "literal 0\nHcmV?d00001\n\n", "vllm/.gitattributes"),
    ("attr-case", new_file("vllm/.GitAttributes", "*.py ident"), "vllm/.GitAttributes"),
    ("quoted-dotdot", new_file("\\056\\056/evil", "pwned", quoted=True), "../evil"),
    ("quoted-git", new_file(".\\147it/hooks/post-checkout", "#!/bin/sh", quoted=True), ".git/hooks"),
    ("rename-to", "diff --git a/vllm/envs.py b/vllm/envs.py\nsimilarity index 100%\n"
                  "rename from vllm/envs.py\nrename to ../envs.py\n", "../envs.py"),
    ("copy-to", "diff --git a/vllm/envs.py b/vllm/envs.py\nsimilarity index 100%\n"
                "copy from vllm/envs.py\ncopy to /tmp/envs.py\n", "/tmp/envs.py"),
])
def test_hostile_patch_is_refused(tmp_path, upstream, cli, case, body, needle):
    lock = raw_patch_lock(tmp_path, upstream, body)
    res = cli("check", "--lock", lock, "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_INPUT, res
    assert "0001-evil.patch" in res.err and needle in res.err
    tree = tmp_path / "t"
    res = cli("apply", "--lock", lock, "--pin", "p", "--tree", tree, "--no-build",
              "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_INPUT and not tree.exists()


def test_gitattributes_renamed_from_an_earlier_patchs_file_is_refused(tmp_path, upstream, cli):
    """Patch A writes attribute lines into a plain file, patch B renames it to .gitattributes (no
    added lines): refused when the series is loaded, not left for the guard to refuse the tree."""
    d = tmp_path / "l"
    d.mkdir()
    head = ("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
            "From: x <x@x>\nDate: Mon, 1 Jan 2001 00:00:00 +0000\nSubject: [PATCH] {}\n\n---\n")
    (d / "0001-notes.patch").write_text(head.format("notes") + new_file("notes-probe.txt", "*.py ident eol=crlf"))
    (d / "0002-move.patch").write_text(head.format("move") + (
        "diff --git a/notes-probe.txt b/vllm/.gitattributes\nsimilarity index 100%\n"
        "rename from notes-probe.txt\nrename to vllm/.gitattributes\n"))
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": ["0001-notes.patch", "0002-move.patch"]})
    for args in (("check",), ("lock", "--update", "--pin", "p"),
                 ("apply", "--pin", "p", "--tree", tmp_path / "t", "--no-build")):
        res = cli(*args, "--lock", lock, "--cache-dir", tmp_path / "c")
        assert res.rc == EXIT_INPUT, (args, res)
        assert "0002-move.patch" in res.err and "vllm/.gitattributes is renamed from 'notes-probe.txt'" in res.err
    assert not (tmp_path / "t").exists()


def test_symlink_inside_the_tree_and_harmless_attributes_are_fine(tmp_path, upstream, cli):
    body = (new_file("vllm/alias.py", "worker.py", mode="120000")
            + new_file("vllm/sub/up.py", "./../worker.py", mode="120000")
            + new_file(".gitattributes", "*.bin binary\n*.py -text diff=python"))
    lock = raw_patch_lock(tmp_path, upstream, body)
    res = cli("check", "--lock", lock, "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_OK, res.err


@pytest.mark.parametrize("setting", ["filter", "ident"])
def test_target_tree_filters_and_rewriting_attributes_are_refused(tmp_path, upstream, cli, setting):
    """A filter driver or an info/attributes line would make disk differ from the tree id (or run code)."""
    conflict = whitespace_conflict_lock(tmp_path, upstream)
    cache = tmp_path / "c"
    tree = tmp_path / "t"
    assert cli("apply", "--lock", conflict, "--pin", "p", "--tree", tree, "--no-build",
               "--cache-dir", cache).rc == EXIT_UNEXPECTED  # the tree, at the pin's base commit
    d = tmp_path / "clean"
    d.mkdir()
    upstream.patch(d / "0001-a.patch", "a", {"vllm/envs.py": MINI_FILES["vllm/envs.py"] + "A = '$Id$'\n"}, "a")
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": ["0001-a.patch"]})
    smudge, marker = marker_script(tmp_path, "smudge")
    (tree / ".git" / "info").mkdir(exist_ok=True)
    if setting == "filter":
        with open(tree / ".git" / "config", "a") as fh:
            fh.write(f"[filter \"evil\"]\n\tsmudge = {smudge}\n\tclean = {smudge}\n")
        (tree / ".git" / "info" / "attributes").write_text("* filter=evil\n")
    else:
        (tree / ".git" / "info" / "attributes").write_text("*.py ident\n")
    before = snapshot_dir(tree)
    res = cli("apply", "--lock", lock, "--pin", "p", "--tree", tree, "--no-build", "--cache-dir", cache)
    assert res.rc == EXIT_TREE, res
    assert str(tree) in res.err and ("filter.evil" in res.err or "ident" in res.err)
    assert not marker.exists()
    assert snapshot_dir(tree) == before


def test_quoted_names_are_read_as_git_reads_them(tmp_path, upstream, cli):
    """A symlink with a non-ASCII name, written through by a C-quoted path: refused, not missed."""
    os.symlink("/tmp", upstream.path / "l\u00efnk")
    sh(upstream.path, "add", "-A")
    sh(upstream.path, "commit", "-qm", "link")
    upstream.commit = sh(upstream.path, "rev-parse", "HEAD")
    lock = raw_patch_lock(tmp_path, upstream, new_file("l\\303\\257nk/evil", "pwned", quoted=True))
    res = cli("check", "--lock", lock, "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_INPUT, res
    assert "l\u00efnk" in res.err and "symlink" in res.err
    # An ordinary non-ASCII file name is fine.
    ok = tmp_path / "ok"
    ok.mkdir()
    good = raw_patch_lock(ok, upstream, new_file("vllm/\\303\\244.py", "A = 1", quoted=True))
    res = cli("check", "--lock", good, "--cache-dir", tmp_path / "c", "--format", "json")
    assert res.rc == EXIT_OK, res.err


# --- issue 29: a tree copied with cp -a (a CI cache restore, rsync, Docker COPY) ---------------------


def test_apply_on_a_tree_copied_with_cp_a_refreshes_stale_stat_data(shared_cache, tmp_path, cli):
    """The real 0.27.1 pin: a dsv4patch tree at the pin's base, copied with `cp -a`, then applied.

    The copy's files have new inodes and ctimes, so the index's stat data no longer matches
    them although their content does: git read-tree -m -u refused ("not uptodate", exit 70).
    apply refreshes the stat data (only that) and moves the tree; real changes stay refused.
    """
    import subprocess

    from conftest import LOCK
    from dsv4patch.pins.lock import load

    tree = tmp_path / "vllm-src"
    args = ("apply", "--lock", LOCK, "--pin", "0.27.1", "--cache-dir", shared_cache, "--no-build")
    assert cli(*args, "--tree", tree).rc == 0
    base = sh(tree, "rev-list", "--max-parents=0", "HEAD")
    sh(tree, "reset", "-q", "--hard", base)
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(tree), str(copy)], check=True)
    res = cli(*args, "--tree", copy)
    assert res.rc == 0, (res.rc, res.err)
    assert sh(copy, "rev-parse", "HEAD^{tree}") == load(LOCK).pin("0.27.1").patched_tree
    assert sh(copy, "status", "--porcelain") == ""
    shutil.rmtree(copy)  # disk: a 150 MB tree, done with
    # A copy whose content differs is still dirty: refused, untouched.
    dirty = tmp_path / "dirty"
    subprocess.run(["cp", "-a", str(tree), str(dirty)], check=True)
    (dirty / "vllm" / "envs.py").write_text("# changed\n")
    res = cli(*args, "--tree", dirty)
    assert res.rc == EXIT_TREE and "vllm/envs.py" in res.err, (res.rc, res.err)
    assert sh(dirty, "rev-parse", "HEAD") == base


def test_random_kills_while_applying_copied_trees(tmp_path, cli, wide_lock):
    """Seeded random SIGKILLs of apply on fresh `cp -a` copies of a base tree (the stat refresh
    included): one or two plain re-runs always reach the locked tree, clean, with nothing left over."""
    import random
    import subprocess
    import time

    from test_recovery import apply_args, killpg, leftovers, spawn, state

    cache = tmp_path / "c"
    tree = tmp_path / "orig"
    ref = cli(*apply_args(wide_lock, tree, cache), "--format", "json")
    assert ref.rc == 0, ref.err
    final = json.loads(ref.out)["head"]
    sh(tree, "reset", "-q", "--hard", sh(tree, "rev-list", "--max-parents=0", "HEAD"))
    timing_copy = tmp_path / "timing"
    subprocess.run(["cp", "-a", str(tree), str(timing_copy)], check=True)
    t0 = time.monotonic()
    timing = spawn(apply_args(wide_lock, timing_copy, cache))
    timing.wait()
    duration = time.monotonic() - t0
    assert timing.returncode == 0 and state(timing_copy) == (final, "")
    rng = random.Random(29)
    for i in range(10):
        copy = tmp_path / f"copy{i}"
        subprocess.run(["cp", "-a", str(tree), str(copy)], check=True)
        delay = rng.uniform(duration * 0.2, duration * 1.05)
        proc = spawn(apply_args(wide_lock, copy, cache))
        time.sleep(delay)
        killpg(proc)
        for _attempt in (1, 2):
            res = cli(*apply_args(wide_lock, copy, cache))
            if res.rc == 0:
                break
        assert res.rc == 0, (i, delay, res.rc, res.err)
        assert state(copy) == (final, ""), (i, delay)
        assert leftovers(copy) == [], (i, delay)
        subprocess.run(["rm", "-rf", str(copy)], check=True)
