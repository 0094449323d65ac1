"""The keys a Python reader reads from a document, recorded as it reads them: the document is handed to it wrapped
(:class:`Reads`), every key read (``doc[k]``, ``doc.get(k)``, a record checked against a declared
:class:`walklens.base.records.Schema`, which reads each of its fields) is kept as a path from the document's root,
and :meth:`Reads.undeclared` names each path the document's schema (:mod:`walklens.reports.schemas`) does not
declare.  Iterating a dict's items walks its values without reading a field."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from walklens.reports.schemas import Node, undeclared

Path = tuple[Any, ...]


class Reads:
    """The paths read from one document."""

    def __init__(self) -> None:
        self.paths: set[Path] = set()

    def wrap(self, value: Any, path: Path = ()) -> Any:
        if isinstance(value, dict) and not isinstance(value, RDict):
            return RDict(value, self, path)
        if isinstance(value, list) and not isinstance(value, RList):
            return RList(value, self, path)
        return value

    def undeclared(self, node: Node, label: str = "") -> list[str]:
        """Each path read that ``node`` does not declare, as ``label: a.b[].c``."""
        found = {undeclared(node, p) for p in self.paths}
        return sorted(f"{label}: {p}" if label else p for p in found if p is not None)


class RDict(dict):  # type: ignore[type-arg]
    """A JSON object that records each key read."""

    def __init__(self, data: dict[Any, Any], reads: Reads, path: Path) -> None:
        super().__init__(data)
        self._reads, self._path = reads, path

    def __getitem__(self, key: Any) -> Any:
        self._reads.paths.add((*self._path, key))
        return self._reads.wrap(super().__getitem__(key), (*self._path, key))

    def get(self, key: Any, default: Any = None) -> Any:
        self._reads.paths.add((*self._path, key))
        return self._reads.wrap(super().__getitem__(key), (*self._path, key)) if key in self else default

    def items(self) -> Any:
        return [(k, self._reads.wrap(v, (*self._path, k))) for k, v in super().items()]

    def values(self) -> Any:
        return [v for _, v in self.items()]


class RList(list):  # type: ignore[type-arg]
    """A JSON list whose elements record the keys read from them."""

    def __init__(self, data: list[Any], reads: Reads, path: Path) -> None:
        super().__init__(data)
        self._reads, self._path = reads, path

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(len(self))[i]]
        k = i % len(self) if i < 0 else i
        return self._reads.wrap(super().__getitem__(i), (*self._path, k))

    def __iter__(self) -> Iterator[Any]:
        for k, v in enumerate(super().__iter__()):
            yield self._reads.wrap(v, (*self._path, k))


def checked_by_schemas(monkeypatch: Any, schema_classes: list[type]) -> None:
    """A recorded record checked against a declared schema reads each of the schema's fields; the checked copy
    records its own reads (``check`` of each class in ``schema_classes`` wrapped)."""
    for cls in schema_classes:
        real = cls.__dict__["check"]

        def check(self: Any, record: Any, where: str, _real: Any = real) -> Any:
            if not isinstance(record, RDict):
                return _real(self, record, where)
            for name in self.names:
                record._reads.paths.add((*record._path, name))
            return RDict(_real(self, dict(record), where), record._reads, record._path)

        monkeypatch.setattr(cls, "check", check)
