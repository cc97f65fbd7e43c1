#!/usr/bin/env python3
"""Docker build args (and OCI label values) for one pin of a dsv4patch lock.

Deliberately independent of the ``dsv4patch`` package (stdlib only), so it
can run before anything is installed, and so the Dockerfile's ``patch`` stage
can cross-check it against what ``dsv4patch apply`` computes.

    VLLM_PIN          the lock entry
    VLLM_VERSION      pins.<pin>.vllm_version
    VLLM_COMMIT       pins.<pin>.commit
    PATCHED_TREE      pins.<pin>.patched_tree (git tree id after the series)
    PATCH_SET_SHA256  sha256 over "<patch file name> <sha256 of the file>\\n" for
                      every patch of the pin, in series order (what
                      dsv4patch.series.Series.hash() computes)
    LOCK_SHA256       sha256 of the lock file's bytes
    IMAGE_VERSION     <vllm_version>-dsv4.<first 12 hex of PATCH_SET_SHA256>
    SDIST_SHA256      pins.<pin>.source.sha256 (pypi-sdist pins only; not a build arg)

Usage:
    docker/build-args.py [--lock locks/vllm.toml] [--pin 0.27.1] [--format docker|env|json]

``--format docker`` (default) prints one ``--build-arg K=V`` per line, for
``docker build $(docker/build-args.py --pin 0.27.1) ...``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

BUILD_ARGS = ("VLLM_PIN", "VLLM_VERSION", "VLLM_COMMIT", "PATCHED_TREE", "PATCH_SET_SHA256",
              "LOCK_SHA256", "IMAGE_VERSION")


class Error(Exception):
    pass


def series_files(series_file: Path) -> list[Path]:
    try:
        lines = series_file.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise Error(f"series file {series_file} not found") from None
    out = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(series_file.parent / line)
    return out


def compute(lock_path: Path, pin_name: str | None) -> dict[str, str]:
    raw = lock_path.read_bytes()
    data = tomllib.loads(raw.decode("utf-8"))
    pins = data.get("pins") or {}
    name = pin_name or data.get("default_pin") or next(iter(pins), None)
    if name not in pins:
        raise Error(f"{lock_path}: no pin {name!r} (pins: {', '.join(pins)})")
    pin = pins[name]
    base = lock_path.parent
    series_tab = data.get("series") or {}
    names = pin.get("series")
    if names is None:
        names = [s for s, d in series_tab.items() if d.get("default", True)]
    variants = {k: (base / v) for k, v in (pin.get("variants") or {}).items()}
    h = hashlib.sha256()
    for sname in names:
        if sname not in series_tab:
            raise Error(f"{lock_path}: pin {name} names series {sname!r}, which is not defined")
        for p in series_files(base / series_tab[sname]["path"]):
            f = variants.get(p.name, p)
            h.update(f"{p.name} {hashlib.sha256(f.read_bytes()).hexdigest()}\n".encode())
    patched = pin.get("patched_tree")
    if not patched:
        raise Error(f"{lock_path}: pin {name} has no patched_tree (run `dsv4patch lock --update`)")
    commit = pin.get("commit") or pin.get("commit_abbrev") or ""
    patch_set = h.hexdigest()
    out = {
        "VLLM_PIN": name,
        "VLLM_VERSION": pin["vllm_version"],
        "VLLM_COMMIT": commit,
        "PATCHED_TREE": patched,
        "PATCH_SET_SHA256": patch_set,
        "LOCK_SHA256": hashlib.sha256(raw).hexdigest(),
        "IMAGE_VERSION": f"{pin['vllm_version']}-dsv4.{patch_set[:12]}",
    }
    src = pin.get("source") or {}
    if src.get("kind") == "pypi-sdist":
        out["SDIST_SHA256"] = src.get("sha256", "")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lock", type=Path, default=Path("locks/vllm.toml"))
    ap.add_argument("--pin", default=None, help="pin name (default: the lock's default_pin)")
    ap.add_argument("--format", choices=("docker", "env", "json"), default="docker")
    args = ap.parse_args(argv)
    try:
        vals = compute(args.lock, args.pin)
    except (Error, OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        print(f"build-args: error: {exc}", file=sys.stderr)
        return 3
    if args.format == "json":
        print(json.dumps(vals, indent=2, sort_keys=True))
    elif args.format == "env":
        for k, v in vals.items():
            print(f"{k}={v}")
    else:
        for k in BUILD_ARGS:
            print(f"--build-arg {k}={vals[k]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
