"""Small data classes without :mod:`dataclasses`, whose import (it pulls in ``inspect``) would cost
``ddpdoctor stacks`` more start-up time than reading a rank's stack.

A subclass lists its fields in ``__slots__`` and assigns them in ``__init__``; equality and ``repr``
follow the fields, as a dataclass's would.
"""

from __future__ import annotations


class Record:
    """Fields compared and printed in ``__slots__`` order; mutable, so not hashable."""

    __slots__: tuple[str, ...] = ()

    def fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and type(other) is type(self) and self.fields() == other.fields()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({inner})"


class FrozenRecord(Record):
    """A record used as a dict key: hashable, and its fields are not reassigned after ``__init__``."""

    __slots__ = ()

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(self.fields())
