"""Capture on every family: logits, sublayer sums and HF hidden states agree with the model itself."""

from __future__ import annotations

import pytest
import torch

import walklens
from walklens.models import get_module
from walklens.testing import TINY_FAMILIES, tiny_model

TEXT = "the capital of france is paris and the king ran to the river"


def _reference(lm, text):
    ids = lm.tokenizer(text, return_tensors="pt").input_ids
    kw = {"decoder_input_ids": lm.model._shift_right(ids)} if lm.adapter.auto_class == "seq2seq" else {}
    with torch.no_grad():
        return lm.model(ids, output_hidden_states=True, **kw)


@pytest.fixture(scope="module", params=TINY_FAMILIES)
def fam(request):
    lm = tiny_model(request.param)
    return lm, walklens.capture(lm, TEXT), _reference(lm, TEXT)


def test_logits_match_model(fam):
    lm, tr, out = fam
    assert torch.allclose(tr.logits(), out.logits[0], atol=1e-4)


def test_hidden_states_match_hf_at_every_layer(fam):
    lm, tr, out = fam
    hs = out.decoder_hidden_states if lm.adapter.auto_class == "seq2seq" else out.hidden_states
    L = tr.n_layers
    assert len(hs) == L + 1
    for layer in range(L):
        assert torch.allclose(tr[("resid_pre", layer)], hs[layer][0], atol=1e-5), layer
        if layer:
            assert torch.allclose(tr[("resid_post", layer - 1)], hs[layer][0], atol=1e-5)
    # HF's last hidden state already has the final norm applied (the tuned-lens trap)
    if hs[L].shape[-1] == tr.d_model:
        assert torch.allclose(tr["final"], hs[L][0], atol=1e-5)
    else:  # the model maps final out of D-space before its head (OPT's project_out): compare through the head
        head = get_module(lm.model, lm.adapter.unembed)
        with torch.no_grad():
            assert torch.allclose(head(hs[L][0]), tr.logits(), atol=1e-5)
    if lm.adapter.auto_class == "seq2seq":
        enc = tr.encoder
        for layer in range(L):
            assert torch.allclose(enc[("resid_pre", layer)], out.encoder_hidden_states[layer][0], atol=1e-5)
        assert torch.allclose(enc["final"], out.encoder_hidden_states[L][0], atol=1e-5)


def test_sublayer_contributions_rebuild_layer_output(fam):
    lm, tr, _ = fam
    kind = lm.adapter.residual_kind(lm.model.config)
    for layer in range(tr.n_layers):
        pre, post = tr[("resid_pre", layer)], tr[("resid_post", layer)]
        attn, mlp = tr[("attn_out", layer)], tr[("mlp_out", layer)]
        if kind == "post_norm":  # resid_mid = LN1(pre + attn_out), resid_post = LN2(mid + mlp_out)
            layer_mod = lm.adapter.layer_modules(lm.model)[layer]
            ln1 = lm.adapter.stacks[0].norm_module(layer_mod, "attn")
            ln2 = lm.adapter.stacks[0].norm_module(layer_mod, "mlp")
            mid = tr[("resid_mid", layer)]
            assert torch.allclose(ln1(pre + attn), mid, atol=1e-5)
            assert torch.allclose(ln2(mid + mlp), post, atol=1e-5)
            continue
        total = pre + attn + mlp
        if "L0.cross_out" in tr.points:
            total = total + tr[("cross_out", layer)]
        assert torch.allclose(total, post, atol=1e-5), layer
        assert not torch.allclose(pre + mlp, post, atol=1e-5)  # the attention contribution is not zero


def test_adapter_paths_resolve(fam):
    """Every module an adapter names exists in the real module tree (norms through their alternatives)."""
    lm, tr, _ = fam
    for spec in lm.adapter.stacks:
        layer = lm.adapter.layer_modules(lm.model, spec.name)[0]
        for role in spec.norms:
            assert spec.norm_module(layer, role) is not None, (spec.name, role)
        hw = lm.adapter.head_weights(lm.model, 0, spec.name)
        assert hw.w_o.shape[-1] == hw.w_q.shape[1] == tr.d_model
        assert len(hw.kv_head) == hw.n_heads and max(hw.kv_head) < hw.w_v.shape[0]


def test_subset_and_fp16_and_roundtrip(tmp_path):
    lm = tiny_model("llama")
    full = walklens.capture(lm, TEXT)
    sub = walklens.capture(lm, TEXT, points=["embed", "L*.resid_post"], dtype=torch.float16)
    assert sub.points == ["embed", "L0.resid_post", "L1.resid_post", "final"]
    assert sub.hidden.dtype == torch.float16
    assert torch.allclose(sub["L1.resid_post"].float(), full["L1.resid_post"], atol=1e-2)
    path = full.save(tmp_path / "t.safetensors")
    back = walklens.Trace.load(path, lm=lm)
    assert back.points == full.points and back.tokens == full.tokens
    assert torch.equal(back.hidden, full.hidden)
    assert torch.allclose(back.logits(), full.logits())


def test_t5_trace_roundtrip_keeps_encoder(tmp_path):
    lm = tiny_model("t5")
    tr = walklens.capture(lm, TEXT, attentions=True)
    back = walklens.Trace.load(tr.save(tmp_path / "t5.safetensors"))
    assert back.encoder is not None and torch.equal(back.encoder.hidden, tr.encoder.hidden)
    assert set(back.attentions) == {"L0.attn", "L1.attn", "L0.cross", "L1.cross"}


def test_albert_shared_layer_is_captured_once_per_use():
    lm = tiny_model("albert")
    tr = walklens.capture(lm, TEXT)
    assert tr.n_layers == 3
    # one module applied 3 times: each use has its own input and output
    assert not torch.allclose(tr[("resid_post", 0)], tr[("resid_post", 2)])


def test_bad_input_is_refused_with_typed_errors():
    lm = tiny_model("gpt2")
    with pytest.raises(walklens.EmptyTextError):
        walklens.capture(lm, "   ")
    with pytest.raises(walklens.ContextTooLongError):
        walklens.capture(lm, "the " * 100)
    tr = walklens.capture(lm, "the " * 100, truncate=True)
    assert len(tr.tokens) == 64
    with pytest.raises(walklens.UnknownModelError):
        walklens.load_model("no-such-model")
    with pytest.raises(walklens.UnknownModelError):
        walklens.load_model("/nonexistent/model.gguf")


def test_unsupported_family_lists_supported():
    with pytest.raises(walklens.UnsupportedFamilyError, match="llama"):
        walklens.models.get_adapter("mamba")


def test_capture_hooks_are_removed_even_on_error():
    lm = tiny_model("gpt2")
    with pytest.raises(walklens.EmptyTextError):
        walklens.capture(lm, "")
    walklens.capture(lm, TEXT)
    n_hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in lm.model.modules())
    assert n_hooks == 0


@pytest.mark.real
def test_smollm2_paris(smollm2):
    tr = walklens.capture(smollm2, "The capital of France is")
    assert tr.tokens == ["The", " capital", " of", " France", " is"]
    logits = tr.logits()
    assert smollm2.tokenizer.decode([int(logits[-1].argmax())]) == " Paris"
    ids = smollm2.tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        ref = smollm2.model(ids).logits[0]
    assert torch.allclose(logits, ref, atol=1e-4)


# ---- one-point selections, batches stopped early, per-call records ------------------------------------------


@pytest.mark.parametrize("family", ["llama", "gpt2", "t5"])
def test_a_lone_mid_residual_point_is_computed(family):
    """Pre-norm resid_mid is resid_pre + attn_out, added in the attention hook: asking for one layer's mid
    point alone must compute it (it used to be computed only when L0's mid point was kept)."""
    lm = tiny_model(family)
    full = walklens.capture(lm, TEXT)
    for point in ("L1.resid_mid", "L1.resid_*"):
        sub = walklens.capture(lm, TEXT, points=[point])
        assert torch.equal(sub["L1.resid_mid"], full["L1.resid_mid"]), point


def _layer_runs(lm, stack=None):
    """Hooks counting finished layer calls (a shared ALBERT layer counts once per use)."""
    runs = []
    hooks = walklens.Hooks()
    for layer in dict.fromkeys(lm.adapter.layer_modules(lm.model, stack)):
        hooks.post(layer, lambda *_: runs.append(1))
    return hooks, runs


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "bert", "t5", "albert"])
def test_capture_batch_rows_equal_capture_and_stop_early(family):
    lm = tiny_model(family)
    texts = ["the capital of france is paris", "the king ran", "a big red dog runs to the river and the city"]
    traces = [walklens.capture(lm, t) for t in texts]
    seqs = [tr.encoder.token_ids.tolist() if tr.encoder is not None else tr.token_ids.tolist() for tr in traces]
    b = walklens.core.capture_batch(lm, seqs, ["L*.resid_pre", "final"])
    assert b.points == [f"L{l}.resid_pre" for l in range(lm.n_layers)] + ["final"]
    assert b.mask.tolist() == [[1] * len(s) + [0] * (max(map(len, seqs)) - len(s)) for s in seqs]
    for i, (tr, s) in enumerate(zip(traces, seqs)):
        own = tr.encoder if tr.encoder is not None else tr
        for p in b.points:
            assert torch.allclose(b[p][i, : len(s)], own[p], atol=1e-5), (i, p)
    stack = "enc" if family == "t5" else None
    hooks, runs = _layer_runs(lm, stack)
    with hooks:
        one = walklens.core.capture_batch(lm, seqs, ["L1.resid_pre"])
    assert len(runs) == 1 and one.points == ["L1.resid_pre"]  # layer 0 ran; layer 1 itself never ran
    assert torch.equal(one["L1.resid_pre"], b["L1.resid_pre"])
    hooks, runs = _layer_runs(lm, stack)
    with hooks:
        walklens.core.capture_batch(lm, seqs, ["L1.resid_pre"], stop_early=False)
    assert len(runs) == lm.n_layers


def test_capture_batch_bad_input():
    lm = tiny_model("llama")
    with pytest.raises(walklens.InputError, match="no point"):
        walklens.core.capture_batch(lm, [[7, 8]], ["L9.nothing"])
    with pytest.raises(walklens.EmptyTextError):
        walklens.core.capture_batch(lm, [[7, 8], []], ["final"])
    with pytest.raises(walklens.InputError):
        walklens.core.capture_batch(lm, [[7, 8]], ["final"], stack="dec")
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in lm.model.modules()) == 0


def test_record_steps_one_record_per_call():
    lm = tiny_model("llama")
    ids = lm.tokenizer("the capital of france", return_tensors="pt").input_ids
    with walklens.core.record_steps(lm) as steps, torch.no_grad():
        out = lm.model(input_ids=ids)
        lm.model(input_ids=ids[:, :2])
    assert len(steps) == 2 and steps[0].final.shape == (ids.shape[1], 32) and steps[1].final.shape[0] == 2
    assert torch.equal(steps[0].logits, out.logits[0, -1].float())
    tr = walklens.capture(lm, "the capital of france")
    assert torch.allclose(steps[0].final, tr["final"], atol=1e-6)
    assert sum(len(m._forward_hooks) for m in lm.model.modules()) == 0
