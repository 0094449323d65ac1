"""walklens: see and measure a transformer as movement through embedding space.

Data flows one way: :func:`load_model` → :func:`capture` (a :class:`Trace`) → analyses (walks, attention,
kernels, power, concepts) → reports.  Public names are imported lazily so ``import walklens`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Imported eagerly: the function ``capture`` shares its name with the module ``walklens.capture``, and a lazy
# export would be shadowed by the submodule as soon as anything imports ``walklens.capture``.
from .capture import capture  # noqa: E402

_EXPORTS: dict[str, str] = {
    # foundation
    "load_model": "loading", "wrap": "loading", "LoadedModel": "loading", "DEFAULT_MODEL": "loading",
    "Trace": "trace",
    "get_adapter": "models", "supported_model_types": "models",
    "WalklensError": "errors", "InputError": "errors", "UnknownModelError": "errors",
    "UnsupportedFamilyError": "errors", "MissingDependencyError": "errors", "EmptyTextError": "errors",
    "ContextTooLongError": "errors", "DataFormatError": "errors",
    # walks (seed 000 sec. 2.1, 2.2.2)
    "encoding_walk": "walks", "decoding_walk": "walks", "similarity_map": "walks",
    "EncodingWalk": "walks", "DecodingWalk": "walks",
    # attention and kernels (sec. 2.2.1, A.2, A.3)
    "head_matrices": "attention", "attention_identity": "attention", "HeadMatrices": "attention",
    "FactoredMatrix": "attention",
    "position_kernels": "kernels",
    # power method (seed 002)
    "power_spectra": "power", "alignment": "power", "steer": "power",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
        value = getattr(module, name)
        globals()[name] = value  # also replaces the submodule binding of the same name (walklens.capture)
        return value
    raise AttributeError(f"module 'walklens' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_EXPORTS))


__all__ = list(_EXPORTS)
