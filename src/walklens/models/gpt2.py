"""GPT-2: learned absolute positions, Conv1D weights (x @ W), fused c_attn = [q | k | v]."""

from __future__ import annotations

import math
from typing import Any

from .base import Adapter, HeadWeights, HFModule, StackSpec, act_from_config, lm_head_logits


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H, D = config.n_head, config.n_embd
    d = D // H
    w = attn.c_attn.weight.detach()  # Conv1D: [D, 3D], used as x @ w
    b = attn.c_attn.bias.detach()
    per = [w[:, i * D : (i + 1) * D].reshape(D, H, d).permute(1, 0, 2).contiguous() for i in range(3)]
    bias = [b[i * D : (i + 1) * D].reshape(H, d) for i in range(3)]
    w_o = attn.c_proj.weight.detach().reshape(H, d, D).contiguous()
    scale = 1.0 / math.sqrt(d) if getattr(config, "scale_attn_weights", True) else 1.0
    notes = (
        "scale_attn_by_inverse_layer_idx also divides scores by (layer+1)"
        if getattr(config, "scale_attn_by_inverse_layer_idx", False)
        else ""
    )
    return HeadWeights(
        per[0],
        per[1],
        per[2],
        w_o,
        bias[0],
        bias[1],
        bias[2],
        attn.c_proj.bias.detach(),
        tuple(range(H)),
        scale,
        notes=notes,
    )


ADAPTER = Adapter(
    family="gpt2",
    model_types=("gpt2",),
    auto_class="causal",
    embed="transformer.wte",
    stacks=(
        StackSpec(
            name="",
            layers="transformer.h",
            attn="attn",
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
    n_layers_fn=lambda c: c.n_layer,
    mlp_act_fn=act_from_config("activation_function"),
    unembed="lm_head",
)
