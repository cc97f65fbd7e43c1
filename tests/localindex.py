"""A package index (or any file host) on 127.0.0.1 for tests: pages, files, optional auth.

One HTTP server for every test that needs an index: ``test_index.py`` (pip's
and uv's settings, PEP 503/691 pages) and ``test_hostile_delivery.py`` (index
pages and settings as hostile input, credentials).  Each request is recorded
with its Authorization header.
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class LocalIndex:
    root: Path | None = None  # files served from here when no page matches
    url: str = ""
    pages: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # path -> (content type, body)
    requests: list[str] = field(default_factory=list)  # paths, in order
    requests_auth: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Authorization)
    auth: str | None = None  # required Authorization header, if any
    streams: dict[str, Stream] = field(default_factory=dict)  # path -> a body sent piece by piece
    sent: dict[str, int] = field(default_factory=dict)  # path -> body bytes a stream got out


@dataclass
class Stream:
    """A response body sent ``piece`` by ``piece`` (``delay`` s apart) up to ``total`` bytes.

    For hostile servers: an endless (or huge) body, one that dribbles a byte at
    a time, one whose Content-Length lies (``length``).  The server records in
    ``LocalIndex.sent`` how many bytes it got out before the client hung up.
    """

    ctype: str
    total: int
    piece: bytes = b"x" * 65536
    delay: float = 0.0
    length: int | None = None  # the Content-Length header sent, None for none


@contextmanager
def serve(root: Path | None = None) -> Iterator[LocalIndex]:
    idx = LocalIndex(root=root)

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            auth = self.headers.get("Authorization")
            idx.requests.append(self.path)
            idx.requests_auth.append((self.path, auth))
            if idx.auth is not None and auth != idx.auth:
                self.send_error(401)
                return
            if self.path in idx.streams:
                self._stream(idx.streams[self.path])
                return
            if self.path in idx.pages:
                ctype, body = idx.pages[self.path]
            elif idx.root is not None and (idx.root / self.path.lstrip("/")).is_file():
                ctype, body = "application/octet-stream", (idx.root / self.path.lstrip("/")).read_bytes()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _stream(self, st: Stream) -> None:
            self.send_response(200)
            self.send_header("Content-Type", st.ctype)
            if st.length is not None:
                self.send_header("Content-Length", str(st.length))
            self.end_headers()
            sent = 0
            try:
                while sent < st.total:
                    piece = st.piece[: st.total - sent]
                    self.wfile.write(piece)
                    self.wfile.flush()
                    sent += len(piece)
                    idx.sent[self.path] = sent
                    if st.delay:
                        time.sleep(st.delay)
            except OSError:  # the client hung up: what it refused to read is the point
                pass
            self.close_connection = True

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    # serve_forever checks for shutdown() once per poll interval: 0.5 s by default, which every test's
    # teardown (shutdown() waits for it) paid in full, twice with two servers
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    idx.url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        yield idx
    finally:
        srv.shutdown()
        srv.server_close()
