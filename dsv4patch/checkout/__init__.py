"""The user's checkout (``--tree``): moving it between states atomically
(:mod:`.transaction`), applying a series to it, its status, its conflict workspaces
(``apply --3way``, ``port --workspace``) and a fork's own checkout.

Every git call in it goes through :mod:`dsv4patch.guard`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsv4patch import face

if TYPE_CHECKING:
    from dsv4patch.checkout.applying import ApplyResult, KernelBuild, apply_pin
    from dsv4patch.checkout.conflicts import marked as marked_files
    from dsv4patch.checkout.conflicts import resolution_patch
    from dsv4patch.checkout.forkcheckout import (
        Committed,
        branch_name_problem,
        checkout_pinrepo,
        committed_series,
        content_tree,
        is_fork_checkout,
    )
    from dsv4patch.checkout.resolving import (
        Invocation,
        abort_workspace,
        continue_workspace,
        has_workspace,
        variants_dir,
    )
    from dsv4patch.checkout.states import PortState, inside_tree
    from dsv4patch.checkout.states import read as read_state_file
    from dsv4patch.checkout.states import write as write_state_file
    from dsv4patch.checkout.transaction import (
        commit_message,
        exclusive_checkout,
        interrupted,
        is_empty,
        move_tree,
        open_tree,
        plan_commits,
        reset_tree,
    )
    from dsv4patch.checkout.transaction import recover as recover_tree
    from dsv4patch.checkout.treestatus import makes_commit, patch_of_commit, tree_pin, tree_status

# The public face: name -> "module:attribute" (what other packages may use; see dsv4patch/face.py).
FACE = {
    "ApplyResult": "applying:ApplyResult",
    "Committed": "forkcheckout:Committed",
    "Invocation": "resolving:Invocation",
    "KernelBuild": "applying:KernelBuild",
    "PortState": "states:PortState",
    "abort_workspace": "resolving:abort_workspace",
    "apply_pin": "applying:apply_pin",
    "branch_name_problem": "forkcheckout:branch_name_problem",
    "checkout_pinrepo": "forkcheckout:checkout_pinrepo",
    "commit_message": "transaction:commit_message",
    "committed_series": "forkcheckout:committed_series",
    "content_tree": "forkcheckout:content_tree",
    "continue_workspace": "resolving:continue_workspace",
    "has_workspace": "resolving:has_workspace",
    "inside_tree": "states:inside_tree",
    "interrupted": "transaction:interrupted",
    "is_empty": "transaction:is_empty",
    "is_fork_checkout": "forkcheckout:is_fork_checkout",
    "makes_commit": "treestatus:makes_commit",
    "marked_files": "conflicts:marked",
    "move_tree": "transaction:move_tree",
    "open_tree": "transaction:open_tree",
    "patch_of_commit": "treestatus:patch_of_commit",
    "plan_commits": "transaction:plan_commits",
    "read_state_file": "states:read",
    "recover_tree": "transaction:recover",
    "reset_tree": "transaction:reset_tree",
    "resolution_patch": "conflicts:resolution_patch",
    "exclusive_checkout": "transaction:exclusive_checkout",
    "tree_pin": "treestatus:tree_pin",
    "tree_status": "treestatus:tree_status",
    "variants_dir": "resolving:variants_dir",
    "write_state_file": "states:write",
}
__all__ = [
    "ApplyResult",
    "Committed",
    "Invocation",
    "KernelBuild",
    "PortState",
    "abort_workspace",
    "apply_pin",
    "branch_name_problem",
    "checkout_pinrepo",
    "commit_message",
    "committed_series",
    "content_tree",
    "continue_workspace",
    "has_workspace",
    "inside_tree",
    "interrupted",
    "is_empty",
    "is_fork_checkout",
    "makes_commit",
    "marked_files",
    "move_tree",
    "open_tree",
    "patch_of_commit",
    "plan_commits",
    "read_state_file",
    "recover_tree",
    "reset_tree",
    "resolution_patch",
    "exclusive_checkout",
    "tree_pin",
    "tree_status",
    "variants_dir",
    "write_state_file",
]
if not TYPE_CHECKING:
    __getattr__ = face.lazy(__name__, globals(), FACE)
