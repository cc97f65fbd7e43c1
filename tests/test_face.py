"""face.py: a package's public face resolves each name on first use, once, and nothing else."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from dsv4patch import face


def test_a_name_is_loaded_on_first_use_and_then_a_plain_global() -> None:
    ns: dict[str, object] = {}
    getter = face.lazy("dsv4patch", ns, {"sha": "hashing:sha256", "Raw": "zipcopy:Raw"})
    from dsv4patch import hashing, zipcopy

    assert getter("sha") is hashing.sha256
    assert ns["sha"] is hashing.sha256  # cached in the package namespace: __getattr__ is not called again
    assert getter("Raw") is zipcopy.Raw
    with pytest.raises(AttributeError, match="has no attribute 'missing'"):
        getter("missing")


def test_a_face_entry_that_points_nowhere_fails_loudly() -> None:
    getter = face.lazy("dsv4patch", {}, {"gone": "hashing:no_such_name", "nomod": "no_such_module:x"})
    with pytest.raises(AttributeError):
        getter("gone")
    with pytest.raises(ModuleNotFoundError):
        getter("nomod")


def test_importing_a_real_face_loads_no_module_behind_it_until_a_name_is_used() -> None:
    code = ("import sys\nimport dsv4patch.kernels as k\n"
            "before = 'dsv4patch.kernels.identity' in sys.modules\n"
            "k.kernel_dist_name\n"
            "print(before, 'dsv4patch.kernels.identity' in sys.modules, 'dsv4patch.kernels.build' in sys.modules, "
            "'dsv4patch.kernels.toolchain' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "False", "False"]  # the name's module alone, not the build beside it


def test_every_face_resolves_every_name_it_lists() -> None:
    import importlib

    for package in ("pins", "series", "kernels", "checkout", "forks", "delivery", "proofs"):
        mod = importlib.import_module(f"dsv4patch.{package}")
        assert isinstance(mod, types.ModuleType)
        for name in mod.FACE:
            assert getattr(mod, name) is not None, f"dsv4patch.{package}.{name}"


def test_a_module_loaded_on_first_use_is_in_importtimes_report() -> None:
    """``python -X importtime`` (what the start-up benchmark reads, issue 39) reports a module a face loads on
    first use, and a command module ``main`` loads: importlib.import_module's path is invisible to it, which
    left ``pins/lock.py`` and ``commands/check.py`` out of ``check``'s start-up."""
    code = "import dsv4patch.pins as p\np.DEFAULT_LOCK\nimport dsv4patch.main as m\nm.build_parser('check')"
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                         check=True).stderr
    reported = {line.rsplit("|", 1)[-1].strip() for line in err.splitlines() if line.startswith("import time:")}
    assert {"dsv4patch.pins.lock", "dsv4patch.commands.check"} <= reported, sorted(reported)
