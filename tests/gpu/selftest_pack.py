#!/usr/bin/env python3
"""Pack what ``tests/gpu/selftest_h200.sh`` needs on the offline H200 machine, in device-call pieces.

Why this exists: the H200 machine has torch 2.11+cu130 and Python 3.12 but no
vLLM, no network, and a call carries at most 64 MiB.  ``dsv4patch wheel``
needs the pin's *stock* wheel byte for byte (the lock's sha256; 303,698,761
bytes for 0.26.0 x86_64) and the pin's sdist (the patched tree is recomputed
from it), and vLLM needs the Python packages the machine lacks (the old
harness's ``DEPS`` in ``tests/gpu/e2e/pack.py``, verified against
``tests/gpu/e2e/wheels.lock.json``).  So the payload is one tar of:

* ``vllm.whl``: the stock wheel as the lock pins it (deflated already: not
  recompressed; it must keep its sha256);
* ``rest.tar.xz``: the dependency wheels rewritten uncompressed (xz then
  shrinks their shared libraries; ``pack.restore_stored``, with the old
  harness's ``DEP_STRIP``), the sdist blob under ``cache/blobs/sha256/``,
  dsv4patch's pure-Python dependencies in ``cli-site/`` and, with
  ``--kernels``, a ``dsv4patch build`` kernel wheel (else the device builds
  one);

split into pieces of at most ``--piece-mib`` (``.selftest/part-NN.bin``) with
``.selftest/manifest.json`` (sha256 of each piece and of the payload).  One
device call per piece stages it; see docs/selftest.md.

Usage: python tests/gpu/selftest_pack.py [--out .selftest] [--cache-dir DIR]
       [--wheels-cache DIR] [--kernels WHEEL] [--piece-mib 56] [--xz-preset 6]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIN = "0.26.0"
# dsv4patch's runtime dependencies (pyproject.toml) and theirs, all pure Python (as pack_status.py).
CLI_DEPS = ("unidiff", "tomlkit", "rich", "markdown-it-py", "mdurl", "pygments")


def _pack_module():
    spec = importlib.util.spec_from_file_location("e2e_pack", ROOT / "tests" / "gpu" / "e2e" / "pack.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _add(tar: tarfile.TarFile, path: Path, arcname: str) -> None:
    info = tar.gettarinfo(str(path), arcname=arcname)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if info.isfile():
        with path.open("rb") as f:
            tar.addfile(info, f)
    else:
        tar.addfile(info)


def xz(src: Path, preset: int) -> Path:
    """SRC.xz: the xz binary on all cores when present (pack.py's preset 9 took most of an hour on a
    loaded 2-core machine for these 713 MB), else stdlib lzma."""
    dst = src.with_name(src.name + ".xz")
    if shutil.which("xz"):
        with dst.open("wb") as out:
            subprocess.run(["xz", f"-{preset}", "-T0", "-c", str(src)], stdout=out, check=True)
        return dst
    import lzma

    comp = lzma.LZMACompressor(preset=preset)
    with src.open("rb") as f, dst.open("wb") as out:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            out.write(comp.compress(chunk))
        out.write(comp.flush())
    return dst


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from dsv4patch.kernels import stock
    from dsv4patch.lock import load
    from dsv4patch.progress import Progress
    from dsv4patch.store import Store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".selftest")
    ap.add_argument("--cache-dir", type=Path, default=None, help="dsv4patch cache (default: $DSV4PATCH_CACHE, ...)")
    ap.add_argument("--wheels-cache", type=Path, default=Path("/work/cache/e2e-wheels"),
                    help="pip download cache of the dependency wheels (pack.py's --cache)")
    ap.add_argument("--kernels", type=Path, default=None, help="a dsv4patch build kernel wheel for the pin")
    ap.add_argument("--piece-mib", type=float, default=56.0,
                    help="piece size (a call carries one piece, the manifest and the repo: keep under ~60)")
    ap.add_argument("--xz-preset", type=int, default=6, choices=range(0, 10), metavar="0-9")
    args = ap.parse_args(argv)
    pack = _pack_module()
    lock = load(ROOT / "locks" / "vllm.toml")
    pin = lock.pin(PIN)
    store = Store.open(args.cache_dir)
    progress = Progress.for_output("text")
    wheel = stock.wheel_for(pin, "x86_64")
    wheel_blob = stock.wheel_path(store, wheel, progress)  # downloaded once, verified against the lock
    subprocess.run([sys.executable, "-m", "dsv4patch", "fetch", "--pin", PIN, "--lock", str(ROOT / "locks" / "vllm.toml"),
                    *(["--cache-dir", str(args.cache_dir)] if args.cache_dir else [])],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    sdist_blob = store.blob_path(pin.source.sha256)
    locked = {d["requirement"]: d for d in pack.load_lock().get("deps", [])}
    args.wheels_cache.mkdir(parents=True, exist_ok=True)
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="selftest-pack-") as tmp:
        work = Path(tmp)
        rest = work / "rest"
        (rest / "deps").mkdir(parents=True)
        deps = []
        for dep in pack.DEPS:
            path = pack.pip_download(dep.requirement, args.wheels_cache)
            old = locked.get(dep.requirement)
            if old is None or (old["filename"], old["sha256"]) != (path.name, sha256_file(path)):
                raise SystemExit(f"{path}: not the wheel tests/gpu/e2e/wheels.lock.json records for {dep.requirement}")
            pack.restore_stored(path, rest / "deps" / path.name, strip=True)
            deps.append(path.name)
        blob_rel = Path("cache") / sdist_blob.relative_to(store.root)
        (rest / blob_rel).parent.mkdir(parents=True)
        shutil.copyfile(sdist_blob, rest / blob_rel)
        reqs = [f"{name}=={metadata.version(name)}" for name in CLI_DEPS]
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--only-binary=:all:",
                        "--target", str(rest / "cli-site"), *reqs], check=True)
        if args.kernels is not None:
            (rest / "kernels").mkdir()
            shutil.copyfile(args.kernels, rest / "kernels" / args.kernels.name)
        rest_tar = work / "rest.tar"
        with tarfile.open(rest_tar, "w", format=tarfile.PAX_FORMAT) as tar:
            for p in sorted(rest.rglob("*")):
                _add(tar, p, str(p.relative_to(rest)))
        rest_xz = xz(rest_tar, args.xz_preset)
        payload = work / "payload.tar"
        with tarfile.open(payload, "w", format=tarfile.PAX_FORMAT) as tar:
            _add(tar, wheel_blob, "vllm.whl")
            _add(tar, rest_xz, "rest.tar.xz")
        total = payload.stat().st_size
        n = -(-total // int(args.piece_mib * 2**20))
        size = -(-total // n)  # balanced pieces
        parts = pack.write_parts(payload, out, size)
        manifest = {
            "pin": PIN, "payload_sha256": sha256_file(payload), "payload_size": total, "parts": parts,
            "stock_wheel": {"name": Path(wheel.url).name, "sha256": wheel.sha256, "size": wheel.size},
            "sdist": {"blob": str(blob_rel), "sha256": pin.source.sha256}, "deps": deps, "cli": reqs,
            "kernels": args.kernels.name if args.kernels is not None else None,
        }
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"{out}: {len(parts)} pieces of {size / 2**20:.1f} MiB (payload {total / 2**20:.1f} MiB; "
          f"rest.tar.xz with {len(deps)} dependency wheels)")
    for p in parts:
        print(f"  carry .selftest/manifest.json .selftest/{p['name']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
