"""A domain package's public face: the names other packages may use, loaded on first use.

Why a face: a package (``pins/``, ``series/``, ...) is reached from outside only through the
names its ``__init__.py`` lists, so a module's internals can change without touching its
readers (``tests/test_architecture.py`` refuses any other import across packages).

Why lazy: a command imports only what it runs; a face that imported every module of its
package would make ``check`` import the kernel build.  Each ``__init__.py`` lists its names
twice, once for the type checker (imports under ``TYPE_CHECKING``) and once in ``FACE`` for
the interpreter; ``tests/test_architecture.py`` checks that the two lists agree.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, MutableMapping
from types import ModuleType
from typing import Any


def load(name: str) -> ModuleType:
    """The module ``name`` (absolute), imported as an ``import`` statement imports it.

    Not ``importlib.import_module``: its pure-Python path is invisible to ``python -X importtime``,
    which then leaves a module loaded on first use out of the start-up it reports (the time lands in
    whichever import was running, or nowhere), and the start-up benchmark reads that report.
    """
    __import__(name)
    return sys.modules[name]


def lazy(package: str, namespace: MutableMapping[str, Any], face: Mapping[str, str]) -> Callable[[str], Any]:
    """The package's ``__getattr__``: ``face`` maps a public name to ``"module:attribute"``."""

    def __getattr__(name: str) -> Any:
        where = face.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = where.partition(":")
        value = getattr(load(f"{package}.{module}"), attr)
        namespace[name] = value  # the next lookup is a plain global
        return value

    return __getattr__
