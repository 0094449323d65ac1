"""Qwen 3, Qwen 3 MoE, Qwen 2 MoE, Mixtral and StarCoder 2: what the generic family tests do not cover.

- the greedy decoding walk equals ``model.generate``;
- per-head W_q/W_k (with the q/k RMSNorm of the Qwen 3 families applied exactly, and the sliding window of the
  sliding variants) recompute the captured attention probabilities when every position id is 0 (rotary is
  then the identity);
- the declared limits (q/k norms, mixture-of-experts MLPs, sliding windows) are exactly the ones each variant has;
- interventions (MLP ablation of a mixture-of-experts block included) act and restore the model bit for bit;
- planted errors (a dropped q/k norm, a missing query bias, a wrong MLP point) are caught by these checks.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

import walklens
from test_interventions import INTERVENTIONS, _assert_restored, _logits, _snapshot
from walklens.base.errors import UnsupportedFamilyError
from walklens.testing import VARIANTS, tiny_model

FAMILIES = ("qwen3", "qwen3_moe", "qwen2_moe", "mixtral", "starcoder2")
OURS = tuple(v for v, (mt, _) in VARIANTS.items() if mt in FAMILIES)
TEXT = "the capital of france is paris and the king ran to the river"

#: the identities each variant breaks (models/base.py::IDENTITIES)
BROKEN = {
    "qwen3": {"qk_bilinear"},
    "qwen3_sliding": {"qk_bilinear", "full_attention"},
    "qwen3_moe": {"qk_bilinear", "dense_mlp"},
    "qwen3_moe_mixed": {"qk_bilinear", "dense_mlp"},
    "qwen2_moe": {"dense_mlp"},
    "qwen2_moe_sliding": {"dense_mlp", "full_attention"},
    "mixtral": {"dense_mlp"},
    "mixtral_sliding": {"dense_mlp", "full_attention"},
    "starcoder2": set(),
    "starcoder2_sliding": {"full_attention"},
}

_CACHE: dict[str, walklens.LoadedModel] = {}


def tiny(variant: str) -> walklens.LoadedModel:
    if variant not in _CACHE:
        _CACHE[variant] = tiny_model(variant)
    return _CACHE[variant]


def test_every_variant_is_listed():
    assert set(OURS) == set(BROKEN)
    assert {VARIANTS[v][0] for v in OURS} == set(FAMILIES)


@pytest.mark.parametrize("variant", OURS)
def test_declared_limits_are_the_variants_own(variant):
    lm = tiny(variant)
    broken = lm.adapter.broken(lm.model.config)
    assert set(broken) == BROKEN[variant], broken
    for identity, why in broken.items():
        with pytest.raises(UnsupportedFamilyError, match=lm.adapter.family):
            lm.adapter.require(lm.model.config, identity, "this analysis")
        assert why
    hw = lm.adapter.head_weights(lm.model, 0)
    assert hw.qk_norm == ("qk_bilinear" in broken)
    layers = lm.adapter.layer_modules(lm.model)
    moe = [i for i, layer in enumerate(layers) if hasattr(layer.mlp, "experts")]
    assert bool(moe) == ("dense_mlp" in broken)


def _capture_at_position_zero(lm: walklens.LoadedModel) -> walklens.Trace:
    """Capture with the rotary embedding given position ids all 0, so that its rotation is the identity.  (The
    ids go to the rotary module only: position ids passed to the model that restart at 0 would also make the
    causal mask treat every token as a packed sequence of its own.)"""

    def zero_positions(_m, args, kwargs):
        if len(args) == 2:
            return (args[0], torch.zeros_like(args[1])), kwargs
        return args, {**kwargs, "position_ids": torch.zeros_like(kwargs["position_ids"])}

    handle = lm.model.model.rotary_emb.register_forward_pre_hook(zero_positions, with_kwargs=True)
    try:
        return walklens.capture(lm, TEXT, attentions=True)
    finally:
        handle.remove()


def _window(config, layer: int) -> int | None:
    window = getattr(config, "sliding_window", None) or None
    types = getattr(config, "layer_types", None)
    return window if types is None or types[layer] == "sliding_attention" else None


def _qk_error(lm: walklens.LoadedModel, weights=None, window=_window) -> float:
    """Largest |softmax(scale (X W_q,h + b_q)(X W_k,h + b_k)^T + mask) - A_h| over layers and heads, the q/k
    RMSNorm applied per head where the head weights say so, the mask causal (and windowed on sliding layers)."""
    tr = _capture_at_position_zero(lm)
    err = 0.0
    for layer in range(lm.n_layers):
        hw = (weights or lm.adapter.head_weights)(lm.model, layer)
        attn = lm.adapter.attention_module(lm.model, layer)
        X, A = tr.attn_inputs[f"L{layer}.attn"], tr.attentions[f"L{layer}.attn"]
        T = X.shape[0]
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        allowed = j <= i
        w = window(lm.model.config, layer)
        if w:
            allowed &= (i - j) < w
        mask = torch.zeros(T, T).masked_fill(~allowed, float("-inf"))
        with torch.no_grad():
            for h in range(hw.n_heads):
                kv = hw.kv_head[h]
                q, k = X @ hw.w_q[h] + hw.b_q[h], X @ hw.w_k[kv] + hw.b_k[kv]
                if hw.qk_norm:
                    q, k = attn.q_norm(q), attn.k_norm(k)
                p = torch.softmax(hw.scale * q @ k.T + mask, -1)
                err = max(err, float((p - A[h]).abs().max()))
    return err


@pytest.mark.parametrize("variant", OURS)
def test_per_head_qk_recomputes_attention_at_position_zero(variant):
    lm = tiny(variant)
    assert _qk_error(lm) < 1e-5


def test_a_dropped_qk_norm_is_caught():
    lm = tiny("qwen3")

    def plain(model, layer):  # as if q·k were bilinear in x
        return dataclasses.replace(lm.adapter.head_weights(model, layer), qk_norm=False)

    assert _qk_error(lm, plain) > 1e-2


def test_a_missing_query_bias_is_caught():
    lm = tiny("starcoder2")  # use_bias: q, k, v and o projections all have biases

    def no_bias(model, layer):
        hw = lm.adapter.head_weights(model, layer)
        return dataclasses.replace(hw, b_q=torch.zeros_like(hw.b_q))

    assert _qk_error(lm, no_bias) > 1e-3


def test_a_missing_sliding_window_is_caught():
    lm = tiny("mixtral_sliding")
    assert len(lm.tokenizer(TEXT).input_ids) > 2 * lm.model.config.sliding_window
    assert _qk_error(lm, window=lambda config, layer: None) > 1e-2


def test_a_wrong_mlp_point_is_caught():
    """The MLP point of Qwen 2 MoE is the whole block (routed experts + gated shared expert): naming only the
    routed experts' module breaks the sublayer rebuild of the layer output."""
    lm = tiny("qwen2_moe")
    tr = walklens.capture(lm, TEXT)
    assert torch.allclose(tr[("resid_mid", 0)] + tr[("mlp_out", 0)], tr[("resid_post", 0)], atol=1e-5)
    spec = dataclasses.replace(lm.adapter.stacks[0], mlp_out="mlp.experts")
    bad = dataclasses.replace(lm, adapter=dataclasses.replace(lm.adapter, stacks=(spec,)))
    tr = walklens.capture(bad, TEXT)
    assert not torch.allclose(tr[("resid_mid", 0)] + tr[("mlp_out", 0)], tr[("resid_post", 0)], atol=1e-3)


@pytest.mark.parametrize("fail", [False, True], ids=["exit", "raise"])
@pytest.mark.parametrize("name", list(INTERVENTIONS))
@pytest.mark.parametrize("variant", ["qwen3_moe_mixed", "qwen2_moe", "mixtral", "starcoder2"])
def test_interventions_act_and_restore(variant, name, fail):
    lm = tiny_model(variant)
    before, base = _snapshot(lm), _logits(lm)
    with pytest.raises(RuntimeError, match="boom") if fail else contextlib.nullcontext():
        with INTERVENTIONS[name](lm):
            assert not torch.equal(_logits(lm), base)  # the intervention really acts inside the block
            if fail:
                raise RuntimeError("boom")
    _assert_restored(lm, before)
    assert torch.equal(_logits(lm), base)
