"""Cohere (Command-R): a parallel block (attention and MLP both read one shared input LayerNorm and add to the
residual together), bias-free LayerNorm, rotary positions, logits multiplied by ``config.logit_scale`` after
the unembedding, and optional per-head q/k LayerNorm (``use_qk_norm``, one weight per head)."""

from __future__ import annotations

from typing import Any

from .base import HeadWeights, HFModule, lm_head_logits
from .heads import config_heads, qk_norm_note
from .llama import PARALLEL_NORMS, ROTARY_NOTE, llama_like


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    qk = bool(config.use_qk_norm)
    return config_heads(attn, config, qk_norm=qk, notes=qk_norm_note("LayerNorm-ed per head") if qk else ROTARY_NOTE)


def limits(config: Any) -> dict[str, str]:
    scale = config.logit_scale
    return {
        "qk_bilinear": "q and k are LayerNorm-ed per head before the dot product" if config.use_qk_norm else "",
        "logit_linear": f"logits are multiplied by logit_scale = {scale}" if scale not in (None, 1, 1.0) else "",
    }


ADAPTER = llama_like(
    "cohere",
    stack=dict(norms=PARALLEL_NORMS),
    residual="parallel",
    head_weights_fn=head_weights,
    logits_fn=lm_head_logits("lm_head", scale=("logit_scale", "mul")),  # lm_head(final) * logit_scale
    limits=limits,
)
