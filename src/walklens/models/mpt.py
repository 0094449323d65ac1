"""MPT: ALiBi positions (slopes 2^(-8 (h+1) / H), added unscaled after q.k * softmax_scale), fused Wqkv laid
out as blocks [q | k | v], no biases anywhere (bias-free LayerNorms too), GELU MLP.  The MLP module adds the
residual itself, so its contribution is read at ``ffn.down_proj``.

``clip_qkv`` clamps q, k and v, so the scores are not bilinear in x (``qk_bilinear``) and the value path is
linear only while nothing is clipped.  transformers' MPT ignores ``qk_ln`` and ``alibi=False``; configs asking
for them are refused, since the loaded model would not compute the checkpoint."""

from __future__ import annotations

from typing import Any

from ..base.errors import UnsupportedFamilyError
from .base import Adapter, HeadWeights, HFModule, causal_lm
from .heads import attention_heads


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H = config.n_heads
    clip = attn.clip_qkv
    notes = "ALiBi: scores add slope_h * (key - query), unscaled" + (
        f"; q, k and v are clamped to +-{clip}" if clip else ""
    )
    return attention_heads(attn, "Wqkv", "out_proj", H, config.d_model // H, attn.softmax_scale, notes=notes)


def limits(config: Any) -> dict[str, str]:
    clip = config.attn_config.clip_qkv
    return {"qk_bilinear": f"q and k are clamped to +-{clip} (clip_qkv)" if clip else ""}


def for_config(adapter: Adapter, config: Any) -> Adapter:
    ac = config.attn_config
    if ac.qk_ln or not ac.alibi:
        raise UnsupportedFamilyError(
            "MPT with qk_ln or without alibi is not supported: transformers' MPT ignores "
            "both, so the loaded model does not compute this checkpoint"
        )
    return adapter


ADAPTER = causal_lm(
    "mpt",
    embed="transformer.wte",
    layers="transformer.blocks",
    attn="attn",
    mlp_out="ffn.down_proj",
    final_norm="transformer.norm_f",
    norms={"attn": "norm_1", "mlp": "norm_2"},
    position="alibi",
    head_weights_fn=head_weights,
    n_layers_fn=lambda c: c.n_layers,
    mlp_act_fn=lambda model, layer: model.transformer.blocks[layer].ffn.act,
    limits=limits,
    for_config=for_config,
)
