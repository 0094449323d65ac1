"""BERT (masked LM): encoder only, learned absolute positions, post-norm sublayers
(resid_mid = LN(resid_pre + attn_out), resid_post = LN(resid_mid + mlp_out)).  There is no final norm:
the 'final' point is the last layer's output and the MLM head (transform + decoder) is the unembedding."""

from __future__ import annotations

from typing import Any

import torch

from .base import Adapter, HeadWeights, HFModule, StackSpec, act_from_config
from .heads import attention_heads


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H = config.num_attention_heads
    d = config.hidden_size // H
    inner = "self." if hasattr(attn, "self") else ""
    qkv = (f"{inner}query", f"{inner}key", f"{inner}value")
    out = "output.dense" if hasattr(attn, "output") else "dense"
    notes = "post-norm: the attention output is added to the residual before a LayerNorm"
    return attention_heads(attn, qkv, out, H, d, notes=notes)


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
