"""A fork maintainer's own checkout as the tree: where the series goes on it, and a branch for it.

A ``git`` or ``local`` pin names a real commit; a user's checkout whose HEAD is
that commit, or descends from it (the fork's own commits on top), is a tree of
the pin as it is: ``apply`` checks the series against HEAD's content and commits
it on top of the current branch (or a new branch the user names), through the
same engine and journal as a tree dsv4patch made (:mod:`dsv4patch.checkout.transaction`).
Nothing here rewrites the user's history: no ref is deleted, no config written;
only HEAD's branch (or the new one) advances (issue 28).  The checkout is held
vetted by the caller (:mod:`dsv4patch.guard`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from dsv4patch import git
from dsv4patch.errors import ParameterError, TreeError, param
from dsv4patch.pins import kind_of
from dsv4patch.records import frozen

if TYPE_CHECKING:
    from dsv4patch.guard import Checkout
    from dsv4patch.pins import Pin, PinRepo


def is_fork_checkout(path: Path, pinrepo: PinRepo, head: str | None) -> bool:
    """Whether ``path`` is a user's checkout of ``pinrepo``'s (git/local) pin: HEAD descends
    from the pin's commit and the history lacks dsv4patch's synthetic base commit."""
    return (descends_from_fork_pin(path, pinrepo.pin, head)
            and not git.has_object(path, f"{pinrepo.base_commit}^{{commit}}"))


def descends_from_fork_pin(path: Path, pin: Pin, head: str | None) -> bool:
    """Whether ``pin`` is a fork's (git/local) and ``head`` descends from its commit in ``path``'s
    history: the fork's own checkout, at the pin's commit or with commits on top."""
    return (head is not None and kind_of(pin).fork
            and git.has_object(path, f"{pin.commit}^{{commit}}")
            and git.is_ancestor(path, pin.commit, head))


def series_base(path: Path, pin_commit: str, head: str) -> str:
    """The commit the series sits on in a fork checkout: the parent of the oldest commit after
    ``pin_commit`` that dsv4patch made (a ``Dsv4patch-Patch`` trailer), else ``head``."""
    for entry in git.log_trailers(path, f"{pin_commit}..{head}"):
        if "Dsv4patch-Patch" in entry.trailers:
            parents = git.parents(path, entry.commit)
            if len(parents) != 1:
                raise TreeError(f"{path}: dsv4patch's commit {entry.commit[:12]} is a merge; a series "
                                "is a line of commits")
            return parents[0]
    return head


def content_tree(path: Path, commit: str) -> str:
    """The tree id of ``commit``'s files as a pin's tree holds them: without its submodules
    (gitlinks), which a pin's files never include (a fork with a submodule still has its
    pin's content)."""
    links = [name for name, entry in git.tree_files(path, commit).items() if entry.mode == "160000"]
    if not links:
        return git.tree_of(path, commit)
    with git.scratch_index(path, commit) as env:
        git.run(path, ["update-index", "--force-remove", "--", *links], env=env)
        return git.write_tree(path, env)


def checkout_pinrepo(path: Path, pinrepo: PinRepo, head: str) -> PinRepo:
    """``pinrepo`` re-based onto the fork checkout at ``path``: its base commit is where the
    series sits there (:func:`series_base`), its base tree that commit's content."""
    base = series_base(path, pinrepo.pin.commit, head)
    base_tree = git.out(path, "rev-parse", f"{base}^{{tree}}")
    return dataclasses.replace(pinrepo, base_commit=base, base_tree=base_tree)


def branch_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be the new branch of ``apply --branch``, or None when it can."""
    if git.valid_branch_name(name):
        return None
    return (f"{name!r} is not a branch name git accepts for a new branch (`git check-ref-format "
            "refs/heads/NAME`; shorthands such as @{-1}, @ and HEAD, and a leading '-', are refused)")


@frozen
class Committed:
    """A commit dsv4patch made for a patch in a checkout's history, as its trailers say."""

    patch: str
    sha256: str
    commit: str


def committed_series(path: Path, rev: str = "HEAD") -> dict[str, Committed]:
    """The patches dsv4patch committed in ``rev``'s history (``Dsv4patch-Patch`` and
    ``Dsv4patch-Sha256`` trailers), the newest commit per patch."""
    found: dict[str, Committed] = {}
    res = git.run(path, ["log", "--format=%H%x00%(trailers:unfold,only)%x01", "--extended-regexp", "--grep=^Dsv4patch-Patch: ",
                         rev, "--"], check=False)
    for chunk in res.stdout.split("\x01"):
        sha, _, trailers = chunk.strip("\n").partition("\x00")
        fields: dict[str, str] = {}
        for line in trailers.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields.setdefault(key.strip(), value.strip())
        name = fields.get("Dsv4patch-Patch")
        if sha.strip() and name and name not in found:
            found[name] = Committed(name, fields.get("Dsv4patch-Sha256", ""), sha.strip())
    return found


def start_branch(co: Checkout, name: str, head: str) -> str:
    """Put HEAD on a new branch ``name`` at ``head`` (the work tree is not touched); a note.

    Already on it: nothing to do.  A branch of that name elsewhere is the user's:
    refused (exit 5), never moved or deleted."""
    path = co.path
    problem = branch_name_problem(name)
    if problem:
        raise ParameterError(f"{param('branch')} {problem}")
    ref = f"refs/heads/{name}"
    if git.current_ref(path) == ref:
        return f"on branch {name}"
    if git.ref_commit(path, ref) is not None or git.run(path, ["rev-parse", "-q", "--verify", "--end-of-options",
                                                              ref], check=False).ok:
        raise TreeError(f"{path}: branch {name} already exists; check it out (`git switch {name}`) "
                        f"and run apply without {param('branch')}, or name a new branch")
    git.run(path, ["update-ref", "-m", "dsv4patch apply --branch", ref, head, ""], tied=True)
    git.run(path, ["symbolic-ref", "-m", "dsv4patch apply --branch", "HEAD", ref], tied=True)
    return f"created branch {name} at {head[:12]} and switched to it (the work tree is unchanged)"
