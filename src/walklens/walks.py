"""Encoding walks, decoding walks and similarity maps (seed 000: sec. 2.1, 2.2.2, A.1, A.2; Figs. 3, 9, 11, 12).

- :func:`encoding_walk` follows every position's vector up the stack (the *encoding walk*, sec. 2.2.2) and
  reads it against the token vectors: nearest tokens, rank and probability of the input token w_t and of
  the next token w_{t+1}, step lengths and angles, and where w_{t+1} first outranks w_t (A.2).
- :func:`~walklens.decoding.decoding_walk` (in :mod:`walklens.decoding`) generates text and records the
  decoding vector d_t of every step (eqs. 8-15), with ``target=`` teacher-forcing a target path (A.1).
- :func:`similarity_map` gives the [tokens, tokens] similarity of the vectors at one point (Figs. 3, 11, 12).

Which matrix each reading compares with (``against``):

- ``norm="none"`` (the papers' reading, default ``against="embed"``): the raw captured vector x against the
  rows of V, the input embedding matrix (eq. 12 with tied embeddings: P_t = softmax(d_t V^T)).
- ``norm="final"`` (the logit-lens reading, default ``against="unembed"``): the model's own final norm is
  applied to x (never twice: the ``final`` point already is its output) and the result is read through the
  model's own head, so ``metric="dot"`` scores are exactly the model's logits (W_U, its bias, T5's
  d_model**-0.5 scale, Gemma's soft-capping, the MLM transform of BERT/ALBERT).  Cosines then compare the
  head's input with the rows of W_U.  For tied models W_U is V.
- ``against="embed"``/``"unembed"`` chooses the matrix explicitly; without the head (``norm="none"``, or
  ``against="embed"``) scores are plain inner products x·m_i.

BERT and ALBERT have no final norm: their residual stream is already the output of a LayerNorm at every
layer, so ``norm="final"`` applies no norm and reads through the MLM head.  ALBERT's V lives in E-space
(E may differ from D); comparing D-sized vectors with it raises a clear :class:`~walklens.errors.InputError`
(use ``norm="final"``, which reads through the MLM head that maps D to E).

Ranks are counts of scores strictly greater than the token's score (rank 0 = nearest), never a sort: rows are
read in chunks (at most 512) against the matrix one vocabulary tile at a time by :mod:`walklens.ranking`
(one float32 product per tile, compared while in cache; a token never outranks itself, see there), so memory
stays bounded (never points x tokens x |V| at once).  Probabilities are always softmax of the inner products
(eq. 12), whatever the metric.  ``k=0, probs=False`` leaves out the top-k and softmax passes: the rank maps
(and escape points) cost the products and the counts alone, which is what ``walklens serve`` computes for its
heatmap (docs/explorer.md, Benchmark).

Speed: the products dominate (|V| x D multiply-adds per row and point: 28 M for smollm2-135m, ~6.5x its
forward pass per token over 32 points) and stay float32.  A bfloat16 (AMX) screen with float32 verification
was measured and rejected: the rigorous bound of its error leaves thousands of tokens per row to re-score
(:mod:`walklens.ranking`).

Precision: scores, ranks and probabilities are float32 computations whatever the model's dtype.  A bfloat16 or
float16 model's vectors are recorded in float32 (:func:`~walklens.capture.capture`), its V / W_U are read in
float32, and with ``norm="final"`` its final norm and head run in float32 from its own weights
(:func:`~walklens.interventions.upcast`, exact conversions), so ranks are not decided by 16-bit rounding
ties.  :attr:`EncodingWalk.model_dtype` records the model's dtype.
"""

from __future__ import annotations

import fnmatch
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence

import torch
from torch import nn

from .errors import InputError
from .frames import Columns, DataFrame, concat_columns, frame, long_table, pick, point_kind, point_layer
from .interventions import Hooks, outside_layers, upcast
from .models.base import get_module
from .precision import dtype_name, is_low_precision
from .ranking import Dense, Linear, read_rows, scratch

if TYPE_CHECKING:
    from .loading import LoadedModel
    from .trace import Trace

Metric = Literal["dot", "cosine"]
Norm = Literal["none", "final"]
Against = Literal["auto", "embed", "unembed"]

_RESIDUAL_KINDS = ("resid_pre", "resid_mid", "resid_cross", "resid_post")
_CHUNK_BYTES = 128 << 20  # a whole [rows, |V|] float32 score block (read with k > 0, or through a model's head)
_MAX_CHUNK_ROWS = 512  # rows read at once (walklens.ranking: a chunk's target scores cost rows**2 products)


# ------------------------------------------------------------------------------------------------------------
# result types
# ------------------------------------------------------------------------------------------------------------

@dataclass
class EncodingWalk:
    """The encoding walk of every position through every selected point (sec. 2.2.2, Fig. 9, A.2).

    Per point p and position t (tensors [points, tokens]): ``top_ids``/``top_scores`` [points, tokens, k]
    (nearest tokens by ``metric``; k = 0: none read), ``rank_of_input``/``rank_of_next`` (rank of w_t /
    w_{t+1}; 0 = nearest; the last position has no next token: -1), ``prob_of_input``/``prob_of_next``
    (softmax of the inner products, eq. 12; NaN where undefined, and everywhere if read with ``probs=False``),
    ``dot_input``/``dot_next`` and ``cos_input``/``cos_next`` (inner product and cosine with the token's row),
    ``vector_norm`` (|x|), ``step_length`` and ``step_angle`` (distance and angle in degrees from the previous
    residual point, measured on the raw captured vectors; NaN for the first residual point and for
    contribution points such as ``attn_out``).  Per position: ``escape_point`` — index into ``points`` of the
    first residual point where w_{t+1} outranks w_t (the escape from the self-neighbourhood, A.2), -1 if never
    (or the last position); ``escape_stable`` — the first residual point from which w_{t+1} stays ahead of w_t
    up to the top.
    ``encoder`` holds the encoder stack's walk for encoder-decoder models (A.2, "Encoder vs Decoder Walks").
    """

    tokens: list[str]
    token_ids: torch.Tensor
    points: list[str]
    residual: list[bool]
    k: int
    metric: str
    norm: str
    matrix: str
    top_ids: torch.Tensor
    top_scores: torch.Tensor
    rank_of_input: torch.Tensor
    rank_of_next: torch.Tensor
    prob_of_input: torch.Tensor
    prob_of_next: torch.Tensor
    dot_input: torch.Tensor
    dot_next: torch.Tensor
    cos_input: torch.Tensor
    cos_next: torch.Tensor
    vector_norm: torch.Tensor
    step_length: torch.Tensor
    step_angle: torch.Tensor
    escape_point: torch.Tensor
    escape_stable: torch.Tensor
    stack: str = ""
    model_name: str = ""
    n_layers: int = 0
    encoder: EncodingWalk | None = None
    model_dtype: str = "float32"

    def __post_init__(self) -> None:
        P, T = len(self.points), len(self.tokens)
        if len(self.residual) != P:
            raise ValueError(f"residual flags: {len(self.residual)} for {P} points")
        for name in ("rank_of_input", "rank_of_next", "prob_of_input", "prob_of_next", "dot_input", "dot_next",
                     "cos_input", "cos_next", "vector_norm", "step_length", "step_angle"):
            shape = tuple(getattr(self, name).shape)
            if shape != (P, T):
                raise ValueError(f"{name} has shape {shape}, expected {(P, T)}")
        for name in ("top_ids", "top_scores"):
            if tuple(getattr(self, name).shape) != (P, T, self.k):
                raise ValueError(f"{name} has shape {tuple(getattr(self, name).shape)}, expected {(P, T, self.k)}")
        for name in ("escape_point", "escape_stable"):
            if tuple(getattr(self, name).shape) != (T,):
                raise ValueError(f"{name} has shape {tuple(getattr(self, name).shape)}, expected {(T,)}")

    @property
    def residual_points(self) -> list[str]:
        """The points on the residual stream, in walk order."""
        return [p for p, r in zip(self.points, self.residual) if r]

    @property
    def escape_names(self) -> list[str | None]:
        """Name of the escape point of each position (None: w_{t+1} never outranks w_t)."""
        return [self.points[i] if i >= 0 else None for i in self.escape_point.tolist()]

    @property
    def escape_stable_names(self) -> list[str | None]:
        """Name of the point from which w_{t+1} stays ahead of w_t to the top (None: it does not)."""
        return [self.points[i] if i >= 0 else None for i in self.escape_stable.tolist()]

    def point_index(self, name: str) -> int:
        try:
            return self.points.index(name)
        except ValueError:
            raise InputError(f"no point {name!r} in this walk") from None

    def label_ids(self) -> list[int]:
        """Every token id this walk mentions (inputs and top-k), for decoding labels once."""
        ids = torch.cat([self.token_ids.reshape(-1), self.top_ids.reshape(-1)]).unique()
        out = [int(i) for i in ids.tolist() if i >= 0]
        if self.encoder is not None:
            out = sorted(set(out) | set(self.encoder.label_ids()))
        return out

    def _columns(self, table: str = "walk") -> Columns:
        """The plain columns of :meth:`to_pandas` (encoder rows first on an encoder-decoder model)."""
        cells = ("rank_of_input", "rank_of_next", "prob_of_input", "prob_of_next", "dot_input", "dot_next",
                 "cos_input", "cos_next", "vector_norm", "step_length", "step_angle")

        def walk(w: EncodingWalk) -> Columns:
            ids = [int(i) for i in w.token_ids.reshape(-1).tolist()]
            return long_table(
                [("point", w.points), ("position", range(len(w.tokens)))],
                {name: getattr(w, name) for name in cells}, constants={"stack": w.stack},
                by_axis={"point": {"layer": [point_layer(p) for p in w.points],
                                   "kind": [point_kind(p) for p in w.points], "residual": w.residual},
                         "position": {"token": w.tokens, "token_id": ids, "next_token_id": ids[1:] + [None],
                                      "escape_point": w.escape_names, "escape_stable": w.escape_stable_names}},
                wide={"top_id": w.top_ids, "top_score": w.top_scores})

        parts = ([self.encoder] if self.encoder is not None else []) + [self]
        return pick(table, {"walk": lambda: concat_columns([walk(w) for w in parts])}, "an EncodingWalk")

    def to_pandas(self, table: str = "walk") -> DataFrame:
        """The walk as a long table (pandas; docs/notebooks.md, "Tables"): one row per (stack, point, position)
        with the fields above under their own names, the escape points by name and the top-k as ``top_id_i``,
        ``top_score_i`` (i = rank, 0 = nearest)."""
        return frame(self._columns(table), {"model": self.model_name, "metric": self.metric, "norm": self.norm,
                                            "matrix": self.matrix, "k": self.k, "model_dtype": self.model_dtype})


# ------------------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------------------

def _need_lm(trace: Trace, lm: LoadedModel | None) -> LoadedModel:
    lm = lm if lm is not None else trace.lm
    if lm is None:
        raise InputError("this trace is not attached to a model (capture it with walklens.capture, or pass lm=)")
    return lm


def _check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise InputError(f"{name} must be one of {', '.join(map(repr, allowed))}, not {value!r}")


def final_norm_fn(lm: LoadedModel, stack: str = "") -> Callable[[torch.Tensor], torch.Tensor]:
    """The model's final norm of ``stack`` as a function (identity for BERT/ALBERT, which have none)."""
    spec = lm.adapter.stack(stack if stack in [s.name for s in lm.adapter.stacks] else None)
    if not spec.final_norm:
        return lambda x: x
    module = get_module(lm.model, spec.final_norm)

    def fn(x: torch.Tensor) -> torch.Tensor:
        w = next(module.parameters(), None)
        with torch.no_grad():
            return module(x.to(w.dtype) if w is not None else x).float()

    return fn


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


def labels_for(tokenizer: Any, ids: Sequence[int]) -> dict[int, str]:
    """Each id decoded on its own (``" Paris"``, not ``"ĠParis"``), once per distinct id."""
    return {int(i): tokenizer.decode([int(i)]) for i in ids}


# ------------------------------------------------------------------------------------------------------------
# encoding walk
# ------------------------------------------------------------------------------------------------------------

def encoding_walk(trace: Trace, k: int = 10, metric: Metric = "dot", norm: Norm = "none", *,
                  against: Against = "auto", points: Sequence[str] | str | None = None,
                  lm: LoadedModel | None = None, chunk_rows: int | None = None, probs: bool = True,
                  progress: bool = True) -> EncodingWalk:
    """The encoding walk of every position (seed 000, sec. 2.2.2, Fig. 9; A.2) read against the token vectors.

    ``metric``: ``"dot"`` (the inner product of eq. 13) or ``"cosine"``.  ``norm``: ``"none"`` compares the raw
    captured vectors (the papers' reading); ``"final"`` applies the model's final norm first and reads through
    the model's head (the logit lens; see the module docstring for the matrix each reading uses).
    ``points``: ``None``/``"all"`` (every captured point), ``"residual"`` or glob patterns.
    ``k``: nearest tokens per cell; ``k=0`` and ``probs=False`` skip the top-k and the softmax passes (no
    ``top_ids`` columns; ``prob_of_*`` NaN): what a rank map needs costs little more than the products.
    ``chunk_rows``: rows read at once (at most 512; by default as many as a 128 MiB score block holds).
    For encoder-decoder models the encoder's walk is attached as ``.encoder``.
    """
    _check_choice("metric", metric, ("dot", "cosine"))
    _check_choice("norm", norm, ("none", "final"))
    _check_choice("against", against, ("auto", "embed", "unembed"))
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise InputError(f"k must be a non-negative integer, not {k!r}")
    lm = _need_lm(trace, lm)
    walk = _walk_stack(trace, lm, k, metric, norm, against, points, chunk_rows, probs, progress)
    if trace.encoder is not None:
        enc = trace.encoder
        if enc.lm is None:
            enc.lm = lm
        walk.encoder = _walk_stack(enc, lm, k, metric, norm, against, points, chunk_rows, probs, progress)
    return walk


def _walk_stack(trace: Trace, lm: LoadedModel, k: int, metric: str, norm: str, against: str,
                points: Sequence[str] | str | None, chunk_rows: int | None, probs_wanted: bool,
                progress: bool) -> EncodingWalk:
    from tqdm.auto import tqdm

    model, adapter = lm.model, lm.adapter
    device = lm.device
    which = ("embed" if norm == "none" else "unembed") if against == "auto" else against
    if which == "unembed" and not adapter.unembed:
        which = "embed"
    lens = norm == "final" and which == "unembed"
    sel = _select_points(trace, points)
    names = [trace.points[i] for i in sel]
    P, T, D = len(sel), len(trace.tokens), trace.d_model
    token_ids = trace.token_ids.reshape(-1).long().cpu()

    head: nn.Module | None = None
    if lens:
        head = get_module(model, adapter.unembed)
        M = head.weight.detach()
        matrix = f"W_U ({adapter.unembed}) through the model's head"
    else:
        M = (adapter.embedding_matrix(model) if which == "embed" else get_module(model, adapter.unembed).weight).detach()
        matrix = "V" if which == "embed" else f"W_U ({adapter.unembed})"
        if M.shape[1] != D:
            raise InputError(
                f"{lm.name}: the {'token embedding matrix V' if which == 'embed' else 'unembedding'} has width "
                f"{M.shape[1]} but the captured vectors have D={D} (ALBERT keeps V in E-space); "
                f"use norm='final', which reads through the model's head")
    M = M.float().to(device)
    n_vocab = M.shape[0]
    if int(token_ids.max()) >= n_vocab:
        raise InputError(f"token id {int(token_ids.max())} is outside the matrix of {n_vocab} rows")
    inv_m = 1.0 / M.norm(dim=-1).clamp_min(1e-12)
    normf = final_norm_fn(lm, trace.stack) if norm == "final" else None
    final_idx = [j for j, n in enumerate(names) if n == "final"]

    # targets per token position
    nxt = torch.full((T,), -1, dtype=torch.long)
    nxt[:-1] = token_ids[1:]
    rows_total = P * T
    if chunk_rows is None:
        chunk_rows = _CHUNK_BYTES // (4 * n_vocab)
    chunk_rows = max(1, min(int(chunk_rows), _MAX_CHUNK_ROWS))
    hidden = trace.hidden[sel] if sel != list(range(len(trace.points))) else trace.hidden
    flat = hidden.reshape(rows_total, D)

    out_top_i = torch.empty(rows_total, k, dtype=torch.long)
    out_top_v = torch.empty(rows_total, k)
    ranks = torch.empty(2, rows_total, dtype=torch.long)
    probs = torch.full((2, rows_total), float("nan"))
    dots = torch.empty(2, rows_total)
    coss = torch.empty(2, rows_total)
    norms = torch.empty(rows_total)
    head_bias = head.bias.detach().float().to(device) if (head is not None and getattr(head, "bias", None) is not None) else None
    plain_head: bool | None = None  # lens: decided on the first chunk
    k_eff = min(k, n_vocab)
    buf = scratch(min(chunk_rows, rows_total), n_vocab, k_eff, device)  # the tiles' products, chunk after chunk
    starts = range(0, rows_total, chunk_rows)
    bar = tqdm(starts, desc=f"encoding walk{' ' + trace.stack if trace.stack else ''}", unit="chunk",
               disable=not progress or len(starts) < 8, file=sys.stderr, leave=False)
    wide = upcast(outside_layers(lm)) if is_low_precision(lm.dtype) else nullcontext()  # head in float32
    with torch.no_grad(), wide:
        for r0 in bar:
            r1 = min(r0 + chunk_rows, rows_total)
            t_idx = torch.arange(r0, r1) % T
            x = flat[r0:r1].to(device=device, dtype=torch.float32)
            norms[r0:r1] = x.norm(dim=-1).cpu()
            if normf is not None:
                xn = normf(x)
                if final_idx:
                    keep = torch.isin(torch.arange(r0, r1) // T, torch.tensor(final_idx)).to(device)
                    xn = torch.where(keep[:, None], x, xn)
                x = xn
            ids_in = token_ids[t_idx].to(device)
            ids_nx = nxt[t_idx].to(device)
            has_nx = ids_nx >= 0
            ids_nx_c = ids_nx.clamp_min(0)
            scorer: Linear | Dense
            if lens and not plain_head:
                store: dict[str, torch.Tensor] = {}
                with Hooks() as hooks:  # the head's input and output while the model's own head runs
                    hooks.pre(head, lambda _m, args: store.__setitem__("u", args[0]))
                    hooks.post(head, lambda _m, _a, out: store.__setitem__("y", out))
                    dot = adapter.logits(model, x).float()
                u = store["u"].float()
                if plain_head is None:  # first chunk: is the model's head a plain linear map of x?
                    plain_head = bool(u.shape == x.shape and torch.equal(u, x)
                                      and torch.equal(dot, torch.nn.functional.linear(x, M, head_bias)))
                scores = dot
                if metric == "cosine":
                    y = store["y"].float()  # may be the very tensor returned as logits: never modify in place
                    if head_bias is not None:
                        y = y - head_bias
                    scores = (y * inv_m).mul_(1.0 / u.norm(dim=-1, keepdim=True).clamp_min(1e-12))
                scorer = Dense(dot, scores)
            else:  # scores are x·m_i (+ the head's bias): computed tile by tile (walklens.ranking)
                u = x
                scorer = Linear(x, M, head_bias if lens else None, inv_m if metric == "cosine" else None, buf)
            got = read_rows(scorer, torch.stack([ids_in, ids_nx_c], 1), k_eff, lse=probs_wanted)
            d_in, d_nx = got.dot[:, 0], got.dot[:, 1]
            inv_u = 1.0 / u.norm(dim=-1).clamp_min(1e-12)
            if lens:  # the head's input u and its logits differ (bias, scale, transform): use u
                c_in = (u * M[ids_in]).sum(-1) * inv_u * inv_m[ids_in]
                c_nx = (u * M[ids_nx_c]).sum(-1) * inv_u * inv_m[ids_nx_c]
            else:  # u = x and dot = x·m: the cosine follows from the inner product
                c_in = d_in * inv_u * inv_m[ids_in]
                c_nx = d_nx * inv_u * inv_m[ids_nx_c]
            nan = torch.tensor(float("nan"), device=device)
            out_top_v[r0:r1, :k_eff] = got.top_v.cpu()
            out_top_i[r0:r1, :k_eff] = got.top_i.cpu()
            ranks[0, r0:r1] = got.rank[:, 0].cpu()
            ranks[1, r0:r1] = torch.where(has_nx, got.rank[:, 1], -1).cpu()
            if got.lse is not None:  # softmax of the inner products (eq. 12)
                probs[0, r0:r1] = (d_in - got.lse).exp().cpu()
                probs[1, r0:r1] = torch.where(has_nx, (d_nx - got.lse).exp(), nan).cpu()
            dots[0, r0:r1], dots[1, r0:r1] = d_in.cpu(), torch.where(has_nx, d_nx, nan).cpu()
            coss[0, r0:r1], coss[1, r0:r1] = c_in.cpu(), torch.where(has_nx, c_nx, nan).cpu()
    if k_eff < k:
        out_top_i[:, k_eff:] = -1
        out_top_v[:, k_eff:] = float("nan")

    residual = [_is_residual(trace, n) for n in names]
    step_len, step_ang = _steps(trace, sel, residual)
    rank_in, rank_nx = ranks[0].reshape(P, T), ranks[1].reshape(P, T)
    return EncodingWalk(
        tokens=list(trace.tokens), token_ids=token_ids, points=names, residual=residual, k=k, metric=metric,
        norm=norm, matrix=matrix, top_ids=out_top_i.reshape(P, T, k), top_scores=out_top_v.reshape(P, T, k),
        rank_of_input=rank_in, rank_of_next=rank_nx, prob_of_input=probs[0].reshape(P, T),
        prob_of_next=probs[1].reshape(P, T), dot_input=dots[0].reshape(P, T), dot_next=dots[1].reshape(P, T),
        cos_input=coss[0].reshape(P, T), cos_next=coss[1].reshape(P, T), vector_norm=norms.reshape(P, T),
        step_length=step_len, step_angle=step_ang, escape_point=_escape(rank_in, rank_nx, residual),
        escape_stable=_escape(rank_in, rank_nx, residual, stable=True),
        stack=trace.stack, model_name=trace.model_name, n_layers=trace.n_layers, model_dtype=dtype_name(lm.dtype))


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


# ------------------------------------------------------------------------------------------------------------
# similarity maps
# ------------------------------------------------------------------------------------------------------------

def similarity_map(trace: Trace, point: str = "embed", metric: Metric = "dot", normed: bool = False, *,
                   lm: LoadedModel | None = None) -> torch.Tensor:
    """The [tokens, tokens] similarity of the vectors at one point (seed 000, Figs. 3, 11, 12).

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
    return x @ x.t()


__all__ = ["EncodingWalk", "encoding_walk", "similarity_map"]
