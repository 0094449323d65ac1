"""Registry of architecture adapters, keyed by ``config.model_type`` (one small file per family)."""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedFamilyError
from . import albert, bert, falcon, gemma3, gpt2, gpt_neo, gpt_neox, llama, t5
from .base import Adapter, HeadWeights, StackSpec, get_module

ADAPTERS: dict[str, Adapter] = {}
for _mod in (gpt2, gpt_neo, gpt_neox, llama, gemma3, falcon, t5, bert, albert):
    for _mt in _mod.ADAPTER.model_types:
        ADAPTERS[_mt] = _mod.ADAPTER


def supported_model_types() -> list[str]:
    return sorted(ADAPTERS)


def get_adapter(config_or_type: Any) -> Adapter:
    """The adapter for a config (or a model_type string); refuses unknown families with the supported list."""
    mt = config_or_type if isinstance(config_or_type, str) else getattr(config_or_type, "model_type", None)
    if mt not in ADAPTERS:
        raise UnsupportedFamilyError(
            f"model_type {mt!r} is not supported; supported: {', '.join(supported_model_types())}")
    return ADAPTERS[mt]


__all__ = ["ADAPTERS", "Adapter", "HeadWeights", "StackSpec", "get_adapter", "get_module", "supported_model_types"]
