"""Cohere (Command-R): a parallel block (attention and MLP both read one shared input LayerNorm and add to the
residual together), bias-free LayerNorm, rotary positions, logits multiplied by ``config.logit_scale`` after
the unembedding, and optional per-head q/k LayerNorm (``use_qk_norm``, one weight per head)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .base import Adapter, HeadWeights, HFModule, StackSpec, act_from_config, lm_head_logits
from .llama import head_weights as llama_head_weights

_head = lm_head_logits("lm_head")


def logits(model: HFModule, final: torch.Tensor) -> torch.Tensor:
    """``lm_head(final) * logit_scale``, as the model computes them."""
    return _head(model, final) * model.config.logit_scale


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    hw = llama_head_weights(attn, config)
    if not config.use_qk_norm:
        return hw
    return dataclasses.replace(
        hw,
        qk_norm=True,
        notes="q and k are LayerNorm-ed per head before the dot product, so W_qk is only a "
        "direction-level summary; W_vo is exact",
    )


def limits(config: Any) -> dict[str, str]:
    scale = config.logit_scale
    return {
        "qk_bilinear": "q and k are LayerNorm-ed per head before the dot product" if config.use_qk_norm else "",
        "logit_linear": f"logits are multiplied by logit_scale = {scale}" if scale not in (None, 1, 1.0) else "",
    }


ADAPTER = Adapter(
    family="cohere",
    model_types=("cohere",),
    auto_class="causal",
    embed="model.embed_tokens",
    stacks=(
        StackSpec(
            name="",
            layers="model.layers",
            attn="self_attn",
            attn_out="self_attn",
            mlp_out="mlp",
            final_norm="model.norm",
            norms={"attn": "input_layernorm", "mlp": "input_layernorm"},
        ),
    ),
    position="rotary",
    residual="parallel",
    head_weights_fn=head_weights,
    logits_fn=logits,
    mlp_act_fn=act_from_config("hidden_act"),
    unembed="lm_head",
    limits=limits,
)
