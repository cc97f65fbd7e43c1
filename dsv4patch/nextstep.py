"""Next steps as data: a command the user can run next, an action and its parameters.

The core knows what a user should do next (finish a conflict workspace, give a
port up, re-check a pin) but not how the command line spells it: that is
``commands/``' business (``commands/_words.py``).  So a result carries
:class:`Step` values, and a message that tells the user what to run names the
step with :func:`mention` (as :func:`dsv4patch.errors.param` names a
parameter): the message stays a readable string in the core and spells no
option.  The output layer (:mod:`dsv4patch.report`, where ``main.py`` installs
the command line's renderer once at start) turns every mention into the
command a user can copy (``dsv4patch resolve --continue --tree /t``, values
shell-quoted) wherever text reaches the terminal, a Markdown report or JSON.

A mention is the step as ASCII-only JSON between two brackets that JSON never
writes there (``\u27e6 \u27e7``), so :func:`substitute` finds each one again
without a table kept on the side.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsv4patch.records import frozen


@frozen
class Blank:
    """A value the user fills in (``DIR``, ``NAME``): shown as it is, never quoted."""

    what: str


Value = str | bool | Blank  # a value (shell-quoted when shown), True for a flag, or a blank to fill


@frozen
class Step:
    """A command the user can run next: ``action`` (the command's verb) and its parameters by name
    (the core's names, ``tree``, ``three_way``), in the order they are shown."""

    action: str
    params: tuple[tuple[str, Value], ...] = ()

    @classmethod
    def of(cls, action: str, **params: str | Path | bool | Blank | None) -> Step:
        """The step ``action`` with ``params`` in the order given; None and False leave a parameter out."""
        kept: list[tuple[str, Value]] = []
        for name, value in params.items():
            if value is None or value is False:
                continue
            kept.append((name, str(value) if isinstance(value, Path) else value))
        return cls(action, tuple(kept))

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "params": [[n, _value_json(v)] for n, v in self.params]}

    @classmethod
    def from_json(cls, data: object) -> Step:
        """A step :meth:`to_json` wrote; ValueError for anything else."""
        if not isinstance(data, dict):
            raise ValueError("not a step")
        action, params = data.get("action"), data.get("params")
        if not isinstance(action, str) or not isinstance(params, list):
            raise ValueError("not a step")
        out: list[tuple[str, Value]] = []
        for item in params:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                raise ValueError("not a step parameter")
            out.append((item[0], _value_from_json(item[1])))
        return cls(action, tuple(out))


def _value_json(value: Value) -> object:
    return {"blank": value.what} if isinstance(value, Blank) else value


def _value_from_json(value: object) -> Value:
    if isinstance(value, bool | str):
        return value
    if isinstance(value, dict) and isinstance(value.get("blank"), str):
        return Blank(value["blank"])
    raise ValueError("not a step value")


_OPEN, _CLOSE = "\u27e6", "\u27e7"
# ensure_ascii JSON holds no non-ASCII character, so no closing bracket: each mention ends at the first one.
# Text from outside (a tree's line in a conflict note, a patch's name) may hold the brackets too: a
# mention is at most MENTION_LIMIT characters, and what does not read back as a step is left as it is.
MENTION_LIMIT = 4096
_MENTION = re.compile(f"{_OPEN}([\x20-\x7e]{{0,{MENTION_LIMIT}}}){_CLOSE}")


def mention(step: Step, *, bare: bool = False) -> str:
    """``step`` named inside a message; shown as the command line (``bare``: without the program's
    name, as in "an ``apply --3way`` workspace")."""
    body = {"step": step.to_json(), "bare": bare} if bare else {"step": step.to_json()}
    return _OPEN + json.dumps(body, ensure_ascii=True, separators=(",", ":")) + _CLOSE


def substitute(text: str, show: Callable[[Step, bool], str | None]) -> str:
    """``text`` with each :func:`mention` replaced by ``show(step, bare)`` (what is not a mention
    :func:`mention` wrote, or what ``show`` refuses with None, is left as it is)."""
    if _OPEN not in text:
        return text

    def one(m: re.Match[str]) -> str:
        try:
            body = json.loads(m.group(1))
            step = Step.from_json(body.get("step") if isinstance(body, dict) else None)
        except (ValueError, RecursionError):  # json's errors are ValueErrors; "[[[…" too deep to read
            return m.group(0)
        shown = show(step, body.get("bare") is True)
        return m.group(0) if shown is None else shown

    return _MENTION.sub(one, text)
