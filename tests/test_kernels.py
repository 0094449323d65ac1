"""Position kernels (T5 buckets, ALiBi, empirical) and self-bias classes (seed 000, A.2, Figs. 6 and 8)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import walklens
from walklens.analyses.kernels import StackKernels, classify_kernel, empirical_kernels
from walklens.base.errors import InputError
from walklens.core.interventions import Hooks
from walklens.testing import WORDS, tiny_model

LONG = " ".join(WORDS[i % len(WORDS)] for i in range(0, 7 * 40, 7))  # 40 words -> 40 tokens


@pytest.fixture(scope="module")
def t5():
    return tiny_model("t5")


def _t5_position_biases(lm, ids):
    """position_bias returned by every T5 self-attention module in one forward pass, per stack."""
    got: dict[str, list[torch.Tensor]] = {"enc": [], "dec": []}
    with Hooks() as hooks, torch.no_grad():
        for stack in ("enc", "dec"):
            for layer in range(lm.n_layers):
                mod = lm.adapter.attention_module(lm.model, layer, stack)
                hooks.post(mod, lambda _m, _i, out, s=stack: got[s].append(out[1].detach()[0].clone()))
        lm.model(input_ids=ids, decoder_input_ids=ids, use_cache=False)
    return got


def test_t5_kernels_equal_the_biases_the_model_adds(t5):
    ids = t5.tokenizer(LONG, return_tensors="pt").input_ids
    T = ids.shape[1]
    assert T > 2 * t5.config.relative_attention_max_distance  # the far (log-spaced, clamped) buckets are hit
    pk = walklens.position_kernels(t5, max_distance=T)
    assert pk.scheme == "t5_relative" and [s.stack for s in pk.stacks] == ["enc", "dec"]
    biases = _t5_position_biases(t5, ids)
    for s in pk.stacks:
        assert s.layers == [None]  # one kernel per head, reused by every layer
        for b in biases[s.stack][1:]:  # every layer adds layer 0's bias
            assert torch.equal(b, biases[s.stack][0])
        bias = biases[s.stack][0]  # [H, T, T]
        index = {d: i for i, d in enumerate(s.distances)}
        checked = 0
        for h in range(s.n_heads):
            for i in range(T):
                for j in range(T):
                    if s.causal and j > i:
                        continue
                    assert bias[h, i, j] == s.values[0, h, index[j - i]], (s.stack, h, i, j)
                    checked += 1
        assert checked == s.n_heads * (T * (T + 1) // 2 if s.causal else T * T)
    assert pk.stack("enc").causal is False and pk.stack("dec").causal is True
    assert pk.stack("dec").distances[-1] == 0 and pk.stack("enc").distances[-1] == T


def test_t5_kernel_changes_with_the_weights(t5):
    lm = copy.deepcopy(t5)
    before = walklens.position_kernels(lm).stack("enc").values.clone()
    rel = lm.adapter.attention_module(lm.model, 0, "enc").relative_attention_bias
    with torch.no_grad():
        rel.weight[0, 2] += 3.0  # bucket 0 = distance 0 in the encoder
    after = walklens.position_kernels(lm).stack("enc")
    d0 = after.distances.index(0)
    assert math.isclose(float(after.values[0, 2, d0] - before[0, 2, d0]), 3.0, rel_tol=1e-6)
    assert torch.equal(after.values[0, :2], before[0, :2])


def _zero_input_attention(lm, T):
    """Independent of walklens.analyses.kernels: attention with every attention input zeroed (position bias only)."""
    mods = [lm.adapter.attention_module(lm.model, layer) for layer in range(lm.n_layers)]
    probs = []
    with Hooks() as hooks, torch.no_grad():
        for m in mods:
            hooks.pre(
                m,
                lambda _m, a, k: (
                    ((torch.zeros_like(a[0]),) + a[1:], k)
                    if a
                    else (a, {**k, "hidden_states": torch.zeros_like(k["hidden_states"])})
                ),
                with_kwargs=True,
            )
            hooks.post(m, lambda _m, _i, out: probs.append(out[-1][0].detach()))
        lm.model(input_ids=torch.arange(6, 6 + T)[None])
    return torch.stack(probs)


@pytest.mark.parametrize("family,scale", [("falcon_alibi", 2 / math.sqrt(8)), ("bloom", 1.0), ("mpt", 1.0)])
def test_alibi_slopes_and_kernels_predict_position_only_attention(family, scale):
    """Falcon's eager path adds ALiBi twice after scaling (2/sqrt(d)); BLOOM and MPT add it unscaled."""
    lm = tiny_model(family)
    H = lm.adapter.head_weights(lm.model, 0).n_heads
    pk = walklens.position_kernels(lm, max_distance=20)
    assert pk.scheme == "alibi" and math.isclose(pk.alibi_scale, scale, rel_tol=1e-4)
    # the ALiBi paper's slopes for H a power of two: 2^(-8 (h+1) / H)
    assert torch.allclose(pk.alibi_slopes, torch.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)]))
    s = pk.stacks[0]
    assert s.causal and s.distances == list(range(-20, 1))
    probs = _zero_input_attention(lm, 24)  # [L, H, T, T]
    k = s.values[0]  # [H, 21]
    for i in range(20, 24):
        row = probs[:, :, i, i - 20 : i + 1]  # distances -20..0
        pred = torch.softmax(k, -1) * row.sum(-1, keepdim=True)[0]  # renormalised to the same window mass
        assert torch.allclose(row, pred.expand_as(row), atol=1e-5)
    assert all(c.label == "local" for c in s.classes[0][:2])  # steep ALiBi heads decay with distance
    assert not any(c.negative_self or c.far_amplifying for c in s.classes[0])


def test_empirical_estimator_is_exact_when_attention_ignores_content():
    """With q zeroed, Falcon-ALiBi attention is softmax(ALiBi) whatever the tokens: the estimator must return
    the mean over its query rows of that softmax, with zero spread."""
    lm = copy.deepcopy(tiny_model("falcon_alibi"))
    H, d = lm.config.num_attention_heads, lm.config.hidden_size // lm.config.num_attention_heads
    for layer in lm.model.transformer.h:
        with torch.no_grad():
            layer.self_attention.query_key_value.weight[: H * d].zero_()  # multi-query layout: [q (H d) | k | v]
    T, W = 24, 8
    pk = walklens.position_kernels(lm, max_distance=W)
    slopes, scale = pk.alibi_slopes, pk.alibi_scale
    (emp,), est = empirical_kernels(lm, samples=3, length=T, window=W, progress=False)
    assert "shuffled-token samples" in est
    rows = range(W + 1, T)
    for h in range(H):
        expect = []
        for delta in range(-W, 1):
            vals = []
            for i in rows:
                logits = slopes[h] * scale * torch.arange(-i, 1, dtype=torch.float32)
                vals.append(float(torch.softmax(logits, 0)[i + delta]))
            expect.append(sum(vals) / len(vals))
        for layer in range(lm.n_layers):
            assert torch.allclose(emp.values[layer, h], torch.tensor(expect), atol=1e-5)
    assert float(emp.spread.max()) < 1e-5
    assert torch.allclose(emp.ci95, 1.96 * emp.spread / math.sqrt(3))


def test_empirical_kernels_shape_spread_and_seed():
    lm = tiny_model("llama")
    a = walklens.position_kernels(lm, samples=4, length=24, progress=False)
    b = walklens.position_kernels(lm, samples=4, length=24, progress=False)
    c = walklens.position_kernels(lm, samples=4, length=24, seed=1, progress=False)
    s = a.stacks[0]
    assert a.scheme == "empirical" and a.units == "mean attention weight"
    assert s.values.shape == (lm.n_layers, 4, len(s.distances)) and s.distances == list(range(-11, 1))
    assert torch.equal(s.values, b.stacks[0].values)  # deterministic for a seed
    assert not torch.equal(s.values, c.stacks[0].values)
    assert float(s.spread.max()) > 0 and bool((s.values.sum(-1) <= 1 + 1e-5).all())
    assert s.layers == list(range(lm.n_layers))
    bert = walklens.position_kernels(tiny_model("bert"), samples=3, length=21, progress=False).stacks[0]
    assert not bert.causal and bert.distances == list(range(-5, 6))


def _k(pairs: dict[int, float], W: int = 16, causal: bool = False, base: float = 0.0):
    dist = list(range(-W, 1 if causal else W + 1))
    return torch.tensor([pairs.get(d, base) for d in dist]), dist


def test_classify_kernel():
    k, dist = _k({0: -1.0})
    c = classify_kernel(k, dist, 0.1)
    assert c.negative_self and c.label == "negative self-bias"
    k, dist = _k({0: -0.05})  # attenuated, but less than the margin
    assert not classify_kernel(k, dist, 0.1).negative_self
    assert classify_kernel(k, dist, 0.01).negative_self
    k, dist = _k({0: -1.0}, causal=True)  # causal: compared with delta = -1 only
    assert classify_kernel(k, dist, 0.1).negative_self
    # far-amplifying (Fig. 8): self and far left amplified, intermediate band suppressed
    k, dist = _k({d: (1.0 if d <= -4 else -1.0) for d in range(-16, 0)} | {0: 2.0}, causal=True)
    c = classify_kernel(k, dist, 0.1)
    assert c.far_amplifying and not c.negative_self
    # ALiBi-like decay: local, nothing else
    dist = list(range(-16, 1))
    c = classify_kernel(torch.tensor([0.3 * d for d in dist]), dist, 0.1)
    assert c.local and not (c.far_amplifying or c.negative_self or c.flat) and c.label == "local"
    c = classify_kernel(torch.full((len(dist),), 0.7), dist, 0.1)
    assert c.flat and c.label == "flat"
    with pytest.raises(InputError):
        classify_kernel(torch.zeros(3), [1, 2, 3])


def test_fractions_per_stack_and_margin_sweep():
    k_neg, dist = _k({0: -1.0})
    k_flat, _ = _k({})
    vals = torch.stack([k_neg, k_neg, k_neg, k_flat])[None]  # 1 x 4 heads
    s = StackKernels("enc", False, dist, [None], vals, vals)
    s.classify(0.1)
    f = s.fractions()
    assert f["negative_self"] == 0.75 and f["flat"] == 0.25 and f["label: flat"] == 0.25
    assert s.fractions(2.0)["negative_self"] == 0.0  # a margin larger than the dip


def test_bad_input():
    lm = tiny_model("llama")
    with pytest.raises(InputError):
        walklens.position_kernels(lm, method="weights")
    with pytest.raises(InputError):
        walklens.position_kernels(lm, method="nope")
    with pytest.raises(InputError):
        walklens.position_kernels(lm, margin=-1)
    with pytest.raises(InputError):
        walklens.position_kernels(lm, samples=1, progress=False)


@pytest.mark.real
def test_empirical_kernels_on_smollm2(smollm2):
    pk = walklens.position_kernels(smollm2, samples=4, length=32, progress=False)
    s = pk.stacks[0]
    assert s.values.shape == (30, 9, 16) and bool(torch.isfinite(s.log_values).all())
    f = pk.fractions()["model"]
    assert 0.0 <= f["negative_self"] <= 1.0 and math.isclose(sum(v for k, v in f.items() if k.startswith("label")), 1.0)


# ---- command line ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    def get(fam):
        path = tmp_path_factory.getbasetemp() / f"saved-{fam}"
        if not path.exists():
            lm = tiny_model(fam)
            lm.model.save_pretrained(str(path))
            lm.tokenizer.save_pretrained(str(path))
        return path

    return get


def test_cli_kernels_t5_json_and_report(saved, tmp_path, capsys):
    import json

    from walklens.cli import main

    js, out = tmp_path / "k.json", tmp_path / "rep"
    assert main(["kernels", "--model", str(saved("t5")), "--json", str(js), "--out", str(out)]) == 0
    data = json.loads(js.read_text())
    pk = walklens.position_kernels(tiny_model("t5"))
    assert data["scheme"] == "t5_relative" and [s["stack"] for s in data["stacks"]] == ["enc", "dec"]
    for st, f in pk.fractions().items():
        assert data["fractions"][st] == pytest.approx(f)
    assert torch.allclose(torch.tensor(data["stacks"][0]["values"]), pk.stack("enc").values, atol=1e-6)
    html = (out / "index.html").read_text()
    assert "self-bias classes" in html and "wl-lines" in html
    text = capsys.readouterr().out
    assert "negative_self" in text and "enc" in text


def test_cli_kernels_empirical_and_errors(saved, tmp_path, capsys):
    import json

    from walklens.cli import main

    js = tmp_path / "k.json"
    assert main(["kernels", "--model", str(saved("llama")), "--samples", "3", "--length", "20", "--json", str(js)]) == 0
    data = json.loads(js.read_text())
    assert data["scheme"] == "empirical" and len(data["stacks"][0]["spread"]) == 2
    for args, msg in (
        (["--method", "weights"], "no position bias"),
        (["--samples", "1"], "--samples"),
        (["--margin", "-1"], "margin"),
        (["--corpus", "@/no/such/file"], "no such file"),
    ):
        rc = main(["kernels", "--model", str(saved("llama")), *args])
        err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("walklens:")]
        assert rc == 2 and len(err) == 1 and msg in err[0], (args, err)


def test_cli_kernels_reproduces_planted_t5_fractions(tmp_path, capsys):
    """The seed's T5 figures come from one command; here on a tiny T5 whose biases are planted: 3 of 4 encoder
    heads attenuate distance 0 (75% negative self-bias), 1 of 4 decoder heads amplifies far positions (25%)."""
    import json

    from walklens.cli import main

    lm = copy.deepcopy(tiny_model("t5"))
    enc = lm.adapter.attention_module(lm.model, 0, "enc").relative_attention_bias
    dec = lm.adapter.attention_module(lm.model, 0, "dec").relative_attention_bias
    with torch.no_grad():
        enc.weight.zero_()
        enc.weight[0, :3] = -2.0  # bucket 0 = distance 0
        enc.weight[0, 3] = 2.0
        dec.weight.zero_()
        dec.weight[4:, 1] = 2.0  # causal buckets 4..7 = distances 4..16 (the far band); bucket 3 = distance 3
    path = tmp_path / "planted"
    lm.model.save_pretrained(str(path))
    lm.tokenizer.save_pretrained(str(path))
    js = tmp_path / "k.json"
    assert main(["kernels", "--model", str(path), "--json", str(js)]) == 0
    f = json.loads(js.read_text())["fractions"]
    assert f["enc"]["negative_self"] == 0.75 and f["enc"]["far_amplifying"] == 0.0
    assert f["dec"]["far_amplifying"] == 0.25 and f["dec"]["negative_self"] == 0.0
    assert f["dec"]["flat"] == 0.75
