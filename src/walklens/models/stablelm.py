"""StableLM (stablelm-2, stablelm-3b-4e1t): partial rotary, LayerNorm, grouped-query attention with optional
q/k/v biases; a parallel block (attention and MLP both read input_layernorm, no post-attention norm) when
``use_parallel_residual``, else pre-norm; optional per-head q/k LayerNorm (``qk_layernorm``)."""

from __future__ import annotations

from typing import Any

from .base import HeadWeights, HFModule
from .llama import llama_like
from .phi import partial_rotary_heads, qk_norm_limits


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    return partial_rotary_heads(attn, config, "o_proj")


ADAPTER = llama_like(
    "stablelm",
    stack=dict(norms={"attn": "input_layernorm", "mlp": "post_attention_layernorm|input_layernorm"}),
    residual=lambda c: "parallel" if c.use_parallel_residual else "pre_norm",
    head_weights_fn=head_weights,
    limits=qk_norm_limits,
)
