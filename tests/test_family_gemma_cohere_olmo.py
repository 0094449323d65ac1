"""Gemma, Gemma 2, Gemma 3, Cohere and OLMo 2: what the family-parametrized tests do not cover.

- the greedy decoding walk reproduces ``model.generate``;
- per-head W_q / W_k rebuild the captured attention probabilities with rotation off (all positions 0), with
  each family's non-bilinear terms added exactly (the model's own q/k norm modules, the attention soft-cap,
  the sliding window), and the adapter declares ``qk_bilinear`` / ``full_attention`` exactly when such a term
  was needed; ``logit_linear`` exactly when the logits are not the plain unembedding;
- planted errors (a missing logit scale or soft-cap, a wrong head split, a forgotten post-norm) are caught.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

import walklens
from walklens.core.capture import tokenize
from walklens.core.interventions import ablate_mlps, eigen_edit
from walklens.models.base import lm_head_logits
from walklens.testing import tiny_model

FAMILIES = ("gemma", "gemma2", "gemma2_nocap", "gemma3", "cohere", "cohere_qknorm", "olmo2")
TEXT = "the capital of france is paris and the king ran to the river"

_cache: dict[str, object] = {}


def tiny(family: str):
    if family not in _cache:
        _cache[family] = tiny_model(family)
    return _cache[family]


# ---- per-head W_q / W_k ------------------------------------------------------------------------------------


@contextmanager
def positions_at_zero(lm) -> Iterator[None]:
    """Every forward of the decoder runs with position_ids 0 (rotary is the identity) and an explicit
    all-ones attention mask (so equal positions are not read as packed sequences)."""
    base = lm.model.get_decoder()

    def pre(_m, args, kwargs):
        x = kwargs.get("input_ids")
        x = x if x is not None else kwargs["inputs_embeds"]
        kwargs["position_ids"] = torch.zeros(1, x.shape[1], dtype=torch.long, device=x.device)
        kwargs["attention_mask"] = torch.ones(1, x.shape[1], dtype=torch.long, device=x.device)
        return args, kwargs

    h = base.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        yield
    finally:
        h.remove()


def _normed(norm, x: torch.Tensor, n: int, d: int) -> torch.Tensor:
    """The module's own q/k norm on [T, n, d]: over the full width when its weight spans it, else per head."""
    if norm.weight.numel() == n * d and norm.weight.dim() == 1 and n > 1:
        return norm(x.reshape(x.shape[0], n * d)).reshape(x.shape)
    return norm(x)


def rebuilt_probs(lm, layer: int, X: torch.Tensor, matrices=None) -> tuple[torch.Tensor, set[str]]:
    """softmax(scale * (X W_q,h + b_q)(X W_k,h + b_k)^T + mask) per head, with the family's non-bilinear terms
    added exactly; also the names of the terms that were needed."""
    attn = lm.adapter.attention_module(lm.model, layer)
    hw = matrices or lm.adapter.head_weights(lm.model, layer)
    H, H_kv, d = hw.n_heads, hw.w_k.shape[0], hw.d_head
    q = torch.einsum("td,hde->the", X, hw.w_q) + hw.b_q
    k = torch.einsum("td,hde->the", X, hw.w_k) + hw.b_k
    terms: set[str] = set()
    if getattr(attn, "q_norm", None) is not None:
        q, k = _normed(attn.q_norm, q, H, d), _normed(attn.k_norm, k, H_kv, d)
        terms.add("qk_bilinear")
    k = k[:, list(hw.kv_head)]
    s = hw.scale * torch.einsum("thd,shd->hts", q, k)
    cap = getattr(attn, "attn_logit_softcapping", None)
    if cap:
        s = cap * torch.tanh(s / cap)
        terms.add("qk_bilinear")
    T = X.shape[0]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = j <= i
    window = getattr(attn, "sliding_window", None)
    if window:
        allowed = allowed & (i - j < window)
        terms.add("full_attention")
    return s.masked_fill(~allowed, float("-inf")).softmax(-1), terms


@torch.no_grad()
def _qk_errors(lm, matrices=None) -> tuple[list[float], set[str]]:
    with positions_at_zero(lm):
        tr = walklens.capture(lm, TEXT, attentions=True)
    errs, needed = [], set()
    for layer in range(lm.n_layers):
        A = tr.attentions[f"L{layer}.attn"]
        got, terms = rebuilt_probs(lm, layer, tr.attn_inputs[f"L{layer}.attn"], matrices(layer) if matrices else None)
        errs.append((got - A).abs().max().item())
        needed |= terms
    return errs, needed


@pytest.mark.parametrize("family", FAMILIES)
def test_per_head_qk_rebuilds_attention_at_position_zero(family):
    lm = tiny(family)
    errs, needed = _qk_errors(lm)
    assert max(errs) < 1e-5, errs
    broken = lm.adapter.broken(lm.config)
    # a limit is declared exactly where the plain bilinear form (or full causal attention) is not the model
    assert {"qk_bilinear", "full_attention"} & set(broken) == needed, (broken, needed)
    assert all(
        lm.adapter.head_weights(lm.model, l).qk_norm == hasattr(lm.adapter.attention_module(lm.model, l), "q_norm")
        for l in range(lm.n_layers)
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_logit_linear_declared_exactly_when_the_head_is_not_plain(family):
    lm = tiny(family)
    tr = walklens.capture(lm, TEXT)
    with torch.no_grad():
        out = lm.model(tokenize(lm, TEXT)).logits[0]
        plain = lm.model.lm_head(tr["final"])
    assert torch.allclose(tr.logits(), out, atol=1e-5)
    assert ("logit_linear" in lm.adapter.broken(lm.config)) == (not torch.allclose(plain, out, atol=1e-5))


@pytest.mark.parametrize("family", ["gemma2_nocap", "cohere_qknorm", "olmo2"])
def test_interventions_act_through_the_adapter_paths(family):
    lm = tiny(family)
    ids = tokenize(lm, TEXT)
    with torch.no_grad():
        base = lm.model(ids).logits
        u = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        for ctx in (ablate_mlps(lm), eigen_edit(lm, [0, 1], u / u.norm(), 2.0)):
            with ctx:
                assert not torch.equal(lm.model(ids).logits, base)
            assert torch.equal(lm.model(ids).logits, base)


# ---- planted errors are caught -----------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["cohere", "gemma2"])
def test_missing_logit_scale_or_softcap_is_caught(family):
    lm = tiny(family)
    bad = dataclasses.replace(lm, adapter=dataclasses.replace(lm.adapter, logits_fn=lm_head_logits("lm_head")))
    with torch.no_grad():
        out = lm.model(tokenize(lm, TEXT)).logits[0]
    assert torch.allclose(walklens.capture(lm, TEXT).logits(), out, atol=1e-5)
    assert not torch.allclose(walklens.capture(bad, TEXT).logits(), out, atol=1e-2)


@pytest.mark.parametrize("family", ["gemma", "olmo2"])
def test_wrong_head_split_is_caught(family):
    """q_proj read with the head axis inner ([d, H] instead of [H, d]): the W_q/W_k check fails."""
    lm = tiny(family)

    def wrong(layer: int):
        hw = lm.adapter.head_weights(lm.model, layer)
        H, D, d = hw.w_q.shape
        w = lm.adapter.attention_module(lm.model, layer).q_proj.weight.detach()  # [H*d, D]
        return dataclasses.replace(hw, w_q=w.reshape(d, H, D).permute(1, 2, 0).contiguous())

    errs, _ = _qk_errors(lm, wrong)
    assert max(errs) > 1e-2, errs


def test_forgotten_post_norm_is_caught():
    """OLMo 2 read as if attn/MLP outputs were added unnormed: the sublayer sum no longer rebuilds the layer."""
    lm = tiny("olmo2")
    spec = lm.adapter.stacks[0]
    bad = dataclasses.replace(
        lm,
        adapter=dataclasses.replace(
            lm.adapter, stacks=(dataclasses.replace(spec, attn_out="self_attn", mlp_out="mlp", attn_proj=None),)
        ),
    )
    for model, ok in ((lm, True), (bad, False)):
        tr = walklens.capture(model, TEXT)
        rebuilt = tr[("resid_pre", 0)] + tr[("attn_out", 0)] + tr[("mlp_out", 0)]
        assert torch.allclose(rebuilt, tr[("resid_post", 0)], atol=1e-5) == ok
