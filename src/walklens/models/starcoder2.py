"""StarCoder 2: rotary, grouped-query attention, LayerNorm with bias (not RMSNorm), a plain two-matrix MLP
(``c_fc``, ``c_proj``), biases on every projection when ``use_bias``, optional sliding window on every layer."""

from __future__ import annotations

from .base import Adapter, StackSpec, act_from_config, lm_head_logits, sliding_window_limit
from .llama import head_weights

ADAPTER = Adapter(
    family="starcoder2",
    model_types=("starcoder2",),
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
    limits=sliding_window_limit,
)
