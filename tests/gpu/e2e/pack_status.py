#!/usr/bin/env python3
"""Pack what ``dsv4patch status --installed`` needs on the offline H200 machine.

Why this exists: ``status --installed`` compares an installed vLLM with the
lock's patched tree, which it recomputes from the cache (the lock's sdist
hash is the trust anchor), and on a machine with a GPU it asks the kernel
package whether its kernels are the ones torch's dispatcher runs.  That last
part can only run on a GPU.  The H200 machine has vLLM 0.26.0's sites once
``device.sh`` has built them, but neither dsv4patch's own dependencies nor the
0.26.0 sdist, and no network.  This script puts both under ``.e2e/status/``
(about 45 MiB; carry it in a call that carries nothing else large):

- ``cache/blobs/sha256/<hex>``: the 0.26.0 sdist, fetched by ``dsv4patch
  fetch`` into a fresh cache (so verified against the lock), blob only: the
  device makes the tree itself with its git;
- ``cli-site/``: dsv4patch's runtime dependencies (pure Python wheels), at the
  versions of the interpreter running this script.

``tests/gpu/e2e/status_installed.sh`` runs the command on the device.

Usage: python tests/gpu/e2e/pack_status.py [--out .e2e/status] [--pin 0.26.0]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from dsv4patch.lock import load
from dsv4patch.store import Store

ROOT = Path(__file__).resolve().parents[3]
# dsv4patch's runtime dependencies (pyproject.toml) and theirs, all pure Python.
CLI_DEPS = ("unidiff", "tomlkit", "rich", "markdown-it-py", "mdurl", "pygments")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".e2e" / "status")
    ap.add_argument("--pin", default="0.26.0")
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="fetch through this dsv4patch cache (default: a fresh temporary one)")
    args = ap.parse_args(argv)
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    (out / "cache").mkdir(parents=True)
    lock = load(ROOT / "locks" / "vllm.toml")
    sha = lock.pin(args.pin).source.sha256
    with tempfile.TemporaryDirectory(prefix="pack-status-") as tmp:
        cache = args.cache_dir or Path(tmp)
        subprocess.run([sys.executable, "-m", "dsv4patch", "fetch", "--pin", args.pin,
                        "--lock", str(ROOT / "locks" / "vllm.toml"), "--cache-dir", str(cache)],
                       check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        # the sdist alone (the device makes the tree): a pin's source blob is named by the lock's sha256
        blob = Store.open(cache).blob_path(sha)
        (out / "cache" / blob.parent.relative_to(cache)).mkdir(parents=True)
        shutil.copyfile(blob, out / "cache" / blob.relative_to(cache))
    reqs = [f"{name}=={metadata.version(name)}" for name in CLI_DEPS]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--only-binary=:all:", "--target", str(out / "cli-site"), *reqs], check=True)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{out}: {size / 2**20:.1f} MiB ({', '.join(reqs)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
