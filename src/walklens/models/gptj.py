"""GPT-J: GPT-2's module tree with a parallel block whose attention and MLP both read the one ``ln_1``, bias-free
q/k/v/out projections, rotary on the first ``rotary_dim`` dimensions of each head with the interleaved
rotate-every-two convention (pairs (0,1), (2,3), ...), a biased lm_head."""

from __future__ import annotations

from typing import Any

from . import gpt2
from .base import HeadWeights, HFModule, variant
from .heads import config_heads


def rotary_notes(config: Any) -> str:
    dims = config.rotary_dim or config.n_embd // config.n_head
    return (
        f"rotary (interleaved pairs) on the first {dims} dims of each head: W_qk is the position-0 (no rotation) form"
    )


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    return config_heads(attn, config, "out_proj", notes=rotary_notes(config))


#: GPT-2's tree (``transformer.h[i].{ln_1, attn, mlp}``, ``transformer.ln_f``), the MLP reading ``ln_1`` too
ADAPTER = variant(
    gpt2.ADAPTER,
    "gptj",
    stack=dict(norms={"attn": "ln_1", "mlp": "ln_1"}),
    position="rotary",
    residual="parallel",
    head_weights_fn=head_weights,
)
