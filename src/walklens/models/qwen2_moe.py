"""Qwen 1.5 / Qwen 2 MoE: Llama's layout with q/k/v biases; the MLP of a sparse layer is a mixture of experts
(``mlp``: top-k routed experts plus a shared expert scaled by a sigmoid gate), and its output (the routed sum)
is the MLP point.  Layers in ``mlp_only_layers`` or off the ``decoder_sparse_step`` are dense."""

from __future__ import annotations

from typing import Any

from .base import sliding_window_limit
from .llama import llama_like


def moe_layers(config: Any) -> list[int]:
    """The layers whose MLP is a mixture of experts (the rule of the Qwen MoE decoder layers)."""
    n, step = getattr(config, "num_experts", 0) or 0, getattr(config, "decoder_sparse_step", 1) or 1
    dense = set(getattr(config, "mlp_only_layers", None) or ())
    return [i for i in range(config.num_hidden_layers) if n > 0 and i not in dense and (i + 1) % step == 0]


def moe_limit(config: Any) -> dict[str, str]:
    """``{"dense_mlp": why}`` when some layer's MLP is a mixture of experts, else ``{}``."""
    layers = moe_layers(config)
    if not layers:
        return {}
    shared = " plus a gated shared expert" if getattr(config, "shared_expert_intermediate_size", 0) else ""
    return {
        "dense_mlp": f"the MLP of layers {layers} is the routed sum of the top {config.num_experts_per_tok} "
        f"of {config.num_experts} experts{shared}, chosen per token"
    }


def limits(config: Any) -> dict[str, str]:
    return {**moe_limit(config), **sliding_window_limit(config)}


ADAPTER = llama_like("qwen2_moe", limits=limits)
