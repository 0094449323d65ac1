"""Test 1, pyramidal generation (seed 000, sec. 5.1.1): "we compute segment vectors as described above,
yielding a sequence of vectors representing the context.  Next (without any further aggregation of the
context), we concatenate token vectors of a completion sentence (one of the 4 choices) to this sequence and
the resulting vector-sequence is fed to the model as input.  Joint probability of the completion sentence is
then obtained from the model's output probabilities and used to pick the winning choice."

Exact construction, per item and scheme (see docs/hellaswag.md):

* the context is segmented (:mod:`.segment`) and composed into concept vectors ``k_1..k_m``
  (:mod:`.compose`); the segment vectors of text segments come from :func:`~.vectors.text_vectors`, the same
  computation the sweep's bank uses, read from the concept cache when one is given
  (:mod:`walklens.analyses.concepts.cache`);
* decoder-only: the model input is ``[BOS embedding (Gemma only, as in the baseline)] k_1..k_m`` followed by
  the ending's tokens, through ``inputs_embeds``; the ending's tokens are the baseline's continuation tokens of
  ``" " + ending`` and its log-likelihood is the sum of their log-probabilities (the first one predicted after
  ``k_m``).  The context part runs once and its past key/values serve the four endings;
* encoder-decoder: the encoder's input (``inputs_embeds``) is ``k_1..k_m`` followed by the embedding of the
  ``</s>`` the baseline's encoder input ends with; the decoder scores the ending's tokens exactly as in the
  baseline.  (The seed's own code instead used ``k_1..k_m`` directly as the encoder's *output*.)
* ``acc`` and ``acc_norm`` are computed from the four log-likelihoods as in the baseline.

With ``enc=token_level``, ``layer=E`` and ``word=last`` the concept vectors are the context's own token
embeddings, so Test 1 reproduces the baseline's log-likelihoods (the test-suite checks this on every family);
``enc=cross_encoding`` is the baseline itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict, Unpack, cast

import torch

from ...analyses.concepts.compose import Segment, compose_context, context_vectors
from ...analyses.concepts.schemes import Scheme
from ...analyses.concepts.vectors import VectorBank, layer_key, segment_vectors_of, text_vectors
from ...core.scoring.encode import continuation_logliks, input_embeddings, n_prefix_tokens
from ...core.scoring.request import ScoreRequest
from ..hellaswag.baseline import baseline_request, item_result, item_tokens, packed_results
from ..hellaswag.data import HellaswagItem
from ..hellaswag.store import ItemResult
from .segment import segment_context

if TYPE_CHECKING:
    from ...analyses.concepts.cache import ConceptCache
    from ...core.loading import LoadedModel
    from .controls import Control


class Sources(TypedDict, total=False):
    """Where a concept sequence's vectors come from (:func:`concept_sequence`): the text segments' vectors
    precomputed in ``bank`` or read through the concept ``cache``; a ``control`` (:mod:`.controls`) composing
    another context or replacing its vectors."""

    bank: VectorBank | None
    cache: ConceptCache | None
    control: Control | None


def scheme_bank(
    lm: LoadedModel, contexts: Sequence[Sequence[Sequence[Segment]]], scheme: Scheme, cache: ConceptCache | None = None
) -> VectorBank:
    """The segment vectors (before NORM) of every text segment of ``contexts`` (each a list of examples of
    segments) at the scheme's layer and word aggregation, computed once (:func:`~.vectors.text_vectors`) or
    read from the concept ``cache``."""
    texts = [s for ctx in contexts for ex in ctx for s in ex if isinstance(s, str)]
    return text_vectors(lm, texts, [layer_key(lm, scheme.layer)], [scheme.word], cache=cache)


def compose_segments(
    lm: LoadedModel,
    segs: Sequence[Sequence[Segment]],
    scheme: Scheme,
    bank: VectorBank | None = None,
    cache: ConceptCache | None = None,
) -> torch.Tensor:
    """The concept vectors ``[m, D]`` of a context cut into examples of segments: segment vectors (text
    segments from ``bank`` / the concept cache, token-id segments from one pass), then NORM, segment and example
    aggregation (:func:`~.compose.compose_context`)."""
    if any(not isinstance(x, str) for e in segs for x in e):
        ctx, _ = context_vectors(lm, segs, scheme)
        return ctx
    bank = scheme_bank(lm, [segs], scheme, cache) if bank is None else bank
    key = layer_key(lm, scheme.layer)
    # every segment is a text here (token-id segments were composed above, in one pass)
    per_ex = [
        segment_vectors_of(bank, cast(Sequence[str], e), key, scheme.word, scheme.norm).to(lm.device) for e in segs
    ]
    return compose_context(per_ex, scheme.seg, scheme.ex, scheme.norm)


def special_around(lm: LoadedModel, ctx: torch.Tensor) -> torch.Tensor:
    """``ctx`` with the baseline's special tokens around it: Gemma's BOS embedding before, T5's ``</s>``
    after."""
    dev = ctx.device
    parts = []
    if n_prefix_tokens(lm):
        parts.append(input_embeddings(lm, torch.tensor([lm.tokenizer.bos_token_id], device=dev)).float())
    parts.append(ctx)
    if lm.is_encoder_decoder:
        eos = lm.tokenizer.eos_token_id
        probe = lm.tokenizer.encode("a", add_special_tokens=True)
        if eos is not None and probe and probe[-1] == eos:
            parts.append(input_embeddings(lm, torch.tensor([eos], device=dev)).float())
    return torch.cat(parts, dim=0)


def concept_sequence(
    lm: LoadedModel,
    item: HellaswagItem,
    examples: Sequence[HellaswagItem],
    scheme: Scheme,
    **sources: Unpack[Sources],
) -> torch.Tensor:
    """The model input that replaces the context: ``[m', D]`` (concept vectors, with the baseline's special
    tokens around them: Gemma's BOS before, T5's ``</s>`` after; token_level keeps the baseline's own tokens).
    Text segments' vectors come from ``bank`` when given, else from :func:`scheme_bank` (with the concept
    ``cache``).  A ``control`` (:mod:`.controls`) picks the context composed and replaces its vectors."""
    bank, cache, control = sources.get("bank"), sources.get("cache"), sources.get("control")
    src, src_examples = (item, examples) if control is None else control.context(item, examples)
    segs = segment_context(src, src_examples, scheme.enc, lm)
    ctx = compose_segments(lm, segs, scheme, bank, cache)
    if control is not None:
        ctx = control.vectors(item, ctx)
    if scheme.enc == "token_level":
        return ctx
    return special_around(lm, ctx)


def test1_request(
    lm: LoadedModel,
    item: HellaswagItem,
    examples: Sequence[HellaswagItem],
    scheme: Scheme,
    **sources: Unpack[Sources],
) -> ScoreRequest:
    """The concept sequence of the item's context (a ``control``'s, where given) and the baseline's four
    continuations after it."""
    if scheme.enc == "cross_encoding" and sources.get("control") is None:
        return baseline_request(lm, item, examples)
    _, conts = item_tokens(lm, item, examples)
    seq = concept_sequence(lm, item, examples, scheme, **sources)
    return ScoreRequest(conts, context_embeds=seq.to(lm.dtype))  # the dtype of the input embeddings


def test1_scores(
    lm: LoadedModel,
    item: HellaswagItem,
    examples: Sequence[HellaswagItem],
    scheme: Scheme,
    cache: ConceptCache | None = None,
) -> list[float]:
    """The four endings' log-likelihoods after the concept sequence of the item's context."""
    r = test1_request(lm, item, examples, scheme, cache=cache)
    return continuation_logliks(lm, r.continuations, context_ids=r.context_ids, context_embeds=r.context_embeds)


def test1_item(
    lm: LoadedModel,
    item: HellaswagItem,
    examples: Sequence[HellaswagItem],
    scheme: Scheme,
    cache: ConceptCache | None = None,
) -> ItemResult:
    return item_result(item, test1_scores(lm, item, examples, scheme, cache))


def test1_items(
    lm: LoadedModel,
    items: Sequence[HellaswagItem],
    examples: Sequence[Sequence[HellaswagItem]],
    scheme: Scheme,
    cache: ConceptCache | None = None,
    control: Control | None = None,
) -> list[ItemResult]:
    """:func:`test1_item` for many items: the segment vectors of all of them computed (or read from the
    concept ``cache``) together, their requests packed into shared forward passes (:func:`~.packing.packed_logliks`).
    A ``control`` (:mod:`.controls`) scores the same endings after its concept vectors."""
    bank = None
    if scheme.enc not in ("cross_encoding", "token_level"):
        srcs = [(it, ex) if control is None else control.context(it, ex) for it, ex in zip(items, examples)]
        bank = scheme_bank(lm, [segment_context(it, ex, scheme.enc, lm) for it, ex in srcs], scheme, cache)
    reqs = [test1_request(lm, it, ex, scheme, bank=bank, control=control) for it, ex in zip(items, examples)]
    return packed_results(lm, items, reqs)
