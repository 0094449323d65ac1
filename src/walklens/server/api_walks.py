"""The walk views: the encoding walk heatmap and its cells, the decoding walk, the similarity map (seed 000,
sec. 2.1, 2.2.2, A.1, A.2; Figs. 3, 9, 11, 12).  The compare view asks :func:`walk` once per model.

Each route checks its arguments, then runs the analysis of :mod:`walklens.walks` / :mod:`walklens.decoding`
on a cached trace (:mod:`.traces`) and sends what the page draws: ranks as integers (-1: undefined, the last
position has no next token), maps of at most :data:`~.bounds.MAX_CELLS` cells, top-k lists cut to the k
asked.  The heatmap needs the ranks of w_t and w_t+1 at every cell and P(w_t+1) at ``final`` only, so the
walk is computed in two parts, each once per (model, text, reading, metric) and kept: the rank maps of every
point (:func:`get_walk`: ``k=0, probs=False``, the matrix products and rank counts and nothing else), and the
full reading of one point at every position (:func:`get_point`: :data:`~.bounds.MAX_K` nearest tokens,
probabilities, cosines), for ``final`` with the heatmap and for any other point on the first click on it.
Both are :func:`walklens.encoding_walk` itself, so a cell shows what the whole walk would.
"""

from __future__ import annotations

from typing import Any

import torch
from starlette.requests import Request

from ..decoding import decoding_walk
from ..reports.html import block_labels, block_mean, show
from ..walks import EncodingWalk, encoding_walk, labels_for, similarity_map
from .bounds import (MAX_K, MAX_NEW_TOKENS, MAX_TOKENS, ApiError, block_for, bool_arg, choice_arg, column_min,
                     int_arg, text_arg)
from .routing import api
from .state import Explorer, Job, run_job
from .traces import WALK_POINTS, n_tokens, trace


def get_walk(ex: Explorer, job: Job, model: str, text: str, norm: str, metric: str) -> EncodingWalk:
    """The ranks of the encoding walk of ``text`` at :data:`~.traces.WALK_POINTS` (no top k, no probabilities;
    cached)."""
    tr = trace(ex, job, model, text, WALK_POINTS, MAX_TOKENS, "walk")
    w = ex.results.get((model, "walk", text, norm, metric),
                       lambda: encoding_walk(tr, k=0, metric=metric, norm=norm, points=list(WALK_POINTS),
                                             probs=False, progress=False))
    job.check()
    return w


def get_point(ex: Explorer, job: Job, model: str, text: str, norm: str, metric: str, point: str) -> EncodingWalk:
    """The full encoding walk of ``text`` at one walk point (:data:`~.bounds.MAX_K` nearest tokens, probabilities,
    cosines, at every position; cached)."""
    tr = trace(ex, job, model, text, WALK_POINTS, MAX_TOKENS, "walk")
    w = ex.results.get((model, "walk point", text, norm, metric, point),
                       lambda: encoding_walk(tr, k=MAX_K, metric=metric, norm=norm, points=[point], progress=False))
    job.check()
    return w


def _ranks(r: torch.Tensor, b: int) -> list[list[int]]:
    """Ranks [P, T] as integers, the best rank of each block of b positions; -1 stays -1 (undefined)."""
    if b <= 1:
        return r.tolist()
    big = float(2 ** 40)
    z = column_min(torch.where(r < 0, big, r.double()), b)
    return torch.where(z >= big, -1, z).long().tolist()


def _walk_args(body: dict[str, Any]) -> tuple[str, str, str, str]:
    return (body.get("model"), text_arg(body), choice_arg(body, "norm", "none", ("none", "final")),
            choice_arg(body, "metric", "dot", ("dot", "cosine")))


@api
async def walk(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{model, text, norm: none|final, metric: dot|cosine}`` -> the layer x position maps of rank(w_t) and
    rank(w_t+1), the escape points of every position and P(w_t+1) at ``final``."""
    model, text, norm, metric = _walk_args(body)
    lm = ex.model(model)

    def compute(job: Job) -> dict[str, Any]:
        w = get_walk(ex, job, model, text, norm, metric)
        fin = get_point(ex, job, model, text, norm, metric, "final")
        P, T = w.rank_of_input.shape
        b = block_for(P, T)
        tokens = [show(t) for t in w.tokens]
        fi = w.points.index("final")
        return {"model": model, "norm": norm, "metric": metric, "matrix": w.matrix, "n_vocab": int(
                lm.embedding_matrix().shape[0]), "tokens": tokens, "points": w.points, "block": b,
                "columns": block_labels(tokens, b), "rank_input": _ranks(w.rank_of_input, b),
                "rank_next": _ranks(w.rank_of_next, b), "escape": w.escape_point, "escape_stable": w.escape_stable,
                "prob_next_final": fin.prob_of_next[0], "rank_next_final": w.rank_of_next[fi]}

    return await run_job(request, ex, model, compute)


@api(exact=True)
async def walk_cell(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{model, text, norm, metric, point, position, k}`` -> the k nearest tokens of one cell with scores, the
    ranks, probabilities and cosines of w_t and w_t+1 there, and whether it is the position's escape point."""
    model, text, norm, metric = _walk_args(body)
    lm = ex.model(model)
    p = int_arg(body, "point", None, 0, 10 ** 6)
    t = int_arg(body, "position", None, 0, MAX_TOKENS - 1)
    k = int_arg(body, "k", 10, 1, MAX_K)

    def compute(job: Job) -> dict[str, Any]:
        w = get_walk(ex, job, model, text, norm, metric)
        P, T = w.rank_of_input.shape
        if p >= P or t >= T:
            raise ApiError(f"no cell ({p}, {t}): the walk has {P} points and {T} positions")
        c = get_point(ex, job, model, text, norm, metric, w.points[p])  # the ranks are the map's (w)
        ids = [int(i) for i in c.top_ids[0, t, :k] if i >= 0]
        labels = labels_for(lm.tokenizer, ids)
        nxt = int(w.token_ids[t + 1]) if t + 1 < T else None
        return {"point": w.points[p], "position": t, "token": show(w.tokens[t]),
                "next": show(w.tokens[t + 1]) if nxt is not None else None, "metric": metric, "norm": norm,
                "rank_input": w.rank_of_input[p, t], "rank_next": w.rank_of_next[p, t],
                "prob_input": c.prob_of_input[0, t], "prob_next": c.prob_of_next[0, t],
                "cos_input": c.cos_input[0, t], "cos_next": c.cos_next[0, t], "vector_norm": c.vector_norm[0, t],
                "escape": int(w.escape_point[t]) == p, "escape_stable": int(w.escape_stable[t]) == p,
                "neighbours": [{"id": i, "token": show(labels[i]), "score": float(s), "is_next": i == nxt,
                                "is_input": i == int(w.token_ids[t])}
                               for i, s in zip(ids, c.top_scores[0, t, :len(ids)].tolist())]}

    return await run_job(request, ex, model, compute)


@api(exact=True)
async def decode(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{model, text, max_new_tokens, target?, k}`` -> the decoding walk: per step the emitted token, its rank
    and probability, d_t's k nearest tokens with probabilities and its movement; with a target (teacher
    forcing, A.1) whether each d_t lies in the target token's neighbourhood."""
    model = body.get("model")
    lm = ex.model(model)
    prompt = text_arg(body)
    target = text_arg(body, "target", required=False) or None
    steps = int_arg(body, "max_new_tokens", 12, 1, MAX_NEW_TOKENS)
    k = int_arg(body, "k", 10, 1, MAX_K)

    def compute(job: Job) -> dict[str, Any]:
        n_tokens(ex, model, prompt, MAX_TOKENS, "decoding")
        if target is not None:
            n_tokens(ex, model, target, MAX_NEW_TOKENS, "decoding target")
        dw = ex.results.get((model, "decode", prompt, target, steps, k),
                            lambda: decoding_walk(lm, prompt, max_new_tokens=steps, target=target, k=k,
                                                  progress=False))
        return {"model": model, "prompt_tokens": [show(t) for t in dw.prompt_tokens],
                "tokens": [show(t) for t in dw.tokens], "ranks": dw.ranks, "probs": dw.probs,
                "top_tokens": [[show(t) for t in row] for row in dw.top_tokens], "top_probs": dw.top_probs,
                "greedy": [show(t) for t in lm.token_strings(dw.greedy_ids.tolist())],
                "step_length": dw.step_length, "step_angle": dw.step_angle, "d_norm": dw.d_norm,
                "stopped_at_eos": dw.stopped_at_eos, "target": dw.target,
                "in_neighbourhood": dw.in_neighbourhood, "left_path_at": dw.left_path_at}

    return await run_job(request, ex, model, compute)


@api
async def simmap(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{model, text, point, metric, normed}`` -> the [tokens, tokens] similarity at a captured point (or
    ``V``), averaged over b x b blocks of positions when it has more than MAX_CELLS cells."""
    model = body.get("model")
    ex.model(model)
    text = text_arg(body)
    point = body.get("point", "embed")
    if point != "V" and point not in ex.points[model]:
        raise ApiError("point must be V or a captured point of the model (see /api/info)")
    metric = choice_arg(body, "metric", "cosine", ("dot", "cosine"))
    normed = bool_arg(body, "normed", False)

    def compute(job: Job) -> dict[str, Any]:
        tr = trace(ex, job, model, text, ["embed" if point == "V" else point], MAX_TOKENS, "similarity map")
        S = similarity_map(tr, point, metric, normed)
        b = block_for(*S.shape, square=True)
        return {"model": model, "point": point, "metric": metric, "normed": normed, "block": b,
                "labels": block_labels([show(t) for t in tr.tokens], b), "z": block_mean(S, b)}

    return await run_job(request, ex, model, compute)
