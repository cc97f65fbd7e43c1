"""Downloads go through the package index the user's pip/uv is configured with.

A tiny HTTP server on 127.0.0.1 plays the index (PEP 503 HTML or PEP 691
JSON pages plus the files); the lock's URLs point nowhere, so a download that
works came from the index.  The lock's sha256 stays the only trust anchor.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import LOCK, ROOT
from dsv4patch import index
from dsv4patch.errors import IntegrityError
from dsv4patch.kernels import stock
from dsv4patch.pins.lock import WheelFile, load
from dsv4patch.progress import Progress
from dsv4patch.store import Store
from localindex import LocalIndex, serve

DEAD = "http://127.0.0.1:9/nowhere"  # the discard port: connection refused


@pytest.fixture
def served(tmp_path: Path) -> Iterator[LocalIndex]:
    (tmp_path / "www").mkdir()
    with serve(tmp_path / "www") as idx:
        yield idx


@pytest.fixture
def no_index_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("DSV4PATCH_INDEX_URL", "PIP_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL", "VIRTUAL_ENV"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")


def test_apply_fetch_through_a_local_index_named_by_pip_index_url(
        served: LocalIndex, tmp_path: Path, shared_cache: Path, cli, monkeypatch: pytest.MonkeyPatch,
        no_index_config: None) -> None:
    """The real 0.27.1 sdist from a PEP 503 index; the lock's url is dead (a hint only)."""
    pin = load(LOCK).pin("0.27.1")
    sdist = Store.open(shared_cache).blob_path(pin.source.sha256)
    assert sdist.is_file()
    (served.root / "files").mkdir()
    shutil.copyfile(sdist, served.root / "files" / "vllm-0.27.1.tar.gz")
    served.pages["/simple/vllm/"] = ("text/html", (
        '<html><body><a href="../../files/vllm-0.27.1.tar.gz#sha256='
        f'{pin.source.sha256}">vllm-0.27.1.tar.gz</a></body></html>').encode())
    proj = tmp_path / "proj"
    shutil.copytree(ROOT / "patches", proj / "patches")
    (proj / "locks").mkdir()
    text = LOCK.read_text()
    text = text.replace(pin.source.url, f"{DEAD}/vllm-0.27.1.tar.gz")
    (proj / "locks" / "vllm.toml").write_text(text)
    cache = tmp_path / "cache"
    res = cli("fetch", "--lock", proj / "locks" / "vllm.toml", "--pin", "0.27.1", "--cache-dir", cache)
    assert res.rc == 4 and "127.0.0.1:9" in res.err  # no index configured: the lock's url, dead
    monkeypatch.setenv("PIP_INDEX_URL", f"{served.url}/simple")
    res = cli("apply", "--lock", proj / "locks" / "vllm.toml", "--pin", "0.27.1", "--tree",
              tmp_path / "tree", "--cache-dir", cache, "--no-build", "--format", "json")
    assert res.rc == 0, res.err
    assert served.requests == ["/simple/vllm/", "/files/vllm-0.27.1.tar.gz"]
    assert json.loads(res.out)["pins"]["0.27.1"]["patched_tree"] == pin.patched_tree


def _blob(tmp_path: Path, data: bytes) -> tuple[Store, str]:
    return Store.open(tmp_path / "cache"), hashlib.sha256(data).hexdigest()


def _json_page(served: LocalIndex, files: list[dict]) -> None:
    served.pages["/pypi/simple/vllm/"] = ("application/vnd.pypi.simple.v1+json",
                                          json.dumps({"meta": {"api-version": "1.0"},
                                                      "files": files}).encode())


def test_wheel_through_pip_conf_and_uv_index_url_pep691(
        served: LocalIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_index_config: None) -> None:
    data = b"a wheel's bytes" * 1000
    store, sha = _blob(tmp_path, data)
    name = "vllm-0.0.1-cp38-abi3-manylinux_2_28_x86_64.whl"
    (served.root / "w").mkdir()
    (served.root / "w" / name).write_bytes(data)
    _json_page(served, [{"filename": name, "url": f"/w/{name}", "hashes": {"sha256": sha}}])
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nindex-url = {served.url}/pypi/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    assert index.configured_index() == (f"{served.url}/pypi/simple", f"{conf} [global] index-url")
    wheel = WheelFile("x86_64", f"{DEAD}/{name}", sha, len(data))
    got = stock.wheel_path(store, wheel)
    assert got.read_bytes() == data and served.requests == ["/pypi/simple/vllm/", f"/w/{name}"]
    got.unlink()
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("UV_INDEX_URL", f"{served.url}/pypi/simple")
    assert stock.wheel_path(store, wheel).read_bytes() == data
    assert served.requests[-1] == f"/w/{name}"


def test_the_lock_sha256_is_the_only_trust_anchor(
        served: LocalIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_index_config: None) -> None:
    """An index listing another hash is skipped for the lock's url; wrong bytes are never cached."""
    data = b"the pinned sdist" * 100
    store, sha = _blob(tmp_path, data)
    name = "vllm-0.0.1.tar.gz"
    (served.root / "lockurl").mkdir()
    (served.root / "lockurl" / name).write_bytes(data)
    (served.root / "evil").mkdir()
    (served.root / "evil" / name).write_bytes(b"something else")
    monkeypatch.setenv("DSV4PATCH_INDEX_URL", f"{served.url}/pypi/simple")
    _json_page(served, [{"filename": name, "url": f"/evil/{name}", "hashes": {"sha256": "0" * 64}}])
    got = store.fetch_blob(f"{served.url}/lockurl/{name}", sha, None, name, Progress(False))
    assert got.read_bytes() == data and f"/evil/{name}" not in served.requests
    got.unlink()
    # Listed without a hash, wrong bytes: refused, nothing cached; the dead lock url fails too.
    _json_page(served, [{"filename": name, "url": f"/evil/{name}", "hashes": {}}])
    with pytest.raises(IntegrityError, match="sha256 mismatch") as exc:
        store.fetch_blob(f"{DEAD}/{name}", sha, None, name, Progress(False))
    assert "127.0.0.1:9" in str(exc.value)
    assert not store.blob_path(sha).exists()
    assert not [p for p in (store.root / "tmp").iterdir() if re.match(r"dl-", p.name)]


def test_fetch_seeds_a_stock_wheel_matched_by_sha256(cli, tmp_path: Path, shared_cache: Path) -> None:
    """Offline builds (the Docker context's vllm-wheels/): the stock wheel enters the cache by hash."""
    pin = load(LOCK).pin("0.27.1")
    blob = stock.wheel_path(Store.open(shared_cache), pin.wheels["x86_64"])
    res = cli("fetch", "--lock", LOCK, "--pin", "0.27.1", "--wheel", blob, "--cache-dir", shared_cache,
              "--format", "json")
    assert res.rc == 0, res.err
    assert json.loads(res.out)["seeded"] == {str(blob): ["0.27.1 (x86_64 wheel)"]}
    other = tmp_path / "vllm-0.27.1-cp38-abi3-manylinux_2_28_x86_64.whl"
    other.write_bytes(b"not the pinned wheel")
    res = cli("fetch", "--lock", LOCK, "--pin", "0.27.1", "--wheel", other, "--cache-dir", shared_cache)
    assert res.rc == 4 and "not a stock wheel any selected pin locks" in res.err


def test_a_release_the_index_does_not_have_is_named_with_the_nearest(
        served: LocalIndex, monkeypatch: pytest.MonkeyPatch, no_index_config: None) -> None:
    """`port --to 9.9.9` (a typo) said the index 'has no sdist vllm-9.9.9.tar.gz with a sha256'; a version the
    index does not list is 'no release', with the nearest ones it lists; one listed without a sha256 says so."""
    from dsv4patch.errors import FetchError

    _json_page(served, [{"filename": f"vllm-{v}.tar.gz", "url": f"/f/vllm-{v}.tar.gz", "hashes": {"sha256": "ab" * 32}}
                        for v in ("0.27.1", "0.28.0")] +
               [{"filename": "vllm-0.26.0.tar.gz", "url": "/f/vllm-0.26.0.tar.gz", "hashes": {}}])
    monkeypatch.setenv("DSV4PATCH_INDEX_URL", f"{served.url}/pypi/simple")
    with pytest.raises(FetchError, match=r"has no release 0\.27\.2 \(no sdist vllm-0\.27\.2\.tar\.gz\); did you mean "
                                         r"0\.27\.1"):
        index.find_sdist("vllm", "0.27.2")
    with pytest.raises(FetchError, match=r"has no release 9\.9\.9 \(no sdist vllm-9\.9\.9\.tar\.gz\)$"):
        index.find_sdist("vllm", "9.9.9")
    with pytest.raises(FetchError, match="lists vllm-0.26.0.tar.gz without a sha256"):
        index.find_sdist("vllm", "0.26.0")
