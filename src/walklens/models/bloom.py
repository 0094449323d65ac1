"""BLOOM: ALiBi positions, fused query_key_value laid out per head as [q_h | k_h | v_h], a LayerNorm
(``word_embeddings_layernorm``) right after the word embeddings, tanh-GELU MLP.

The ``embed`` point is the raw token embedding V[w_t] (eq. 2); ``L0.resid_pre`` is its LayerNorm, which is
what the first block receives (HF's first hidden state).  The attention and MLP modules add the residual
themselves, so their contributions are read at their output projections (``dense``, ``dense_4h_to_h``).
The ALiBi bias is added unscaled, after q.k has been scaled by 1/sqrt(d)."""

from __future__ import annotations

from typing import Any

from ..base.errors import UnsupportedFamilyError
from .base import Adapter, HeadWeights, HFModule, Tree, causal_lm
from .heads import attention_heads


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H = config.num_attention_heads
    d = config.hidden_size // H
    notes = "ALiBi: scores add slope_h * (key - query), unscaled"
    return attention_heads(attn, "query_key_value", "dense", H, d, layout="per_head", notes=notes)


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


#: BLOOM's module tree, which Falcon keeps
TREE = Tree(
    embed="transformer.word_embeddings", layers="transformer.h", attn="self_attention", final_norm="transformer.ln_f"
)

ADAPTER = causal_lm(
    "bloom",
    **TREE,
    attn_out="self_attention.dense",
    mlp_out="mlp.dense_4h_to_h",
    position="alibi",
    head_weights_fn=head_weights,
    mlp_act_fn=lambda model, layer: model.transformer.h[layer].mlp.gelu_impl,
    for_config=for_config,
)
