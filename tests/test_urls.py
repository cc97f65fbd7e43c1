"""urls.py: which URLs may be downloaded from, and credentials never shown (checked against urllib's own
parsing, not against the module's regexes)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import LOCK, pin_table, write_lock
from dsv4patch import urls
from dsv4patch.errors import EXIT_INPUT, EXIT_USAGE
from dsv4patch.pins.lock import git_url_problem


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


# --- credentials in messages: a password holding '@', a token holding '/', git URLs (D5) -----------

SECRET = "SECRETpw"


def test_redact_text_hides_a_password_that_holds_at_signs_and_a_token_that_holds_slashes() -> None:
    assert urls.redact_text(f"got https://user:p@ss@{SECRET}@host.example/x.") == "got https://***@host.example/x."
    assert urls.redact_text(f"'https://user:{SECRET}/x@host.example/simple' is refused; mail a@b.example") \
        == "'https://***@host.example/simple' is refused; mail a@b.example"
    assert urls.redact_text(f"https://u_{SECRET}/tok@host.example/") == "https://***@host.example/"
    # not credentials: an '@' in the path of a URL to a host, a pip-style git URL, an e-mail address
    for text in ("https://host.example/a@b and https://h.example:8443/x@y", "git+https://github.com/o/r@v1.0",
                 "From: Dave <dave@example.com>", "see https://pypi.org/simple, or mail x@y.example"):
        assert urls.redact_text(text) == text


def test_a_token_holding_a_slash_before_a_one_label_name_is_read_as_a_credential() -> None:
    """``https://TOKEN/x@host.example/``: the token's '/' ends the authority, so urllib reads the host
    ``TOKEN``; a one-label "host" followed by an '@' and a host name is read as a credential (hidden,
    refused), a dotted host, ``localhost`` or an '@' not followed by a host name is not."""
    for text, shown in [(f"got https://{SECRET}/x@host.example/simple.", "got https://***@host.example/simple."),
                        (f"--index-url https://{SECRET}/a/b@mirror.example:8443/simple vllm",
                         "--index-url https://***@mirror.example:8443/simple vllm"),
                        (f"https://{SECRET}/x@localhost:3141/root", "https://***@localhost:3141/root"),
                        (f"https://{SECRET}/x@[::1]/simple a@b", "https://***@[::1]/simple a@b"),
                        (f"https://{SECRET}/x@10.0.0.7:8080/simple", "https://***@10.0.0.7:8080/simple"),
                        (f"'https://{SECRET}/x@host.example' is refused", "'https://***@host.example' is refused"),
                        (f"cannot reach https://{SECRET}/x@host.example.", "cannot reach https://***@host.example."),
                        (f"https://{SECRET}/x@host.example/a@b", "https://***@host.example/a@b")]:
        assert urls.redact_text(text) == shown, text
    # not credentials: a dotted host or localhost with an '@' in its path (pip's git URL with a ref),
    # a one-label host whose path's '@' is followed by no host name
    for text in ("https://host.example/a@b.example/c", "git+https://github.com/o/r@v1.0",
                 "http://localhost/x@y.example", "https://mirror/pkg@1.0", "https://mirror/r@v1.0",
                 "https://mirror/simple"):
        assert urls.redact_text(text) == text and urls.redact(text) == text, text
        assert not urls.slashed_credential(text.partition("://")[2]), text
    assert urls.http_url_problem("https://mirror/pkg@1.0") is None


@pytest.mark.parametrize("url", [f"https://user:p@ss@{SECRET}@host.example/x",
                                 f"https://user:{SECRET}/x@host.example/simple",
                                 f"https://{SECRET}/x@host.example/simple",
                                 f"https://user:p[{SECRET}@host.example/simple"])
def test_a_url_with_a_credential_is_judged_and_shown_without_it(url: str) -> None:
    assert SECRET not in urls.redact(url) and urls.redact(url).startswith("https://***@host.example/")
    problem = urls.http_url_problem(url)  # no exception for an unbalanced '['
    assert problem is None or SECRET not in problem
    git_problem = git_url_problem(url)
    assert git_problem is not None and SECRET not in git_problem


@pytest.mark.parametrize("url", [f"https://user:{SECRET}@host.example/vllm.git",
                                 f"ssh://user:{SECRET}@host.example/vllm.git",
                                 f"https://user:p@ss@{SECRET}@host.example/vllm.git",
                                 f"https://user:{SECRET}/x@host.example/vllm.git",
                                 f"https://{SECRET}/x@host.example/vllm.git"])
def test_a_git_url_with_a_password_is_refused_without_printing_it(url: str) -> None:
    problem = git_url_problem(url)
    assert problem is not None and SECRET not in problem and "host.example" not in problem
    assert git_url_problem("https://git@host.example/vllm.git") is None  # a user name alone is fine
    assert git_url_problem("ssh://git@host.example:2222/vllm.git") is None


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("url", [f"https://user:{SECRET}@nonexistent.invalid/vllm.git",
                                 f"ssh://user:{SECRET}@nonexistent.invalid/vllm.git",
                                 f"https://user:p@ss@{SECRET}@nonexistent.invalid/vllm.git",
                                 f"https://user:{SECRET}/x@nonexistent.invalid/vllm.git",
                                 f"https://{SECRET}/x@nonexistent.invalid/vllm.git"])
def test_check_of_a_git_pin_with_a_password_never_prints_it(tmp_path, cli, url: str, fmt: str) -> None:
    lock = write_lock(tmp_path / "vllm.toml", {"p": pin_table("p", "0" * 40, {"kind": "git", "url": url})})
    res = cli("check", "--pin", "p", "--lock", lock, "--cache-dir", tmp_path / "cache", "--format", fmt)
    assert res.rc == EXIT_INPUT, res.err
    assert SECRET not in res.out + res.err
    shown = json.loads(res.out)["error"]["message"] if fmt == "json" else res.err
    assert "***@nonexistent.invalid/vllm.git" in shown and "is refused" in shown


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_port_from_a_git_url_with_a_password_never_prints_it(tmp_path, cli, fmt: str) -> None:
    res = cli("port", "--lock", LOCK, "--cache-dir", tmp_path / "cache", "--from", "0.27.1", "--to", "0" * 40,
              "--git", f"https://user:p@ss@{SECRET}@nonexistent.invalid/vllm.git", "--format", fmt)
    assert res.rc == EXIT_INPUT, res.err
    assert SECRET not in res.out + res.err
    assert "***@nonexistent.invalid" in (json.loads(res.out)["error"]["message"] if fmt == "json" else res.err)


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("url", [f"https://user:{SECRET}/x@nonexistent.invalid/simple",
                                 f"https://{SECRET}/x@nonexistent.invalid/simple",
                                 f"https://user:p[{SECRET}@nonexistent.invalid/simple",
                                 f"https://user:p@ss@{SECRET}@nonexistent.invalid:99999999/simple"])
def test_releases_with_an_index_credential_never_prints_it(tmp_path, cli, monkeypatch, url: str,
                                                           fmt: str) -> None:
    for var in ("PIP_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("DSV4PATCH_INDEX_URL", url)
    res = cli("releases", "--lock", LOCK, "--cache-dir", tmp_path / "cache", "--format", fmt)
    assert res.rc == EXIT_USAGE, res.err
    assert SECRET not in res.out + res.err
    shown = json.loads(res.out)["error"]["message"] if fmt == "json" else res.err
    assert "DSV4PATCH_INDEX_URL = 'https://***@nonexistent.invalid" in shown and "is refused" in shown


# --- scp-like git URLs with a password: 'user:pw@host:path' (git reads the host as 'user') -----------

SCP_WITH_PASSWORD = [f"user:{SECRET}@nonexistent.invalid:org/vllm.git",      # the plain form
                     f"user:p@ss:{SECRET}@nonexistent.invalid:org/vllm.git",  # a password holding '@' and ':'
                     f"user:{SECRET}/x@nonexistent.invalid:org/vllm.git",     # ... and '/'
                     f"user:{SECRET}@nonexistent.invalid"]                    # no path


@pytest.mark.parametrize("url", SCP_WITH_PASSWORD)
def test_an_scp_like_git_url_with_a_password_is_refused_and_shown_without_it(url: str) -> None:
    problem = git_url_problem(url)
    assert problem is not None and "password" in problem and SECRET not in problem
    assert urls.redact(url).startswith("***@nonexistent.invalid") and SECRET not in urls.redact(url)
    assert SECRET not in urls.redact_text(f"pin p: cannot fetch from {url}: ssh: Could not resolve hostname user")
    # ordinary scp-like URLs: a login name is no password, an '@' in the path after one is the path's
    for ok in ("git@github.com:vllm-project/vllm.git", "github.com:vllm-project/vllm.git",
               "git@host.example:org/a@b.git"):
        assert git_url_problem(ok) is None and urls.redact(ok) == ok and urls.redact_text(ok) == ok


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("url", SCP_WITH_PASSWORD)
def test_check_of_a_git_pin_with_an_scp_like_password_never_prints_it(tmp_path, cli, url: str, fmt: str) -> None:
    """Before: the URL passed (git's host being 'user'), ssh was run, and the password was printed in the
    progress line, the table's note and the JSON (exit 4); now it is refused (exit 3) before any git runs."""
    lock = write_lock(tmp_path / "vllm.toml", {"p": pin_table("p", "0" * 40, {"kind": "git", "url": url})})
    res = cli("check", "--pin", "p", "--lock", lock, "--cache-dir", tmp_path / "cache", "--format", fmt)
    assert res.rc == EXIT_INPUT, res.out + res.err
    assert SECRET not in res.out + res.err
    shown = json.loads(res.out)["error"]["message"] if fmt == "json" else res.err
    assert "pins.\"p\"" in shown and "'***@nonexistent.invalid" in shown and "is refused" in shown
    assert "ssh key" in shown and "credential helper" in shown


def test_port_from_an_scp_like_git_url_with_a_password_never_prints_it(tmp_path, cli) -> None:
    res = cli("port", "--lock", LOCK, "--cache-dir", tmp_path / "cache", "--from", "0.27.1", "--to", "0" * 40,
              "--git", SCP_WITH_PASSWORD[1], "--format", "json")
    assert res.rc == EXIT_INPUT, res.err
    assert SECRET not in res.out + res.err
    assert "'***@nonexistent.invalid:org/vllm.git' is refused" in json.loads(res.out)["error"]["message"]
