"""The instrument's core: load a model, capture its points (a :class:`Trace`), hook and intervene, score
continuations, F = W_V W_O as factors, TransformerLens names.  Its public names resolve lazily (``walklens.core.X``)."""

from __future__ import annotations

import importlib

from ..base.exports import lazy_exports, names

# The interventions' export list is kept once, in the module, and read here (cheap: capture loads torch anyway).
from . import interventions as _interventions

# Imported eagerly: the function ``capture`` shares its name with the module ``walklens.core.capture``, and a lazy
# export would be shadowed by the submodule as soon as anything imports ``walklens.core.capture``.
from .capture import capture

_PUBLIC: dict[str, tuple[str, ...]] = {
    "loading": ("load_model", "wrap", "LoadedModel", "DEFAULT_MODEL"),
    "capture": ("capture_batch", "capture_texts", "record_steps", "Batch", "Step"),
    "generation": ("generate_batch", "Generation"),
    "trace": ("Trace",),
    "ov": ("ov_factors", "ov_matrix", "value_projection", "eigen_factored", "residual_gap", "FactoredMatrix", "Eigen"),
    "tlnames": ("tl_name", "walklens_point", "to_transformerlens", "to_walklens", "tl_cache"),
    "interventions": tuple(_interventions.__all__),
}

__getattr__ = lazy_exports(globals(), _PUBLIC, lambda module: importlib.import_module(f".{module}", __name__))
__all__ = ["capture", *names(_PUBLIC)]
