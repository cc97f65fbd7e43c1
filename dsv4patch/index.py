"""Look up an sdist's download URL and size on a PyPI-compatible index.

Uses the JSON form of the simple API (PEP 691).  Only ``lock --update`` and
``port`` call this; ``check`` and ``apply`` download from the URL recorded in
the lock and never ask the index.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass

from dsv4patch.errors import FetchError

DEFAULT_INDEX = "https://pypi.org/simple"


@dataclass(frozen=True)
class SdistInfo:
    filename: str
    url: str
    sha256: str
    size: int | None


def index_url() -> str:
    return os.environ.get("DSV4PATCH_INDEX_URL", DEFAULT_INDEX).rstrip("/")


def find_sdist(name: str, version: str) -> SdistInfo:
    url = f"{index_url()}/{name}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310
            data = json.load(resp)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise FetchError(f"cannot query the package index at {url}: {exc}") from None
    filename = f"{name}-{version}.tar.gz"
    for f in data.get("files", []):
        if f.get("filename") == filename:
            return SdistInfo(filename, f["url"], f["hashes"]["sha256"], f.get("size"))
    raise FetchError(f"{url} has no sdist {filename}")
