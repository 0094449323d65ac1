"""GPT-NeoX / Pythia: rotary positions, fused query_key_value laid out per head as [q_h | k_h | v_h],
parallel attention + MLP residual when ``use_parallel_residual``."""

from __future__ import annotations

from typing import Any

from .base import HeadWeights, HFModule, causal_lm
from .heads import attention_heads


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H = config.num_attention_heads
    d = config.hidden_size // H
    notes = f"rotary on the first {getattr(config, 'rotary_pct', 1.0):.0%} of each head"
    return attention_heads(attn, "query_key_value", "dense", H, d, layout="per_head", notes=notes)


ADAPTER = causal_lm(
    "gpt_neox",
    embed="gpt_neox.embed_in",
    layers="gpt_neox.layers",
    attn="attention",
    final_norm="gpt_neox.final_layer_norm",
    position="rotary",
    residual=lambda c: "parallel" if c.use_parallel_residual else "pre_norm",
    head_weights_fn=head_weights,
)
