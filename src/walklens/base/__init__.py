"""The ground floor: errors, numbers, records read back, outputs written, hooks, precision, the display protocol,
tables as data frames.  Its public names: the errors and :class:`Hooks`."""

from __future__ import annotations

import importlib

from .exports import lazy_exports, names

_PUBLIC: dict[str, tuple[str, ...]] = {
    "errors": (
        "WalklensError",
        "InputError",
        "UnknownModelError",
        "UnsupportedFamilyError",
        "MissingDependencyError",
        "EmptyTextError",
        "ContextTooLongError",
        "DataFormatError",
    ),
    "hooks": ("Hooks",),
}

__getattr__ = lazy_exports(globals(), _PUBLIC, lambda module: importlib.import_module(f".{module}", __name__))
__all__ = names(_PUBLIC)
