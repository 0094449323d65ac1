"""GPT-J: a parallel block whose attention and MLP both read the one ``ln_1``, bias-free q/k/v/out projections,
rotary on the first ``rotary_dim`` dimensions of each head with the interleaved rotate-every-two convention
(pairs (0,1), (2,3), ...), a biased lm_head."""

from __future__ import annotations

from typing import Any

from .base import Adapter, HeadWeights, HFModule, StackSpec, act_from_config, lm_head_logits
from .phi import qkv_heads


def rotary_notes(config: Any) -> str:
    dims = config.rotary_dim or config.n_embd // config.n_head
    return (
        f"rotary (interleaved pairs) on the first {dims} dims of each head: W_qk is the position-0 (no rotation) form"
    )


def head_weights(attn: HFModule, config: Any) -> HeadWeights:
    return qkv_heads(attn, config, "out_proj", notes=rotary_notes(config))


def transformer_adapter(family: str, head_weights_fn: Any) -> Adapter:
    """The GPT-J module tree (``transformer.h[i].{ln_1, attn, mlp}``, ``transformer.ln_f``), shared with CodeGen."""
    return Adapter(
        family=family,
        model_types=(family,),
        auto_class="causal",
        embed="transformer.wte",
        stacks=(
            StackSpec(
                name="",
                layers="transformer.h",
                attn="attn",
                attn_out="attn",
                mlp_out="mlp",
                final_norm="transformer.ln_f",
                norms={"attn": "ln_1", "mlp": "ln_1"},
            ),
        ),
        position="rotary",
        residual="parallel",
        head_weights_fn=head_weights_fn,
        logits_fn=lm_head_logits("lm_head"),
        n_layers_fn=lambda c: c.n_layer,
        mlp_act_fn=act_from_config("activation_function"),
        unembed="lm_head",
    )


ADAPTER = transformer_adapter("gptj", head_weights)
