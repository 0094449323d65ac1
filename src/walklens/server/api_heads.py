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

from ..attention import cluster_view, head_matrices, head_stats, self_mass
from ..kernels import position_kernels
from ..reports.html import block_labels, block_mean, show
from .bounds import MAX_CELLS, MAX_TOKENS, ApiError, block_for, int_arg, text_arg
from .routing import api
from .state import Explorer, Job, run_job
from .traces import attention_trace


@api
async def attention(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{model, text, layer, head, query}`` -> head ``head``'s attention map at ``layer`` (its self-attention),
    the cluster view of position ``query`` (negative: from the end), self mass and W_vo / W_qk statistics of
    every layer and head."""
    model = body.get("model")
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
        tokens = [show(t) for t in tr.tokens]
        return {"model": model, "layer": layer, "head": head, "n_heads": H, "n_layers": L, "tokens": tokens,
                "block": b, "labels": block_labels(tokens, b), "map": block_mean(A[head].float(), b),
                "cluster": {"position": cv.position, "token": tokens[cv.position], "kind": cv.kind,
                            "self_mass": cv.self_mass, "foreign_mass": cv.foreign_mass,
                            "move_distance": cv.move_distance, "foreign_distance": cv.foreign_distance,
                            "cos_query_centroid": cv.cos_query_centroid,
                            "output_norm": float(cv.filtered_centroid.norm()),
                            "top": [{"position": j, "token": show(tok), "weight": w} for j, tok, w in cv.top_members]},
                "self_mass": sm.mass, "self_uniform": sm.uniform,
                "head_stats": {"layers": stats.layers, "vo_norm": stats.vo_norm, "qk_norm": stats.qk_norm,
                               "vo_sigma1": stats.vo_sigma1, "vo_copying": stats.vo_copying}}

    return await run_job(request, ex, model, compute)


@api
async def kernels(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{model}`` -> position kernels (logit units) of every layer and head by distance, their self-bias
    classes and the fractions per class (T5 and ALiBi from the weights, others measured; cached)."""
    model = body.get("model")
    lm = ex.model(model)

    def compute(job: Job) -> dict[str, Any]:
        pk = ex.results.get((model, "kernels"), lambda: position_kernels(lm, progress=False))
        stacks = []
        for s in pk.stacks:
            K, H, n = s.log_values.shape
            names = ["all layers" if l is None else f"L{l}" for l in s.layers]
            if K * H * n <= MAX_CELLS:
                rows = [f"{names[r]} h{h}" for r in range(K) for h in range(H)]
                values = s.log_values.reshape(K * H, n)
                labels = [c.label for row in s.classes for c in row]
            else:  # very many heads: the mean kernel of each layer
                rows, values, labels = [f"{nm} (mean of {H} heads)" for nm in names], s.log_values.mean(1), []
            stacks.append({"stack": s.stack or "model", "causal": s.causal, "distances": s.distances,
                           "rows": rows, "values": values.to(torch.float32), "labels": labels,
                           "fractions": s.fractions()})
        return {"model": model, "scheme": pk.scheme, "units": pk.units, "estimator": pk.estimator,
                "notes": pk.notes, "margin": pk.margin, "stacks": stacks}

    return await run_job(request, ex, model, compute)
