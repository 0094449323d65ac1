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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from .baseline import item_result
from .compose import context_vectors
from .data import HellaswagItem
from .schemes import Scheme, similarity
from .segment import segment_context
from .store import ItemResult

if TYPE_CHECKING:
    from ..loading import LoadedModel


def test2_from_vectors(ctx: torch.Tensor, endings: torch.Tensor, scheme: Scheme) -> torch.Tensor:
    """Scores ``[C]`` of ending vectors ``[C, D]`` against context vectors ``[m, D]`` (see the module doc)."""
    if scheme.sim is None:
        raise ValueError("Test 2 needs sim")
    if scheme.ex == "soft_cluster":
        w = torch.softmax(endings @ ctx.T, dim=-1)  # [C, m]
        ctx_c = w @ ctx  # [C, D]
        return similarity(ctx_c[:, None, :], endings[:, None, :], scheme.sim)[:, 0, 0]
    return similarity(ctx, endings, scheme.sim).amax(dim=-1)


def test2_scores(lm: "LoadedModel", item: HellaswagItem, examples: Sequence[HellaswagItem],
                 scheme: Scheme) -> list[float]:
    segs = segment_context(item, examples, scheme.enc, lm)
    ctx, ends = context_vectors(lm, segs, scheme.layer, scheme.word, scheme.norm, scheme.seg, scheme.ex,
                                extra=list(item.endings), extra_layer=scheme.out_layer_eff,
                                extra_word=scheme.out_word_eff)
    assert ends is not None
    return [float(x) for x in test2_from_vectors(ctx, ends, scheme)]


def test2_item(lm: "LoadedModel", item: HellaswagItem, examples: Sequence[HellaswagItem],
               scheme: Scheme) -> ItemResult:
    return item_result(item, test2_scores(lm, item, examples, scheme), per_char=False)
