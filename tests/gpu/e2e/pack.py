#!/usr/bin/env python3
"""Pack vLLM 0.26.0's own wheel and the Python packages it lacks on the H200 machine.

Why this exists: the H200 machine (issue 15) has no network, torch 2.11.0+cu130
and Python 3.12, but not vLLM nor a good part of what vLLM imports; each device
call carries at most 64 MiB of files.  This script makes the transfer
reproducible and as small as it can be:

1. downloads (``pip download``, cached) the ``vllm==0.26.0`` manylinux x86_64
   wheel and checks its size and sha256 against the index's JSON (PEP 691);
2. downloads the pinned cp312 manylinux wheels of the packages vLLM 0.26.0
   imports on the offline ``LLM()`` path with DeepSeek-V4 that the machine lacks
   (``DEPS`` below; versions from vLLM 0.26.0's own ``requirements/test/cuda.txt``
   lock where it has them, else from ``requirements/cuda.txt``);
3. strips from the vLLM wheel what DeepSeek-V4 on sm_90 never loads (``STRIP``),
   rewrites every wheel uncompressed (ZIP_STORED) so one xz stream over all of
   them compresses the shared libraries well, and splits that stream into
   balanced pieces of at most ``--max-part-mib`` MiB (``.e2e/part-NN.bin``);
4. writes ``.e2e/meta/manifest.json`` (sha256 of every piece and of the whole
   stream, the wheel list) and records every download in
   ``tests/gpu/e2e/wheels.lock.json`` so a later run verifies the same bytes;
5. optionally puts the patched vLLM Python files (``--patched-tree``, the tree
   ``dsv4patch apply --pin 0.26.0 --no-build`` makes) and the kernel plugin
   wheel of ``dsv4patch build`` (``--plugin-wheel``) under ``.e2e/meta/``.

``tests/gpu/e2e/device.sh`` verifies and reassembles the pieces on the device.

Usage: python tests/gpu/e2e/pack.py [--cache DIR] [--out .e2e]
       [--patched-tree DIR] [--plugin-wheel WHEEL]
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

VLLM_VERSION = "0.26.0"
SIMPLE_URL = os.environ.get("DSV4PATCH_INDEX_URL", "https://pypi.org/simple").rstrip("/") + "/vllm/"
HERE = Path(__file__).resolve().parent
LOCK_FILE = HERE / "wheels.lock.json"

# pip's platform tags for the device (glibc 2.35+, x86_64, CPython 3.12).
PLATFORMS = [
    "manylinux_2_35_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_26_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
]

# Members of the vLLM wheel that DeepSeek-V4 on sm_90 does not load.  Kept:
# _C_stable_libtorch (custom ops, persistent/cooperative top-k), _moe_C
# (routing/MoE ops), _flashmla_C (the sparse MLA kernels), deep_gemm (FP8 GEMMs,
# JIT), and FlashAttention 3: vllm/vllm_flash_attn/__init__.py raises
# ImportError unless FA2 or FA3 loads, and the DeepSeek-V4 model imports it
# (model registry inspection fails without it), so only FA2 can go.
STRIP = [
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",  # FA2 (FA3 is the sm_90 one)
    "vllm/vllm-rs",  # Rust HTTP frontend binary, `vllm serve` only
    "vllm/third_party/fmha_sm100/*",  # SM100 attention sources
    "vllm/third_party/deep_gemm/_C.cpython-310-*",  # DeepGEMM for other Pythons
    "vllm/third_party/deep_gemm/_C.cpython-311-*",
    "vllm/third_party/deep_gemm/_C.cpython-313-*",
    "vllm/third_party/deep_gemm/_C.cpython-314-*",
]

# The same for dependency wheels (name prefix -> patterns).
DEP_STRIP: dict[str, list[str]] = {
    # AMD Composable Kernel headers: TileLang's HIP backend only.
    "tilelang-": ["tilelang/3rdparty/composable_kernel/*"],
    # The z3 command-line program; TileLang links libz3.so only.
    "z3_solver-": ["z3_solver-*.data/data/bin/*"],
}


@dataclass(frozen=True)
class Dep:
    requirement: str  # exact pin "name==version"
    why: str


# What the device lacks (compare /work/.library/device/KINDS.md, "Python
# packages already there") and vLLM 0.26.0 imports with DeepSeek-V4 offline.
# Found by importing vllm.entrypoints.llm, vllm.engine.arg_utils, the V1/V2
# workers, vllm.models.deepseek_v4 and EngineArgs.create_engine_config for the
# tiny model on CPU (tests/gpu/e2e/validate_config_cpu.py), plus the CUDA-only
# kernel packages the DeepSeek-V4 code imports at run time.
DEPS: list[Dep] = [
    Dep("cbor2==6.1.2", "vllm.utils hashing (imported by vllm.config)"),
    Dep("msgspec==0.21.1", "V1 engine core messages"),
    Dep("pyzmq==27.1.0", "engine core <-> front-end sockets"),
    Dep("blake3==1.0.9", "prefix-cache hashing"),
    Dep("cachetools==5.5.2", "vllm.utils caches"),
    Dep("pydantic==2.12.0", "vllm.config dataclasses"),
    Dep("pydantic-core==2.41.1", "pydantic"),
    Dep("annotated-types==0.7.0", "pydantic"),
    Dep("typing-inspection==0.4.2", "pydantic"),
    Dep("pybase64==1.4.3", "vllm.utils"),
    Dep("setproctitle==1.3.7", "engine core process title"),
    Dep("ijson==3.5.0", "tool parsers imported by the LLM entrypoint"),
    Dep("partial-json-parser==0.2.1.1.post7", "tool parsers"),
    Dep("python-json-logger==4.1.0", "vllm logging config"),
    Dep("openai-harmony==0.0.4", "vllm.entrypoints (harmony utils)"),
    Dep("openai==2.44.0", "vllm.entrypoints protocol types"),
    Dep("jiter==0.15.0", "openai"),
    Dep("sniffio==1.3.1", "openai"),
    Dep("distro==1.9.0", "openai"),
    Dep("fastapi==0.136.3", "vllm.entrypoints (imported by LLM)"),
    Dep("starlette==1.3.1", "fastapi"),
    Dep("llguidance==1.7.6", "structured output backends (imported by the scheduler)"),
    Dep("xgrammar==0.2.3", "structured output backends"),
    Dep("apache-tvm-ffi==0.1.10", "xgrammar, tilelang"),
    Dep("compressed-tensors==0.17.0", "quantization config registry"),
    Dep("loguru==0.7.3", "compressed-tensors"),
    Dep("depyf==0.20.0", "vllm.compilation (torch.compile wrapper)"),
    Dep("astor==0.8.1", "depyf"),
    Dep("dill==0.3.8", "depyf"),
    Dep("tilelang==0.1.9", "DeepSeek-V4 mHC kernels (model_executor/kernels/mhc)"),
    Dep("z3-solver==4.15.4.0", "tilelang (pin from vLLM's rocm test lock)"),
    Dep("torch-c-dlpack-ext==0.1.5", "tilelang, quack"),
    Dep("nvidia-cutlass-dsl==4.6.0", "DeepSeek-V4 compressor/indexer CuTe DSL kernels"),
    Dep("nvidia-cutlass-dsl-libs-base==4.6.0", "nvidia-cutlass-dsl"),
    # The `cutlass` package's Python sources (cutlass/__init__.py, cute,
    # cutlass_dsl, base_dsl): libs-base requires it (Requires-Dist), without
    # it `cutlass` is a namespace package of _mlir only (first device run:
    # "No module named 'cutlass.cute'" / "'cutlass.cutlass_dsl'").
    Dep("nvidia-cutlass-dsl-libs-core==4.6.0", "nvidia-cutlass-dsl-libs-base (the cutlass package itself)"),
    Dep("nvidia-cutlass-dsl-libs-cu13==4.6.0", "nvidia-cutlass-dsl[cu13]"),
    Dep("quack-kernels==0.6.0", "CuTe DSL helpers (pins nvidia-cutlass-dsl==4.6.0)"),
    # requirements/cuda.txt pins it; the V1 sampler imports
    # vllm/v1/attention/backends/flashinfer.py (top-level `from flashinfer
    # import ...`) on every CUDA engine (first device run: "No module named
    # 'flashinfer'").  flashinfer-cubin==0.6.14 is not on PyPI (cuda.txt says
    # so); without it FlashInfer compiles its kernels just in time (nvcc).
    # Its other requirements are on the device (click, einops, ninja,
    # nvidia-ml-py, requests, tabulate, tqdm) or optional there (cuda-tile,
    # nvidia-cudnn-frontend: imported lazily / under try).
    Dep("flashinfer-python==0.6.14", "V1 sampler -> vllm.v1.attention.backends.flashinfer"),
]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _cached_wheel(cache: Path, requirement: str) -> Path | None:
    name, version = requirement.split("==")
    prefix = f"{_norm(name)}-{version}-"
    for path in sorted(cache.glob("*.whl")):
        if _norm(path.name.split("-")[0]) + "-" + path.name.split("-")[1] + "-" == prefix:
            return path
    return None


def pip_download(requirement: str, cache: Path) -> Path:
    """The cp312 manylinux x86_64 wheel for REQUIREMENT, from the cache or pip."""
    found = _cached_wheel(cache, requirement)
    if found is not None:
        return found
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", "3.12", "--implementation", "cp", "-d", str(cache),
    ]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    cmd.append(requirement)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = _cached_wheel(cache, requirement)
    if proc.returncode != 0 or found is None:
        raise SystemExit(
            f"pip could not download {requirement} for cp312 manylinux x86_64:\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}\n"
            "Check the pin in tests/gpu/e2e/pack.py (DEPS) and your network."
        )
    return found


def vllm_release_file() -> dict[str, object]:
    """The index's record (PEP 691 simple JSON) of the vLLM 0.26.0 manylinux x86_64 wheel."""
    req = urllib.request.Request(SIMPLE_URL, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310
        data = json.load(r)
    for entry in data.get("files", []):
        fn = entry["filename"]
        if fn.startswith(f"vllm-{VLLM_VERSION}-") and fn.endswith("manylinux_2_28_x86_64.whl"):
            return {
                "filename": fn,
                "size": entry.get("size"),
                "sha256": entry["hashes"]["sha256"],
                "url": entry["url"],
            }
    raise SystemExit(f"{SIMPLE_URL} lists no manylinux x86_64 wheel for vllm {VLLM_VERSION}")


def load_lock() -> dict[str, object]:
    if LOCK_FILE.exists():
        return json.loads(LOCK_FILE.read_text())
    return {}


def fetch_all(cache: Path, offline: bool) -> tuple[Path, list[Path], dict[str, object]]:
    """Download (or reuse) every wheel; verify against PyPI and the lock."""
    cache.mkdir(parents=True, exist_ok=True)
    lock = load_lock()
    if offline:
        vinfo = dict(lock["vllm"])  # type: ignore[arg-type]
    else:
        vinfo = vllm_release_file()
    vpath = pip_download(f"vllm=={VLLM_VERSION}", cache)
    if vpath.name != vinfo["filename"]:
        raise SystemExit(f"pip gave {vpath.name}, PyPI lists {vinfo['filename']}")
    size, digest = vpath.stat().st_size, sha256_file(vpath)
    if size != vinfo["size"] or digest != vinfo["sha256"]:
        raise SystemExit(
            f"{vpath}: size {size} sha256 {digest} does not match PyPI "
            f"({vinfo['size']}, {vinfo['sha256']}); delete it and run again"
        )
    locked = {d["requirement"]: d for d in lock.get("deps", [])}  # type: ignore[union-attr]
    deps: list[Path] = []
    dep_records: list[dict[str, object]] = []
    for dep in DEPS:
        path = pip_download(dep.requirement, cache)
        rec = {
            "requirement": dep.requirement,
            "filename": path.name,
            "size": path.stat().st_size,
            "sha256": sha256_file(path),
            "why": dep.why,
        }
        old = locked.get(dep.requirement)
        if old is not None and (old["filename"], old["sha256"]) != (rec["filename"], rec["sha256"]):
            raise SystemExit(
                f"{path} differs from tests/gpu/e2e/wheels.lock.json "
                f"({old['filename']} {old['sha256']}); delete the cached file or update the lock"
            )
        deps.append(path)
        dep_records.append(rec)
    new_lock = {"vllm": vinfo, "deps": dep_records}
    return vpath, deps, new_lock


def _stripped(name: str, patterns: list[str] | None = None) -> bool:
    return any(fnmatch.fnmatch(name, pat) for pat in (STRIP if patterns is None else patterns))


def strip_patterns(wheel_name: str) -> list[str]:
    """What to leave out of WHEEL_NAME (the vLLM wheel or a dependency)."""
    if wheel_name.startswith("vllm-"):
        return STRIP
    return [p for prefix, pats in DEP_STRIP.items() if wheel_name.startswith(prefix) for p in pats]


def restore_stored(src: Path, dst: Path, strip: bool) -> list[str]:
    """Copy wheel SRC to DST uncompressed, dropping its strip patterns if STRIP; fix RECORD."""
    patterns = strip_patterns(src.name) if strip else []
    dropped: list[str] = []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            if patterns and _stripped(info.filename, patterns):
                dropped.append(info.filename)
                continue
            data = zin.read(info)
            if patterns and info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(
                    ln for ln in lines if not _stripped(ln.split(",", 1)[0], patterns)
                ).encode()
            new = zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0))
            new.external_attr = info.external_attr
            new.compress_type = zipfile.ZIP_STORED
            zout.writestr(new, data)
    if patterns and not dropped:
        raise SystemExit(f"{src.name}: none of its strip patterns matched; check STRIP/DEP_STRIP")
    return dropped


def strip_summary(wheels: list[Path]) -> dict[str, dict[str, object]]:
    """Per wheel: the strip patterns and how many members they leave out."""
    out: dict[str, dict[str, object]] = {}
    for w in wheels:
        pats = strip_patterns(w.name)
        if pats:
            with zipfile.ZipFile(w) as z:
                n = sum(1 for name in z.namelist() if _stripped(name, pats))
            out[w.name] = {"patterns": pats, "members_left_out": n}
    return out


def make_payload(wheels: list[Path], vllm_wheel: Path, work: Path) -> tuple[Path, dict[str, dict[str, object]]]:
    """WORK/payload.tar: the stored wheels, deterministic (sorted, no owners, mtime 0)."""
    staging = work / "staging"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    restore_stored(vllm_wheel, staging / vllm_wheel.name, strip=True)
    for w in wheels:
        restore_stored(w, staging / w.name, strip=True)
    tar_path = work / "payload.tar"
    with tarfile.open(tar_path, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(staging.iterdir()):
            info = tar.gettarinfo(str(path), arcname=f"wheels/{path.name}")
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with path.open("rb") as f:
                tar.addfile(info, f)
    shutil.rmtree(staging)
    return tar_path, strip_summary([vllm_wheel, *wheels])


def xz_compress(src: Path) -> Path:
    """SRC.xz at preset 9: the xz binary (2 threads) when present, else stdlib lzma."""
    dst = src.with_name(src.name + ".xz")
    if shutil.which("xz"):
        with dst.open("wb") as out:
            subprocess.run(["xz", "-9", "-T2", "-c", str(src)], stdout=out, check=True)
    else:
        comp = lzma.LZMACompressor(preset=9)
        with src.open("rb") as f, dst.open("wb") as out:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                out.write(comp.compress(chunk))
            out.write(comp.flush())
    return dst


def patched_files(tree: Path, vllm_wheel: Path) -> list[str]:
    """vllm/*.py files the dsv4patch commits changed in TREE (relative paths).

    Each file's unpatched version (the parent of the first dsv4patch commit)
    must equal the wheel's copy byte for byte, so laying the patched file over
    the installed wheel gives exactly the patched tree's file.
    """
    def git(*args: str) -> bytes:
        return subprocess.run(
            ["git", "-C", str(tree), *args], capture_output=True, check=True
        ).stdout

    commits = git("log", "--format=%H", "--grep=Dsv4patch-Patch").decode().split()
    if not commits:
        raise SystemExit(
            f"{tree} has no dsv4patch commits; make it with "
            "`dsv4patch apply --pin 0.26.0 --tree DIR --no-build`"
        )
    base = git("rev-parse", f"{commits[-1]}^").decode().strip()
    names = git("diff", "--name-only", "--diff-filter=AM", base, "HEAD", "--", "vllm").decode().split()
    names = sorted(n for n in names if n.endswith(".py"))
    with zipfile.ZipFile(vllm_wheel) as z:
        in_wheel = set(z.namelist())
        for n in names:
            if n not in in_wheel:
                continue  # a file the patches add
            if git("show", f"{base}:{n}") != z.read(n):
                raise SystemExit(
                    f"{n}: the unpatched tree's copy differs from the wheel's; "
                    "the patched file cannot simply be laid over the wheel"
                )
    return names


def write_parts(blob: Path, out: Path, part_bytes: int) -> list[dict[str, object]]:
    for old in out.glob("part-*.bin"):
        old.unlink()
    parts: list[dict[str, object]] = []
    with blob.open("rb") as f:
        for piece in iter(lambda: f.read(part_bytes), b""):
            name = f"part-{len(parts) + 1:02d}.bin"
            (out / name).write_bytes(piece)
            parts.append(
                {"name": name, "size": len(piece), "sha256": hashlib.sha256(piece).hexdigest()}
            )
    return parts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("DSV4PATCH_E2E_CACHE", Path.home() / ".cache" / "dsv4patch-e2e")),
        help="download cache (default $DSV4PATCH_E2E_CACHE or ~/.cache/dsv4patch-e2e)",
    )
    ap.add_argument("--out", type=Path, default=None, help="output folder (default <repo>/.e2e)")
    ap.add_argument(
        "--max-part-mib",
        type=float,
        default=60.0,
        help="largest piece in MiB (default 60: a call carries 64 MiB with the repo)",
    )
    ap.add_argument("--patched-tree", type=Path, help="tree made by dsv4patch apply --pin 0.26.0")
    ap.add_argument("--plugin-wheel", type=Path, help="kernel plugin wheel from dsv4patch build")
    ap.add_argument("--offline", action="store_true", help="trust the lock instead of PyPI JSON")
    ap.add_argument("--no-update-lock", action="store_true", help="do not rewrite wheels.lock.json")
    args = ap.parse_args(argv)

    repo = Path(
        subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, cwd=HERE
        ).stdout.strip()
        or HERE.parents[2]
    )
    out: Path = args.out or repo / ".e2e"
    meta = out / "meta"
    meta.mkdir(parents=True, exist_ok=True)

    vllm_wheel, deps, lock = fetch_all(args.cache, args.offline)
    if not args.no_update_lock:
        LOCK_FILE.write_text(json.dumps(lock, indent=2) + "\n")
    key = hashlib.sha256(
        json.dumps({"lock": lock, "strip": STRIP, "dep_strip": DEP_STRIP}, sort_keys=True).encode()
    ).hexdigest()
    blob = args.cache / f"payload-{key[:16]}.tar.xz"
    manifest_path = meta / "manifest.json"
    old = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    old_parts = old.get("parts", []) if old.get("key") == key else []
    if not blob.exists() and old_parts and all((out / p["name"]).exists() for p in old_parts):
        # The stream is the concatenation of the pieces: rebuild it instead of xz again.
        with blob.open("wb") as f:
            for p in old_parts:
                f.write((out / p["name"]).read_bytes())
        if sha256_file(blob) != old.get("xz_sha256"):
            blob.unlink()
    if blob.exists():
        dropped = strip_summary([vllm_wheel, *deps])
        manifest = {
            "key": key,
            "vllm": lock["vllm"],
            "stripped": dropped,
            "wheels": [vllm_wheel.name] + [d.name for d in deps],
            "tar_size": old.get("tar_size") if old.get("key") == key else None,
        }
        print(f"xz stream up to date ({blob})")
    else:
        tar_path, dropped = make_payload(deps, vllm_wheel, args.cache)
        tar_size = tar_path.stat().st_size
        print(f"tar of stored wheels: {tar_size / 2**20:.1f} MiB; compressing (xz -9)...", flush=True)
        xz_compress(tar_path).replace(blob)
        tar_path.unlink()
        manifest = {
            "key": key,
            "vllm": lock["vllm"],
            "stripped": dropped,
            "wheels": [vllm_wheel.name] + [d.name for d in deps],
            "tar_size": tar_size,
        }
    manifest["xz_size"] = blob.stat().st_size
    manifest["xz_sha256"] = sha256_file(blob)
    # Balanced pieces, each at most --max-part-mib.
    limit = int(args.max_part_mib * 2**20)
    count = -(-manifest["xz_size"] // limit)
    part_bytes = -(-manifest["xz_size"] // count)
    same = (
        old_parts
        and old.get("xz_sha256") == manifest["xz_sha256"]
        and [p["size"] for p in old_parts][:1] == [min(part_bytes, manifest["xz_size"])]
        and all((out / p["name"]).exists() and (out / p["name"]).stat().st_size == p["size"] for p in old_parts)
    )
    manifest["parts"] = old_parts if same else write_parts(blob, out, part_bytes)

    # Patched Python files and the kernel plugin (small; they travel in meta/).
    patched_dir = meta / "patched"
    if args.patched_tree:
        if patched_dir.exists():
            shutil.rmtree(patched_dir)
        files = patched_files(args.patched_tree, vllm_wheel)
        for rel in files:
            dst = patched_dir / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(args.patched_tree / rel, dst)
        manifest["patched_files"] = files
        print(f"patched files: {len(files)} under {patched_dir}")
    plugin_dir = meta / "plugin"
    if args.plugin_wheel:
        if plugin_dir.exists():
            shutil.rmtree(plugin_dir)
        plugin_dir.mkdir()
        shutil.copy2(args.plugin_wheel, plugin_dir / args.plugin_wheel.name)
        manifest["plugin_wheel"] = args.plugin_wheel.name
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")

    parts = manifest["parts"]
    meta_size = sum(p.stat().st_size for p in meta.rglob("*") if p.is_file())
    total = sum(int(p["size"]) for p in parts)
    print(f"vLLM wheel {vllm_wheel.name}: {vllm_wheel.stat().st_size / 2**20:.1f} MiB, sha256 verified")
    print(f"wheels: {len(manifest['wheels'])}, tar {manifest['tar_size'] / 2**20:.1f} MiB, "
          f"xz {manifest['xz_size'] / 2**20:.1f} MiB in {len(parts)} pieces; meta {meta_size / 2**20:.2f} MiB")
    rel_out = os.path.relpath(out, repo)
    print(f"device calls needed: {len(parts)} (one piece each; the last one can also run the cases)")
    for i, p in enumerate(parts, 1):
        print(f"  call {i}: carry [\"{rel_out}/meta\", \"{rel_out}/{p['name']}\"]  ({int(p['size']) / 2**20:.1f} MiB)")
    print(f"total to carry: {(total + meta_size * len(parts)) / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
