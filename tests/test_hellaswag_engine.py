"""The engine on tiny random models of every family: the one-context-pass baseline equals full-sequence
scoring, Test 1 with token-level segmentation reproduces the baseline, hidden-state layers mean what A.6 says,
segmentations, and Test 2 end to end."""

from __future__ import annotations

import pytest
import torch

from oracles import reference_logliks
from walklens.analyses.concepts.schemes import Scheme
from walklens.core.scoring.encode import continuation_logliks, hidden_states, input_embeddings
from walklens.lab.concepts import generation as t1
from walklens.lab.concepts import similarity as t2
from walklens.lab.concepts.segment import segment_context, split_sentences
from walklens.lab.hellaswag.baseline import baseline_scores, item_tokens
from walklens.lab.hellaswag.data import HellaswagItem
from walklens.testing import tiny_model

SCORING = (
    "gpt2",
    "gpt_neo",
    "gpt_neox",
    "gpt_neox_seq",
    "llama",
    "gemma3",
    "falcon",
    "falcon_alibi",
    "falcon_seq",
    "t5",
)
ARCH = {"t5": "encoder-decoder"}

ITEM = HellaswagItem(
    index=0,
    activity_label="the city",
    ctx="the city: the man walks to the river. he",
    endings=("runs to the house.", "eats a red car.", "walks with the dog and the cat in london.", "was big"),
    label=0,
)
SHOT = HellaswagItem(
    index=1,
    activity_label="a dog",
    ctx="a dog: the dog runs. it",
    endings=("eats.", "was good.", "ran to the queen.", "is red."),
    label=2,
)
TOKEN_LEVEL = Scheme(enc="token_level", layer="E", word="last", norm=None, seg=None, ex=None)


@pytest.fixture(scope="module")
def models():
    return {f: tiny_model(f) for f in SCORING}


@pytest.mark.parametrize("family", SCORING)
def test_context_once_equals_full_sequences(models, family):
    lm = models[family]
    for shots in ([], [SHOT]):
        ctx, conts = item_tokens(lm, ITEM, shots)
        assert len({len(c) for c in conts}) > 1  # ragged endings: the padded batch is exercised
        fast = baseline_scores(lm, ITEM, shots)
        ref = reference_logliks(lm, ctx, conts)
        assert fast == pytest.approx(ref, abs=2e-5, rel=1e-5)


def test_context_goes_through_the_model_once(models):
    lm = models["llama"]
    calls = []
    h = lm.model.model.layers[0].register_forward_pre_hook(lambda m, a: calls.append(a[0].shape))
    try:
        baseline_scores(lm, ITEM, [SHOT])
    finally:
        h.remove()
    ctx, conts = item_tokens(lm, ITEM, [SHOT])
    # one pass over the whole context (batch 1), one pass over the four endings (batch 4, no context)
    assert calls == [torch.Size([1, len(ctx), 32]), torch.Size([4, max(map(len, conts)) - 1, 32])]


@pytest.mark.parametrize("family", SCORING)
def test_token_level_test1_reproduces_the_baseline(models, family):
    lm = models[family]
    TOKEN_LEVEL.validate(1, ARCH.get(family, "decoder"))
    for shots in ([], [SHOT]):
        base = baseline_scores(lm, ITEM, shots)
        got = t1.test1_scores(lm, ITEM, shots, TOKEN_LEVEL)
        assert got == pytest.approx(base, abs=2e-5, rel=1e-5)
        cross = Scheme(enc="cross_encoding", layer="E", word="last", norm=None, seg=None, ex=None)
        assert t1.test1_scores(lm, ITEM, shots, cross) == base


def test_gemma_embedding_scale_matters(models):
    """Feeding raw embedding rows instead of the embedding module's output breaks the reproduction (Gemma
    scales by sqrt(D) inside the module), so the token-level test above really checks the scale."""
    lm = models["gemma3"]
    ctx, conts = item_tokens(lm, ITEM, [])
    ids = torch.tensor(ctx)
    module_out = input_embeddings(lm, ids)
    raw = lm.embedding_matrix()[ids]
    assert torch.allclose(module_out, raw * 32**0.5, rtol=1e-3)  # hidden_size 32 (normaliser in bf16-free fp32)
    exact = continuation_logliks(lm, conts, context_embeds=module_out)
    wrong = continuation_logliks(lm, conts, context_embeds=raw)
    assert exact == pytest.approx(baseline_scores(lm, ITEM, []), abs=2e-5)
    assert max(abs(a - b) for a, b in zip(exact, wrong)) > 1e-2


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma3", "t5", "bert"])
def test_layers_mean_what_a6_says(family):
    lm = tiny_model(family)
    ids = [7, 8, 9, 10, 11]
    N = lm.n_layers
    states, mask = hidden_states(lm, [ids], [None, 0, 1, N])
    x = torch.tensor([ids])
    if family == "t5":
        hf = lm.model.get_encoder()(input_ids=x, output_hidden_states=True)
    else:
        hf = lm.model.base_model(input_ids=x, output_hidden_states=True)
    assert torch.allclose(states[None], input_embeddings(lm, x).float())  # E
    assert torch.allclose(states[0], hf.hidden_states[0].float(), atol=1e-5)  # input of layer 0
    assert torch.allclose(states[1], hf.hidden_states[1].float(), atol=1e-5)  # input of layer 1
    assert torch.allclose(states[N], hf.last_hidden_state.float(), atol=1e-5)  # top, after final norm
    if family == "gpt2":  # layer 0 = E + position embeddings for learned absolute positions (A.6)
        pos = lm.model.transformer.wpe.weight[:5]
        assert torch.allclose(states[0], states[None] + pos, atol=1e-6)
    assert mask.tolist() == [[1] * 5]
    # asking only for a lower layer stops the pass early and gives the same states
    spec = lm.adapter.stack("enc") if family == "t5" else lm.adapter.stack()
    last = lm.adapter.layer_modules(lm.model, spec.name)[-1]
    ran = []
    h = last.register_forward_hook(lambda m, a, o: ran.append(1))
    try:
        only, _ = hidden_states(lm, [ids], [1])
    finally:
        h.remove()
    assert list(only) == [1] and torch.allclose(only[1], states[1]) and ran == []  # layer 1 itself never ran


def test_padding_does_not_change_states():
    lm = tiny_model("llama")
    short, long = [7, 8, 9], [7, 8, 9, 10, 11, 12]
    alone, _ = hidden_states(lm, [short], [2])
    batch, mask = hidden_states(lm, [long, short], [2])
    assert torch.allclose(batch[2][1, :3], alone[2][0], atol=1e-5)
    assert mask.tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]


def test_segmentations():
    assert split_sentences("A man sits. he runs! Does he? yes") == ["A man sits.", "he runs!", "Does he?", "yes"]
    ex = [SHOT]
    assert segment_context(ITEM, ex, "concat_each_example") == [
        ["a dog: the dog runs. it ran to the queen."],
        [ITEM.ctx],
    ]
    assert segment_context(ITEM, ex, "segment_each_example") == [
        ["a dog: the dog runs. it", "ran to the queen."],
        [ITEM.ctx],
    ]
    assert segment_context(ITEM, ex, "merge_all_segments") == [
        ["a dog: the dog runs. it", "ran to the queen.", ITEM.ctx]
    ]
    assert segment_context(ITEM, ex, "concat_all_examples") == [
        ["a dog: the dog runs. it ran to the queen.\n\n" + ITEM.ctx]
    ]
    assert segment_context(ITEM, ex, "sentence_level_segmentation") == [
        ["a dog: the dog runs.", "it", "ran to the queen."],
        ["the city: the man walks to the river.", "he"],
    ]
    lm = tiny_model("gpt2")
    tok = segment_context(ITEM, ex, "token_level", lm)
    assert [t[0] for t in tok[0]] == item_tokens(lm, ITEM, ex)[0]


@pytest.mark.parametrize("family", ["gpt2", "gemma3", "t5"])
def test_test1_and_test2_run_every_encoding(models, family):
    lm = models[family]
    arch = ARCH.get(family, "decoder")
    word = "w1mean" if arch == "decoder" else "mean"
    for enc in (
        "sentence_level_segmentation",
        "segment_each_example",
        "merge_all_segments",
        "concat_each_example",
        "concat_all_examples",
    ):
        s1 = Scheme(enc=enc, layer="middle", word=word, norm="L2", seg=None, ex=None).validate(1, arch)
        a = t1.test1_scores(lm, ITEM, [SHOT], s1)
        s2 = Scheme(
            enc=enc,
            layer="-1",
            word="relu|" + word,
            norm="zNorm",
            seg="mean",
            ex="soft_cluster",
            sim="cosine",
            out_layer="E",
            out_word="mean",
        ).validate(2, arch)
        b = t2.test2_scores(lm, ITEM, [SHOT], s2)
        assert len(a) == len(b) == 4 and all(x < 0 for x in a) and all(-1.0001 <= x <= 1.0001 for x in b)
    # different concept sequences give different likelihoods (the composition really feeds the model)
    c1 = t1.test1_scores(lm, ITEM, [SHOT], Scheme.standard(1, arch))
    c2 = t1.test1_scores(lm, ITEM, [SHOT], Scheme(enc="concat_each_example", layer="-1", word=word, ex=None))
    assert c1 != c2


def test_test2_standard_by_hand(models):
    """Test 2 standard (decoder-only): context = w1mean of the query's top hidden states; ending = the same for
    the ending's text; dot product.  Recomputed here from HF's own hidden states."""
    lm = models["llama"]
    s = Scheme.standard(2, "decoder")
    got = t2.test2_scores(lm, ITEM, [], s)

    @torch.no_grad()
    def vec(text: str) -> torch.Tensor:
        ids = torch.tensor([lm.tokenizer.encode(text, add_special_tokens=False)])
        h = lm.model.base_model(input_ids=ids).last_hidden_state[0]
        w = torch.arange(1, h.shape[0] + 1, dtype=torch.float32)
        return (h * w[:, None]).sum(0) / w.sum()

    c = vec(ITEM.ctx)
    expect = [float(vec(e) @ c) for e in ITEM.endings]
    assert got == pytest.approx(expect, rel=1e-4, abs=1e-4)


def test_test2_on_an_encoder_only_model():
    """Masked LMs have no likelihood baseline and refuse Test 1, but Test 2 only needs hidden states."""
    lm = tiny_model("bert")
    s = Scheme.standard(2, "encoder").validate(2, "encoder")
    scores = t2.test2_scores(lm, ITEM, [SHOT], s)
    assert len(scores) == 4 and len(set(scores)) == 4
    from walklens.base.errors import InputError, UnsupportedFamilyError

    with pytest.raises(InputError, match="causal or encoder-decoder"):
        Scheme.standard(1, "encoder-decoder").validate(1, "encoder")
    with pytest.raises(UnsupportedFamilyError):
        baseline_scores(lm, ITEM, [])
