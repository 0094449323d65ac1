"""T5 / Flan-T5: encoder and decoder stacks, learned relative position buckets (the position kernels of
seed 000, A.2) added in layer 0 and shared by all layers, no 1/sqrt(d) scaling, no biases, RMS-style norms.
The decoder's lm_head scales its input by d_model**-0.5 when embeddings are tied."""

from __future__ import annotations

from typing import Any

import torch

from .base import Adapter, HeadWeights, HFModule, StackSpec, act_from_config
from .heads import attention_heads


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    notes = "T5 does not scale q·k; a relative position bias is added to the scores"
    return attention_heads(attn, ("q", "k", "v"), "o", config.num_heads, config.d_kv, 1.0, notes=notes)


def logits(model: HFModule, final: torch.Tensor) -> torch.Tensor:
    x = final.to(model.lm_head.weight.dtype)
    if model.config.tie_word_embeddings:
        x = x * (model.config.d_model**-0.5)
    return model.lm_head(x)


def _stack(side: str, mlp: int, **cross: Any) -> StackSpec:
    """The ``encoder``'s or ``decoder``'s stack: sublayer 0 is the self-attention, sublayer ``mlp`` the feed-forward
    network, and sublayer 1 of the decoder the cross-attention (``cross``: its fields)."""
    norms = {"attn": "layer.0.layer_norm", **({"cross": "layer.1.layer_norm"} if cross else {})}
    return StackSpec(
        name=side[:3],
        layers=f"{side}.block",
        attn="layer.0.SelfAttention",
        attn_out="layer.0.SelfAttention",
        mlp_out=f"layer.{mlp}.DenseReluDense",
        final_norm=f"{side}.final_layer_norm",
        norms={**norms, "mlp": f"layer.{mlp}.layer_norm"},
        embed_point=f"{side}.embed_tokens",
        causal=side == "decoder",
        **cross,
    )


_ENC = _stack("encoder", 1)
_DEC = _stack("decoder", 2, cross_attn="layer.1.EncDecAttention", cross_out="layer.1.EncDecAttention")

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
