"""Gemma 3 (text): rotary, sandwich norms (the residual receives post_attention_layernorm(attn) and
post_feedforward_layernorm(mlp)), per-head q/k RMSNorm, embeddings scaled by sqrt(D) inside the embedding
module, sliding-window layers, optional soft-capping."""

from __future__ import annotations

from typing import Any

from . import gemma2
from .base import HeadWeights, HFModule, variant
from .heads import config_heads, qk_norm_note


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    return config_heads(attn, config, qk_norm=True, notes=qk_norm_note("RMS-normalised per head"))


def limits(config: Any) -> dict[str, str]:
    got = gemma2.limits(config)
    qk = "q and k are RMS-normalised per head before the dot product"
    return {**got, "qk_bilinear": "; ".join(r for r in (qk, got["qk_bilinear"]) if r)}


#: Gemma 2's module tree and sandwich norms, its soft-cap, embedding scale and harness BOS
ADAPTER = variant(gemma2.ADAPTER, "gemma3", model_types=("gemma3_text",), head_weights_fn=head_weights, limits=limits)
