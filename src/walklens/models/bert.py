"""BERT (masked LM): encoder only, learned absolute positions, post-norm sublayers
(resid_mid = LN(resid_pre + attn_out), resid_post = LN(resid_mid + mlp_out)).  There is no final norm:
the 'final' point is the last layer's output and the MLM head (transform + decoder) is the unembedding."""

from __future__ import annotations

import math
from typing import Any

import torch

from .base import Adapter, HeadWeights, HFModule, StackSpec, act_from_config, split_linear_heads, split_out_linear


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    self_attn = attn.self if hasattr(attn, "self") else attn
    H = config.num_attention_heads
    d = config.hidden_size // H
    w_q, b_q = split_linear_heads(self_attn.query, H, d)
    w_k, b_k = split_linear_heads(self_attn.key, H, d)
    w_v, b_v = split_linear_heads(self_attn.value, H, d)
    dense = attn.output.dense if hasattr(attn, "output") else attn.dense
    w_o, b_o = split_out_linear(dense, H, d)
    return HeadWeights(
        w_q,
        w_k,
        w_v,
        w_o,
        b_q,
        b_k,
        b_v,
        b_o,
        tuple(range(H)),
        1.0 / math.sqrt(d),
        notes="post-norm: the attention output is added to the residual before a LayerNorm",
    )


def logits(model: HFModule, final: torch.Tensor) -> torch.Tensor:
    return model.cls(final.to(model.cls.predictions.decoder.weight.dtype))


ADAPTER = Adapter(
    family="bert",
    model_types=("bert",),
    auto_class="masked",
    embed="bert.embeddings.word_embeddings",
    stacks=(
        StackSpec(
            name="",
            layers="bert.encoder.layer",
            attn="attention",
            attn_out="attention.output.dense",
            mlp_out="output.dense",
            mid="attention",
            norms={"attn": "attention.output.LayerNorm", "mlp": "output.LayerNorm"},
            causal=False,
        ),
    ),
    position="learned",
    residual="post_norm",
    head_weights_fn=head_weights,
    logits_fn=logits,
    mlp_act_fn=act_from_config("hidden_act"),
    unembed="cls.predictions.decoder",
)
