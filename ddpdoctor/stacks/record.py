"""Small data classes without :mod:`dataclasses`, whose import (it pulls in ``inspect``) would cost
``ddpdoctor stacks`` more start-up time than reading a rank's stack.

A subclass lists its fields in ``__slots__`` and assigns them in ``__init__``; equality and ``repr``
follow the fields in ``__slots__`` order (kept sorted), much as a dataclass's would.
"""

from __future__ import annotations


class Record:
    """Fields compared and printed in ``__slots__`` order; mutable, so not hashable."""

    __slots__: tuple[str, ...] = ()

    def fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return type(other) is type(self) and self.fields() == other.fields()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({inner})"


class FrozenRecord(Record):
    """A record used as a dict key: hashable, and each field is set once (in ``__init__``)."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        if hasattr(self, name):
            raise AttributeError(f"{type(self).__name__}.{name} cannot be reassigned (a frozen record)")
        object.__setattr__(self, name, value)

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(self.fields())
