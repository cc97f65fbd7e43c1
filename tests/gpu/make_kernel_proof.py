#!/usr/bin/env python3
"""Build the one-call kernel proof's library: the pin's patched top-k kernels, standalone.

    python tests/gpu/make_kernel_proof.py OUTDIR [--pin 0.27.1] [--arch 9.0a]

The full proof (``make_bundle.py``) carries vLLM's stock library (57 MB) so that it
can compare stock and rebuilt kernels through vLLM's own loader; it takes two device
calls. This one proves what the patched kernels compute, in one call:

1. ``dsv4patch apply --pin P --no-build`` makes the patched tree (the pin's default
   series, so ``patches/extra/`` included);
2. the units ``dsv4patch build`` would compile (``sources.plan`` and
   ``build.plan_build``: same units, flags and include paths), for ``--arch`` only,
   against the torch ``dsv4patch build`` would use (``DSV4PATCH_TORCH_PYTHON``, else
   the pin's CPU test venv), plus a bindings unit that *defines* the ops' schemas
   (``STABLE_TORCH_LIBRARY(_C)``, taken from the tree's ``torch_bindings.cpp``)
   besides registering their CUDA kernels: the library needs no stock vLLM;
3. ``OUTDIR/libdsv4patch_topk_standalone.so`` and ``OUTDIR/kernel_proof.json``
   (pin, series, tree id, archs, ops and schemas, the library's sha256).

Objects are cached in the store as ``dsv4patch build``'s are. ``OUTDIR`` should be an
ignored path (``.gpu/kernel_proof``) that the device call carries; see
``tests/gpu/kernel_proof.sh``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from dsv4patch.hashing import hash_file
from dsv4patch.kernels import build as kbuild
from dsv4patch.kernels import sources
from dsv4patch.pins.lock import load
from dsv4patch.proofs import testenv
from dsv4patch.settings import Settings
from dsv4patch.store import Store

LIB = "libdsv4patch_topk_standalone.so"


def standalone_bindings(units: list[kbuild.UnitBuild], ops: list[sources.Op],
                        store: Store) -> list[kbuild.UnitBuild]:
    """``units`` with the generated bindings unit replaced by one that also defines the ops."""
    out = []
    for u in units:
        if u.name != "dsv4patch_bindings":
            out.append(u)
            continue
        text = kbuild.generate_bindings(ops, ops[0].namespace, define=True)
        key = hashlib.sha256(f"{u.key}\n{text}".encode()).hexdigest()
        obj = store.root / "kernels" / key / "dsv4patch_bindings.o"
        cmd = list(u.command)
        cmd[cmd.index("-c") + 1] = str(obj.with_suffix(".cpp"))
        cmd[cmd.index("-o") + 1] = str(obj)
        out.append(dataclasses.replace(u, key=key, obj=obj, command=cmd, text=text))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--pin", default="0.27.1")
    ap.add_argument("--arch", action="append", help="CUDA arch to build for (repeatable; default 9.0a, "
                    "the H200)")
    ap.add_argument("--lock", type=Path, default=REPO / "locks" / "vllm.toml")
    args = ap.parse_args()
    archs = tuple(args.arch or ["9.0a"])
    out = args.outdir.resolve()
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    pin = load(args.lock).pin(args.pin)
    store = Store.open(Settings.from_environ(os.environ).cache_root())
    res = subprocess.run([sys.executable, "-m", "dsv4patch", "apply", "--lock", str(args.lock), "--pin",
                          pin.name, "--tree", str(work / "tree"), "--no-build", "--format", "json"],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"dsv4patch apply failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    tree = work / "tree"
    plan = sources.plan(tree)
    python = os.environ.get("DSV4PATCH_TORCH_PYTHON") or str(testenv.ensure(tree, store).python)
    tc = kbuild.detect_toolchain(store, python=python)
    units, ops, notes = kbuild.plan_build(plan, archs, tc, store)
    if not ops:
        raise SystemExit(f"no op to build for {', '.join(archs)}: {notes}")
    units = standalone_bindings(units, ops, store)
    kbuild.compile_units(units, plan.tree, store, pin.build.max_jobs)
    lib = kbuild.link(units, tc, store)
    shutil.copyfile(lib, out / LIB)
    meta = {"pin": pin.name, "vllm_version": pin.vllm_version, "series": list(pin.series),
            "tree_id": plan.tree_id, "lock_patched_tree": pin.patched_tree, "head": plan.head,
            "archs": list(archs), "changed": list(plan.changed),
            "units": [{"unit": u.source, "archs": list(u.archs), "ops": list(u.ops)} for u in units],
            "ops": [{"name": o.name, "schema": o.schema} for o in ops],
            "torch_version": tc.torch_version, "nvcc": tc.nvcc_version.strip().splitlines()[-1],
            "library": LIB, "library_sha256": hash_file(out / LIB), "notes": notes}
    (out / "kernel_proof.json").write_text(json.dumps(meta, indent=1) + "\n")
    shutil.rmtree(work)
    print(json.dumps({"outdir": str(out), "tree_id": plan.tree_id, "archs": list(archs),
                      "library_bytes": (out / LIB).stat().st_size}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
