"""limits.py and commands/_common.number: every number a user gives is finite and in range."""

from __future__ import annotations

import argparse

import pytest

from dsv4patch import limits
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_USAGE, ParameterError


@pytest.mark.parametrize("raw", ["inf", "-inf", "nan", "NaN", "1e999", "", "abc", "0", "-1", "601", "0x10"])
def test_a_number_outside_its_range_or_not_finite_is_a_usage_error(raw):
    with pytest.raises(ParameterError) as err:
        limits.parse_number(raw, what="--deadline", low=0, high=600, example="60")
    assert err.value.exit_code == EXIT_USAGE and "--deadline" in str(err.value) and "e.g. 60" in str(err.value)


def test_numbers_in_range_pass():
    assert limits.parse_number(" 600 ", what="x", low=0, high=600) == 600
    assert limits.parse_number("0", what="x", low=0, high=1, low_inclusive=True) == 0
    assert limits.parse_number("2.5", what="x", low=0, high=3) == 2.5
    with pytest.raises(ParameterError):
        limits.parse_number("2.5", what="x", low=0, high=3, integer=True)
    assert limits.parse_number("2", what="x", low=0, high=3, integer=True) == 2


def test_an_environment_variable():
    """Variables are read by settings.Settings.from_environ through parse_number: unset is the default."""
    from dsv4patch.settings import Settings

    assert Settings.from_environ({}).git_timeout == 3600
    assert Settings.from_environ({"DSV4PATCH_GIT_TIMEOUT": " "}).git_timeout == 3600
    with pytest.raises(ParameterError, match="DSV4PATCH_GIT_TIMEOUT='inf'"):
        Settings.from_environ({"DSV4PATCH_GIT_TIMEOUT": "inf"})


def test_the_option_type_commands_share():
    p = argparse.ArgumentParser(exit_on_error=False)
    p.add_argument("--jobs", type=_common.number(low=0, high=64, integer=True))
    p.add_argument("--gib", type=_common.number(low=0, high=4096))
    assert p.parse_args(["--jobs", "4", "--gib", "1.5"]) == argparse.Namespace(jobs=4, gib=1.5)
    for bad in (["--gib", "inf"], ["--gib", "nan"], ["--jobs", "1.5"], ["--jobs", "65"]):
        with pytest.raises(argparse.ArgumentError):
            p.parse_args(bad)


@pytest.mark.parametrize("var,value", [("DSV4PATCH_LOCK_TIMEOUT", "inf"), ("DSV4PATCH_DOWNLOAD_TIMEOUT", "inf"),
                                       ("DSV4PATCH_DOWNLOAD_TIMEOUT", "nan"), ("DSV4PATCH_DOWNLOAD_MIN_RATE", "-1"),
                                       ("DSV4PATCH_DOWNLOAD_MIN_RATE", "inf")])
def test_the_bounds_in_the_environment_cannot_be_switched_off(tmp_path, cli, monkeypatch, var, value):
    """A download or a lock wait is never unbounded: `inf` and `nan` are refused (exit 2)."""
    from conftest import LOCK

    monkeypatch.setenv(var, value)
    res = cli("check", "--lock", LOCK, "--cache-dir", tmp_path / "c")
    assert res.rc == EXIT_USAGE and var in res.err
