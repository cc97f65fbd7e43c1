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
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # an unbalanced '[' or ']' in the authority (a password holding one, say)
        return "its host is not a host name (a '[' or ']' in a user name or password must be percent-encoded)"
    if parts.scheme.lower() not in _HTTP_SCHEMES:
        return f"scheme {parts.scheme or '(none)'!r} is not http or https"
    userinfo, at, host = parts.netloc.rpartition("@")
    if not _HOST.match(host) or (not at and slashed_credential(url.partition("://")[2])):
        if not at and "@" in parts.path + parts.query + parts.fragment:
            # 'https://user:tok/en@host/', 'https://tok/en@host/': the authority ends at the token's '/',
            # so what urllib calls the host is (part of) the credential: never quoted
            return ("its host is not a host name, or its user name or password holds a '/', '?' or '#' "
                    "(percent-encode them: %2F, %3F, %23; an '@' in the path after a one-label host: %40)")
        return f"host {host!r} is not a host name"
    return None


def redact(url: str) -> str:
    """``url`` with any ``user:password@`` replaced by ``***@`` (for messages and JSON).

    An scp-like git URL (no ``//`` after its first ``:``) whose ``@`` comes after that ``:``
    (``user:pw@host:path``, a password) is shown from its last ``@`` on: ``***@host:path``.
    """
    head, colon, rest = url.partition(":")
    if colon and not rest.startswith("//") and "@" in rest and not {"/", "@"} & set(head):
        return "***@" + url.rpartition("@")[2]
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # an unbalanced '[' (in a password, say): redacted as text
        return redact_text(url)
    if "@" not in parts.netloc:
        return redact_text(url)  # a credential holding '/' ends urllib's netloc early
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


# scheme:// and the authority after it: up to the first '/', '?', '#' or whitespace
_AUTHORITY = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/?#\s]*)")
_WHITESPACE = re.compile(r"\s")


def redact_text(text: str) -> str:
    """``text`` with the ``user:password@`` of every URL in it replaced by ``***@``.

    The last line of defence: ``main`` passes every error message and JSON
    field through it, so a credential that reached a message (an exception's
    text quoting a URL, a note) is still never printed.

    What is hidden is everything from ``scheme://`` up to the *last* ``@`` of
    the authority (a password may hold an ``@``: ``https://u:p@ss@host`` is
    ``https://***@host``). A credential holding a ``/`` (``https://u:to/ken@host``)
    ends the authority early, at what is then no host name (``u:to``): when the
    authority has no ``@`` and is no ``host[:port]``, everything up to the last
    ``@`` of the URL (up to the next whitespace) is hidden. An scp-like git URL
    with a password (``user:pw@host:path``, which ``git_url_problem`` refuses) is
    shown as ``***@host:path`` (everything up to its last ``@`` before a host
    name); ``git@host:path`` (an ssh login, no password) is left as it is.
    An ``@`` outside a URL (``dave@example.com``) or in the path of a URL to a
    host (``https://host/a@b``) is left as it is.
    """
    out: list[str] = []
    pos = 0
    for m in _AUTHORITY.finditer(text):
        if m.start() < pos:  # inside what an earlier URL's redaction already hid
            continue
        authority = m.group(2)
        if "@" in authority:
            at = m.start(2) + authority.rindex("@")
        else:
            space = _WHITESPACE.search(text, m.end())
            end = space.start() if space else len(text)
            if not _HOST.match(authority):
                at = text.rfind("@", m.end(), end)
            else:
                at = _credential_end(text, m.end(), end, authority)
            if at < 0:
                continue
        out += [text[pos:m.start(2)], "***"]
        pos = at
    out.append(text[pos:])
    return _SCP_CREDENTIAL.sub(r"***@", "".join(out))


# A name after an '@' that can only be a host (a dotted name whose last label starts with a letter, localhost,
# an IPv4 or bracketed IPv6 address) and its port, ending where a host name ends (a path, a quote, the
# sentence's '.', the end): not a version ('pkg@1.0', 'r@v1.0').
_HOST_AFTER_AT = re.compile(r"@(?:(?:[A-Za-z0-9-]+\.)+[A-Za-z][A-Za-z0-9-]*|\d{1,3}(?:\.\d{1,3}){3}|localhost"
                            r"|\[[0-9A-Fa-f:.]+\])(?::\d{1,5})?(?![A-Za-z0-9-])", re.I)
_ONE_LABEL = re.compile(r"[A-Za-z0-9-]+")
_AUTHORITY_END = re.compile(r"[/?#\s]")


def _credential_end(text: str, start: int, end: int, authority: str) -> int:
    """The ``@`` that ends a credential holding a ``/`` whose first part looks like a host, or -1.

    ``https://tok/en@mirror.example/simple``: the authority ends at the token's ``/``, so urllib reads
    the host ``tok`` and the path ``/en@mirror.example/simple``.  Such a URL is read as a credential
    when what it calls the host is one label (no dot, no port, not ``localhost``: an index host is a
    dotted name, ``localhost`` or an IP address) and an ``@`` in ``text[start:end]`` (the rest of the
    URL) is followed by a host name and then a port, a path or the URL's end; the last such ``@``.
    ``https://host.example/a@b`` and pip's ``git+https://github.com/o/r@v1.0`` are left as they are;
    ``https://mirror/users/dave@example.com`` (a one-label host and an e-mail address in its path) is
    hidden too: a name too many is hidden rather than a token shown."""
    if not _ONE_LABEL.fullmatch(authority) or authority.lower() == "localhost":
        return -1
    at = text.rfind("@", start, end)
    while at >= 0 and not _HOST_AFTER_AT.match(text, at, end):
        at = text.rfind("@", start, at)
    return at


def slashed_credential(rest: str) -> bool:
    """Whether a URL whose part after ``scheme://`` is ``rest`` holds a credential with a ``/`` in it that
    ends its authority early and leaves a name that looks like a host (``tok/en@host.example/x``:
    :func:`_credential_end`).  Such a URL is refused wherever one is read (index, lock, git remote)."""
    cut = _AUTHORITY_END.search(rest)
    authority = rest[:cut.start()] if cut else rest
    return "@" not in authority and _credential_end(rest, len(authority), len(rest), authority) >= 0


# an scp-like git URL with a password, 'user:password@host:path' (no '//' after the first ':'), up to its
# last '@' before a host name; never inside a URL (after '/', ':', '@', '+') or a word
_SCP_CREDENTIAL = re.compile(r"(?<![\w.~%+/:@*-])[A-Za-z0-9._~%-]+:(?!//)\S*@(?=[A-Za-z0-9\[])")
