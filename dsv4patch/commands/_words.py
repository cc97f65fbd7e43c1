"""The command line's words for what the core names by parameter and by next step.

The core never spells an option: a message names a parameter with
:func:`dsv4patch.errors.param` (``⟨lock⟩``) and a command to run next with
:func:`dsv4patch.nextstep.mention` (a :class:`~dsv4patch.nextstep.Step`);
:func:`render` turns them into the option a user types (``--lock``) and the
command line a user can copy (``dsv4patch resolve --continue --tree /t``).
``main.py`` installs :func:`render` into the output layer once at start
(:func:`dsv4patch.report.use_words`), so every path to the user renders: an
error, a result's text, table cells, Markdown and JSON, progress and warning
lines.  ``tests/test_architecture.py`` checks that every parameter the core
names has its word here.
"""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING

from dsv4patch.nextstep import Blank, substitute

if TYPE_CHECKING:
    from dsv4patch.nextstep import Step

PROGRAM = "dsv4patch"

# parameter -> how the command line spells it
OPTIONS = {
    "abort": "--abort",
    "allow_torch": "--allow-torch",
    "arch": "--arch",
    "as_variant": "--as-variant",
    "branch": "--branch",
    "cache_dir": "--cache-dir",
    "cases": "--cases",
    "cont": "--continue",
    "dry_run": "--dry-run",
    "extra_include": "--extra-include",
    "force_sm120_topk": "--force-sm120-topk",
    "from_pin": "--from",
    "git": "--git",
    "installed": "--installed",
    "kernels": "--kernels",
    "local": "--local",
    "lock": "--lock",
    "name": "--name",
    "no_build": "--no-build",
    "nvcc": "--nvcc",
    "out": "--out",
    "pin": "--pin",
    "platform": "--platform",
    "python": "--python",
    "resolutions": "--resolutions",
    "sdist": "--sdist",
    "series": "--series",
    "three_way": "--3way",
    "to": "--to",
    "torch": "--torch",
    "tree": "--tree",
    "update": "--update",
    "upstream_from": "--from",
    "upstream_tests": "--upstream-tests",
    "workspace": "--workspace",
}

# the commands a step may name (tests/test_architecture.py checks they are the parser's)
COMMANDS = frozenset({"apply", "build", "check", "fetch", "lock", "port", "refresh", "releases", "resolve",
                      "selftest", "status", "verify", "wheel"})

_PARAM = re.compile("\u27e8([a-z_]+)\u27e9")


def option(name: str) -> str:
    """How the command line spells the core's parameter ``name``."""
    return OPTIONS[name]


_BLANK = re.compile(r"[A-Z][A-Z_]{0,15}")


def _shown(step: Step, bare: bool) -> str | None:
    """``step``'s command line, or None for one the core could not have written (a mention forged in
    text from outside: an unknown command or parameter, a blank that is not a placeholder word)."""
    if step.action not in COMMANDS or any(name not in OPTIONS for name, _ in step.params):
        return None
    if any(isinstance(v, Blank) and not _BLANK.fullmatch(v.what) for _, v in step.params):
        return None
    return command(step, bare)


def command(step: Step, bare: bool = False) -> str:
    """``step`` as the command line a user types (``bare``: without the program's name)."""
    words = [] if bare else [PROGRAM]
    words.append(step.action)
    for name, value in step.params:
        words.append(OPTIONS.get(name, f"\u27e8{name}\u27e9"))
        if isinstance(value, Blank):
            words.append(value.what)
        elif isinstance(value, str):
            words.append(shlex.quote(value))
    return " ".join(words)


def render(text: str) -> str:
    """``text`` with each step the core mentioned shown as its command line and each parameter it
    named shown as its option."""
    if "\u27e6" in text:
        text = substitute(text, _shown)
    if "\u27e8" not in text:
        return text
    return _PARAM.sub(lambda m: OPTIONS.get(m.group(1), m.group(0)), text)
