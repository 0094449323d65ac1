"""StarCoder 2: rotary, grouped-query attention, LayerNorm with bias (not RMSNorm), a plain two-matrix MLP
(``c_fc``, ``c_proj``), biases on every projection when ``use_bias``, optional sliding window on every layer."""

from __future__ import annotations

from .llama import llama_like

ADAPTER = llama_like("starcoder2")
