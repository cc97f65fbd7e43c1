"""The CPU test venv is shared between pins whose requirements agree (testenv.py).

0.27.1, 0.28.0 and 0.26.0 (with ``--torch 2.13.0``) have different
``requirements/common.txt`` files, but the venv built for 0.27.1 satisfies all
three: one venv build instead of three (each several minutes on a fresh machine).
"""

from __future__ import annotations

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
