"""Phi-3 / Phi-4-mini: pre-norm with RMSNorm, grouped-query attention through one fused ``qkv_proj`` whose output
rows are the blocks [q (H*d) | k (H_kv*d) | v (H_kv*d)], a fused ``gate_up_proj`` MLP, rotary (possibly partial,
possibly LongRoPE-scaled); some checkpoints use a sliding window."""

from __future__ import annotations

from typing import Any

from .base import HeadWeights, HFModule, fold_rope_factor, split_out_linear, split_rows_heads
from .llama import llama_like


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H, H_kv = config.num_attention_heads, config.num_key_value_heads
    d = getattr(config, "head_dim", None) or config.hidden_size // H
    sizes = [H * d, H_kv * d, H_kv * d]
    w = attn.qkv_proj.weight.split(sizes)
    b = attn.qkv_proj.bias.split(sizes) if attn.qkv_proj.bias is not None else (None,) * 3
    (w_q, b_q), (w_k, b_k), (w_v, b_v) = (split_rows_heads(w[i], b[i], n, d) for i, n in enumerate((H, H_kv, H_kv)))
    w_o, b_o = split_out_linear(attn.o_proj, H, d)
    group = H // H_kv
    frac = (getattr(config, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0)
    hw = HeadWeights(
        w_q,
        w_k,
        w_v,
        w_o,
        b_q,
        b_k,
        b_v,
        b_o,
        tuple(h // group for h in range(H)),
        float(attn.scaling),
        notes=f"rotary on the first {frac:.0%} of each head: W_qk is the position-0 (no rotation) form",
    )
    return fold_rope_factor(hw, config)


def limits(config: Any) -> dict[str, str]:
    window = getattr(config, "sliding_window", None)
    return {"full_attention": f"every layer attends through a sliding window of {window} positions"} if window else {}


ADAPTER = llama_like("phi3", head_weights_fn=head_weights, limits=limits)
