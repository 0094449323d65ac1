"""Test 2, concept similarity (seed 000, sec. 5.1.2): "We embed the Hellaswag context into a single vector
using the pyramidal aggregation scheme described earlier and do the same for each choice sequence (considered
as exactly one segment).  Then we compare the context and completions [...] and pick the winning choice."

Per item and scheme: the context becomes one vector or a sequence ``k_1..k_m`` (:mod:`.compose`); each ending
(its text without the leading space, one segment, as in the seed's code) becomes one vector at
``out_layer``/``out_word`` followed by NORM (not after ``last``).  The score of ending c is
``max_j sim(k_j, e_c)`` ("each vector of the sequence is compared with the choice vector and the best match
is used"); with ``ex=soft_cluster`` the context is first averaged with weights ``softmax_j(k_j · e_c)``, a
different context vector per ending, and the score is ``sim(k̄_c, e_c)``.  A similarity has no per-character
form, so ``acc_norm`` picks the same ending as ``acc``.

One scorer serves the single-scheme runner and the sweep: :func:`batched_scores` scores many items, many
context compositions and many choice encodings at once (one ``bmm``); :func:`test2_from_vectors` is the
one-item, one-scheme case of it.  Two endings with bit-identical vectors get bit-identical scores
(:func:`tie_identical`), so a tie goes to the first ending however the product was batched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ...analyses.concepts.compose import context_vectors
from ...analyses.concepts.schemes import Scheme
from ...base.errors import InputError
from ..hellaswag.baseline import item_result
from ..hellaswag.data import HellaswagItem
from ..hellaswag.store import ItemResult
from .segment import segment_context

if TYPE_CHECKING:
    from ...core.loading import LoadedModel
    from .controls import Control


def identical_choices(choices: torch.Tensor, cv_dim: int) -> list[tuple[int, int, torch.Tensor]]:
    """Which choice vectors ``choices`` (on ``cv_dim``, ``D`` last) are bitwise copies of earlier ones: for each
    choice c equal somewhere to an earlier one, ``(c, c0, same)`` with c0 the first such and ``same`` where."""
    cv = choices.movedim(cv_dim, -2)  # [..., C, D]
    ties = []
    for c in range(1, cv.shape[-2]):
        for c0 in range(c):
            same = (cv[..., c, :] == cv[..., c0, :]).all(-1)  # [...]
            if bool(same.any()):
                ties.append((c, c0, same))
                break
    return ties


def tie_identical(
    score: torch.Tensor,
    choices: torch.Tensor,
    c_dim: int,
    cv_dim: int,
    ties: list[tuple[int, int, torch.Tensor]] | None = None,
) -> torch.Tensor:
    """Give bitwise-identical choice vectors bitwise-identical scores (the first one's).

    Two endings can have the very same vector (e.g. ``out_layer=E, out_word=last`` and both end in ``.``); a
    batched product may round their scores differently, and the first must win the argmax.  ``score`` has the
    choices on ``c_dim``; ``choices`` holds their vectors on ``cv_dim`` (``D`` last), its other dims
    broadcastable to ``score``'s once both choice dims are moved last.  ``ties``: their
    :func:`identical_choices`, where calls that share the choices compute it once.
    """
    sc = score.movedim(c_dim, -1).clone()
    for c, c0, same in identical_choices(choices, cv_dim) if ties is None else ties:
        sc[..., c] = torch.where(same, sc[..., c0], sc[..., c])
    return sc.movedim(-1, c_dim)


def choice_ties(choices: torch.Tensor) -> list[tuple[int, int, torch.Tensor]]:
    """The ``ties`` of :func:`batched_scores`'s ``choices`` ``[n, C, Q, D]``, for calls that share them."""
    return identical_choices(choices.unsqueeze(1), 2)


#: ``|k̄_c|`` is recomputed from ``k̄_c`` itself where it is shorter than 1/CANCEL of ``sum_j w_j |k_j|``
CANCEL = 8.0
#: (item, composition, ending, choice encoding) entries recomputed at a time (bounds the memory of ``k̄_c``)
_REFORM = 2048


def _cluster_norms(seq: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``|k̄_c|`` ``[n, P, C, Q]`` of the soft clusters ``k̄_c = sum_j w_j k_j`` (``seq`` ``[n, m, P, D]``,
    weights ``w`` ``[n, m, P, C, Q]``, zero on padding) without forming every ``k̄_c``: ``|k̄_c|^2 = w^T G w``
    with the Gram matrix ``G = K K^T``.

    That sum cancels where the weighted average is short against its terms (``|k̄_c|`` much less than
    ``sum_j w_j |k_j|``), losing float digits as the square of that ratio, while forming ``k̄_c`` loses them
    only linearly.  Those few entries (ratio above :data:`CANCEL`) are recomputed from ``k̄_c`` itself, so the
    score is as accurate as the per-item form's.
    """
    gram = torch.einsum("nmpd,nkpd->npmk", seq, seq)  # [n, P, m, m]
    sq = torch.einsum("nmpcq,npmk,nkpcq->npcq", w, gram, w).clamp_min(0.0)
    reach = torch.einsum("nmpcq,nmp->npcq", w, seq.norm(dim=-1))  # sum_j w_j |k_j| >= |k̄_c|
    bad = (sq * CANCEL**2 < reach.square()).nonzero()  # [B, 4]: (n, p, c, q)
    for a in range(0, len(bad), _REFORM):
        i, p, c, q = bad[a : a + _REFORM].unbind(1)
        kbar = (w[i, :, p, c, q][..., None] * seq[i, :, p]).sum(1)  # [b, D]
        sq[i, p, c, q] = kbar.square().sum(-1)
    return sq.sqrt().clamp_min(1e-12)


def batched_scores(
    seq: torch.Tensor,
    mask: torch.Tensor,
    choices: torch.Tensor,
    sim: str | None,
    soft_cluster: bool,
    ties: list[tuple[int, int, torch.Tensor]] | None = None,
) -> torch.Tensor:
    """Test 2 scores ``[n, P, C, Q]`` of ``n`` items: context sequences ``seq`` ``[n, m, P, D]`` (``P``
    compositions of each item's context; ``mask`` ``[n, m]`` marks the real positions) against choice vectors
    ``choices`` ``[n, C, Q, D]`` (``C`` endings, ``Q`` choice encodings).

    Every context vector meets every choice vector in one batched matrix product ``[n, m*P, C*Q]``.  The score
    is the best match over the real positions, ``max_j sim(k_j, e_c)``; with ``soft_cluster`` it is
    ``sim(k̄_c, e_c)`` with ``k̄_c = sum_j w_j k_j``, ``w = softmax_j(k_j · e_c)`` over the real positions,
    computed without forming ``k̄_c``: ``k̄_c · e_c = sum_j w_j (k_j · e_c)`` and, for cosine,
    ``|k̄_c|^2 = w^T G w`` with the Gram matrix ``G = K K^T`` (:func:`_cluster_norms`).  ``sim``: ``dot`` or
    ``cosine`` (A.6).  ``ties``: :func:`choice_ties` of ``choices`` where calls share them.
    """
    if sim not in ("dot", "cosine"):
        raise InputError(f"invalid similarity {sim!r}; use dot or cosine")
    n, m, P, D = seq.shape
    C, Q = choices.shape[1], choices.shape[2]
    ch = choices
    if sim == "cosine" and not soft_cluster:
        seq = torch.nn.functional.normalize(seq, p=2, dim=-1)
        ch = torch.nn.functional.normalize(ch, p=2, dim=-1)
    dots = torch.bmm(seq.reshape(n, m * P, D), ch.reshape(n, C * Q, D).transpose(1, 2)).reshape(n, m, P, C, Q)
    pad = ~mask[:, :, None, None, None]
    if soft_cluster:
        w = torch.softmax(dots.masked_fill(pad, float("-inf")), dim=1)  # weights over the sequence
        score = (w * dots.masked_fill(pad, 0.0)).sum(1)  # k̄_c · e_c  [n, P, C, Q]
        if sim == "cosine":
            norm = _cluster_norms(seq, w) * ch.norm(dim=-1).clamp_min(1e-12)[:, None]
            score = score / norm
    else:
        score = dots.masked_fill(pad, torch.finfo(dots.dtype).min).amax(1)  # best match [n, P, C, Q]
    return tie_identical(score, choices.unsqueeze(1), 2, 2, ties)  # choices [n, 1, C, Q, D] broadcast over P


def test2_from_vectors(ctx: torch.Tensor, endings: torch.Tensor, scheme: Scheme) -> torch.Tensor:
    """Scores ``[C]`` of ending vectors ``[C, D]`` against context vectors ``[m, D]`` (see the module doc):
    :func:`batched_scores` of one item, one composition and one choice encoding."""
    if scheme.sim is None:
        raise ValueError("Test 2 needs sim")
    mask = torch.ones(1, ctx.shape[0], dtype=torch.bool, device=ctx.device)
    return batched_scores(
        ctx[None, :, None, :], mask, endings[None, :, None, :], scheme.sim, scheme.ex == "soft_cluster"
    )[0, 0, :, 0]


def test2_scores(
    lm: LoadedModel,
    item: HellaswagItem,
    examples: Sequence[HellaswagItem],
    scheme: Scheme,
    control: Control | None = None,
) -> list[float]:
    """The four endings' scores against the context's concept vectors (a ``control``'s, :mod:`.controls`)."""
    src, src_examples = (item, examples) if control is None else control.context(item, examples)
    segs = segment_context(src, src_examples, scheme.enc, lm)
    ctx, ends = context_vectors(lm, segs, scheme, extra=list(item.endings))
    assert ends is not None
    if control is not None:
        ctx = control.vectors(item, ctx)
    return [float(x) for x in test2_from_vectors(ctx, ends, scheme)]


def test2_item(
    lm: LoadedModel,
    item: HellaswagItem,
    examples: Sequence[HellaswagItem],
    scheme: Scheme,
    control: Control | None = None,
) -> ItemResult:
    return item_result(item, test2_scores(lm, item, examples, scheme, control), per_char=False)
