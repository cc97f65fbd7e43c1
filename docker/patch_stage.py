#!/usr/bin/env python3
"""Steps of the Dockerfile's ``patch`` stage that are more than one command.

    patch_stage.py preflight   check the label build args against the lock
                               (docker/build-args.py), seed the dsv4patch cache
                               from sdists/ in the build context
    patch_stage.py stage       check what `dsv4patch apply` did, stage the changed
                               vllm/ files with a hash manifest for the final stage,
                               write the labels file

Environment: VLLM_PIN plus the build args VLLM_VERSION, VLLM_COMMIT,
PATCHED_TREE, PATCH_SET_SHA256, LOCK_SHA256, IMAGE_VERSION.  Any mismatch
exits non-zero, which fails `docker build`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import importlib.util  # noqa: E402

_spec = importlib.util.spec_from_file_location("build_args", HERE / "build-args.py")
build_args = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(build_args)  # type: ignore[union-attr]

LOCK = Path(os.environ.get("DSV4PATCH_LOCK", "locks/vllm.toml"))
TREE = Path(os.environ.get("VLLM_TREE", "/opt/vllm-src"))
APPLY_JSON = Path("/opt/dsv4patch-apply.json")
OUT = Path("/opt/dsv4patch")  # metadata for later stages and for `docker run`
OVERLAY = Path("/opt/vllm-overlay")  # vllm/... files changed by the patches
LABELS = OUT / "labels.env"


def die(msg: str) -> None:
    print(f"patch stage: error: {msg}", file=sys.stderr)
    raise SystemExit(1)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git(*args: str) -> str:
    """git on the patched tree, through dsv4patch's git module (hermetic environment)."""
    from dsv4patch import git as dgit

    return dgit.run(TREE.resolve(), args).stdout


def git_bytes(*args: str) -> bytes:
    from dsv4patch import git as dgit

    return dgit.out_bytes(TREE.resolve(), *args)


def expected() -> dict[str, str]:
    try:
        return build_args.compute(LOCK, os.environ.get("VLLM_PIN") or None)
    except build_args.Error as exc:
        die(str(exc))
        raise


def preflight() -> None:
    want = expected()
    bad = []
    for k in build_args.BUILD_ARGS:
        got = os.environ.get(k, "")
        if got != want[k]:
            bad.append(f"  {k}: build arg {got!r}, lock says {want[k]!r}")
    if bad:
        die("build args do not match the lock "
            f"({LOCK}, pin {want['VLLM_PIN']}):\n" + "\n".join(bad) +
            "\npass them with: docker build $(docker/build-args.sh --pin "
            f"{want['VLLM_PIN']}) ...")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "build-args.json").write_text(json.dumps(want, indent=2, sort_keys=True) + "\n")
    seeds = []
    sdists = Path("sdists")
    for f in sorted(sdists.iterdir()) if sdists.is_dir() else []:
        if not f.is_file() or f.name.startswith("."):
            continue
        digest = sha256(f.read_bytes())
        if digest == want.get("SDIST_SHA256"):
            seeds.append(str(f))
        else:
            print(f"patch stage: ignoring {f}: not pin {want['VLLM_PIN']}'s sdist")
    if seeds:
        cmd = ["dsv4patch", "fetch", "--lock", str(LOCK), "--pin", want["VLLM_PIN"],
               "--format", "json"]
        for s in seeds:
            cmd += ["--sdist", s]
        print("patch stage: seeding the cache offline:", " ".join(cmd))
        with open(OUT / "fetch.json", "w") as fh:
            subprocess.run(cmd, check=True, stdout=fh)
    else:
        print("patch stage: no sdist in sdists/; `dsv4patch apply` downloads it from PyPI")


def series_hash(pin: str) -> str:
    """The patch-set hash as dsv4patch itself computes it (cross-check)."""
    from dsv4patch.lock import load
    from dsv4patch.series import series_for_pin

    lock = load(LOCK)
    return series_for_pin(lock, lock.pin(pin)).hash()


def stage() -> None:
    want = expected()
    pin = want["VLLM_PIN"]
    try:
        report = json.loads(APPLY_JSON.read_text())
    except (OSError, ValueError) as exc:
        die(f"cannot read {APPLY_JSON}: {exc}")
        raise
    rep = report.get("pins", {}).get(pin)
    if not report.get("ok") or rep is None or not rep.get("ok"):
        die(f"dsv4patch apply did not report ok for pin {pin}: "
            + "; ".join(report.get("notes", [])))
        raise AssertionError
    checks = {
        "apply report patched_tree": rep.get("patched_tree"),
        "git rev-parse HEAD^{tree}": git("rev-parse", "HEAD^{tree}").strip(),
    }
    for what, got in checks.items():
        if got != want["PATCHED_TREE"]:
            die(f"{what} is {got}, the lock/build arg says {want['PATCHED_TREE']}")
    if rep.get("commit") not in (None, want["VLLM_COMMIT"]):
        die(f"apply report commit {rep.get('commit')} != {want['VLLM_COMMIT']}")
    ours = series_hash(pin)
    if ours != want["PATCH_SET_SHA256"]:
        die(f"dsv4patch's patch-set hash {ours} != {want['PATCH_SET_SHA256']}")
    if git("status", "--porcelain").strip():
        die(f"{TREE} has uncommitted changes after apply")
    base = rep["base_commit"]
    head = git("rev-parse", "HEAD").strip()
    deleted = git("diff", "--no-renames", "--name-only", "--diff-filter=D",
                  f"{base}..{head}", "--", "vllm/").split()
    if deleted:
        die(f"the patches delete files under vllm/ ({', '.join(deleted)}); the overlay "
            "cannot express deletions")
    changed = git("diff", "--no-renames", "--name-only", f"{base}..{head}", "--", "vllm/").split()
    shutil.rmtree(OVERLAY, ignore_errors=True)
    OVERLAY.mkdir(parents=True)
    files = {}
    for rel in changed:
        src = TREE / rel
        dst = OVERLAY / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        in_base = git("ls-tree", "--name-only", base, "--", rel).strip()
        files[rel] = {
            "base_sha256": sha256(git_bytes("show", f"{base}:{rel}")) if in_base else None,
            "patched_sha256": sha256(src.read_bytes()),
        }
    manifest = {
        "pin": pin, "vllm_version": want["VLLM_VERSION"], "vllm_commit": want["VLLM_COMMIT"],
        "base_commit": base, "head": head, "patched_tree": want["PATCHED_TREE"],
        "patch_set_sha256": want["PATCH_SET_SHA256"], "lock_sha256": want["LOCK_SHA256"],
        "files": files,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (OUT / "manifest.json").write_text(text)
    (OVERLAY.parent / "vllm-overlay.manifest.json").write_text(text)
    labels = {
        "org.opencontainers.image.version": want["IMAGE_VERSION"],
        "dev.dsv4patch.pin": pin,
        "dev.dsv4patch.vllm.version": want["VLLM_VERSION"],
        "dev.dsv4patch.vllm.commit": want["VLLM_COMMIT"],
        "dev.dsv4patch.patch-set.sha256": want["PATCH_SET_SHA256"],
        "dev.dsv4patch.patched-tree": want["PATCHED_TREE"],
        "dev.dsv4patch.lock.sha256": want["LOCK_SHA256"],
    }
    LABELS.write_text("".join(f"{k}={v}\n" for k, v in labels.items()))
    print(f"patch stage: pin {pin}: tree {want['PATCHED_TREE']}, {len(files)} vllm/ file(s) "
          f"staged in {OVERLAY}")


if __name__ == "__main__":
    steps = {"preflight": preflight, "stage": stage}
    if len(sys.argv) != 2 or sys.argv[1] not in steps:
        print(f"usage: {sys.argv[0]} {{{'|'.join(steps)}}}", file=sys.stderr)
        raise SystemExit(2)
    steps[sys.argv[1]]()
