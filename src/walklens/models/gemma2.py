"""Gemma 2: sandwich norms as in Gemma 3 (the residual receives post_attention_layernorm(attn) and
post_feedforward_layernorm(mlp)), GeGLU, embeddings scaled by sqrt(D) inside the embedding module, query
scale ``query_pre_attn_scalar ** -0.5``, sliding-window attention on alternate layers, and soft-capping of
the attention scores (``cap * tanh(s / cap)`` before the softmax) and of the final logits.

The A.3 identity holds (it reads the captured probabilities); q·k is not bilinear under the attention cap.
"""

from __future__ import annotations

from typing import Any

from .base import HeadWeights, HFModule, act_from_config, lm_head_logits, sliding_window_limit
from .heads import config_heads
from .llama import ROTARY_NOTE, llama_like


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    cap = getattr(config, "attn_logit_softcapping", None)
    capped = f"scores are soft-capped ({cap} * tanh(s / {cap})) before the softmax, so W_qk gives the pre-cap score"
    return config_heads(attn, config, notes=f"{capped}; W_vo is exact" if cap else ROTARY_NOTE)


def limits(config: Any) -> dict[str, str]:
    """Soft-capped scores or logits and sliding-window layers, where the config has them (Gemma 2 and 3)."""
    attn_cap = getattr(config, "attn_logit_softcapping", None)
    final_cap = getattr(config, "final_logit_softcapping", None)
    return {
        "qk_bilinear": f"attention scores are soft-capped: {attn_cap} * tanh(s / {attn_cap})" if attn_cap else "",
        "logit_linear": f"final logits are soft-capped: {final_cap} * tanh(z / {final_cap})" if final_cap else "",
        **sliding_window_limit(config),
    }


#: Llama's module tree with sandwich norms: each sublayer's output normed before it is added to the residual
SANDWICH = dict(
    attn_out="post_attention_layernorm",
    mlp_out="post_feedforward_layernorm",
    attn_proj="self_attn",
)

ADAPTER = llama_like(
    "gemma2",
    stack=dict(
        SANDWICH,
        norms={
            "attn": "input_layernorm",
            "attn_post": "post_attention_layernorm",
            "mlp": "pre_feedforward_layernorm",
            "mlp_post": "post_feedforward_layernorm",
        },
    ),
    head_weights_fn=head_weights,
    logits_fn=lm_head_logits("lm_head", softcap_attr="final_logit_softcapping"),
    mlp_act_fn=act_from_config("hidden_activation"),
    embed_scale_fn=lambda c: float(c.hidden_size) ** 0.5,
    limits=limits,
    harness_bos=True,  # lm-evaluation-harness prefixes Gemma's inputs with BOS
)
