"""The Docker image's build args (and OCI label values), computed by dsv4patch itself.

The image carries the pin, vLLM version and commit, the patched tree id, the
patch-set hash and the lock's sha256 as labels.  They are passed as build
args (``docker build $(dsv4patch lock --build-args --pin P) .``) and the
image's first stage checks them against the lock with ``dsv4patch lock
--check-build-args``, so a label can never disagree with what was built.
One implementation: the patch-set hash is :meth:`Series.hash`, the same that
names the patched wheel.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING

from dsv4patch.errors import LockFileError
from dsv4patch.nextstep import Step, mention
from dsv4patch.pins import read_lock_bytes
from dsv4patch.series import series_for_pin

if TYPE_CHECKING:
    from dsv4patch.pins import Lock, Pin

BUILD_ARGS = ("VLLM_PIN", "VLLM_VERSION", "VLLM_COMMIT", "PATCHED_TREE", "PATCH_SET_SHA256",
              "LOCK_SHA256", "IMAGE_VERSION")


def compute(lock: Lock, pin: Pin) -> dict[str, str]:
    if not pin.patched_tree:
        raise LockFileError(f"{lock.path}: pin {pin.name} has no patched_tree (run "
                            f"`{mention(Step.of('lock', update=True))}`); an image needs it")
    patch_set = series_for_pin(lock, pin).hash()
    return {
        "VLLM_PIN": pin.name,
        "VLLM_VERSION": pin.vllm_version,
        "VLLM_COMMIT": pin.commit,
        "PATCHED_TREE": pin.patched_tree,
        "PATCH_SET_SHA256": patch_set,
        "LOCK_SHA256": hashlib.sha256(read_lock_bytes(lock.path)).hexdigest(),
        "IMAGE_VERSION": f"{pin.vllm_version}-dsv4.{patch_set[:12]}",
    }


def mismatches(want: dict[str, str], env: dict[str, str] | None = None) -> list[str]:
    env = dict(os.environ) if env is None else env
    return [f"{k}: build arg {env.get(k, '')!r}, lock says {want[k]!r}"
            for k in BUILD_ARGS if env.get(k, "") != want[k]]
