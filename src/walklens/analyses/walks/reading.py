"""How an encoding walk reads its rows against the token matrix (eq. 12, A.2): the matrix (V, W_U, or the model's
own head for the logit lens), the model's final norm, and the rows read chunk by chunk by :mod:`walklens.core.ranking`
(exact rank counts, top k, log-sum-exp; with ``screen=True`` the bfloat16 screen's provisional ranks).  See
:mod:`walklens.analyses.walks` for the matrix each reading compares with, and for the precision of the reading."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ...base.errors import InputError
from ...base.hooks import Hooks
from ...base.precision import is_low_precision
from ...core.interventions import outside_layers, upcast
from ...core.kept import kept
from ...core.ranking import Dense, Linear, Rows, read_rows, scratch, screen_ranks
from ...core.tracedir import PointStack
from ...core.vocab_blocks import RowBlocks, TokenRows, largest_block
from ...models.base import get_module

if TYPE_CHECKING:
    from ...core.loading import LoadedModel
    from ...core.trace import Trace

_CHUNK_BYTES = 128 << 20  # a whole [rows, |V|] float32 score block (read with k > 0, or through a model's head)
_MAX_CHUNK_ROWS = 512  # rows read at once (walklens.core.ranking: a chunk's target scores cost rows**2 products)


def _weight(module: nn.Module) -> torch.Tensor:
    """A linear map's or an embedding's ``weight``."""
    w = module.weight
    assert isinstance(w, torch.Tensor)
    return w


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
    the result names the matrix by, and ``source``: the model's weight M was read from (what
    :func:`~walklens.core.kept.kept`
    keys the tensors derived from M by)."""

    M: TokenRows
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
        """One chunk's read (``got``: :class:`walklens.core.ranking.Rows` of the input and next tokens), with the
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


def _token_matrix(lm: LoadedModel, norm: str, against: str, D: int, blocked: bool = False) -> _Matrix:
    """The matrix of ``against`` (``auto``: V for the raw reading, the head for the logit lens; V when the model
    has no separate unembedding); the raw reading refuses a matrix whose width is not D (ALBERT's V).  ``blocked``
    (or a streamed model): M read in float32 row blocks (:class:`~walklens.core.vocab_blocks.RowBlocks`)."""
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
    M: TokenRows
    if blocked or lm.stream is not None:
        M = blocks = RowBlocks(source, lm.device)
        inv_m = kept(lm.model, f"{label} 1/|m_i|", source, lambda: blocks.per_block(lambda b, _0, _1: _inv_norms(b)))
    else:
        M = source.detach().float().to(lm.device)
        inv_m = kept(lm.model, f"{label} 1/|m_i|", source, lambda: _inv_norms(M))
    bias = getattr(head, "bias", None) if head is not None else None
    return _Matrix(
        M=M,
        inv_m=inv_m,
        head=head,
        bias=bias.detach().float().to(lm.device) if bias is not None else None,
        label=label,
        source=source,
    )


def _inv_norms(M: torch.Tensor) -> torch.Tensor:
    """1 / |m_i| of each row of ``M`` (a row's norm is a reduction over that row alone: blocks give the same)."""
    return 1.0 / M.norm(dim=-1).clamp_min(1e-12)


def walk_chunk_rows(n_vocab: int, chunk_rows: int | None = None) -> int:
    """The rows :func:`encoding_walk` reads at once against ``n_vocab`` token rows: ``chunk_rows`` if given, else as
    many as a :data:`_CHUNK_BYTES` score block holds; at most :data:`_MAX_CHUNK_ROWS`."""
    chunk = chunk_rows if chunk_rows is not None else _CHUNK_BYTES // (4 * n_vocab)
    return max(1, min(int(chunk), _MAX_CHUNK_ROWS))


def walk_matrix_bytes(lm: LoadedModel) -> int:
    """The bytes of float32 token rows an encoding walk of ``lm`` holds besides its scores: for a streamed model
    the largest row block (:class:`~walklens.core.vocab_blocks.RowBlocks`); in memory, in a dtype other than float32,
    the float32 copy of the matrix and of each vocabulary-sized tensor held in float32 while it reads (the embedding,
    the head: :func:`_widened`), none in float32 (it reads the model's own); and each row's inverse norm."""
    V, W = lm.embedding_matrix().shape
    if lm.stream is not None:
        return (largest_block(V, W) * W + V) * 4
    if not is_low_precision(lm.dtype):
        return V * 4
    wide = sum(t.numel() for t in {id(t): t for t in outside_layers(lm)}.values() if t.dim() and t.shape[0] == V)
    return (V * W + wide + V) * 4


def point_aligned_chunks(rows_total: int, T: int, chunk: int) -> list[tuple[int, int]]:
    """The ``(start, stop)`` row spans a walk reads at once: whole points (``chunk // T`` of them) when a point's
    ``T`` rows fit a chunk, else each point's rows in chunks from its first row.  Every span starts at a point,
    so a walk over a run of points that is one span reads exactly that span's rows in one product (the
    explorer's pieces are bit for bit the one-shot walk's rows)."""
    if T <= chunk:
        step = (chunk // T) * T
        return [(r0, min(r0 + step, rows_total)) for r0 in range(0, rows_total, step)]
    return [(p0 + r0, p0 + min(r0 + chunk, T)) for p0 in range(0, rows_total, T) for r0 in range(0, T, chunk)]


#: the rows r0 .. r1 - 1 of a walk's points, [rows, D] (:func:`point_rows`)
RowReader = Callable[[int, int], torch.Tensor]


def point_rows(hidden: torch.Tensor, sel: list[int], T: int) -> RowReader:
    """The rows ``r0 .. r1 - 1`` of the points ``sel`` of ``hidden`` (point-major, ``T`` rows a point): views of an
    in-memory trace's tensor, or, for an opened trace (:class:`~walklens.core.tracedir.PointStack`), read from its
    shards point by point, so that a walk holds no more than the points of one chunk.  Read rows are placed at the
    alignment the in-memory rows have (a product's kernel may sum in another order at another address), so both
    walks are the same bit for bit."""
    if isinstance(hidden, PointStack):
        stack = hidden

        def read(r0: int, r1: int) -> torch.Tensor:
            parts = [
                stack.rows(sel[j], max(r0 - j * T, 0), min(r1 - j * T, T)) for j in range(r0 // T, (r1 + T - 1) // T)
            ]
            x = parts[0] if len(parts) == 1 else torch.cat(parts)
            shift = r0 * x.shape[-1] * x.element_size() % 64  # where row r0 lies in a 64-byte aligned tensor
            if x.data_ptr() % 64 == shift:
                return x
            n = x.numel() * x.element_size()
            placed = torch.empty(n + 64, dtype=torch.uint8)[shift : shift + n].view(x.dtype).view(x.shape)
            return placed.copy_(x)

        return read
    picked = hidden[sel] if sel != list(range(hidden.shape[0])) else hidden
    flat = picked.reshape(len(sel) * T, -1)
    return lambda r0, r1: flat[r0:r1]


def _read_all(
    lm: LoadedModel, trace: Trace, mat: _Matrix, opts: _Reading, rows: RowReader, rows_total: int, final_rows: list[int]
) -> _Columns:
    """Read the rows ``rows(r0, r1)`` of ``rows_total`` [points x tokens, D] chunk by chunk (at most
    :data:`_MAX_CHUNK_ROWS`; by default as many as a :data:`_CHUNK_BYTES` score block holds); ``final_rows``: the
    points already final-normed."""
    from tqdm.auto import tqdm

    T, n_vocab = len(trace.tokens), mat.M.shape[0]
    token_ids = trace.token_ids.reshape(-1).long().cpu()
    nxt = torch.full((T,), -1, dtype=torch.long)  # the next token of each position
    nxt[:-1] = token_ids[1:]
    chunk = walk_chunk_rows(n_vocab, opts.chunk_rows)
    normf = final_norm_fn(lm, trace.stack) if opts.norm == "final" else None
    cols = _Columns(rows_total, opts.k, min(opts.k, n_vocab))
    buf = scratch(min(chunk, rows_total), n_vocab, cols.k_eff, lm.device)  # the tiles' products, chunk after chunk
    Mb = None  # the screen's bfloat16 rows (cosine: of unit norm)
    if opts.screen:
        Mb = kept(lm.model, f"{mat.label} bfloat16 {opts.metric}", mat.source, lambda: _screen_rows(mat, opts.metric))
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
    wide = upcast(_widened(lm, mat)) if is_low_precision(lm.dtype) else nullcontext()  # head in float32
    with torch.no_grad(), wide:
        for r0, r1 in bar:
            t_idx = torch.arange(r0, r1) % T
            x = rows(r0, r1).to(device=lm.device, dtype=torch.float32)
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


def _screen_rows(mat: _Matrix, metric: str) -> torch.Tensor:
    """The screen's bfloat16 rows of the matrix (cosine: divided by their norms), block by block if blocked."""
    if isinstance(mat.M, RowBlocks):
        scale = metric == "cosine"
        return mat.M.per_block(lambda b, b0, b1: (b * mat.inv_m[b0:b1, None] if scale else b).to(torch.bfloat16))
    return (mat.M * mat.inv_m[:, None] if metric == "cosine" else mat.M).to(torch.bfloat16)


def _widened(lm: LoadedModel, mat: _Matrix) -> list[torch.Tensor]:
    """The tensors outside the layers held in float32 while a walk reads (the final norm, the head): all of them,
    but the vocabulary-sized ones when M is read in blocks (the head then gets its float32 rows block by block)."""
    tensors = outside_layers(lm)
    if not isinstance(mat.M, RowBlocks):
        return tensors
    return [t for t in tensors if t.dim() == 0 or t.shape[0] != mat.M.shape[0]]


def _screened(scorer: Linear, mat: _Matrix, Mb: torch.Tensor, metric: str, ids: torch.Tensor) -> Rows:
    """Provisional ranks of one chunk by :func:`walklens.core.ranking.screen_ranks` against ``Mb`` (the matrix's rows
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
    if isinstance(mat.M, RowBlocks):
        return _head_scores_blocked(lm, mat, x)
    store: dict[str, torch.Tensor] = {}
    assert mat.head is not None  # a lens reading keeps the model's head
    with Hooks() as hooks:  # the head's input and output while the model's own head runs
        hooks.pre(mat.head, lambda _m, args: store.__setitem__("u", args[0]))
        hooks.post(mat.head, lambda _m, _a, out: store.__setitem__("y", out))
        dot = lm.adapter.logits(lm.model, x).float()
    return dot, store["u"].float(), store["y"]


def _head_scores_blocked(
    lm: LoadedModel, mat: _Matrix, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_head_scores` with the head's weight (and bias) swapped for its float32 rows one block at a time:
    each block's logits are those columns of the whole head's (a head whose last step is its linear map, then
    elementwise: a softcap, a scale), so the float32 head is never whole in memory."""
    assert mat.head is not None and isinstance(mat.M, RowBlocks)
    w, b = mat.head.weight, getattr(mat.head, "bias", None)
    assert isinstance(w, torch.Tensor)
    saved = (w.data, b.data if isinstance(b, torch.Tensor) else None)
    dot = y = u = None
    store: dict[str, torch.Tensor] = {}
    try:
        for b0, b1 in mat.M.blocks():
            w.data = mat.M[b0:b1]
            if isinstance(b, torch.Tensor) and mat.bias is not None:
                b.data = mat.bias[b0:b1]
            with Hooks() as hooks:
                hooks.pre(mat.head, lambda _m, args: store.__setitem__("u", args[0]))
                hooks.post(mat.head, lambda _m, _a, out: store.__setitem__("y", out))
                part = lm.adapter.logits(lm.model, x).float()
            if dot is None or y is None:
                whole = (*part.shape[:-1], mat.M.shape[0])
                dot, y = part.new_empty(whole), part.new_empty(whole)
                u = store["u"].float()
            dot[..., b0:b1], y[..., b0:b1] = part, store["y"]
    finally:
        w.data = saved[0]
        if isinstance(b, torch.Tensor) and saved[1] is not None:
            b.data = saved[1]
    assert dot is not None and y is not None and u is not None
    return dot, u, y


def _plain(mat: _Matrix, x: torch.Tensor, u: torch.Tensor, dot: torch.Tensor) -> bool:
    """Whether the head's logits ``dot`` of ``x`` (its input ``u``) are x·m_i (+ its bias), bit for bit."""
    if not (u.shape == x.shape and torch.equal(u, x)):
        return False
    if isinstance(mat.M, RowBlocks):
        return torch.equal(dot, mat.M.linear(x, mat.bias))
    return torch.equal(dot, torch.nn.functional.linear(x, mat.M, mat.bias))


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
    # scores are x·m_i (+ the head's bias): computed tile by tile (walklens.core.ranking)
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
