"""GPT-NeoX / Pythia: rotary positions, fused query_key_value laid out per head as [q_h | k_h | v_h],
parallel attention + MLP residual when ``use_parallel_residual``."""

from __future__ import annotations

import math
from typing import Any

from .base import Adapter, HeadWeights, HFModule, StackSpec, act_from_config, lm_head_logits, split_out_linear, zeros_or


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H = config.num_attention_heads
    D = config.hidden_size
    d = D // H
    w = attn.query_key_value.weight.detach().reshape(H, 3, d, D)  # rows: head, (q,k,v), d
    b = zeros_or(attn.query_key_value.bias, H, 3, d, like=w)
    per = [w[:, i].transpose(1, 2).contiguous() for i in range(3)]
    w_o, b_o = split_out_linear(attn.dense, H, d)
    return HeadWeights(
        per[0],
        per[1],
        per[2],
        w_o,
        b[:, 0],
        b[:, 1],
        b[:, 2],
        b_o,
        tuple(range(H)),
        1.0 / math.sqrt(d),
        notes=f"rotary on the first {getattr(config, 'rotary_pct', 1.0):.0%} of each head",
    )


ADAPTER = Adapter(
    family="gpt_neox",
    model_types=("gpt_neox",),
    auto_class="causal",
    embed="gpt_neox.embed_in",
    stacks=(
        StackSpec(
            name="",
            layers="gpt_neox.layers",
            attn="attention",
            attn_out="attention",
            mlp_out="mlp",
            final_norm="gpt_neox.final_layer_norm",
            norms={"attn": "input_layernorm", "mlp": "post_attention_layernorm"},
        ),
    ),
    position="rotary",
    residual=lambda c: "parallel" if c.use_parallel_residual else "pre_norm",
    head_weights_fn=head_weights,
    logits_fn=lm_head_logits("lm_head"),
    mlp_act_fn=act_from_config("hidden_act"),
    unembed="lm_head",
)
