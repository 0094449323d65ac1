"""Activation patching (issue 55): every cell equals its single-patch forward pass bit for bit on every causal family
with an adapter file, the batched grid within float32 rounding of it, the model restored bit for bit, exact oracles
(a prompt pair differing in one token), and one-line refusals of bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from walklens.analyses.patching import attribute, expand_points, patch
from walklens.base.errors import InputError, UnsupportedFamilyError
from walklens.core.capture import capture
from walklens.core.patching import Cell, Site, out_projection, patched, record, run_logits, start_at
from walklens.testing import TINY_FAMILIES, tiny_model

CLEAN = "the capital of france is paris"
CORRUPT = "the capital of england is paris"  # one token differs (position 3)
METRIC = "logitdiff:paris,london"

_CAUSAL: dict[str, bool] = {}


def _causal(family: str) -> bool:
    if family not in _CAUSAL:
        lm = tiny_model(family)
        spec = lm.adapter.stack()
        _CAUSAL[family] = bool(lm.is_causal and not lm.is_encoder_decoder and not spec.shared_layer)
    return _CAUSAL[family]


FAMILIES = [f for f in TINY_FAMILIES if f not in ("t5", "bert", "albert")]


def _points(lm) -> list[str]:
    kinds = ["resid_pre", "attn_out", "mlp_out", "resid_post", f"L{lm.n_layers - 1}.H1"]
    if lm.adapter.residual_kind(lm.config) != "parallel":
        kinds.append("resid_mid")
    return kinds


def _state(lm) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in lm.model.state_dict().items()}


def _no_hooks(lm) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in lm.model.modules())


@pytest.mark.parametrize("family", FAMILIES)
def test_every_cell_is_its_single_patch_pass(family: str) -> None:
    """Incremental (from the stored residual) at batch 1 equals the plain single-patch forward pass bit for bit; a
    layer's cells in one batch equal it within float32 rounding (the kernels block by batch shape); the model, its
    layer list and config are restored bit for bit and no hook is left."""
    lm = tiny_model(family)
    if not _causal(family):
        pytest.skip("not a decoder-only model")
    before, n_before = _state(lm), lm.config.num_hidden_layers
    kw = dict(points=_points(lm), positions=[0, 3, -1], metric=METRIC)
    single = patch(lm, CLEAN, CORRUPT, batch=1, incremental=False, **kw)
    incremental = patch(lm, CLEAN, CORRUPT, batch=1, incremental=True, **kw)
    batched = patch(lm, CLEAN, CORRUPT, **kw)
    assert np.isfinite(single.raw).all()
    assert np.array_equal(incremental.raw, single.raw)
    scale = abs(single.clean_metric - single.corrupted_metric)
    np.testing.assert_allclose(batched.raw, single.raw, rtol=0, atol=1e-5 * max(scale, 1.0))
    after = _state(lm)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert lm.config.num_hidden_layers == n_before and _no_hooks(lm)
    assert len(lm.adapter.layer_modules(lm.model)) == lm.n_layers


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma3", "opt_postnorm", "gpt_neox", "falcon_alibi", "phi"])
def test_one_token_pair_oracles(family: str) -> None:
    """Prompts differing in one token (position 3): restoring L0.resid_pre there makes the whole input clean, so the
    cell scores the clean run exactly (1); positions before it hold equal vectors (0 exactly); the last layer's
    resid_post at the answer position gives the clean logits (1); noising mirrors it (0 and 1)."""
    lm = tiny_model(family)
    last = lm.n_layers - 1
    pts = ["L0.resid_pre", f"L{last}.resid_post"]
    r = patch(lm, CLEAN, CORRUPT, points=pts, metric=METRIC, batch=1)
    assert r.cell("L0.resid_pre", 3) == 1.0 and r.cell("L0.resid_pre", 1) == 0.0
    assert r.cell(f"L{last}.resid_post", 5) == 1.0
    n = patch(lm, CLEAN, CORRUPT, points=pts, metric=METRIC, batch=1, direction="noise")
    assert n.cell("L0.resid_pre", 3) == 0.0 and n.cell("L0.resid_pre", 2) == 1.0


def test_resid_pre_against_an_independent_hook() -> None:
    """The grid's resid_pre cell equals a hand-written hook fed by capture()'s clean vector, bit for bit."""
    lm = tiny_model("llama")
    r = patch(lm, CLEAN, CORRUPT, points=["L1.resid_pre"], positions=[4], metric="kl", batch=1, incremental=False)
    clean_vec = capture(lm, CLEAN, points=["L1.resid_pre"], dtype=None)["L1.resid_pre"][4]
    layer = lm.adapter.layer_modules(lm.model)[1]

    def hook(_m, args, kwargs):
        x = (args[0] if args else kwargs["hidden_states"]).clone()
        x[0, 4] = clean_vec
        return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})

    ids = lm.tokenizer(CORRUPT, return_tensors="pt")["input_ids"]
    handle = layer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            logits = run_logits(lm, ids, -1)[0]
    finally:
        handle.remove()
    clean_logits = record(lm, lm.tokenizer(CLEAN, return_tensors="pt")["input_ids"], [], -1).logits
    lc, lp = torch.log_softmax(clean_logits, -1), torch.log_softmax(logits, -1)
    assert float(r.raw[0, 0]) == float((lc.exp() * (lc - lp)).sum())


def test_heads_sum_to_attention_output() -> None:
    """A head's z_h patched with its own value changes nothing (bit for bit); every head of a layer patched with the
    clean z_h gives the clean attn_out there (up to the sum's rounding): the per-head patch is the A.3 share."""
    lm = tiny_model("gpt2")
    ids = lm.tokenizer(CORRUPT, return_tensors="pt")["input_ids"]
    cids = lm.tokenizer(CLEAN, return_tensors="pt")["input_ids"]
    sites = [Site(1, "head", h) for h in range(4)] + [Site(1, "attn_out")]
    base, clean = record(lm, ids, sites, -1), record(lm, cids, sites, -1)
    d = lm.head_weights(1).d_head
    own = [Cell(Site(1, "head", 2), 3, base.vectors["L1.heads"][3, 2 * d : 3 * d])]
    with torch.no_grad(), patched(lm, own):
        assert torch.equal(run_logits(lm, ids, -1)[0], base.logits)
    assert out_projection(lm, 1) is lm.model.transformer.h[1].attn.c_proj
    # all heads at position 3 from the clean run: record the patched run's attn_out there
    z = clean.vectors["L1.heads"][3]
    every = [Cell(Site(1, "head", h), 3, z[h * d : (h + 1) * d]) for h in range(4)]
    from walklens.core.patching import patched as p2

    got = {}
    hook_mod = lm.model.transformer.h[1].attn
    h = hook_mod.register_forward_hook(lambda _m, _i, o: got.update(a=o[0][0, 3].detach().clone()))
    try:
        with torch.no_grad(), p2(lm, [every[0]]), p2(lm, [every[1]]), p2(lm, [every[2]]), p2(lm, [every[3]]):
            run_logits(lm, ids, -1)
    finally:
        h.remove()
    torch.testing.assert_close(got["a"], clean.vectors["L1.attn_out"][3], rtol=0, atol=1e-5)


def test_start_at_restores_and_equals_the_full_pass() -> None:
    """start_at(l) from the stored input of layer l gives the full pass's logits bit for bit; the layer list, depth and
    layer_types come back even when the body raises."""
    lm = tiny_model("gemma3")
    ids = lm.tokenizer(CLEAN, return_tensors="pt")["input_ids"]
    rec = record(lm, ids, [], -1)
    types, mods = list(lm.config.layer_types), list(lm.adapter.layer_modules(lm.model))
    with torch.no_grad(), start_at(lm, 1, rec.resid_pre[1]):
        assert lm.config.layer_types == types[1:]
        assert torch.equal(run_logits(lm, ids, -1)[0], rec.logits)
    with pytest.raises(RuntimeError), start_at(lm, 1, rec.resid_pre[1]):
        raise RuntimeError("body fails")
    assert lm.config.layer_types == types and list(lm.adapter.layer_modules(lm.model)) == mods and _no_hooks(lm)


def test_metrics_and_result() -> None:
    """The four metrics and a callable; normalised clean 1 / corrupted 0 with both references; table and document."""
    lm = tiny_model("llama")
    for metric in ("kl", METRIC, "logprob:paris", "rank:paris", lambda logits: logits[10] - logits[11]):
        r = patch(lm, CLEAN, "the capital of england is london", points=["L1.resid_pre"], metric=metric)
        assert np.allclose(r.values, (r.raw - r.corrupted_metric) / (r.clean_metric - r.corrupted_metric))
    df = r.to_pandas()
    assert list(df.columns[:5]) == ["point", "position", "token", "value", "raw"] and len(df) == 6
    doc = r.document()
    assert doc["kind"] == "patching" and len(doc["values"]) == 1 and doc["clean_metric"] == r.clean_metric


def test_bad_input_one_line() -> None:
    lm = tiny_model("gpt2")
    cases = [
        (dict(corrupted="the capital of england"), "position_map"),
        (dict(metric=lambda logits: float("nan")), "not finite"),
        (dict(metric=lambda logits: logits[:3]), "3 numbers"),
        (dict(points=["L9.resid_pre"]), "out of range"),
        (dict(points=["L0.H7"]), "out of range"),
        (dict(positions=[40]), "out of range"),
        (dict(metric="logitdiff:paris"), "needs 2 tokens"),
        (dict(metric="logprob:paris london"), "not one"),
        (dict(direction="sideways"), "denoise or noise"),
    ]
    for kw, words in cases:
        args = {"clean": CLEAN, "corrupted": CORRUPT, "points": "resid_pre", "metric": METRIC, **kw}
        with pytest.raises(InputError, match=words) as e:
            patch(lm, **args)
        assert "\n" not in str(e.value)
    ok = patch(lm, CLEAN, "the capital of england", points="L0.resid_pre", metric="kl", position_map={0: 0, 3: 3})
    assert ok.positions == [0, 3]
    with pytest.raises(InputError, match="parallel"):
        expand_points(tiny_model("gpt_neox"), ["L0.resid_mid"])
    with pytest.raises(UnsupportedFamilyError, match="decoder-only"):
        patch(tiny_model("bert"), CLEAN, CORRUPT)
    with pytest.raises(InputError, match="has none"):
        attribute(lm, CLEAN, CORRUPT, metric="rank:paris")
    assert math.isfinite(ok.clean_metric)
