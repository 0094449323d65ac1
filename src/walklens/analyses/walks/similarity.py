"""Similarity maps (seed 000, Figs. 3, 11, 12): the [tokens, tokens] similarity of the vectors at one point."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ...base.errors import InputError
from ..simmap import SimilarityMap
from .encoding import _check_choice, _need_lm
from .reading import final_norm_fn
from .result import Metric

if TYPE_CHECKING:
    from ...core.loading import LoadedModel
    from ...core.trace import Trace


def similarity_map(
    trace: Trace, point: str = "embed", metric: Metric = "dot", normed: bool = False, *, lm: LoadedModel | None = None
) -> SimilarityMap:
    """The [tokens, tokens] similarity of the vectors at one point (seed 000, Figs. 3, 11, 12), as a
    :class:`~walklens.analyses.simmap.SimilarityMap` (a tensor that knows its tokens and shows itself in a notebook).

    ``point``: a captured point name, or ``"V"`` for the token embedding rows V[w_t] themselves.
    ``metric``: ``"dot"`` (inner product, eq. 13) or ``"cosine"``.  ``normed``: apply the model's final norm
    to every vector first (the paper's layer-normed maps; a no-op on the ``final`` point, which already is
    the norm's output, and for BERT/ALBERT, whose residual is LayerNorm output at every layer).
    """
    _check_choice("metric", metric, ("dot", "cosine"))
    if point == "V":
        model_lm = _need_lm(trace, lm)
        x = model_lm.embedding_matrix().detach()[trace.token_ids.long().to(model_lm.device)].float().cpu()
    else:
        x = trace[point].float()
    if normed and point != "final":
        model_lm = _need_lm(trace, lm)
        if point == "V" and x.shape[-1] != trace.d_model:
            raise InputError("V lives in E-space for this model (E != D); the final norm cannot be applied")
        with torch.no_grad():
            x = final_norm_fn(model_lm, trace.stack)(x.to(model_lm.device)).float().cpu()
    if metric == "cosine":
        x = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return SimilarityMap.of(x @ x.t(), list(trace.tokens), point, metric, normed, trace.model_name)
