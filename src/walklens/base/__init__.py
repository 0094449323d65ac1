"""The ground floor: errors, numbers, records read back, outputs written, hooks, precision, the display protocol,
tables as data frames.  Its public names: the errors and :class:`Hooks`."""

from __future__ import annotations

import importlib

# The errors' export list is kept once, in the module (its exceptions; cheap: it imports nothing of walklens).
from . import errors as _errors
from .exports import lazy_exports, names

_PUBLIC: dict[str, tuple[str, ...]] = {
    "errors": tuple(name for name in _errors.__all__ if name.endswith("Error")),
    "hooks": ("Hooks",),
}

__getattr__ = lazy_exports(globals(), _PUBLIC, lambda module: importlib.import_module(f".{module}", __name__))
__all__ = names(_PUBLIC)
