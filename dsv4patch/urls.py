"""Which URLs dsv4patch may download from, and how they are shown.

Separate from index.py so that loading a lock (which checks its URLs) does
not import urllib.request, http.client and ssl: a warm ``check`` answered
from the result cache never needs them (issue 14).
"""

from __future__ import annotations

import re
import urllib.parse

_HTTP_SCHEMES = ("http", "https")
_SPACE_OR_CONTROL = re.compile(r"[\x00-\x20\x7f]")
_HOST = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9.-]*|\[[0-9A-Fa-f:.]+\])(?::\d{1,5})?$")


def http_url_problem(url: str) -> str | None:
    """Why ``url`` may not be downloaded from, or None if it may (http/https to a host name only).

    urllib would also open ``file:`` (any local file), ``ftp:`` and ``data:``
    URLs, so index settings, index pages and lock URLs pass through here.
    """
    if not url:
        return "it is empty"
    if _SPACE_OR_CONTROL.search(url):
        return "it contains spaces or control characters"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in _HTTP_SCHEMES:
        return f"scheme {parts.scheme or '(none)'!r} is not http or https"
    host = parts.netloc.rpartition("@")[2]
    if not _HOST.match(host):
        return f"host {host!r} is not a host name"
    return None


def redact(url: str) -> str:
    """``url`` with any ``user:password@`` replaced by ``***@`` (for messages and JSON)."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


# scheme://userinfo@ anywhere in a text (userinfo: no '/', '@' or whitespace)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]+@")


def redact_text(text: str) -> str:
    """``text`` with the ``user:password@`` of every URL in it replaced by ``***@``.

    The last line of defence: ``main`` passes every error message and JSON
    field through it, so a credential that reached a message (an exception's
    text quoting a URL, a note) is still never printed.
    """
    return _USERINFO.sub(r"\1***@", text)
