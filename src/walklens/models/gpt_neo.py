"""GPT-Neo: learned absolute positions, separate q/k/v without bias, no 1/sqrt(d) score scaling,
alternating global/local attention layers."""

from __future__ import annotations

from typing import Any

from .base import (
    Adapter,
    HeadWeights,
    HFModule,
    StackSpec,
    act_from_config,
    lm_head_logits,
    split_linear_heads,
    split_out_linear,
)


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    inner = attn.attention if hasattr(attn, "attention") else attn
    H = config.num_heads
    d = config.hidden_size // H
    w_q, b_q = split_linear_heads(inner.q_proj, H, d)
    w_k, b_k = split_linear_heads(inner.k_proj, H, d)
    w_v, b_v = split_linear_heads(inner.v_proj, H, d)
    w_o, b_o = split_out_linear(inner.out_proj, H, d)
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
        1.0,
        notes="GPT-Neo does not scale q·k; local layers see a sliding window",
    )


ADAPTER = Adapter(
    family="gpt_neo",
    model_types=("gpt_neo",),
    auto_class="causal",
    embed="transformer.wte",
    stacks=(
        StackSpec(
            name="",
            layers="transformer.h",
            attn="attn.attention",
            attn_out="attn",
            mlp_out="mlp",
            final_norm="transformer.ln_f",
            norms={"attn": "ln_1", "mlp": "ln_2"},
        ),
    ),
    position="learned",
    residual="pre_norm",
    head_weights_fn=head_weights,
    logits_fn=lm_head_logits("lm_head"),
    n_layers_fn=lambda c: c.num_layers,
    mlp_act_fn=act_from_config("activation_function"),
    unembed="lm_head",
)
