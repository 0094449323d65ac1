"""Falcon: BLOOM's module tree (:data:`.bloom.TREE`), rotary or ALiBi positions, fused query_key_value
(multi-query, grouped 'new decoder architecture', or per-head [q|k|v]), parallel attention + MLP in most
checkpoints."""

from __future__ import annotations

from typing import Any

from . import bloom
from .base import HeadWeights, HFModule, act_from_config, causal_lm
from .heads import attention_heads


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H = config.num_attention_heads
    d = config.hidden_size // H
    if config.new_decoder_architecture:  # per key/value group [q ... q | k | v]
        layout, n_kv = "grouped", config.num_kv_heads
    elif config.multi_query:  # [q (H d) | k (d) | v (d)]
        layout, n_kv = "blocks", 1
    else:
        layout, n_kv = "per_head", H
    return attention_heads(attn, "query_key_value", "dense", H, d, n_kv=n_kv, layout=layout)


ADAPTER = causal_lm(
    "falcon",
    **bloom.TREE,
    norms={"attn": "ln_attn|input_layernorm", "mlp": "ln_mlp|post_attention_layernorm|input_layernorm"},
    position=lambda c: "alibi" if c.alibi else "rotary",
    residual=lambda c: "parallel" if (c.new_decoder_architecture or c.parallel_attn) else "pre_norm",
    head_weights_fn=head_weights,
    mlp_act_fn=act_from_config("activation"),
)
