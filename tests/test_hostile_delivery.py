"""Hostile inputs to the code that downloads through an index, repacks wheels and resolves conflicts.

The same trust boundary as ``test_hostile.py`` (issue 10), for what landed
after it: the package index settings (``DSV4PATCH_INDEX_URL``,
``PIP_INDEX_URL``, ``UV_*``, pip.conf) and the index's pages, the stock wheel
``dsv4patch wheel`` repacks, commit subjects ``refresh`` turns into file
names, and the conflict workspace's state file in the tree's ``.git``.
Each is data: it never opens a local file or another scheme, never leaks a
credential into a message, and never makes dsv4patch write outside the tree,
the cache and the output directory the user named.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import sdist_pin, write_lock
from dsv4patch.errors import EXIT_FETCH, EXIT_INPUT, EXIT_OK, EXIT_USAGE
from test_hostile import Sdist

DEAD = "http://127.0.0.1:9/nowhere"  # the discard port: connection refused
INDEX_VARS = ("DSV4PATCH_INDEX_URL", "PIP_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL", "VIRTUAL_ENV")


@dataclass
class Server:
    url: str = ""
    pages: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # path -> (type, body)
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Authorization)
    auth: str | None = None  # required Authorization header, if any


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    """Two HTTP servers on 127.0.0.1 (two hosts as far as URLs go: different ports)."""
    out: list[Server] = []
    running = []
    for _ in range(2):
        s = Server()

        class H(http.server.BaseHTTPRequestHandler):
            srv = s

            def do_GET(self):  # noqa: N802
                auth = self.headers.get("Authorization")
                self.srv.requests.append((self.path, auth))
                if self.srv.auth is not None and auth != self.srv.auth:
                    self.send_error(401)
                    return
                if self.path not in self.srv.pages:
                    self.send_error(404)
                    return
                ctype, body = self.srv.pages[self.path]
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        s.url = f"http://127.0.0.1:{httpd.server_address[1]}"
        out.append(s)
        running.append(httpd)
    yield out
    for httpd in running:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def no_index_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in INDEX_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")


def _sdist_lock(tmp_path: Path, url: str = f"{DEAD}/vllm-0.0.1.tar.gz") -> tuple[Path, bytes, str]:
    """(lock, sdist bytes, sha256): a pin whose sdist is NOT cached; the lock's url is ``url``."""
    data = Sdist().bytes()
    sha = hashlib.sha256(data).hexdigest()
    d = tmp_path / "lock"
    d.mkdir(exist_ok=True)
    lock = write_lock(d / "l.toml", {"s": sdist_pin("s", "0123456789abcdef0123456789abcdef01234567",
                                                     sha, url)}, {"main": []})
    return lock, data, sha


def _fetch(cli, lock: Path, cache: Path, *extra: str):
    return cli("fetch", "--lock", lock, "--pin", "s", "--cache-dir", cache, *extra)


# --- the package index -------------------------------------------------------------------


@pytest.mark.parametrize("setting,value", [
    ("DSV4PATCH_INDEX_URL", "file://{tmp}/simple"),
    ("PIP_INDEX_URL", "ftp://127.0.0.1:9/simple"),
    ("UV_INDEX_URL", "javascript:alert(1)"),
    ("UV_DEFAULT_INDEX", "data:text/html,<a href='x'>x</a>"),
    ("pip.conf", "$(touch {tmp}/MARKER)"),
    ("pip.conf", "file:///etc"),
])
def test_index_setting_that_is_not_http_is_refused(tmp_path, cli, monkeypatch, no_index_config,
                                                   setting, value):
    value = value.format(tmp=tmp_path)
    (tmp_path / "simple" / "vllm").mkdir(parents=True)
    lock, _data, sha = _sdist_lock(tmp_path)
    if setting == "pip.conf":
        conf = tmp_path / "pip.conf"
        conf.write_text(f"[global]\nindex-url = {value}\n")
        monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    else:
        monkeypatch.setenv(setting, value)
    cache = tmp_path / "cache"
    res = _fetch(cli, lock, cache, "--format", "json")
    assert res.rc == EXIT_USAGE, (res.rc, res.err)
    assert "refused as a package index" in res.err and (setting in res.err or "pip.conf" in res.err)
    assert json.loads(res.out)["error"]["exit_code"] == EXIT_USAGE
    assert not (tmp_path / "MARKER").exists()
    assert not (cache / "blobs" / "sha256" / sha).exists()


def test_index_link_to_a_local_file_is_not_followed(tmp_path, cli, monkeypatch, no_index_config, servers):
    """A page that links the pinned file to file:///... (right sha256 and all) is not read."""
    index = servers[0]
    lock, data, sha = _sdist_lock(tmp_path)
    outside = tmp_path / "outside" / "vllm-0.0.1.tar.gz"
    outside.parent.mkdir()
    outside.write_bytes(data)
    index.pages["/simple/vllm/"] = ("application/vnd.pypi.simple.v1+json", json.dumps({
        "meta": {"api-version": "1.0"},
        "files": [{"filename": "vllm-0.0.1.tar.gz", "url": outside.as_uri(),
                   "hashes": {"sha256": sha}}]}).encode())
    monkeypatch.setenv("PIP_INDEX_URL", f"{index.url}/simple")
    cache = tmp_path / "cache"
    res = _fetch(cli, lock, cache)
    assert res.rc == EXIT_FETCH, res.err
    assert "refused" in res.err and "file" in res.err
    assert not (cache / "blobs" / "sha256" / sha).exists()


def test_index_credentials_are_used_for_the_index_host_only_and_never_printed(
        tmp_path, cli, monkeypatch, no_index_config, servers):
    index, files = servers
    index.auth = "Basic " + base64.b64encode(b"alice:s3cret").decode()
    lock, data, sha = _sdist_lock(tmp_path)
    files.pages["/f/vllm-0.0.1.tar.gz"] = ("application/octet-stream", data)
    index.pages["/simple/vllm/"] = ("text/html", (
        f'<a href="{files.url}/f/vllm-0.0.1.tar.gz#sha256={sha}">vllm-0.0.1.tar.gz</a>').encode())
    host = index.url.split("//", 1)[1]
    monkeypatch.setenv("PIP_INDEX_URL", f"http://alice:s3cret@{host}/simple")
    res = _fetch(cli, lock, tmp_path / "cache")
    assert res.rc == EXIT_OK, res.err
    assert index.requests == [("/simple/vllm/", index.auth)]
    assert files.requests == [("/f/vllm-0.0.1.tar.gz", None)]  # another host: no credentials
    # A failure names the index without its password, in text and JSON alike.
    index.pages["/simple/vllm/"] = ("text/html", b"<html></html>")
    res = _fetch(cli, lock, tmp_path / "cache2", "--format", "json")
    assert res.rc == EXIT_FETCH
    assert "s3cret" not in res.out + res.err
    assert f"***@{host}" in json.loads(res.out)["error"]["message"]


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1:9/vllm-0.0.1.tar.gz",
                                 "http://-oProxyCommand=x/vllm-0.0.1.tar.gz"])
def test_lock_download_url_that_is_not_http_is_refused(tmp_path, cli, no_index_config, url):
    lock, _data, sha = _sdist_lock(tmp_path, url)
    res = _fetch(cli, lock, tmp_path / "cache")
    assert res.rc == EXIT_INPUT, (res.rc, res.err)
    assert "is refused" in res.err and "url" in res.err
