"""walklens: see and measure a transformer as movement through embedding space.

Data flows one way: :func:`load_model` → :func:`capture` (a :class:`Trace`) → analyses (walks, attention,
kernels, power, steering, concepts) → reports.  Public names are imported lazily so ``import walklens`` stays
fast.

The public API follows one rule:

- every verb takes the loaded model first, as ``lm`` (a :class:`LoadedModel`), or a :class:`Trace` that knows
  its model; analyses return plain dataclasses (result types) and never draw;
- ``walklens.__all__`` lists every public verb and every result type of the analysis modules (each module's
  own ``__all__``), so ``walklens.X`` works for all of them;
- ranks are 0-based everywhere: rank 0 is the nearest token (the most probable one; what greedy decoding
  picks), rank r means r tokens score strictly higher; layers are 0-based too (negative: from the top);
- every hook goes through :class:`Hooks` (:mod:`walklens.hooks`); interventions live in
  :mod:`walklens.interventions`, each a context manager that restores the model bit for bit on exit, even on
  error;
- each public name is exported by one module only: the module that defines it, or its package.
"""

from __future__ import annotations

import importlib
from typing import Any

# The interventions' export list is kept once, in the module, and read here (cheap: capture loads torch anyway).
from . import interventions as _interventions
from ._version import __version__ as __version__

# Imported eagerly: the function ``capture`` shares its name with the module ``walklens.capture``, and a lazy
# export would be shadowed by the submodule as soon as anything imports ``walklens.capture``.
from .capture import capture

_PUBLIC: dict[str, tuple[str, ...]] = {
    # foundation
    "loading": ("load_model", "wrap", "LoadedModel", "DEFAULT_MODEL"),
    "capture": ("capture_batch", "record_steps", "Batch", "Step"),
    "trace": ("Trace",),
    "models": ("get_adapter", "supported_model_types"),
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
    # walks (seed 000 sec. 2.1, 2.2.2)
    "walks": ("encoding_walk", "similarity_map", "EncodingWalk"),
    "simmap": ("SimilarityMap",),
    # the associative organisation: Result 4 and the blocks of the similarity maps (sec. 2.2, Figs. 3, 11, 12)
    "association": (
        "block_contrast",
        "cooccurrence",
        "token_classes",
        "BlockContrast",
        "ClassContrast",
        "Cooccurrence",
        "Correlation",
    ),
    "decoding": ("decoding_walk", "DecodingWalk"),
    # the parity card: every recomputation against the model itself
    "parity": ("verify", "ParityCard", "ParityCheck"),
    # attention and kernels (sec. 2.2.1, A.2, A.3)
    "attention": (
        "head_matrices",
        "attention_identity",
        "cluster_view",
        "self_mass",
        "head_stats",
        "HeadMatrices",
        "IdentityResult",
        "IdentityCheck",
        "ClusterView",
        "SelfMass",
        "HeadStats",
    ),
    "kernels": (
        "position_kernels",
        "empirical_kernels",
        "position_only_attention",
        "classify_kernel",
        "t5_kernel_values",
        "PositionKernels",
        "StackKernels",
        "KernelClass",
        "DEFAULT_CORPUS",
    ),
    # F = W_V W_O and the power method (seed 002)
    "ov": ("ov_factors", "ov_matrix", "value_projection", "eigen_factored", "residual_gap", "FactoredMatrix", "Eigen"),
    "power": (
        "power_spectra",
        "alignment",
        "alignment_from_states",
        "power_iterate",
        "predicted_alignment",
        "fitted_rate",
        "PowerSpectra",
        "LayerSpectrum",
        "HeadSpectrum",
        "Alignment",
    ),
    "idealised": ("dynamics", "shared_weights", "Dynamics", "SharedWeights"),
    "steering": (
        "steer",
        "activation_addition",
        "steering_sweep",
        "direction",
        "SteerResult",
        "SteerRow",
        "SteeringSweep",
    ),
    # the steering card: eigen-steering next to the usual methods on one dose scale (seed 002)
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
    # context compaction and the concept cache (seed 000, footnote 11)
    "compaction": ("compact", "Compacted", "CompactSpec", "CompactionReport"),
    "concepts.cache": ("ConceptCache",),
    # ecosystem: TransformerLens hook names, llama.cpp control vectors (docs/ecosystem.md)
    "tlnames": ("tl_name", "walklens_point", "to_transformerlens", "to_walklens", "tl_cache"),
    "controlvectors": (
        "ControlVector",
        "control_vector",
        "write_control_vector",
        "read_control_vector",
        "apply_control_vector",
    ),
    # hooks and interventions
    "hooks": ("Hooks",),
    "interventions": tuple(_interventions.__all__),
    # tables as data frames (pandas, an optional extra): every result's to_pandas(), a results database
    "frames": ("similarity_frame",),
    "database": ("summarise_db",),
}

_EXPORTS: dict[str, str] = {name: module for module, names in _PUBLIC.items() for name in names}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'walklens' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = ["capture", *_EXPORTS]

# Every result's notebook view registers itself with the display protocol (walklens.display.register_view) when
# walklens.notebook is imported.  The results never import it (it stands on the reports, above them): the entry
# point does, here, and a submodule is never imported without its package, so `import walklens.trace` alone
# has every view registered too.  Last, so the names above exist while the reports load.
from . import notebook  # noqa: E402, F401  # imported for its registration: the views fill display's table
