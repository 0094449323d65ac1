"""The encoding walk (seed 000, sec. 2.2.2, Fig. 9; A.2): every position's vector followed up the stack and read
against the token vectors (:mod:`walklens.analyses.walks.reading`), its steps and its escape points; the walk at some of
its points (:func:`walk_rows`) and one walk joined from walks of consecutive points (:func:`join_walks`)."""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch

from ...base.errors import InputError
from ...base.precision import dtype_name
from ...core.loading import token_strings
from ...core.tracedir import PointStack
from .reading import _read_all, _Reading, _token_matrix, point_rows
from .result import Against, EncodingWalk, Metric, Norm

if TYPE_CHECKING:
    from ...core.loading import LoadedModel
    from ...core.trace import Trace


_RESIDUAL_KINDS = ("resid_pre", "resid_mid", "resid_cross", "resid_post")


def _need_lm(trace: Trace, lm: LoadedModel | None) -> LoadedModel:
    lm = lm if lm is not None else trace.lm
    if lm is None:
        raise InputError("this trace is not attached to a model (capture it with walklens.core.capture, or pass lm=)")
    return lm


def _check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise InputError(f"{name} must be one of {', '.join(map(repr, allowed))}, not {value!r}")


def _is_residual(trace: Trace, point: str) -> bool:
    return point in ("embed", "final") or trace.kind_of(point) in _RESIDUAL_KINDS


def _select_points(trace: Trace, points: Sequence[str] | str | None) -> list[int]:
    if points is None or points == "all":
        return list(range(len(trace.points)))
    if points == "residual":
        return [i for i, p in enumerate(trace.points) if _is_residual(trace, p)]
    if isinstance(points, str):
        points = [points]
    keep = [i for i, p in enumerate(trace.points) if any(fnmatch.fnmatchcase(p, pat) for pat in points)]
    if not keep:
        raise InputError(f"no captured point matches {', '.join(points)}; captured: {', '.join(trace.points[:6])} ...")
    return keep


def _check_reading(k: Any, probs: bool, screen: bool) -> None:
    """``k`` a non-negative integer; ``screen`` only with ``k=0, probs=False``."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise InputError(f"k must be a non-negative integer, not {k!r}")
    if screen and (k or probs):
        raise InputError("screen=True gives provisional ranks only: use it with k=0, probs=False")


def labels_for(tokenizer: Any, ids: Sequence[int]) -> dict[int, str]:
    """Each distinct id's label (:func:`walklens.core.loading.token_strings`: ``" Paris"``, not ``"ĠParis"``)."""
    distinct_ids = list(dict.fromkeys(int(i) for i in ids))
    return dict(zip(distinct_ids, token_strings(tokenizer, distinct_ids)))


def encoding_walk(
    trace: Trace,
    k: int = 10,
    metric: Metric = "dot",
    norm: Norm = "none",
    *,
    against: Against = "auto",
    points: Sequence[str] | str | None = None,
    lm: LoadedModel | None = None,
    chunk_rows: int | None = None,
    probs: bool = True,
    progress: bool = True,
    screen: bool = False,
    target: str | int | None = None,
    target_position: int = -1,
) -> EncodingWalk:
    """The encoding walk of every position (seed 000, sec. 2.2.2, Fig. 9; A.2) read against the token vectors.

    ``metric``: ``"dot"`` (the inner product of eq. 13) or ``"cosine"``.  ``norm``: ``"none"`` compares the raw
    captured vectors (the papers' reading); ``"final"`` applies the model's final norm first and reads through
    the model's head (the logit lens; see :mod:`walklens.analyses.walks` for the matrix each reading uses).
    ``points``: ``None``/``"all"`` (every captured point), ``"residual"`` or glob patterns.
    ``k``: nearest tokens per cell; ``k=0`` and ``probs=False`` skip the top-k and the softmax passes (no
    ``top_ids`` columns; ``prob_of_*`` NaN): what a rank map needs costs little more than the products.
    ``chunk_rows``: rows read at once (at most 512; by default as many as a 128 MiB score block holds).
    For encoder-decoder models the encoder's walk is attached as ``.encoder``.
    ``screen``: provisional ranks from bfloat16 products (:func:`walklens.core.ranking.screen_ranks`, several times
    faster, not exact: what ``walklens serve`` paints first); needs ``k=0, probs=False``.
    ``target``: one token (``" Paris"``, or its id) whose exact rank at ``target_position`` (default the last) is
    read at every point (``rank_of_target``; :meth:`~walklens.analyses.walks.EncodingWalk.first_top`).
    """
    _check_choice("metric", metric, ("dot", "cosine"))
    _check_choice("norm", norm, ("none", "final"))
    _check_choice("against", against, ("auto", "embed", "unembed"))
    _check_reading(k, probs, screen)
    lm = _need_lm(trace, lm)
    opts = _Reading(
        k=k,
        metric=metric,
        norm=norm,
        against=against,
        points=points,
        chunk_rows=chunk_rows,
        probs=probs,
        progress=progress,
        screen=screen,
    )
    walk = _walk_stack(trace, lm, opts)
    if target is not None:
        _read_target(walk, trace, lm, opts, _target_id(lm, target), target_position)
    if trace.encoder is not None:
        enc = trace.encoder
        if enc.lm is None:
            enc.lm = lm
        walk.encoder = _walk_stack(enc, lm, opts)
    walk.labels = labels_for(lm.tokenizer, walk.label_ids())  # the encoder's ids too: one decode, shared
    if walk.encoder is not None:
        walk.encoder.labels = walk.labels
    return walk


def _target_id(lm: LoadedModel, target: str | int) -> int:
    """The id of ``target``: an id of the vocabulary, or a text the tokenizer makes one token of."""
    if isinstance(target, bool) or not isinstance(target, (int, str)):
        raise InputError(f"target must be a token's text or its id, not {target!r}")
    if isinstance(target, int):
        ids = [target]
    else:
        ids = list(lm.tokenizer.encode(target, add_special_tokens=False))
    if len(ids) != 1:
        pieces = ", ".join(repr(s) for s in token_strings(lm.tokenizer, ids)) or "none"
        raise InputError(f"target {target!r} is {len(ids)} tokens ({pieces}), not one; choose one token")
    return int(ids[0])


def _read_target(walk: EncodingWalk, trace: Trace, lm: LoadedModel, opts: _Reading, tid: int, position: int) -> None:
    """The target ``tid``'s rank and probability at ``position`` at every point of ``walk``: the walk's own reading
    of that position's rows alone, with the target as the token to rank."""
    T = len(trace.tokens)
    if isinstance(position, bool) or not isinstance(position, int) or not -T <= position < T:
        raise InputError(f"target_position must be an integer in [{-T}, {T - 1}], not {position!r}")
    at = position % T
    sel = [trace.points.index(n) for n in walk.points]
    one = SimpleNamespace(tokens=[trace.tokens[at]], token_ids=torch.tensor([tid]), stack=trace.stack)
    mat = _token_matrix(lm, opts.norm, opts.against, trace.d_model)
    if not 0 <= tid < mat.M.shape[0]:
        raise InputError(f"target id {tid} is outside the matrix of {mat.M.shape[0]} rows")
    rows = point_rows(trace.hidden, sel, T)
    final_rows = [j for j, n in enumerate(walk.points) if n == "final"]
    quiet = dataclasses.replace(opts, k=0, progress=False, screen=False)
    cols = _read_all(
        lm,
        one,  # type: ignore[arg-type]  # what the reading reads of a trace: its tokens, their ids, its stack
        mat,
        quiet,
        lambda r0, r1: torch.cat([rows(j * T + at, j * T + at + 1) for j in range(r0, r1)]),
        len(sel),
        final_rows,
    )
    walk.target_id, walk.target_position = tid, at
    walk.rank_of_target, walk.prob_of_target = cols.ranks[0].clone(), cols.probs[0].clone()


def _walk_stack(trace: Trace, lm: LoadedModel, opts: _Reading) -> EncodingWalk:
    """The encoding walk of one stack's trace: every (point, position) row read against the token matrix."""
    sel = _select_points(trace, opts.points)
    names = [trace.points[i] for i in sel]
    P, T, D = len(sel), len(trace.tokens), trace.d_model
    token_ids = trace.token_ids.reshape(-1).long().cpu()
    mat = _token_matrix(lm, opts.norm, opts.against, D, blocked=isinstance(trace.hidden, PointStack))
    if int(token_ids.max()) >= mat.M.shape[0]:
        raise InputError(f"token id {int(token_ids.max())} is outside the matrix of {mat.M.shape[0]} rows")
    final_rows = [j for j, n in enumerate(names) if n == "final"]
    cols = _read_all(lm, trace, mat, opts, point_rows(trace.hidden, sel, T), P * T, final_rows)
    residual = [_is_residual(trace, n) for n in names]
    step_len, step_ang = _steps(trace, sel, residual)
    rank_in, rank_nx = cols.ranks[0].reshape(P, T), cols.ranks[1].reshape(P, T)
    k = opts.k
    return EncodingWalk(
        tokens=list(trace.tokens),
        token_ids=token_ids,
        points=names,
        residual=residual,
        k=k,
        metric=opts.metric,
        norm=opts.norm,
        matrix=mat.label,
        top_ids=cols.top_i.reshape(P, T, k),
        top_scores=cols.top_v.reshape(P, T, k),
        rank_of_input=rank_in,
        rank_of_next=rank_nx,
        prob_of_input=cols.probs[0].reshape(P, T),
        prob_of_next=cols.probs[1].reshape(P, T),
        dot_input=cols.dots[0].reshape(P, T),
        dot_next=cols.dots[1].reshape(P, T),
        cos_input=cols.coss[0].reshape(P, T),
        cos_next=cols.coss[1].reshape(P, T),
        vector_norm=cols.norms.reshape(P, T),
        step_length=step_len,
        step_angle=step_ang,
        escape_point=_escape(rank_in, rank_nx, residual),
        escape_stable=_escape(rank_in, rank_nx, residual, stable=True),
        stack=trace.stack,
        model_name=trace.model_name,
        n_layers=trace.n_layers,
        model_dtype=dtype_name(lm.dtype),
    )


def _per_cell(walk: EncodingWalk) -> list[str]:
    """The names of a walk's fields with a value per cell (tensors [points, positions, ...]), its own type's too."""
    shape = (len(walk.points), len(walk.tokens))
    return [
        f.name
        for f in dataclasses.fields(walk)
        if isinstance(v := getattr(walk, f.name), torch.Tensor) and v.dim() >= 2 and tuple(v.shape[:2]) == shape
    ]


#: a walk's fields with a value per point (the target's reading), None when it read no target
_PER_POINT = ("rank_of_target", "prob_of_target")


def walk_rows(walk: EncodingWalk, start: int, stop: int) -> EncodingWalk:
    """The walk at its points ``start`` .. ``stop - 1``: each per-cell field's rows (step length and angle as
    measured in the whole walk); the escape points, found over every point, as indices of these rows (-1 where
    the whole walk's lies outside them)."""
    rows = slice(start, stop)

    def among(esc: torch.Tensor) -> torch.Tensor:
        return torch.where((esc >= start) & (esc < stop), esc - start, -1)

    return dataclasses.replace(
        walk,
        **{f: getattr(walk, f)[rows] for f in _per_cell(walk)},
        points=walk.points[rows],
        residual=walk.residual[rows],
        escape_point=among(walk.escape_point),
        escape_stable=among(walk.escape_stable),
        **{f: getattr(walk, f)[rows] for f in _PER_POINT if getattr(walk, f) is not None},
    )


def join_walks(trace: Trace, parts: Sequence[EncodingWalk]) -> EncodingWalk:
    """One walk of the points of ``parts`` (walks of ``trace`` read alike at consecutive groups of its points, in
    walk order): every per-cell field stacked along the points, the fields that need the neighbouring or all
    points computed on the whole (step length and angle from the trace's vectors, the escape points of A.2).
    A part's own type and extra fields are kept, so a walk read in pieces is the walk read at once."""
    if not parts:
        raise ValueError("join_walks needs at least one part")
    if any(p.encoder is not None for p in parts):
        raise ValueError("join_walks joins one stack: read an encoder-decoder walk at once")
    first = parts[0]
    per_cell = _per_cell(first)
    names = [n for p in parts for n in p.points]
    residual = [r for p in parts for r in p.residual]
    step_len, step_ang = _steps(trace, [trace.points.index(n) for n in names], residual)
    joined: dict[str, Any] = {f: torch.cat([getattr(p, f) for p in parts]) for f in per_cell}
    if all(getattr(p, f) is not None for p in parts for f in _PER_POINT):
        joined |= {f: torch.cat([getattr(p, f) for p in parts]) for f in _PER_POINT}
    else:
        joined |= dict.fromkeys(_PER_POINT)
    rank_in, rank_nx = joined["rank_of_input"], joined["rank_of_next"]
    return dataclasses.replace(
        first,
        **{**joined, "step_length": step_len, "step_angle": step_ang},
        points=names,
        residual=residual,
        escape_point=_escape(rank_in, rank_nx, residual),
        escape_stable=_escape(rank_in, rank_nx, residual, stable=True),
        labels={i: s for p in parts for i, s in p.labels.items()},
    )


def _steps(trace: Trace, sel: list[int], residual: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """Distance and angle (degrees) of each residual point from the previous one, on the raw vectors."""
    T = len(trace.tokens)
    length = torch.full((len(sel), T), float("nan"))
    angle = torch.full((len(sel), T), float("nan"))
    prev: torch.Tensor | None = None
    for j, (i, r) in enumerate(zip(sel, residual)):
        if not r:
            continue
        x = trace.hidden[i].float()
        if prev is not None:
            length[j] = (x - prev).norm(dim=-1)
            cos = torch.nn.functional.cosine_similarity(x, prev, dim=-1, eps=1e-12).clamp(-1.0, 1.0)
            angle[j] = torch.rad2deg(torch.arccos(cos))
        prev = x
    return length, angle


def _escape(rank_in: torch.Tensor, rank_nx: torch.Tensor, residual: list[bool], stable: bool = False) -> torch.Tensor:
    """First residual point where w_{t+1} outranks w_t (A.2), per position; -1 if never.

    ``stable``: the first residual point from which it outranks w_t at every later residual point too.
    """
    T = rank_in.shape[1]
    res_idx = torch.tensor([i for i, r in enumerate(residual) if r], dtype=torch.long)
    out = torch.full((T,), -1, dtype=torch.long)
    if len(res_idx) == 0:
        return out
    esc = (rank_nx[res_idx] >= 0) & (rank_nx[res_idx] < rank_in[res_idx])  # [R, T]
    if stable:  # ahead here and at every later point: a suffix-AND along the walk
        esc = esc.flip(0).int().cummin(0).values.flip(0).bool()
    anyv = esc.any(0)
    first = esc.int().argmax(0)
    out[anyv] = res_idx[first[anyv]]
    return out
