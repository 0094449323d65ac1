"""ALBERT (masked LM): one shared layer applied num_hidden_layers times (the shared-weight case of seed 002),
factorised embeddings (size E, mapped to D by embedding_hidden_mapping_in), post-norm sublayers.  The
'embed' point is the mapped embedding (size D); V itself lives in E-space."""

from __future__ import annotations

from typing import Any

import torch

from . import bert
from .base import HeadWeights, HFModule, variant
from .heads import attention_heads


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H = config.num_attention_heads
    d = config.hidden_size // H
    notes = "post-norm; the same weights serve every layer"
    return attention_heads(attn, ("query", "key", "value"), "dense", H, d, notes=notes)


def logits(model: HFModule, final: torch.Tensor) -> torch.Tensor:
    return model.predictions(final.to(model.predictions.decoder.weight.dtype))


def n_layers(config: Any) -> int:
    if config.num_hidden_groups != 1 or config.inner_group_num != 1:
        from ..base.errors import UnsupportedFamilyError

        raise UnsupportedFamilyError("ALBERT with num_hidden_groups != 1 or inner_group_num != 1 is not supported")
    return config.num_hidden_layers


#: BERT's layer (post-norm sublayers, the attention module ``attention``), one shared layer applied L times
ADAPTER = variant(
    bert.ADAPTER,
    "albert",
    embed="albert.embeddings.word_embeddings",
    stack=dict(
        layers="albert.encoder.albert_layer_groups.0.albert_layers",
        attn_out="attention.dense",
        mlp_out="ffn_output",
        norms={"attn": "attention.LayerNorm", "mlp": "full_layer_layer_norm"},
        embed_point="albert.encoder.embedding_hidden_mapping_in",
        shared_layer=True,
    ),
    head_weights_fn=head_weights,
    logits_fn=logits,
    n_layers_fn=n_layers,
    unembed="predictions.decoder",
)
