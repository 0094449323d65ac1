"""Gemma (1): Llama-like pre-norm layers with GeGLU feed-forward (``gelu_pytorch_tanh``), RMSNorm scaling by
``1 + weight``, and token embeddings multiplied by sqrt(D) inside the embedding module (so the captured
``embed`` point is the scaled vector, V row times sqrt(D)).  lm-evaluation-harness prefixes its inputs with BOS."""

from __future__ import annotations

from .llama import llama_like

ADAPTER = llama_like("gemma", embed_scale_fn=lambda c: float(c.hidden_size) ** 0.5, harness_bos=True)
