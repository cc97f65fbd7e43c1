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
"""

from __future__ import annotations

import configparser
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath

from dsv4patch.errors import FetchError

DEFAULT_INDEX = "https://pypi.org/simple"
_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"


@dataclass(frozen=True)
class SdistInfo:
    filename: str
    url: str
    sha256: str
    size: int | None


@dataclass(frozen=True)
class Candidate:
    """A place to download a pinned file from, and why it is tried."""

    url: str
    origin: str  # "index <url> (<setting>)" or "lock"


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


def configured_index() -> tuple[str, str] | None:
    """(index URL, which setting gave it), or None when nothing is configured."""
    for var in ("DSV4PATCH_INDEX_URL", "PIP_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL"):
        value = os.environ.get(var, "").strip()
        if value:
            return value.split()[0], var
    return _from_pip_conf()


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
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href") or ""
            self._text = ""

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, self._text.strip()))
            self._href = None


def project_files(index: str, project: str) -> dict[str, tuple[str, str | None, int | None]]:
    """filename -> (absolute URL, sha256 or None, size or None) on the index's simple page."""
    page = f"{index.rstrip('/')}/{normalize(project)}/"
    req = urllib.request.Request(page, headers={"Accept": _ACCEPT})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 (the user's index)
            ctype = resp.headers.get("Content-Type", "")
            body = resp.read()
            base = resp.geturl()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise FetchError(f"cannot query the package index at {page}: {getattr(exc, 'reason', exc)}") from None
    files: dict[str, tuple[str, str | None, int | None]] = {}
    if "json" in ctype:
        try:
            data = json.loads(body)
        except ValueError:
            raise FetchError(f"{page}: not a PEP 691 JSON page") from None
        for f in data.get("files", []):
            name, url = f.get("filename"), f.get("url")
            if isinstance(name, str) and isinstance(url, str):
                files[name] = (urllib.parse.urljoin(base, url), (f.get("hashes") or {}).get("sha256"),
                               f.get("size"))
        return files
    parser = _Links()
    parser.feed(body.decode("utf-8", "replace"))
    for href, text in parser.links:
        url, _, frag = urllib.parse.urljoin(base, href).partition("#")
        name = text or PurePosixPath(urllib.parse.urlparse(url).path).name
        sha = frag[len("sha256="):] if frag.startswith("sha256=") else None
        files[name] = (url, sha, None)
    return files


def download_candidates(url: str, sha256: str, notes: list[str] | None = None) -> list[Candidate]:
    """Where to fetch the file the lock names by ``url`` and ``sha256``: the index first."""
    out: list[Candidate] = []
    filename = PurePosixPath(urllib.parse.urlparse(url).path).name if url else ""
    found = configured_index()
    project = project_of(filename) if filename else None
    if found and project:
        index, origin = found
        try:
            listed = project_files(index, project).get(filename)
        except FetchError as exc:
            listed = None
            if notes is not None:
                notes.append(str(exc))
        if listed is None:
            if notes is not None:
                notes.append(f"{filename} is not on the index {index} ({origin})")
        elif listed[1] and listed[1].lower() != sha256:
            if notes is not None:
                notes.append(f"the index {index} lists {filename} with sha256 {listed[1]}, the lock "
                             f"pins {sha256}: not using the index's file")
        else:
            out.append(Candidate(listed[0], f"index {index} ({origin})"))
    if url and all(c.url != url for c in out):
        out.append(Candidate(url, "lock"))
    return out


def find_sdist(name: str, version: str) -> SdistInfo:
    index = index_url()
    filename = f"{name}-{version}.tar.gz"
    files = project_files(index, name)
    if filename not in files or not files[filename][1]:
        raise FetchError(f"{index}/{normalize(name)}/ has no sdist {filename} with a sha256")
    url, sha, size = files[filename]
    return SdistInfo(filename, url, str(sha), size)
