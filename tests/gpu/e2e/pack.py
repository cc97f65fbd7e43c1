#!/usr/bin/env python3
"""The Python packages vLLM 0.26.0 needs on the H200 machine that it lacks, pinned and packed.

Why this exists: the H200 machine has no network, torch 2.11.0+cu130 and
Python 3.12, but not a good part of what vLLM imports on the offline
``LLM()`` path with DeepSeek-V4; a device call carries at most 64 MiB.
``tests/gpu/selftest_pack.py`` (the payload of ``tests/gpu/selftest_h200.sh``)
takes from here:

* ``DEPS``: the pinned cp312 manylinux wheels (versions from vLLM 0.26.0's own
  ``requirements/test/cuda.txt`` lock where it has them, else from
  ``requirements/cuda.txt``), each with why it is needed, found on the first
  device runs of issue 15's harness (tests/gpu/e2e/README.md);
* ``pip_download`` (cached by normalised name and version), checked against
  ``wheels.lock.json`` (file name, size, sha256 of every wheel) by ``load_lock``;
* ``restore_stored``: a wheel rewritten uncompressed (ZIP_STORED, so one xz
  stream over all of them compresses the shared libraries well), without the
  members ``DEP_STRIP`` names, its RECORD fixed;
* ``write_parts``: a file split into pieces of at most N bytes with sha256s.

Run directly, it downloads ``DEPS`` into ``--cache`` and checks them against
``wheels.lock.json``; ``--update`` records the wheels of a changed ``DEPS``
there instead.  ``import_check_cpu.py`` checks such a set on CPU before it is
carried.

Usage: python tests/gpu/e2e/pack.py [--cache DIR] [--update]
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCK_FILE = HERE / "wheels.lock.json"

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

# Members of dependency wheels vLLM never loads on the H200 (name prefix -> patterns).
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
# tiny model on CPU (the harness's validate_config_cpu.py, in git history at the
# commit tests/gpu/e2e/README.md names), plus the CUDA-only kernel packages the
# DeepSeek-V4 code imports at run time.
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


def load_lock() -> dict[str, object]:
    if LOCK_FILE.exists():
        return json.loads(LOCK_FILE.read_text())
    return {}


def _stripped(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(name, pat) for pat in patterns)


def strip_patterns(wheel_name: str) -> list[str]:
    """What to leave out of the dependency wheel WHEEL_NAME."""
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
        raise SystemExit(f"{src.name}: none of its strip patterns matched; check DEP_STRIP")
    return dropped


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
    ap.add_argument("--cache", type=Path, default=Path("/work/cache/e2e-wheels"), help="pip download cache")
    ap.add_argument("--update", action="store_true", help="record the downloaded wheels in wheels.lock.json")
    args = ap.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    locked = {d["requirement"]: d for d in load_lock().get("deps", [])}
    records, bad = [], []
    for dep in DEPS:
        path = pip_download(dep.requirement, args.cache)
        rec = {"requirement": dep.requirement, "filename": path.name, "size": path.stat().st_size,
               "sha256": sha256_file(path), "why": dep.why}
        old = locked.get(dep.requirement)
        if old is None or (old["filename"], old["sha256"]) != (rec["filename"], rec["sha256"]):
            bad.append(f"{dep.requirement}: {path.name} {rec['sha256']} is not what {LOCK_FILE.name} records")
        records.append(rec)
    if args.update:
        LOCK_FILE.write_text(json.dumps({"deps": records}, indent=2) + "\n")
        print(f"{LOCK_FILE}: {len(records)} wheels recorded")
        return 0
    for line in bad:
        print(line)
    print(f"{len(DEPS) - len(bad)} of {len(DEPS)} wheels as {LOCK_FILE.name} records")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
