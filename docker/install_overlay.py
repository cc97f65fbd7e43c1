#!/usr/bin/env python3
"""Final stage: put the patched vllm/ files over the installed vllm package, then check.

    install_overlay.py install OVERLAY MANIFEST   copy OVERLAY/vllm/... into the
        site-packages that holds `vllm`; every target must currently be the
        pin's unpatched file (or already the patched one), so an image of
        another vLLM build is refused instead of silently mixed
    install_overlay.py check MANIFEST             every manifest file in the
        installed package hashes to its patched sha256 and vllm.__version__ is
        the manifest's vllm_version

Exit 1 on any mismatch.  Uses only the standard library (runs in the vLLM image).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import sys
from pathlib import Path


def die(msg: str) -> None:
    print(f"dsv4patch overlay: error: {msg}", file=sys.stderr)
    raise SystemExit(1)


def site_root() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        die("vllm is not installed in this image's python")
    return Path(list(spec.submodule_search_locations)[0]).parent


def digest(p: Path) -> str | None:
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None


def install(overlay: Path, manifest_path: Path) -> None:
    m = json.loads(manifest_path.read_text())
    root = site_root()
    wrong = []
    for rel, h in m["files"].items():
        cur = digest(root / rel)
        if cur not in (h["base_sha256"], h["patched_sha256"]):
            wrong.append(f"  {rel}: installed {cur}, unpatched {h['base_sha256']}")
    if wrong:
        die(f"the vllm in {root} is not pin {m['pin']}'s unpatched vLLM {m['vllm_version']}:\n"
            + "\n".join(wrong))
    for rel in m["files"]:
        dst = root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(overlay / rel, dst)
    print(f"dsv4patch overlay: {len(m['files'])} file(s) installed into {root}")


def check(manifest_path: Path) -> None:
    m = json.loads(manifest_path.read_text())
    root = site_root()
    bad = [f"  {rel}: {digest(root / rel)} != {h['patched_sha256']}"
           for rel, h in m["files"].items() if digest(root / rel) != h["patched_sha256"]]
    if bad:
        die("installed vllm files differ from the patched tree:\n" + "\n".join(bad))
    import vllm

    if vllm.__version__ != m["vllm_version"]:
        die(f"vllm.__version__ is {vllm.__version__}, the pin says {m['vllm_version']}")
    print(f"dsv4patch overlay: ok: vllm {vllm.__version__}, {len(m['files'])} patched file(s), "
          f"tree {m['patched_tree']}")


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[:1] == ["install"] and len(a) == 3:
        install(Path(a[1]), Path(a[2]))
    elif a[:1] == ["check"] and len(a) == 2:
        check(Path(a[1]))
    else:
        print(__doc__, file=sys.stderr)
        raise SystemExit(2)
