"""The sweep's vector bank (seed 000, A.6): every distinct segment text run once, reduced by every word
aggregation, optionally kept in the concept cache; NORM applied as rows are read.

The ``[T, D]`` hidden states of a text are reduced right away by every WORD_AGG_SCHEME into a
:class:`~..vectors.VectorBank` ``[texts, layers, words, D]`` (the hidden states themselves are dropped) by
:func:`~..vectors.text_vectors`, the one place every command computes segment vectors.  With a concept cache
(``--cache DIR``: a :class:`~walklens.analyses.concepts.cache.ConceptCache`, shared with Test 1 and compaction), every
(text, layer, word) vector is stored once and read back by later runs, also by runs that need a subset of the
layers and word aggregations.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import torch

from ....analyses.concepts.cache import ConceptCache, open_cache
from ....analyses.concepts.schemes import normalize
from ....analyses.concepts.vectors import VectorBank, forward_batch, layer_key, text_vectors

if TYPE_CHECKING:
    from ....core.backends import Workers
    from ....core.loading import LoadedModel

Tensor = torch.Tensor

#: The bank's shard as a sweep's workers run it: one batch of texts of equal token length through the model.
forward_shard = forward_batch


class NormedBank:
    """The bank after NORM, which follows word aggregation except ``word=last`` (a selection, not an
    aggregation; :mod:`..compose` does the same), indexed like ``bank.vectors`` (``[texts, layers, words, D]``).

    The rows asked for are normalised when they are read, so a sweep never holds a second copy of the whole
    bank (at 10,042 items the bank alone is ~9 GB).  NORM acts on each vector by itself, so a vector reads the
    same bits whichever other vectors are read with it (tested for every NORM: ``tests/test_sweep_eval.py``);
    :meth:`pairs` reads just some (layer, word) pairs of some rows.
    """

    def __init__(self, bank: VectorBank, norm: str | None) -> None:
        self.bank = bank
        self.norm = norm
        self.last = bank.word_pos("last") if "last" in bank.words else None

    @property
    def shape(self) -> torch.Size:
        return self.bank.vectors.shape

    def __getitem__(self, rows: Tensor | Sequence[int]) -> Tensor:
        x = self.bank.vectors[rows]
        if self.norm is None:
            return x
        out = normalize(x, self.norm)
        if self.last is not None:
            out[..., self.last, :] = x[..., self.last, :]
        return out

    def pairs(self, rows: Tensor, layers: Tensor, words: Tensor) -> Tensor:
        """``self[rows][:, layers, words]`` ``[rows, pairs, D]`` with one copy, normalising only those vectors."""
        x = self.bank.vectors[rows[:, None], layers[None, :], words[None, :]]
        if self.norm is None:
            return x
        out = normalize(x, self.norm)
        if self.last is not None and bool((keep := words == self.last).any()):
            out[:, keep] = x[:, keep]
        return out


def layer_keys(lm: LoadedModel, layers: Iterable[str]) -> dict[str, str]:
    """Scheme layer values (``E``, ``middle``, ``-1``, ...) → bank keys (``"E"`` or the hidden-state index)."""
    return {str(l): layer_key(lm, str(l)) for l in layers}


def build_bank(
    lm: LoadedModel,
    texts: Iterable[str],
    layers: Sequence[str],
    words: Sequence[str],
    *,
    cache: ConceptCache | str | os.PathLike[str] | None = None,
    progress: bool = True,
    workers: Workers | None = None,
    on_shard: Callable[[str, int], None] | None = None,
) -> VectorBank:
    """Run every distinct text once and reduce its hidden states by every word aggregation.

    ``layers``: bank keys (``"E"`` or a hidden-state index ``"0"``..``"N"``; hidden state ``l`` is the input of
    layer ``l`` and ``N`` the top of the stack after the final norm, A.6 ENCODING_LAYER).  Each text is
    tokenised and run exactly as the single-scheme runner does (:func:`~..vectors.text_vectors`).  With a
    ``cache`` (a :class:`~walklens.analyses.concepts.cache.ConceptCache`, or a folder to open one in for this call),
    vectors already stored are read back instead of computed, and those computed are stored
    (:mod:`walklens.analyses.concepts.cache`).  ``workers`` runs the forward batches (:func:`forward_shard`; default:
    this process), ``on_shard("forward", n)`` follows the n-th.
    """
    own = cache is not None and not isinstance(cache, ConceptCache)
    store = open_cache(cache)
    try:
        return text_vectors(
            lm,
            texts,
            layers,
            words,
            cache=store,
            progress=progress,
            workers=workers,
            on_batch=None if on_shard is None else lambda n: on_shard("forward", n),
        )
    finally:
        if own and store is not None:
            store.close()
