"""The next step for each kind of failure: the command (or lock edit) that resolves it.

A diagnosis alone leaves a maintainer where it found them; every status that
differs from what the lock expects, and every tree-id drift, gets one line
here that names the command to run next.  Kept apart from the engine so
``check``, ``apply`` and their JSON and Markdown outputs say the same thing.
"""

from __future__ import annotations

from pathlib import Path

from dsv4patch.nextstep import Blank, Step, mention

_DIR, _VERSION = Blank("DIR"), Blank("VERSION")
_PORT = mention(Step.of("port", to=_VERSION))


def next_step(status: str, expected: str, pin: str, patch: str, lock: Path | str) -> str:
    """What to do about ``patch`` having ``status`` on ``pin`` when the lock expects ``expected``."""
    where = f"pin {pin} in {lock}"
    expect = f'set expect_patches."{patch}" = "{status}" for {where}'
    apply_3way = Step.of("apply", pin=pin, tree=_DIR, three_way=True)
    if status == "conflict":
        return (f"resolve it in a tree: `{mention(apply_3way)}`, edit, "
                f"`{mention(Step.of('resolve', cont=True, tree=_DIR))}` (writes the pin's variant), or "
                f"`{_PORT}` for a new release")
    if status == "offset":
        return (f"refresh it: `{mention(apply_3way)}` (commits it with "
                f"its offset) then `{mention(Step.of('refresh', pin=pin, tree=_DIR, as_variant=True))}` (writes "
                f"the exact variant); or {expect}")
    if status == "missing-file":
        return (f"the file moved or is gone in this pin: port the patch (`{_PORT}`, or "
                f"`{mention(Step.of('apply', three_way=True), bare=True)}` and "
                f"`{mention(Step.of('resolve', cont=True), bare=True)}`), or {expect}")
    if status in ("upstream", "already-applied"):
        return (f"the fix is already in this pin: drop it ({expect}; `{_PORT}` drops it with its evidence)")
    if status == "not-checked":
        return "fix the patch it depends on first (see its next step), then run check again"
    if status == "clean" and expected != "clean":
        return f'it applies now: set expect_patches."{patch}" = "clean" (or remove the entry) for {where}'
    return f"run `{mention(Step.of('check', pin=pin))}` again after fixing it"


def drift(pin: str, what: str) -> str:
    """A derived tree id differs from the lock's."""
    return (f"if the change is intended (a new sdist, a new variant), record it with "
            f"`{mention(Step.of('lock', update=True, pin=pin))}`; otherwise the {what} changed under the lock: "
            "restore the inputs")
