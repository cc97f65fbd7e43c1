"""A tree's kernel plan kept per commit, so a warm ``wheel`` does not scan the tree's includes again.

Why this exists: :func:`dsv4patch.kernels.sources.plan` reads the tree's
``CMakeLists.txt``, its bindings and, for every unit of the target, each local
header it includes (a few hundred files of vLLM's ``csrc``): about a third of a
warm ``wheel``'s own work once its kernel objects are cached.  The plan is a
pure function of the commit's content, the base it is taken from and the code
that scans (``sources.py`` and this module, with dsv4patch's version), so it is
kept under ``<cache>/kernel-plans/<key>.json``, the key the sha256 of all of
those.  It is used only where the caller has just checked that the work tree is
exactly HEAD's tree (``build_tree``'s ``expect_tree``): elsewhere a user's
uncommitted edit counts, and the tree is scanned.  An entry is read without
following a link and within a size bound, and must have exactly the plan's
shape and name the same commit, base and tree; anything else is scanned again
and written anew.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4patch import git, safeio
from dsv4patch.errors import Dsv4Error
from dsv4patch.hashing import code_identity
from dsv4patch.kernels import sources
from dsv4patch.kernels.sources import KernelPlan, Op, TranslationUnit

if TYPE_CHECKING:
    from dsv4patch.store import Store

SCHEMA = "kernel-plan-v1"
PLANS = "kernel-plans"  # the cache's directory of plans
_DECIDING = ("kernels/sources.py", "kernels/plancache.py")  # relative to dsv4patch/


def plan(tree: Path, base: str | None, store: Store) -> KernelPlan:
    """:func:`sources.plan` of ``tree`` (clean: its work tree is HEAD's tree), from the cache when kept."""
    head = git.head(tree)
    if head is None:
        return sources.plan(tree, base)  # no commit: the scan says so
    base = base or git.root_commit(tree)
    entry = store.subdir(PLANS) / f"{_key(head, base)}.json"
    kept = _read(entry, tree, head, base)
    if kept is not None:
        return kept
    fresh = sources.plan(tree, base)
    try:
        safeio.atomic_write(entry, json.dumps(_to_json(fresh), sort_keys=True) + "\n", durable=False)
    except OSError:
        pass  # a full or read-only cache only loses the shortcut
    return fresh


def _key(head: str, base: str) -> str:
    facts = {"schema": SCHEMA, "head": head, "base": base, "code": code_identity(_DECIDING)}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def _to_json(p: KernelPlan) -> dict[str, Any]:
    return {
        "schema": SCHEMA, "base": p.base, "head": p.head, "tree_id": p.tree_id, "changed": list(p.changed),
        "units": [[u.path, u.target, list(u.headers), list(u.changed), u.arch_var] for u in p.units],
        "ops": [[o.name, o.function, o.schema, o.unit, o.namespace, o.guard] for o in p.ops],
        "bindings": p.bindings, "defines": {k: list(v) for k, v in p.defines.items()},
        "torch_target_version": p.torch_target_version, "unmapped": list(p.unmapped),
        "cuda_standard": p.cuda_standard,
    }


def _read(entry: Path, tree: Path, head: str, base: str) -> KernelPlan | None:
    """The kept plan of ``head`` from ``base``, re-rooted at ``tree``; None for anything else."""
    try:
        data = safeio.read_json(entry)
    except (OSError, Dsv4Error):
        return None
    try:
        plan = _from_json(data, tree)
    except (TypeError, ValueError, KeyError):
        return None
    return plan if (plan.head, plan.base) == (head, base) else None


def _strs(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError("not a list of strings")
    return tuple(value)


def _opt(value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError("not a string or null")
    return value


def _row(value: object, n: int) -> list[object]:
    if not isinstance(value, list) or len(value) != n:
        raise TypeError(f"not a row of {n}")
    return value


def _from_json(data: object, tree: Path) -> KernelPlan:
    if not isinstance(data, dict) or set(data) != set(_FIELDS) or data["schema"] != SCHEMA:
        raise ValueError("not a kernel plan of this schema")
    units = tuple(TranslationUnit(_str(r[0]), _str(r[1]), _strs(r[2]), _strs(r[3]), _opt(r[4]))
                  for r in (_row(v, 5) for v in _list(data["units"])))
    ops = tuple(Op(_str(r[0]), _str(r[1]), _str(r[2]), _str(r[3]), _str(r[4]), _opt(r[5]))
                for r in (_row(v, 6) for v in _list(data["ops"])))
    defines = data["defines"]
    if not isinstance(defines, dict):
        raise TypeError("defines: not an object")
    standard = data["cuda_standard"]
    if standard is not None and (not isinstance(standard, int) or isinstance(standard, bool)):
        raise TypeError("cuda_standard: not an integer")
    return KernelPlan(tree=tree, base=_str(data["base"]), head=_str(data["head"]), tree_id=_str(data["tree_id"]),
                      changed=_strs(data["changed"]), units=units, ops=ops, bindings=_opt(data["bindings"]),
                      defines={_str(k): _strs(v) for k, v in defines.items()},
                      torch_target_version=_opt(data["torch_target_version"]), unmapped=_strs(data["unmapped"]),
                      cuda_standard=standard)


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError("not a string")
    return value


def _list(value: object) -> list[object]:
    if not isinstance(value, list):
        raise TypeError("not a list")
    return value


_FIELDS = ("schema", "base", "head", "tree_id", "changed", "units", "ops", "bindings", "defines",
           "torch_target_version", "unmapped", "cuda_standard")
