"""GPT-BigCode (SantaCoder, StarCoder): GPT-2's layout with nn.Linear weights, learned absolute positions and
multi-query attention: fused c_attn = [q (H d) | k (d) | v (d)], one key/value head shared by every query
head.  With ``multi_query=False`` c_attn is laid out per head as [q_h | k_h | v_h]."""

from __future__ import annotations

import dataclasses
from typing import Any

from . import gpt2
from .base import HeadWeights, HFModule
from .heads import attention_heads


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    layout = "blocks" if attn.multi_query else "per_head"
    H, d, n_kv = attn.num_heads, attn.head_dim, attn.kv_heads
    return attention_heads(attn, "c_attn", "c_proj", H, d, attn.scaling, n_kv=n_kv, layout=layout)


#: GPT-2's module tree (``transformer.h``, ``attn``, ``mlp``, ``ln_1``/``ln_2``, ``ln_f``, ``lm_head``)
ADAPTER = dataclasses.replace(
    gpt2.ADAPTER, family="gpt_bigcode", model_types=("gpt_bigcode",), head_weights_fn=head_weights
)
