"""ALBERT (masked LM): one shared layer applied num_hidden_layers times (the shared-weight case of seed 002),
factorised embeddings (size E, mapped to D by embedding_hidden_mapping_in), post-norm sublayers.  The
'embed' point is the mapped embedding (size D); V itself lives in E-space."""

from __future__ import annotations

import math
from typing import Any

import torch

from .base import Adapter, HeadWeights, HFModule, StackSpec, act_from_config, split_linear_heads, split_out_linear


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H = config.num_attention_heads
    d = config.hidden_size // H
    w_q, b_q = split_linear_heads(attn.query, H, d)
    w_k, b_k = split_linear_heads(attn.key, H, d)
    w_v, b_v = split_linear_heads(attn.value, H, d)
    w_o, b_o = split_out_linear(attn.dense, H, d)
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
        notes="post-norm; the same weights serve every layer",
    )


def logits(model: HFModule, final: torch.Tensor) -> torch.Tensor:
    return model.predictions(final.to(model.predictions.decoder.weight.dtype))


def n_layers(config: Any) -> int:
    if config.num_hidden_groups != 1 or config.inner_group_num != 1:
        from ..errors import UnsupportedFamilyError

        raise UnsupportedFamilyError("ALBERT with num_hidden_groups != 1 or inner_group_num != 1 is not supported")
    return config.num_hidden_layers


ADAPTER = Adapter(
    family="albert",
    model_types=("albert",),
    auto_class="masked",
    embed="albert.embeddings.word_embeddings",
    stacks=(
        StackSpec(
            name="",
            layers="albert.encoder.albert_layer_groups.0.albert_layers",
            attn="attention",
            attn_out="attention.dense",
            mlp_out="ffn_output",
            mid="attention",
            norms={"attn": "attention.LayerNorm", "mlp": "full_layer_layer_norm"},
            embed_point="albert.encoder.embedding_hidden_mapping_in",
            shared_layer=True,
            causal=False,
        ),
    ),
    position="learned",
    residual="post_norm",
    head_weights_fn=head_weights,
    logits_fn=logits,
    n_layers_fn=n_layers,
    mlp_act_fn=act_from_config("hidden_act"),
    unembed="predictions.decoder",
)
