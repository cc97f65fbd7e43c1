"""``dsv4patch resolve``: the conflict workspace that ``apply --3way`` opens, and how it closes.

Without a workspace a conflict leaves the user with a precise diagnosis and
nothing else: resolving meant ``git am -3`` and ``format-patch`` by hand.
``apply --3way`` (see :func:`start`) instead leaves the tree with

* the patches before the failing one committed (the same commits a plain
  ``apply`` makes), moved to under apply's journal;
* the failing patch applied with ``git apply --3way``: conflict markers in the
  files it could not merge, the rest staged.  3-way needs the file each hunk
  was made against (the patch's ``index`` line names its blob); a pin
  materialized from an sdist or a fork does not have it, so it is copied,
  by id, from another pin of the lock whose series produces it;
* a state file inside the tree's git directory (``.git/dsv4patch-resolve.json``)
  naming the lock, pin, patch and the commits to return to.

The state file lives in the tree, which dsv4patch does not trust (see "What
dsv4patch trusts" in the README): its commits must be commit ids, its paths
paths inside the tree, and it cannot choose where ``resolve`` writes.  The
lock is the one this command finds (``--lock``, ``$DSV4PATCH_LOCK``, the
checkout's ``locks/vllm.toml``) and must be the one the state names; the
cache and the kernel wheel's directory are this command's ``--cache-dir`` and
``--out`` (the state's values are only compared, never used).

``resolve --continue`` turns the resolved tree into the refreshed patch (a
``format-patch`` of the resolution on top of the committed prefix), writes
it as the pin's variant (``patches/variants/PIN/NAME`` beside the series),
records it in the lock with the derived ``patched_tree``, puts the tree back
at the prefix and runs ``apply --3way`` again: the next conflict opens the
next workspace, or the series completes.  ``resolve --abort`` puts the tree
back at the commit it had before ``apply --3way``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

from dsv4patch import engine, git, portspace, report, tree
from dsv4patch import lock as lockmod
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK, FetchError, TreeError, UsageError
from dsv4patch.lock import Lock, Pin
from dsv4patch.series import Patch, Series, series_for_pin
from dsv4patch.store import Store
from dsv4patch.progress import Progress

HELP = "finish (--continue) or undo (--abort) the conflict workspace `apply --3way` left in a tree"
STATE = "dsv4patch-resolve.json"
_INDEX_LINE = re.compile(rb"^index ([0-9a-f]{7,64})\.\.[0-9a-f]{7,64}", re.M)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("resolve", help=HELP, description=HELP)
    _common.add_lock(p, pins=False, series=False)
    p.add_argument("--tree", type=Path, required=True, help="the tree `apply --3way` left a conflict in")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--continue", dest="cont", action="store_true",
                      help="write the resolution as the pin's variant, update the lock, go on applying")
    what.add_argument("--abort", action="store_true",
                      help="put the tree back at the commit it had before `apply --3way`")
    p.add_argument("--out", type=Path, default=None,
                   help="--continue: where the kernel wheel goes when apply builds (default: ./dist)")
    _common.add_output(p)
    _common.add_cache(p)


def variants_dir(lock: Lock, pin: Pin) -> Path:
    """Where a pin's variants live: ``variants/PIN`` beside its first series file."""
    return lock.series[pin.series[0]].path.parent / "variants" / pin.name


def state_path(gitdir: Path) -> Path:
    return gitdir / STATE


def read_state(gitdir: Path, path: Path) -> dict[str, Any]:
    sp = state_path(gitdir)
    if not sp.exists():
        raise TreeError(
            f"{path} has no conflict workspace (no {sp}); `dsv4patch apply --pin P --tree {path} "
            "--3way` opens one when a patch conflicts"
        )
    try:
        data = json.loads(sp.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError("not an object")
        for key in ("lock", "pin", "patch", "orig_head", "at"):
            if not isinstance(data.get(key), str):
                raise ValueError(f"missing {key}")
        _check_state(data)
    except (OSError, ValueError) as exc:
        raise TreeError(
            f"{sp} (the conflict workspace's state) is unreadable ({exc}); restore the tree "
            "yourself (`git reset --hard` to the commit you want) and delete the file"
        ) from None
    return data


def _check_state(data: dict[str, Any]) -> None:
    """Refuse (ValueError) a state whose values are not what dsv4patch writes.

    The commits go to ``git reset --hard`` and ``commit-tree`` (an option or a
    revision expression must not), the conflict paths are read from the tree.
    """
    for key in ("orig_head", "at", "base_commit"):
        value = data.get(key)
        if (key != "base_commit" or value is not None) and not (
                isinstance(value, str) and portspace.COMMIT_ID.match(value)):
            raise ValueError(f"{key} = {value!r} is not a full commit id")
    conflicts = data.get("conflicts") or []
    if not isinstance(conflicts, list):
        raise ValueError("conflicts is not a list")
    for name in conflicts:
        if not (isinstance(name, str) and portspace.inside_tree(name)):
            raise ValueError(f"conflicts names {name!r}, which is not a path inside the tree")
    series = data.get("series")
    if series is not None and not (isinstance(series, list) and all(isinstance(x, str) for x in series)):
        raise ValueError("series is not a list of series names")


def _state_lock(args: argparse.Namespace, state: dict[str, Any], path: Path) -> Path:
    """The lock this command uses: found as every command finds it, and the one the state names."""
    named = Path(state["lock"])
    try:
        found = lockmod.find_lock(getattr(args, "lock", None))
    except UsageError:
        raise TreeError(
            f"the conflict workspace in {path} was opened with the lock {named}; pass it: "
            f"`dsv4patch resolve --tree {path} --lock {named} ...`") from None
    if os.path.abspath(found) != os.path.abspath(named):
        raise TreeError(
            f"the conflict workspace in {path} names the lock {named}, this command uses {found} "
            f"(from --lock, $DSV4PATCH_LOCK or the current directory); resolve writes the variant "
            f"into the lock it uses, so run it with `--lock {named}` if that is the lock you "
            "opened the workspace with"
        )
    return found


def _write_state(gitdir: Path, data: dict[str, Any]) -> None:
    sp = state_path(gitdir)
    tmp = sp.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    os.replace(tmp, sp)


def _seed_preimages(path: Path, lock: Lock, pin: Pin, patch: Patch, store: Store,
                    progress: Progress) -> list[str]:
    """Copy the blobs the patch was made against into the tree's repository.

    ``git apply --3way`` merges only when it has the preimage blob named in
    each ``index`` line.  Objects are content-addressed, so the blob is looked
    up by id in the other pins of the lock (the default pin first), after
    running their series (which writes every intermediate blob); returns
    the ids still missing.
    """
    wanted = {m.group(1).decode() for m in _INDEX_LINE.finditer(patch.path.read_bytes())}
    missing = sorted(a for a in wanted if set(a) != {"0"} and git.resolve_blob(path, a) is None)
    others = sorted((p for p in lock.pins.values() if p.name != pin.name),
                    key=lambda p: p.name != lock.default_pin)
    for other in others:
        if not missing:
            break
        try:
            repo = tree.materialize(other, store, progress)
        except FetchError:  # a pin that cannot be fetched or verified now: try the next one
            continue
        for ran in (False, True):
            if ran:
                engine.run_series(repo.repo, repo.base_commit, series_for_pin(lock, other))
            for abbrev in list(missing):
                full = git.resolve_blob(repo.repo, abbrev)
                if full:
                    git.hash_object(path, git.cat_blob(repo.repo, full))
                    missing.remove(abbrev)
            if not missing:
                break
    return missing


def start(
    args: argparse.Namespace,
    path: Path,
    gitdir: Path,
    lock: Lock,
    pin: Pin,
    pinrepo: tree.PinRepo,
    series: Series,
    result: engine.SeriesResult,
    head: str | None,
    notes: list[str],
) -> dict[str, Any] | None:
    """Open a conflict workspace for the first patch that conflicts; None if it is not a conflict."""
    from dsv4patch.commands import apply

    k = next(i for i, r in enumerate(result.patches) if r.status.blocks)
    failing, patch = result.patches[k], series.patches[k]
    if failing.status is not engine.Status.CONFLICT:
        return None
    drivers = git.merge_drivers(path)
    if drivers:
        raise TreeError(
            f"{path}: its git config names merge drivers ({', '.join(drivers)}), programs a 3-way "
            "merge would run; remove them, or use a new directory for --tree"
        )
    prefix = engine.SeriesResult(result.pin, result.base_commit, result.base_tree, result.patches[:k])
    commits = apply.plan_commits(path, pinrepo.base_commit, series, prefix)
    at = commits[-1] if commits else pinrepo.base_commit
    if head is None or (head != pinrepo.base_commit and head not in commits):
        raise TreeError(
            f"{path} is at {head}, which is neither pin {pin.name}'s base commit "
            f"{pinrepo.base_commit[:12]} nor a state dsv4patch made; check out the base commit "
            "or use a new directory"
        )
    store = _common.open_store(args)
    missing = _seed_preimages(path, lock, pin, patch, store, _common.progress(args))
    if missing:
        raise TreeError(
            f"{patch.name} conflicts on pin {pin.name}, and a 3-way merge needs the files the "
            f"patch was made against (blobs {', '.join(missing)}), which no pin of {lock.path} "
            f"has; add the pin the patch was made for to the lock (or regenerate the patch with "
            f"`git format-patch` against a pin of the lock), then run apply --3way again. "
            f"{path} was left unchanged"
        )
    if head != at:
        apply.move_tree(path, gitdir, head, at)
    res = git.apply_3way(path, patch.path)
    conflicted = git.unmerged_paths(path)
    if not res.ok and not conflicted:
        if head != at:
            apply.move_tree(path, gitdir, at, head)
        raise TreeError(
            f"{patch.name}: `git apply --3way` could not merge it into pin {pin.name}:\n"
            f"{res.stderr.strip()}\n{path} was left unchanged; port it with "
            f"`dsv4patch port --to {pin.name}` or edit the patch by hand"
        )
    # Through resolve --continue, --abort still returns to before the first apply --3way.
    orig = getattr(args, "orig_head", None) or head
    _write_state(gitdir, {
        "lock": os.path.abspath(lock.path), "pin": pin.name, "series": getattr(args, "series", None),
        "patch": patch.name, "patch_index": k, "orig_head": orig, "at": at,
        "base_commit": pinrepo.base_commit,
        "cache_dir": str(args.cache_dir) if args.cache_dir else None,
        "build": bool(getattr(args, "build", False)),
        "out": str(args.out) if getattr(args, "out", None) else None,
        "conflicts": conflicted,
    })
    again = f" --lock {lock.path}" + (f" --cache-dir {args.cache_dir}" if args.cache_dir else "") + (
        f" --out {args.out}" if getattr(args, "out", None) else "")
    if conflicted:
        where = f"conflicts in {', '.join(conflicted)} (conflict markers)"
        todo = "edit the files"
    else:
        where = "it merged cleanly (staged, not committed)"
        todo = f"review the merge (`git -C {path} diff --cached`)"
    notes += [
        f"{patch.name} conflicts on pin {pin.name}: {failing.message}",
        f"committed {len(commits)} earlier patch(es) (HEAD {at[:12]}) and applied {patch.name} "
        f"3-way: {where}",
        f"next: {todo}, then `dsv4patch resolve --continue --tree {path}{again}` (writes the "
        f"resolution as pin {pin.name}'s variant of {patch.name}, updates {lock.path.name}, "
        f"applies the rest); `dsv4patch resolve --abort --tree {path}` puts the tree back at "
        f"{orig[:12]}",
    ]
    return {"patch": patch.name, "conflicts": conflicted, "head": at,
            "state": str(state_path(gitdir))}


def _continue(args: argparse.Namespace, path: Path) -> tuple[argparse.Namespace, list[str]]:
    """Write the resolution as a variant and put the tree back at the prefix; apply's args."""
    from dsv4patch.commands import apply

    with apply.tree_lock(path):
        gitdir = apply._git_dir(path)
        state = read_state(gitdir, path)
        largs = argparse.Namespace(lock=_state_lock(args, state, path), series=state.get("series"))
        lock = _common.open_lock(largs)
        pin = lock.pin(state["pin"])
        series = series_for_pin(lock, pin)
        patch = next((p for p in series.patches if p.name == state["patch"]), None)
        if patch is None:
            raise TreeError(
                f"{state['patch']} is no longer in pin {pin.name}'s series in {lock.path}; run "
                f"`dsv4patch resolve --abort --tree {path}`"
            )
        touched = sorted(set(state.get("conflicts") or []) | set(patch.touched))
        left = portspace.marked(path, touched) + [u for u in git.unmerged_paths(path) if u not in touched]
        if left:
            raise TreeError(
                f"{', '.join(left)} in {path} still hold conflict markers; edit them (keep the "
                "code you want, remove the <<<<<<< ======= >>>>>>> lines), then run "
                f"`dsv4patch resolve --continue --tree {path}` again (or --abort)"
            )
        text = portspace.resolution_patch(path, state["at"], patch, series.patches.index(patch) + 1,
                                          len(series.patches))
        if text is None:
            raise TreeError(
                f"the resolution of {patch.name} changes nothing in {path}; if the pin does not "
                f"need it, set expect_patches.\"{patch.name}\" for pin {pin.name} in {lock.path} "
                f"and run `dsv4patch resolve --abort --tree {path}`"
            )
        target = variants_dir(lock, pin) / patch.name
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
        lockmod.set_variant(lock.path, pin.name, patch.name, target)
        notes = [f"wrote {target}: pin {pin.name}'s variant of {patch.name}, recorded in {lock.path}"]
        git.reset_hard(path, state["at"])
        state_path(gitdir).unlink()
        if not state.get("series"):
            lock = _common.open_lock(largs)
            pin = lock.pin(pin.name)
            store = _common.open_store(args)
            repo = tree.materialize(pin, store, _common.progress(args))
            res = engine.run_series(repo.repo, repo.base_commit, series_for_pin(lock, pin))
            values: dict[str, Any] = {"base_tree": repo.base_tree, "patched_tree": res.final_tree}
            lockmod.update_derived(lock.path, pin.name, values, {})
            if res.final_tree:
                notes.append(f"pin {pin.name}: patched_tree {res.final_tree} in {lock.path}")
    out = getattr(args, "out", None)
    if state.get("build") and state.get("out") and str(out) != state["out"]:
        notes.append(f"the workspace was opened with --out {state['out']}; the kernel wheel goes to "
                     f"{out or './dist'} (pass --out to resolve to choose)")
    aargs = argparse.Namespace(
        lock=largs.lock, pin=state["pin"], series=state.get("series"), tree=path,
        build=bool(state.get("build")), out=out,
        format=args.format, cache_dir=getattr(args, "cache_dir", None),
        three_way=True, pre_notes=notes, orig_head=state["orig_head"],
    )
    return aargs, notes


def run(args: argparse.Namespace) -> int:
    from dsv4patch.commands import apply

    path = _common.tree_path(args)
    if args.cont:
        aargs, _notes = _continue(args, path)
        return apply.run(aargs)
    with apply.tree_lock(path):
        gitdir = apply._git_dir(path)
        state = read_state(gitdir, path)
        git.reset_hard(path, state["orig_head"])
        state_path(gitdir).unlink()
    out = {"tree": str(path), "ok": True, "head": state["orig_head"], "notes": [
        f"aborted the conflict workspace of {state['patch']} (pin {state['pin']}): {path} is back "
        f"at {state['orig_head'][:12]}"]}
    table, md = report.simple_table("dsv4patch resolve --abort", ["tree", "head"],
                                    [[str(path), state["orig_head"][:12]]])
    report.emit(args.format, out, table, md)
    return EXIT_OK

