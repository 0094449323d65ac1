"""Context compaction (issue 17; seed 000, footnote 11): where segments end, the vectors of each method, HellaSwag
with a compacted prefix (lm-eval-exact endings), and the concept cache shared by the sweep's bank, Test 1 and
compaction (a second run computes no vector; bit-identical with and without the cache)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from walklens.analyses.compaction import CompactSpec, compact, explain
from walklens.analyses.compaction.core import choose_cuts, sentence_starts, word_starts
from walklens.analyses.concepts.schemes import Scheme
from walklens.core.scoring.encode import input_embeddings
from walklens.lab.experiments.compaction import compact_requests, plan_item
from walklens.lab.hellaswag.baseline import baseline_items, packed_results
from walklens.lab.hellaswag.data import HellaswagItem, fewshot_examples
from walklens.testing import WORDS, tiny_model

FUZZ = dict(deadline=None, derandomize=True, database=None)


def compact_items(lm, items, examples, spec, cache=None, stats=None):
    """The compacted items' results, as the runner's compaction scorer gets them."""
    return packed_results(lm, items, compact_requests(lm, items, examples, spec, cache, stats))


TEXT = (
    "the man walks to the river and he runs to the city . the dog eats a red car and she walks to london . "
    "they run to the house"
)


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def gemma():
    return tiny_model("gemma3")


def toy_items(n: int = 6, seed: int = 0) -> list[HellaswagItem]:
    rng = np.random.default_rng(seed)

    def sent(k: int) -> str:
        return " ".join(rng.choice(WORDS, size=k))

    return [
        HellaswagItem(
            index=i,
            activity_label="x",
            ctx=f"{sent(3)} {sent(4)}",
            endings=tuple(sent(int(rng.integers(1, 4))) for _ in range(4)),
            label=int(rng.integers(0, 4)),
        )
        for i in range(n)
    ]


# ---- where segments end --------------------------------------------------------------------------------------------


@settings(max_examples=150, **FUZZ)
@given(n=st.integers(1, 300), data=st.data())
def test_cuts_meet_the_budget_with_non_empty_runs(n: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, n))
    pref = data.draw(st.lists(st.integers(0, n), max_size=20))
    cuts = choose_cuts(n, k, pref, data.draw(st.lists(st.integers(0, n), max_size=40)))
    edges = [0, *cuts, n]
    assert len(cuts) == k - 1 and all(b > a for a, b in zip(edges, edges[1:]))


def test_cuts_prefer_sentences_within_half_a_segment() -> None:
    assert choose_cuts(100, 10) == list(range(10, 100, 10))
    assert choose_cuts(20, 2, preferred=[12]) == [12]  # within n/(2k) = 5 of 10
    assert choose_cuts(20, 2, preferred=[16], fallback=[9]) == [9]  # 16 is too far: the nearest word start
    assert choose_cuts(20, 2, preferred=[16]) == [10]  # nothing near: exactly there
    assert choose_cuts(5, 9) == [1, 2, 3, 4]  # a budget above n: one token each


def test_sentence_and_word_starts() -> None:
    pieces = ["The", " man", " ran", ".", " He", " sat", '!"', " Then", "\n\n", "Now", " go", "?"]
    assert sentence_starts(pieces) == [0, 4, 7, 9]
    assert word_starts(pieces) == [0, 1, 2, 4, 5, 7, 8, 9, 10]


# ---- compact() ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bounds", ["even", "sentence"])
@pytest.mark.parametrize("budget,recent", [(1, 0), (3, 0), (5, 4), (100, 2)])
def test_compact_covers_the_text_within_the_budget(llama, bounds: str, budget: int, recent: int) -> None:
    c = compact(llama, TEXT, budget=budget, bounds=bounds, recent=recent)
    ids = llama.tokenizer.encode(TEXT, add_special_tokens=False)
    assert c.token_ids == ids and c.keep_from == len(ids) - recent and c.tail_ids == ids[len(ids) - recent :]
    assert 1 <= c.k <= min(budget, c.keep_from) and tuple(c.vectors.shape) == (c.k, llama.d_model)
    edges = [a for a, _ in c.spans] + [c.spans[-1][1]]
    assert edges[0] == 0 and edges[-1] == c.keep_from and all(b == a2 for (_, b), (a2, _) in zip(c.spans, c.spans[1:]))
    assert c.segments == [llama.tokenizer.decode(ids[a:b]) for a, b in c.spans]
    assert c.ratio == pytest.approx(c.keep_from / c.k)


def test_concept_vectors_are_the_a6_composition(llama) -> None:
    """Each vector is the segment encoded on its own, word-aggregated and normed as Test 1 does (compose.py, one
    padded batch) -- here from text_vectors (equal-length batches): equal to float rounding."""
    from walklens.analyses.concepts.compose import segment_vectors

    for scheme in (
        "enc=concat_all_examples,layer=-1,word=w1mean,norm=None",
        "enc=concat_all_examples,layer=1,word=relu|mean,norm=zNorm",
        "enc=concat_all_examples,layer=E,word=last,norm=L2",
    ):
        s = Scheme.parse(scheme)
        c = compact(llama, TEXT, scheme=s, budget=4, bounds="even")
        (ref,) = segment_vectors(llama, c.segments, [s.layer], [s.word], s.norm)
        assert torch.allclose(c.vectors, ref.cpu(), atol=2e-5), scheme


def test_baselines_average_pooling_and_drop(gemma) -> None:
    ids = gemma.tokenizer.encode(TEXT, add_special_tokens=False)
    avg = compact(gemma, TEXT, budget=4, method="avgpool", bounds="even")
    for (a, b), v in zip(avg.spans, avg.vectors):  # the input-embedding module's output (Gemma's sqrt(D) scale in)
        assert torch.allclose(v, input_embeddings(gemma, torch.tensor(ids[a:b])).float().mean(0), atol=1e-6)
    drop = compact(gemma, TEXT, budget=3, method="drop", recent=2)
    assert drop.spans == [(len(ids) - 5 + i, len(ids) - 4 + i) for i in range(3)] and drop.scheme is None
    # dropping nothing is the full text, through inputs_embeds: the continuation scores the same
    full = explain(gemma, TEXT, holdout=3, budget=len(ids), method="drop")
    assert full.compact.loglik == pytest.approx(full.full.loglik, abs=1e-4) and full.compact.inputs == full.full.inputs


def test_concepts_at_the_input_layer_averaged_are_average_pooling(gemma) -> None:
    """layer=E with word=mean over even bounds is the avgpool baseline itself: the same vectors, so the same scores
    (measured on gemma3-270m's curves too: every item's four scores equal at ratios 2, 8 and max)."""
    items = toy_items()
    exs = [fewshot_examples(items, 2, it.index) for it in items]
    for ratio in ("2", "max"):
        avgpool = CompactSpec.parse(f"what=examples,method=avgpool,bounds=even,ratio={ratio}")
        pool = compact_items(gemma, items, exs, avgpool)
        concept = compact_items(
            gemma, items, exs, CompactSpec.parse(f"what=examples,bounds=even,ratio={ratio},layer=E,word=mean")
        )
        assert np.allclose([r.scores for r in concept], [r.scores for r in pool], atol=1e-5, rtol=0), ratio
        deeper = compact_items(gemma, items, exs, CompactSpec.parse(f"what=examples,bounds=even,ratio={ratio}"))
        assert not np.allclose([r.scores for r in deeper], [r.scores for r in pool], atol=1e-5, rtol=0), ratio


def test_explain_reads_each_vector_with_the_walk(llama) -> None:
    rep = explain(llama, TEXT, continuation=" they run to the city", budget=3, top=4, method="drop")
    # a dropped-to token's vector is that token's own embedding: its nearest token by cosine is itself
    assert [nb[0][0] for nb in rep.neighbours] == rep.compacted.segments
    assert all(len(nb) == 4 for nb in rep.neighbours) and rep.neighbours[0][0][1] == pytest.approx(1.0, abs=1e-5)
    assert rep.continuation_ids == llama.tokenizer.encode(" they run to the city", add_special_tokens=False)
    assert rep.delta_per_token == rep.compact.per_token - rep.full.per_token


# ---- HellaSwag ------------------------------------------------------------------------------------------------------


def test_compacting_with_the_scheme_cut_is_test1(gemma) -> None:
    """what=both with the A.6 scheme's own cut is Test 1 itself, bit for bit (same vectors, same packed pass)."""
    from walklens.lab.concepts.generation import test1_items

    items = toy_items()
    exs = [fewshot_examples(items, 1, it.index) for it in items]
    for scheme in (
        Scheme.standard(1, "decoder"),
        Scheme.parse("enc=sentence_level_segmentation,layer=E,word=mean,norm=L2,seg=None,ex=None"),
    ):
        spec = CompactSpec(
            what="both",
            bounds="scheme",
            ratio=None,
            layer=scheme.layer,
            word=scheme.word,
            norm=scheme.norm,
            enc=scheme.enc,
            seg=scheme.seg,
            ex=scheme.ex,
        )
        got = compact_items(gemma, items, exs, spec)
        assert [r.scores for r in got] == [r.scores for r in test1_items(gemma, items, exs, scheme)]


def test_endings_are_scored_as_the_baseline(gemma) -> None:
    """Keeping every token (drop at ratio 1) is the baseline: only the prefix went through inputs_embeds."""
    items = toy_items()
    exs = [fewshot_examples(items, 1, it.index) for it in items]
    base = baseline_items(gemma, items, exs)
    for what in ("examples", "context", "both"):
        got = compact_items(gemma, items, exs, CompactSpec.parse(f"what={what},method=drop,ratio=1"))
        assert np.allclose([r.scores for r in got], [r.scores for r in base], atol=1e-5)
        assert [(r.pred, r.pred_norm) for r in got] == [(r.pred, r.pred_norm) for r in base]
    spec = CompactSpec.parse("what=examples,ratio=2")
    stats: dict[str, int] = {}
    got = compact_items(gemma, items, exs, spec, stats=stats)
    assert stats["inputs"] == stats["inputs_full"] - stats["tokens_replaced"] + stats["vectors"]
    assert 2 * stats["vectors"] >= stats["tokens_replaced"] > stats["vectors"]
    assert any(r.scores != b.scores for r, b in zip(got, base))


@pytest.mark.real
def test_the_parts_are_the_examples_and_the_query(smollm2) -> None:
    from walklens.lab.hellaswag.data import load_hellaswag

    items = load_hellaswag(limit=40)[30:34]
    for it in items:
        exs = fewshot_examples(load_hellaswag(limit=40), 3, it.index)
        ex = plan_item(smollm2, it, exs, CompactSpec.parse("what=examples,ratio=4"))
        cx = plan_item(smollm2, it, exs, CompactSpec.parse("what=context,ratio=4,recent=3"))
        dec = smollm2.tokenizer.decode
        shots = "".join(e.solved() + "\n\n" for e in exs)
        # the examples up to the separator, which BPE may merge with the query's first token (kept verbatim)
        assert dec(ex.ctx[ex.a : ex.b]).rstrip("\n") == shots.rstrip("\n")
        assert dec(ex.ctx[ex.a : ex.b]) + dec(ex.ctx[ex.b :]) == shots + it.ctx
        assert dec(cx.ctx[cx.a :]).lstrip("\n") == it.ctx and cx.b == len(cx.ctx) - 3 and ex.b == cx.a


@pytest.mark.real
def test_a_blank_part_before_the_recent_window_stays_verbatim(smollm2) -> None:
    """A short context's recent window can leave only the examples' "\\n\\n" separator to compact (items 476,
    498 ... at 5 shots, recent=16): no concept stands for white space, so it stays verbatim, for every method."""
    from walklens.lab.hellaswag.data import load_hellaswag

    every = load_hellaswag(limit=40)
    it = every[31]
    exs = fewshot_examples(every, 3, it.index)
    whole = plan_item(smollm2, it, exs, CompactSpec.parse("what=context,ratio=4"))
    pieces = [smollm2.tokenizer.decode([t]) for t in whole.ctx[whole.a :]]
    blank = next(i for i, p in enumerate(pieces) if p.strip())
    assert blank >= 1  # the separator opens the context's part
    recent = len(whole.ctx) - whole.a - blank
    base = baseline_items(smollm2, [it], [exs])[0]
    for method in ("concept", "avgpool", "drop"):
        spec = CompactSpec.parse(f"what=context,method={method},ratio=max,recent={recent}")
        p = plan_item(smollm2, it, exs, spec)
        assert p.b == p.a == whole.a and p.cut is None and p.k == 0
        got = compact_items(smollm2, [it], [exs], spec)[0]
        assert np.allclose(got.scores, base.scores, atol=1e-4)
        assert (got.pred, got.pred_norm) == (base.pred, base.pred_norm)
    one = plan_item(smollm2, it, exs, CompactSpec.parse(f"what=context,ratio=max,recent={recent - 1}"))
    assert (one.a, one.b, one.k) == (whole.a, whole.a + blank + 1, 1)  # one word more: compacted as before
    text = "\n\nThe man walks to the river."
    ids = smollm2.tokenizer.encode(text, add_special_tokens=False)
    assert smollm2.tokenizer.decode(ids[:2]) == "\n\n"
    c = compact(smollm2, text, budget=1, recent=len(ids) - 2)
    assert c.keep_from == 0 and c.vectors.shape == (0, smollm2.d_model) and c.tail_ids == ids
    assert compact(smollm2, text, budget=1, recent=len(ids) - 3).keep_from == 3


# ---- one concept cache for the bank, Test 1 and compaction ----------------------------------------------------------


@pytest.fixture
def passes(monkeypatch):
    """Counts the forward passes that compute segment vectors (every command computes them in one place)."""
    from walklens.analyses.concepts import vectors

    calls = []
    real = vectors.hidden_states

    def counted(lm, seqs, layers):
        calls.append(len(seqs))
        return real(lm, seqs, layers)

    monkeypatch.setattr(vectors, "hidden_states", counted)
    return calls


def test_the_cache_is_shared_and_changes_no_bit(llama, tmp_path, passes) -> None:
    from walklens.analyses.concepts.cache import ConceptCache
    from walklens.lab.concepts.generation import scheme_bank
    from walklens.lab.experiments.runner import run_test, scorer
    from walklens.lab.experiments.runsetup import RunSetup
    from walklens.lab.experiments.sweep import build_bank

    items = toy_items(8, seed=1)
    scheme = Scheme.standard(1, "decoder")
    runs = {}
    with ConceptCache(tmp_path / "cache") as cache:
        for name, c in (("none", None), ("cold", cache), ("warm", cache)):
            passes.clear()
            setup = RunSetup(shots=1, cache=c, progress=False)
            runs[name] = run_test(llama, items, scorer(llama, "test1", scheme), setup)
            runs[name + "_passes"] = len(passes)
        assert runs["none_passes"] == runs["cold_passes"] > 0 and runs["warm_passes"] == 0
        assert (
            [r.scores for r in runs["warm"].results]
            == [r.scores for r in runs["cold"].results]
            == [r.scores for r in runs["none"].results]
        )  # bit-identical with and without the cache
        assert cache.stats.misses > 0 and cache.stats.hits > 0
        # compaction with the same segments (Test 1's cut) computes nothing: the vectors are Test 1's
        exs = [fewshot_examples(items, 1, it.index) for it in items]
        spec = CompactSpec(what="both", bounds="scheme", ratio=None, ex="mean")
        passes.clear()
        got = compact_items(llama, items, exs, spec, cache=cache)
        assert passes == [] and [r.scores for r in got] == [r.scores for r in runs["none"].results]
        # so does the sweep's bank asking for those texts at that layer and word
        segs = [[list(e) for e in plan_item(llama, it, ex, spec).segs] for it, ex in zip(items, exs)]
        texts = [t for s in segs for e in s for t in e]
        bank = build_bank(llama, texts, ["2"], ["w1mean"], cache=cache, progress=False)
        assert passes == [] and bank.computed == 0
        assert torch.equal(bank.vectors, scheme_bank(llama, segs, scheme).vectors)
        # a compaction with new segments computes them once; the second run none
        new = CompactSpec.parse("what=both,ratio=3,bounds=even")
        cold = compact_items(llama, items, exs, new, cache=cache)
        assert passes
        passes.clear()
        warm = compact_items(llama, items, exs, new, cache=cache)
        assert passes == [] and [r.scores for r in warm] == [r.scores for r in cold] == [
            r.scores for r in compact_items(llama, items, exs, new)
        ]
    # the sweep's --cache DIR is the same cache folder, opened by path
    passes.clear()
    again = build_bank(llama, texts, ["2"], ["w1mean"], cache=tmp_path / "cache", progress=False)
    assert passes == [] and torch.equal(again.vectors, bank.vectors)


def test_ratio_max_is_one_vector_and_the_budget_follows_the_ratio(llama) -> None:
    n = len(llama.tokenizer.encode(TEXT, add_special_tokens=False))
    assert compact(llama, TEXT, ratio=math.inf).k == 1
    assert compact(llama, TEXT, ratio=4, bounds="even").k == math.ceil(n / 4)
    assert compact(llama, TEXT, ratio=1, bounds="even").k == n


def test_compaction_runs_through_the_runner_as_a_typed_scorer(llama, tmp_path) -> None:
    """compact_run is the runner with compaction's scorer: stored under test ``compact`` and scheme ``str(spec)``
    (the few-shot seed in the data key when not the default), the items' scores compact_items', resumed from the
    store with nothing computed again."""
    from walklens.lab.experiments.compaction import compact_run, compact_scorer
    from walklens.lab.experiments.runsetup import RunSetup
    from walklens.lab.hellaswag.store import ResultStore

    items = toy_items(5, seed=2)
    spec = CompactSpec.parse("what=examples,ratio=2,bounds=even")
    sc = compact_scorer(spec)
    assert (sc.test, sc.scheme) == ("compact", str(spec))
    with ResultStore(tmp_path / "r.sqlite") as store:
        setup = RunSetup(shots=1, data="toy", store=store, fewshot_seed=5, progress=False)
        stats: dict = {}
        first = compact_run(llama, items, spec, setup, stats=stats)
        assert (first.key.test, first.key.scheme, first.key.data) == ("compact", str(spec), "toy#seed=5")
        assert first.computed == 5 and stats["tokens_replaced"] > 0
        exs = [fewshot_examples(items, 1, it.index, seed=5) for it in items]
        assert [r.scores for r in first.results] == [r.scores for r in compact_items(llama, items, exs, spec)]
        again = compact_run(llama, items, spec, setup)
        assert again.computed == 0 and again.predictions == first.predictions
