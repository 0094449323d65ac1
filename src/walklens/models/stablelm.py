"""StableLM (stablelm-2, stablelm-3b-4e1t): partial rotary, LayerNorm, grouped-query attention with optional
q/k/v biases; a parallel block (attention and MLP both read input_layernorm, no post-attention norm) when
``use_parallel_residual``, else pre-norm; optional per-head q/k LayerNorm (``qk_layernorm``)."""

from __future__ import annotations

from typing import Any

from .base import Adapter, HeadWeights, HFModule, StackSpec, act_from_config, lm_head_logits
from .phi import qk_norm_limits, qkv_heads, rotary_notes


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    qk = bool(getattr(config, "qk_layernorm", False))
    return qkv_heads(attn, config, "o_proj", qk_norm=qk, notes=rotary_notes(config, qk))


ADAPTER = Adapter(
    family="stablelm",
    model_types=("stablelm",),
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
            norms={"attn": "input_layernorm", "mlp": "post_attention_layernorm|input_layernorm"},
        ),
    ),
    position="rotary",
    residual=lambda c: "parallel" if c.use_parallel_residual else "pre_norm",
    head_weights_fn=head_weights,
    logits_fn=lm_head_logits("lm_head"),
    mlp_act_fn=act_from_config("hidden_act"),
    unembed="lm_head",
    limits=qk_norm_limits,
)
