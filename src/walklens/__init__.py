"""walklens: see and measure a transformer as movement through embedding space.

Data flows one way: :func:`load_model` → :func:`capture` (a :class:`Trace`) → analyses (walks, attention,
kernels, power, steering, concepts) → reports.  Public names are imported lazily so ``import walklens`` stays
fast.

The public API follows one rule:

- every verb takes the loaded model first, as ``lm`` (a :class:`LoadedModel`), or a :class:`Trace` that knows
  its model; analyses return plain dataclasses (result types) and never draw;
- the public names come in groups, each with its ``__all__``: :mod:`walklens.core` (load, capture, the trace,
  interventions), :mod:`walklens.analyses` (every verb and result type of both papers' analyses),
  :mod:`walklens.lab` (the steering card, a results database), :mod:`walklens.models` (the adapters);
  ``walklens.__all__`` holds only the verbs a new user needs first, the errors and :class:`Hooks` (a name that
  moved from the root to its group answers one release more with a ``FutureWarning``);
- ranks are 0-based everywhere: rank 0 is the nearest token (the most probable one; what greedy decoding
  picks), rank r means r tokens score strictly higher; layers are 0-based too (negative: from the top);
- every hook goes through :class:`Hooks` (:mod:`walklens.base.hooks`); interventions live in
  :mod:`walklens.core.interventions`, each a context manager that restores the model bit for bit on exit, even on
  error;
- each public name is exported by one module only: the module that defines it, or its package.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import analyses as _analyses
from . import base as _base
from . import core as _core
from ._version import __version__ as __version__
from .base.exports import lazy_exports

# Imported eagerly: the function ``capture`` shares its name with the module ``walklens.core.capture``, and a lazy
# export would be shadowed by the submodule as soon as anything imports ``walklens.core.capture``.
from .core import capture

#: the verbs a new user needs first (README, docs/walks.md), the errors to catch, and Hooks; every other public name
#: lives in its group: walklens.core, walklens.analyses, walklens.lab, walklens.models (docs/architecture.md)
_PUBLIC: dict[str, tuple[str, ...]] = {
    "core": ("load_model", "LoadedModel", "Trace"),
    "analyses": (
        "encoding_walk",
        "similarity_map",
        "decoding_walk",
        "head_matrices",
        "attention_identity",
        "position_kernels",
        "power_spectra",
        "alignment",
        "steer",
        "activation_addition",
        "verify",
        "compact",
        "patch",
    ),
    "base": ("Hooks", *_base._PUBLIC["errors"]),
    "costs.planning": ("plan",),  # what a run would take, from the model's files alone (walklens plan)
}

#: the lab's public names (walklens.lab.__all__; the lab is imported only when one is asked for: tests/test_api.py)
_LAB = (
    "steering_card", "load_steering_set", "shipped_sets", "SteeringCard", "CardCell", "CardChoice", "CardExample",
    "SteeringSet", "summarise_db",
)  # fmt: skip

#: every name walklens exported at its root before the groups: one release more, with a FutureWarning
_MOVED: dict[str, str] = {
    **{name: "walklens.core" for name in _core.__all__},
    **{name: "walklens.analyses" for name in _analyses.__all__},
    **{name: "walklens.models" for name in ("get_adapter", "supported_model_types")},
    **{name: "walklens.lab" for name in _LAB},
}
for _names in (*_PUBLIC.values(), ("capture",)):
    for _name in _names:
        _MOVED.pop(_name, None)

_exported = lazy_exports(
    globals(), _PUBLIC, lambda module: importlib.import_module(f".{module}", __name__), moved=_MOVED
)


def __getattr__(name: str) -> Any:
    if name == "lab":  # the one group not imported with the package (it loads the lab's views)
        return importlib.import_module(".lab", __name__)
    return _exported(name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = ["capture", *(name for names in _PUBLIC.values() for name in names)]

# Every result's notebook view registers itself with the display protocol (walklens.base.display.register_view) when
# walklens.reports.notebook is imported.  The results never import it (it stands on the reports, above them): the entry
# point does, here, and a submodule is never imported without its package, so `import walklens.core.trace` alone
# has every view registered too.  Last, so the names above exist while the reports load.
from .reports import notebook  # noqa: E402, F401  # imported for its registration: the views fill display's table
