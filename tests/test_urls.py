"""urls.py: which URLs may be downloaded from, and credentials never shown (checked against urllib's own
parsing, not against the module's regexes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dsv4patch import urls


@pytest.mark.parametrize("url", [
    "https://pypi.org/simple/vllm/",
    "http://127.0.0.1:8080/simple/",
    "https://user:secret@mirror.example.com/simple/",
    "https://[::1]:3141/root/pypi/",
    "HTTPS://files.pythonhosted.org/packages/x.tar.gz",
])
def test_http_urls_to_a_host_may_be_downloaded(url: str) -> None:
    assert urls.http_url_problem(url) is None


@pytest.mark.parametrize(("url", "why"), [
    ("", "empty"),
    ("file:///etc/passwd", "scheme 'file'"),
    ("ftp://example.com/x", "scheme 'ftp'"),
    ("data:text/plain,hi", "scheme 'data'"),
    ("/simple/vllm/", "scheme '(none)'"),
    ("https://exa mple.com/", "spaces or control"),
    ("https://example.com/\x00", "spaces or control"),
    ("https://example.com\r\nHost: evil/", "spaces or control"),
    ("https:///etc/passwd", "not a host name"),
    ("https://-x.example.com/", "not a host name"),
    ("https://example.com:99999999/", "not a host name"),
    ("https://user@/path", "not a host name"),
])
def test_other_urls_are_refused_with_the_reason(url: str, why: str) -> None:
    problem = urls.http_url_problem(url)
    assert problem is not None and why in problem


def test_redact_hides_userinfo_and_keeps_the_rest() -> None:
    assert urls.redact("https://alice:s3cret@mirror.example.com:8443/simple/?x=1") \
        == "https://***@mirror.example.com:8443/simple/?x=1"
    assert urls.redact("https://token@host/") == "https://***@host/"
    assert urls.redact("https://host/a@b") == "https://host/a@b"  # an @ in the path is not userinfo
    assert urls.redact("https://pypi.org/simple/") == "https://pypi.org/simple/"


def test_redact_text_hides_every_credential_in_a_message() -> None:
    text = ("fetching https://alice:s3cret@a.example/x failed; retried git+ssh://bob:pw@b.example/repo.git "
            "and HTTP://carol@C.example; mail me at dave@example.com")
    out = urls.redact_text(text)
    for secret in ("alice", "s3cret", "bob:pw", "carol"):
        assert secret not in out
    assert "https://***@a.example/x" in out and "git+ssh://***@b.example/repo.git" in out
    assert "HTTP://***@C.example" in out
    assert "dave@example.com" in out  # not a URL: left as it is


def test_checking_a_url_imports_no_network_module() -> None:
    """Loading a lock checks its URLs; a warm check must not pay for urllib.request, http.client or ssl."""
    code = ("import sys\nfrom dsv4patch import urls\nurls.http_url_problem('https://pypi.org/simple/')\n"
            "print(sorted({'urllib.request', 'http.client', 'ssl'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
