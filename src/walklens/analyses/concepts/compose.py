"""The pyramidal aggregation f_⊕ of seed 000 (sec. 5.1 "Hierarchical Concept Composition", A.6): segments →
word vectors at ENCODING_LAYER → one vector per segment (WORD_AGG_SCHEME, then NORM) → per example
(SEGMENT_AGG_SCHEME, then NORM) → over examples (EXAMPLE_AGG_SCHEME, then NORM).

NORM is applied after every aggregation that takes place ("applied to vectors after an aggregation
operation"), except after ``word=last``, which selects a vector rather than aggregating (as in the seed's
code).  Example aggregation runs only when more than one vector remains (A.6: "Applies when there are more
than one examples"); with ``seg=None`` the example ``mean`` averages every remaining segment vector, as the
seed's code does.  ``soft_cluster`` needs the choice vectors and is applied by Test 2.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ...core.scoring.encode import hidden_states, n_prefix_tokens, segment_token_ids
from .schemes import Scheme, normalize, resolve_layer, word_aggregate

if TYPE_CHECKING:
    from ...core.loading import LoadedModel

#: a text, or (token-level segmentation) a tuple of token ids: each is encoded on its own
Segment = str | tuple[int, ...]


def segment_vectors(
    lm: LoadedModel, segments: Sequence[Segment], layers: Sequence[str], words: Sequence[str], norm: str | None
) -> list[torch.Tensor]:
    """Encode every segment on its own (one batched pass; duplicate segments run once) and reduce its token
    vectors: for each (layer, word) pair in ``zip(layers, words)``, a tensor ``[len(segments), D]``.

    A text segment is tokenised by :func:`~walklens.core.scoring.encode.segment_token_ids` (Gemma's BOS conditions the
    segment but
    is left out of the aggregation); a token-id tuple is fed as it is.
    """
    uniq: dict[Segment, int] = {}
    for s in segments:
        uniq.setdefault(s, len(uniq))
    seqs, skip = [], []
    for s in uniq:
        if isinstance(s, str):
            seqs.append(segment_token_ids(lm, s))
            skip.append(n_prefix_tokens(lm))
        else:
            seqs.append(list(s))
            skip.append(0)
    resolved = [resolve_layer(l, lm.n_layers) for l in layers]
    states, mask = hidden_states(lm, seqs, resolved)
    mask = mask.clone()
    for i, k in enumerate(skip):
        mask[i, :k] = 0
    act = lm.adapter.mlp_activation(lm.model) if any("relu" in w for w in words) else None
    rows = torch.tensor([uniq[s] for s in segments], dtype=torch.long)
    out = []
    for lay, word in zip(resolved, words):
        v = word_aggregate(states[lay], word, act, mask.to(states[lay].device))
        if word != "last":
            v = normalize(v, norm)
        out.append(v[rows])
    return out


def compose_context(
    example_vectors: Sequence[torch.Tensor], seg: str | None, ex: str | None, norm: str | None
) -> torch.Tensor:
    """Segment and example aggregation: ``example_vectors`` holds one ``[..., n_segments, D]`` tensor per
    example; returns the context's vector sequence ``[..., m, D]`` (``m = 1`` when everything is averaged).
    Leading dimensions are independent contexts (the sweep composes every (layer, word) pair at once)."""
    parts = [normalize(v.mean(dim=-2, keepdim=True), norm) if seg == "mean" else v for v in example_vectors]
    seq = torch.cat(parts, dim=-2)
    if seq.shape[-2] > 1 and ex == "mean":
        seq = normalize(seq.mean(dim=-2, keepdim=True), norm)
    return seq


def context_vectors(
    lm: LoadedModel, examples: Sequence[Sequence[Segment]], scheme: Scheme, extra: Sequence[Segment] = ()
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The context's concept vectors ``[m, D]`` from its segmented examples under ``scheme`` (ENCODING_LAYER,
    WORD_AGG_SCHEME, NORM, SEGMENT_AGG_SCHEME, EXAMPLE_AGG_SCHEME); with ``extra`` segments (Test 2's endings),
    also their vectors at the scheme's OUT_ENCODING_LAYER and choice word aggregation, from the same forward pass
    (None without)."""
    layer, word, norm = scheme.layer, scheme.word, scheme.norm
    flat = [s for e in examples for s in e]
    if extra:
        segs = flat + list(extra)
        extra_layer, extra_word = scheme.out_layer_eff, scheme.out_word_eff
        if (extra_layer, extra_word) == (layer, word):
            (v,) = segment_vectors(lm, segs, [layer], [word], norm)
            ctx_v, extra_v = v[: len(flat)], v[len(flat) :]
        else:
            a, b = segment_vectors(lm, segs, [layer, extra_layer], [word, extra_word], norm)
            ctx_v, extra_v = a[: len(flat)], b[len(flat) :]
    else:
        (ctx_v,) = segment_vectors(lm, flat, [layer], [word], norm)
        extra_v = None
    per_ex, k = [], 0
    for e in examples:
        per_ex.append(ctx_v[k : k + len(e)])
        k += len(e)
    return compose_context(per_ex, scheme.seg, scheme.ex, norm), extra_v
