"""Mixtral: Mistral's layout (rotary, RMSNorm, grouped-query attention, no biases, optional sliding window on
every layer) with a mixture-of-experts MLP in every layer (``mlp``: the top-k of ``num_local_experts`` gated
experts, routed per token); the MLP point is that block's output, the routed sum."""

from __future__ import annotations

from typing import Any

from .base import sliding_window_limit
from .llama import llama_like


def limits(config: Any) -> dict[str, str]:
    moe = (
        f"the MLP of every layer is the routed sum of the top {config.num_experts_per_tok} of "
        f"{config.num_local_experts} experts, chosen per token"
    )
    return {"dense_mlp": moe, **sliding_window_limit(config)}


ADAPTER = llama_like("mixtral", limits=limits)
