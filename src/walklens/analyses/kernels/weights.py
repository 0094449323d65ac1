"""Position kernels read from a model's own position bias (seed 000, A.2; Fig. 6): T5's relative buckets from the
weights, and ALiBi measured on the position-only probe (:func:`position_only_attention`: a forward pass with every
attention input zero, so only the additive bias is left)."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from ...base.errors import InputError
from ...base.hooks import Hooks, distinct
from ...core.capture import attention_probs
from .empirical import DEFAULT_CORPUS, _attention_modules, _token_pool
from .result import StackKernels

if TYPE_CHECKING:
    from transformers.models.t5.modeling_t5 import T5Attention

    from ...core.loading import LoadedModel


def _t5_bias_modules(lm: LoadedModel, stack: str) -> list[tuple[int, T5Attention]]:
    mods = []
    for l in range(lm.n_layers):
        attn = lm.adapter.attention_module(lm.model, l, stack)
        if getattr(attn, "has_relative_attention_bias", False):
            mods.append((l, cast("T5Attention", attn)))  # T5's attention (or a copy of its layout)
    return mods


def t5_kernel_values(attn: T5Attention, distances: Sequence[int]) -> torch.Tensor:
    """[H, n]: ``relative_attention_bias.weight[bucket(delta), h]`` via the module's own bucket function."""
    rel = torch.tensor(list(distances), dtype=torch.long)
    buckets = attn._relative_position_bucket(
        rel,
        bidirectional=not attn.is_decoder,
        num_buckets=attn.relative_attention_num_buckets,
        max_distance=attn.relative_attention_max_distance,
    )
    return attn.relative_attention_bias.weight.detach().float().cpu()[buckets].T.contiguous()


def _held_values(lm: LoadedModel, layer: int, stack: str, attn: T5Attention, dist: list[int]) -> torch.Tensor:
    """:func:`t5_kernel_values` with layer ``layer``'s weights in memory (read from disk for a streamed model)."""
    with lm.held(layer, stack):
        return t5_kernel_values(attn, dist)


def _t5_kernels(lm: LoadedModel, max_distance: int | None) -> tuple[list[StackKernels], str]:
    out = []
    for spec in lm.adapter.stacks:
        mods = _t5_bias_modules(lm, spec.name)
        if not mods:
            continue
        W = max_distance or int(mods[0][1].relative_attention_max_distance)
        causal = bool(mods[0][1].is_decoder)
        dist = list(range(-W, 1)) if causal else list(range(-W, W + 1))
        vals = torch.stack([_held_values(lm, l, spec.name, m, dist) for l, m in mods])
        layers: list[int | None] = [None] if [l for l, _ in mods] == [0] else [l for l, _ in mods]
        out.append(StackKernels(spec.name, causal, dist, layers, vals, vals.clone()))
    return out, (
        "read from relative_attention_bias through the model's _relative_position_bucket; layer 0's "
        "bias is reused by every layer of its stack"
    )


@torch.no_grad()
def position_only_attention(lm: LoadedModel, length: int = 32) -> torch.Tensor:
    """Attention [L, H, T, T] of a forward pass in which every self-attention module's input is zero.

    Then q and k are constant (their biases), so q.k is the same for every key and each row is the softmax of
    the additive position bias (T5 buckets, ALiBi) plus the mask; rotary and learned-absolute models give
    uniform rows.  Decoder-only and encoder-only families.
    """
    if lm.is_encoder_decoder:
        raise InputError("the position-only probe supports decoder-only and encoder-only models")
    spec = lm.adapter.stacks[-1]
    modules = _attention_modules(lm, spec.name)
    store: list[torch.Tensor] = []

    def zero(
        _m: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if args:
            return (torch.zeros_like(args[0]),) + tuple(args[1:]), kwargs
        kwargs = dict(kwargs, hidden_states=torch.zeros_like(kwargs["hidden_states"]))
        return args, kwargs

    def keep(_m: torch.nn.Module, _i: Any, out: Any) -> None:
        w = attention_probs(out)
        if w is not None:
            store.append(w.detach()[0].float().cpu())

    ids = _token_pool(lm, DEFAULT_CORPUS)[:length].unsqueeze(0).to(lm.device)
    if ids.shape[1] < length:
        ids = ids.repeat(1, math.ceil(length / ids.shape[1]))[:, :length]
    with Hooks() as hooks:
        for m in distinct(modules):  # a shared module once
            hooks.pre(m, zero, with_kwargs=True)
            hooks.post(m, keep)
        lm.model(input_ids=ids)
    return torch.stack(store)


def _declared_alibi_slopes(lm: LoadedModel, H: int) -> torch.Tensor | None:
    """The ALiBi slopes [H] from the model's own builder, when its modeling module has one transformers uses:
    ``build_alibi_tensor(mask, H, dtype)`` (BLOOM, Falcon; ``slope_h * key``) or ``build_mpt_alibi_tensor(H, T)``
    (MPT; ``slope_h * (key - T + 1)``)."""
    mod = sys.modules[type(lm.model).__module__]
    if hasattr(mod, "build_alibi_tensor"):
        return mod.build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), H, torch.float32).reshape(H, 2)[:, 1].float()
    if hasattr(mod, "build_mpt_alibi_tensor"):
        return -mod.build_mpt_alibi_tensor(H, 2).reshape(H, 2)[:, 0].float()
    return None


def _alibi_kernels(lm: LoadedModel, window: int | None) -> tuple[list[StackKernels], str, torch.Tensor, float]:
    """ALiBi kernels measured on the position-only probe: each head's logit slope per position is fitted to the
    log-ratios of its attention row (exact when the bias is linear in delta), whatever the family's layout;
    the declared slopes, where the model's module has a builder, split it into slope_h * scale."""
    hw = lm.head_weights(0)
    H = hw.n_heads
    T = min(64, window + 2 if window else 64)
    probs = position_only_attention(lm, T)  # [L, H, T, T]
    i = T - 1
    rel = torch.arange(-i, 1, dtype=torch.float32)
    logr = probs[:, :, i, :].clamp_min(1e-30).log() - probs[:, :, i, i : i + 1].clamp_min(1e-30).log()  # [L,H,T]
    per_layer = (logr * rel).sum(-1) / (rel * rel).sum()  # [L, H] logit bias per position
    eff = per_layer.mean(0)
    declared = _declared_alibi_slopes(lm, H)
    if declared is None:
        slopes, scale, how = eff, 1.0, "slopes measured (the model's module has no ALiBi builder)"
    else:
        slopes = declared
        scale = float((eff * slopes).sum() / (slopes * slopes).sum().clamp_min(1e-30))
        how = f"declared slopes times a measured scale {scale:.6g}"
    W = window or 32
    dist = list(range(-W, 1))
    vals = (eff[:, None] * torch.tensor(dist, dtype=torch.float32)[None, :])[None]
    misfit = float((per_layer[:, :, None] * rel - logr).abs().max())
    note = (
        f"k_h(delta) = slope_h * delta * scale, {how}; q.k is scaled by {hw.scale:.6g}"
        + (
            " (the model adds ALiBi twice: measured scale = 2/sqrt(d))"
            if abs(scale - 2 * hw.scale) < 1e-3 * hw.scale
            else ""
        )
        + (f"; the position-only logits deviate from linear by up to {misfit:.3g}" if misfit > 1e-3 else "")
    )
    return [StackKernels(lm.adapter.stacks[-1].name, True, dist, [None], vals, vals.clone())], note, slopes, scale
