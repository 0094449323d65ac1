"""GPT-2: learned absolute positions, Conv1D weights (x @ W), fused c_attn = [q | k | v]."""

from __future__ import annotations

import math
from typing import Any

from .base import HeadWeights, HFModule, act_from_config, causal_lm
from .heads import attention_heads


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H = config.n_head
    d = config.n_embd // H
    scale = 1.0 / math.sqrt(d) if getattr(config, "scale_attn_weights", True) else 1.0
    by_layer = getattr(config, "scale_attn_by_inverse_layer_idx", False)
    notes = "scale_attn_by_inverse_layer_idx also divides scores by (layer+1)" if by_layer else ""
    return attention_heads(attn, "c_attn", "c_proj", H, d, scale, conv1d=True, notes=notes)


ADAPTER = causal_lm(
    "gpt2",
    embed="transformer.wte",
    layers="transformer.h",
    attn="attn",
    final_norm="transformer.ln_f",
    norms={"attn": "ln_1", "mlp": "ln_2"},
    position="learned",
    head_weights_fn=head_weights,
    n_layers_fn=lambda c: c.n_layer,
    mlp_act_fn=act_from_config("activation_function"),
)
