"""dsv4patch.series.releases and ``dsv4patch releases``: the release watcher against real index servers.

A copy of the real lock without pin 0.28.0 (its patches and variants copied
beside it) is watched through a PEP 691 index on 127.0.0.1 (tests/localindex.py)
that lists the real 0.28.0 sdist, a yanked release, a pre-release and a
release whose file is not the one its sha256 names; then through a real
``pypiserver`` (PEP 503 pages) holding the real sdist.  The sdists are the
real ones from the cache (network on a cold cache), the check runs real git
on the real tree; nothing here is mocked.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
import tomlkit

from conftest import LOCK, ROOT
from dsv4patch.pins import repository
from dsv4patch.pins.lock import load
from dsv4patch.progress import Progress
from dsv4patch.series import engine, releases
from dsv4patch.series.patches import series_for_pin
from dsv4patch.store import Store
from localindex import serve

pytestmark = pytest.mark.network  # the sdists, on a cold cache
REAL = load(LOCK)
REMOVED = "0.28.0"
P28 = REAL.pin(REMOVED)
P26 = REAL.pin("0.26.0")
FAKE_SHA = "0123456789abcdef" * 4  # what the index claims for a file whose bytes are others


@pytest.fixture(scope="module")
def blobs(shared_cache: Path) -> dict[str, Path]:
    """The real sdists of 0.28.0 and 0.26.0, verified by the lock's sha256 (from the cache)."""
    store = Store.open(shared_cache)
    return {p.name: store.fetch_blob(p.source.url, p.source.sha256, p.source.size, f"vllm {p.name}",
                                     Progress(False)) for p in (P28, P26)}


def _project(tmp: Path, drop: tuple[str, ...] = (REMOVED,)) -> Path:
    """A project copy: patches/ and locks/ (the lock without ``drop``); returns the lock's path."""
    shutil.copytree(ROOT / "patches", tmp / "patches")
    shutil.copytree(ROOT / "locks" / "toolchains", tmp / "locks" / "toolchains")
    doc = tomlkit.parse(LOCK.read_text(encoding="utf-8"))
    for name in drop:
        del doc["pins"][name]  # type: ignore[union-attr]
    lock = tmp / "locks" / "vllm.toml"
    lock.write_text(tomlkit.dumps(doc), encoding="utf-8")
    return lock


def _link(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _page(files: list[dict]) -> tuple[str, bytes]:
    return ("application/vnd.pypi.simple.v1+json",
            json.dumps({"meta": {"api-version": "1.1"}, "name": "vllm", "files": files}).encode())


def _file(name: str, sha: str, size: int | None = None, yanked: bool | str = False) -> dict:
    out: dict = {"filename": name, "url": f"/files/{name}", "hashes": {"sha256": sha}, "yanked": yanked}
    if size is not None:
        out["size"] = size
    return out


def _pinned_files() -> list[dict]:
    return [_file(f"vllm-{p}.tar.gz", REAL.pin(p).source.sha256, REAL.pin(p).source.size)
            for p in ("0.26.0", "0.27.1")]


@pytest.fixture
def index(tmp_path: Path, blobs: dict[str, Path], monkeypatch: pytest.MonkeyPatch):
    """A PEP 691 index: the pinned 0.26.0 and 0.27.1, 0.28.0 (new, real), 0.28.1 (yanked),
    0.29.0rc1 (a pre-release), 0.28.2 (listed with a sha256 its bytes do not have)."""
    www = tmp_path / "www"
    _link(blobs[REMOVED], www / "files" / f"vllm-{REMOVED}.tar.gz")
    _link(blobs["0.26.0"], www / "files" / "vllm-0.28.2.tar.gz")  # 0.26.0's bytes under another name
    wheel_sha = "ab" * 32
    with serve(www) as idx:
        idx.pages["/simple/vllm/"] = _page([
            *_pinned_files(),
            _file(f"vllm-{REMOVED}.tar.gz", P28.source.sha256, P28.source.size),
            _file(f"vllm-{REMOVED}-cp38-abi3-manylinux_2_28_x86_64.whl", wheel_sha, 1234),
            _file("vllm-0.28.1.tar.gz", "cd" * 32, 10, yanked="broken build"),
            _file("vllm-0.29.0rc1.tar.gz", "ef" * 32, 10),
            _file("vllm-0.28.2.tar.gz", FAKE_SHA, None),
        ])
        monkeypatch.setenv("DSV4PATCH_INDEX_URL", idx.url + "/simple")
        yield idx


SCHEMA = json.loads((ROOT / "schemas" / "releases.schema.json").read_text(encoding="utf-8"))


def _json(res) -> dict:
    """The output, checked against the JSON contract (schemas/releases.schema.json)."""
    import jsonschema

    out = json.loads(res.out)
    jsonschema.validate(out, SCHEMA)
    return out


def test_lists_a_removed_pin_with_each_patch_classified_and_flags_the_others(
        index, tmp_path: Path, shared_cache: Path, cli) -> None:
    lock = _project(tmp_path / "proj")
    before = lock.read_bytes()
    res = cli("releases", "--lock", lock, "--cache-dir", shared_cache, "--format", "json")
    assert res.rc == 1, res.err  # releases need a decision
    out = _json(res)
    rels = out["releases"]
    assert set(rels) == {REMOVED, "0.28.1", "0.29.0rc1", "0.28.2"}  # the pinned ones are not listed
    assert out["pinned"] == ["0.26.0", "0.27.1"] and out["needs_decision"] == [REMOVED, "0.28.2"]
    # The removed pin: the sdist by the index's sha256, each patch classified as check does.
    r = rels[REMOVED]
    assert (r["state"], r["decision"]) == ("new", "adopt"), r
    assert r["sdist"]["sha256"] == P28.source.sha256 and r["commit"] == P28.commit[:9]
    assert r["torch"] == "2.13.0" and r["toolchain"] == "torch2.13.0-cu13"
    patches = r["patches"]
    # The series as it is: the seven and extra 1 upstream by their markers, extra 2 conflicts (as
    # `check` finds it on the tree without variants, which then stops at extra 3: it depends on
    # extra 2); extra 3, on top of extra 2's variant, applies only at an offset.
    store = Store.open(shared_cache)
    repo = repository.materialize(P28, store, Progress(False))
    plain = engine.run_series(repo.repo, repo.base_commit, series_for_pin(REAL, replace(P28, variants={})))
    assert [p.status.value for p in plain.patches] == ["upstream"] * 8 + ["conflict", "not-checked"]
    assert [p.patch for p in plain.patches] == list(patches)
    assert [c["series_status"] for c in patches.values()] == ["upstream"] * 8 + ["conflict", "offset"]
    for name, c in list(patches.items())[:8]:
        assert c["status"] == "upstream" and "fix already in the tree" in c["message"], name
    # With the variants written for this release (patches/variants/0.28.0/): both clean.
    for name in list(patches)[8:]:
        assert patches[name]["status"] == "clean" and patches[name]["variant_of"] == REMOVED, name
    # The entry it would add is the pin that was removed.
    entry = tomlkit.parse(r["entry"])["pins"][REMOVED]
    assert entry["base_tree"] == P28.base_tree and entry["patched_tree"] == P28.patched_tree
    assert entry["expect"] == "upstream" and dict(entry["expect_patches"]) == P28.expect_patches
    assert dict(entry["variants"]) == {k: os.path.relpath(v, LOCK.parent) for k, v in P28.variants.items()}
    assert entry["source"]["sha256"] == P28.source.sha256 and entry["source"]["size"] == P28.source.size
    assert entry["toolchain"] == "torch2.13.0-cu13" and entry["commit_abbrev"] == P28.commit[:9]
    assert entry["wheels"]["x86_64"]["sha256"] == "ab" * 32 and "aarch64" not in entry["wheels"]
    # Yanked and pre-release: listed, never downloaded; the hash mismatch: nothing cached.
    assert (rels["0.28.1"]["state"], rels["0.28.1"]["decision"]) == ("yanked", "none")
    assert "broken build" in rels["0.28.1"]["detail"]
    assert (rels["0.29.0rc1"]["state"], rels["0.29.0rc1"]["decision"]) == ("pre-release", "none")
    assert not any(p.endswith(("vllm-0.28.1.tar.gz", "vllm-0.29.0rc1.tar.gz")) for p in index.requests)
    bad = rels["0.28.2"]
    assert (bad["state"], bad["decision"]) == ("hash-mismatch", "investigate")
    assert FAKE_SHA in bad["detail"] and "sha256 mismatch" in bad["detail"]
    assert not store.blob_path(FAKE_SHA).exists()
    assert lock.read_bytes() == before  # never written without --write
    # Text and Markdown name the release, its classification and what to do next.
    text = cli("releases", "--lock", lock, "--cache-dir", shared_cache)
    assert text.rc == 1 and "0.28.0: new" in text.out and "next: adopt it" in text.out
    assert f"--release {REMOVED} --write" in text.out and "0.28.2: hash-mismatch" in text.out
    md = cli("releases", "--lock", lock, "--cache-dir", shared_cache, "--format", "markdown")
    assert md.rc == 1 and f"| {REMOVED} | new | up 1-8; clean* 9-10 | adopt |" in md.out and "`*`" in md.out
    assert "| 0.28.2 | hash-mismatch | - | investigate |" in md.out
    assert "with the variant written for 0.28.0" in text.out
    assert "[pins.\"0.28.0\"]" in md.out


def test_write_adds_the_entry_that_check_then_accepts(index, tmp_path: Path, shared_cache: Path, cli) -> None:
    lock = _project(tmp_path / "proj")
    res = cli("releases", "--lock", lock, "--cache-dir", shared_cache, "--release", REMOVED, "--write",
              "--format", "json")
    assert res.rc == 0, res.out + res.err
    assert _json(res)["releases"][REMOVED]["written"] is True
    pin = load(lock).pin(REMOVED)
    assert (pin.base_tree, pin.patched_tree, pin.commit) == (P28.base_tree, P28.patched_tree, P28.commit[:9])
    check = cli("check", "--lock", lock, "--cache-dir", shared_cache, "--pin", REMOVED, "--format", "json")
    assert check.rc == 0, check.out
    # Watched again: the new pin is pinned now; only the hash mismatch is left to decide.
    again = _json(cli("releases", "--lock", lock, "--cache-dir", shared_cache, "--format", "json"))
    assert REMOVED in again["pinned"] and again["needs_decision"] == ["0.28.2"]
    # --pre checks the pre-release too: the index links a file it does not serve.
    pre = _json(cli("releases", "--lock", lock, "--cache-dir", shared_cache, "--pre", "--format", "json"))
    assert pre["releases"]["0.29.0rc1"]["state"] == "fetch-failed"
    # An ignored release is a decision taken: listed with the reason, nothing to do.
    doc = tomlkit.parse(lock.read_text(encoding="utf-8"))
    doc["watch"] = {"ignore": {"0.28.2": "its sdist does not match the index's hash"}}
    lock.write_text(tomlkit.dumps(doc), encoding="utf-8")
    res = cli("releases", "--lock", lock, "--cache-dir", shared_cache, "--format", "json")
    assert res.rc == 0, res.out
    assert _json(res)["releases"]["0.28.2"]["state"] == "ignored"


def test_a_pinned_release_asked_for_is_compared_with_its_entry_and_never_written(
        index, tmp_path: Path, shared_cache: Path, cli) -> None:
    """`--release 0.28.0` where the lock pins 0.28.0: state `pinned`, checked from its own pin and compared
    with its entry; `--write` leaves the entry as it is (it was `new`/`adopt`, exit 1, and suggested a
    `--write` that failed with exit 3 "pin exists already")."""
    lock = _project(tmp_path / "proj", drop=())
    before = lock.read_bytes()
    res = cli("releases", "--lock", lock, "--cache-dir", shared_cache, "--release", REMOVED, "--format", "json")
    assert res.rc == 0, res.out + res.err
    r = _json(res)["releases"][REMOVED]
    assert (r["state"], r["decision"], r["needs_decision"], r["entry"]) == ("pinned", "none", False, None), r
    assert (r["reference"], r["base_tree"], r["patched_tree"]) == (REMOVED, P28.base_tree, P28.patched_tree)
    assert r["toolchain"] == P28.toolchain.name and P28.commit.startswith(r["commit"])
    # The adopting command run again: a no-op that says so, exit 0, the lock untouched.
    res = cli("releases", "--lock", lock, "--cache-dir", shared_cache, "--release", REMOVED, "--write")
    assert res.rc == 0, res.out + res.err
    assert f"{REMOVED}: pinned (pin {REMOVED}'s lock entry agrees:" in res.out and "not written:" in res.out, res.out
    assert "--write" not in res.out and "next:" not in res.out and lock.read_bytes() == before
    # An entry that is not what the series gives there: what differs, and a next step that can be run.
    doc = tomlkit.parse(lock.read_text(encoding="utf-8"))
    doc["pins"][REMOVED]["patched_tree"] = "a" * 40  # type: ignore[index]
    lock.write_text(tomlkit.dumps(doc), encoding="utf-8")
    res = cli("releases", "--lock", lock, "--cache-dir", shared_cache, "--release", REMOVED, "--write")
    assert res.rc == 1, res.out + res.err
    assert f"patched_tree {'a' * 40} in the lock, {P28.patched_tree} from the check" in res.out.replace("\n", " ")
    assert f"dsv4patch check --lock {lock} --pin {REMOVED}" in res.out.replace("\n", " ")
    assert "--write" not in res.out and "not written:" in res.out
    out = _json(cli("releases", "--lock", lock, "--cache-dir", shared_cache, "--release", REMOVED,
                    "--format", "json"))
    assert (out["releases"][REMOVED]["state"], out["needs_decision"]) == ("pinned", [REMOVED])


def test_a_pinned_release_yanked_or_changed_on_the_index_needs_a_decision(
        tmp_path: Path, shared_cache: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    lock = _project(tmp_path / "proj")
    files = _pinned_files()
    files[0]["yanked"] = True  # 0.26.0
    files[1]["hashes"]["sha256"] = FAKE_SHA  # 0.27.1: another file under the pinned name
    with serve(tmp_path / "www") as idx:
        idx.pages["/simple/vllm/"] = _page(files)
        monkeypatch.setenv("DSV4PATCH_INDEX_URL", idx.url + "/simple")
        res = cli("releases", "--lock", lock, "--cache-dir", shared_cache, "--format", "json")
        assert idx.requests == ["/simple/vllm/"]  # nothing downloaded
        idx.pages["/simple/vllm/"] = _page(_pinned_files())  # as pinned: nothing to report
        quiet = cli("releases", "--lock", lock, "--cache-dir", shared_cache)
        assert quiet.rc == 0 and "nothing new" in quiet.out and "┃" not in quiet.out  # no empty table
    out = _json(res)
    assert res.rc == 1 and out["needs_decision"] == ["0.26.0", "0.27.1"]
    assert out["releases"]["0.26.0"]["state"] == "pinned-yanked"
    assert out["releases"]["0.27.1"]["state"] == "pinned-changed" and FAKE_SHA in out["releases"]["0.27.1"]["detail"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_new_release_through_pypiserver(tmp_path: Path, blobs: dict[str, Path], shared_cache: Path, cli,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """pypiserver's PEP 503 pages (sha256 in the links, no sizes): the same classification."""
    lock = _project(tmp_path / "proj")
    packages = tmp_path / "packages"
    _link(blobs[REMOVED], packages / f"vllm-{REMOVED}.tar.gz")
    port = _free_port()
    log = open(tmp_path / "pypiserver.log", "wb")
    server = subprocess.Popen([str(Path(sys.executable).parent / "pypi-server"), "run", "-i", "127.0.0.1", "-p",
                               str(port), "-a", ".", "-P", ".", "--disable-fallback", "--hash-algo", "sha256",
                               str(packages)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/simple/", timeout=2).read()  # noqa: S310
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "pypiserver did not start"
                time.sleep(0.3)
        monkeypatch.setenv("DSV4PATCH_INDEX_URL", f"http://127.0.0.1:{port}/simple")
        res = cli("releases", "--lock", lock, "--cache-dir", shared_cache, "--format", "json")
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    assert res.rc == 1, res.err
    r = _json(res)["releases"][REMOVED]
    assert (r["state"], r["decision"], r["sdist"]["sha256"]) == ("new", "adopt", P28.source.sha256)
    assert [c["status"] for c in r["patches"].values()] == ["upstream"] * 8 + ["clean", "clean"]
    assert tomlkit.parse(r["entry"])["pins"][REMOVED]["patched_tree"] == P28.patched_tree


def test_list_releases_reads_yanked_and_prereleases_from_both_page_kinds(tmp_path: Path) -> None:
    with serve(tmp_path) as idx:
        idx.pages["/simple/vllm/"] = _page([
            _file("vllm-0.30.0.tar.gz", "aa" * 32, 5, yanked=True),
            _file("vllm-0.30.0-cp38-abi3-manylinux_2_28_aarch64.whl", "bb" * 32, 6, yanked=True),
            _file("vllm-0.31.0.dev3.tar.gz", "cc" * 32, 7),
            _file("vllm-0.29.0-cp38-abi3-manylinux_2_28_x86_64.whl", "dd" * 32, 8),  # wheels only
            _file("not-vllm-1.0.tar.gz", "ee" * 32, 9),
        ])
        got = {r.version: r for r in releases.list_releases(idx.url + "/simple")}
        assert list(got) == ["0.29.0", "0.30.0", "0.31.0.dev3"]  # sorted as versions
        assert got["0.30.0"].yanked == "" and got["0.31.0.dev3"].prerelease and got["0.29.0"].sdist is None
        assert got["0.30.0"].wheels["aarch64"][1].sha256 == "bb" * 32
        html = ('<html><body><a href="/f/vllm-0.30.0.tar.gz#sha256=' + "aa" * 32 + '" data-yanked="bad">'
                'vllm-0.30.0.tar.gz</a><a href="/f/vllm-0.29.0.tar.gz#sha256=' + "bb" * 32 + '">'
                'vllm-0.29.0.tar.gz</a></body></html>')
        idx.pages["/simple/vllm/"] = ("text/html", html.encode())
        got = {r.version: r for r in releases.list_releases(idx.url + "/simple")}
        assert got["0.30.0"].yanked == "bad" and got["0.29.0"].yanked is None


def test_watch_settings_are_validated(tmp_path: Path) -> None:
    """[watch] in the lock: since is a release, every ignored release says why."""
    from dsv4patch.errors import LockFileError

    base = LOCK.read_text(encoding="utf-8")
    lock = tmp_path / "vllm.toml"
    for table, message in (('since = "latest"', "is not a release"),
                           ('ignore = { "0.25.1" = "" }', "must say why"),
                           ('sinse = "0.26.0"', "unknown key")):
        lock.write_text(base + f"\n[watch]\n{table}\n", encoding="utf-8")
        with pytest.raises(LockFileError, match=message):
            load(lock)
    lock.write_text(base + '\n[watch]\nsince = "0.27.0"\nignore = { "0.25.1" = "drifted" }\n', encoding="utf-8")
    watch = load(lock).watch
    assert (watch.since, watch.ignore) == ("0.27.0", {"0.25.1": "drifted"})
