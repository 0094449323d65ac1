"""OLMo 2: no norm before the sublayers; instead post_attention_layernorm(attn) and
post_feedforward_layernorm(mlp) normalise each sublayer's output before it is added to the residual (so the
contributions are those norms' outputs, and the raw attention projection is ``self_attn``'s output).  q and
k are RMS-normalised over the full width (all heads jointly) before they are split into heads."""

from __future__ import annotations

from typing import Any

from .base import HeadWeights, HFModule
from .gemma2 import SANDWICH
from .heads import config_heads, qk_norm_note
from .llama import llama_like


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    return config_heads(attn, config, qk_norm=True, notes=qk_norm_note("RMS-normalised over all heads jointly"))


ADAPTER = llama_like(
    "olmo2",
    stack=dict(SANDWICH, norms={"attn_post": "post_attention_layernorm", "mlp_post": "post_feedforward_layernorm"}),
    head_weights_fn=head_weights,
    limits={"qk_bilinear": "q and k are RMS-normalised over the full width (all heads jointly)"},
)
