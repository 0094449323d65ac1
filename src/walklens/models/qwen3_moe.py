"""Qwen 3 MoE: Qwen 3's attention (per-head q/k RMSNorm) with a mixture-of-experts MLP (top-k routed experts,
no shared expert) on the sparse layers, whose output (the routed sum) is the MLP point; dense layers follow the
Qwen MoE rule (``mlp_only_layers``, ``decoder_sparse_step``).  A sliding window, when used, is on every layer."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .base import sliding_window_limit
from .qwen2_moe import moe_limit
from .qwen3 import ADAPTER as QWEN3
from .qwen3 import QK_NORM


def limits(config: Any) -> dict[str, str]:
    return {"qk_bilinear": QK_NORM, **moe_limit(config), **sliding_window_limit(config)}


ADAPTER = replace(QWEN3, family="qwen3_moe", model_types=("qwen3_moe",), limits=limits)
