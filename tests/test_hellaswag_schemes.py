"""A.6 schemes: string round trip, validation with reasons, and every composition function and metric against
hand-computed values."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from walklens.analyses.concepts.compose import compose_context
from walklens.analyses.concepts.schemes import (
    ENCODING_SCHEMES,
    EXAMPLE_AGG_SCHEMES,
    NORMS,
    SEGMENT_AGG_SCHEMES,
    WORD_AGG_SCHEMES,
    Scheme,
    canonical_layer,
    normalize,
    resolve_layer,
    similarity,
    word_aggregate,
)
from walklens.base.errors import InputError
from walklens.lab.concepts import similarity as t2
from walklens.lab.experiments.grid import GridSpec
from walklens.lab.hellaswag.baseline import accuracy, argmax_first, item_result, picks
from walklens.lab.hellaswag.data import HellaswagItem
from walklens.lab.hellaswag.store import ItemResult


def test_round_trip_over_a_grid():
    n = 0
    for enc, layer, word, norm, seg, ex in itertools.product(
        ENCODING_SCHEMES,
        ("E", "middle", "0", "-1", "+3"),
        WORD_AGG_SCHEMES,
        NORMS,
        SEGMENT_AGG_SCHEMES,
        EXAMPLE_AGG_SCHEMES,
    ):
        s = Scheme(enc=enc, layer=layer, word=word, norm=norm, seg=seg, ex=ex)
        assert Scheme.parse(str(s)) == s
        t2 = Scheme(
            enc=enc, layer=layer, word=word, norm=norm, seg=seg, ex=ex, sim="cosine", out_layer="-2", out_word="last"
        )
        assert Scheme.parse(str(t2)) == t2
        n += 1
    assert n == 6 * 5 * 11 * 4 * 2 * 3
    s = Scheme.parse("enc=concat_each_example,layer=-1,word=w1mean,norm=None,seg=mean,ex=mean")
    assert str(s) == "enc=concat_each_example,layer=-1,word=w1mean,norm=None,seg=mean,ex=mean"
    assert Scheme(enc="token_level", layer=3, word="last").layer == "3"  # ints become canonical strings


@pytest.mark.parametrize(
    "bad,msg",
    [
        ("", "empty"),
        ("enc=concat_each_example,layer=-1", "lacks word"),
        ("enc=concat_each_example,layer=-1,word=w1mean,foo=1", "unknown scheme key"),
        ("enc=concat_each_example,layer=-1,word=w2mean", "invalid word"),
        ("enc=nope,layer=-1,word=mean", "invalid enc"),
        ("enc=concat_each_example,layer=top,word=mean", "invalid layer"),
        ("enc=concat_each_example,layer=1,word=mean,norm=L3", "invalid norm"),
        ("enc=concat_each_example,layer=1,layer=2,word=mean", "twice"),
    ],
)
def test_parse_refuses(bad, msg):
    with pytest.raises(InputError, match=msg):
        Scheme.parse(bad)


@pytest.mark.parametrize(
    "spec,test,arch,msg",
    [
        ("enc=concat_each_example,layer=-1,word=mean,sim=dot", 1, "decoder", "belong to Test 2"),
        ("enc=concat_each_example,layer=-1,word=mean,ex=soft_cluster", 1, "decoder", "only Test 2"),
        ("enc=cross_encoding,layer=-1,word=mean", 1, "decoder", "ordinary run"),
        ("enc=concat_each_example,layer=-1,word=mean", 2, "decoder", "similarity function"),
        ("enc=cross_encoding,layer=-1,word=mean,sim=dot", 2, "decoder", "no separate context"),
        ("enc=concat_each_example,layer=-1,word=last", 1, "encoder-decoder", "causal masking"),
        ("enc=concat_each_example,layer=-1,word=mean,sim=dot,out_word=last", 2, "seq2seq", "causal masking"),
        ("enc=concat_each_example,layer=-1,word=mean", 1, "encoder", "causal or encoder-decoder"),
    ],
)
def test_validate_refuses_with_reason(spec, test, arch, msg):
    with pytest.raises(InputError, match=msg):
        Scheme.parse(spec).validate(test, arch)


def test_standard_presets():
    assert (
        str(Scheme.standard(1, "decoder")) == "enc=concat_each_example,layer=-1,word=w1mean,norm=None,seg=mean,ex=mean"
    )
    assert Scheme.standard(1, "encoder-decoder").word == "mean"
    s2 = Scheme.standard(2, "decoder")
    assert (s2.sim, s2.out_layer, s2.out_word) == ("dot", "-1", "w1mean")
    for t, a in itertools.product((1, 2), ("decoder", "encoder-decoder")):
        Scheme.standard(t, a).validate(t, a)
    assert Scheme.from_spec("standard", 2, "causal") == s2
    # token-level with E/last is allowed on every architecture (the exactness test needs it)
    Scheme(enc="token_level", layer="E", word="last", seg=None, ex=None).validate(1, "encoder-decoder")


def test_resolve_layer():
    # 30-layer stack: 31 hidden states, 0..29 inputs of the layers, 30 the top after the final norm
    assert resolve_layer("E", 30) is None
    assert [resolve_layer(x, 30) for x in ("0", "29", "30", "-1", "-2", "-31", "middle")] == [0, 29, 30, 30, 29, 0, 15]
    with pytest.raises(InputError, match="out of range"):
        resolve_layer("31", 30)
    with pytest.raises(InputError, match="out of range"):
        resolve_layer("-32", 30)


def test_word_aggregation_by_hand():
    x = torch.tensor([[1.0, -2.0], [3.0, -4.0]])
    relu = torch.relu
    assert torch.equal(word_aggregate(x, "mean"), torch.tensor([2.0, -3.0]))
    # w1mean: weights 1/2 and 2/2, divided by their sum: (1*x1 + 2*x2) / 3
    assert torch.allclose(word_aggregate(x, "w1mean"), torch.tensor([7 / 3, -10 / 3]))
    assert torch.equal(word_aggregate(x, "last"), torch.tensor([3.0, -4.0]))
    assert torch.equal(word_aggregate(x, "relu|mean", relu), torch.tensor([2.0, 0.0]))
    assert torch.equal(word_aggregate(x, "-relu|mean", relu), torch.tensor([0.0, -3.0]))  # -relu(-x) = min(x, 0)
    assert torch.equal(word_aggregate(x, "relu+|mean", relu), torch.tensor([4.0, -3.0]))  # x + relu(x)
    assert torch.equal(word_aggregate(x, "-relu+|mean", relu), torch.tensor([2.0, -6.0]))  # x + min(x, 0)
    assert torch.allclose(word_aggregate(x, "relu|w1mean", relu), torch.tensor([7 / 3, 0.0]))
    # the model's own activation, not a hard-coded relu
    gelu = torch.nn.functional.gelu
    assert torch.allclose(word_aggregate(x, "relu|mean", gelu), gelu(x).mean(0))
    # masks: padding is ignored, "last" is the last real vector, w1mean weights count real tokens only
    y = torch.tensor([[[1.0], [2.0], [4.0], [100.0]]])
    m = torch.tensor([[1, 1, 1, 0]])
    assert word_aggregate(y, "last", mask=m).item() == 4.0
    assert math.isclose(word_aggregate(y, "w1mean", mask=m).item(), 17 / 6, rel_tol=1e-6)
    assert math.isclose(word_aggregate(y, "mean", mask=m).item(), 7 / 3, rel_tol=1e-6)
    # batched over extra leading dims ([B, L, T, D])
    z = torch.randn(2, 3, 5, 4)
    assert torch.allclose(word_aggregate(z, "mean"), z.mean(-2))


def test_norms_by_hand():
    assert torch.allclose(normalize(torch.tensor([3.0, 4.0]), "L2"), torch.tensor([0.6, 0.8]))
    assert torch.allclose(normalize(torch.tensor([1.0, 2.0, 3.0]), "varNorm"), torch.tensor([1.0, 2.0, 3.0]))  # std 1
    assert torch.allclose(normalize(torch.tensor([2.0, 4.0, 6.0]), "varNorm"), torch.tensor([1.0, 2.0, 3.0]))
    z = 1 / math.sqrt(2 / 3 + 1e-5)
    assert torch.allclose(normalize(torch.tensor([1.0, 2.0, 3.0]), "zNorm"), torch.tensor([-z, 0.0, z]))
    v = torch.tensor([1.0, 2.0])
    assert normalize(v, None) is v


def test_similarity_and_test2_scoring_by_hand():
    ctx = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    ends = torch.tensor([[2.0, 1.0], [0.0, 3.0]])
    assert torch.equal(similarity(ctx, ends, "dot"), torch.tensor([[2.0, 1.0], [0.0, 3.0]]))
    dot = Scheme(enc="concat_each_example", layer="-1", word="mean", ex=None, sim="dot")
    assert torch.equal(t2.test2_from_vectors(ctx, ends, dot), torch.tensor([2.0, 3.0]))  # best-matching context vector
    cos = Scheme(enc="concat_each_example", layer="-1", word="mean", ex=None, sim="cosine")
    assert torch.allclose(t2.test2_from_vectors(ctx, ends, cos), torch.tensor([2 / math.sqrt(5), 1.0]))
    sc = Scheme(enc="concat_each_example", layer="-1", word="mean", ex="soft_cluster", sim="dot")
    # ending 0: weights softmax([2, 1]) -> context (e^2, e^1)/(e^2+e^1); score = its dot with (2, 1)
    w0 = torch.softmax(torch.tensor([2.0, 1.0]), 0)
    w1 = torch.softmax(torch.tensor([0.0, 3.0]), 0)
    expect = torch.tensor([2 * w0[0] + 1 * w0[1], 3 * w1[1]])
    assert torch.allclose(t2.test2_from_vectors(ctx, ends, sc), expect)


def test_compose_context_by_hand():
    e1 = torch.tensor([[1.0, 1.0], [3.0, 5.0]])  # example 1: two segment vectors
    e2 = torch.tensor([[5.0, 3.0]])  # example 2: one
    assert torch.equal(compose_context([e1, e2], "mean", None, None), torch.tensor([[2.0, 3.0], [5.0, 3.0]]))
    assert torch.equal(compose_context([e1, e2], "mean", "mean", None), torch.tensor([[3.5, 3.0]]))
    assert torch.equal(compose_context([e1, e2], None, None, None), torch.cat([e1, e2]))
    assert torch.allclose(compose_context([e1, e2], None, "mean", None), torch.tensor([[3.0, 3.0]]))  # all segments
    l2 = compose_context([e1, e2], "mean", "mean", "L2")
    # NORM after each aggregation: example means normalised, then their mean normalised
    a = torch.nn.functional.normalize(torch.tensor([2.0, 3.0]), dim=0)
    b = torch.nn.functional.normalize(torch.tensor([5.0, 3.0]), dim=0)
    assert torch.allclose(l2[0], torch.nn.functional.normalize((a + b) / 2, dim=0))


def test_metrics_by_hand():
    item = HellaswagItem(
        index=7, activity_label="A", ctx="A: x", label=1, endings=("a" * 10, "b" * 30, "c" * 5, "d" * 10)
    )
    lls = [-20.0, -30.0, -15.0, -25.0]
    # acc: largest log-likelihood (-15 -> 2); acc_norm: per character -2, -1, -3, -2.5 -> 1
    assert picks(lls, item.endings) == (2, 1)
    assert picks(lls, item.endings, per_char=False) == (2, 2)
    assert argmax_first([1.0, 3.0, 3.0, 0.0]) == 1  # ties: the first, as numpy.argmax
    r = item_result(item, lls)
    assert (r.pred, r.pred_norm, r.gold, r.item) == (2, 1, 1, 7)
    rs = [
        r,
        ItemResult(8, 2, 2, 0, (0.0,) * 4),
        ItemResult(9, 0, 1, 0, (0.0,) * 4),
        ItemResult(10, 3, 3, 3, (0.0,) * 4),
    ]
    assert accuracy(rs) == (0.5, 0.75)
    assert accuracy([]) == (None, None)


# ---- bad input: one InputError, never another exception (issue 12, part D) ------------------------------------


@pytest.mark.parametrize("spec", ["", " ", "\t"])
def test_empty_scheme_spec_is_refused(spec):
    """``--scheme ""`` used to run the standard scheme."""
    with pytest.raises(InputError, match="empty scheme"):
        Scheme.from_spec(spec, 1, "decoder")
    assert (
        Scheme.from_spec(None, 1, "decoder")
        == Scheme.from_spec("standard", 1, "decoder")
        == Scheme.standard(1, "decoder")
    )


@pytest.mark.parametrize("layer", ["9" * 5000, 10**5000, "-" + "1" * 4400], ids=["digits", "int", "negative"])
def test_huge_layer_is_an_input_error(layer):
    """int() / str() refuse more than 4300 digits with a ValueError, which used to escape."""
    with pytest.raises(InputError, match="invalid layer"):
        canonical_layer(layer)
    with pytest.raises(InputError, match="invalid layer"):
        Scheme.parse(f"enc=concat_each_example,layer={'9' * 5000},word=mean")


def test_grid_file_that_is_not_utf8_is_an_input_error(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_bytes(b'layer = ["\xff\xfe"]\n')
    with pytest.raises(InputError, match="not UTF-8 text"):
        GridSpec.from_toml(f, 1, "decoder")


def test_grid_file_values_are_checked_when_loaded(tmp_path):
    f = tmp_path / "g.toml"
    for doc, msg in (
        ('norm = ["L3"]', "invalid norm"),
        ("layer = [1.5]", "invalid layer"),
        ('layers = ["top"]', "invalid layer"),
        ("word = [[]]", "invalid word"),
        ("seg = [{a = 1}]", "invalid seg"),
    ):
        f.write_text(doc, encoding="utf-8")
        with pytest.raises(InputError, match=msg):
            GridSpec.from_toml(f, 1, "decoder")


def test_standard_grid_applies_layers():
    """``--grid standard --layers ...`` used to ignore the layers."""
    g = GridSpec.resolve("standard", 2, "decoder", ["-1", "3"])
    schemes, refused = g.enumerate("decoder")
    assert not refused and g.layers() == ("-1", "3")
    std = Scheme.standard(2, "decoder")
    assert {(s.layer, s.out_layer) for s in schemes} == {("-1", "-1"), ("-1", "3"), ("3", "-1"), ("3", "3")}
    assert all(replace_layers(s) == std for s in schemes)
    assert GridSpec.resolve("standard", 1, "decoder").layers() == ("-1",)
    assert GridSpec.resolve("full", 1, "decoder", ["E", "7"]).layers() == ("E", "7")


def replace_layers(s: Scheme) -> Scheme:
    from dataclasses import replace

    return replace(s, layer="-1", out_layer="-1" if s.out_layer is not None else None)


def test_layers_given_twice_are_refused(tmp_path):
    f = tmp_path / "g.toml"
    f.write_text('layers = ["E"]\n', encoding="utf-8")
    with pytest.raises(InputError, match="sets layers itself"):
        GridSpec.resolve(str(f), 1, "decoder", ["-1"])
    f.write_text('layer = ["E"]\nout_layer = ["-1"]\n', encoding="utf-8")
    with pytest.raises(InputError, match="sets layer and out_layer itself"):
        GridSpec.resolve(str(f), 2, "decoder", ["-1"])
    assert GridSpec.resolve(str(f), 2, "decoder").layers() == ("E", "-1")
    f.write_text('layer = ["E"]\n', encoding="utf-8")  # Test 2: --layers still sets OUT_ENCODING_LAYER
    assert GridSpec.resolve(str(f), 2, "decoder", ["3"]).layers() == ("E", "3")


def test_product_size_counts_distinct_values():
    """Found by fuzzing: ``--layers E,E`` (or ``-1,+-1``, ``None,none``) counted each copy in product_size while the
    product holds each scheme once, so the printed counts did not add up."""
    for g in (
        GridSpec.resolve("standard", 1, "decoder", ["E", "E"]),
        GridSpec.full(1, layers=("-1", "-1", "+3", "3")),
        GridSpec(
            test=1,
            values={
                "enc": ("concat_each_example",),
                "layer": ("-1",),
                "word": ("mean",),
                "norm": ("None", "none", ""),
                "seg": ("mean",),
                "ex": ("mean",),
            },
        ),
    ):
        valid, refused = g.enumerate("decoder")
        assert g.product_size() == len(list(g.candidates())) == len(valid) + sum(refused.values())
