"""settings.py: the environment's defaults read once, into one record (issue 37)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

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


def test_the_command_line_takes_the_environment_as_it_is_when_the_command_runs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The edge: commands/_common.settings() reads os.environ at each run (no value kept from an earlier run)."""
    from dsv4patch.commands import _common

    monkeypatch.setenv("DSV4PATCH_VLLM_PYTHON", sys.executable)
    monkeypatch.setenv("DSV4PATCH_CACHE", str(tmp_path / "a"))
    assert _common.settings().vllm_python == sys.executable
    assert _common.settings().cache_root() == tmp_path / "a"
    monkeypatch.delenv("DSV4PATCH_VLLM_PYTHON")
    monkeypatch.setenv("DSV4PATCH_CACHE", str(tmp_path / "b"))
    assert _common.settings() == Settings.from_environ(os.environ)
    assert _common.settings().vllm_python is None and _common.settings().cache_root() == tmp_path / "b"


def test_an_option_wins_over_the_environment_which_wins_over_the_built_in(
        cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``status --installed`` (no lock here: the installed SBOM's check): --python, else
    $DSV4PATCH_VLLM_PYTHON, else the interpreter running dsv4patch, as before the settings moved."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DSV4PATCH_LOCK", raising=False)
    monkeypatch.setenv("DSV4PATCH_VLLM_PYTHON", str(tmp_path / "env-python"))
    res = cli("status", "--installed", "--python", tmp_path / "option-python")
    assert res.rc == 2 and f"--python {tmp_path / 'option-python'}: cannot run it" in res.err
    res = cli("status", "--installed")
    assert res.rc == 2 and f"--python {tmp_path / 'env-python'}: cannot run it" in res.err
    monkeypatch.delenv("DSV4PATCH_VLLM_PYTHON")
    res = cli("status", "--installed", "--format", "json")
    assert f'"python": "{sys.executable}"' in res.out  # no vLLM in the test environment: a report, not an error
