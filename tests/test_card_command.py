"""The card's command as typed: ``dsv4patch apply --lock locks/vllm.toml`` and no other flag.

The tree goes to ``vllm-src/<pin>`` in the lock's project (printed), the lock is
found from the current directory upwards or from ``DSV4PATCH_LOCK``, so the tool
works from any subdirectory of a checkout.  Real git, the real 0.27.1 sdist
(cached).  On a terminal every step shows progress; off one, a line per step.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import LOCK, ROOT, pty_run
from dsv4patch.pins.lock import load

PATCHED = load(LOCK).pin("0.27.1").patched_tree


def _tree_id(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD^{tree}"], capture_output=True,
                          text=True, check=True).stdout.strip()


def _project(proj: Path) -> Path:
    """A copy of the checkout's lock and patches (what a user's clone has) at ``proj``."""
    shutil.copytree(ROOT / "locks", proj / "locks")
    shutil.copytree(ROOT / "patches", proj / "patches")
    return proj


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return _project(tmp_path / "proj")


def test_apply_without_tree_or_lock_from_a_subdirectory(cli, project: Path, shared_cache: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSV4PATCH_CACHE", str(shared_cache))
    monkeypatch.delenv("DSV4PATCH_LOCK", raising=False)
    sub = project / "a" / "b"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    res = cli("apply", "--no-build", "--format", "json")
    assert res.rc == 0, res.err
    rep = json.loads(res.out)
    # In the lock's project, as git finds its repository (issue 40), printed; nothing under the cwd.
    tree = project / "vllm-src" / "0.27.1"
    assert rep["tree"] == str(tree) and rep["lock"] == str(project / "locks" / "vllm.toml")
    assert any(n.startswith(f"tree: {tree} (the default for pin 0.27.1") for n in rep["notes"])
    assert not (sub / "vllm-src").exists()
    assert _tree_id(tree) == PATCHED
    again = cli("apply", "--no-build", "--python", sys.executable)  # the kernel build's options parse
    assert again.rc == 0 and "already has all patches" in again.out


def test_lock_from_environment_or_a_clear_error(cli, tmp_path: Path, shared_cache: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSV4PATCH_CACHE", str(shared_cache))
    monkeypatch.delenv("DSV4PATCH_LOCK", raising=False)
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    monkeypatch.chdir(empty)
    res = cli("check", "--pin", "0.27.1")
    assert res.rc == 2 and "no lock file" in res.err and "DSV4PATCH_LOCK" in res.err
    monkeypatch.setenv("DSV4PATCH_LOCK", str(LOCK))
    res = cli("check", "--pin", "0.27.1", "--format", "json")
    assert res.rc == 0, res.err
    assert json.loads(res.out)["pins"]["0.27.1"]["ok"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
                    reason="needs nvcc")
def test_the_card_command_as_typed_builds_the_kernels(cli, project: Path, shared_cache: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`dsv4patch apply --lock locks/vllm.toml` in an environment without torch (this test venv,
    as the README's install makes it): the tree and the kernel wheel, nothing else given. The
    pin's torch is installed by dsv4patch into the cache (toolchain.py); the table of what
    apply did is printed before the kernel step."""
    monkeypatch.delenv("DSV4PATCH_TORCH_PYTHON", raising=False)
    monkeypatch.setenv("DSV4PATCH_CACHE", str(shared_cache))
    monkeypatch.chdir(project)
    res = cli("apply", "--lock", "locks/vllm.toml")
    assert res.rc == 0, res.err[-3000:]
    assert _tree_id(project / "vllm-src" / "0.27.1") == PATCHED
    assert f"tree: {project / 'vllm-src' / '0.27.1'}" in res.out
    assert res.out.index("applied ") < res.out.index("toolchain: torch 2.13.0")
    wheels = list((project / "dist").glob("dsv4patch_kernels_0_27_1-*.whl"))
    assert len(wheels) == 1
    with zipfile.ZipFile(wheels[0]) as zf:
        info = json.loads(zf.read("dsv4patch_kernels_0_27_1/build_info.json"))
    assert info["torch_version"].split("+")[0] == "2.13.0" and not info["torch_mismatch"]


def test_the_card_command_shows_progress_at_least_every_5_s_on_a_terminal(tmp_path: Path, shared_cache: Path,
                                                                          disk_tmp_path: Path) -> None:
    """issue 40: the card command was silent for minutes. From a cache holding only the sdist (so the
    extraction, the git import, the check, the new tree and its commits all happen), on a terminal
    the screen changes at least every 5 s from start to end; piped, each step is one plain line.
    (The kernel build's own steps, the toolchain's pip and nvcc's units, are bars of the same
    display: tests/test_kernels.py builds; --no-build here keeps this test to the tree.)  The project and
    the cache are on the disk, as a user's are.  How long the run takes depends on the machine (6 s here
    on tmpfs, 8-11 s on the disk, 8.2 s on the project's CI): so no gap may be longer than a quarter of
    the run nor 5 s, which a display that changes only between steps fails on any machine (the sdist's
    git import alone is about a third of the run); a run under 2 s would prove nothing and fails."""
    project = _project(disk_tmp_path / "proj")
    pin = load(LOCK).pin("0.27.1")
    blobs = disk_tmp_path / "c" / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    shutil.copyfile(shared_cache / "blobs" / "sha256" / pin.source.sha256, blobs / pin.source.sha256)
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "LINES", "DSV4PATCH_LOCK")}
    env.update(TERM="xterm-256color", PYTHONPATH=str(ROOT), DSV4PATCH_CACHE=str(disk_tmp_path / "c"))
    rc, reads, total = pty_run(["apply", "--lock", "locks/vllm.toml", "--no-build"], project, env)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(d for _, d in reads).decode("utf-8", "replace"))
    assert rc == 0, text[-3000:]
    times = [0.0] + [t for t, _ in reads] + [total]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert total > 2 and max(gaps) <= min(5.0, total / 4), (total, max(gaps), text[-3000:])
    for step in ("extract vllm-0.27.1.tar.gz", "import 0.27.1 into git", "apply pin 0.27.1",
                 "check pin 0.27.1", "create "):
        assert step in text, (step, text[-3000:])
    assert _tree_id(project / "vllm-src" / "0.27.1") == PATCHED
    # Off a terminal (a CI log): one plain line per step on stderr, no escape codes, stdout the result.
    piped = subprocess.run([sys.executable, "-m", "dsv4patch", "apply", "--lock", "locks/vllm.toml", "--no-build",
                            "--tree", str(tmp_path / "second")], cwd=project, env=env, capture_output=True,
                           text=True)
    assert piped.returncode == 0, piped.stderr
    steps = piped.stderr.splitlines()
    assert "\x1b[" not in piped.stderr + piped.stdout and steps, piped.stderr
    assert all(line.startswith("dsv4patch: ") for line in steps), steps
    assert any(line.startswith("dsv4patch: apply pin 0.27.1 into ") for line in steps), steps
    assert "dsv4patch: " not in piped.stdout
