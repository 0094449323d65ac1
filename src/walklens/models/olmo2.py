"""OLMo 2: no norm before the sublayers; instead post_attention_layernorm(attn) and
post_feedforward_layernorm(mlp) normalise each sublayer's output before it is added to the residual (so the
contributions are those norms' outputs, and the raw attention projection is ``self_attn``'s output).  q and
k are RMS-normalised over the full width (all heads jointly) before they are split into heads."""

from __future__ import annotations

import dataclasses
from typing import Any

from .base import Adapter, HeadWeights, HFModule, StackSpec, act_from_config, lm_head_logits
from .llama import head_weights as llama_head_weights


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    hw = llama_head_weights(attn, config)
    return dataclasses.replace(
        hw,
        qk_norm=True,
        notes="q and k are RMS-normalised over all heads jointly before the dot product, so W_qk "
        "is only a direction-level summary; W_vo is exact",
    )


ADAPTER = Adapter(
    family="olmo2",
    model_types=("olmo2",),
    auto_class="causal",
    embed="model.embed_tokens",
    stacks=(
        StackSpec(
            name="",
            layers="model.layers",
            attn="self_attn",
            attn_out="post_attention_layernorm",
            mlp_out="post_feedforward_layernorm",
            final_norm="model.norm",
            attn_proj="self_attn",
            norms={"attn_post": "post_attention_layernorm", "mlp_post": "post_feedforward_layernorm"},
        ),
    ),
    position="rotary",
    residual="pre_norm",
    head_weights_fn=head_weights,
    logits_fn=lm_head_logits("lm_head"),
    mlp_act_fn=act_from_config("hidden_act"),
    unembed="lm_head",
    limits={"qk_bilinear": "q and k are RMS-normalised over the full width (all heads jointly)"},
)
