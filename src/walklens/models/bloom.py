"""BLOOM: ALiBi positions, fused query_key_value laid out per head as [q_h | k_h | v_h], a LayerNorm
(``word_embeddings_layernorm``) right after the word embeddings, tanh-GELU MLP.

The ``embed`` point is the raw token embedding V[w_t] (eq. 2); ``L0.resid_pre`` is its LayerNorm, which is
what the first block receives (HF's first hidden state).  The attention and MLP modules add the residual
themselves, so their contributions are read at their output projections (``dense``, ``dense_4h_to_h``).
The ALiBi bias is added unscaled, after q.k has been scaled by 1/sqrt(d)."""

from __future__ import annotations

import math
from typing import Any

from ..errors import UnsupportedFamilyError
from .base import Adapter, HeadWeights, HFModule, StackSpec, lm_head_logits, split_fused_qkv, split_out_linear


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H = config.num_attention_heads
    d = config.hidden_size // H
    w_q, b_q, w_k, b_k, w_v, b_v = split_fused_qkv(attn.query_key_value, H, H, d, per_head=True)
    w_o, b_o = split_out_linear(attn.dense, H, d)
    return HeadWeights(
        w_q,
        w_k,
        w_v,
        w_o,
        b_q,
        b_k,
        b_v,
        b_o,
        tuple(range(H)),
        1.0 / math.sqrt(d),
        notes="ALiBi: scores add slope_h * (key - query), unscaled",
    )


def for_config(adapter: Adapter, config: Any) -> Adapter:
    if config.apply_residual_connection_post_layernorm:
        raise UnsupportedFamilyError(
            "BLOOM with apply_residual_connection_post_layernorm is not supported "
            "(its residual stream is the normed input, not the block's input)"
        )
    if config.pretraining_tp > 1 and config.slow_but_exact:
        raise UnsupportedFamilyError(
            "BLOOM with slow_but_exact and pretraining_tp > 1 is not supported (its "
            "output projections are applied slice by slice, not as modules)"
        )
    return adapter


ADAPTER = Adapter(
    family="bloom",
    model_types=("bloom",),
    auto_class="causal",
    embed="transformer.word_embeddings",
    stacks=(
        StackSpec(
            name="",
            layers="transformer.h",
            attn="self_attention",
            attn_out="self_attention.dense",
            mlp_out="mlp.dense_4h_to_h",
            final_norm="transformer.ln_f",
            norms={"attn": "input_layernorm", "mlp": "post_attention_layernorm"},
        ),
    ),
    position="alibi",
    residual="pre_norm",
    head_weights_fn=head_weights,
    logits_fn=lm_head_logits("lm_head"),
    mlp_act_fn=lambda model, layer: model.transformer.h[layer].mlp.gelu_impl,
    unembed="lm_head",
    for_config=for_config,
)
