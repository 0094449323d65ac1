"""GPT-BigCode (SantaCoder, StarCoder): GPT-2's layout with nn.Linear weights, learned absolute positions and
multi-query attention: fused c_attn = [q (H d) | k (d) | v (d)], one key/value head shared by every query
head.  With ``multi_query=False`` c_attn is laid out per head as [q_h | k_h | v_h]."""

from __future__ import annotations

import dataclasses
from typing import Any

from . import gpt2
from .base import HeadWeights, HFModule, split_fused_qkv, split_out_linear


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H, d = attn.num_heads, attn.head_dim
    n_kv = attn.kv_heads
    w_q, b_q, w_k, b_k, w_v, b_v = split_fused_qkv(attn.c_attn, H, n_kv, d, per_head=not attn.multi_query)
    w_o, b_o = split_out_linear(attn.c_proj, H, d)
    return HeadWeights(
        w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, tuple(h * n_kv // H for h in range(H)), float(attn.scaling)
    )


#: GPT-2's module tree (``transformer.h``, ``attn``, ``mlp``, ``ln_1``/``ln_2``, ``ln_f``, ``lm_head``)
ADAPTER = dataclasses.replace(
    gpt2.ADAPTER, family="gpt_bigcode", model_types=("gpt_bigcode",), head_weights_fn=head_weights
)
