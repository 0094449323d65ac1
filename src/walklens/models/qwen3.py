"""Qwen 3 (dense): Llama's layout (rotary, RMSNorm, grouped-query attention, gated MLP) plus a per-head RMSNorm
of q and of k (``q_norm``/``k_norm``, over the head dimension) before rotary, so the scores are not bilinear in
x; optional sliding-window layers (``use_sliding_window``: layers from ``max_window_layers`` on)."""

from __future__ import annotations

from typing import Any

from .base import sliding_window_limit
from .gemma3 import head_weights
from .llama import llama_like

QK_NORM = "q and k are RMS-normalised per head (q_norm, k_norm) before the dot product"


def limits(config: Any) -> dict[str, str]:
    return {"qk_bilinear": QK_NORM, **sliding_window_limit(config)}


ADAPTER = llama_like("qwen3", head_weights_fn=head_weights, limits=limits)
