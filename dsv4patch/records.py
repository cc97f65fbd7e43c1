"""Frozen records: dataclasses whose equality, hash and repr are written once for all of them.

Why: Python 3.11's ``dataclass`` compiles every method it generates from source text when the
class is made, and a frozen dataclass gets six (``__init__``, ``__repr__``, ``__eq__``,
``__hash__``, ``__setattr__``, ``__delattr__``).  Every command makes its record classes at
start-up (a warm ``check`` 32 of them, most of them frozen), so that compiling was a fifth of
``check``'s own start-up (issue 39).  Three of the six do the same for every record: compare the
fields in order, hash them, show them.  :func:`frozen` keeps ``dataclass`` for what is per class
(``__init__`` and the frozen guards) and gives the three a shared implementation that reads the
field list ``dataclass`` made; equality, hashing, ``repr``, ``fields()``, ``replace()``,
``asdict()`` and ``FrozenInstanceError`` behave as ``@dataclass(frozen=True)``'s.
"""

from __future__ import annotations

import dataclasses
import reprlib
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # typing's own from Python 3.11; at run time it only marks the function
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_kwargs: object) -> Any:
        return lambda function: function

_T = TypeVar("_T")


def _key_getter(names: tuple[str, ...]) -> Any:
    """A function from a record to the tuple of ``names``' values (``attrgetter`` gives a bare
    value for one name and needs at least one)."""
    if not names:
        return lambda _obj: ()
    if len(names) == 1:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return attrgetter(*names)


def _eq(self: Any, other: object) -> object:
    cls: Any = self.__class__
    key = cls.__record_compare__
    if other.__class__ is cls:
        return key(self) == key(other)
    return NotImplemented


def _hash(self: Any) -> int:
    cls: Any = self.__class__
    return hash(cls.__record_hash__(self))


@reprlib.recursive_repr()
def _repr(self: Any) -> str:
    cls: Any = self.__class__
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in cls.__record_repr__)
    return f"{cls.__qualname__}({shown})"


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, dataclasses.Field))
def frozen(cls: type[_T]) -> type[_T]:
    """``@dataclass(frozen=True)``, made with three compiled methods instead of six."""
    own = dict(cls.__dict__)  # what the class body wrote itself: kept, as dataclass keeps it
    explicit_hash = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
    made: Any = dataclasses.dataclass(frozen=True, eq=False, repr=False)(cls)
    fields = dataclasses.fields(made)
    # As dataclass: compare the fields with compare=True; hash those with hash=True, or hash=None
    # and compare=True; show those with repr=True.
    made.__record_compare__ = _key_getter(tuple(f.name for f in fields if f.compare))
    made.__record_hash__ = _key_getter(tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash)))
    made.__record_repr__ = tuple(f.name for f in fields if f.repr)
    if "__eq__" not in own:
        made.__eq__ = _eq
    if not explicit_hash:
        made.__hash__ = _hash
    if "__repr__" not in own:
        made.__repr__ = _repr
    return cls
