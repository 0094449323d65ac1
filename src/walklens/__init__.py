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
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from . import base as _base
from ._version import __version__ as __version__
from .base.display import views_from
from .base.exports import lazy_exports

#: the verbs a new user needs first (README, docs/walks.md), the errors to catch, and Hooks; every other public name
#: lives in its group: walklens.core, walklens.analyses, walklens.lab, walklens.models (docs/architecture.md)
_PUBLIC: dict[str, tuple[str, ...]] = {
    # ``capture`` (the function) is read from walklens.core, which binds it over its submodule of the same name;
    # walklens has no submodule ``capture`` to shadow it here
    "core": ("capture", "load_model", "LoadedModel", "Trace"),
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


class _Moved(Mapping[str, str]):
    """Every name walklens exported at its root before the groups -> its new home: one release more, with a
    FutureWarning.  Built the first time it is read (it lists walklens.core's names, and walklens.core loads
    torch), so ``import walklens`` loads no torch."""

    def __init__(self) -> None:
        self._table: dict[str, str] | None = None

    def _built(self) -> dict[str, str]:
        if self._table is None:
            core = importlib.import_module(".core", __name__)
            analyses = importlib.import_module(".analyses", __name__)
            table = {
                **{name: "walklens.core" for name in core.__all__},
                **{name: "walklens.analyses" for name in analyses.__all__},
                **{name: "walklens.models" for name in ("get_adapter", "supported_model_types")},
                **{name: "walklens.lab" for name in _LAB},
            }
            for names in _PUBLIC.values():
                for name in names:
                    table.pop(name, None)
            self._table = table
        return self._table

    def __getitem__(self, name: str) -> str:
        return self._built()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())


#: every name walklens exported at its root before the groups: one release more, with a FutureWarning
_MOVED: Mapping[str, str] = _Moved()

_exported = lazy_exports(
    globals(), _PUBLIC, lambda module: importlib.import_module(f".{module}", __name__), moved=_MOVED
)


def __getattr__(name: str) -> Any:
    if name == "lab":  # the one group not imported with the package (it loads the lab's views)
        return importlib.import_module(".lab", __name__)
    return _exported(name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [name for names in _PUBLIC.values() for name in names]

# Every result's notebook view registers itself with the display protocol (walklens.base.display.register_view) when
# walklens.reports.notebook is imported.  The results never import it (it stands on the reports, above them): the entry
# point hands its import to the display table, which runs it the first time a view is looked up (views_from), and a
# submodule is never imported without its package, so `import walklens.core.trace` alone has every view registered
# before any result is shown.  Not imported here: it loads torch, and `import walklens` (walklens --help) must not.
views_from(lambda: importlib.import_module(".reports.notebook", __name__))

if TYPE_CHECKING:  # the same import, for the import contracts (exclude_type_checking_imports = false): a module below
    # that imports the root still reaches the reports, and they see it (tests/test_architecture.py)
    from .reports import notebook  # noqa: F401  # imported for the contracts only
