"""The command line's words for what the core names by parameter.

The core never spells an option: a message names a parameter with
:func:`dsv4patch.errors.param` (``⟨lock⟩``), and :func:`render` turns it into the
option a user types (``--lock``) where a message reaches the terminal or JSON
(``main.py`` for errors).  ``tests/test_architecture.py`` checks that every
parameter the core names has its word here.
"""

from __future__ import annotations

import re

# parameter -> how the command line spells it
OPTIONS = {
    "allow_torch": "--allow-torch",
    "branch": "--branch",
    "cases": "--cases",
    "force_sm120_topk": "--force-sm120-topk",
    "git": "--git",
    "kernels": "--kernels",
    "local": "--local",
    "name": "--name",
    "lock": "--lock",
    "pin": "--pin",
    "platform": "--platform",
    "python": "--python",
    "to": "--to",
}

_PARAM = re.compile("\u27e8([a-z_]+)\u27e9")


def render(text: str) -> str:
    """``text`` with each parameter the core named shown as its option."""
    return _PARAM.sub(lambda m: OPTIONS.get(m.group(1), m.group(0)), text)
