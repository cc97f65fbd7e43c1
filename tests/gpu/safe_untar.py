"""Unpack a tar the GPU scripts carry (the self-test's payload, the kernel proof's tree) the same way on
every Python the device or a node may have.

Why this module: ``tarfile``'s ``filter="data"`` (Python 3.12, 3.11.4+ and the other security releases)
refuses members that leave the destination, links and devices, and drops special mode bits; Debian 12's
``python3`` (3.11.2) has no ``filter=`` and raised TypeError in the device script's first step (found
by the suite on that interpreter).  Where the filter is missing the refusals that matter for these plain
archives are made here, by hand: every member must be a regular file or a directory with a relative
name that stays inside; modes are masked to 0o755.  Used by ``selftest_h200.sh`` and
``run_vllm_binary_proof.py`` (both put this directory on ``sys.path``).
"""

from __future__ import annotations

import tarfile
from pathlib import Path, PurePosixPath


class UnsafeMember(Exception):
    """A member the data filter would refuse (raised where the filter itself is missing)."""


def extract(tar: tarfile.TarFile, dest: Path) -> None:
    """Every member of ``tar`` under ``dest``: the data filter where this Python has it, else its refusals."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
        return
    members = tar.getmembers()
    for m in members:
        parts = PurePosixPath(m.name).parts
        if m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir()):
            raise UnsafeMember(f"{m.name!r}: not a plain file or directory inside the archive")
        m.mode &= 0o755  # as the filter: no setuid/setgid/sticky bits, no group or other write
    tar.extractall(dest, members=members)
