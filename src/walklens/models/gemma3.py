"""Gemma 3 (text): rotary, sandwich norms (the residual receives post_attention_layernorm(attn) and
post_feedforward_layernorm(mlp)), per-head q/k RMSNorm, embeddings scaled by sqrt(D) inside the embedding
module, sliding-window layers, optional soft-capping."""

from __future__ import annotations

from typing import Any

from torch import nn

from .base import Adapter, HeadWeights, StackSpec, act_from_config, lm_head_logits
from .gemma2 import limits as gemma2_limits
from .llama import head_weights as llama_head_weights


def head_weights(attn: nn.Module, config: Any) -> HeadWeights:
    hw = llama_head_weights(attn, config)
    return HeadWeights(hw.w_q, hw.w_k, hw.w_v, hw.w_o, hw.b_q, hw.b_k, hw.b_v, hw.b_o, hw.kv_head, hw.scale,
                       qk_norm=True,
                       notes="q and k are RMS-normalised per head before the dot product, so W_qk is only "
                             "a direction-level summary; W_vo is exact")


def limits(config: Any) -> dict[str, str]:
    got = gemma2_limits(config)
    qk = "q and k are RMS-normalised per head before the dot product"
    return {**got, "qk_bilinear": "; ".join(r for r in (qk, got["qk_bilinear"]) if r)}


ADAPTER = Adapter(
    family="gemma3",
    model_types=("gemma3_text",),
    auto_class="causal",
    embed="model.embed_tokens",
    stacks=(StackSpec(name="", layers="model.layers", attn="self_attn", attn_out="post_attention_layernorm",
                      mlp_out="post_feedforward_layernorm", final_norm="model.norm", attn_proj="self_attn",
                      norms={"attn": "input_layernorm", "attn_post": "post_attention_layernorm",
                             "mlp": "pre_feedforward_layernorm", "mlp_post": "post_feedforward_layernorm"}),),
    position="rotary",
    residual="pre_norm",
    head_weights_fn=head_weights,
    logits_fn=lm_head_logits("lm_head", softcap_attr="final_logit_softcapping"),
    mlp_act_fn=act_from_config("hidden_activation"),
    unembed="lm_head",
    embed_scale_fn=lambda c: float(c.hidden_size) ** 0.5,
    limits=limits,
)
