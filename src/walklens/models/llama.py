"""Llama (SmolLM2 and relatives): rotary positions, RMSNorm, grouped-query attention."""

from __future__ import annotations

import dataclasses
from typing import Any

from .base import (
    Adapter,
    HeadWeights,
    HFModule,
    StackSpec,
    act_from_config,
    fold_rope_factor,
    lm_head_logits,
    sliding_window_limit,
    split_linear_heads,
    split_out_linear,
)


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H = config.num_attention_heads
    H_kv = getattr(config, "num_key_value_heads", None) or H
    d = getattr(config, "head_dim", None) or config.hidden_size // H
    w_q, b_q = split_linear_heads(attn.q_proj, H, d)
    w_k, b_k = split_linear_heads(attn.k_proj, H_kv, d)
    w_v, b_v = split_linear_heads(attn.v_proj, H_kv, d)
    w_o, b_o = split_out_linear(attn.o_proj, H, d)
    group = H // H_kv
    return fold_rope_factor(
        HeadWeights(
            w_q,
            w_k,
            w_v,
            w_o,
            b_q,
            b_k,
            b_v,
            b_o,
            tuple(h // group for h in range(H)),
            float(attn.scaling),
            notes="rotary: W_qk is the position-0 (no rotation) form",
        ),
        config,
    )


ADAPTER = Adapter(
    family="llama",
    model_types=("llama", "mistral", "qwen2"),
    auto_class="causal",
    embed="model.embed_tokens",
    stacks=(
        StackSpec(
            name="",
            layers="model.layers",
            attn="self_attn",
            attn_out="self_attn",
            mlp_out="mlp",
            final_norm="model.norm",
            norms={"attn": "input_layernorm", "mlp": "post_attention_layernorm"},
        ),
    ),
    position="rotary",
    residual="pre_norm",
    head_weights_fn=head_weights,
    logits_fn=lm_head_logits("lm_head"),
    mlp_act_fn=act_from_config("hidden_act"),
    unembed="lm_head",
    limits=sliding_window_limit,  # Mistral, Qwen 2
)


def llama_like(family: str, **changes: Any) -> Adapter:
    """Llama's module layout (``model.layers``, ``self_attn``, ``mlp``, ``input_layernorm``,
    ``post_attention_layernorm``, ``model.norm``, ``lm_head``) for another family, with ``changes``."""
    return dataclasses.replace(ADAPTER, family=family, model_types=(family,), **changes)
