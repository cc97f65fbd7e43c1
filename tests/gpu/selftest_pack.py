#!/usr/bin/env python3
"""Pack what ``tests/gpu/selftest_h200.sh`` needs on the offline H200 machine, in device-call pieces: one command.

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
  harness's ``DEP_STRIP``) and py-spy's wheel (the hang probe's native
  stacks) under ``deps/``; the sdist blob under ``cache/blobs/sha256/``;
  dsv4patch's own runtime dependencies with everything they need, for
  CPython 3.12 on manylinux x86_64 (``pip download`` of the requirements this
  checkout's dsv4patch declares, resolved for that target: complete by
  construction, and checked by importing the whole CLI from them alone)
  under ``cli/``; and the kernel wheel ``dsv4patch apply --pin 0.26.0``
  builds here with the pin's own toolchain (torch 2.11.0 from the lock),
  or ``--kernels WHEEL``, under ``kernels/``;

split into pieces of at most ``--piece-mib`` (``.selftest/part-NN.bin``) with
``.selftest/manifest.json`` (sha256 of each piece and of the payload).  One
device call per piece stages it; see docs/selftest.md.

Usage: python tests/gpu/selftest_pack.py [--out .selftest] [--cache-dir DIR]
       [--wheels-cache DIR] [--kernels WHEEL] [--piece-mib 60] [--xz-preset 6]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIN = "0.26.0"
DEVICE_PYTHON = "3.12"
DEVICE_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64",
                    "manylinux1_x86_64")
PY_SPY = "py-spy==0.4.3"  # the hang probe's native stacks (a static binary in a py2.py3 wheel)


def cli_requirements() -> list[str]:
    """dsv4patch's runtime requirements as this checkout declares them (markers kept: pip evaluates them
    for the device's Python), pinned to the versions installed here where they are installed."""
    out = []
    for req in metadata.requires("dsv4patch") or []:
        if "extra ==" in req:
            continue
        name = req.split(";")[0].split("[")[0]
        for op in "<>=!~ ":
            name = name.split(op)[0]
        marker = req.split(";", 1)[1].strip() if ";" in req else ""
        try:
            pinned = f"{name}=={metadata.version(name)}"
        except metadata.PackageNotFoundError:
            pinned = req.split(";")[0].strip()
        out.append(f"{pinned}; {marker}" if marker else pinned)
    return out


def download_for_device(reqs: list[str], dest: Path, *, deps: bool) -> list[Path]:
    """``pip download`` of REQS (and, with DEPS, everything they need) as the device's CPython 3.12 takes them."""
    dest.mkdir(parents=True, exist_ok=True)
    plat = [x for p in DEVICE_PLATFORMS for x in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version",
                    DEVICE_PYTHON, "--implementation", "cp", *plat, *([] if deps else ["--no-deps"]),
                    "-d", str(dest), *reqs], check=True)
    return sorted(dest.glob("*.whl"))


def check_cli(wheels: list[Path], work: Path) -> None:
    """The whole CLI imports from these wheels alone (no site-packages): the pack's dependencies are complete."""
    site = work / "cli-check"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(site), *map(str, wheels)], check=True)
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
            "import dsv4patch.main, dsv4patch.delivery.sbom, dsv4patch.delivery.vllm_wheel, dsv4patch.delivery.installed, "
            "dsv4patch.proofs.selftest.runner, dsv4patch.commands.wheel, dsv4patch.commands.selftest\n"
            "print('cli ok')")
    res = subprocess.run([sys.executable, "-S", "-E", "-c", code, str(site), str(ROOT)], capture_output=True,
                         text=True)
    if res.returncode != 0:
        raise SystemExit(f"the packed CLI dependencies are incomplete: {res.stderr.strip().splitlines()[-1]}")


def build_kernels(work: Path, cache_dir: Path | None) -> Path:
    """The pin's kernel wheel, built here by the product (``dsv4patch apply``) with the pin's own toolchain."""
    dist = work / "kernels-dist"
    subprocess.run([sys.executable, "-m", "dsv4patch", "apply", "--lock", str(ROOT / "locks" / "vllm.toml"), "--pin",
                    PIN, "--tree", str(work / "tree"), "--out", str(dist),
                    *(["--cache-dir", str(cache_dir)] if cache_dir else [])], check=True, cwd=ROOT)
    wheels = sorted(dist.glob("dsv4patch_kernels_*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"dsv4patch apply --pin {PIN} made {len(wheels)} kernel wheels in {dist}")
    return wheels[0]


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
    from dsv4patch.pins.lock import load
    from dsv4patch.progress import Progress
    from dsv4patch.settings import Settings
    from dsv4patch.store import Store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".selftest")
    ap.add_argument("--cache-dir", type=Path, default=None, help="dsv4patch cache (default: $DSV4PATCH_CACHE, ...)")
    ap.add_argument("--wheels-cache", type=Path, default=Path("/work/cache/e2e-wheels"),
                    help="pip download cache of the dependency wheels (pack.py's --cache)")
    ap.add_argument("--kernels", type=Path, default=None,
                    help="the pin's kernel wheel (default: `dsv4patch apply --pin 0.26.0` builds it here)")
    ap.add_argument("--piece-mib", type=float, default=60.0,
                    help="piece size (a call carries one piece, the manifest and the repo: keep under ~60)")
    ap.add_argument("--xz-preset", type=int, default=6, choices=range(0, 10), metavar="0-9")
    args = ap.parse_args(argv)
    pack = _pack_module()
    lock = load(ROOT / "locks" / "vllm.toml")
    pin = lock.pin(PIN)
    store = Store.open(args.cache_dir or Settings.from_environ(os.environ).cache_root())
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
        for spy in download_for_device([PY_SPY], work / "py-spy", deps=False):
            shutil.copyfile(spy, rest / "deps" / spy.name)
            deps.append(spy.name)
        blob_rel = Path("cache") / sdist_blob.relative_to(store.root)
        (rest / blob_rel).parent.mkdir(parents=True)
        shutil.copyfile(sdist_blob, rest / blob_rel)
        reqs = cli_requirements()
        cli = download_for_device(reqs, rest / "cli", deps=True)
        check_cli(cli, work)
        kernels = args.kernels or build_kernels(work, args.cache_dir)
        (rest / "kernels").mkdir()
        shutil.copyfile(kernels, rest / "kernels" / kernels.name)
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
            "sdist": {"blob": str(blob_rel), "sha256": pin.source.sha256}, "deps": deps,
            "cli": [w.name for w in cli], "cli_requirements": reqs, "kernels": kernels.name,
        }
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"{out}: {len(parts)} pieces of {size / 2**20:.1f} MiB (payload {total / 2**20:.1f} MiB; "
          f"rest.tar.xz with {len(deps)} dependency wheels)")
    for p in parts:
        print(f"  carry .selftest/manifest.json .selftest/{p['name']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
