"""Reading rows of vectors against a token matrix, one vocabulary tile at a time: exact ranks by counting,
the top k, the log-sum-exp of the inner products (seed 000, eq. 12, sec. 2.2.2, A.2).  The kernel of
:func:`walklens.analyses.walks.encoding_walk`.

A chunk of rows is never scored against the whole vocabulary at once: each tile of :data:`TILE` token rows is
scored by one float32 matrix product and, while it is in cache, compared with each row's target scores (the
rank of a token is the number of tokens scoring strictly higher: a count, never a sort) and folded into the
running log-sum-exp (online: the sum is rescaled when the maximum grows).  A read with a top k scores whole
rows instead (one top k of a whole row costs a fraction of merging the top k's of 24 tiles) and still
compares a cache-sized slice at a time.  Passes a read does not ask for (``k=0``, ``lse=False``) are not made.

Exactness.  Every score is the float32 product the untiled computation makes (the same matrix product, one tile
of its columns; the same elementwise bias and cosine scaling).  A row's target scores are needed before its
tiles, so they are computed first by the same product on the gathered target rows; each tile checks that the
target it holds scores bit for bit what was assumed, and a row where it does not (a matrix kernel may sum in
another order for other shapes) is read again from its whole score row, so a token never outranks itself
and a count is never off by a rounding difference.  Counts are sums of 0/1 floats per slice (exact below
2**24) accumulated as integers.

Why float32 and not a bfloat16 (AMX) screen with float32 verification, measured on smollm2-135m: the rigorous
bound of a bfloat16 product's error, (2 * 2**-8 + 576 * 2**-24) |x| |m_i| from rounding x and m_i plus the
float32 sum (Cauchy-Schwarz; the largest error seen was a sixth of it), leaves a median of 1,500-3,900 tokens
per target and row within reach of the target's score at the layers of the raw reading (mean 3,100-4,200; read
normed: median 50-230, mean 1,100-1,500; 64 tokens of the grading prompt): the scores there are dense, so most of each
row would need float32 re-scoring by gathers, costlier
than the product it replaces.  A split precise enough (x and M as sums of bfloat16 parts: three products)
needs a float32 output, which torch's CPU kernels give only in oneDNN's bf16 "fpmath" mode, at ~130 G
multiply-adds/s against float32's ~60-75: no faster than float32 once tripled.

The bfloat16 products serve instead as a *screen* (:func:`screen_ranks`): provisional ranks, counted on bfloat16
scores, that ``walklens serve`` paints before the exact ones (about 3x faster per row here: the products are 8x
faster, the counting is not).  The counting itself runs :data:`ROW_BLOCK` rows at a time so that each comparison
block stays in cache (a fifth less time for the exact ranks than comparing a whole chunk at once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .vocab_blocks import RowBlocks, TokenRows

TILE = 2048  # token rows per tile: a [512, 2048] float32 tile (4 MiB) stays in cache for its passes
ROW_BLOCK = 64  # rows compared at once: a [64, j, 2048] comparison block stays in cache (2.5x faster than whole)
EXP_FLOOR = -80.0  # exp(-80) is a normal float: keeps the softmax pass off the slow denormal path


class Scorer(Protocol):
    """The scores of a chunk of rows: ``dot`` (inner products, eq. 12's logits) and ``score`` (by the metric)."""

    n_rows: int
    n_vocab: int

    def tile(self, v0: int, v1: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(dot, score) [rows, v1 - v0] for tokens v0..v1-1."""
        ...

    def at(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(dot, score) [rows, j] at token ids [rows, j], as :meth:`tile` computes them."""
        ...

    def whole(self, rows: torch.Tensor) -> Dense:
        """The whole score rows of some rows (a bool mask), for the rows read again."""
        ...


def tile_width(n_vocab: int, k: int) -> int:
    """Token rows a read scores per product: :data:`TILE`, or whole rows for a top k (see :func:`read_rows`)."""
    return min(TILE, n_vocab) if k == 0 else n_vocab


def scratch(rows: int, n_vocab: int, k: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """A flat float32 buffer for :class:`Linear`'s tiles of ``rows`` rows, to be reused chunk after chunk (a fresh
    tensor per tile would cost the memory system more than the comparisons do)."""
    return torch.empty(2 * rows * tile_width(n_vocab, k), device=device)


class Linear:
    """Scores of rows ``x`` [n, D] against matrix rows ``M`` [V, D]: dot = x·m_i (+ bias_i); score = dot, or the
    cosine x·m_i / (|x| |m_i|) (without the bias) when ``inv_m`` is given.  ``buf``: a :func:`scratch` buffer
    that tiles are written into (each tile's tensors are valid until the next tile).  ``M`` may be a
    :class:`~walklens.core.vocab_blocks.RowBlocks` (a model larger than memory): the same scores, bit for bit."""

    def __init__(
        self,
        x: torch.Tensor,
        M: TokenRows,
        bias: torch.Tensor | None = None,
        inv_m: torch.Tensor | None = None,
        buf: torch.Tensor | None = None,
    ) -> None:
        self.x, self.M, self.bias, self.inv_m, self.buf = x, M, bias, inv_m, buf
        self.inv_x = 1.0 / x.norm(dim=-1, keepdim=True).clamp_min(1e-12) if inv_m is not None else None
        self.n_rows, self.n_vocab = x.shape[0], M.shape[0]

    def _finish(
        self, raw: torch.Tensor, bias: torch.Tensor | None, inv_m: torch.Tensor | None, out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(dot, score) from the products ``raw`` (overwritten; ``out``: where the score goes)."""
        score = None
        if inv_m is not None:
            assert self.inv_x is not None  # set in __init__ whenever inv_m is (the cosine score)
            score = torch.mul(raw, inv_m, out=out).mul_(self.inv_x)
        dot = raw.add_(bias) if bias is not None else raw
        return dot, score if score is not None else dot

    def tile(self, v0: int, v1: int) -> tuple[torch.Tensor, torch.Tensor]:
        n, b = self.n_rows, v1 - v0
        buf = self.buf if self.buf is not None and self.buf.numel() >= 2 * n * b else None  # None: it does not fit
        into = buf[: n * b].view(n, b) if buf is not None else None
        if isinstance(self.M, RowBlocks):  # the matrix in float32 row blocks: one block converted at a time
            raw = self.M.mm(self.x, v0, v1, out=into)
        else:
            raw = torch.mm(self.x, self.M[v0:v1].t(), out=into)
        return self._finish(
            raw,
            None if self.bias is None else self.bias[v0:v1],
            None if self.inv_m is None else self.inv_m[v0:v1],
            buf[n * b : 2 * n * b].view(n, b) if buf is not None else None,
        )

    def at(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n, j = ids.shape
        flat = ids.reshape(-1)
        # one product with the gathered rows (the same kernel as a tile's), of which row r keeps its own columns
        diag = torch.arange(n, device=ids.device)
        raw = torch.mm(self.x, self.M[flat].t()).view(n, n, j)[diag, diag]
        return self._finish(
            raw, None if self.bias is None else self.bias[ids], None if self.inv_m is None else self.inv_m[ids]
        )

    def whole(self, rows: torch.Tensor) -> Dense:
        sub = Linear(self.x[rows], self.M, self.bias, self.inv_m)
        return Dense(*sub.tile(0, self.n_vocab))


class Dense:
    """Scores already computed whole ([n, V] each; e.g. by a model's own head): tiles are views of them."""

    def __init__(self, dot: torch.Tensor, score: torch.Tensor) -> None:
        self.dot, self.score = dot, score
        self.n_rows, self.n_vocab = dot.shape

    def tile(self, v0: int, v1: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.dot[:, v0:v1], self.score[:, v0:v1]

    def at(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.dot.gather(1, ids), self.score.gather(1, ids)

    def whole(self, rows: torch.Tensor) -> Dense:
        return Dense(self.dot[rows], self.score[rows])


@dataclass
class Rows:
    """What a read gives per row: ``rank`` [n, j] (tokens scoring strictly above each target), ``dot`` and
    ``score`` [n, j] at the targets, ``top_v``/``top_i`` [n, k] (best first), ``lse`` [n] (log-sum-exp of the
    inner products; None when not asked)."""

    rank: torch.Tensor
    dot: torch.Tensor
    score: torch.Tensor
    top_v: torch.Tensor
    top_i: torch.Tensor
    lse: torch.Tensor | None


def _count_above(counts: torch.Tensor, s: torch.Tensor, s_t: torch.Tensor, cmp: torch.Tensor) -> None:
    """``counts`` [n, j] += the number of scores ``s`` [n, c] strictly above each target score ``s_t`` [n, j], compared
    :data:`ROW_BLOCK` rows at a time (``cmp``: a float32 buffer of at least [ROW_BLOCK, j, c]); sums of 0/1 floats
    over at most 2**24 columns are exact."""
    n, c = s.shape
    for r0 in range(0, n, ROW_BLOCK):
        r1 = min(r0 + ROW_BLOCK, n)
        out = cmp[: r1 - r0, :, :c]
        counts[r0:r1] += torch.gt(s[r0:r1, None, :], s_t[r0:r1, :, None], out=out).sum(-1).long()


def read_rows(scorer: Scorer, ids: torch.Tensor, k: int = 0, lse: bool = False, tile: int | None = None) -> Rows:
    """Read every row of ``scorer`` against the whole vocabulary, tile by tile (see the module docstring).

    ``ids`` [n, j]: each row's target tokens (valid ids).  ``k``: how many nearest tokens (0: none).
    ``lse``: whether to compute the log-sum-exp of the inner products (for the probabilities of eq. 12).
    ``tile``: token rows scored per product; by default :data:`TILE`, or whole rows when ``k`` > 0 (a top k
    of whole rows costs a fraction of merging the tiles' top k's); the comparisons and the exponentials run
    over at most :data:`TILE` columns at a time either way.
    """
    n, V = scorer.n_rows, scorer.n_vocab
    j = ids.shape[1]
    tile = max(1, int(tile if tile is not None else tile_width(V, k)))
    dot_t, s_t = scorer.at(ids)
    dev = ids.device
    counts = torch.zeros(n, j, dtype=torch.long, device=dev)
    ok = torch.ones(n, j, dtype=torch.bool, device=dev)
    k_eff = min(k, V)
    tops_v: list[torch.Tensor] = []
    tops_i: list[torch.Tensor] = []
    m_run = torch.full((n,), float("-inf"), device=dev)
    acc = torch.zeros(n, device=dev)
    step = min(tile, TILE, V)
    cmp = torch.empty(min(n, ROW_BLOCK), j, step, device=dev)
    work = torch.empty(n, step, device=dev) if lse else torch.empty(0, device=dev)
    for v0 in range(0, V, tile):
        v1 = min(v0 + tile, V)
        dot, score = scorer.tile(v0, v1)
        here = (ids >= v0) & (ids < v1)
        if here.any():  # the targets in this tile must score what was assumed, bit for bit
            seen = score.gather(1, (ids - v0).clamp(0, v1 - v0 - 1))
            ok &= ~here | (seen == s_t)
        if k_eff:
            tv, ti = score.topk(min(k_eff, v1 - v0), dim=-1)
            tops_v.append(tv)
            tops_i.append(ti + v0)
        if lse:
            m_new = torch.maximum(m_run, dot.amax(-1))
            acc = acc * torch.exp(m_run - m_new)
            m_run = m_new
        for c0 in range(0, v1 - v0, step):  # comparisons and exponentials, a cache-sized slice at a time
            c1 = min(c0 + step, v1 - v0)
            _count_above(counts, score[:, c0:c1], s_t, cmp)
            if lse:
                e = torch.sub(dot[:, c0:c1], m_run[:, None], out=work[:, : c1 - c0])
                acc += e.clamp_(min=EXP_FLOOR).exp_().sum(-1)
    if k_eff:
        cand_v, cand_i = torch.cat(tops_v, 1), torch.cat(tops_i, 1)
        top_v, pick = cand_v.topk(k_eff, dim=-1) if len(tops_v) > 1 else (cand_v, None)
        top_i = cand_i.gather(1, pick) if pick is not None else cand_i
    else:
        top_v, top_i = torch.empty(n, 0, device=dev), torch.empty(n, 0, dtype=torch.long, device=dev)
    out = Rows(counts, dot_t, s_t, top_v, top_i, m_run + acc.log() if lse else None)
    bad = ~ok.all(1)
    if bad.any() and not isinstance(scorer, Dense):  # read these rows again from their whole score rows
        again = read_rows(scorer.whole(bad), ids[bad], k, lse, tile=V)
        for name in ("rank", "dot", "score", "top_v", "top_i"):
            getattr(out, name)[bad] = getattr(again, name)
        if out.lse is not None and again.lse is not None:
            out.lse[bad] = again.lse
    return out


SCREEN_TILE = 4096  # token rows per bfloat16 product of the screen (:func:`screen_ranks`)


def screen_ranks(
    x: torch.Tensor, Mb: torch.Tensor, ids: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Provisional ranks [n, j] of the targets ``ids`` [n, j] among the rows of ``Mb`` [V, D] (bfloat16), scored by
    bfloat16 products (AMX on CPUs that have it: ~8x the float32 product's speed here): what the explorer paints
    first, marked provisional, before :func:`read_rows`'s exact ranks replace it (seed 000, sec. 2.2.2).

    Not exact and not a bound: x and the token rows are rounded to bfloat16 (relative error 2**-8 each) and each
    product to bfloat16 again, so a score moves by up to about (3 * 2**-8) |x| |m_i| and a token that close to the
    target's score may be counted on the wrong side; the target is never counted against itself.  For cosine
    ranks pass the rows already divided by their norms (a row's own norm does not change its ranks); ``bias``
    (float32, [V]) is added to every score (the head's bias of the logit lens).
    """
    n, V = x.shape[0], Mb.shape[0]
    xb = x.to(torch.bfloat16)
    s_t = torch.einsum("nd,njd->nj", xb.float(), Mb[ids].float())  # the targets' scores from the rounded inputs
    if bias is not None:
        s_t += bias[ids]
    counts = torch.zeros(ids.shape, dtype=torch.long, device=x.device)
    w = min(SCREEN_TILE, V)
    prod = torch.empty(n, w, dtype=torch.bfloat16, device=x.device)
    wide = torch.empty(n, w, device=x.device)
    cmp = torch.empty(min(n, ROW_BLOCK), ids.shape[1], w, device=x.device)
    for v0 in range(0, V, w):
        v1 = min(v0 + w, V)
        b = v1 - v0
        torch.mm(xb, Mb[v0:v1].t(), out=prod[:, :b])
        s = wide[:, :b].copy_(prod[:, :b])  # float32 comparisons are faster than bfloat16 ones on CPU
        if bias is not None:
            s += bias[v0:v1]
        _count_above(counts, s, s_t, cmp)
        here = (ids >= v0) & (ids < v1)
        if here.any():  # the target's own rounded product may exceed s_t: never count it
            counts -= (here & (s.gather(1, (ids - v0).clamp(0, b - 1)) > s_t)).long()
    return counts


__all__ = [
    "Dense",
    "Linear",
    "Rows",
    "SCREEN_TILE",
    "Scorer",
    "TILE",
    "read_rows",
    "scratch",
    "screen_ranks",
    "tile_width",
]
