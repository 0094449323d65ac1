"""Gemma (1): Llama-like pre-norm layers with GeGLU feed-forward (``gelu_pytorch_tanh``), RMSNorm scaling by
``1 + weight``, and token embeddings multiplied by sqrt(D) inside the embedding module (so the captured
``embed`` point is the scaled vector, V row times sqrt(D))."""

from __future__ import annotations

from .base import Adapter, StackSpec, act_from_config, lm_head_logits
from .llama import head_weights

ADAPTER = Adapter(
    family="gemma",
    model_types=("gemma",),
    auto_class="causal",
    embed="model.embed_tokens",
    stacks=(StackSpec(name="", layers="model.layers", attn="self_attn", attn_out="self_attn", mlp_out="mlp",
                      final_norm="model.norm",
                      norms={"attn": "input_layernorm", "mlp": "post_attention_layernorm"}),),
    position="rotary",
    residual="pre_norm",
    head_weights_fn=head_weights,
    logits_fn=lm_head_logits("lm_head"),
    mlp_act_fn=act_from_config("hidden_act"),
    unembed="lm_head",
    embed_scale_fn=lambda c: float(c.hidden_size) ** 0.5,
)
