"""dsv4patch.records.frozen against the standard library's @dataclass(frozen=True): the same records.

Each case makes one class twice from the same body, once with each decorator, and compares what a caller
sees: equality (and its NotImplemented), hashing, repr (recursion included), field flags, fields(),
replace(), asdict(), pickling, FrozenInstanceError, methods the class body writes itself.
"""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import field
from pathlib import Path
from typing import Any

import pytest

from dsv4patch.records import frozen

ROOT = Path(__file__).resolve().parent.parent


def _twice(make: Any) -> tuple[type, type]:
    """The class ``make(decorator)`` returns, made with frozen and with @dataclass(frozen=True)."""
    return make(frozen), make(dataclasses.dataclass(frozen=True))


def _plain(deco: Any) -> type:
    class Plain:
        name: str
        count: int = 0
        tags: tuple[str, ...] = ()
        extra: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
        hashed_only: int = field(default=1, compare=False, hash=True)
        no_hash: int = field(default=2, hash=False)
    Plain.__qualname__ = "Plain"
    return deco(Plain)


def _empty(deco: Any) -> type:
    class Empty:
        pass
    return deco(Empty)


@pytest.mark.parametrize("values", [("a",), ("a", 3, ("x",)), ("a", 3, (), {"k": 1}, 5, 6)])
def test_equality_hash_and_repr_are_the_dataclass_ones(values: tuple[Any, ...]) -> None:
    ours, std = _twice(_plain)
    a, b = ours(*values), std(*values)
    assert repr(a) == repr(b)
    twin_ours, twin_std = ours(*values), std(*values)
    assert (a == twin_ours) is (b == twin_std) is True
    assert hash(a) == hash(twin_ours) and hash(b) == hash(twin_std)
    assert hash(a) == hash(b)  # the same tuple of fields hashed
    changed = {"count": 99}
    assert (dataclasses.replace(a, **changed) == a) is (dataclasses.replace(b, **changed) == b) is False
    # a field with compare=False does not make two records differ, nor hash=False change the hash
    assert (dataclasses.replace(a, extra={"z": 1}) == a) is (dataclasses.replace(b, extra={"z": 1}) == b) is True
    assert hash(dataclasses.replace(a, no_hash=7)) == hash(a)
    assert hash(dataclasses.replace(b, no_hash=7)) == hash(b)
    # hash=True on a compare=False field: hashed, not compared
    assert (hash(dataclasses.replace(a, hashed_only=9)) == hash(a)) is (hash(dataclasses.replace(b, hashed_only=9)) == hash(b))
    assert dataclasses.asdict(a) == dataclasses.asdict(b)
    assert [f.name for f in dataclasses.fields(a)] == [f.name for f in dataclasses.fields(b)]
    assert ours.__match_args__ == std.__match_args__


def test_another_class_is_not_implemented_and_not_equal() -> None:
    ours, std = _twice(_plain)
    for cls in (ours, std):
        rec = cls("a")
        assert rec.__eq__("a") is NotImplemented and rec != "a" and rec != ("a", 0, (), 1, 2)
    assert ours("a") != std("a")  # two classes with the same fields are not equal, as dataclass has it
    assert len({ours("a"), ours("a"), ours("b")}) == 2


def test_a_record_without_fields() -> None:
    ours, std = _twice(_empty)
    assert ours() == ours() and std() == std() and hash(ours()) == hash(std()) == hash(())
    assert repr(ours()).endswith("Empty()") and repr(std()).endswith("Empty()")


def test_frozen_refuses_assignment_and_deletion() -> None:
    ours, _ = _twice(_plain)
    rec = ours("a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.name = "b"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del rec.count  # type: ignore[misc]
    assert rec.name == "a"


def test_pickle_and_copy_round_trip() -> None:
    rec = Outer(1, Inner("x"))
    again = pickle.loads(pickle.dumps(rec))
    assert again == rec and hash(again) == hash(rec) and repr(again) == repr(rec)
    assert dataclasses.replace(rec) == rec


@frozen
class Inner:
    text: str


@frozen
class Outer:
    number: int
    inner: Inner


@frozen
class Node:
    children: list[Node] = field(default_factory=list)


def test_a_record_that_holds_itself_shows_dots_as_dataclass_does() -> None:
    node = Node()
    node.children.append(node)
    assert repr(node) == "Node(children=[...])"
    assert repr(Outer(1, Inner("x"))) == "Outer(number=1, inner=Inner(text='x'))"


def test_methods_the_class_body_writes_are_kept() -> None:
    @frozen
    class Own:
        value: int

        def __eq__(self, other: object) -> bool:
            return True

        def __hash__(self) -> int:
            return 7

        def __repr__(self) -> str:
            return "own"

    assert Own(1) == Own(2) and hash(Own(1)) == 7 and repr(Own(1)) == "own"

    @frozen
    class EqOnly:  # an __eq__ of its own and no __hash__: dataclass still hashes the fields
        value: int

        def __eq__(self, other: object) -> bool:
            return isinstance(other, EqOnly)

    assert EqOnly(1) == EqOnly(2) and hash(EqOnly(1)) == hash((1,))


def test_a_subclass_compares_its_own_fields() -> None:
    @frozen
    class Base:
        a: int

    @frozen
    class Child(Base):
        b: int = 0

    assert Child(1, 2) != Child(1, 3) and Child(1, 2) == Child(1, 2) and Base(1) != Child(1, 0)
    assert repr(Child(1, 2)).endswith("Child(a=1, b=2)") and hash(Child(1, 2)) == hash((1, 2))


# Modules that run outside dsv4patch's process and so import nothing of it (by file path in the environment
# under test, or as the kernel wheel's own package): their frozen records stay @dataclass(frozen=True).
OUTSIDE = {"dsv4patch/proofs/selftest/model.py", "dsv4patch/proofs/selftest/child.py", "dsv4patch/kernels/runtime.py",
           "dsv4patch/proofs/cpu_pytest_plugin.py"}


def test_the_package_makes_its_frozen_records_with_frozen() -> None:
    """Every frozen record of the package comes from records.frozen, except in the modules that run outside
    dsv4patch's process: a @dataclass(frozen=True) would bring back the three compiled methods per class at
    start-up (issue 39)."""
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "dsv4patch").rglob("*.py"))
                 if p.relative_to(ROOT).as_posix() not in OUTSIDE
                 for n, line in enumerate(p.read_text().splitlines(), 1)
                 if line.lstrip().startswith(("@dataclass(frozen", "@dataclasses.dataclass(frozen"))]
    assert offenders == []


@pytest.mark.parametrize("rel", sorted(OUTSIDE))
def test_the_modules_that_run_outside_import_nothing_of_the_package(rel: str) -> None:
    """selftest/model.py is loaded by file path inside the engine child, in the environment under test, where
    dsv4patch is not installed (a records.frozen there failed every engine child: test_selftest_child)."""
    tops = [line for line in (ROOT / rel).read_text().splitlines() if line.startswith(("import ", "from "))]
    assert not [line for line in tops if line.split()[1].split(".")[0] == "dsv4patch"], rel
