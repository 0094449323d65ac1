"""GPT-Neo: learned absolute positions, separate q/k/v without bias, no 1/sqrt(d) score scaling,
alternating global/local attention layers."""

from __future__ import annotations

from typing import Any

from . import gpt2
from .base import HeadWeights, HFModule, variant
from .heads import QKV_PROJ, attention_heads


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    inner = attn.attention if hasattr(attn, "attention") else attn
    H = config.num_heads
    notes = "GPT-Neo does not scale q·k; local layers see a sliding window"
    return attention_heads(inner, QKV_PROJ, "out_proj", H, config.hidden_size // H, 1.0, notes=notes)


#: GPT-2's module tree, the attention module one level down (``attn.attention``)
ADAPTER = variant(
    gpt2.ADAPTER,
    "gpt_neo",
    stack=dict(attn="attn.attention"),
    head_weights_fn=head_weights,
    n_layers_fn=lambda c: c.num_layers,
)
