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
(:mod:`walklens.ranking`); ``screen=True`` uses the bfloat16 products alone for provisional ranks.

Precision: scores, ranks and probabilities are float32 computations whatever the model's dtype.  A bfloat16 or
float16 model's vectors are recorded in float32 (:func:`~walklens.capture.capture`), its V / W_U are read in
float32, and with ``norm="final"`` its final norm and head run in float32 from its own weights
(:func:`~walklens.interventions.upcast`, exact conversions), so ranks are not decided by 16-bit rounding
ties.  :attr:`EncodingWalk.model_dtype` records the model's dtype.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import sys
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from .display import Shown
from .errors import InputError
from .frames import Columns, DataFrame, concat_columns, frame, long_table, pick, point_kind, point_layer
from .hooks import Hooks
from .interventions import outside_layers, upcast
from .kept import kept
from .loading import token_strings
from .models.base import get_module
from .precision import dtype_name, is_low_precision
from .ranking import Dense, Linear, Rows, read_rows, scratch, screen_ranks
from .simmap import SimilarityMap

if TYPE_CHECKING:
    from .loading import LoadedModel
    from .trace import Trace

Metric = Literal["dot", "cosine"]
Norm = Literal["none", "final"]
Against = Literal["auto", "embed", "unembed"]

_RESIDUAL_KINDS = ("resid_pre", "resid_mid", "resid_cross", "resid_post")
# the [points, positions] readings of an EncodingWalk, in its columns' order
_WALK_CELLS = (
    "rank_of_input",
    "rank_of_next",
    "prob_of_input",
    "prob_of_next",
    "dot_input",
    "dot_next",
    "cos_input",
    "cos_next",
    "vector_norm",
    "step_length",
    "step_angle",
)
_CHUNK_BYTES = 128 << 20  # a whole [rows, |V|] float32 score block (read with k > 0, or through a model's head)
_MAX_CHUNK_ROWS = 512  # rows read at once (walklens.ranking: a chunk's target scores cost rows**2 products)


# ------------------------------------------------------------------------------------------------------------
# result types
# ------------------------------------------------------------------------------------------------------------


@dataclass
class EncodingWalk(Shown, view="walk"):
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
    #: the text of each token id the walk names (its tokens and their nearest tokens): what its view shows
    labels: dict[int, str] = field(default_factory=dict, repr=False)

    def _headline(self) -> str:
        """The head line of its text repr (:mod:`walklens.display`)."""
        return f"{self.model_name} · {len(self.tokens)} tokens × {len(self.points)} points · {self.metric}/{self.norm}"

    def __post_init__(self) -> None:
        P, T = len(self.points), len(self.tokens)
        if len(self.residual) != P:
            raise ValueError(f"residual flags: {len(self.residual)} for {P} points")
        for name in _WALK_CELLS:
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

        def walk(w: EncodingWalk) -> Columns:
            ids = [int(i) for i in w.token_ids.reshape(-1).tolist()]
            return long_table(
                [("point", w.points), ("position", range(len(w.tokens)))],
                {name: getattr(w, name) for name in _WALK_CELLS},
                constants={"stack": w.stack},
                by_axis={
                    "point": {
                        "layer": [point_layer(p) for p in w.points],
                        "kind": [point_kind(p) for p in w.points],
                        "residual": w.residual,
                    },
                    "position": {
                        "token": w.tokens,
                        "token_id": ids,
                        "next_token_id": ids[1:] + [None],
                        "escape_point": w.escape_names,
                        "escape_stable": w.escape_stable_names,
                    },
                },
                wide={"top_id": w.top_ids, "top_score": w.top_scores},
            )

        parts = ([self.encoder] if self.encoder is not None else []) + [self]
        return pick(table, {"walk": lambda: concat_columns([walk(w) for w in parts])}, "an EncodingWalk")

    def to_pandas(self, table: str = "walk") -> DataFrame:
        """The walk as a long table (pandas; docs/notebooks.md, "Tables"): one row per (stack, point, position)
        with the fields above under their own names, the escape points by name and the top-k as ``top_id_i``,
        ``top_score_i`` (i = rank, 0 = nearest)."""
        return frame(
            self._columns(table),
            {
                "model": self.model_name,
                "metric": self.metric,
                "norm": self.norm,
                "matrix": self.matrix,
                "k": self.k,
                "model_dtype": self.model_dtype,
            },
        )


# ------------------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------------------


def _weight(module: nn.Module) -> torch.Tensor:
    """A linear map's or an embedding's ``weight``."""
    w = module.weight
    assert isinstance(w, torch.Tensor)
    return w


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
    """Each distinct id's label (:func:`walklens.loading.token_strings`: ``" Paris"``, not ``"ĠParis"``)."""
    distinct_ids = list(dict.fromkeys(int(i) for i in ids))
    return dict(zip(distinct_ids, token_strings(tokenizer, distinct_ids)))


# ------------------------------------------------------------------------------------------------------------
# encoding walk
# ------------------------------------------------------------------------------------------------------------


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
) -> EncodingWalk:
    """The encoding walk of every position (seed 000, sec. 2.2.2, Fig. 9; A.2) read against the token vectors.

    ``metric``: ``"dot"`` (the inner product of eq. 13) or ``"cosine"``.  ``norm``: ``"none"`` compares the raw
    captured vectors (the papers' reading); ``"final"`` applies the model's final norm first and reads through
    the model's head (the logit lens; see the module docstring for the matrix each reading uses).
    ``points``: ``None``/``"all"`` (every captured point), ``"residual"`` or glob patterns.
    ``k``: nearest tokens per cell; ``k=0`` and ``probs=False`` skip the top-k and the softmax passes (no
    ``top_ids`` columns; ``prob_of_*`` NaN): what a rank map needs costs little more than the products.
    ``chunk_rows``: rows read at once (at most 512; by default as many as a 128 MiB score block holds).
    For encoder-decoder models the encoder's walk is attached as ``.encoder``.
    ``screen``: provisional ranks from bfloat16 products (:func:`walklens.ranking.screen_ranks`, several times
    faster, not exact: what ``walklens serve`` paints first); needs ``k=0, probs=False``.
    """
    _check_choice("metric", metric, ("dot", "cosine"))
    _check_choice("norm", norm, ("none", "final"))
    _check_choice("against", against, ("auto", "embed", "unembed"))
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise InputError(f"k must be a non-negative integer, not {k!r}")
    if screen and (k or probs):
        raise InputError("screen=True gives provisional ranks only: use it with k=0, probs=False")
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
    if trace.encoder is not None:
        enc = trace.encoder
        if enc.lm is None:
            enc.lm = lm
        walk.encoder = _walk_stack(enc, lm, opts)
    walk.labels = labels_for(lm.tokenizer, walk.label_ids())  # the encoder's ids too: one decode, shared
    if walk.encoder is not None:
        walk.encoder.labels = walk.labels
    return walk


@dataclass(frozen=True)
class _Reading:
    """How an encoding walk reads its vectors: :func:`encoding_walk`'s options, the same for every stack."""

    k: int
    metric: str
    norm: str
    against: str
    points: Sequence[str] | str | None
    chunk_rows: int | None
    probs: bool
    progress: bool
    screen: bool = False


@dataclass(frozen=True)
class _Matrix:
    """The token matrix a walk reads against, float32 on the model's device: ``M`` [|V|, D], ``inv_m`` (1 / |m_i|),
    ``head`` (the model's own head, for the logit lens; None: scores are x·m_i), its ``bias``, the ``label``
    the result names the matrix by, and ``source``: the model's weight M was read from (what :func:`~walklens.kept.kept`
    keys the tensors derived from M by)."""

    M: torch.Tensor
    inv_m: torch.Tensor
    head: nn.Module | None
    bias: torch.Tensor | None
    label: str
    source: torch.Tensor

    @property
    def lens(self) -> bool:
        return self.head is not None


class _Columns:
    """A walk's per-row results (rows: point-major, points x tokens), filled chunk by chunk."""

    def __init__(self, rows: int, k: int, k_eff: int) -> None:
        self.k_eff = k_eff
        self.top_i = torch.empty(rows, k, dtype=torch.long)
        self.top_v = torch.empty(rows, k)
        self.ranks = torch.empty(2, rows, dtype=torch.long)
        self.probs = torch.full((2, rows), float("nan"))
        self.dots = torch.empty(2, rows)
        self.coss = torch.empty(2, rows)
        self.norms = torch.empty(rows)

    def store(self, r0: int, r1: int, got: Any, cos: torch.Tensor, has_nx: torch.Tensor) -> None:
        """One chunk's read (``got``: :class:`walklens.ranking.Rows` of the input and next tokens), with the
        cosines ``cos`` [rows, 2]; the last position has no next token (``has_nx`` False): NaN, rank -1."""
        nan = torch.tensor(float("nan"), device=cos.device)
        d_in, d_nx = got.dot[:, 0], got.dot[:, 1]
        self.top_v[r0:r1, : self.k_eff] = got.top_v.cpu()
        self.top_i[r0:r1, : self.k_eff] = got.top_i.cpu()
        self.ranks[0, r0:r1] = got.rank[:, 0].cpu()
        self.ranks[1, r0:r1] = torch.where(has_nx, got.rank[:, 1], -1).cpu()
        if got.lse is not None:  # softmax of the inner products (eq. 12)
            self.probs[0, r0:r1] = (d_in - got.lse).exp().cpu()
            self.probs[1, r0:r1] = torch.where(has_nx, (d_nx - got.lse).exp(), nan).cpu()
        self.dots[0, r0:r1], self.dots[1, r0:r1] = d_in.cpu(), torch.where(has_nx, d_nx, nan).cpu()
        self.coss[0, r0:r1], self.coss[1, r0:r1] = cos[:, 0].cpu(), torch.where(has_nx, cos[:, 1], nan).cpu()

    def finish(self) -> None:
        """Columns of the top k beyond the vocabulary: id -1, score NaN."""
        self.top_i[:, self.k_eff :] = -1
        self.top_v[:, self.k_eff :] = float("nan")


def _walk_stack(trace: Trace, lm: LoadedModel, opts: _Reading) -> EncodingWalk:
    """The encoding walk of one stack's trace: every (point, position) row read against the token matrix."""
    sel = _select_points(trace, opts.points)
    names = [trace.points[i] for i in sel]
    P, T, D = len(sel), len(trace.tokens), trace.d_model
    token_ids = trace.token_ids.reshape(-1).long().cpu()
    mat = _token_matrix(lm, opts.norm, opts.against, D)
    if int(token_ids.max()) >= mat.M.shape[0]:
        raise InputError(f"token id {int(token_ids.max())} is outside the matrix of {mat.M.shape[0]} rows")
    hidden = trace.hidden[sel] if sel != list(range(len(trace.points))) else trace.hidden
    final_rows = [j for j, n in enumerate(names) if n == "final"]
    cols = _read_all(lm, trace, mat, opts, hidden.reshape(P * T, D), final_rows)
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


def _token_matrix(lm: LoadedModel, norm: str, against: str, D: int) -> _Matrix:
    """The matrix of ``against`` (``auto``: V for the raw reading, the head for the logit lens; V when the model
    has no separate unembedding); the raw reading refuses a matrix whose width is not D (ALBERT's V)."""
    model, adapter = lm.model, lm.adapter
    which = ("embed" if norm == "none" else "unembed") if against == "auto" else against
    if which == "unembed" and not adapter.unembed:
        which = "embed"
    unembed = adapter.unembed or ""  # read only when which == "unembed", so never empty there
    head: nn.Module | None = None
    if norm == "final" and which == "unembed":
        head = get_module(model, unembed)
        source = _weight(head)
        label = f"W_U ({adapter.unembed}) through the model's head"
    else:
        source = adapter.embedding_matrix(model) if which == "embed" else _weight(get_module(model, unembed))
        label = "V" if which == "embed" else f"W_U ({adapter.unembed})"
        if source.shape[1] != D:
            raise InputError(
                f"{lm.name}: the {'token embedding matrix V' if which == 'embed' else 'unembedding'} has width "
                f"{source.shape[1]} but the captured vectors have D={D} (ALBERT keeps V in E-space); "
                f"use norm='final', which reads through the model's head"
            )
    M = source.detach().float().to(lm.device)
    bias = getattr(head, "bias", None) if head is not None else None
    return _Matrix(
        M=M,
        inv_m=kept(lm.model, f"{label} 1/|m_i|", source, lambda: 1.0 / M.norm(dim=-1).clamp_min(1e-12)),
        head=head,
        bias=bias.detach().float().to(lm.device) if bias is not None else None,
        label=label,
        source=source,
    )


def walk_chunk_rows(n_vocab: int, chunk_rows: int | None = None) -> int:
    """The rows :func:`encoding_walk` reads at once against ``n_vocab`` token rows: ``chunk_rows`` if given, else as
    many as a :data:`_CHUNK_BYTES` score block holds; at most :data:`_MAX_CHUNK_ROWS`."""
    chunk = chunk_rows if chunk_rows is not None else _CHUNK_BYTES // (4 * n_vocab)
    return max(1, min(int(chunk), _MAX_CHUNK_ROWS))


def _per_cell(walk: EncodingWalk) -> list[str]:
    """The names of a walk's fields with a value per cell (tensors [points, positions, ...]), its own type's too."""
    shape = (len(walk.points), len(walk.tokens))
    return [
        f.name
        for f in dataclasses.fields(walk)
        if isinstance(v := getattr(walk, f.name), torch.Tensor) and v.dim() >= 2 and tuple(v.shape[:2]) == shape
    ]


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


def point_aligned_chunks(rows_total: int, T: int, chunk: int) -> list[tuple[int, int]]:
    """The ``(start, stop)`` row spans a walk reads at once: whole points (``chunk // T`` of them) when a point's
    ``T`` rows fit a chunk, else each point's rows in chunks from its first row.  Every span starts at a point,
    so a walk over a run of points that is one span reads exactly that span's rows in one product (the
    explorer's pieces are bit for bit the one-shot walk's rows)."""
    if T <= chunk:
        step = (chunk // T) * T
        return [(r0, min(r0 + step, rows_total)) for r0 in range(0, rows_total, step)]
    return [(p0 + r0, p0 + min(r0 + chunk, T)) for p0 in range(0, rows_total, T) for r0 in range(0, T, chunk)]


def _read_all(
    lm: LoadedModel, trace: Trace, mat: _Matrix, opts: _Reading, flat: torch.Tensor, final_rows: list[int]
) -> _Columns:
    """Read the rows ``flat`` [points x tokens, D] chunk by chunk (at most :data:`_MAX_CHUNK_ROWS`; by default
    as many as a :data:`_CHUNK_BYTES` score block holds); ``final_rows``: the points already final-normed."""
    from tqdm.auto import tqdm

    T, n_vocab, rows_total = len(trace.tokens), mat.M.shape[0], flat.shape[0]
    token_ids = trace.token_ids.reshape(-1).long().cpu()
    nxt = torch.full((T,), -1, dtype=torch.long)  # the next token of each position
    nxt[:-1] = token_ids[1:]
    chunk = walk_chunk_rows(n_vocab, opts.chunk_rows)
    normf = final_norm_fn(lm, trace.stack) if opts.norm == "final" else None
    cols = _Columns(rows_total, opts.k, min(opts.k, n_vocab))
    buf = scratch(min(chunk, rows_total), n_vocab, cols.k_eff, lm.device)  # the tiles' products, chunk after chunk
    Mb = None  # the screen's bfloat16 rows (cosine: of unit norm)
    if opts.screen:
        Mb = kept(
            lm.model,
            f"{mat.label} bfloat16 {opts.metric}",
            mat.source,
            lambda: (mat.M * mat.inv_m[:, None] if opts.metric == "cosine" else mat.M).to(torch.bfloat16),
        )
    spans = point_aligned_chunks(rows_total, T, chunk)
    bar = tqdm(
        spans,
        desc=f"encoding walk{' ' + trace.stack if trace.stack else ''}",
        unit="chunk",
        disable=not opts.progress or len(spans) < 8,
        file=sys.stderr,
        leave=False,
    )
    plain_head: bool | None = None  # lens: decided on the first chunk
    wide = upcast(outside_layers(lm)) if is_low_precision(lm.dtype) else nullcontext()  # head in float32
    with torch.no_grad(), wide:
        for r0, r1 in bar:
            t_idx = torch.arange(r0, r1) % T
            x = flat[r0:r1].to(device=lm.device, dtype=torch.float32)
            cols.norms[r0:r1] = x.norm(dim=-1).cpu()
            if normf is not None:
                xn = normf(x)
                if final_rows:  # the final point is the final norm's output already: never normed twice
                    keep = torch.isin(torch.arange(r0, r1) // T, torch.tensor(final_rows)).to(lm.device)
                    xn = torch.where(keep[:, None], x, xn)
                x = xn
            ids = torch.stack([token_ids[t_idx], nxt[t_idx]], 1).to(lm.device)
            if Mb is not None and mat.lens and plain_head is None:  # decided on a few rows, not by a whole product
                plain_head = _is_plain_head(lm, mat, x[:_PROBE_ROWS])
            scorer, u, plain_head = _scorer(lm, mat, x, opts.metric, buf, plain_head)
            if Mb is not None and isinstance(scorer, Linear):
                got = _screened(scorer, mat, Mb, opts.metric, ids.clamp_min(0))
            else:
                got = read_rows(scorer, ids.clamp_min(0), cols.k_eff, lse=opts.probs)
            cols.store(r0, r1, got, _cosines(mat, u, got.dot, ids.clamp_min(0)), ids[:, 1] >= 0)
    cols.finish()
    return cols


def _screened(scorer: Linear, mat: _Matrix, Mb: torch.Tensor, metric: str, ids: torch.Tensor) -> Rows:
    """Provisional ranks of one chunk by :func:`walklens.ranking.screen_ranks` against ``Mb`` (the matrix's rows
    in bfloat16, divided by their norms for cosines), with the targets' float32 scores."""
    bias = mat.bias if mat.lens and metric == "dot" else None
    rank = screen_ranks(scorer.x, Mb, ids, bias)
    dot = torch.einsum("nd,njd->nj", scorer.x, mat.M[ids])  # the targets' float32 scores (a walk's dots)
    if scorer.bias is not None:
        dot += scorer.bias[ids]
    score = dot * mat.inv_m[ids] / scorer.x.norm(dim=-1, keepdim=True).clamp_min(1e-12) if metric == "cosine" else dot
    empty = torch.empty(ids.shape[0], 0, device=ids.device)
    return Rows(rank, dot, score, empty, empty.long(), None)


_PROBE_ROWS = 16  # rows a screen decides on whether the model's head is a plain linear map


def _head_scores(lm: LoadedModel, mat: _Matrix, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model's own head on ``x``: its logits (float32), its input u and its output y (hooked)."""
    store: dict[str, torch.Tensor] = {}
    assert mat.head is not None  # a lens reading keeps the model's head
    with Hooks() as hooks:  # the head's input and output while the model's own head runs
        hooks.pre(mat.head, lambda _m, args: store.__setitem__("u", args[0]))
        hooks.post(mat.head, lambda _m, _a, out: store.__setitem__("y", out))
        dot = lm.adapter.logits(lm.model, x).float()
    return dot, store["u"].float(), store["y"]


def _plain(mat: _Matrix, x: torch.Tensor, u: torch.Tensor, dot: torch.Tensor) -> bool:
    """Whether the head's logits ``dot`` of ``x`` (its input ``u``) are x·m_i (+ its bias), bit for bit."""
    return bool(
        u.shape == x.shape and torch.equal(u, x) and torch.equal(dot, torch.nn.functional.linear(x, mat.M, mat.bias))
    )


def _is_plain_head(lm: LoadedModel, mat: _Matrix, x: torch.Tensor) -> bool:
    """:func:`_plain` on a few rows ``x`` (the screen's decision: its ranks are provisional either way)."""
    dot, u, _ = _head_scores(lm, mat, x)
    return _plain(mat, x, u, dot)


def _scorer(
    lm: LoadedModel, mat: _Matrix, x: torch.Tensor, metric: str, buf: torch.Tensor, plain_head: bool | None
) -> tuple[Linear | Dense, torch.Tensor, bool | None]:
    """The scorer of one chunk ``x``, the vectors u its cosines are measured on, and whether the model's head is a
    plain linear map of x (decided on the first chunk of a lens reading; then scored tile by tile like x·m_i)."""
    if mat.lens and not plain_head:
        dot, u, y_out = _head_scores(lm, mat, x)
        if plain_head is None:  # first chunk: is the model's head a plain linear map of x?
            plain_head = _plain(mat, x, u, dot)
        scores = dot
        if metric == "cosine":
            y = y_out.float()  # may be the very tensor returned as logits: never modify in place
            if mat.bias is not None:
                y = y - mat.bias
            scores = (y * mat.inv_m).mul_(1.0 / u.norm(dim=-1, keepdim=True).clamp_min(1e-12))
        return Dense(dot, scores), u, plain_head
    # scores are x·m_i (+ the head's bias): computed tile by tile (walklens.ranking)
    return (
        Linear(x, mat.M, mat.bias if mat.lens else None, mat.inv_m if metric == "cosine" else None, buf),
        x,
        plain_head,
    )


def _cosines(mat: _Matrix, u: torch.Tensor, dot: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Cosines [rows, 2] of u with the rows of the input and next tokens ``ids`` [rows, 2]: from the inner
    products ``dot`` when u = x, else (the head's input differs from its logits: bias, scale, transform) on u."""
    inv_u = 1.0 / u.norm(dim=-1).clamp_min(1e-12)
    if mat.lens:
        return torch.stack([(u * mat.M[ids[:, j]]).sum(-1) * inv_u * mat.inv_m[ids[:, j]] for j in (0, 1)], 1)
    return torch.stack([dot[:, j] * inv_u * mat.inv_m[ids[:, j]] for j in (0, 1)], 1)


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


def similarity_map(
    trace: Trace, point: str = "embed", metric: Metric = "dot", normed: bool = False, *, lm: LoadedModel | None = None
) -> SimilarityMap:
    """The [tokens, tokens] similarity of the vectors at one point (seed 000, Figs. 3, 11, 12), as a
    :class:`~walklens.simmap.SimilarityMap` (a tensor that knows its tokens and shows itself in a notebook).

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


__all__ = ["EncodingWalk", "encoding_walk", "similarity_map"]
