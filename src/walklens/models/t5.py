"""T5 / Flan-T5: encoder and decoder stacks, learned relative position buckets (the position kernels of
seed 000, A.2) added in layer 0 and shared by all layers, no 1/sqrt(d) scaling, no biases, RMS-style norms.
The decoder's lm_head scales its input by d_model**-0.5 when embeddings are tied."""

from __future__ import annotations

from typing import Any

import torch

from .base import Adapter, HeadWeights, HFModule, StackSpec, act_from_config, split_linear_heads, split_out_linear


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H, d = config.num_heads, config.d_kv
    w_q, b_q = split_linear_heads(attn.q, H, d)
    w_k, b_k = split_linear_heads(attn.k, H, d)
    w_v, b_v = split_linear_heads(attn.v, H, d)
    w_o, b_o = split_out_linear(attn.o, H, d)
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
        1.0,
        notes="T5 does not scale q·k; a relative position bias is added to the scores",
    )


def logits(model: HFModule, final: torch.Tensor) -> torch.Tensor:
    x = final.to(model.lm_head.weight.dtype)
    if model.config.tie_word_embeddings:
        x = x * (model.config.d_model**-0.5)
    return model.lm_head(x)


_ENC = StackSpec(
    name="enc",
    layers="encoder.block",
    attn="layer.0.SelfAttention",
    attn_out="layer.0.SelfAttention",
    mlp_out="layer.1.DenseReluDense",
    final_norm="encoder.final_layer_norm",
    norms={"attn": "layer.0.layer_norm", "mlp": "layer.1.layer_norm"},
    embed_point="encoder.embed_tokens",
    causal=False,
)
_DEC = StackSpec(
    name="dec",
    layers="decoder.block",
    attn="layer.0.SelfAttention",
    attn_out="layer.0.SelfAttention",
    cross_attn="layer.1.EncDecAttention",
    cross_out="layer.1.EncDecAttention",
    mlp_out="layer.2.DenseReluDense",
    final_norm="decoder.final_layer_norm",
    norms={"attn": "layer.0.layer_norm", "cross": "layer.1.layer_norm", "mlp": "layer.2.layer_norm"},
    embed_point="decoder.embed_tokens",
)

ADAPTER = Adapter(
    family="t5",
    model_types=("t5",),
    auto_class="seq2seq",
    embed="encoder.embed_tokens",  # the token embeddings (tied to the model's `shared` module: the same weight)
    stacks=(_ENC, _DEC),
    position="t5_relative",
    residual="pre_norm",
    head_weights_fn=head_weights,
    logits_fn=logits,
    n_layers_fn=lambda c: c.num_layers,
    mlp_act_fn=act_from_config("dense_act_fn"),
    unembed="lm_head",
)
