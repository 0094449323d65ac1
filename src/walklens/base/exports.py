"""Lazy public names of a package: ``walklens.X`` resolves ``X`` from the module that defines it on first use, so
``import walklens`` stays fast (torch and transformers load with the first verb, not with the package)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any


def lazy_exports(
    package: dict[str, Any],
    table: Mapping[str, Sequence[str]],
    load: Callable[[str], ModuleType],
    moved: Mapping[str, str] | None = None,
) -> Callable[[str], Any]:
    """The ``__getattr__`` of a package whose namespace is ``package`` (its ``globals()``): a name of ``table``
    (module, relative to the package -> the names it exports) is read from its module by ``load`` and kept; a name
    of ``moved`` (name -> its new home, a dotted path) is read from there with one ``FutureWarning`` (a one-release
    alias)."""
    exports = {name: module for module, names in table.items() for name in names}
    where = str(package["__name__"])

    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(load(exports[name]), name)
            package[name] = value
            return value
        if moved and name in moved:
            home = moved[name]
            warnings.warn(
                f"{where}.{name} is now {home}.{name}; the short alias goes in the next release",
                FutureWarning,
                stacklevel=2,
            )
            return getattr(load(home.removeprefix(f"{where}.")), name)
        raise AttributeError(f"module {where!r} has no attribute {name!r}")

    return __getattr__


def names(table: Mapping[str, Sequence[str]]) -> list[str]:
    """Every name ``table`` exports, in order: a package's ``__all__``."""
    return [name for module_names in table.values() for name in module_names]


__all__ = ["lazy_exports", "names"]
