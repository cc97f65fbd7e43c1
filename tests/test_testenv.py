"""The CPU test venv is shared between pins whose requirements agree (testenv.py).

0.27.1, 0.28.0 and 0.26.0 (with ``--torch 2.13.0``) have different
``requirements/common.txt`` files, but the venv built for 0.27.1 satisfies all
three: one venv build instead of three (each several minutes on a fresh machine).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import pin_requirements
from dsv4patch.proofs import testenv
from dsv4patch.store import Store

pytestmark = [pytest.mark.network, pytest.mark.slow]


def test_pins_whose_requirements_agree_share_one_venv(shared_cache: Path, tmp_path: Path) -> None:
    store = Store.open(shared_cache)
    t271 = pin_requirements("0.27.1", shared_cache, tmp_path / "t271")
    t280 = pin_requirements("0.28.0", shared_cache, tmp_path / "t280")
    t260 = pin_requirements("0.26.0", shared_cache, tmp_path / "t260")
    common = [(t / "requirements" / "common.txt").read_text() for t in (t271, t280, t260)]
    assert len(set(common)) == 3  # the requirements differ as text
    first = testenv.ensure(t271, store)
    assert testenv.ensure(t280, store).python == first.python
    assert testenv.ensure(t260, store, "2.13.0").python == first.python
    # A second lookup uses the recorded choice.
    assert testenv.ensure(t280, store).python == first.python


def test_a_venv_that_lacks_a_requirement_is_not_shared(shared_cache: Path, tmp_path: Path) -> None:
    store = Store.open(shared_cache)
    t271 = pin_requirements("0.27.1", shared_cache, tmp_path / "t271")
    env = testenv.ensure(t271, store)
    venvs = env.python.parent.parent.parent
    base = (env.python.parent.parent / ".base").read_text().strip()
    for extra in ("dsv4patch-no-such-package-xyz >= 1.0", "pytest < 1.0"):
        common = tmp_path / "common.txt"
        common.write_text((t271 / "requirements" / "common.txt").read_text() + extra + "\n")
        assert testenv._shared_venv(venvs, "test-" + "0" * 15, base, common) is None, extra
    # Another torch/Python/triton (another base) is never shared either.
    assert testenv._shared_venv(venvs, "test-" + "0" * 15, "0" * 20,
                                t271 / "requirements" / "common.txt") is None


def _pip_version(python: str) -> tuple[int, ...]:
    out = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True, check=True).stdout
    return tuple(int(x) for x in out.split()[1].split(".")[:2])


def _no_index(m: pytest.MonkeyPatch, empty: Path) -> None:
    """pip with no index, no find-links but an empty directory and no config files: nothing to be had."""
    m.setenv("PIP_NO_INDEX", "1")
    m.setenv("PIP_FIND_LINKS", str(empty))
    m.setenv("PIP_CONFIG_FILE", os.devnull)


def test_a_new_venv_gets_a_current_pip_where_the_index_has_one(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The venv's bundled pip is replaced by one of at least PIP_FLOOR from the index (3.11's
    pip 23.2 took twice the CPU of 25.1 on the test venv's install, issue 39); an index without
    one leaves the bundled pip, and the install goes on with it."""
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    bundled = _pip_version(py)
    floor = tuple(int(x) for x in testenv.PIP_FLOOR.split(">=")[1].split("."))
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    with monkeypatch.context() as m:  # no index at all: nothing newer to be had
        _no_index(m, empty)
        assert testenv._current_pip(py) is (bundled >= floor)
        assert _pip_version(py) == bundled
    assert testenv._current_pip(py) is True
    assert _pip_version(py) >= floor
    with monkeypatch.context() as m:  # now new enough: the index is not asked again
        _no_index(m, empty)
        assert testenv._current_pip(py) is True
