"""``dsv4patch status --installed``: does the vLLM installed in an environment carry the fixes?

Operators run vLLM on many nodes and in images; what matters there is the
installed package, not a source tree.  This module asks an interpreter
(``--python``, default this one) where its vLLM is, without importing vLLM
(no torch, no CUDA initialisation: it works in a health check), and compares
every shipped file each patch changes with the lock's patched tree, which is
recomputed from the cache (the lock's hashes are the trust anchor; the
``dsv4patch.json`` the patched wheel carries is reported, never trusted).

Per patch: ``present`` (every file it changes has the patched content),
``stock`` (a file has the pin's unpatched content), ``missing`` (a file is
absent), or ``other`` (anything else; a diff summary against the patched file
is given); the worst file decides (missing, other, stock) and each file's
state is listed.
A patch that changes only kernel sources is ``present`` when the rebuilt
kernel library of this patched tree is installed.  The kernel library is
reported with its archs and activation routes (the ``vllm/__init__.py`` hook
line or the ``vllm.general_plugins`` entry point); on a machine with a GPU,
``python -m <kernel package> check`` says whether its kernels are the ones
torch's dispatcher runs.  Exit 0 only when everything matches.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from dsv4patch import report, vllm_wheel
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK, EXIT_UNEXPECTED, UsageError
from dsv4patch.kernels.build import dist_name
from dsv4patch.lock import Lock, Pin

# Runs in the target interpreter: standard library only, vLLM is located, not imported.
_PROBE = r"""
import importlib.util, json, os, sys
out = {"python": sys.executable, "vllm": None}
spec = importlib.util.find_spec("vllm")
if spec is not None and spec.submodule_search_locations:
    pkg = list(spec.submodule_search_locations)[0]
    out["vllm"] = {"package": pkg, "root": os.path.dirname(pkg)}
    try:
        from importlib import metadata
        dist = metadata.distribution("vllm")
        out["vllm"]["version"] = dist.version
        out["vllm"]["provenance"] = dist.read_text("dsv4patch.json")
    except Exception as exc:
        out["vllm"]["version"] = None
        out["vllm"]["error"] = repr(exc)
try:
    from importlib import metadata as _md
    out["torch"] = _md.version("torch")
except Exception:
    out["torch"] = None
kdist = sys.argv[1]
kspec = importlib.util.find_spec(kdist)
out["kernels"] = None
if kspec is not None and kspec.submodule_search_locations:
    d = list(kspec.submodule_search_locations)[0]
    info = None
    try:
        with open(os.path.join(d, "build_info.json"), encoding="utf-8") as fh:
            info = json.load(fh)
    except (OSError, ValueError):
        pass
    eps = []
    try:
        from importlib.metadata import entry_points
        eps = [e.value for e in entry_points(group="vllm.general_plugins") if e.value.startswith(kdist)]
    except Exception:
        pass
    out["kernels"] = {"dir": d, "build_info": info, "entry_points": eps}
print("DSV4PATCH-PROBE " + json.dumps(out))
"""

STATES = ("present", "stock", "missing", "other")


def probe(python: str, kernel_dist: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    try:
        res = subprocess.run([python, "-c", _PROBE, kernel_dist], capture_output=True, text=True,
                             timeout=120, env=env, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--python {python}: cannot run it ({exc})") from None
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("DSV4PATCH-PROBE ")), None)
    if res.returncode != 0 or line is None:
        raise UsageError(f"--python {python}: not a working Python interpreter "
                         f"({(res.stderr.strip().splitlines() or ['no output'])[-1]})")
    found: dict[str, Any] = json.loads(line[len("DSV4PATCH-PROBE "):])
    return found


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _diff_summary(have: bytes, want: bytes) -> str:
    a = want.decode("utf-8", "replace").splitlines()
    b = have.decode("utf-8", "replace").splitlines()
    added = removed = 0
    first = None
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        first = first or i1 + 1
        removed += i2 - i1
        added += j2 - j1
    return f"+{added} -{removed} lines against the patched file (first difference at line {first})"


def pick_pin(lock: Lock, name: str | None, version: str | None) -> Pin:
    if name:
        return lock.pin(name)
    public = (version or "").split("+", 1)[0]
    matches = [p for p in lock.pins.values() if p.vllm_version == public]
    if lock.default_pin and any(p.name == lock.default_pin for p in matches):
        return lock.pin(lock.default_pin)
    return matches[0] if matches else lock.pin(None)


def inspect(lock: Lock, pin_name: str | None, python: str, store: Any, progress: Any) -> dict[str, Any]:
    """The report (``ok`` and per-patch states) for the vLLM ``python`` sees."""
    first = probe(python, "")
    version = (first.get("vllm") or {}).get("version")
    pin = pick_pin(lock, pin_name, version)
    kdist = dist_name(pin.name)
    found = probe(python, kdist)
    vllm = found.get("vllm")
    out: dict[str, Any] = {"python": found["python"], "pin": pin.name, "vllm_version": pin.vllm_version,
                           "installed": None, "patches": {}, "kernels": None, "ok": False, "notes": []}
    if vllm is None:
        out["notes"].append(f"vLLM is not installed in {found['python']}")
        return out
    out["installed"] = {"package": vllm["package"], "version": vllm.get("version")}
    version_ok = (vllm.get("version") or "").split("+", 1)[0] == pin.vllm_version
    if not version_ok:
        out["notes"].append(f"installed vLLM {vllm.get('version')} is not pin {pin.name}'s "
                            f"{pin.vllm_version}")
    if vllm.get("provenance"):
        try:
            prov = json.loads(vllm["provenance"])
            out["installed"]["provenance"] = {k: prov.get(k) for k in
                                              ("pin", "version", "patch_set_sha256", "patched_tree")}
        except ValueError:
            out["installed"]["provenance"] = "unreadable"
    tree = vllm_wheel.patched_tree(lock, pin, store, progress)
    out["patch_set_sha256"] = tree.series.hash()
    out["patched_tree"] = tree.patched_tree
    root = Path(vllm["root"])
    changes = tree.by_path()
    top = Path(vllm["package"]).name
    kernel = _kernels(found.get("kernels"), tree.patched_tree, root / top / "__init__.py", kdist,
                      found.get("torch"))
    out["kernels"] = kernel
    ok = version_ok
    for patch in tree.series.patches:
        paths = tree.patch_files.get(patch.name)
        if paths is None:  # not applied: the lock expects it upstream already
            out["patches"][patch.name] = {"state": "upstream", "files": {}}
            continue
        files: dict[str, Any] = {}
        for rel in paths:
            change = changes.get(rel)
            if change is None or not rel.startswith(top + "/"):
                continue  # tests, kernel sources, files another patch restores: not shipped
            target = root / rel
            if change.patched is None:
                files[rel] = {"state": "present" if not target.exists() else "stock"}
                continue
            try:
                have = target.read_bytes()
            except FileNotFoundError:
                files[rel] = {"state": "missing"}
                continue
            if have == change.patched:
                files[rel] = {"state": "present"}
            elif change.base is not None and have == change.base:
                files[rel] = {"state": "stock"}
            else:
                files[rel] = {"state": "other", "sha256": _sha(have),
                              "diff": _diff_summary(have, change.patched)}
        kernel_only = not files and any(p.startswith("csrc/") for p in paths)
        if kernel_only:
            state = "present" if kernel["ok"] else "missing"
            files["<kernel library>"] = {"state": state}
        states = {f["state"] for f in files.values()}
        # The worst file decides: missing, then other, then stock (the files say which).
        state = next((s for s in ("missing", "other", "stock") if s in states), "present")
        out["patches"][patch.name] = {"state": state, "files": files}
        ok &= state == "present"
    ok &= kernel["ok"] or not any(p.startswith("csrc/") for p in changes)
    out["ok"] = bool(ok)
    return out


def torch_problem(info: dict[str, Any], installed_torch: str | None) -> str | None:
    """Why the kernel library does not fit this environment's torch, or None.

    The library is compiled and linked against one torch (``build_info.json``
    ``torch_version``); ``torch_mismatch`` says it was not the pin's on purpose
    (``--allow-torch``).  Either way the library is reported as built for
    another torch when it differs from the pin's or from the torch installed here.
    """
    built = str(info.get("torch_version") or "").split("+", 1)[0]
    required = str(info.get("torch_required") or "").split("+", 1)[0]
    if info.get("torch_mismatch") or (required and built and built != required):
        return (f"the kernel library was built for torch {built or '?'}, not torch {required or '?'} "
                "that the pin's vLLM requires (--allow-torch); rebuild it without --allow-torch")
    have = (installed_torch or "").split("+", 1)[0]
    if built and have and built != have:
        return (f"the kernel library was built for torch {built}, this environment has torch {have}; "
                "install the pin's torch or rebuild the library against this one")
    return None


def _kernels(found: dict[str, Any] | None, tree_id: str, init: Path, kdist: str,
             installed_torch: str | None = None) -> dict[str, Any]:
    if found is None:
        return {"package": kdist, "installed": False, "ok": False,
                "note": f"{kdist} is not installed: the kernel fixes are not in effect"}
    info = found.get("build_info") or {}
    # build_info.json is the installed package's word: its library must be a file in the package.
    name = str(info.get("library", ""))
    lib = Path(found["dir"]) / name
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        lib = Path(found["dir"]) / "<no library named>"
    try:
        hooked = vllm_wheel.hook_line(kdist) in init.read_text(encoding="utf-8")
    except OSError:
        hooked = False
    res: dict[str, Any] = {
        "package": kdist, "installed": True, "dir": found["dir"],
        "tree_id": info.get("tree_id"), "library": str(lib), "library_present": lib.is_file(),
        "units": [{"unit": u.get("unit"), "sass": u.get("sass"), "ptx": u.get("ptx")}
                  for u in info.get("units", [])],
        "routes": {"vllm-hook": hooked, "entry-point": bool(found.get("entry_points"))},
    }
    res["torch"] = {"built": info.get("torch_version"), "required": info.get("torch_required"),
                    "installed": installed_torch}
    problem = torch_problem(info, installed_torch)
    res["ok"] = bool(res["tree_id"] == tree_id and res["library_present"] and (hooked or res["routes"]["entry-point"])
                     and problem is None)
    if res["tree_id"] != tree_id:
        res["note"] = f"built from tree {res['tree_id']}, the pin's patched tree is {tree_id}"
    elif problem is not None:
        res["note"] = problem
    return res


def _gpu_present() -> bool:
    return any(Path("/dev").glob("nvidia[0-9]*"))


def active_check(python: str, kdist: str) -> dict[str, Any]:
    """On a GPU machine: the kernel package's own dispatcher check."""
    res = subprocess.run([python, "-m", kdist, "check", "--json"], capture_output=True, text=True,
                         timeout=600)
    try:
        data = json.loads(res.stdout[res.stdout.index("{"):])
    except ValueError:
        data = {"output": res.stdout[-2000:] + res.stderr[-2000:]}
    return {"checked": True, "exit_code": res.returncode, "report": data, "active": res.returncode == 0}


def run(args: argparse.Namespace) -> int:
    python = args.python or os.environ.get("DSV4PATCH_VLLM_PYTHON") or sys.executable
    lock = _common.open_lock(args)
    store = _common.open_store(args)
    out = inspect(lock, args.pin, python, store, _common.progress(args))
    kernel = out.get("kernels") or {}
    if kernel.get("installed"):
        if _gpu_present():
            kernel["active"] = active_check(python, kernel["package"])
            out["ok"] &= kernel["active"]["active"]
        else:
            kernel["active"] = {"checked": False, "active": None, "reason": "no GPU on this machine"}
    rows = []
    for name, p in out["patches"].items():
        detail = ", ".join(f"{f}: {v['state']}" + (f" ({v['diff']})" if "diff" in v else "")
                           for f, v in p["files"].items() if v["state"] != "present")
        rows.append([name, p["state"], detail])
    inst = out.get("installed")
    out["notes"] = list(out["notes"]) + [
        f"python {out['python']}: " + (f"vLLM {inst.get('version')} at {inst.get('package')}" if inst
                                        else "no vLLM installed"),
        f"pin {out['pin']} (vLLM {out['vllm_version']}), patched tree {out.get('patched_tree', '?')[:12]}",
    ]
    if kernel:
        if kernel.get("installed"):
            routes = ", ".join(k for k, v in kernel["routes"].items() if v) or "none"
            archs = "; ".join(f"{Path(str(u['unit'])).name}: {' '.join(u['sass'] or [])}"
                              for u in kernel["units"])
            out["notes"].append(f"kernel library {kernel['package']}: "
                                f"{'ok' if kernel['ok'] else 'NOT OK'} (tree {str(kernel['tree_id'])[:12]}, "
                                f"routes: {routes}; archs {archs}); active: "
                                + (str(kernel["active"]["active"]) if kernel["active"]["checked"]
                                   else f"not checked ({kernel['active']['reason']})"))
            if kernel.get("note"):
                out["notes"].append(f"kernel library {kernel['package']}: {kernel['note']}")
        else:
            out["notes"].append(kernel["note"])
    for name, p in out["patches"].items():
        if p["state"] not in ("present", "upstream"):
            # In full (the table may fold a long name on a narrow terminal), with what to do.
            bad = ", ".join(f"{f}: {v['state']}" for f, v in p["files"].items() if v["state"] != "present")
            out["notes"].append(
                f"{name}: {p['state']} ({bad or 'its kernels: see the kernel library line'})\n  next: install the patched wheel again "
                f"(`dsv4patch wheel --pin {out['pin']}`, then `pip install --force-reinstall "
                "--no-deps <wheel>`)")
    out["notes"].append("everything matches the lock" if out["ok"] else "DOES NOT MATCH the lock")
    table, md = report.simple_table(f"dsv4patch status --installed: {out['python']}",
                                    ["patch", "state", "files not present"], rows)
    report.emit(args.format, out, table, md)
    return EXIT_OK if out["ok"] else EXIT_UNEXPECTED
