"""Seed 002 (power method): spectra of F = W_V W_O, alignment with chance baselines, analytic convergence
for shared weights, idealised dynamics, eigen-steering and activation addition."""

from __future__ import annotations

import json
import math

import pytest
import torch

import walklens
from _ties import assert_picks_match, assert_ranks_match
from oracles import eigen_dense
from walklens.analyses.idealised import dynamics, shared_weights
from walklens.analyses.power import (
    alignment_from_states,
    fitted_rate,
    power_iterate,
    power_spectra,
    predicted_alignment,
)
from walklens.analyses.steering import direction, steering_sweep
from walklens.base.errors import InputError
from walklens.core.interventions import ablate_mlps, tied_layers
from walklens.core.ov import eigen_factored, ov_factors, ov_matrix, residual_gap
from walklens.testing import tiny_model

TEXTS = ["the cat and the dog walk to the house", "paris is the capital of france"]


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")  # grouped-query attention: 4 heads, 2 kv heads


@pytest.fixture(scope="module")
def gpt2():
    return tiny_model("gpt2")  # multi-head attention, H d = D


def _same_subspace(a: torch.Tensor, b: torch.Tensor) -> float:
    """Smallest cosine of the principal angles between the row spaces of a and b (1 = identical)."""
    return float(torch.linalg.svdvals(a.double() @ b.double().T).min())


def _planted(D: int = 12, r: int = 5, seed: int = 0, top: float = 5.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Factors A [D, r], B [r, D] with B A = diag(top, 2, 1, 0.5, 0.25) + small noise (a real, dominant lambda1)."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(D, r, generator=g, dtype=torch.float64)
    M0 = torch.diag(torch.tensor([top, 2.0, 1.0, 0.5, 0.25][:r], dtype=torch.float64))
    M0 += 0.05 * torch.randn(r, r, generator=g, dtype=torch.float64)
    B = M0 @ torch.linalg.pinv(A)
    return A, B


# ---- spectra -------------------------------------------------------------------------------------------------


def test_factored_v1_equals_dense_eigenvector_planted():
    A, B = _planted()
    f, d = eigen_factored(A, B), eigen_dense(A @ B)
    assert not f.complex_pair and not d.complex_pair
    assert abs(f.lambda1 - d.lambda1) < 1e-10
    assert abs(abs(float(f.v1 @ d.v1)) - 1) < 1e-10  # equal up to sign
    F = A @ B
    assert torch.allclose(f.v1 @ F, f.lambda1.real * f.v1, atol=1e-10)  # left eigenvector: v1 F = lambda1 v1
    assert torch.allclose(F @ f.v1_right, f.lambda1.real * f.v1_right, atol=1e-10)
    lam = torch.linalg.eigvals(B @ A)
    assert f.gap == pytest.approx(float(sorted(lam.abs(), reverse=True)[1] / lam.abs().max()), rel=1e-10)


@pytest.mark.parametrize("family", ["llama", "gpt2", "albert"])
def test_power_spectra_matches_dense_per_layer_and_head(family):
    lm = tiny_model(family)
    sp = power_spectra(lm)
    assert len(sp) == lm.n_layers
    for s in sp.layers:
        F = ov_matrix(lm, s.layer)
        d = eigen_dense(F)
        k = len(s.eigenvalues)
        dense_nonzero = d.eigenvalues[:k]
        assert torch.allclose(s.eigenvalues.abs(), dense_nonzero.abs(), atol=1e-8)
        assert s.complex_pair == d.complex_pair
        assert _same_subspace(s.basis, d.basis) > 1 - 1e-8  # v1 (or its plane) up to sign / phase
        # the basis is F-invariant: rows of basis @ F stay in span(basis)
        img = s.basis @ F
        resid = img - (img @ s.basis.T) @ s.basis
        assert resid.abs().max() < 1e-8 * max(1.0, img.abs().max().item())
        for h in s.heads:
            dh = eigen_dense(ov_matrix(lm, s.layer, h.head))
            assert abs(abs(complex(h.eigenvalues[0])) - abs(dh.lambda1)) < 1e-8
            assert (
                torch.allclose(h.v1.double().abs(), dh.v1.abs(), atol=1e-6)
                or _same_subspace(eigen_factored(*ov_factors(lm, s.layer, h.head)).basis, dh.basis) > 1 - 1e-8
            )
    if family == "albert":  # one shared layer: the same spectrum at every depth
        assert sp.shared and torch.equal(sp.layers[0].v1, sp.layers[-1].v1)


def test_gqa_factor_uses_kv_head_of_each_query_head(llama):
    hw = llama.adapter.head_weights(llama.model, 0)
    F = sum(hw.w_v[hw.kv_head[h]].double() @ hw.w_o[h].double() for h in range(hw.n_heads))
    assert torch.allclose(ov_matrix(llama, 0), F, atol=1e-12)
    # and F acts like the attention module's value/output path on a token attending only to itself
    attn = llama.adapter.attention_module(llama.model, 0)
    x = torch.randn(3, hw.d_model, dtype=torch.float64)
    via_modules = attn.o_proj.double()(
        attn.v_proj.double()(x).view(3, -1, hw.d_head)[:, list(hw.kv_head)].reshape(3, -1)
    )
    attn.float()
    assert torch.allclose(via_modules, x @ F, atol=1e-9)


def test_nearest_tokens_are_nearest(llama):
    s = power_spectra(llama, layers=[1], heads=False, nearest=3).layers[0]
    if s.complex_pair:
        pytest.skip("plane: nearest by projection")
    V = llama.embedding_matrix().detach().double()
    cos = (V / V.norm(dim=1, keepdim=True)) @ s.v1
    # the nearest token is the argmax of the cosines, but for float near-ties (tests/_ties.py)
    pick = next(int(i) for i in cos.topk(8).indices if llama.tokenizer.decode([int(i)]) == s.nearest[0])
    assert_picks_match(pick, cos, "nearest token")
    assert s.nearest_cos[0] == pytest.approx(float(cos.max()), abs=1e-6)


# ---- alignment and the analytic rate ---------------------------------------------------------------------------


def _linear_model(D: int = 16, seed: int = 0) -> tuple[torch.Tensor, float]:
    g = torch.Generator().manual_seed(seed)
    S = torch.randn(D, D, generator=g, dtype=torch.float64)
    lam = torch.tensor([2.0, 1.0] + [0.5 * 0.9**i for i in range(D - 2)], dtype=torch.float64)
    F = torch.linalg.solve(S, torch.diag(lam) @ S)  # F = S^-1 diag S (left eigenvectors are S's rows)
    return F, 0.5


def test_shared_weight_linear_model_converges_at_analytic_rate():
    F, rho = _linear_model()
    e = eigen_dense(F)
    assert e.gap == pytest.approx(rho, rel=1e-9)
    x0 = torch.randn(40, F.shape[0], generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    traj = power_iterate(F, x0, 30)
    cos = (traj / traj.norm(dim=-1, keepdim=True) @ e.v1).abs()  # [31, 40]
    for t in range(40):  # per token: tan(theta) shrinks by rho per step, asymptotically
        assert fitted_rate(cos[:, t], start=10) == pytest.approx(rho, rel=0.02)
    pred = predicted_alignment(cos[0], rho, 30)
    assert (pred[-5:] - cos.mean(1)[-5:]).abs().max() < 1e-4  # analytic curve meets the measured one
    assert cos.mean(1)[-1] > 0.999


def test_shared_weights_on_tiny_albert_power_curve_rate():
    lm = tiny_model("albert")
    sw = shared_weights(lm, TEXTS[:1], layer=0, n_layers=30)
    assert sw.n_layers == 30 and len(sw.measured) == 31 and len(sw.power) == 31
    assert sw.power[-1] > sw.power[0] and sw.power[-1] > 0.95  # the pure power method aligns with v1
    assert sw.fitted_power == pytest.approx(sw.rate, rel=0.1)
    assert lm.n_layers == 3  # depth restored


def test_alignment_baselines_and_per_point_values():
    torch.manual_seed(0)
    D, L = 24, 3
    F, _ = _linear_model(D)
    sp = walklens.analyses.power.PowerSpectra("constructed", D, [], False)
    for l in range(L):
        e = eigen_dense(F)
        sp.layers.append(walklens.analyses.power.LayerSpectrum(**e.__dict__, layer=l, residual_gap=float("nan")))
    x0 = torch.randn(30, D, dtype=torch.float64)
    traj = power_iterate(F, x0, L)[1:]  # [L, N, D]: states "after" each layer
    al = alignment_from_states([traj.float()], [f"L{l}.resid_post" for l in range(L)], list(range(L)), sp, n_random=400)
    manual = (traj / traj.norm(dim=-1, keepdim=True) @ sp.layers[0].v1).abs().mean(1)
    assert torch.allclose(torch.tensor(al.mean, dtype=torch.float64), manual, atol=1e-5)
    assert al.mean[0] < al.mean[1] < al.mean[2]  # grows with depth
    # random baseline: |cos| of a fixed set of vectors with isotropic directions ~ E|cos| = Gamma(D/2)/(sqrt(pi)
    # Gamma((D+1)/2))
    expected = math.exp(math.lgamma(D / 2) - math.lgamma((D + 1) / 2)) / math.sqrt(math.pi)
    assert al.random_mean[0] == pytest.approx(expected, rel=0.15)
    assert all(m > hi for m, hi in zip(al.mean, al.random_hi))


def test_alignment_on_tiny_model(llama):
    al = walklens.alignment(llama, TEXTS, n_random=20, n_shuffles=5)
    assert al.points[:3] == ["L0.resid_pre", "L0.resid_mid", "L0.resid_post"]
    assert al.n_tokens == sum(len(llama.tokenizer(t)["input_ids"]) for t in TEXTS)
    sp = power_spectra(llama, heads=False, nearest=0)
    tr = walklens.capture(llama, TEXTS[0])
    x = tr["L1.resid_mid"].double()
    b = sp.layers[1].basis
    manual = (x @ b.T).norm(dim=1) / x.norm(dim=1)
    i = al.points.index("L1.resid_mid")
    assert torch.allclose(al.per_token[0][i].double(), manual, atol=1e-5)
    for lo, m, hi in zip(al.random_lo, al.random_mean, al.random_hi):
        assert lo <= m <= hi
    # the count above each band, counted by hand, printed with the number expected by chance
    from walklens.analyses.chance import count_above_p, expected_by_chance
    from walklens.reports.power import band_counts

    post = [i for i, p in enumerate(al.points) if p.endswith(".resid_post")]
    for band, top in (("random", al.random_hi), ("other", al.other_hi)):
        assert al.above(band) == (sum(al.mean[i] > top[i] for i in post), len(post))
    c, n = al.above("random")
    assert f"{c} of {n} ({expected_by_chance(n, 0.05):.3g} expected by chance" in band_counts(al)
    assert expected_by_chance(30, 0.05) == 1.5 and count_above_p(0, 30, 0.05) == 1.0
    assert count_above_p(6, 30, 0.05) == pytest.approx(
        1 - sum(math.comb(30, j) * 0.05**j * 0.95 ** (30 - j) for j in range(6))
    )


# ---- dynamics ---------------------------------------------------------------------------------------------------


def test_ablate_mlps_zeroes_feed_forward(llama):
    with ablate_mlps(llama):
        tr = walklens.capture(llama, TEXTS[0])
    assert tr["L0.mlp_out"].abs().max() == 0
    assert torch.equal(tr["L1.resid_post"], tr["L1.resid_mid"])
    tr2 = walklens.capture(llama, TEXTS[0])  # hooks removed
    assert tr2["L0.mlp_out"].abs().max() > 0


def test_dynamics_modes(llama):
    d = dynamics(llama, TEXTS[:1])
    assert d.agreement["real"] == pytest.approx([1.0] * llama.n_layers, abs=1e-5)
    # the power mode is the normalised product with F_l, from the real input of layer 0
    tr = walklens.capture(llama, TEXTS[0])
    x = tr["L0.resid_pre"].double() @ ov_matrix(llama, 0)
    b = power_spectra(llama, layers=[0], heads=False, nearest=0).layers[0].basis
    assert d.alignment["power"][0] == pytest.approx(float(((x @ b.T).norm(dim=1) / x.norm(dim=1)).mean()), abs=1e-5)
    assert d.alignment["mlp_ablated"] != d.alignment["real"]


def test_tied_layers_first_application_equals_real_and_restores(llama):
    real = walklens.capture(llama, TEXTS[0])
    layers_before = llama.model.model.layers
    with tied_layers(llama, layer=0, n_layers=5):
        tr = walklens.capture(llama, TEXTS[0])
        assert tr.n_layers == 5
    assert torch.allclose(tr["L0.resid_post"], real["L0.resid_post"], atol=1e-6)
    assert not torch.allclose(tr["L1.resid_post"], real["L1.resid_post"], atol=1e-3)
    assert llama.model.model.layers is layers_before and llama.n_layers == 2


# ---- steering ----------------------------------------------------------------------------------------------------


def _logits(lm, text):
    ids = lm.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return lm.model(input_ids=ids).logits[0, -1]


@pytest.mark.parametrize("method", ["eigen", "add"])
def test_alpha_zero_changes_nothing(llama, method):
    base = _logits(llama, TEXTS[0])
    with walklens.steer(llama, toward=" cat", layers=[0, 1], alpha=0.0, method=method):
        assert torch.equal(_logits(llama, TEXTS[0]), base)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3", "falcon"])
def test_weights_bit_identical_after_exit_even_on_error(family):
    lm = tiny_model(family)
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    with pytest.raises(RuntimeError):
        with walklens.steer(lm, toward=" dog", layers=[0, 1], alpha=3.0, method="eigen", sign=1):
            assert not all(torch.equal(before[k], v) for k, v in lm.model.state_dict().items())
            raise RuntimeError("boom")
    assert all(torch.equal(before[k], v) for k, v in lm.model.state_dict().items())
    with walklens.steer(lm, toward=" dog", layers=[1], alpha=3.0, method="add"):
        pass
    assert all(torch.equal(before[k], v) for k, v in lm.model.state_dict().items())
    assert not any(m._forward_hooks for m in lm.model.modules())


def test_eigen_edit_realises_rank_one_update_mha(gpt2):
    u, _, _ = direction(gpt2, " cat")
    F0 = ov_matrix(gpt2, 1)
    with walklens.steer(gpt2, toward=" cat", layers=1, alpha=2.5, method="eigen", sign=1) as r:
        F1 = ov_matrix(gpt2, 1)
    assert r.edits[0].reach == pytest.approx(1.0, abs=1e-9)  # u is in the value space: F' = F + alpha u u^T
    assert torch.allclose(F1 - F0, 2.5 * torch.outer(u, u), atol=1e-5)
    assert r.edits[0].error < 1e-5


def test_eigen_edit_gqa_projects_read_side(llama):
    u, _, _ = direction(llama, " cat")
    A, _ = ov_factors(llama, 0)
    w = A @ (torch.linalg.pinv(A) @ u)
    F0 = ov_matrix(llama, 0)
    with walklens.steer(llama, toward=" cat", layers=[0], alpha=1.5, method="eigen", sign=1) as r:
        F1 = ov_matrix(llama, 0)
    assert torch.allclose(F1 - F0, 1.5 * torch.outer(w, u), atol=1e-5)
    assert r.edits[0].reach == pytest.approx(float(w.norm()), rel=1e-9) and r.edits[0].reach < 1
    # u F' = u F + alpha |P u|^2 u: with large alpha u becomes the principal left eigenvector
    with walklens.steer(llama, toward=" cat", layers=[0], alpha=200.0, method="eigen", sign=1):
        e = eigen_factored(*ov_factors(llama, 0))
    assert abs(float(e.v1 @ u)) > 0.99


@pytest.mark.parametrize("method", ["eigen", "add"])
def test_target_logit_rises_monotonically_with_alpha(llama, method):
    tid = llama.tokenizer(" cat", add_special_tokens=False)["input_ids"][0]
    text, vals = "the dog and the cat and the", []
    for a in [0.0, 1.0, 2.0, 4.0, 8.0]:
        with walklens.steer(llama, toward=" cat", layers=[0, 1], alpha=a, method=method, prompts=[text]):
            vals.append(float(_logits(llama, text)[tid]))
    assert all(b > a for a, b in zip(vals, vals[1:])), vals


def test_steering_sweep_rows(llama):
    sw = steering_sweep(
        llama, ["the dog and the", "a big red"], " cat", [[1], [0, 1]], alphas=[0.0, 4.0], max_new_tokens=3
    )
    assert len(sw.rows) == 2 * 2 * 2 * 2
    zero = [r for r in sw.rows if r.alpha == 0.0]
    for r in zero:  # alpha 0: identical to the unsteered model in both methods
        assert r.push == 0 and r.injection == 0
    add = [r for r in sw.rows if r.method == "add" and r.alpha == 4.0]
    assert all(r.push == pytest.approx(4.0, rel=1e-4) for r in add)  # activation addition pushes exactly alpha u
    base = _logits(llama, "the dog and the")
    tid = llama.tokenizer(" cat", add_special_tokens=False)["input_ids"][0]
    r0 = next(r for r in zero if r.prompt == "the dog and the")
    assert r0.target_logit == pytest.approx(float(base[tid]), abs=1e-5)
    assert_ranks_match(r0.target_rank, base, tid, "target rank")  # 0-based; equal but for float near-ties
    assert all(r.perplexity > 1 for r in sw.rows)
    al, ys = sw.curve("add", [0, 1])
    assert al == [0.0, 4.0] and ys[1] > ys[0]


def test_bad_input(llama):
    with pytest.raises(InputError):
        with walklens.steer(llama, toward=" cat", layers=[7], alpha=1.0):
            pass
    with pytest.raises(InputError):
        with walklens.steer(llama, toward=" cat", layers=[0], alpha=1.0, method="nope"):
            pass
    with pytest.raises(InputError):
        walklens.alignment(llama, ["  "])


# ---- command line and report ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, llama):
    d = tmp_path_factory.mktemp("tiny_llama")
    llama.model.save_pretrained(str(d), safe_serialization=True)
    llama.tokenizer.save_pretrained(str(d))
    return d


def test_cli_power_and_steer(tiny_dir, tmp_path, capsys):
    from walklens.cli import main

    js, out = tmp_path / "p.json", tmp_path / "rep"
    assert (
        main(
            [
                "power",
                "the cat and the dog",
                "paris is the capital",
                "--model",
                str(tiny_dir),
                "--json",
                str(js),
                "--out",
                str(out),
                "--shared-layer",
                "1",
                "--shared-depth",
                "6",
            ]
        )
        == 0
    )
    data = json.loads(js.read_text())
    assert len(data["spectra"]["layers"]) == 2 and len(data["alignment"]["mean"]) == 6
    assert len(data["shared_weights"]["measured"]) == 7
    html = (out / "index.html").read_text()
    assert "Alignment through depth" in html and "Shared weights" in html
    js2, out2 = tmp_path / "s.json", tmp_path / "rep2"
    assert (
        main(
            [
                "steer",
                "the dog and the",
                "--toward",
                " cat",
                "--layers",
                "0-1",
                "--alpha",
                "0,4",
                "--method",
                "both",
                "--max-new-tokens",
                "2",
                "--model",
                str(tiny_dir),
                "--json",
                str(js2),
                "--out",
                str(out2),
            ]
        )
        == 0
    )
    rows = json.loads(js2.read_text())["rows"]
    assert len(rows) == 4 and {r["method"] for r in rows} == {"eigen", "add"}
    assert "Eigen-steering" in (out2 / "index.html").read_text()
    assert main(["steer", "the dog", "--toward", " cat", "--layers", "9", "--model", str(tiny_dir)]) == 2
    assert "walklens: error:" in capsys.readouterr().err


# ---- the real model --------------------------------------------------------------------------------------------------


@pytest.mark.real
def test_real_smollm2_factored_equals_dense_and_steer_restores(smollm2):
    for l in (0, 29):
        s = power_spectra(smollm2, layers=[l], heads=False, nearest=3).layers[0]
        d = eigen_dense(ov_matrix(smollm2, l))
        assert abs(abs(s.lambda1) - abs(d.lambda1)) < 1e-8 * abs(d.lambda1)
        assert _same_subspace(s.basis, d.basis) > 1 - 1e-6
    p = smollm2.model.model.layers[10].self_attn.o_proj.weight
    before = p.detach().clone()
    with walklens.steer(smollm2, toward=" Paris", layers=[10], alpha=5.0, method="eigen") as r:
        assert not torch.equal(p, before)
        assert r.edits[0].error < 1e-4 and 0 < r.edits[0].reach < 1  # GQA: 3 kv heads of 64 < 576
    assert torch.equal(p, before)


def test_residual_gap_skips_conjugate_and_counts_null_space():
    ev = torch.tensor([1 + 1j, 1 - 1j, 0.5 + 0j], dtype=torch.complex128)  # 1 + lambda: 2 +- 1i, 1.5; plus 1
    assert residual_gap(ev, d_model=3) == pytest.approx(1.5 / math.sqrt(5), rel=1e-12)
    ev = torch.tensor([-0.1 + 0j], dtype=torch.complex128)  # 0.9, and 1 on the null space dominates
    assert residual_gap(ev, d_model=4) == pytest.approx(0.9, rel=1e-12)


def test_direction_of_text_is_mean_of_token_rows(llama):
    V = llama.embedding_matrix().detach().double()
    ids = llama.tokenizer(" cat dog", add_special_tokens=False)["input_ids"]
    assert len(ids) == 2
    u, tid, _ = direction(llama, " cat dog")
    m = V[ids].mean(0)
    assert torch.allclose(u, m / m.norm(), atol=1e-12) and tid == ids[0]


def test_shared_layer_is_edited_once_and_restored():
    lm = tiny_model("albert")
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    u = torch.randn(32, dtype=torch.float64)
    F0 = ov_matrix(lm, 0)
    with walklens.steer(lm, toward=u, layers=[0, 1, 2], alpha=1.5, method="eigen", sign=1) as r:
        assert len(r.edits) == 1 and r.edits[0].shared_with == [0, 1, 2]
        F1 = ov_matrix(lm, 2)
    un = u / u.norm()
    assert torch.allclose(F1 - F0, 1.5 * torch.outer(un, un), atol=1e-5)  # MHA with invertible W_V: exact u u^T
    assert all(torch.equal(before[k], v) for k, v in lm.model.state_dict().items())


def test_alignment_needs_spectra_of_every_layer(llama):
    sp = power_spectra(llama, layers=[0], heads=False, nearest=0)
    with pytest.raises(InputError):
        walklens.alignment(llama, TEXTS[:1], spectra=sp)


def test_linear_dynamics_on_falcon_new_architecture_norm_names():
    lm = tiny_model("falcon")  # new decoder architecture: ln_attn instead of input_layernorm
    d = dynamics(lm, TEXTS[:1], modes=("real", "linear"))
    assert d.modes == ["real", "linear"] and not d.notes
    assert all(0 <= a <= 1 for a in d.alignment["linear"])
