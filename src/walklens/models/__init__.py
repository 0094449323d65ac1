"""Registry of architecture adapters, keyed by ``config.model_type`` (one small file per family).

Every module of this package that defines ``ADAPTER`` is a family; the registry finds them (one scan), so a
new family is one new file.  A model_type with no file gets an adapter derived from its module tree
(:mod:`.derive`), accepted only when the parity checks pass on the loaded model (:mod:`walklens.analyses.parity`).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from ..base.errors import UnsupportedFamilyError
from .base import Adapter, HeadWeights, StackSpec, get_module

#: Modules of this package that are machinery, not families.
_NOT_FAMILIES = frozenset({"base", "checkpoint", "derive", "derived_cache", "heads", "probe", "roles", "tiny"})


def _discover() -> dict[str, Adapter]:
    found: dict[str, Adapter] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in _NOT_FAMILIES:
            continue
        adapter = getattr(importlib.import_module(f"{__name__}.{info.name}"), "ADAPTER", None)
        if isinstance(adapter, Adapter):
            for mt in adapter.model_types:
                if mt in found:
                    raise RuntimeError(f"model_type {mt!r} claimed by {found[mt].family} and {adapter.family}")
                found[mt] = adapter
    return found


ADAPTERS: dict[str, Adapter] = _discover()


def supported_model_types() -> list[str]:
    """The model_types with an adapter file (others may still load through a derived adapter)."""
    return sorted(ADAPTERS)


def has_adapter(config_or_type: Any) -> bool:
    mt = config_or_type if isinstance(config_or_type, str) else getattr(config_or_type, "model_type", None)
    return mt in ADAPTERS


def get_adapter(config_or_type: Any) -> Adapter:
    """The adapter for a config (or a model_type string); refuses unknown families with the supported list.
    Given a config, the adapter is specialised to it (:meth:`Adapter.specialize`), which may refuse it."""
    mt = config_or_type if isinstance(config_or_type, str) else getattr(config_or_type, "model_type", None)
    if mt not in ADAPTERS:
        raise UnsupportedFamilyError(
            f"model_type {mt!r} is not supported; supported: {', '.join(supported_model_types())}"
        )
    return ADAPTERS[mt] if isinstance(config_or_type, str) else ADAPTERS[mt].specialize(config_or_type)


__all__ = [
    "ADAPTERS",
    "Adapter",
    "HeadWeights",
    "StackSpec",
    "get_adapter",
    "get_module",
    "has_adapter",
    "supported_model_types",
]
