"""Packed scoring (many contexts and their endings in one forward pass, walklens.core.scoring.packing) equals
scoring each ending as its own full sequence, on every causal family, from token ids and from embeddings."""

from __future__ import annotations

import random

import pytest
import torch

from oracles import reference_logliks
from walklens.base.errors import ContextTooLongError, EmptyTextError
from walklens.core.scoring import packing
from walklens.core.scoring.encode import continuation_logliks, input_embeddings
from walklens.core.scoring.packing import can_pack, packed_logliks, plan_batches
from walklens.core.scoring.request import ScoreRequest
from walklens.lab.hellaswag.baseline import baseline_items, baseline_scores
from walklens.lab.hellaswag.data import HellaswagItem
from walklens.testing import TINY_FAMILIES, tiny_model

CAUSAL = tuple(f for f in TINY_FAMILIES if f not in ("t5", "bert", "albert"))


def _requests(lm, n: int, seed: int, max_ctx: int = 12) -> list[ScoreRequest]:
    rng = random.Random(seed)
    V = len(lm.tokenizer)
    out = []
    for _ in range(n):
        ctx = [rng.randrange(3, V) for _ in range(rng.randint(1, max_ctx))]
        conts = [[rng.randrange(3, V) for _ in range(rng.randint(1, 6))] for _ in range(rng.randint(1, 4))]
        out.append(ScoreRequest(conts, context_ids=ctx))
    return out


@pytest.fixture(scope="module")
def models():
    return {f: tiny_model(f) for f in CAUSAL}


@pytest.mark.parametrize("family", CAUSAL)
def test_packed_equals_full_sequences(models, family, monkeypatch):
    lm = models[family]
    reqs = _requests(lm, 9, seed=1)
    if can_pack(lm) and family != "gpt_neo":  # the packed path really runs: no request-by-request fallback
        monkeypatch.setattr(packing, "continuation_logliks", lambda *a, **k: pytest.fail("fell back"))
    got = packed_logliks(lm, reqs, max_tokens=48)  # several batches, rows of unequal length (padding)
    for r, g in zip(reqs, got):
        assert g == pytest.approx(reference_logliks(lm, r.context_ids, r.continuations), abs=1e-4)


@pytest.mark.parametrize("family", CAUSAL)
def test_packed_embeddings_equal_one_request_at_a_time(models, family):
    lm = models[family]
    g = torch.Generator().manual_seed(0)
    reqs = []
    for r in _requests(lm, 6, seed=2):
        e = input_embeddings(lm, torch.tensor(r.context_ids)).detach()
        reqs.append(ScoreRequest(r.continuations, context_embeds=e + 0.3 * torch.randn(e.shape, generator=g)))
    got = packed_logliks(lm, reqs)
    for r, g_ in zip(reqs, got):
        assert g_ == pytest.approx(continuation_logliks(lm, r.continuations, context_embeds=r.context_embeds), abs=1e-4)


def test_which_models_pack(models):
    assert {f for f in CAUSAL if can_pack(models[f])} == set(CAUSAL) - {"falcon_alibi", "bloom", "mpt"}  # ALiBi
    assert not can_pack(tiny_model("t5")) and not can_pack(tiny_model("bert"))


def test_sliding_window_counts_positions(models):
    """Gemma 3's sliding layers see ``window`` positions back: rows far longer than the window still agree."""
    lm = models["gemma3"]
    window = lm.model.config.sliding_window
    assert "sliding_attention" in lm.model.config.layer_types
    reqs = _requests(lm, 4, seed=3, max_ctx=6 * window)
    assert max(r.row_len for r in reqs) > 3 * window
    for r, g in zip(reqs, packed_logliks(lm, reqs)):
        assert g == pytest.approx(reference_logliks(lm, r.context_ids, r.continuations), abs=1e-4)


def test_gpt_neo_local_window_falls_back_for_long_rows(models, monkeypatch):
    lm = models["gpt_neo"]
    window = lm.model.config.window_size
    reqs = [r for r in _requests(lm, 12, seed=4, max_ctx=3 * window)]
    long_rows = sum(r.row_len > window for r in reqs)
    assert 0 < long_rows < len(reqs)
    calls = []
    real = packing.continuation_logliks
    monkeypatch.setattr(packing, "continuation_logliks", lambda *a, **k: calls.append(1) or real(*a, **k))
    got = packed_logliks(lm, reqs)
    assert len(calls) == long_rows
    for r, g in zip(reqs, got):
        assert g == pytest.approx(reference_logliks(lm, r.context_ids, r.continuations), abs=1e-4)


def test_plan_batches_respects_budgets():
    rng = random.Random(5)
    reqs = [
        ScoreRequest([[1] * rng.randint(1, 9) for _ in range(4)], context_ids=[1] * rng.randint(1, 40))
        for _ in range(50)
    ]
    batches = plan_batches(reqs, vocab=100, max_tokens=300, max_logits=100 * 60)
    assert sorted(i for b in batches for i in b) == list(range(50))
    for b in batches:
        rows = [reqs[i] for i in b]
        if len(b) > 1:
            assert max(r.row_len for r in rows) * len(b) <= 300
            assert sum(r.n_needed for r in rows) * 100 <= 100 * 60
    lengths = [reqs[i].row_len for b in batches for i in b]
    assert lengths == sorted(lengths, reverse=True)  # longest first: padding only within similar lengths


def test_bad_requests(models):
    lm = models["llama"]
    with pytest.raises(EmptyTextError):
        packed_logliks(lm, [ScoreRequest([[1, 2], []], context_ids=[3])])
    with pytest.raises(EmptyTextError):
        packed_logliks(lm, [ScoreRequest([[1, 2]], context_ids=[])])
    limit = lm.model.config.max_position_embeddings
    with pytest.raises(ContextTooLongError):
        packed_logliks(lm, [ScoreRequest([[1, 2, 3]], context_ids=[4] * limit)])


def test_baseline_items_equal_baseline_scores(models):
    lm = models["llama"]
    items = [
        HellaswagItem(index=i, activity_label="a dog", ctx=c, endings=e, label=i % 4)
        for i, (c, e) in enumerate(
            [
                ("a dog: the dog runs. it", ("eats.", "was good.", "ran to the queen.", "is red.")),
                (
                    "the city: the man walks to the river. he",
                    ("runs to the house.", "eats a red car.", "walks with the dog.", "was big"),
                ),
                ("the man: he", ("eats the red car and the dog.", "runs.", "is.", "walks to london.")),
            ]
        )
    ]
    got = baseline_items(lm, items)
    for it, r in zip(items, got):
        assert r.item == it.index and r.gold == it.label
        assert list(r.scores) == pytest.approx(baseline_scores(lm, it), abs=1e-4)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
def test_shared_ending_prefixes_are_one_set_of_positions(models, family):
    """Endings that start alike share tree nodes (fewer positions), and still score as full sequences."""
    lm = models[family]
    conts = [[5, 6, 7, 8], [5, 6, 9], [5, 10, 3], [11], [5, 6, 7, 12]]
    r = ScoreRequest(conts, context_ids=[20, 21, 22])
    tokens, parents, depths = r.tree  # the inputs: each continuation minus its last token
    assert tokens == [5, 6, 7, 10] and parents == [-1, 0, 1, 0] and depths == [0, 1, 2, 1]
    assert r.row_len == 3 + 4 < 3 + sum(len(c) - 1 for c in conts)
    (got,) = packed_logliks(lm, [r, ScoreRequest([[7, 8]], context_ids=[9] * 11)])[:1]
    assert got == pytest.approx(reference_logliks(lm, r.context_ids, conts), abs=1e-4)


# ---- prepacked linear layers (interventions.prepacked_linears; issue 39) ----------------------------------------

BF16_ONEDNN = torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@pytest.mark.skipif(not BF16_ONEDNN, reason="this CPU has no oneDNN bfloat16 path (AVX-512 BF16 / AMX)")
@pytest.mark.parametrize("family", ["llama", "gemma3", "opt"])  # opt: linear layers with biases
def test_prepacked_scoring_is_bit_identical(family, monkeypatch):
    """bfloat16 packed scoring from prepacked weights gives exactly the log-likelihoods of ``F.linear``'s."""
    from walklens.core.interventions import prepacked_linears

    lm = tiny_model(family, dtype=torch.bfloat16)
    reqs = _requests(lm, 9, seed=3)
    monkeypatch.setenv("WALKLENS_PREPACK", "0")
    ref = packed_logliks(lm, reqs, max_tokens=48)
    monkeypatch.setenv("WALKLENS_PREPACK", "1")
    with prepacked_linears(lm) as n:
        assert n == sum(type(m) is torch.nn.Linear for m in lm.hf.modules()) > 0
    assert packed_logliks(lm, reqs, max_tokens=48) == ref  # exact, not approx
    assert not any("forward" in m.__dict__ for m in lm.hf.modules())  # every layer's own forward is back


@pytest.mark.skipif(not BF16_ONEDNN, reason="this CPU has no oneDNN bfloat16 path (AVX-512 BF16 / AMX)")
def test_prepacked_weights_follow_an_edit_and_keep_hooks() -> None:
    """A weight edited in place is packed again (never a stale product); hooks on a switched layer still run;
    a float32 model (MKL's products, not oneDNN's) is never switched."""
    from walklens.base.hooks import Hooks
    from walklens.core.interventions import edit_weights, prepacked_linears

    lm = tiny_model("llama", dtype=torch.bfloat16)
    lin = next(m for m in lm.hf.modules() if type(m) is torch.nn.Linear)
    x = torch.randn(5, lin.in_features).to(torch.bfloat16)
    with torch.no_grad(), prepacked_linears(lm):
        before = lin(x)
    with torch.no_grad(), edit_weights([(lin.weight, torch.ones_like(lin.weight))]), prepacked_linears(lm):
        seen = []
        with Hooks() as hooks:
            hooks.post(lin, lambda mod, args, out: seen.append(out))
            after = lin(x)
        assert torch.equal(after, torch.nn.functional.linear(x, lin.weight)) and not torch.equal(after, before)
        assert len(seen) == 1
    with prepacked_linears(tiny_model("llama")) as n:
        assert n == 0
