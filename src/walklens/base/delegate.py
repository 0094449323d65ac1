"""Read-only attributes that another object of the instance answers: ``kind = Delegated[Kind]("adapter")`` reads
``self.adapter.kind``, as a ``property`` returning it would, without one such property per name."""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast, overload

_T = TypeVar("_T")


class Delegated(Generic[_T]):
    """The attribute of the same name of the instance's attribute ``via``; read-only, with ``doc`` as its docstring."""

    def __init__(self, via: str, doc: str = "") -> None:
        self.via = via
        self.name = ""
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Delegated[_T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> _T | Delegated[_T]:
        if obj is None:
            return self
        return cast("_T", getattr(getattr(obj, self.via), self.name))

    def __set__(self, obj: object, value: Any) -> None:
        raise AttributeError(f"{type(obj).__name__}.{self.name} is read from its {self.via}; it cannot be set")


__all__ = ["Delegated"]
