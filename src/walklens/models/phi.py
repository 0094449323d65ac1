"""Phi (phi-1, phi-1.5, phi-2): a parallel block whose attention and MLP both read the one input LayerNorm,
partial rotary (the first ``partial_rotary_factor`` of each head), biased q/k/v and an output projection named
``dense``, a biased lm_head; optional per-head q/k LayerNorm (``qk_layernorm``), which makes q·k not bilinear."""

from __future__ import annotations

from typing import Any

from .base import (
    Adapter,
    HeadWeights,
    HFModule,
    StackSpec,
    act_from_config,
    fold_rope_factor,
    lm_head_logits,
    split_linear_heads,
    split_out_linear,
)


def qkv_heads(attn: HFModule, config: Any, out: str, qk_norm: bool = False, notes: str = "") -> HeadWeights:
    """Per-head weights of separate ``q_proj``/``k_proj``/``v_proj`` and the output projection named ``out`` (with
    the rope scaling's cos/sin factor folded in, :func:`~.base.fold_rope_factor`)."""
    H = config.num_attention_heads
    H_kv = getattr(config, "num_key_value_heads", None) or H
    d = getattr(config, "head_dim", None) or config.hidden_size // H
    w_q, b_q = split_linear_heads(attn.q_proj, H, d)
    w_k, b_k = split_linear_heads(attn.k_proj, H_kv, d)
    w_v, b_v = split_linear_heads(attn.v_proj, H_kv, d)
    w_o, b_o = split_out_linear(getattr(attn, out), H, d)
    group = H // H_kv
    return fold_rope_factor(
        HeadWeights(
            w_q,
            w_k,
            w_v,
            w_o,
            b_q,
            b_k,
            b_v,
            b_o,
            tuple(h // group for h in range(H)),
            float(attn.scaling),
            qk_norm=qk_norm,
            notes=notes,
        ),
        config,
    )


def rotary_notes(config: Any, qk_norm: bool) -> str:
    """What a user should know about W_qk of a partial-rotary family (and of its optional q/k norm)."""
    frac = (getattr(config, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0)
    note = f"rotary on the first {frac:.0%} of each head: W_qk is the position-0 (no rotation) form"
    if qk_norm:
        note += (
            "; q and k are LayerNorm-ed per head before the dot product, so W_qk is only a direction-level "
            "summary; W_vo is exact"
        )
    return note


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    qk = bool(getattr(config, "qk_layernorm", False))
    return qkv_heads(attn, config, "dense", qk_norm=qk, notes=rotary_notes(config, qk))


def qk_norm_limits(config: Any) -> dict[str, str]:
    """``qk_bilinear`` is broken when the config normalises q and k per head (``qk_layernorm``)."""
    return (
        {"qk_bilinear": "q and k are LayerNorm-ed per head before the dot product (qk_layernorm)"}
        if getattr(config, "qk_layernorm", False)
        else {}
    )


ADAPTER = Adapter(
    family="phi",
    model_types=("phi",),
    auto_class="causal",
    embed="model.embed_tokens",
    stacks=(
        StackSpec(
            name="",
            layers="model.layers",
            attn="self_attn",
            attn_out="self_attn",
            mlp_out="mlp",
            final_norm="model.final_layernorm",
            norms={"attn": "input_layernorm", "mlp": "input_layernorm"},
        ),
    ),
    position="rotary",
    residual="parallel",
    head_weights_fn=head_weights,
    logits_fn=lm_head_logits("lm_head"),
    mlp_act_fn=act_from_config("hidden_act"),
    unembed="lm_head",
    limits=qk_norm_limits,
)
