"""Test 1, pyramidal generation (seed 000, sec. 5.1.1): "we compute segment vectors as described above,
yielding a sequence of vectors representing the context.  Next (without any further aggregation of the
context), we concatenate token vectors of a completion sentence (one of the 4 choices) to this sequence and
the resulting vector-sequence is fed to the model as input.  Joint probability of the completion sentence is
then obtained from the model's output probabilities and used to pick the winning choice."

Exact construction, per item and scheme (see docs/hellaswag.md):

* the context is segmented (:mod:`.segment`) and composed into concept vectors ``k_1..k_m``
  (:mod:`.compose`);
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

from typing import TYPE_CHECKING, Sequence

import torch

from .baseline import baseline_request, item_result, item_tokens
from .compose import context_vectors
from .data import HellaswagItem
from .encode import continuation_logliks, input_embeddings, n_prefix_tokens
from .packing import packed_logliks
from .request import ScoreRequest
from .schemes import Scheme
from .segment import segment_context
from .store import ItemResult

if TYPE_CHECKING:
    from ..loading import LoadedModel


def concept_sequence(lm: "LoadedModel", item: HellaswagItem, examples: Sequence[HellaswagItem],
                     scheme: Scheme) -> torch.Tensor:
    """The model input that replaces the context: ``[m', D]`` (concept vectors, with the baseline's special
    tokens around them: Gemma's BOS before, T5's ``</s>`` after; token_level keeps the baseline's own tokens)."""
    segs = segment_context(item, examples, scheme.enc, lm)
    ctx, _ = context_vectors(lm, segs, scheme.layer, scheme.word, scheme.norm, scheme.seg, scheme.ex)
    if scheme.enc == "token_level":
        return ctx
    dev = ctx.device
    parts = []
    if n_prefix_tokens(lm):
        parts.append(input_embeddings(lm, torch.tensor([lm.tokenizer.bos_token_id], device=dev)).float())
    parts.append(ctx)
    if lm.adapter.auto_class == "seq2seq":
        eos = lm.tokenizer.eos_token_id
        probe = lm.tokenizer.encode("a", add_special_tokens=True)
        if eos is not None and probe and probe[-1] == eos:
            parts.append(input_embeddings(lm, torch.tensor([eos], device=dev)).float())
    return torch.cat(parts, dim=0)


def test1_request(lm: "LoadedModel", item: HellaswagItem, examples: Sequence[HellaswagItem],
                  scheme: Scheme) -> ScoreRequest:
    """The concept sequence of the item's context and the baseline's four continuations after it."""
    if scheme.enc == "cross_encoding":
        return baseline_request(lm, item, examples)
    _, conts = item_tokens(lm, item, examples)
    seq = concept_sequence(lm, item, examples, scheme)
    dtype = lm.model.get_input_embeddings().weight.dtype
    return ScoreRequest(conts, context_embeds=seq.to(dtype))


def test1_scores(lm: "LoadedModel", item: HellaswagItem, examples: Sequence[HellaswagItem],
                 scheme: Scheme) -> list[float]:
    """The four endings' log-likelihoods after the concept sequence of the item's context."""
    r = test1_request(lm, item, examples, scheme)
    return continuation_logliks(lm, r.continuations, context_ids=r.context_ids, context_embeds=r.context_embeds)


def test1_item(lm: "LoadedModel", item: HellaswagItem, examples: Sequence[HellaswagItem],
               scheme: Scheme) -> ItemResult:
    return item_result(item, test1_scores(lm, item, examples, scheme))


def test1_items(lm: "LoadedModel", items: Sequence[HellaswagItem], examples: Sequence[Sequence[HellaswagItem]],
                scheme: Scheme) -> list[ItemResult]:
    """:func:`test1_item` for many items, their requests packed into shared forward passes
    (:func:`~.packing.packed_logliks`)."""
    reqs = [test1_request(lm, it, ex, scheme) for it, ex in zip(items, examples)]
    return [item_result(it, s) for it, s in zip(items, packed_logliks(lm, reqs))]
