"""Mixtral: Mistral's layout (rotary, RMSNorm, grouped-query attention, no biases, optional sliding window on
every layer) with a mixture-of-experts MLP in every layer (``mlp``: the top-k of ``num_local_experts`` gated
experts, routed per token); the MLP point is that block's output, the routed sum."""

from __future__ import annotations

from typing import Any

from .base import Adapter, StackSpec, act_from_config, lm_head_logits, sliding_window_limit
from .llama import head_weights


def limits(config: Any) -> dict[str, str]:
    moe = (f"the MLP of every layer is the routed sum of the top {config.num_experts_per_tok} of "
           f"{config.num_local_experts} experts, chosen per token")
    return {"dense_mlp": moe, **sliding_window_limit(config)}


ADAPTER = Adapter(
    family="mixtral",
    model_types=("mixtral",),
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
