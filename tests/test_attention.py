"""Per-head W_vo / W_qk, the A.3 identity, and the cluster & aggregate view (seed 000, sec. 2.2.1, A.3)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import walklens
from walklens.analyses.attention import HeadMatrices, cluster_view, self_mass
from walklens.base.errors import InputError
from walklens.core.ov import FactoredMatrix
from walklens.testing import TINY_FAMILIES, tiny_model

TEXT = "the capital of france is paris and the king ran to the river"


def _n_modules(lm) -> int:
    n = lm.n_layers
    return sum(n * (2 if s.cross_attn else 1) for s in lm.adapter.stacks)


@pytest.fixture(scope="module")
def tiny():
    cache: dict = {}

    def get(fam):
        if fam not in cache:
            cache[fam] = tiny_model(fam)
        return cache[fam]

    return get


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_identity_holds_on_every_family(tiny, family):
    lm = tiny(family)
    res = walklens.attention_identity(lm, TEXT)
    assert len(res) == _n_modules(lm)  # every self- (and cross-) attention module was checked
    assert res.max_error < 1e-4, dict(res)
    # the outputs are not trivially small, so 1e-4 is a real check
    assert min(c.max_abs_output for c in res.checks) > 0.1
    if family == "t5":
        assert {"enc.L0.attn", "dec.L0.attn", "dec.L0.cross"} <= set(res)
    else:
        assert list(res) == [f"L{l}.attn" for l in range(lm.n_layers)] and res[0] == res["L0.attn"]


def _tampered(lm, change):
    def fn(stack, layer, cross):
        hm = walklens.head_matrices(lm, layer, stack, cross)
        return dataclasses.replace(hm, weights=change(hm.weights))

    return fn


def test_wrong_w_vo_fails(tiny):
    lm = tiny("llama")
    swap = [1, 0, 2, 3]  # W_o of heads 0 and 1 exchanged: W_vo,0 and W_vo,1 are wrong

    res = walklens.attention_identity(
        lm, TEXT, matrices=_tampered(lm, lambda w: dataclasses.replace(w, w_o=w.w_o[swap]))
    )
    assert res.max_error > 1e-2
    assert not res.holds()


def test_grouped_query_mapping_matters(tiny):
    lm = tiny("llama")  # 4 query heads share 2 kv heads: kv_head = (0, 0, 1, 1)
    assert walklens.head_matrices(lm, 0).kv_head == (0, 0, 1, 1)
    res = walklens.attention_identity(
        lm, TEXT, matrices=_tampered(lm, lambda w: dataclasses.replace(w, kv_head=(0, 1, 0, 1)))
    )
    assert res.max_error > 1e-2


def test_value_bias_is_needed(tiny):
    lm = tiny("gpt2")  # GPT-2 has b_v and b_o
    hm = walklens.head_matrices(lm, 0)
    assert hm.vo_bias().abs().max() > 1e-3
    res = walklens.attention_identity(
        lm, TEXT, matrices=_tampered(lm, lambda w: dataclasses.replace(w, b_v=torch.zeros_like(w.b_v)))
    )
    assert res.max_error > 1e-3


def test_w_vo_and_w_qk_match_the_model_weights(tiny):
    lm = tiny("llama")
    attn = lm.model.model.layers[1].self_attn
    hm = walklens.head_matrices(lm, 1)
    d = hm.d_head
    for h in range(hm.n_heads):
        kv = hm.kv_head[h]
        w_v = attn.v_proj.weight[kv * d : (kv + 1) * d].T
        w_o = attn.o_proj.weight[:, h * d : (h + 1) * d].T
        w_q = attn.q_proj.weight[h * d : (h + 1) * d].T
        w_k = attn.k_proj.weight[kv * d : (kv + 1) * d].T
        assert torch.allclose(hm.w_vo(h), w_v @ w_o, atol=1e-6)
        assert torch.allclose(hm.w_qk(h), w_q @ w_k.T, atol=1e-6)
        assert torch.linalg.matrix_rank(hm.w_vo(h)) <= d


def test_w_qk_with_key_bias_recomputes_gpt2_attention(tiny):
    """GPT-2 has no position bias inside attention: A_h = softmax(scale (X W_qk X^T + X W_k b_q^T) + mask)."""
    lm = tiny("gpt2")
    tr = walklens.capture(lm, TEXT, attentions=True)
    for layer in range(lm.n_layers):
        hm = walklens.head_matrices(lm, layer)
        X = tr.attn_inputs[f"L{layer}.attn"]
        A = tr.attentions[f"L{layer}.attn"]
        T = X.shape[0]
        mask = torch.full((T, T), float("-inf")).triu(1)
        for h in range(hm.n_heads):
            scores = hm.scale * (hm.qk(h).apply(X) @ X.T + (X @ hm.qk_key_bias(h))[None, :])
            assert torch.allclose(torch.softmax(scores + mask, -1), A[h], atol=1e-5)
            if h == 0:  # without the key-side bias term the attention is wrong
                bad = torch.softmax(hm.scale * (hm.qk(h).apply(X) @ X.T) + mask, -1)
                assert not torch.allclose(bad, A[h], atol=1e-3)


def _sorted_complex(ev: torch.Tensor) -> list[complex]:
    return sorted((complex(z) for z in ev.tolist()), key=lambda z: (round(z.real, 5), round(z.imag, 5)))


def test_factored_matrix_against_dense():
    g = torch.Generator().manual_seed(1)
    D, d = 24, 5
    fm = FactoredMatrix(
        torch.randn(D, d, generator=g, dtype=torch.float64), torch.randn(d, D, generator=g, dtype=torch.float64)
    )
    M = fm.dense()
    assert fm.shape == (D, D)
    assert torch.allclose(fm.norm(), torch.linalg.matrix_norm(M), atol=1e-9)
    assert torch.allclose(fm.norm("spectral"), torch.linalg.matrix_norm(M, 2), atol=1e-9)
    assert torch.allclose(fm.norm("nuclear"), torch.linalg.matrix_norm(M, "nuc"), atol=1e-9)
    U, S, Vh = fm.svd()
    assert U.shape == (D, d) and Vh.shape == (d, D)
    assert torch.allclose(U @ torch.diag(S) @ Vh, M, atol=1e-9)
    assert torch.allclose(S, torch.linalg.svdvals(M)[:d], atol=1e-9)
    assert torch.allclose(U.T @ U, torch.eye(d, dtype=torch.float64), atol=1e-9)
    # eigenvalues through the d x d product equal the dense ones (complex, compared sorted; D - d zeros)
    ev = fm.eigenvalues(pad_zeros=True)
    assert ev.shape == (D,)
    dense_ev = torch.linalg.eigvals(M)
    for a, b in zip(_sorted_complex(ev), _sorted_complex(dense_ev)):
        assert abs(a - b) < 1e-6, (a, b)
    assert any(abs(z.imag) > 1e-3 for z in _sorted_complex(ev))  # the test really compares complex values
    assert torch.allclose(fm.T.dense(), M.T)
    x = torch.randn(3, D, generator=g, dtype=torch.float64)
    assert torch.allclose(fm.apply(x), x @ M, atol=1e-9)


def test_factored_eigenvalues_of_real_heads(tiny):
    hm = walklens.head_matrices(tiny("gpt_neox"), 0)
    vo = hm.vo()  # all heads at once: [H, D, d] @ [H, d, D]
    assert vo.shape == (hm.n_heads, hm.d_model, hm.d_model)
    ev = vo.eigenvalues()
    for h in range(hm.n_heads):
        dense = torch.linalg.eigvals(hm.w_vo(h).double())
        big = sorted(dense.tolist(), key=abs, reverse=True)[: hm.d_head]
        for a, b in zip(_sorted_complex(ev[h].to(torch.complex128)), _sorted_complex(torch.tensor(big))):
            assert abs(a - b) < 1e-4 * max(1.0, abs(b))
    assert torch.allclose(vo.norm(), torch.stack([torch.linalg.matrix_norm(hm.w_vo(h)) for h in range(4)]), rtol=1e-4)
    score = vo.copying_score()
    assert score.shape == (hm.n_heads,) and bool(((score >= -1) & (score <= 1)).all())


def test_cross_attention_matrices_use_encoder_side(tiny):
    lm = tiny("t5")
    hm = walklens.head_matrices(lm, 1, stack="dec", cross=True)
    attn = lm.model.decoder.block[1].layer[1].EncDecAttention
    d = hm.d_head
    assert torch.allclose(hm.w_vo(2), attn.v.weight[2 * d : 3 * d].T @ attn.o.weight[:, 2 * d : 3 * d].T, atol=1e-6)
    enc = walklens.head_matrices(lm, 0, stack="enc")
    assert enc.stack == "enc" and not enc.cross


def test_cluster_view_is_consistent_with_the_module_output(tiny):
    lm = tiny("gpt2")
    tr = walklens.capture(lm, TEXT, attentions=True)
    hm = walklens.head_matrices(lm, 1)
    t = 7
    views = [cluster_view(tr, hm, h, t) for h in range(hm.n_heads)]
    for v in views:
        assert math.isclose(float(v.memberships.sum()), 1.0, rel_tol=1e-5)
        assert float(v.memberships[t + 1 :].abs().max()) == 0.0  # causal: no future members
        # the query moves foreign_mass of the way to the foreign centroid
        assert math.isclose(v.move_distance, v.foreign_mass * v.foreign_distance, rel_tol=1e-4, abs_tol=1e-6)
        assert math.isclose(v.self_mass, float(tr.attentions["L1.attn"][v.head, t, t]), rel_tol=1e-6)
    # sum of the heads' filtered centroids + b_o is the attention output added to the residual at t
    out = sum(v.filtered_centroid for v in views) + hm.b_o
    assert torch.allclose(out, tr[("attn_out", 1)][t], atol=1e-5)


def test_cluster_view_cross_attention(tiny):
    lm = tiny("t5")
    tr = walklens.capture(lm, TEXT, attentions=True)
    v = cluster_view(tr, walklens.head_matrices(lm, 0, "dec", cross=True), 1, 3)
    assert v.self_mass == 0.0 and v.foreign_mass == 1.0 and v.kind == "cross"
    assert len(v.memberships) == len(tr.encoder.tokens)


def test_self_mass(tiny):
    lm = tiny("llama")
    tr = walklens.capture(lm, TEXT, attentions=True)
    sm = self_mass(tr)
    T = len(tr.tokens)
    assert sm.mass.shape == (lm.n_layers, 4)
    A = tr.attentions["L1.attn"]
    assert torch.allclose(sm.mass[1], torch.diagonal(A, dim1=-2, dim2=-1)[:, 1:].mean(-1))
    assert math.isclose(float(sm.uniform[0, 0]), sum(1 / (t + 1) for t in range(1, T)) / (T - 1), rel_tol=1e-6)

    # the attention-sink control, against removing key 0 and renormalising each row by hand
    sk = self_mass(tr, sink=True)
    assert sk.sink_removed and not sm.sink_removed
    for layer in range(lm.n_layers):
        B = tr.attentions[f"L{layer}.attn"].double()[:, :, 1:]
        B = B / B.sum(-1, keepdim=True)  # rows over keys 1..t
        own = torch.stack([B[:, t, t - 1] for t in range(2, T)], dim=1).mean(-1)
        assert torch.allclose(sk.mass[layer].double(), own, rtol=1e-5)
    assert math.isclose(float(sk.uniform[0, 0]), sum(1 / t for t in range(2, T)) / (T - 2), rel_tol=1e-6)
    short = walklens.capture(lm, "a", attentions=True)
    assert len(short.tokens) < 3
    with pytest.raises(InputError, match="at least 3 tokens"):
        self_mass(short, causal=True, sink=True)


def test_bad_input(tiny):
    lm = tiny("llama")
    with pytest.raises(InputError):
        walklens.head_matrices(lm, 5)
    with pytest.raises(InputError):
        walklens.head_matrices(lm, 0, cross=True)
    with pytest.raises(InputError):
        walklens.head_matrices(lm, 0).w_vo(4)
    with pytest.raises(InputError):
        walklens.head_matrices(tiny("t5"), 0, stack="middle")
    assert isinstance(walklens.head_matrices(lm, -1), HeadMatrices)


@pytest.mark.real
def test_identity_and_matrices_on_smollm2(smollm2):
    res = walklens.attention_identity(smollm2, "The capital of France is Paris, and the river is the Seine.")
    assert len(res) == 30
    assert res.max_error < 1e-4, max(res.items(), key=lambda kv: kv[1])
    hm = walklens.head_matrices(smollm2, 3)
    assert hm.n_heads == 9 and hm.kv_head == (0, 0, 0, 1, 1, 1, 2, 2, 2)
    attn = smollm2.model.model.layers[3].self_attn
    d = hm.d_head
    W = attn.v_proj.weight[d : 2 * d].T @ attn.o_proj.weight[:, 4 * d : 5 * d].T
    assert torch.allclose(hm.w_vo(4), W, atol=1e-6)
    U, S, Vh = hm.vo(4).svd()
    assert torch.allclose(S, torch.linalg.svdvals(W)[:d], rtol=1e-3, atol=1e-5)


# ---- command line ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_t5(tmp_path_factory, tiny):
    path = tmp_path_factory.mktemp("tiny") / "t5"
    lm = tiny("t5")
    lm.model.save_pretrained(str(path))
    lm.tokenizer.save_pretrained(str(path))
    return path


def test_cli_heads_json_and_report(saved_t5, tmp_path, capsys):
    import json

    from walklens.cli import main

    out, js = tmp_path / "rep", tmp_path / "h.json"
    rc = main(["heads", TEXT, "--model", str(saved_t5), "--json", str(js), "--out", str(out), "--maps", "0,-1"])
    assert rc == 0, capsys.readouterr().err
    data = json.loads(js.read_text())
    assert data["identity_max"] < 1e-4 and set(data["identity"]) >= {"enc.L1.attn", "dec.L1.cross"}
    assert len(data["cluster"]) == 4 and abs(sum(data["cluster"][0]["memberships"]) - 1) < 1e-5
    assert {"dec.L0.attn", "dec.L0.cross", "enc.L0.attn"} <= set(data["attentions"])
    sinks = [k for k in data["self_mass"] if k.endswith(", position 0 removed")]  # the attention-sink control
    assert sinks and all(data["self_mass"][k]["sink_removed"] for k in sinks)
    assert "position 0 removed" in capsys.readouterr().out
    html = (out / "index.html").read_text()
    assert "A.3 identity" in html and "cross-attention" in html and "position kernels" in html
    assert 'src="http' not in html and "<script src" not in html  # self-contained
    assert html.count("wl-heatmap") >= 6


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--layer", "9"], "out of range"),
        (["--position", "99"], "out of range"),
        (["--maps", "x"], "--maps"),
        (["--stack", "middle"], "no stack"),
    ],
)
def test_cli_heads_bad_input(saved_t5, tmp_path, capsys, args, msg):
    from walklens.cli import main

    rc = main(["heads", TEXT, "--model", str(saved_t5), "--out", str(tmp_path / "r"), *args])
    err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("walklens:")]
    assert rc == 2 and len(err) == 1 and err[0].startswith("walklens: error:") and msg in err[0], err
