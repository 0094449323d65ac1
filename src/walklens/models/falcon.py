"""Falcon: rotary or ALiBi positions, fused query_key_value (multi-query, grouped 'new decoder
architecture', or per-head [q|k|v]), parallel attention + MLP in most checkpoints."""

from __future__ import annotations

import math
from typing import Any

import torch

from .base import Adapter, HeadWeights, HFModule, StackSpec, act_from_config, lm_head_logits, split_out_linear, zeros_or


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H = config.num_attention_heads
    D = config.hidden_size
    d = D // H
    w = attn.query_key_value.weight.detach()  # [out, D]
    b = zeros_or(attn.query_key_value.bias, w.shape[0], like=w)
    if config.new_decoder_architecture:
        H_kv = config.num_kv_heads
        g = H // H_kv
        wr, br = w.reshape(H_kv, g + 2, d, D), b.reshape(H_kv, g + 2, d)
        w_q, b_q = wr[:, :g].reshape(H, d, D), br[:, :g].reshape(H, d)
        w_k, b_k, w_v, b_v = wr[:, g], br[:, g], wr[:, g + 1], br[:, g + 1]
        kv = tuple(h // g for h in range(H))
    elif config.multi_query:
        wr, br = w.reshape(H + 2, d, D), b.reshape(H + 2, d)
        w_q, b_q = wr[:H], br[:H]
        w_k, b_k, w_v, b_v = wr[H : H + 1], br[H : H + 1], wr[H + 1 :], br[H + 1 :]
        kv = (0,) * H
    else:
        wr, br = w.reshape(H, 3, d, D), b.reshape(H, 3, d)
        w_q, b_q, w_k, b_k, w_v, b_v = wr[:, 0], br[:, 0], wr[:, 1], br[:, 1], wr[:, 2], br[:, 2]
        kv = tuple(range(H))

    def rows(t: torch.Tensor) -> torch.Tensor:  # [n, d, D] -> [n, D, d]
        return t.transpose(1, 2).contiguous()

    w_o, b_o = split_out_linear(attn.dense, H, d)
    return HeadWeights(
        rows(w_q), rows(w_k), rows(w_v), w_o, b_q, b_k.contiguous(), b_v.contiguous(), b_o, kv, 1.0 / math.sqrt(d)
    )


ADAPTER = Adapter(
    family="falcon",
    model_types=("falcon",),
    auto_class="causal",
    embed="transformer.word_embeddings",
    stacks=(
        StackSpec(
            name="",
            layers="transformer.h",
            attn="self_attention",
            attn_out="self_attention",
            mlp_out="mlp",
            final_norm="transformer.ln_f",
            norms={"attn": "ln_attn|input_layernorm", "mlp": "ln_mlp|post_attention_layernorm|input_layernorm"},
        ),
    ),
    position=lambda c: "alibi" if c.alibi else "rotary",
    residual=lambda c: "parallel" if (c.new_decoder_architecture or c.parallel_attn) else "pre_norm",
    head_weights_fn=head_weights,
    logits_fn=lm_head_logits("lm_head"),
    mlp_act_fn=act_from_config("activation"),
    unembed="lm_head",
)
