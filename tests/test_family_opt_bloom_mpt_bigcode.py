"""OPT, BLOOM, MPT and GPT-BigCode: what the family-parametrized tests do not cover (the decoding walk against
``generate``, per-head W_q/W_k with each family's position term, refused configs, planted errors)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import walklens
from walklens.base.errors import UnsupportedFamilyError
from walklens.core.capture import tokenize
from walklens.models.heads import attention_heads
from walklens.testing import VARIANTS, tiny_model

FAMILIES = ["opt", "opt_postnorm", "opt_proj", "bloom", "mpt", "gpt_bigcode", "gpt_bigcode_mha"]
TEXT = "the capital of france is paris and the king ran to the river"


def _alibi_term(lm, T: int) -> torch.Tensor:
    """slope_h * (key - query) with the ALiBi paper's slopes (H a power of two), added unscaled by BLOOM/MPT."""
    H = lm.adapter.head_weights(lm.model, 0).n_heads
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)])
    rel = torch.arange(T)[None, :] - torch.arange(T)[:, None]
    return slopes[:, None, None] * rel[None].float()


def qk_error(lm, text: str = TEXT) -> float:
    """Max |softmax(scale (X W_q + b_q)(X W_k + b_k)^T + position term + causal mask) - captured A| over heads
    and layers.  Learned positions are already in X; ALiBi adds its own term."""
    tr = walklens.capture(lm, text, attentions=True)
    err = 0.0
    for layer in range(lm.n_layers):
        hw = lm.adapter.head_weights(lm.model, layer)
        X = tr.attn_inputs[f"L{layer}.attn"].float()
        A = tr.attentions[f"L{layer}.attn"]
        T = X.shape[0]
        kv = list(hw.kv_head)
        q = torch.einsum("td,hde->hte", X, hw.w_q.float()) + hw.b_q.float()[:, None]
        k = torch.einsum("td,hde->hte", X, hw.w_k.float()[kv]) + hw.b_k.float()[kv][:, None]
        s = hw.scale * q @ k.transpose(1, 2)
        if lm.adapter.position_scheme(lm.config) == "alibi":
            s = s + _alibi_term(lm, T)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        err = max(err, float((s.softmax(-1) - A).abs().max()))
    return err


@pytest.mark.parametrize("family", FAMILIES)
def test_per_head_qk_rebuilds_attention(family):
    lm = tiny_model(family)
    assert not lm.adapter.broken(lm.config)
    assert qk_error(lm) < 1e-5


def test_mpt_clip_qkv_declares_the_broken_identity(monkeypatch):
    monkeypatch.setitem(VARIANTS, "mpt_clip", ("mpt", dict(max_seq_len=64, attn_config={"clip_qkv": 0.3})))
    lm = tiny_model("mpt_clip")
    assert "clip_qkv" in lm.adapter.broken(lm.config)["qk_bilinear"]
    with pytest.raises(UnsupportedFamilyError, match="clamped"):
        lm.adapter.require(lm.config, "qk_bilinear", "W_qk")
    assert qk_error(lm) > 1e-2  # the clamp is active in this model: the bilinear form really fails


@pytest.mark.parametrize(
    "family,overrides,match",
    [
        ("mpt", dict(max_seq_len=64, attn_config={"qk_ln": True}), "qk_ln"),
        ("bloom", dict(apply_residual_connection_post_layernorm=True), "post_layernorm"),
        ("bloom", dict(pretraining_tp=2, slow_but_exact=True), "slow_but_exact"),
    ],
)
def test_configs_transformers_does_not_compute_faithfully_are_refused(monkeypatch, family, overrides, match):
    monkeypatch.setitem(VARIANTS, "refused", (family, overrides))
    with pytest.raises(UnsupportedFamilyError, match=match):
        tiny_model("refused")


def test_opt_proj_lives_in_two_spaces():
    """opt-350m's layout: V in E-space (16), the residual stream in D-space (32), post-norm, no final norm."""
    lm = tiny_model("opt_proj")
    tr = walklens.capture(lm, TEXT)
    assert lm.embedding_matrix().shape[1] == 16 and tr.d_model == 32
    assert lm.adapter.stack().final_norm is None and lm.adapter.residual_kind(lm.config) == "post_norm"
    assert torch.equal(tr["final"], tr[("resid_post", lm.n_layers - 1)])
    ids = tokenize(lm, TEXT)[0]
    with torch.no_grad():
        assert torch.allclose(tr["embed"], lm.model.model.decoder.project_in(lm.embedding_matrix()[ids]))


def _blocks_instead_of_per_head(attn, config):
    """BLOOM's head weights read with the wrong fused layout ([q | k | v] blocks instead of [q_h | k_h | v_h])."""
    H = config.num_attention_heads
    d = config.hidden_size // H
    return attention_heads(attn, "query_key_value", "dense", H, d, d**-0.5, layout="blocks")


def test_planted_errors_are_caught():
    bloom = tiny_model("bloom")
    wrong = dataclasses.replace(
        bloom, adapter=dataclasses.replace(bloom.adapter, head_weights_fn=_blocks_instead_of_per_head)
    )
    assert qk_error(wrong) > 1e-2
    assert walklens.attention_identity(wrong, TEXT).max_error > 1e-2
    # ALiBi left out of the scores: the W_q/W_k check fails
    mpt = tiny_model("mpt")
    flat = dataclasses.replace(mpt, adapter=dataclasses.replace(mpt.adapter, position="learned"))
    assert qk_error(flat) > 1e-2
    # OPT's project_out left out of the logits: the lens no longer equals the model's logits
    opt = tiny_model("opt_proj")
    head_only = dataclasses.replace(
        opt, adapter=dataclasses.replace(opt.adapter, logits_fn=lambda model, final: model.lm_head(final[..., :16]))
    )
    tr = walklens.capture(head_only, TEXT)
    with torch.no_grad():
        ref = opt.model(tokenize(opt, TEXT)).logits[0]
    assert not torch.allclose(tr.logits(), ref, atol=1e-2)
    assert math.isclose(float((walklens.capture(opt, TEXT).logits() - ref).abs().max()), 0.0, abs_tol=1e-4)
