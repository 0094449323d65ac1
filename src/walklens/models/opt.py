"""OPT: learned absolute positions (the table is offset by 2), separate q/k/v/out projections with the 1/sqrt(d)
scale applied to q, ReLU MLP (fc1, fc2).  ``do_layer_norm_before`` picks pre-norm (most checkpoints) or
post-norm (opt-350m; then there is no final norm and ``final`` is the last layer's output).  When
``word_embed_proj_dim`` != hidden_size (opt-350m), V lives in that smaller E-space: the ``embed`` point is
``project_in``'s output (size D), and the logits are ``lm_head(project_out(final))``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from .base import Adapter, HeadWeights, HFModule, StackSpec, act_from_config, split_linear_heads, split_out_linear


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    H, d = attn.num_heads, attn.head_dim
    w_q, b_q = split_linear_heads(attn.q_proj, H, d)
    w_k, b_k = split_linear_heads(attn.k_proj, H, d)
    w_v, b_v = split_linear_heads(attn.v_proj, H, d)
    w_o, b_o = split_out_linear(attn.out_proj, H, d)
    return HeadWeights(w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, tuple(range(H)), float(attn.scaling))


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


ADAPTER = Adapter(
    family="opt",
    model_types=("opt",),
    auto_class="causal",
    embed="model.decoder.embed_tokens",
    stacks=(
        StackSpec(
            name="",
            layers="model.decoder.layers",
            attn="self_attn",
            attn_out="self_attn",
            mlp_out="fc2",
            final_norm="model.decoder.final_layer_norm",
            norms={"attn": "self_attn_layer_norm", "mlp": "final_layer_norm"},
        ),
    ),
    position="learned",
    residual=lambda c: "pre_norm" if _pre_norm(c) else "post_norm",
    head_weights_fn=head_weights,
    logits_fn=logits,
    mlp_act_fn=act_from_config("activation_function"),
    unembed="lm_head",
    for_config=for_config,
)
