"""Tokenisation the lm-evaluation-harness way, hidden states of segment texts at any layer, and the shared
scorer that gives the log-likelihood of several continuations after one context pass.

Layers follow A.6 (ENCODING_LAYER): ``E`` is the output of the model's input-embedding module (for Gemma that
already includes its sqrt(D) scale, so feeding it back through ``inputs_embeds`` reproduces the model
exactly); hidden state ``l`` (0..N-1) is the input of layer ``l``; ``N`` is the top of the stack after the
final norm.  Encoder-decoder models are encoded with their encoder stack (sec. 5.1: e_t = c_t).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Sequence

import torch
from torch import nn

from ..errors import EmptyTextError, UnsupportedFamilyError
from ..models.base import StackSpec, get_module

if TYPE_CHECKING:
    from ..loading import LoadedModel

_ARCH = {"causal": "decoder", "seq2seq": "encoder-decoder", "masked": "encoder"}


def arch_of(lm: "LoadedModel") -> str:
    """``decoder``, ``encoder-decoder`` or ``encoder`` (the names :meth:`Scheme.validate` takes)."""
    return _ARCH[lm.adapter.auto_class]


def adds_bos(lm: "LoadedModel") -> bool:
    """Whether lm-evaluation-harness prefixes the BOS token for this causal model (it does so for Gemma only:
    ``add_bos_token`` defaults to False unless the model type contains "gemma")."""
    return lm.adapter.auto_class == "causal" and "gemma" in str(getattr(lm.model.config, "model_type", ""))


def tok_encode(lm: "LoadedModel", text: str) -> list[int]:
    """The harness's ``tok_encode``: special tokens only for encoder-decoder models (T5 appends ``</s>``) and
    for BOS-prefixing causal models (Gemma)."""
    special = lm.adapter.auto_class == "seq2seq" or adds_bos(lm)
    return list(lm.tokenizer.encode(text, add_special_tokens=special))


def encode_pair(lm: "LoadedModel", context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The harness's ``_encode_pair``: trailing spaces of the context move to the continuation; causal models
    encode context+continuation together and split at the context's token length; encoder-decoder models
    encode the context (with ``</s>``) and the continuation (without special tokens) separately."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    if lm.adapter.auto_class == "seq2seq":
        return tok_encode(lm, context), list(lm.tokenizer.encode(continuation, add_special_tokens=False))
    whole = tok_encode(lm, context + continuation)
    ctx = tok_encode(lm, context)
    return ctx, whole[len(ctx):]


def n_prefix_tokens(lm: "LoadedModel") -> int:
    """How many leading positions of :func:`segment_token_ids` are not the segment's own tokens (1 for the BOS
    of Gemma, else 0); they condition the segment but are left out of word aggregation."""
    return 1 if adds_bos(lm) and lm.tokenizer.bos_token_id is not None else 0


def segment_token_ids(lm: "LoadedModel", text: str) -> list[int]:
    """Model input ids of one segment encoded on its own: the text's tokens, after the BOS for Gemma, with
    ``</s>`` for encoder-decoder models (as the seed's code: special tokens only for them)."""
    if not text.strip():
        raise EmptyTextError("a segment is empty")
    if lm.adapter.auto_class == "causal":
        ids = list(lm.tokenizer.encode(text, add_special_tokens=False))
        if n_prefix_tokens(lm):
            ids = [lm.tokenizer.bos_token_id] + ids
    else:
        ids = list(lm.tokenizer.encode(text, add_special_tokens=True))
    if len(ids) <= n_prefix_tokens(lm):
        raise EmptyTextError(f"the segment {text[:40]!r} tokenises to nothing")
    return ids


# ---- hidden states ----------------------------------------------------------------------------------------

def input_embeddings(lm: "LoadedModel", ids: torch.Tensor) -> torch.Tensor:
    """The input-embedding module's output for ``ids`` (Gemma's includes its sqrt(D) scale)."""
    return lm.model.get_input_embeddings()(ids)


class _Stop(Exception):
    pass


def _encoder_spec(lm: "LoadedModel") -> StackSpec:
    return lm.adapter.stack("enc") if lm.adapter.auto_class == "seq2seq" else lm.adapter.stack()


def _body(lm: "LoadedModel") -> nn.Module:
    """The module to run for hidden states: the encoder stack of encoder-decoder models, else the model body
    without its LM head."""
    if lm.adapter.auto_class == "seq2seq":
        return lm.model.get_encoder()
    return lm.model.base_model


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists into ``ids [B, T]`` and ``mask [B, T]`` (1 = real token)."""
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[i, :len(s)] = 1
    return ids, mask


@torch.inference_mode()
def hidden_states(lm: "LoadedModel", seqs: Sequence[Sequence[int]], layers: Sequence[int | None]
                  ) -> tuple[dict[int | None, torch.Tensor], torch.Tensor]:
    """Hidden states of a batch of id sequences at resolved ``layers`` (None = E, 0..N, see
    :func:`~.schemes.resolve_layer`), right-padded: returns ({layer: [B, T, D] float32}, mask [B, T]).

    One forward pass of the encoder stack (encoder-decoder) or the model body (decoder-only, no LM head),
    stopped after the deepest layer needed; forward pre-hooks read each layer's input, a hook on the final norm
    reads the top.  Hooks are always removed.
    """
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    ids, mask = pad_batch(seqs, pad)
    ids, mask = ids.to(lm.device), mask.to(lm.device)
    N = lm.n_layers
    out: dict[int | None, torch.Tensor] = {}
    if None in layers:
        out[None] = input_embeddings(lm, ids).float()
    wanted = sorted({l for l in layers if l is not None})
    if not wanted:
        return out, mask.cpu()
    spec = _encoder_spec(lm)
    modules = lm.adapter.layer_modules(lm.model, spec.name)
    inputs: list[torch.Tensor] = []
    top: list[torch.Tensor] = []
    deepest = max(wanted)

    def pre(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        h = args[0] if args else kwargs.get("hidden_states")
        inputs.append(h)
        if deepest < N and len(inputs) > deepest:
            raise _Stop

    def post_final(_m: nn.Module, _a: tuple, output: torch.Tensor) -> None:
        top.append(output[0] if isinstance(output, (tuple, list)) else output)

    handles = []
    try:
        for m in dict.fromkeys(modules):  # unique modules (ALBERT shares one)
            handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        if deepest == N:
            if spec.final_norm is not None:
                handles.append(get_module(lm.model, spec.final_norm).register_forward_hook(post_final))
            else:  # post-norm stacks: the top is the last layer's output
                handles.append(modules[-1].register_forward_hook(
                    lambda m, a, o: top.append(o[0] if isinstance(o, (tuple, list)) else o)))
        try:
            _body(lm)(input_ids=ids, attention_mask=mask, use_cache=False)
        except _Stop:
            pass
    finally:
        for h in handles:
            h.remove()
    for l in wanted:
        out[l] = (top[-1] if l == N else inputs[l]).float()
    return out, mask.cpu()


# ---- scoring continuations after one context pass ---------------------------------------------------------

def _log_softmax_at(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None]).squeeze(-1)


@functools.lru_cache(maxsize=None)
def _cache_kw_for(cls: type) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def _cache_kw(model: nn.Module) -> str:
    """The name of the past-key/values argument (transformers 5.2x renamed ``past_key_values`` to ``cache``)."""
    return _cache_kw_for(type(model))


@torch.inference_mode()
def continuation_logliks(lm: "LoadedModel", continuations: Sequence[Sequence[int]], *,
                         context_ids: Sequence[int] | None = None,
                         context_embeds: torch.Tensor | None = None) -> list[float]:
    """Sum of log-probabilities of each continuation (token ids) after one context, the context computed once.

    The context is ``context_ids`` or ``context_embeds`` ``[C, D]`` (fed through ``inputs_embeds``).
    Decoder-only: one pass over the context keeps its past key/values and its last logits (which score each
    continuation's first token); the cache is repeated for the continuations, which run as one right-padded
    batch (padding only follows real tokens, so causal attention never sees it).  Encoder-decoder: the
    context goes through the encoder once; the continuations are the decoder's targets, its inputs being
    ``decoder_start`` followed by each continuation minus its last token, as one batch.
    """
    from .packing import ScoreRequest, check_request

    if (context_ids is None) == (context_embeds is None):
        raise ValueError("give exactly one of context_ids and context_embeds")
    check_request(lm, ScoreRequest(continuations, context_ids=context_ids, context_embeds=context_embeds))
    dev = lm.device
    n = len(continuations)
    L = max(len(c) for c in continuations)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    targets = torch.full((n, L), pad, dtype=torch.long, device=dev)
    for i, c in enumerate(continuations):
        targets[i, :len(c)] = torch.tensor(list(c), dtype=torch.long)
    ctx_kw = ({"input_ids": torch.tensor([list(context_ids)], dtype=torch.long, device=dev)}
              if context_ids is not None else {"inputs_embeds": context_embeds[None].to(dev)})
    kind = lm.adapter.auto_class
    if kind == "causal":
        model = lm.model
        try:
            out = model(**ctx_kw, use_cache=True, logits_to_keep=1)
        except TypeError:
            out = model(**ctx_kw, use_cache=True)
        first = torch.log_softmax(out.logits[0, -1].float(), dim=-1)  # [V]
        lp = torch.zeros((n, L), dtype=torch.float32, device=dev)
        lp[:, 0] = first[targets[:, 0]]
        if L > 1:
            cache = out["cache"] if "cache" in out else out["past_key_values"]
            cache.batch_repeat_interleave(n)
            out2 = model(input_ids=targets[:, :-1], use_cache=True, **{_cache_kw(model): cache})
            lp[:, 1:] = _log_softmax_at(out2.logits, targets[:, 1:])
    elif kind == "seq2seq":
        from transformers.modeling_outputs import BaseModelOutput

        enc = lm.model.get_encoder()(**ctx_kw).last_hidden_state  # [1, C, D]
        start = lm.model.config.decoder_start_token_id
        start = pad if start is None else start
        dec_in = torch.cat([torch.full((n, 1), start, dtype=torch.long, device=dev), targets[:, :-1]], dim=1)
        out = lm.model(encoder_outputs=BaseModelOutput(last_hidden_state=enc.expand(n, -1, -1)),
                       decoder_input_ids=dec_in, use_cache=False)
        lp = _log_softmax_at(out.logits, targets)
    else:
        raise UnsupportedFamilyError(f"{lm.adapter.family}: scoring endings needs a causal or encoder-decoder "
                                     f"LM (this is a masked LM)")
    return [float(lp[i, :len(c)].sum()) for i, c in enumerate(continuations)]
