"""Tokenisation the lm-evaluation-harness way, hidden states of segment texts at any layer, and the shared
scorer that gives the log-likelihood of several continuations after one context pass.

Layers follow A.6 (ENCODING_LAYER): ``E`` is the output of the model's input-embedding module (for Gemma that
already includes its sqrt(D) scale, so feeding it back through ``inputs_embeds`` reproduces the model
exactly); hidden state ``l`` (0..N-1) is the input of layer ``l``; ``N`` is the top of the stack after the
final norm.  Encoder-decoder models are encoded with their encoder stack (sec. 5.1: e_t = c_t).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ...base.errors import EmptyTextError, UnsupportedFamilyError
from ..capture import capture_batch, pad_batch
from .request import ScoreRequest, check_request

if TYPE_CHECKING:
    from ..loading import LoadedModel


def arch_of(lm: LoadedModel) -> str:
    """``decoder``, ``encoder-decoder`` or ``encoder`` (the names :meth:`Scheme.validate` takes): the model's
    A.6 kind, as its adapter declares it (``lm.kind``)."""
    return lm.kind


def adds_bos(lm: LoadedModel) -> bool:
    """Whether lm-evaluation-harness prefixes the BOS token for this causal model (Gemma), as its adapter
    declares it (``harness_bos``)."""
    return lm.is_causal and lm.harness_bos


def tok_encode(lm: LoadedModel, text: str) -> list[int]:
    """The harness's ``tok_encode``: special tokens only for encoder-decoder models (T5 appends ``</s>``) and
    for BOS-prefixing causal models (Gemma)."""
    special = lm.is_encoder_decoder or adds_bos(lm)
    return list(lm.tokenizer.encode(text, add_special_tokens=special))


def encode_pair(lm: LoadedModel, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The harness's ``_encode_pair``: trailing spaces of the context move to the continuation; causal models
    encode context+continuation together and split at the context's token length; encoder-decoder models
    encode the context (with ``</s>``) and the continuation (without special tokens) separately."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    if lm.is_encoder_decoder:
        return tok_encode(lm, context), list(lm.tokenizer.encode(continuation, add_special_tokens=False))
    whole = tok_encode(lm, context + continuation)
    ctx = tok_encode(lm, context)
    return ctx, whole[len(ctx) :]


def n_prefix_tokens(lm: LoadedModel) -> int:
    """How many leading positions of :func:`segment_token_ids` are not the segment's own tokens (1 for the BOS
    of Gemma, else 0); they condition the segment but are left out of word aggregation."""
    return 1 if adds_bos(lm) and lm.tokenizer.bos_token_id is not None else 0


def segment_token_ids(lm: LoadedModel, text: str) -> list[int]:
    """Model input ids of one segment encoded on its own: the text's tokens, after the BOS for Gemma, with
    ``</s>`` for encoder-decoder models (as the seed's code: special tokens only for them)."""
    if not text.strip():
        raise EmptyTextError("a segment is empty")
    if lm.is_causal:
        ids = list(lm.tokenizer.encode(text, add_special_tokens=False))
        if n_prefix_tokens(lm):
            ids = [lm.tokenizer.bos_token_id] + ids
    else:
        ids = list(lm.tokenizer.encode(text, add_special_tokens=True))
    if len(ids) <= n_prefix_tokens(lm):
        raise EmptyTextError(f"the segment {text[:40]!r} tokenises to nothing")
    return ids


# ---- hidden states ----------------------------------------------------------------------------------------


def input_embeddings(lm: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    """The input-embedding module's output for ``ids`` (Gemma's includes its sqrt(D) scale)."""
    return lm.hf.get_input_embeddings()(ids)


@torch.inference_mode()
def hidden_states(
    lm: LoadedModel, seqs: Sequence[Sequence[int]], layers: Sequence[int | None]
) -> tuple[dict[int | None, torch.Tensor], torch.Tensor]:
    """Hidden states of a batch of id sequences at resolved ``layers`` (None = E, 0..N, see
    :func:`~walklens.analyses.concepts.schemes.resolve_layer`), right-padded: returns ({layer: [B, T, D] float32},
    mask [B, T]).

    One batched pass of the encoder stack (encoder-decoder) or the model body (decoder-only, no LM head) through
    :func:`walklens.core.capture.capture_batch`, stopped after the deepest layer needed: layer ``l`` < N is the
    point ``L{l}.resid_pre``, N is ``final`` (after the final norm; the last layer's output for post-norm
    stacks without one).  E needs no pass: it is the input-embedding module's output.
    """
    N = lm.n_layers
    wanted = sorted({l for l in layers if l is not None})
    names = {l: "final" if l == N else f"L{l}.resid_pre" for l in wanted}
    if wanted:
        batch = capture_batch(lm, seqs, list(names.values()))
        ids, mask = batch.token_ids, batch.mask
    else:
        ids, mask = pad_batch(seqs, lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0)
    out: dict[int | None, torch.Tensor] = {}
    if None in layers:
        out[None] = input_embeddings(lm, ids.to(lm.device)).float()
    for l in wanted:
        out[l] = batch[names[l]]  # type: ignore[possibly-undefined]  # bound above whenever wanted is not empty
    return out, mask


# ---- scoring continuations after one context pass ---------------------------------------------------------


def _log_softmax_at(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None]).squeeze(-1)


@torch.inference_mode()
def continuation_logliks(
    lm: LoadedModel,
    continuations: Sequence[Sequence[int]],
    *,
    context_ids: Sequence[int] | None = None,
    context_embeds: torch.Tensor | None = None,
) -> list[float]:
    """Sum of log-probabilities of each continuation (token ids) after one context, the context computed once.

    The context is ``context_ids`` or ``context_embeds`` ``[C, D]`` (fed through ``inputs_embeds``, in the
    model's dtype: float32 vectors of a bfloat16 model's own embeddings convert back exactly).
    Decoder-only: one pass over the context keeps its past key/values and its last logits (which score each
    continuation's first token); the cache is repeated for the continuations, which run as one right-padded
    batch (padding only follows real tokens, so causal attention never sees it).  Encoder-decoder: the
    context goes through the encoder once; the continuations are the decoder's targets, its inputs being
    ``decoder_start`` followed by each continuation minus its last token, as one batch.
    """
    if (context_ids is None) == (context_embeds is None):
        raise ValueError("give exactly one of context_ids and context_embeds")
    check_request(lm, ScoreRequest(continuations, context_ids=context_ids, context_embeds=context_embeds))
    dev = lm.device
    n = len(continuations)
    L = max(len(c) for c in continuations)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    targets = torch.full((n, L), pad, dtype=torch.long, device=dev)
    for i, c in enumerate(continuations):
        targets[i, : len(c)] = torch.tensor(list(c), dtype=torch.long)
    ctx_kw = (
        {"input_ids": torch.tensor([list(context_ids)], dtype=torch.long, device=dev)}
        if context_ids is not None
        else {"inputs_embeds": context_embeds[None].to(device=dev, dtype=lm.dtype)}  # type: ignore[index]  # given when no context_ids are
    )
    if lm.is_causal:
        lp = _causal_logprobs(lm, ctx_kw, targets)
    elif lm.is_encoder_decoder:
        lp = _encoder_decoder_logprobs(lm, ctx_kw, targets, pad)
    else:
        raise UnsupportedFamilyError(
            f"{lm.adapter.family}: scoring endings needs a causal or encoder-decoder LM (this is a masked LM)"
        )
    return [float(lp[i, : len(c)].sum()) for i, c in enumerate(continuations)]


def _causal_logprobs(lm: LoadedModel, ctx_kw: dict[str, torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
    """Log-probabilities [n, L] of each continuation's tokens ``targets`` after the context ``ctx_kw`` of a
    decoder-only model: the context's last logits score the first tokens, its key/value cache repeated for the
    continuations' batch scores the rest (:func:`continuation_logliks`)."""
    dev = lm.device
    n, L = targets.shape
    model = lm.model
    try:
        out = model(**ctx_kw, use_cache=True, logits_to_keep=1)
    except TypeError:
        out = model(**ctx_kw, use_cache=True)
    first = torch.log_softmax(out.logits[0, -1].float(), dim=-1)  # [V]
    lp = torch.zeros((n, L), dtype=torch.float32, device=dev)
    lp[:, 0] = first[targets[:, 0]]
    if L > 1:
        out.cache.batch_repeat_interleave(n)  # transformers 5.2x: ``cache`` (was ``past_key_values``)
        out2 = model(input_ids=targets[:, :-1], use_cache=True, cache=out.cache)
        lp[:, 1:] = _log_softmax_at(out2.logits, targets[:, 1:])
    return lp


def _encoder_decoder_logprobs(
    lm: LoadedModel, ctx_kw: dict[str, torch.Tensor], targets: torch.Tensor, pad: int
) -> torch.Tensor:
    """Log-probabilities [n, L] of each continuation's tokens ``targets`` as the decoder's targets after the
    context ``ctx_kw`` went through the encoder once (:func:`continuation_logliks`)."""
    from transformers.modeling_outputs import BaseModelOutput

    dev = lm.device
    n = targets.shape[0]
    enc = lm.hf.get_encoder()(**ctx_kw).last_hidden_state  # [1, C, D]
    start = lm.config.decoder_start_token_id
    start = pad if start is None else start
    dec_in = torch.cat([torch.full((n, 1), start, dtype=torch.long, device=dev), targets[:, :-1]], dim=1)
    out = lm.model(
        encoder_outputs=BaseModelOutput(last_hidden_state=enc.expand(n, -1, -1)),
        decoder_input_ids=dec_in,
        use_cache=False,
    )
    return _log_softmax_at(out.logits, targets)
