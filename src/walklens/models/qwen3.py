"""Qwen 3 (dense): Llama's layout (rotary, RMSNorm, grouped-query attention, gated MLP) plus a per-head RMSNorm
of q and of k (``q_norm``/``k_norm``, over the head dimension) before rotary, so the scores are not bilinear in
x; optional sliding-window layers (``use_sliding_window``: layers from ``max_window_layers`` on)."""

from __future__ import annotations

from typing import Any

from .base import Adapter, StackSpec, act_from_config, lm_head_logits, sliding_window_limit
from .gemma3 import head_weights

QK_NORM = "q and k are RMS-normalised per head (q_norm, k_norm) before the dot product"


def limits(config: Any) -> dict[str, str]:
    return {"qk_bilinear": QK_NORM, **sliding_window_limit(config)}


ADAPTER = Adapter(
    family="qwen3",
    model_types=("qwen3",),
    auto_class="causal",
    embed="model.embed_tokens",
    stacks=(StackSpec(name="", layers="model.layers", attn="self_attn", attn_out="self_attn", mlp_out="mlp",
                      final_norm="model.norm",
                      norms={"attn": "input_layernorm", "mlp": "post_attention_layernorm"}),),
    position="rotary",
    residual="pre_norm",
    head_weights_fn=head_weights,
    logits_fn=lm_head_logits("lm_head"),
    mlp_act_fn=act_from_config("hidden_act"),
    unembed="lm_head",
    limits=limits,
)
