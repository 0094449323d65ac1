"""Phi, Phi-3, StableLM, GPT-J and CodeGen: what the family-parametrized tests do not cover.

The decoding walk equals greedy ``generate``; per-head W_q/W_k (fused and model-parallel layouts included)
rebuild the captured attention probabilities when every position id is 0 (the rotation is then the identity),
with the family's own q/k LayerNorm and sliding window applied where the config has them; a planted layout or
scale error fails that check; the interventions restore these models bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

import walklens
from test_interventions import INTERVENTIONS
from test_interventions import test_intervention_acts_then_restores_bit_for_bit as restores_bit_for_bit
from walklens.core.capture import tokenize
from walklens.models import ADAPTERS, HeadWeights, base
from walklens.testing import tiny_model

VARIANTS = (
    "phi",
    "phi_qkln",
    "phi3",
    "phi3_sliding",
    "phi3_longrope",
    "stablelm",
    "stablelm_parallel",
    "stablelm_qkln",
    "stablelm_yarn",
    "gptj",
    "codegen",
)
TEXT = "the capital of france is paris and the king ran to the river"

_cache: dict[str, walklens.LoadedModel] = {}


def tiny(family: str) -> walklens.LoadedModel:
    """A tiny model whose norm weights are not 1 (q/k LayerNorms included, so they matter in the check)."""
    if family not in _cache:
        lm = tiny_model(family)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in lm.model.named_parameters():
                if p.dim() == 1 and name.endswith("weight"):
                    p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))
        _cache[family] = lm
    return _cache[family]


def zero_position_trace(lm: walklens.LoadedModel) -> walklens.Trace:
    """A capture with every position id 0: rotary then rotates nothing.  The explicit all-ones attention mask
    keeps transformers from reading the repeated position 0 as a pack of one-token sequences."""
    ids = tokenize(lm, TEXT)
    lm.model.forward = functools.partial(
        lm.model.forward, position_ids=torch.zeros_like(ids), attention_mask=torch.ones_like(ids)
    )
    try:
        return walklens.capture(lm, TEXT, attentions=True)
    finally:
        del lm.model.forward


def qk_probabilities(lm: walklens.LoadedModel, layer: int, x: torch.Tensor, hw: HeadWeights) -> torch.Tensor:
    """softmax(scale (X W_q,h + b_q,h)(X W_k,h + b_k,h)^T + mask) [H, T, T], through the module's q/k
    LayerNorm when the family has one, with the config's sliding window when it has one."""
    q = torch.einsum("td,hde->hte", x, hw.w_q) + hw.b_q[:, None]
    k = torch.einsum("td,hde->hte", x, hw.w_k) + hw.b_k[:, None]  # [H_kv, T, d]
    if hw.qk_norm:  # the module's own per-head norms, on [1, heads, T, d] as the module applies them
        attn = lm.adapter.attention_module(lm.model, layer)
        q, k = attn.q_layernorm(q[None])[0], attn.k_layernorm(k[None])[0]
    k = k[list(hw.kv_head)]
    T = x.shape[0]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    blocked = j > i
    window = getattr(lm.config, "sliding_window", None)
    if window:
        blocked |= i - j >= window
    scores = hw.scale * q @ k.transpose(1, 2)
    return scores.masked_fill(blocked, float("-inf")).softmax(-1)


def qk_error(lm: walklens.LoadedModel) -> float:
    """Largest |recomputed - captured| attention probability over every layer and head."""
    tr = zero_position_trace(lm)
    err = 0.0
    with torch.no_grad():
        for layer in range(lm.n_layers):
            hw = lm.adapter.head_weights(lm.model, layer)
            probs = qk_probabilities(lm, layer, tr.attn_inputs[f"L{layer}.attn"], hw)
            err = max(err, (probs - tr.attentions[f"L{layer}.attn"]).abs().max().item())
    return err


@pytest.mark.parametrize("family", VARIANTS)
def test_per_head_w_q_w_k_rebuild_attention_at_position_zero(family, monkeypatch):
    lm = tiny(family)
    assert qk_error(lm) < 1e-5
    hw = lm.adapter.head_weights(lm.model, 0)
    broken = lm.adapter.broken(lm.config)
    assert hw.qk_norm == ("qk_bilinear" in broken) == bool(getattr(lm.config, "qk_layernorm", False))
    assert ("full_attention" in broken) == (family == "phi3_sliding")
    if hw.qk_norm:  # the norm is a real term: the bilinear form alone does not rebuild the probabilities
        real = lm.adapter.head_weights_fn
        plain = dataclasses.replace(
            lm.adapter, head_weights_fn=lambda a, c: dataclasses.replace(real(a, c), qk_norm=False)
        )
        monkeypatch.setattr(lm, "adapter", plain)
        assert qk_error(lm) > 1e-2


def _codegen_blocks(attn, config) -> HeadWeights:
    """A plausible but wrong CodeGen split: qkv_proj read as plain [q | k | v] blocks (no model-parallel shards)."""
    H, D = config.n_head, config.n_embd
    w = attn.qkv_proj.weight.detach().reshape(3, H, D // H, D).transpose(2, 3)
    hw = ADAPTERS["codegen"].head_weights_fn(attn, config)
    return dataclasses.replace(hw, w_q=w[0].contiguous(), w_k=w[1].contiguous(), w_v=w[2].contiguous())


def _phi3_swapped(attn, config) -> HeadWeights:
    """Phi-3's split with query heads read in the wrong grouping (kv_head h % H_kv instead of h // group)."""
    hw = ADAPTERS["phi3"].head_weights_fn(attn, config)
    n_kv = hw.w_k.shape[0]
    return dataclasses.replace(hw, kv_head=tuple(h % n_kv for h in range(hw.n_heads)))


def _no_scale(attn, config) -> HeadWeights:
    return dataclasses.replace(ADAPTERS["gptj"].head_weights_fn(attn, config), scale=1.0)


def _no_rope_factor(attn, config) -> HeadWeights:
    """The head weights without the rope scaling's cos/sin factor folded in."""
    real = base.rope_attention_factor
    base.rope_attention_factor = lambda c: 1.0
    try:
        return ADAPTERS[config.model_type].head_weights_fn(attn, config)
    finally:
        base.rope_attention_factor = real


@pytest.mark.parametrize(
    "family,planted",
    [
        ("codegen", _codegen_blocks),
        ("phi3", _phi3_swapped),
        ("gptj", _no_scale),
        ("phi3_longrope", _no_rope_factor),
        ("stablelm_yarn", _no_rope_factor),
    ],
)
def test_a_planted_split_or_scale_error_is_caught(family, planted, monkeypatch):
    lm = tiny(family)
    assert qk_error(lm) < 1e-5
    bad = dataclasses.replace(lm.adapter, head_weights_fn=planted)
    monkeypatch.setattr(lm, "adapter", bad)
    assert qk_error(lm) > 1e-2


def test_codegen_wrong_value_split_fails_the_identity(monkeypatch):
    """The v block of CodeGen's shards comes before k: taking k as v breaks the A.3 identity."""
    lm = tiny("codegen")
    assert walklens.attention_identity(lm, TEXT).max_error < 1e-4

    def swapped(stack, layer, cross):
        hm = walklens.head_matrices(lm, layer, stack, cross)
        hw = hm.weights
        return dataclasses.replace(hm, weights=dataclasses.replace(hw, w_v=hw.w_k))

    assert walklens.attention_identity(lm, TEXT, matrices=swapped).max_error > 1e-2


@pytest.mark.parametrize("name", ["eigen_edit", "tied_layers"])
@pytest.mark.parametrize("family", ["phi", "phi3", "stablelm_parallel", "codegen"])
def test_interventions_restore_these_families(family, name):
    assert name in INTERVENTIONS
    restores_bit_for_bit(family, name, fail=True)


@pytest.mark.parametrize("command", ["walk", "verify"])
@pytest.mark.parametrize("family", ["gptj", "codegen"])
def test_a_config_the_model_cannot_run_is_one_line(family, command, tmp_path, monkeypatch, capfd):
    """``rotary_dim`` over the head size: the model's own forward pass fails, which used to end in ``internal
    error: RuntimeError``; it is refused at load, in one line naming the family and the exception."""
    import json

    from walklens.cli import main

    monkeypatch.setenv("WALKLENS_CACHE", str(tmp_path / "cache"))
    lm = tiny_model(family)
    lm.model.save_pretrained(str(tmp_path / "m"))
    lm.tokenizer.save_pretrained(str(tmp_path / "m"))
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["rotary_dim"] = 64  # the head size is 8
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    capfd.readouterr()
    assert main([command, *(["hello", "--model"] if command == "walk" else []), str(tmp_path / "m")]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("walklens: error: "), err
    assert "checkpoint or its config is inconsistent" in err[0] and family in err[0], err
    assert "RuntimeError: " in err[0] and "internal error" not in err[0], err
