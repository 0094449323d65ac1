"""CodeGen: GPT-J's block (parallel, one ``ln_1``, interleaved partial rotary) with one fused ``qkv_proj`` laid out
for the ``mp_num`` = 4 model-parallel shards it was trained with: its output rows are ``mp_num`` shards, each
[q | v | k] of ``D / mp_num`` rows (note: v before k); a head's features are the concatenated shards' slices."""

from __future__ import annotations

from typing import Any

from .base import HeadWeights, HFModule, split_out_linear, split_rows_heads
from .gptj import rotary_notes, transformer_adapter


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H, D = config.n_head, config.n_embd
    d, mp = D // H, getattr(attn, "mp_num", 4)
    w = attn.qkv_proj.weight.detach().reshape(mp, 3, D // mp, D)  # rows: shard, (q, v, k), local feature
    q, v, k = (w[:, i].reshape(D, D) for i in range(3))  # rows in feature order, as the module reshapes them
    (w_q, b_q), (w_k, b_k), (w_v, b_v) = (split_rows_heads(t, None, H, d) for t in (q, k, v))
    w_o, b_o = split_out_linear(attn.out_proj, H, d)
    return HeadWeights(
        w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, tuple(range(H)), float(attn.scaling), notes=rotary_notes(config)
    )


ADAPTER = transformer_adapter("codegen", head_weights)
