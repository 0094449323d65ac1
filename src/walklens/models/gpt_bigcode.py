"""GPT-BigCode (SantaCoder, StarCoder): GPT-2's layout with nn.Linear weights, learned absolute positions and
multi-query attention: fused c_attn = [q (H d) | k (d) | v (d)], one key/value head shared by every query
head.  With ``multi_query=False`` c_attn is laid out per head as [q_h | k_h | v_h]."""

from __future__ import annotations

from typing import Any

from torch import nn

from .base import Adapter, HeadWeights, StackSpec, act_from_config, lm_head_logits, split_fused_qkv, split_out_linear


def head_weights(attn: nn.Module, config: Any) -> HeadWeights:
    H, d = attn.num_heads, attn.head_dim
    n_kv = attn.kv_heads
    w_q, b_q, w_k, b_k, w_v, b_v = split_fused_qkv(attn.c_attn, H, n_kv, d, per_head=not attn.multi_query)
    w_o, b_o = split_out_linear(attn.c_proj, H, d)
    return HeadWeights(w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, tuple(h * n_kv // H for h in range(H)),
                       float(attn.scaling))


ADAPTER = Adapter(
    family="gpt_bigcode",
    model_types=("gpt_bigcode",),
    auto_class="causal",
    embed="transformer.wte",
    stacks=(StackSpec(name="", layers="transformer.h", attn="attn", attn_out="attn", mlp_out="mlp",
                      final_norm="transformer.ln_f", norms={"attn": "ln_1", "mlp": "ln_2"}),),
    position="learned",
    residual="pre_norm",
    head_weights_fn=head_weights,
    logits_fn=lm_head_logits("lm_head"),
    n_layers_fn=lambda c: c.n_layer,
    mlp_act_fn=act_from_config("activation_function"),
    unembed="lm_head",
)
