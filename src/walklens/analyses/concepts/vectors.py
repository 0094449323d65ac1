"""Word-aggregated vectors of segment texts (seed 000, A.6: ENCODING_LAYER, WORD_AGG_SCHEME), computed one way
for every command and kept in the concept cache (:mod:`walklens.analyses.concepts.cache`, footnote 11).

Each distinct text is tokenised on its own (:func:`~walklens.core.scoring.encode.segment_token_ids`; a BOS prefix
conditions the
segment but is left out of the aggregation) and run through the model in a batch of texts of the same token
length, so no padding enters any number; its ``[T, D]`` hidden states at each layer are reduced right away by
each word aggregation (before NORM) into a :class:`VectorBank` ``[texts, layers, words, D]``.

With a cache, texts whose every (layer, word) vector is stored are read back; the others are computed as above
(in the same batches a run without the cache would form for them) and stored.  So a run with a cold cache and a
run without one compute the very same batches and give bit-identical vectors, and a warm run reads back exactly
those bits.  (A text computed in another batch, e.g. by another command, can differ from them in float
rounding: batched matrix products are not batch-size invariant on every BLAS; see docs/compaction.md.)
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from ...core.scoring.encode import hidden_states, n_prefix_tokens, segment_token_ids
from .cache import ConceptCache, model_space
from .schemes import normalize, resolve_layer, word_aggregate

if TYPE_CHECKING:
    from ...core.backends import Workers
    from ...core.loading import LoadedModel

Tensor = torch.Tensor
#: Tokens per forward batch of equal-length texts at most (one text at least).
BATCH_TOKENS = 2048


@dataclass
class VectorBank:
    """Word-aggregated vectors ``vectors[text, layer, word, D]`` (before NORM) of every distinct text.

    ``layers`` are resolved layer keys (``"E"`` or a hidden-state index 0..N, A.6), ``words`` the
    WORD_AGG_SCHEME names, ``index`` maps a text to its row; ``computed`` counts the texts that went through
    the model in the call that built the bank (the rest came from the cache).
    """

    layers: tuple[str, ...]
    words: tuple[str, ...]
    index: dict[str, int]
    vectors: Tensor
    computed: int = field(default=0)

    def layer_alias(self) -> list[int]:
        """For each bank layer, the first layer whose vectors are bit-identical to it (itself if none): e.g.
        ``E`` and hidden state ``0`` coincide in models without absolute position embeddings."""
        out: list[int] = []
        for i in range(len(self.layers)):
            same = (j for j in range(i) if out[j] == j and torch.equal(self.vectors[:, i], self.vectors[:, j]))
            out.append(next(same, i))
        return out

    def rows(self, texts: Sequence[str]) -> list[int]:
        """The bank rows of ``texts``."""
        return [self.index[t] for t in texts]

    def layer_pos(self, key: str) -> int:
        return self.layers.index(key)

    def word_pos(self, word: str) -> int:
        return self.words.index(word)


def layer_key(lm: LoadedModel, layer: str) -> str:
    """A scheme layer value (``E``, ``middle``, ``-1``, ...) as a bank key: ``"E"`` or the hidden-state index."""
    r = resolve_layer(str(layer), lm.n_layers)
    return "E" if r is None else str(r)


def _length_batches(ids: dict[int, list[int]], batch_tokens: int) -> list[list[int]]:
    """Texts of equal token length in batches of at most ``batch_tokens`` tokens (at least one text each)."""
    by_len: dict[int, list[int]] = {}
    for i, seq in ids.items():
        by_len.setdefault(len(seq), []).append(i)
    batches: list[list[int]] = []
    for n, members in sorted(by_len.items()):
        per = max(1, batch_tokens // n)
        batches += [members[j : j + per] for j in range(0, len(members), per)]
    return batches


def forward_batch(lm: LoadedModel, ctx: tuple[Sequence[str], Sequence[str]], seqs: Sequence[Sequence[int]]) -> Tensor:
    """One batch of token-id sequences of equal length through the model: ``[B, L, W, D]`` float32 on the CPU,
    the hidden states at the bank-key layers ``ctx[0]`` reduced by each word aggregation ``ctx[1]`` (the BOS
    prefix left out).  A pure function of the model and its arguments (a shard a sweep's workers run)."""
    layers, words = ctx
    act = lm.adapter.mlp_activation(lm.model) if any("relu" in w for w in words) else None
    skip = n_prefix_tokens(lm)
    resolved = [None if k == "E" else int(k) for k in layers]
    hs, _mask = hidden_states(lm, seqs, resolved)
    stack = torch.stack([hs[r][:, skip:] for r in resolved], dim=1)  # [B, L, T, D]
    return torch.stack([word_aggregate(stack, w, act).float().cpu() for w in words], dim=2)


def text_vectors(
    lm: LoadedModel,
    texts: Iterable[str],
    layers: Sequence[str],
    words: Sequence[str],
    *,
    cache: ConceptCache | None = None,
    progress: bool = False,
    workers: Workers | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> VectorBank:
    """The :class:`VectorBank` of the distinct ``texts`` at bank-key ``layers`` (:func:`layer_key`) and word
    aggregations ``words`` (module docstring), read from / written to ``cache`` when given.

    The batches (:data:`BATCH_TOKENS` tokens at most) are fixed before any runs; ``workers`` runs them (default:
    here, in order), each stored in the cache as it comes back; ``on_batch(n)`` is called after the n-th."""
    uniq = list(OrderedDict.fromkeys(texts))
    layers, words = tuple(layers), tuple(words)
    if cache is not None:
        space = model_space(lm)
        out, found = cache.get(space, uniq, layers, words)
        todo = [i for i in range(len(uniq)) if not bool(found[i])]
    else:
        out = torch.empty(len(uniq), len(layers), len(words), lm.d_model, dtype=torch.float32)
        todo = list(range(len(uniq)))
    ids = {i: segment_token_ids(lm, uniq[i]) for i in todo}
    batches = _length_batches(ids, BATCH_TOKENS)
    payloads = ([ids[i] for i in b] for b in batches)
    if workers is not None:
        results = workers.map(forward_batch, (layers, words), payloads)
    else:
        results = ((j, forward_batch(lm, (layers, words), p)) for j, p in enumerate(payloads))
    bar = tqdm(
        file=sys.stderr,
        dynamic_ncols=True,
        total=len(todo),
        desc="forward passes (distinct texts)",
        disable=not progress or not todo,
    )
    try:
        for n, (j, v) in enumerate(results, 1):
            b = batches[j]
            out[b] = v
            if cache is not None:
                cache.put(space, [uniq[i] for i in b], layers, words, v)  # type: ignore[possibly-undefined]  # set with the cache
            bar.update(len(b))
            if on_batch is not None:
                on_batch(n)
    finally:
        bar.close()
    return VectorBank(
        layers=layers, words=words, index={t: i for i, t in enumerate(uniq)}, vectors=out, computed=len(todo)
    )


def segment_vectors_of(bank: VectorBank, texts: Sequence[str], layer: str, word: str, norm: str | None) -> Tensor:
    """``[len(texts), D]``: the bank's vectors at (bank key ``layer``, ``word``) with NORM applied after word
    aggregation, except after ``word=last`` (a selection, not an aggregation), as
    :func:`~.compose.segment_vectors` does."""
    v = bank.vectors[bank.rows(texts), bank.layer_pos(layer), bank.word_pos(word)]
    return v if word == "last" else normalize(v, norm)
