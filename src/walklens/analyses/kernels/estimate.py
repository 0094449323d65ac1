"""Every head's position kernel and its self-bias class (seed 000, A.2; Figs. 6 and 8): :func:`position_kernels`
reads T5's and ALiBi's kernels from the position bias and estimates the others empirically."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...base.errors import InputError
from .empirical import empirical_kernels
from .result import PositionKernels
from .weights import _alibi_kernels, _t5_kernels

if TYPE_CHECKING:
    from ...core.loading import LoadedModel


def position_kernels(
    lm: LoadedModel,
    *,
    method: str = "auto",
    margin: float = 0.1,
    max_distance: int | None = None,
    corpus: str | None = None,
    samples: int = 16,
    length: int = 64,
    seed: int = 0,
    progress: bool = True,
    sink: bool = False,
) -> PositionKernels:
    """Every head's position kernel and its self-bias class (seed 000, A.2; Figs. 6 and 8).

    ``method``: ``"auto"`` (weights for T5 and ALiBi, else empirical), ``"weights"`` or ``"empirical"``.
    ``max_distance``: the window W of distances shown (T5 default: the model's relative_attention_max_distance;
    ALiBi default 32; empirical default (length-2)//2 causal, (length-1)//4 bidirectional).  ``margin``: the
    classification margin in nats (logit units).  ``sink``: the attention-sink control of empirical kernels
    (:func:`empirical_kernels`); kernels read from the weights have no sink to remove.
    """
    scheme = _scheme(lm, method, margin, sink)
    slopes, scale, notes = None, None, ""
    if method in ("auto", "weights") and scheme == "t5_relative":
        stacks, est = _t5_kernels(lm, max_distance)
        kind, units = "t5_relative", "logit bias"
    elif method in ("auto", "weights") and scheme == "alibi":
        stacks, est, slopes, scale = _alibi_kernels(lm, max_distance)
        kind, units, notes = "alibi", "logit bias", est
    elif method == "weights":
        raise InputError(
            f"{lm.name}: position scheme {scheme!r} has no position bias in its weights; use the empirical method"
        )
    else:
        stacks, est = empirical_kernels(
            lm,
            corpus=corpus,
            samples=samples,
            length=length,
            window=max_distance,
            seed=seed,
            progress=progress,
            sink=sink,
        )
        kind, units = "empirical", "mean attention weight"
    if not stacks:
        raise InputError(f"{lm.name}: no position kernels found")
    for s in stacks:
        s.classify(margin)
    return PositionKernels(
        model_name=lm.name,
        scheme=kind,
        units=units,
        estimator=est,
        margin=margin,
        stacks=stacks,
        notes=notes,
        alibi_slopes=slopes,
        alibi_scale=scale,
    )


def _scheme(lm: LoadedModel, method: str, margin: float, sink: bool) -> str:
    """The model's position scheme, once ``method``, ``margin`` and ``sink`` are checked against it."""
    if method not in ("auto", "weights", "empirical"):
        raise InputError(f"unknown method {method!r}; use auto, weights or empirical")
    if margin < 0:
        raise InputError("the margin must be >= 0")
    scheme = lm.adapter.position_scheme(lm.config)
    if sink and (method == "weights" or (method == "auto" and scheme in ("t5_relative", "alibi"))):
        raise InputError(f"{lm.name}: the attention-sink control applies to empirical kernels, not {scheme} weights")
    return scheme
