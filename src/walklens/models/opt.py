"""OPT: learned absolute positions (the table is offset by 2), separate q/k/v/out projections with the 1/sqrt(d)
scale applied to q, ReLU MLP (fc1, fc2).  ``do_layer_norm_before`` picks pre-norm (most checkpoints) or
post-norm (opt-350m; then there is no final norm and ``final`` is the last layer's output).  When
``word_embed_proj_dim`` != hidden_size (opt-350m), V lives in that smaller E-space: the ``embed`` point is
``project_in``'s output (size D), and the logits are ``lm_head(project_out(final))``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from .base import Adapter, HeadWeights, HFModule, act_from_config, causal_lm
from .heads import QKV_PROJ, attention_heads


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    return attention_heads(attn, QKV_PROJ, "out_proj", attn.num_heads, attn.head_dim, attn.scaling)


def logits(model: HFModule, final: torch.Tensor) -> torch.Tensor:
    proj = model.model.decoder.project_out
    x = final.to(model.lm_head.weight.dtype)
    return model.lm_head(proj(x) if proj is not None else x)


def _pre_norm(config: Any) -> bool:
    return bool(config.do_layer_norm_before)


def for_config(adapter: Adapter, config: Any) -> Adapter:
    spec = adapter.stacks[0]
    if not _pre_norm(config):  # post-norm: the attention sublayer's norm output is the mid residual
        spec = replace(spec, mid="self_attn_layer_norm", final_norm=None)
    elif getattr(config, "_remove_final_layer_norm", False):
        spec = replace(spec, final_norm=None)
    if config.word_embed_proj_dim != config.hidden_size:
        spec = replace(spec, embed_point="model.decoder.project_in")
    return replace(adapter, stacks=(spec,))


ADAPTER = causal_lm(
    "opt",
    embed="model.decoder.embed_tokens",
    layers="model.decoder.layers",
    attn="self_attn",
    mlp_out="fc2",
    final_norm="model.decoder.final_layer_norm",
    norms={"attn": "self_attn_layer_norm", "mlp": "final_layer_norm"},
    position="learned",
    residual=lambda c: "pre_norm" if _pre_norm(c) else "post_norm",
    head_weights_fn=head_weights,
    logits_fn=logits,
    mlp_act_fn=act_from_config("activation_function"),
    for_config=for_config,
)
