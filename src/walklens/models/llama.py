"""Llama (SmolLM2 and relatives): rotary positions, RMSNorm, grouped-query attention.

Its module tree (``model.layers``, ``self_attn``, ``mlp``, ``input_layernorm``, ``post_attention_layernorm``,
``model.norm``, ``lm_head``) is shared by most current families, each a :func:`llama_like` variant of it."""

from __future__ import annotations

from typing import Any

from .base import Adapter, HeadWeights, HFModule, causal_lm, sliding_window_limit, variant
from .heads import config_heads

#: the norms of a parallel block, whose attention and MLP both read the one input norm (Phi, Cohere)
PARALLEL_NORMS = {"attn": "input_layernorm", "mlp": "input_layernorm"}
ROTARY_NOTE = "rotary: W_qk is the position-0 (no rotation) form"


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    return config_heads(attn, config, notes=ROTARY_NOTE)


ADAPTER = causal_lm(
    "llama",
    model_types=("llama", "mistral", "qwen2"),
    embed="model.embed_tokens",
    layers="model.layers",
    attn="self_attn",
    final_norm="model.norm",
    position="rotary",
    head_weights_fn=head_weights,
    limits=sliding_window_limit,  # Mistral, Qwen 2
)


def llama_like(family: str, *, stack: dict[str, Any] | None = None, **changes: Any) -> Adapter:
    """Llama's module tree for another family, with ``changes`` to the adapter's fields and ``stack`` to its
    stack's (:func:`~.base.variant`)."""
    return variant(ADAPTER, family, stack=stack, **changes)
