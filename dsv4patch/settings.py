"""The defaults dsv4patch takes from its environment, read once, at the edge.

Why one record: an option whose default comes from an environment variable
(``--python`` from ``$DSV4PATCH_TORCH_PYTHON``, ``--lock`` from ``$DSV4PATCH_LOCK``,
...) used to be read wherever the core needed it, each site with its own fallback.
Now ``commands/`` builds one :class:`Settings` from ``os.environ`` per run and hands
each value to the core with an explicit keyword: the precedence (option > environment >
built-in) is spelled once, in the command, and a library caller of the core says what
it wants instead of inheriting the process's environment.  ``tests/test_architecture.py``
refuses a core module that reads the environment for a setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    """What the environment sets; None where it sets nothing (the built-in default then applies)."""

    torch_python: str | None = None  # $DSV4PATCH_TORCH_PYTHON: --python of build, apply and wheel
    vllm_python: str | None = None  # $DSV4PATCH_VLLM_PYTHON: --python of status --installed and selftest
    lock: Path | None = None  # $DSV4PATCH_LOCK: the lock when --lock is not given
    cache: Path | None = None  # $DSV4PATCH_CACHE: the cache when --cache-dir is not given
    xdg_cache_home: Path | None = None  # $XDG_CACHE_HOME: where the default cache lives

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Settings:
        """The settings ``environ`` holds; an empty variable counts as unset (as it always did)."""

        def path(name: str) -> Path | None:
            value = environ.get(name)
            return Path(value) if value else None

        return cls(
            torch_python=environ.get("DSV4PATCH_TORCH_PYTHON") or None,
            vllm_python=environ.get("DSV4PATCH_VLLM_PYTHON") or None,
            lock=path("DSV4PATCH_LOCK"),
            cache=path("DSV4PATCH_CACHE"),
            xdg_cache_home=path("XDG_CACHE_HOME"),
        )

    def cache_root(self) -> Path:
        """The cache without ``--cache-dir``: ``$DSV4PATCH_CACHE``, else ``$XDG_CACHE_HOME/dsv4patch``,
        else ``~/.cache/dsv4patch``."""
        if self.cache is not None:
            return self.cache
        return (self.xdg_cache_home or Path.home() / ".cache") / "dsv4patch"
