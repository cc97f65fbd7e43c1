#!/usr/bin/env python3
"""Make the bundle ``run_vllm_binary_proof.py`` runs on a GPU machine, from what dsv4patch makes.

    python tests/gpu/make_bundle.py OUTDIR [--pin 0.27.1]

1. ``dsv4patch apply --pin P --tree OUTDIR/work/tree --out OUTDIR/work/dist``: the
   patched tree and, built from it by ``dsv4patch build``, the kernel wheel
   (set ``DSV4PATCH_TORCH_PYTHON`` to a Python with torch, as for ``build``);
2. the pin's stock x86_64 wheel from PyPI (lock: ``[pins.P.wheels]``), through
   dsv4patch's verified store; its ``vllm/_C_stable_libtorch.abi3.so`` is
   xz-compressed (about 54 MiB for 0.27.1, so it fits one device transfer);
3. the tree's ``vllm/`` package and its ``tests/kernels/test_dsv4_*`` tests as
   ``tree.tar.xz``; ``bundle.json`` names everything with sha256s.

The GPU machine needs nothing else but torch and pytest.
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from dsv4patch.hashing import hash_file  # noqa: E402
from dsv4patch.kernels import stock  # noqa: E402
from dsv4patch.pins.lock import load  # noqa: E402
from dsv4patch.settings import Settings  # noqa: E402
from dsv4patch.store import Store  # noqa: E402


def stock_library(store: Store, pin) -> tuple[Path, str, str]:
    """(xz-compressed stock library, its sha256 uncompressed, wheel file name), cached."""
    wheel = stock.wheel_for(pin, "x86_64")
    lib = stock.member(store, wheel)
    digest = hash_file(lib)
    out = store.root / "derived" / f"{digest}.so.xz"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        tmp.write_bytes(lzma.compress(lib.read_bytes(), preset=9 | lzma.PRESET_EXTREME))
        os.replace(tmp, out)
    return out, digest, Path(wheel.url).name


def tree_tar(tree: Path, wheel: Path, dest: Path) -> None:
    """The tree's vllm/ and fix-7 tests, plus the stock wheel's .dist-info (vLLM's platform
    detection reads its version from the installed metadata)."""
    members = [tree / "vllm", tree / "tests" / "__init__.py", tree / "tests" / "kernels" / "__init__.py",
               *sorted((tree / "tests" / "kernels").glob("test_dsv4_*.py"))]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for m in members:
            tf.add(m, arcname=str(m.relative_to(tree)),
                   filter=lambda ti: None if "__pycache__" in ti.name else ti)
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                top = name.split("/")[0]
                if top.endswith(".dist-info") and not name.endswith(("/RECORD", "/")):
                    data = zf.read(name)
                    ti = tarfile.TarInfo(f"distinfo/{name}")
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
    dest.write_bytes(lzma.compress(buf.getvalue(), preset=6))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--pin", default="0.27.1")
    ap.add_argument("--lock", type=Path, default=REPO / "locks" / "vllm.toml")
    args = ap.parse_args()
    out = args.outdir.resolve()
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    lock = load(args.lock)
    pin = lock.pin(args.pin)
    store = Store.open(Settings.from_environ(os.environ).cache_root())
    res = subprocess.run([sys.executable, "-m", "dsv4patch", "apply", "--lock", str(args.lock), "--pin",
                          pin.name, "--tree", str(work / "tree"), "--out", str(work / "dist"),
                          "--format", "json"], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"dsv4patch apply failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    applied = json.loads(res.stdout)
    wheel = next((work / "dist").glob("*.whl"))
    so_xz, so_sha, stock_wheel = stock_library(store, pin)
    shutil.copyfile(so_xz, out / "stock_C_stable_libtorch.abi3.so.xz")
    shutil.copyfile(wheel, out / wheel.name)
    tree_tar(work / "tree", stock.wheel_path(store, stock.wheel_for(pin, "x86_64")), out / "tree.tar.xz")
    with zipfile.ZipFile(wheel) as zf:
        dist = next(n.split("/")[0] for n in zf.namelist() if n.endswith("/build_info.json"))
        info = json.loads(zf.read(f"{dist}/build_info.json"))
    meta = {"pin": pin.name, "vllm_version": pin.vllm_version, "tree_id": info["tree_id"],
            "series": list(pin.series), "apply": {k: applied.get(k) for k in ("head", "tree_id")},
            "stock_wheel": stock_wheel, "stock_so_xz": "stock_C_stable_libtorch.abi3.so.xz",
            "stock_so_sha256": so_sha, "plugin_wheel": wheel.name, "plugin_dist": dist,
            "plugin_build_info": info, "tree_tar": "tree.tar.xz"}
    (out / "bundle.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(work)
    sizes = {p.name: p.stat().st_size for p in out.iterdir()}
    print(json.dumps({"bundle": str(out), "bytes": sizes, "total_mib": round(sum(sizes.values()) / 2**20, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
