"""Phi-3 / Phi-4-mini: pre-norm with RMSNorm, grouped-query attention through one fused ``qkv_proj`` whose output
rows are the blocks [q (H*d) | k (H_kv*d) | v (H_kv*d)], a fused ``gate_up_proj`` MLP, rotary (possibly partial,
possibly LongRoPE-scaled); some checkpoints use a sliding window."""

from __future__ import annotations

from typing import Any

from .base import HeadWeights, HFModule
from .heads import attention_heads, rotary_note
from .llama import llama_like


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H, H_kv = config.num_attention_heads, config.num_key_value_heads
    d = getattr(config, "head_dim", None) or config.hidden_size // H
    notes = rotary_note(config)
    return attention_heads(attn, "qkv_proj", "o_proj", H, d, attn.scaling, n_kv=H_kv, notes=notes, rope=config)


def limits(config: Any) -> dict[str, str]:
    window = getattr(config, "sliding_window", None)
    return {"full_attention": f"every layer attends through a sliding window of {window} positions"} if window else {}


ADAPTER = llama_like("phi3", head_weights_fn=head_weights, limits=limits)
