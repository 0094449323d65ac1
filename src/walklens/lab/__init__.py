"""The papers' lab: HellaSwag, Tests 1 and 2, the sweeps and experiments, the claims, the steering card.

The lab imports the instrument (:mod:`walklens.core`, :mod:`walklens.analyses`, :mod:`walklens.reports`), never the
reverse (docs/architecture.md).  Importing the lab registers the notebook views of its results.
"""

from __future__ import annotations

import importlib

from ..base.exports import lazy_exports, names
from . import views as _views  # noqa: F401  # imported for its registration: the lab results' notebook views

_PUBLIC: dict[str, tuple[str, ...]] = {
    "steeringcard": (
        "steering_card",
        "load_steering_set",
        "shipped_sets",
        "SteeringCard",
        "CardCell",
        "CardChoice",
        "CardExample",
        "SteeringSet",
    ),
    "database": ("summarise_db",),
}

__getattr__ = lazy_exports(globals(), _PUBLIC, lambda module: importlib.import_module(f".{module}", __name__))
__all__ = names(_PUBLIC)
