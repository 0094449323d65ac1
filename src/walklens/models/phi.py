"""Phi (phi-1, phi-1.5, phi-2): a parallel block whose attention and MLP both read the one input LayerNorm,
partial rotary (the first ``partial_rotary_factor`` of each head), biased q/k/v and an output projection named
``dense``, a biased lm_head; optional per-head q/k LayerNorm (``qk_layernorm``), which makes q·k not bilinear."""

from __future__ import annotations

from typing import Any

from .base import HeadWeights, HFModule
from .heads import config_heads, qk_norm_note, rotary_note
from .llama import PARALLEL_NORMS, llama_like


def partial_rotary_heads(attn: HFModule, config: Any, out: str) -> HeadWeights:
    """The heads of a partial-rotary family (:func:`~.heads.config_heads`), with its optional per-head q/k
    LayerNorm (``qk_layernorm``)."""
    qk = bool(getattr(config, "qk_layernorm", False))
    notes = rotary_note(config) + ("; " + qk_norm_note("LayerNorm-ed per head") if qk else "")
    return config_heads(attn, config, out, qk_norm=qk, notes=notes)


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    return partial_rotary_heads(attn, config, "dense")


def qk_norm_limits(config: Any) -> dict[str, str]:
    """``qk_bilinear`` is broken when the config normalises q and k per head (``qk_layernorm``)."""
    return (
        {"qk_bilinear": "q and k are LayerNorm-ed per head before the dot product (qk_layernorm)"}
        if getattr(config, "qk_layernorm", False)
        else {}
    )


ADAPTER = llama_like(
    "phi",
    stack=dict(final_norm="model.final_layernorm", norms=PARALLEL_NORMS),
    residual="parallel",
    head_weights_fn=head_weights,
    limits=qk_norm_limits,
)
