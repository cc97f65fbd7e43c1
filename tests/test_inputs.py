"""Bad input: each case gives an error that names the file/pin/patch and an exit code."""

from __future__ import annotations

import http.server
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import cli_bounded, git_pin, local_pin, sdist_pin, sh, write_lock
from dsv4patch.errors import EXIT_BUSY, EXIT_FETCH, EXIT_INPUT
from dsv4patch.store import file_mutex


def lock_text(tmp_path: Path, body: str) -> Path:
    (tmp_path / "s.series").write_text("x.patch\n")
    p = tmp_path / "l.toml"
    p.write_text('schema = 1\n[series.s]\npath = "s.series"\n' + body)
    return p


@pytest.mark.parametrize(
    "body, needle",
    [
        ('[pins."a"\nvllm_version = 1', "malformed TOML"),
        ('[pins."a"]\nvllm_version = "1"\ncommit = "' + "a" * 40 + '"\nsurprise = 1\n'
         '[pins."a".source]\nkind = "git"\nurl = "/x"\n', "unknown key(s) surprise in [pins.\"a\"]"),
        ('[pins."a"]\nvllm_version = "1"\n[pins."a".source]\nkind = "git"\nurl = "/x"\n',
         "missing key 'commit' in [pins.\"a\"]"),
        ('[pins."a"]\nvllm_version = "1"\ncommit = "6e448d0ea"\n[pins."a".source]\nkind = "git"\nurl = "/x"\n',
         "is not a full 40-hex commit id"),
        ('[pins."a"]\nvllm_version = "1"\ncommit = "' + "a" * 40 + '"\n[pins."a".source]\nkind = "ftp"\n',
         "kind = 'ftp'"),
        ('[pins."a"]\nvllm_version = "1"\ncommit = "' + "a" * 40 + '"\nseries = ["nope"]\n'
         '[pins."a".source]\nkind = "git"\nurl = "/x"\n', "names 'nope'"),
        ('[pins."a"]\nvllm_version = "1"\ncommit = "' + "a" * 40 + '"\n[pins."a".source]\nkind = "git"\nurl = "/x"\n'
         '[pins."a".build]\nmax_jobs = 0\n', "[pins.\"a\"].build.max_jobs must be between 1 and 256, got 0"),
        ('[pins."a"]\nvllm_version = "1"\ncommit = "' + "a" * 40 + '"\n[pins."a".source]\nkind = "git"\nurl = "/x"\n'
         '[pins."a".build]\nnvcc_threads = 100000\n', "build.nvcc_threads must be between 1 and 64, got 100000"),
        *(('[pins."a"]\nvllm_version = "1"\ncommit = "' + "a" * 40 + '"\n[pins."a".source]\nkind = "pypi-sdist"\n'
           'name = "vllm"\nversion = "1"\nsha256 = "' + "ab" * 32 + f'"\nsize = {size}\n',
           f'[pins."a".source].size must be a size in bytes between 1 and {1 << 40}, got {size}')
          for size in ("-1", "0", "99999999999999999")),
    ],
    ids=["toml", "unknown-key", "missing-key", "short-commit", "bad-kind", "unknown-series", "zero-jobs",
         "thread-bomb", "size-negative", "size-zero", "size-absurd"],
)
def test_bad_lock(tmp_path, cli, body, needle):
    lock = lock_text(tmp_path, body)
    res = cli("check", "--lock", lock, "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_INPUT
    assert needle in res.err and str(lock) in res.err


def test_commit_abbrev_only_for_sdist_pins(tmp_path, cli):
    lock = lock_text(tmp_path, '[pins."a"]\nvllm_version = "1"\ncommit_abbrev = "4ba787ec9"\n'
                     '[pins."a".source]\nkind = "git"\nurl = "/x"\n')
    res = cli("check", "--lock", lock, "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_INPUT and "missing key 'commit'" in res.err
    from dsv4patch.pins.lock import load

    ok = lock_text(tmp_path, '[pins."a"]\nvllm_version = "1"\ncommit_abbrev = "4ba787ec9"\n'
                   '[pins."a".source]\nkind = "pypi-sdist"\nname = "vllm"\nversion = "1"\n'
                   f'sha256 = "{"0" * 64}"\n')
    assert load(ok).pin("a").commit == "4ba787ec9"


@pytest.mark.parametrize(
    "body, needle",
    [
        ('[pins."a"]\nvllm_version = "1"\ncommit_abbrev = "xyz"\n[pins."a".source]\nkind = "pypi-sdist"\n'
         'name = "vllm"\nversion = "1"\nsha256 = "' + "0" * 64 + '"\n', "is not a 7..39-hex commit prefix"),
        ('[pins."a"]\nvllm_version = "1"\ncommit = "' + "a" * 40 + '"\n[pins."a".source]\nkind = "pypi-sdist"\n'
         'name = "vllm"\nversion = "1"\nsha256 = "abc"\n', "is not a 64-hex sha256"),
    ],
    ids=["bad-abbrev", "bad-sha256"],
)
def test_bad_hex_fields(tmp_path, cli, body, needle):
    lock = lock_text(tmp_path, body)
    res = cli("check", "--lock", lock, "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_INPUT
    assert needle in res.err


def test_malformed_toml_reports_line_and_column(tmp_path, cli):
    lock = lock_text(tmp_path, '[pins."a"]\nvllm_version = = "1"\n')
    res = cli("check", "--lock", lock, "--cache-dir", tmp_path / "c")
    assert "line 5, column" in res.err


@pytest.mark.parametrize("case, needle", [
    ("fifo", "is a FIFO, not a regular file"),
    ("device", "is a device, not a regular file"),
    ("sparse", "is larger than 16777216 bytes"),
    ("deep-arrays", "nested too deep"),
    ("deep-tables", "nested too deep"),
])
def test_a_lock_that_would_hang_or_exhaust_memory_is_refused(tmp_path, case, needle):
    """A lock is read through safeio: a FIFO never blocks, /dev/zero and a 17 MiB sparse file are not
    read past the lock bound (16 MiB), and 100,000 nested arrays are a lock error, not a RecursionError:
    exit 3 naming the file (these ran for ever, ran out of memory, or exited 70)."""
    lock = tmp_path / "l.toml"
    if case == "fifo":
        os.mkfifo(lock)
    elif case == "device":
        lock = Path("/dev/zero")
    elif case == "sparse":
        lock.write_text("schema = 1\n")
        os.truncate(lock, 17 << 20)
    elif case == "deep-arrays":
        lock.write_text("schema = 1\na = " + "[" * 100000 + "]" * 100000 + "\n")
    else:
        lock.write_text("schema = 1\na = " + "{x=" * 3000 + "1" + "}" * 3000 + "\n")
    res = cli_bounded("check", "--lock", lock, "--pin", "0.27.1", "--cache-dir", tmp_path / "c", timeout=20)
    assert res.rc == EXIT_INPUT and needle in res.err and f"{lock}: " in res.err, (res.rc, res.err)
    assert "internal error" not in res.err


def test_a_lock_named_through_a_link_is_read_where_the_link_leads(tmp_path, cli):
    """The lock the user names may be a link (followed, as any file named on the command line); its
    relative paths are the real lock file's."""
    lock = lock_text(tmp_path, '[pins."a"]\nvllm_version = "1"\ncommit = "' + "a" * 40 + '"\n'
                     '[pins."a".source]\nkind = "git"\nurl = "/x"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "link.toml").symlink_to(lock)
    from dsv4patch.pins.lock import load

    assert load(elsewhere / "link.toml").series["s"].path == tmp_path / "s.series"


@pytest.mark.parametrize("kind", ["missing", "empty", "malformed", "no-hunks"])
def test_bad_patch_file(tmp_path, upstream, cli, kind):
    d = tmp_path / "l"
    d.mkdir()
    patch = d / "0001-x.patch"
    if kind == "empty":
        patch.write_text("\n")
    elif kind == "malformed":
        patch.write_text("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-a\n+b\n")
    elif kind == "no-hunks":
        patch.write_text("From 123\nSubject: hi\n\nno diff at all\n")
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": ["0001-x.patch"]})
    res = cli("check", "--lock", lock, "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_INPUT, res
    assert "0001-x.patch" in res.err


@pytest.mark.parametrize("case, needle", [
    ("fifo", "is a FIFO, not a regular file"),
    ("sparse", "is larger than 16777216 bytes"),
    ("fifo-series", "is a FIFO, not a regular file"),
])
def test_a_patch_or_series_file_that_would_hang_or_exhaust_memory_is_refused(tmp_path, upstream, case, needle):
    """Patch and series files are read through safeio (seriesfile.read_patch_file, read_series_file): a FIFO
    patch never blocks, a 2 GiB sparse patch is refused at the patch bound (16 MiB) instead of taking
    4 GiB of memory, a FIFO series file never blocks: exit 3 naming the file."""
    d = tmp_path / "l"
    d.mkdir()
    patch = d / "0001-x.patch"
    if case == "fifo":
        os.mkfifo(patch)
    else:
        upstream.patch(patch, "a", {"vllm/envs.py": "A = 1\n"}, "a")
    if case == "sparse":
        os.truncate(patch, 2 << 30)
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": ["0001-x.patch"]})
    if case == "fifo-series":
        (d / "main.series").unlink()
        os.mkfifo(d / "main.series")
    res = cli_bounded("check", "--lock", lock, "--cache-dir", tmp_path / "c", timeout=30)
    assert res.rc == EXIT_INPUT and needle in res.err and "internal error" not in res.err, (res.rc, res.err)
    assert (f"series file {d / 'main.series'}" if case == "fifo-series" else f"patch 0001-x.patch: {patch}") in res.err


@pytest.mark.parametrize("case", ["entry-dotdot", "entry-absolute", "patch-link", "directory-link"])
def test_a_series_never_reads_a_patch_from_outside_its_directory(tmp_path, upstream, cli, case):
    """A series entry of ../../outside.patch or an absolute path, a patch file in the series' directory that
    is a link to a file elsewhere, or an entry through a linked directory: each was read and applied
    (check: ok); now exit 3 'unsafe path' naming the series file or the link, and nothing is applied."""
    d = tmp_path / "l"
    d.mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    upstream.patch(outside / "0001-x.patch", "a", {"vllm/envs.py": "A = 1\n"}, "a")
    entry = {"entry-dotdot": "../elsewhere/0001-x.patch", "entry-absolute": str(outside / "0001-x.patch"),
             "patch-link": "0001-x.patch", "directory-link": "sub/0001-x.patch"}[case]
    if case == "patch-link":
        (d / "0001-x.patch").symlink_to(outside / "0001-x.patch")
    elif case == "directory-link":
        (d / "sub").symlink_to(outside)
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": [entry]})
    res = cli("check", "--lock", lock, "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_INPUT and "unsafe path" in res.err, (res.rc, res.out, res.err)
    if case.startswith("entry"):
        assert f"series file {d / 'main.series'}: {entry!r} is an unsafe path" in res.err, res.err
    else:
        link = d / ("0001-x.patch" if case == "patch-link" else "sub")
        assert f"{link} is a symbolic link; refusing to follow it" in res.err, res.err


@pytest.mark.parametrize("key", ["series", "variant"])
def test_a_series_file_or_variant_outside_the_lock_s_project_is_an_unsafe_path(tmp_path, upstream, cli, key):
    """A lock's [series.*] path of /etc/passwd was read as a series file and its first line echoed in the
    error ('patch bash: file /etc/root:x:0:0:...'); a variant could name any file.  Both must lie in the
    lock's project (the directory holding locks/, else the lock's own): exit 3 'unsafe path', and nothing
    of the file is shown."""
    d = tmp_path / "proj" / "locks"
    d.mkdir(parents=True)
    upstream.patch(d / "0001-x.patch", "a", {"vllm/envs.py": "A = 1\n"}, "a")
    upstream.patch(tmp_path / "0001-x.patch", "v", {"vllm/envs.py": "A = 2\n"}, "outside variant")
    extra = 'variants = { "0001-x.patch" = "../../0001-x.patch" }' if key == "variant" else ""
    lock = write_lock(d / "vllm.toml", {"p": git_pin("p", upstream, extra=extra)}, {"main": ["0001-x.patch"]})
    if key == "series":
        lock.write_text(lock.read_text().replace('path = "main.series"', 'path = "/etc/passwd"'))
    res = cli("check", "--lock", lock, "--cache-dir", tmp_path / "c")
    where = "series file /etc/passwd" if key == "series" else f"patch 0001-x.patch: {tmp_path / '0001-x.patch'}"
    assert res.rc == EXIT_INPUT and f"{where} is not below {tmp_path / 'proj'}" in res.err, (res.rc, res.err)
    assert "unsafe path" in res.err and "root:" not in res.err, res.err


@pytest.mark.parametrize("field", ["series", "requirements", "variant", "local"])
def test_a_lock_path_with_a_nul_or_control_character_is_a_lock_error(tmp_path, upstream, cli, field):
    """A NUL in a lock's [series.*] path, a toolchain's requirements, a pin's variants or a local source's
    path reached the file system as ValueError: embedded null byte (exit 70); now exit 3 naming the
    field."""
    d = tmp_path / "l"
    d.mkdir()
    upstream.patch(d / "0001-x.patch", "a", {"vllm/envs.py": "A = 1\n"}, "a")
    extra = 'variants = { "0001-x.patch" = "v/0\\u0000001-x.patch" }' if field == "variant" else ""
    top = ('[toolchains."t"]\ntorch = "2.13.0"\ncuda = "13.0"\nrequirements = "torch\\u0000.txt"\n'
           if field == "requirements" else "")
    pin = (local_pin("p", "vllm\\u0000src", upstream.commit) if field == "local"
           else git_pin("p", upstream, extra=extra))
    lock = write_lock(d / "l.toml", {"p": pin}, {"main": ["0001-x.patch"]}, extra_top=top)
    if field == "series":
        lock.write_text(lock.read_text().replace('path = "main.series"', 'path = "ma\\u0000in.series"'))
    res = cli("check", "--lock", lock, "--cache-dir", tmp_path / "c")
    where = {"series": "[series.main].path", "requirements": '[toolchains."t"].requirements',
             "variant": '[pins."p"].variants.0001-x.patch', "local": '[pins."p".source].path'}[field]
    assert res.rc == EXIT_INPUT and f"{lock}: {where} = " in res.err, (res.rc, res.err)
    assert "the path contains a NUL/control character ('\\x00')" in res.err and "internal error" not in res.err


@pytest.mark.parametrize("path, needle", [
    ("/etc/evil", "absolute path"),
    ("vllm/../../evil", "'..'"),
    ("link/evil.py", "is a symlink"),
])
def test_patch_writing_outside_tree_is_refused(tmp_path, upstream, cli, path, needle):
    os.symlink("/tmp", upstream.path / "link")
    sh(upstream.path, "add", "link")
    sh(upstream.path, "commit", "-qm", "link")
    upstream.commit = sh(upstream.path, "rev-parse", "HEAD")
    d = tmp_path / "l"
    d.mkdir()
    (d / "0001-evil.patch").write_text(
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+pwned\n"
    )
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": ["0001-evil.patch"]})
    res = cli("check", "--lock", lock, "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_INPUT
    assert needle in res.err and "0001-evil.patch" in res.err


def _two_series_lock(d: Path, upstream, variant_of: str) -> Path:
    """Pin p runs series main (0001-a) and more (0002-b), with a variant file for ``variant_of``."""
    d.mkdir()
    upstream.patch(d / "0001-a.patch", "a", {"vllm/envs.py": "A = 1\n"}, "a")
    upstream.patch(d / "0002-b.patch", "b", {"csrc/kernel.cuh": "int length = 0;\n"}, "b")
    (d / "v").mkdir()
    upstream.patch(d / "v" / "0002-b.patch", "bv", {"csrc/kernel.cuh": "int length = 1;\n"}, "b, varied")
    return write_lock(d / "l.toml", {"p": git_pin("p", upstream, extra=f'series = ["main", "more"]\n'
                                                  f'variants = {{ "{variant_of}" = "v/0002-b.patch" }}')},
                      {"main": ["0001-a.patch"], "more": ["0002-b.patch"]})


@pytest.mark.parametrize("chosen", [[], ["main"], ["more"], ["main", "more"]])
def test_variants_outside_the_chosen_series_are_not_used(tmp_path, upstream, cli, chosen):
    """`--series` picks a subset of the pin's series: a variant of a patch outside it is not used (the
    README's `--series dsv4` on a pin with variants of the extras), not a lock error."""
    lock = _two_series_lock(tmp_path / "l", upstream, "0002-b.patch")
    args = [a for s in chosen for a in ("--series", s)]
    res = cli("check", "--lock", lock, "--cache-dir", tmp_path / "c", "--format", "json", *args)
    assert res.rc == 0, res.err
    assert list(json.loads(res.out)["pins"]["p"]["patches"]) == \
        [n for s, n in (("main", "0001-a.patch"), ("more", "0002-b.patch")) if s in (chosen or ["main", "more"])]


@pytest.mark.parametrize("chosen", [[], ["main"], ["more"]])
def test_a_variant_no_series_of_the_pin_contains_is_a_lock_error(tmp_path, upstream, cli, chosen):
    """A mistyped variant name is the lock's error whichever series the run chooses."""
    lock = _two_series_lock(tmp_path / "l", upstream, "0002-bb.patch")
    args = [a for s in chosen for a in ("--series", s)]
    res = cli("check", "--lock", lock, "--cache-dir", tmp_path / "c", *args)
    assert res.rc == EXIT_INPUT, res
    assert f"{lock}: pin p has variants for 0002-bb.patch, which no series of that pin contains " \
           "(its series: main, more)" in res.err and '[pins."p"].variants' in res.err


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b""
    declared: int | None = None

    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", str(self.declared or len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *a):
        pass


@pytest.fixture
def http_server():
    servers = []

    def serve(body: bytes, declared: int | None = None) -> str:
        handler = type("H", (_Handler,), {"body": body, "declared": declared})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_port}/vllm-0.0.1.tar.gz"

    yield serve
    for s in servers:
        s.shutdown()


def sdist_lock(tmp_path: Path, url: str, sha: str) -> Path:
    return lock_text(tmp_path, sdist_pin("s", "a" * 40, sha, url))


def test_sha256_mismatch_never_enters_cache(tmp_path, cli, http_server):
    url = http_server(b"not the sdist")
    lock = sdist_lock(tmp_path, url, "0" * 64)
    res = cli("fetch", "--lock", lock, "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_FETCH and "sha256 mismatch" in res.err and "pin s" in res.err
    assert not (tmp_path / "c/blobs/sha256" / ("0" * 64)).exists()
    assert list((tmp_path / "c/tmp").iterdir()) == []


def test_truncated_download(tmp_path, cli, http_server):
    url = http_server(b"x" * 100, declared=1000)
    lock = sdist_lock(tmp_path, url, "0" * 64)
    res = cli("fetch", "--lock", lock, "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_FETCH
    assert "truncated" in res.err or "broke off" in res.err
    assert list((tmp_path / "c/blobs/sha256").iterdir()) == []


def test_network_unreachable_with_cold_cache(tmp_path, cli):
    lock = sdist_lock(tmp_path, "http://127.0.0.1:9/vllm-0.0.1.tar.gz", "0" * 64)
    res = cli("fetch", "--lock", lock, "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_FETCH
    assert "cannot download" in res.err and "not in the cache" in res.err


def test_read_only_cache(tmp_path, upstream):
    d = tmp_path / "l"
    d.mkdir()
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": []})
    cache = tmp_path / "ro"
    cache.mkdir()
    cmd = [sys.executable, "-m", "dsv4patch", "fetch", "--lock", str(lock), "--cache-dir", str(cache)]
    if os.geteuid() == 0:
        # root ignores permission bits: make the directory a read-only bind mount instead.
        if shutil.which("unshare") is None:
            pytest.skip("running as root without unshare(1): cannot make a read-only directory")
        q = " ".join(shlex.quote(c) for c in cmd)
        c = shlex.quote(str(cache))
        cmd = ["unshare", "-m", "sh", "-c",
               f"mount --bind {c} {c} && mount -o remount,ro,bind {c} && exec {q}"]
    else:
        cache.chmod(0o555)
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    if "mount" in res.stderr and "permission denied" in res.stderr.lower():
        pytest.skip(f"cannot create a read-only mount here: {res.stderr.strip()}")
    assert res.returncode == EXIT_FETCH, res.stderr
    assert "is not writable" in res.stderr and str(cache) in res.stderr


def test_second_run_waits_then_fails_clearly(tmp_path, upstream, cli, monkeypatch):
    d = tmp_path / "l"
    d.mkdir()
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": []})
    cache = tmp_path / "c"
    from dsv4patch.pins.lock import load
    from dsv4patch.pins.repository import cache_key

    key = cache_key(load(lock).pin("p"))
    monkeypatch.setenv("DSV4PATCH_LOCK_TIMEOUT", "0.5")
    (cache / "locks").mkdir(parents=True)
    with file_mutex(cache / "locks" / f"tree-{key}.lock", "x", timeout=0):
        res = cli("fetch", "--lock", lock, "--cache-dir", cache)
    assert res.rc == EXIT_BUSY
    assert "locked by another dsv4patch run" in res.err and f"pid {os.getpid()}" in res.err
    assert cli("fetch", "--lock", lock, "--cache-dir", cache).rc == 0


@pytest.mark.parametrize("verb", ["wheel", "apply", "resolve"])
def test_a_file_where_out_goes_is_refused_before_anything_runs(tmp_path, cli, shared_cache, verb):
    """``--out`` naming a file, or a directory below one, ended `wheel` in an internal error (FileExistsError)
    after its work; now every command that writes wheels there refuses it first (exit 2), naming the file,
    and makes nothing: apply creates no tree.  `apply --no-build` writes no wheel: its --out is not judged."""
    from dsv4patch.errors import EXIT_USAGE

    lock = Path(__file__).resolve().parent.parent / "locks" / "vllm.toml"
    plain = tmp_path / "notes.txt"
    plain.write_text("x")
    tree = tmp_path / "tree"
    args = {"wheel": ["wheel", "--lock", lock, "--pin", "0.27.1"],
            "apply": ["apply", "--lock", lock, "--pin", "0.27.1", "--tree", tree],
            "resolve": ["resolve", "--continue", "--tree", tree, "--lock", lock]}[verb]
    for out, said in [(plain, f"--out {plain} is a file, not a directory"),
                      (plain / "dist", f"--out {plain / 'dist'} cannot be made there: {plain} is a file, not a "
                                       "directory")]:
        res = cli(*args, "--out", out, "--cache-dir", tmp_path / "cache")
        assert res.rc == EXIT_USAGE, (verb, res.rc, res.err)
        assert f"dsv4patch {verb}: error: {said}; name a directory for the wheels (made if absent)" in res.err
        assert "internal error" not in res.err and not tree.exists() and plain.read_text() == "x"
    if verb == "apply":  # no wheel written: the --out it would not use is not judged (the run goes on)
        res = cli(*args, "--no-build", "--out", plain, "--cache-dir", shared_cache, "--format", "json")
        assert res.rc == 0 and json.loads(res.out)["ok"], res.err
        assert (tree / ".git").exists() and plain.read_text() == "x"
