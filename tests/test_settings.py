"""settings.py: the environment's defaults read once, into one record (issue 37)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4patch import settings
from dsv4patch.errors import EXIT_USAGE, ParameterError
from dsv4patch.settings import Settings


def test_each_variable_lands_in_its_field() -> None:
    s = Settings.from_environ({
        "DSV4PATCH_TORCH_PYTHON": "/opt/torch/bin/python", "DSV4PATCH_VLLM_PYTHON": "/srv/vllm/bin/python",
        "DSV4PATCH_LOCK": "/etc/dsv4patch/vllm.toml", "DSV4PATCH_CACHE": "/var/cache/d4", "XDG_CACHE_HOME": "/x",
        "UNRELATED": "1",
    })
    assert s == Settings(torch_python="/opt/torch/bin/python", vllm_python="/srv/vllm/bin/python",
                         lock=Path("/etc/dsv4patch/vllm.toml"), cache=Path("/var/cache/d4"), xdg_cache_home=Path("/x"))
    assert s.cache_root() == Path("/var/cache/d4")  # DSV4PATCH_CACHE wins over XDG_CACHE_HOME


@pytest.mark.parametrize("empty", [{}, {"DSV4PATCH_TORCH_PYTHON": "", "DSV4PATCH_VLLM_PYTHON": "",
                                        "DSV4PATCH_LOCK": "", "DSV4PATCH_CACHE": "", "XDG_CACHE_HOME": ""}])
def test_unset_or_empty_is_no_setting(empty: dict[str, str]) -> None:
    """An empty variable is unset (``DSV4PATCH_LOCK= dsv4patch apply`` searches for the lock)."""
    assert Settings.from_environ(empty) == Settings()


def test_the_cache_root_falls_back_to_xdg_then_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert Settings.from_environ({"XDG_CACHE_HOME": "/xdg"}).cache_root() == Path("/xdg/dsv4patch")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert Settings.from_environ({}).cache_root() == tmp_path / ".cache" / "dsv4patch"


def test_the_bounds_are_read_validated_and_defaulted() -> None:
    s = Settings.from_environ({"DSV4PATCH_GIT_TIMEOUT": "5", "DSV4PATCH_DOWNLOAD_TIMEOUT": "7",
                               "DSV4PATCH_DOWNLOAD_MIN_RATE": "0", "DSV4PATCH_LOCK_TIMEOUT": "0", "NO_COLOR": "1"})
    assert (s.git_timeout, s.download_timeout, s.download_min_rate, s.lock_timeout, s.no_color) == (5, 7, 0, 0, True)
    d = Settings.from_environ({})
    assert (d.git_timeout, d.download_timeout, d.download_min_rate, d.lock_timeout, d.no_color) == \
        (3600, 1800, 1024, 600, False)
    assert d == Settings()


@pytest.mark.parametrize("var,value", [
    ("DSV4PATCH_GIT_TIMEOUT", "inf"), ("DSV4PATCH_GIT_TIMEOUT", "0"), ("DSV4PATCH_GIT_TIMEOUT", "86401"),
    ("DSV4PATCH_DOWNLOAD_TIMEOUT", "nan"), ("DSV4PATCH_DOWNLOAD_TIMEOUT", "0"),
    ("DSV4PATCH_DOWNLOAD_MIN_RATE", "-1"), ("DSV4PATCH_DOWNLOAD_MIN_RATE", "inf"),
    ("DSV4PATCH_LOCK_TIMEOUT", "abc"), ("DSV4PATCH_LOCK_TIMEOUT", ""), ("DSV4PATCH_LOCK_TIMEOUT", "-1")])
def test_a_bad_bound_is_a_usage_error_naming_the_variable(var: str, value: str) -> None:
    """The same messages as when each bound was read at its use: the variable, the range, an example.
    An empty DSV4PATCH_LOCK_TIMEOUT was always refused (the other bounds take an empty one as unset)."""
    with pytest.raises(ParameterError) as err:
        Settings.from_environ({var: value})
    assert err.value.exit_code == EXIT_USAGE and f"{var}={value!r}: must be" in str(err.value)
    assert "e.g. " in str(err.value)


def test_the_run_s_settings_are_in_effect_only_inside_the_block() -> None:
    outside = settings.active()
    mine = Settings(git_timeout=5.0)
    with settings.in_effect(mine):
        assert settings.active() is mine
        with settings.in_effect(Settings.for_output({"NO_COLOR": "1"})):
            assert settings.active().no_color and settings.active().git_timeout == 3600
        assert settings.active() is mine
    assert settings.active() is outside


def test_for_output_never_fails_on_a_bad_bound() -> None:
    """The error that reports a bad bound is itself shown under NO_COLOR."""
    assert Settings.for_output({"NO_COLOR": "1", "DSV4PATCH_GIT_TIMEOUT": "inf"}) == Settings(no_color=True)


@pytest.fixture
def git_lock(tmp_path: Path, upstream):
    from conftest import MINI_FILES, git_pin, write_lock

    d = tmp_path / "lock"
    d.mkdir()
    upstream.patch(d / "0001-a.patch", "a", {"vllm/envs.py": MINI_FILES["vllm/envs.py"] + "A = 1\n"}, "a")
    return write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": ["0001-a.patch"]})


def test_the_command_line_reads_the_environment_at_each_run(
        tmp_path: Path, cli, git_lock: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the CLI, as documented (README's exit codes, docs/trust.md's bounds): DSV4PATCH_GIT_TIMEOUT
    bounds every git call (a microsecond: the pin's clone is ended, exit 8 naming the variable), a bad value
    is exit 2, and each run reads the environment afresh (nothing kept from the run before)."""
    from dsv4patch.errors import EXIT_CHILD

    args = ("check", "--lock", git_lock, "--format", "json")
    monkeypatch.setenv("DSV4PATCH_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("DSV4PATCH_GIT_TIMEOUT", "0.000001")
    res = cli(*args)
    assert res.rc == EXIT_CHILD and "DSV4PATCH_GIT_TIMEOUT" in res.err, (res.rc, res.err)
    monkeypatch.setenv("DSV4PATCH_GIT_TIMEOUT", "inf")
    res = cli(*args)
    assert res.rc == EXIT_USAGE and "DSV4PATCH_GIT_TIMEOUT='inf'" in res.err, (res.rc, res.err)
    monkeypatch.delenv("DSV4PATCH_GIT_TIMEOUT")
    monkeypatch.setenv("DSV4PATCH_CACHE", str(tmp_path / "b"))
    res = cli(*args)
    assert res.rc == 0, res.err
    assert (tmp_path / "b" / "trees").is_dir()  # DSV4PATCH_CACHE of this run, not of the one before
    assert settings.active() == Settings()  # nothing of a run stays in effect after it
