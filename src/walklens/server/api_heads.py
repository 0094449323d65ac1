"""The attention view: one head's attention map, the cluster & aggregate reading of a chosen query, per-head
W_vo / W_qk summaries and self-attention mass for every layer and head, and the model's position kernels with
their self-bias classes (seed 000, sec. 2.2.1, A.2, A.3; Figs. 5-8).

The trace with attention probabilities is captured once per text (:func:`~.traces.attention_trace`; it holds
layers x heads x T x T floats, so its text is bounded by the explorer's --max-memory); a map is sent for the one
head asked, averaged over b x b blocks of positions beyond :data:`~.bounds.MAX_CELLS` cells.
"""

from __future__ import annotations

from typing import Any

import torch
from starlette.requests import Request

from ..analyses.attention import cluster_view, head_matrices, head_stats, self_mass
from ..analyses.kernels import position_kernels
from ..reports import heads as heads_report
from ..reports import kernels as kernels_report
from ..reports.html import block_labels, block_mean
from . import bounds
from .bounds import MAX_TOKENS, ApiError, block_for, int_arg, text_arg
from .routing import api
from .state import Explorer, Job, run_job
from .traces import attention_trace


@api
async def attention(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{model, text, layer, head, query}`` -> head ``head``'s attention map at ``layer`` (its self-attention),
    and the documents of the heads report (:mod:`walklens.reports.heads`): the cluster view of position
    ``query`` (negative: from the end), self mass and W_vo / W_qk statistics of every layer and head."""
    model = ex.model_name(body.get("model"))
    lm = ex.model(model)
    text = text_arg(body)
    L = lm.n_layers
    layer = int_arg(body, "layer", -1, -L, L - 1) % L
    head = int_arg(body, "head", 0, 0, 4096)
    query = int_arg(body, "query", -1, -MAX_TOKENS, MAX_TOKENS - 1)

    def compute(job: Job) -> dict[str, Any]:
        tr = attention_trace(ex, job, model, text, MAX_TOKENS)
        A = tr.attentions.get(f"L{layer}.attn")
        if A is None:
            raise ApiError(f"no self-attention probabilities at layer {layer} for this model")
        H, T, S = A.shape
        if head >= H:
            raise ApiError(f"head must be from 0 to {H - 1}")
        if not -T <= query < T:
            raise ApiError(f"query must be a position from {-T} to {T - 1}")
        hm = ex.results.get((model, "head_matrices", layer), lambda: head_matrices(lm, layer))
        cv = cluster_view(tr, hm, head, query, top=10)
        job.check()
        stats = ex.results.get((model, "head_stats"), lambda: head_stats(lm))
        sm = self_mass(tr)
        b = block_for(T, S, square=True)
        return {
            "model": model,
            "layer": layer,
            "head": head,
            "n_heads": H,
            "n_layers": L,
            "tokens": tr.tokens,
            "block": b,
            "labels": block_labels(tr.tokens, b),
            "map": block_mean(A[head].float(), b),
            "cluster": heads_report.cluster_document(cv),
            "self_mass": heads_report.self_mass_document(sm),
            "head_stats": heads_report.head_stats_document(stats),
        }

    return await run_job(request, ex, model, compute)


@api
async def kernels(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{model}`` -> the kernels report's document (:func:`walklens.reports.kernels.document`, logit units
    only): position kernels of every layer and head by distance, their self-bias classes and the fractions per
    class (T5 and ALiBi from the weights, others measured; cached); a stack of more than MAX_CELLS values holds
    the mean kernel of each layer (``mean_of_heads``: over how many heads)."""
    model = ex.model_name(body.get("model"))
    lm = ex.model(model)

    def compute(job: Job) -> dict[str, Any]:
        pk = ex.results.get((model, "kernels"), lambda: position_kernels(lm, progress=False))
        doc = kernels_report.document(pk, logit_only=True)
        for st in doc["stacks"]:  # very many heads: the mean kernel of each layer
            K, H, n = st["log_values"].shape
            if K * H * n > bounds.MAX_CELLS:
                st.update(log_values=st["log_values"].mean(1, keepdim=True), labels=[], classes=[], mean_of_heads=H)
            st["log_values"] = st["log_values"].to(torch.float32)
        return doc

    return await run_job(request, ex, model, compute)
