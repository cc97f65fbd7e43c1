"""A fork maintainer's own checkout as the tree: where the series goes on it, and a branch for it.

A ``git`` or ``local`` pin names a real commit; a user's checkout whose HEAD is
that commit, or descends from it (the fork's own commits on top), is a tree of
the pin as it is: ``apply`` checks the series against HEAD's content and commits
it on top of the current branch (or a new branch the user names), through the
same engine and journal as a tree dsv4patch made (:mod:`dsv4patch.transaction`).
Nothing here rewrites the user's history: no ref is deleted, no config written;
only HEAD's branch (or the new one) advances (issue 28).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dsv4patch import git
from dsv4patch.errors import TreeError, UsageError
from dsv4patch.tree import PinRepo

FORK_KINDS = ("git", "local")


def is_fork_checkout(path: Path, pinrepo: PinRepo, head: str | None) -> bool:
    """Whether ``path`` is a user's checkout of ``pinrepo``'s (git/local) pin: HEAD descends
    from the pin's commit and the history lacks dsv4patch's synthetic base commit."""
    pin = pinrepo.pin
    return (head is not None and pin.source.kind in FORK_KINDS
            and not git.has_object(path, f"{pinrepo.base_commit}^{{commit}}")
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


def checkout_pinrepo(path: Path, pinrepo: PinRepo, head: str) -> PinRepo:
    """``pinrepo`` re-based onto the fork checkout at ``path``: its base commit is where the
    series sits there (:func:`series_base`), its base tree that commit's content."""
    base = series_base(path, pinrepo.pin.commit, head)
    base_tree = git.out(path, "rev-parse", f"{base}^{{tree}}")
    return dataclasses.replace(pinrepo, base_commit=base, base_tree=base_tree)


def start_branch(path: Path, name: str, head: str) -> str:
    """Put HEAD on a new branch ``name`` at ``head`` (the work tree is not touched); a note.

    Already on it: nothing to do.  A branch of that name elsewhere is the user's:
    refused (exit 5), never moved or deleted."""
    if git.run(path, ["check-ref-format", "--branch", name], check=False).returncode != 0 or name.startswith("-"):
        raise UsageError(f"--branch {name!r} is not a valid branch name")
    ref = f"refs/heads/{name}"
    if git.current_ref(path) == ref:
        return f"on branch {name}"
    if git.run(path, ["rev-parse", "-q", "--verify", ref], check=False).returncode == 0:
        raise TreeError(f"{path}: branch {name} already exists; check it out (`git switch {name}`) "
                        "and run apply without --branch, or name a new branch")
    git.run(path, ["update-ref", "-m", "dsv4patch apply --branch", ref, head, ""], tied=True)
    git.run(path, ["symbolic-ref", "-m", "dsv4patch apply --branch", "HEAD", ref], tied=True)
    return f"created branch {name} at {head[:12]} and switched to it (the work tree is unchanged)"
