"""Comparing picks and rankings that float near-ties can decide, the same way on every CPU.

Two computations of the same scores (a batched product and a per-item loop, a chunked and a whole matrix
product, a KV-cached and a full forward) round differently, and the rounding depends on the CPU's kernels
(AVX2, AVX-512, NEON) and on the matrix shapes.  Where two candidates' scores are closer than that rounding,
which one wins the argmax is decided by the machine, not by the code under test.  So a test that compares
picks (or ranks, or top-k lists) checks them against *reference scores*: a pick must be the reference's best,
except where its reference score is within :data:`TIE_RTOL` of the best (a near-tie), and such tolerated
near-ties are counted and listed in any failure message.  A pick that differs with no near-tie fails.

``TIE_RTOL = 1e-4`` relative to the larger magnitude of the two scores compared: float32 has a 6e-8 unit
round-off, and a reduction over D = 32..576 products (summed in another order, or fused differently) moves a
score by up to ~1e-5 of its magnitude; 1e-4 leaves a margin while a genuine difference between two endings
or tokens of a real or random model is far larger.  ``TIE_ATOL = 1e-6`` covers scores near zero (cosines).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

TIE_RTOL = 1e-4
TIE_ATOL = 1e-6


def _np(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def near(a: Any, b: Any) -> np.ndarray:
    """Whether scores ``a`` and ``b`` are within the tie tolerance of each other (elementwise)."""
    a, b = _np(a), _np(b)
    return np.abs(a - b) <= TIE_RTOL * np.maximum(np.abs(a), np.abs(b)) + TIE_ATOL


def assert_scores_close(got: Any, ref: Any, what: str = "scores") -> None:
    """Two computations of the same scores agree within the tie tolerance."""
    np.testing.assert_allclose(_np(got), _np(ref), rtol=TIE_RTOL, atol=TIE_ATOL, err_msg=what)


def _fail(what: str, bad: list[str], ties: list[str]) -> None:
    if bad:
        raise AssertionError(
            f"{what}: {len(bad)} differ without a near-tie (tolerance {TIE_RTOL:g} rel): "
            f"{bad[:10]}; tolerated near-ties: {len(ties)} {ties[:10]}"
        )


def assert_topk_match(ids: Any, ref_scores: Any, what: str = "top-k") -> list[str]:
    """``ids[..., k]`` (best first) against ``ref_scores[..., V]``: the r-th id must be the reference's r-th
    best, or have a reference score within tolerance of the r-th best score.  Returns the tolerated
    near-ties (empty when every id is the reference's); raises with every real difference listed."""
    ids = np.asarray(_np(ids), dtype=np.int64)
    ref = _np(ref_scores)
    if ids.ndim == 1 and ref.ndim == 1:  # one top-k list over one score vector
        ids, ref = ids[None], ref[None]
    if ids.shape[:-1] != ref.shape[:-1]:
        raise AssertionError(f"{what}: ids {ids.shape} and scores {ref.shape} do not line up")
    k = ids.shape[-1]
    order = np.argsort(-ref, axis=-1, kind="stable")[..., :k]
    want = np.take_along_axis(ref, order, axis=-1)
    got = np.take_along_axis(ref, ids, axis=-1)
    diff = ids != order
    tie = near(got, want)
    bad, ties = [], []
    for pos in zip(*np.nonzero(diff)):
        msg = f"{tuple(int(p) for p in pos)}: {int(ids[pos])} ({got[pos]:.7g}) vs {int(order[pos])} ({want[pos]:.7g})"
        (ties if tie[pos] else bad).append(msg)
    _fail(what, bad, ties)
    return ties


def assert_picks_match(picks: Any, ref_scores: Any, what: str = "picks") -> list[str]:
    """``picks[...]`` (argmax, first on exact ties) against ``ref_scores[..., C]``: see
    :func:`assert_topk_match` with k = 1."""
    return assert_topk_match(np.asarray(_np(picks), dtype=np.int64)[..., None], ref_scores, what)


def assert_ranks_match(ranks: Any, ref_scores: Any, ids: Any, what: str = "ranks") -> list[str]:
    """``ranks[...]`` of tokens ``ids[...]`` (0 = best) against ``ref_scores[..., V]``: a rank may differ from
    the reference's (stable: earlier index first on exact ties) only by candidates whose reference score is
    within tolerance of the token's, i.e. it must lie in ``[#(clearly above), #(above or tied) ]``."""
    ranks = np.asarray(_np(ranks), dtype=np.int64)
    ref = _np(ref_scores)
    ids = np.asarray(_np(ids), dtype=np.int64)
    if ranks.ndim == 0:  # one token's rank over one score vector
        ranks, ids, ref = ranks[None], ids.reshape(1), ref.reshape(1, -1)
    s = np.take_along_axis(ref, ids[..., None], axis=-1)
    tied = near(ref, s)
    above = ref > s
    exact = above.sum(-1) + ((ref == s) & (np.arange(ref.shape[-1]) < ids[..., None])).sum(-1)
    lo = (above & ~tied).sum(-1)
    hi = (above | tied).sum(-1) - 1  # the token itself is tied with itself
    bad, ties = [], []
    for pos in zip(*np.nonzero(ranks != exact)):
        msg = f"{tuple(int(p) for p in pos)}: rank {int(ranks[pos])} vs {int(exact[pos])}"
        (ties if lo[pos] <= ranks[pos] <= hi[pos] else bad).append(msg)
    _fail(what, bad, ties)
    return ties


def assert_same_picks(
    a: Any, b: Any, ref_scores: Callable[[tuple[int, ...]], Sequence[float]], what: str = "picks"
) -> list[str]:
    """Two pick arrays of the same shape with no scores of their own: equal, except where both picks have
    reference scores (``ref_scores(position)``, computed only for the differing positions) within tolerance
    of the reference's best."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise AssertionError(f"{what}: shapes {a.shape} and {b.shape}")
    bad, ties = [], []
    for pos in zip(*np.nonzero(a != b)):
        pos = tuple(int(p) for p in pos)
        ref = _np(ref_scores(pos))
        best = ref.max()
        msg = f"{pos}: {int(a[pos])} ({ref[a[pos]]:.7g}) vs {int(b[pos])} ({ref[b[pos]]:.7g}), best {best:.7g}"
        (ties if near(ref[a[pos]], best) and near(ref[b[pos]], best) else bad).append(msg)
    _fail(what, bad, ties)
    return ties
