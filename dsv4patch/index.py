"""The package index dsv4patch downloads from: the one the user's pip/uv is configured with.

Where PyPI is not reachable (a mirror, an air-gapped index, a proxy such as
devpi or Artifactory) the URLs recorded in the lock do not work, but the
files are the same: an sdist or wheel is identified by its sha256, which the
lock pins.  So the lock's URL is a hint and the configured index comes first:

1. ``DSV4PATCH_INDEX_URL`` (dsv4patch's own setting), else
2. ``PIP_INDEX_URL``, else ``UV_DEFAULT_INDEX`` / ``UV_INDEX_URL``, else
3. ``index-url`` in pip's configuration files (``[install]``, ``[download]``,
   ``[global]``; ``$PIP_CONFIG_FILE`` and the files pip reads), else
4. none: the lock's URL (PyPI's files host), as before.

The file is looked up by name on the index's simple API (PEP 691 JSON, or
the PEP 503 HTML page) and downloaded from there; whatever comes back is
accepted only if its size and sha256 are the lock's (``store.fetch_blob``).
A file the index lacks, or lists with another sha256, is fetched from the
lock's URL instead.  ``lock --update`` and ``port`` ask the same index for an
sdist's URL, size and hash.

None of these settings, nor the index's pages, are trusted (see "What
dsv4patch trusts" in docs/trust.md): an index URL must be ``http(s)://host/...``
(a ``file:``, ``ftp:``, ``javascript:``... setting is refused, exit 2), a link
or redirect to anything but http(s) is not followed, and credentials in an
index URL (``https://user:token@host/simple``) are sent, as HTTP basic auth,
only to that host and are never printed (:func:`redact`).
"""

from __future__ import annotations

import base64
import configparser
import http.client
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from typing import IO, Any

from dsv4patch import settings
from dsv4patch.errors import FetchError, ParameterError, did_you_mean
from dsv4patch.records import frozen
from dsv4patch.safeio import loads_json
from dsv4patch.urls import http_url_problem, redact, redact_text

DEFAULT_INDEX = "https://pypi.org/simple"
_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"

# Bounds (docs/trust.md "Bounds"): what one index page or one transfer may take.
PAGE_LIMIT = 32 << 20  # an index page: 32 MiB (PyPI's largest simple pages are a few MiB)
READ_TIMEOUT = 60.0  # seconds one read (or the connection) may stay silent
# A transfer's total deadline and minimum rate: settings.Settings.download_timeout / download_min_rate.
RATE_WINDOW = 30.0  # seconds over which the rate is measured (a trickling server is cut after about this long)
_CHUNK = 1 << 20
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


@frozen
class SdistInfo:
    filename: str
    url: str
    sha256: str
    size: int | None


@frozen
class IndexFile:
    """One file on a project's simple page (PEP 691 / PEP 503), as the index lists it."""

    url: str  # absolute
    sha256: str | None
    size: int | None
    yanked: str | None = None  # None: not yanked; else the reason (possibly "") (PEP 592)


@frozen
class Candidate:
    """A place to download a pinned file from, and why it is tried."""

    url: str
    origin: str  # "index <url> (<setting>)" or "lock", credentials redacted
    auth_from: str | None = None  # the index URL whose credentials its own host gets


# http_url_problem and redact live in urls.py (no urllib.request: the lock loads them)


def _request(url: str, auth_from: str | None = None, accept: str | None = None) -> urllib.request.Request:
    """A request for ``url`` without its userinfo; basic auth only for ``auth_from``'s own host."""
    problem = http_url_problem(url)
    if problem:
        raise FetchError(f"refusing to download {redact(url)}: {problem}")
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    creds = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    if not creds and auth_from:
        a = urllib.parse.urlsplit(auth_from)
        if "@" in a.netloc and a.netloc.rpartition("@")[2].lower() == host.lower() and a.scheme == parts.scheme:
            creds = a.netloc.rpartition("@")[0]
    req = urllib.request.Request(urllib.parse.urlunsplit(parts._replace(netloc=host)))
    if accept:
        req.add_header("Accept", accept)
    if creds:
        user, _, password = creds.partition(":")
        token = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
        req.add_unredirected_header("Authorization", "Basic " + base64.b64encode(token.encode()).decode())
    return req


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects to http(s) only (urllib's own handler also follows ``ftp:``)."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: http.client.HTTPMessage, newurl: str) -> urllib.request.Request | None:
        problem = http_url_problem(newurl)
        if problem:
            raise urllib.error.URLError(f"redirect to {redact(newurl)} refused: {problem}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def open_url(url: str, auth_from: str | None = None, accept: str | None = None,
             timeout: float = READ_TIMEOUT) -> Any:
    """urlopen for http(s) only, redirects included; see :func:`_request` for credentials."""
    opener = urllib.request.build_opener(_HttpOnlyRedirects())
    return opener.open(_request(url, auth_from, accept), timeout=timeout)


def transfer_timeout() -> float:
    """``DSV4PATCH_DOWNLOAD_TIMEOUT``: seconds one page or file transfer may take in all (default 1800),
    as the run's settings hold it."""
    return settings.active().download_timeout


def min_rate() -> float:
    """``DSV4PATCH_DOWNLOAD_MIN_RATE``: bytes per second a transfer must keep up over any
    :data:`RATE_WINDOW` (default 1024; 0: only the total deadline bounds it), as the run's settings hold it."""
    return settings.active().download_min_rate


class TooLarge(FetchError):
    """A response went past the bytes it may have (the lock's size, the page cap)."""


class TooSlow(FetchError):
    """A transfer went past its total deadline (``DSV4PATCH_DOWNLOAD_TIMEOUT``) or fell below the minimum
    rate (``DSV4PATCH_DOWNLOAD_MIN_RATE`` over :data:`RATE_WINDOW`)."""


def _set_read_timeout(resp: Any, seconds: float) -> None:
    """Shorten the socket timeout under ``resp`` so a read cannot outlast the deadline."""
    sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
    settimeout = getattr(sock, "settimeout", None)
    if callable(settimeout):
        settimeout(max(seconds, 0.01))


def body_chunks(resp: Any, *, limit: int, deadline: float, label: str) -> Iterator[bytes]:
    """The body of ``resp`` piece by piece: at most ``limit`` bytes, done by ``deadline`` (monotonic).

    Reads at most ``limit + 1`` bytes: one byte more than allowed is
    :class:`TooLarge`.  Each read returns what one system call gives (a
    server dribbling a byte at a time is still measured against the total
    deadline) and the socket's timeout is cut to the time left, so the whole
    transfer never takes longer than the deadline: else :class:`TooSlow`.
    Other failures (a cut connection) propagate as the read raised them.
    """
    got = 0
    read = getattr(resp, "read1", None) or resp.read
    allowed = transfer_timeout()  # every caller's deadline: its request's start + this; the message names it
    rate = min_rate()
    marks: deque[tuple[float, int]] = deque([(time.monotonic(), 0)])  # (when, bytes by then) over the window
    while True:
        now = time.monotonic()
        while len(marks) > 1 and marks[1][0] <= now - RATE_WINDOW:
            marks.popleft()
        since, then = marks[0]
        if rate > 0 and now - since >= RATE_WINDOW and (got - then) / (now - since) < rate:
            raise TooSlow(f"{label} sent {got - then} bytes in the last {now - since:.0f} s, slower than "
                          f"{rate:g} bytes/s (DSV4PATCH_DOWNLOAD_MIN_RATE); cut off after {got} bytes")
        left = deadline - time.monotonic()
        if left <= 0:
            raise TooSlow(f"{label} took longer than {allowed:g} s in all (DSV4PATCH_DOWNLOAD_TIMEOUT, "
                          f"default {settings.DEFAULT_TRANSFER_TIMEOUT:g}); cut off after {got} bytes")
        _set_read_timeout(resp, min(READ_TIMEOUT, left))
        try:
            chunk = read(min(_CHUNK, limit + 1 - got))
        except TimeoutError:
            if deadline - time.monotonic() <= 0.05:
                raise TooSlow(f"{label} took longer than {allowed:g} s in all (DSV4PATCH_DOWNLOAD_TIMEOUT, "
                              f"default {settings.DEFAULT_TRANSFER_TIMEOUT:g}); cut off after {got} bytes") from None
            raise
        if not chunk:
            return
        got += len(chunk)
        if time.monotonic() - marks[-1][0] >= 1.0:  # one mark a second at most: bounded bookkeeping
            marks.append((time.monotonic(), got))
        if got > limit:
            raise TooLarge(f"{label} sent more than {limit} bytes, the most dsv4patch reads from it; "
                           "cut off there")
        yield chunk


def _pip_config_files() -> list[Path]:
    env = os.environ.get("PIP_CONFIG_FILE")
    home = Path.home()
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(home / ".config")
    files = [Path("/etc/xdg/pip/pip.conf"), Path("/etc/pip.conf"), home / ".pip" / "pip.conf",
             Path(xdg) / "pip" / "pip.conf"]
    if os.environ.get("VIRTUAL_ENV"):
        files.append(Path(os.environ["VIRTUAL_ENV"]) / "pip.conf")
    if env:
        if env == os.devnull:
            return []
        files.append(Path(env))
    return files


def _from_pip_conf() -> tuple[str, str] | None:
    found = None
    for path in _pip_config_files():
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        for section in ("global", "download", "install"):  # later sections win, as in pip
            if parser.has_option(section, "index-url"):
                found = (parser.get(section, "index-url").strip(), f"{path} [{section}] index-url")
    return found


def _configured() -> tuple[str, str] | None:
    for var in ("DSV4PATCH_INDEX_URL", "PIP_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL"):
        value = os.environ.get(var, "").strip()
        if value:
            return value.split()[0], var
    return _from_pip_conf()


def configured_index() -> tuple[str, str] | None:
    """(index URL, which setting gave it), or None when nothing is configured.

    A setting that is not an http(s) URL of a host is refused (exit 2), never opened.
    """
    found = _configured()
    if found is not None:
        problem = http_url_problem(found[0])
        if problem:
            raise ParameterError(
                f"{found[1]} = {redact(found[0])!r} is refused as a package index: {problem}; "
                "set it to an https:// simple index (or set DSV4PATCH_INDEX_URL="
                f"{DEFAULT_INDEX}, which takes precedence)")
    return found


def index_url() -> str:
    found = configured_index()
    return (found[0] if found else DEFAULT_INDEX).rstrip("/")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_of(filename: str) -> str | None:
    """``vllm`` from ``vllm-0.27.1.tar.gz`` or ``vllm-0.27.1-cp38-abi3-....whl``."""
    if filename.endswith(".whl"):
        return filename.split("-", 1)[0]
    m = re.fullmatch(r"(.+)-[^-]+\.(tar\.gz|zip)", filename)
    return m.group(1) if m else None


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str, str | None]] = []  # (href, text, data-yanked)
        self._href: str | None = None
        self._yanked: str | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            a = dict(attrs)
            self._href = a.get("href") or ""
            self._yanked = (a.get("data-yanked") or "") if "data-yanked" in a else None
            self._text = ""

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, self._text.strip(), self._yanked))
            self._href = None


def project_files(index: str, project: str) -> dict[str, tuple[str, str | None, int | None]]:
    """filename -> (absolute URL, sha256 or None, size or None) on the index's simple page."""
    return {name: (f.url, f.sha256, f.size) for name, f in project_page(index, project).items()}


def project_page(index: str, project: str) -> dict[str, IndexFile]:
    """filename -> :class:`IndexFile` on the index's simple page (yanked files included).

    The page is read under :data:`PAGE_LIMIT` and the transfer deadline; a
    page that is not the shape PEP 691 / PEP 503 says (a JSON ``[]``, files
    as a dict, a hash that is not 64 hex digits, a size that is not a
    non-negative integer) is a :class:`FetchError` naming the page, its
    credentials redacted.
    """
    page = f"{index.rstrip('/')}/{normalize(project)}/"
    shown = redact(page)
    deadline = time.monotonic() + transfer_timeout()
    try:
        with open_url(page, accept=_ACCEPT) as resp:
            ctype = resp.headers.get("Content-Type", "")
            body = b"".join(body_chunks(resp, limit=PAGE_LIMIT, deadline=deadline,
                                        label=f"the package index page {shown}"))
            base = resp.geturl()
    except FetchError:
        raise
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        raise FetchError(f"cannot query the package index at {shown}: "
                         f"{redact_reason(getattr(exc, 'reason', exc))}") from None
    if "json" in ctype:
        return _json_files(body, base, shown)
    parser = _Links()
    parser.feed(body.decode("utf-8", "replace"))
    files: dict[str, IndexFile] = {}
    for href, text, yanked in parser.links:
        url, _, frag = urllib.parse.urljoin(base, href).partition("#")
        name = text or PurePosixPath(urllib.parse.urlparse(url).path).name
        sha = frag[len("sha256="):] if frag.startswith("sha256=") else None
        if sha is not None and not _SHA256.match(sha):
            raise FetchError(f"{shown}: the link of {name!r} has sha256={sha[:80]!r}, not 64 hex digits; "
                             "the index page is not a PEP 503 page, fix the index or unset it")
        files[name] = IndexFile(url, sha.lower() if sha else None, None, yanked)
    return files


def redact_reason(reason: object) -> str:
    """An exception's text with any credentials in URLs in it redacted."""
    return redact_text(str(reason))


def _json_files(body: bytes, base: str, shown: str) -> dict[str, IndexFile]:
    """The files of a PEP 691 JSON page, each value type-checked (anything else is a FetchError)."""
    fix = "the index is not a PEP 691 index: fix it, or unset the setting that names it"
    data = loads_json(body, label=shown, limit=PAGE_LIMIT, error=FetchError)
    if not isinstance(data, dict):
        raise FetchError(f"{shown}: a PEP 691 page is a JSON object, this one is a {type(data).__name__}; {fix}")
    entries = data.get("files", [])
    if not isinstance(entries, list):
        raise FetchError(f"{shown}: \"files\" is a {type(entries).__name__}, not a list; {fix}")
    files: dict[str, IndexFile] = {}
    for i, f in enumerate(entries):
        if not isinstance(f, dict):
            raise FetchError(f"{shown}: files[{i}] is a {type(f).__name__}, not an object; {fix}")
        name, url = f.get("filename"), f.get("url")
        if not isinstance(name, str) or not isinstance(url, str):
            raise FetchError(f"{shown}: files[{i}] has no string \"filename\" and \"url\"; {fix}")
        hashes = f.get("hashes", {})
        if not isinstance(hashes, dict):
            raise FetchError(f"{shown}: {name!r} has \"hashes\" as a {type(hashes).__name__}, not an object; {fix}")
        sha = hashes.get("sha256")
        if sha is not None and not (isinstance(sha, str) and _SHA256.match(sha)):
            raise FetchError(f"{shown}: {name!r} has sha256 {str(sha)[:80]!r}, not 64 hex digits; {fix}")
        size = f.get("size")
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
            raise FetchError(f"{shown}: {name!r} has size {str(size)[:80]!r} ({type(size).__name__}), "
                             f"not a non-negative integer; {fix}")
        yanked = f.get("yanked", False)
        if not isinstance(yanked, (bool, str)):
            raise FetchError(f"{shown}: {name!r} has \"yanked\" {str(yanked)[:80]!r}, not a boolean or a "
                             f"string; {fix}")
        # PEP 691: true, or a non-empty string that is the reason; false (or "") is not yanked.
        reason = None if yanked is False or yanked == "" else (yanked if isinstance(yanked, str) else "")
        files[name] = IndexFile(urllib.parse.urljoin(base, url), sha.lower() if sha else None, size, reason)
    return files


def download_candidates(url: str, sha256: str, notes: list[str] | None = None) -> list[Candidate]:
    """Where to fetch the file the lock names by ``url`` and ``sha256``: the index first."""
    out: list[Candidate] = []
    filename = PurePosixPath(urllib.parse.urlparse(url).path).name if url else ""
    found = configured_index()
    project = project_of(filename) if filename else None
    if found and project:
        index, origin = found
        shown = redact(index)
        try:
            listed = project_files(index, project).get(filename)
        except FetchError as exc:
            listed = None
            if notes is not None:
                notes.append(str(exc))
        problem = http_url_problem(listed[0]) if listed else None
        if listed is not None and problem:
            if notes is not None:
                notes.append(f"the index {shown} links {filename} to {redact(listed[0])}, refused: {problem}")
        elif listed is None:
            if notes is not None:
                notes.append(f"{filename} is not on the index {shown} ({origin})")
        elif listed[1] and listed[1].lower() != sha256:
            if notes is not None:
                notes.append(f"the index {shown} lists {filename} with sha256 {listed[1]}, the lock "
                             f"pins {sha256}: not using the index's file")
        else:
            out.append(Candidate(listed[0], f"index {shown} ({origin})", index))
    if url and all(c.url != url for c in out):
        out.append(Candidate(url, "lock"))
    return out


def find_sdist(name: str, version: str) -> SdistInfo:
    index = index_url()
    filename = f"{name}-{version}.tar.gz"
    files = project_files(index, name)
    if filename not in files:
        prefix = f"{name}-"
        listed = sorted({f[len(prefix):-len(".tar.gz")] for f in files if f.startswith(prefix) and f.endswith(".tar.gz")})
        raise FetchError(f"{redact(index)}/{normalize(name)}/ has no release {version} (no sdist {filename})"
                         + did_you_mean([version], listed, most=3))
    if not files[filename][1]:
        raise FetchError(f"{redact(index)}/{normalize(name)}/ lists {filename} without a sha256: it cannot be verified")
    url, sha, size = files[filename]
    problem = http_url_problem(url)
    if problem:
        raise FetchError(f"{redact(index)}/{normalize(name)}/ links {filename} to {redact(url)}, "
                         f"refused: {problem}")
    # The lock records the URL without credentials (downloads go through the index first).
    parts = urllib.parse.urlsplit(url)
    url = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return SdistInfo(filename, url, str(sha), size)
