"""Batched generation (walklens.core.generation): each sequence's tokens are the ones it gets alone, greedy and
sampled, on every tiny family that generates (float32: the same tokens; bfloat16: the same tokens, or where a
token differs, the same logits within bfloat16's tolerance); capture during generation equals capturing the
finished text; bad input is one line."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import walklens
from walklens.base.errors import ContextTooLongError, EmptyTextError, InputError, UnsupportedFamilyError
from walklens.base.hooks import Hooks
from walklens.core.capture import capture_batch
from walklens.core.generation import Generation, batches, generate_batch, length_dependent
from walklens.testing import TINY_FAMILIES, tiny_model

#: every tiny family that generates (BERT and ALBERT are masked LMs); T5 generates with its decoder
GENERATING = [f for f in TINY_FAMILIES if f not in ("bert", "albert")]
#: the decoder-only ones (capture during generation reads one stack)
CAUSAL = [f for f in GENERATING if f != "t5"]
#: lengths 4, 2, 11 and 1: every prompt but the longest is left-padded in the batch
PROMPTS = ["the capital of france", "a dog", "the king and the queen walk to the river in london", "red"]
SEEDS = [11, 22, 33, 44]
N = 6

_models: dict[tuple[str, str], Any] = {}


def tiny(family: str, dtype: str = "float32") -> Any:
    if (family, dtype) not in _models:
        _models[(family, dtype)] = tiny_model(family, dtype=dtype)
    return _models[(family, dtype)]


def alone(lm: Any, i: int, **kw: Any) -> Generation:
    """Prompt ``i`` generated in a batch of its own."""
    seeds = kw.pop("seeds", SEEDS)
    return generate_batch(lm, [PROMPTS[i]], seeds=seeds[i], **kw)[0]


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def same_or_near(batched: Generation, single: Generation, rtol: float) -> None:
    """The same tokens; or, up to and at the first token that differs, the same raw logits within ``rtol`` of their
    largest magnitude (kernels that depend on the batch's shape moved a near-tie)."""
    j = first_difference(batched.token_ids, single.token_ids)
    if j is None:
        return
    for s in range(j + 1):
        a, b = batched.logits[s].cpu(), single.logits[s].cpu()
        assert (a - b).abs().max() <= rtol * a.abs().max(), (s, j, batched.token_ids, single.token_ids)


@pytest.mark.parametrize("family", GENERATING)
def test_batched_greedy_and_sampled_equal_alone_float32(family: str) -> None:
    """float32: every sequence's tokens, greedy and sampled (its own seed), are the ones it gets alone, and the same
    in another batch (another order, other neighbours)."""
    lm = tiny(family)
    for kw in ({}, {"sample": True, "temperature": 1.5}):
        batch = generate_batch(lm, PROMPTS, max_new_tokens=N, eos=[], seeds=SEEDS, **kw)
        other = generate_batch(lm, PROMPTS[::-1][:3], max_new_tokens=N, eos=[], seeds=SEEDS[::-1][:3], **kw)
        for i in range(len(PROMPTS)):
            single = alone(lm, i, max_new_tokens=N, eos=[], **kw)
            assert batch[i].token_ids == single.token_ids, (kw, i)
            assert len(single.token_ids) == N and batch[i].prompt_ids == single.prompt_ids
        for i, g in enumerate(other):
            assert g.token_ids == batch[len(PROMPTS) - 1 - i].token_ids
        if kw:  # a sampled walk leaves the greedy path somewhere (the draws are real draws)
            assert any(b.token_ids != g.token_ids for b, g in zip(batch, generate_batch(lm, PROMPTS, max_new_tokens=N)))


@pytest.mark.parametrize("family", GENERATING)
def test_batched_equals_alone_bfloat16(family: str) -> None:
    """bfloat16: the same tokens, or where kernels of another batch shape move a near-tie, the same logits within
    bfloat16's tolerance up to that token (module docstring of walklens.core.generation)."""
    lm = tiny(family, "bfloat16")
    for kw in ({}, {"sample": True, "temperature": 1.5}):
        batch = generate_batch(lm, PROMPTS, max_new_tokens=N, eos=[], seeds=SEEDS, logits=N, **kw)
        for i in range(len(PROMPTS)):
            same_or_near(batch[i], alone(lm, i, max_new_tokens=N, eos=[], logits=N, **kw), rtol=2**-6)


def test_the_tolerance_check_can_fail() -> None:
    """A token that differs with logits that differ beyond the tolerance is caught."""
    a = Generation([1], token_ids=[3, 4], logits=[torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.0])])
    b = Generation([1], token_ids=[3, 5], logits=[torch.tensor([0.0, 1.0]), torch.tensor([0.0, 1.0])])
    with pytest.raises(AssertionError):
        same_or_near(a, b, rtol=2**-6)
    same_or_near(a, Generation([1], token_ids=[3, 4]), rtol=0.0)


def test_end_of_sequence_ends_one_row_only() -> None:
    """A row that emits an end-of-sequence id ends there (its id kept, stopped_at_eos); the others go on as alone."""
    lm = tiny("llama")
    free = generate_batch(lm, PROMPTS, max_new_tokens=N, eos=[])
    stop = free[0].token_ids[2]
    ended = generate_batch(lm, PROMPTS, max_new_tokens=N, eos=[stop])
    assert ended[0].token_ids == free[0].token_ids[:3] and ended[0].stopped_at_eos
    for g, f in zip(ended[1:], free[1:]):
        cut = next((j + 1 for j, t in enumerate(f.token_ids) if t == stop), N)
        assert g.token_ids == f.token_ids[:cut] and g.stopped_at_eos == (cut < N or f.token_ids[-1] == stop)


def test_batch_size_and_order_change_nothing() -> None:
    lm = tiny("gemma3")
    whole = generate_batch(lm, PROMPTS, max_new_tokens=N, sample=True, seeds=SEEDS)
    split = generate_batch(lm, PROMPTS, max_new_tokens=N, sample=True, seeds=SEEDS, batch_size=3)
    assert [g.token_ids for g in whole] == [g.token_ids for g in split]
    assert batches(lm, [[1] * 4, [1] * 2, [1] * 11, [1]], 3) == [[3, 1, 0], [2]]  # like lengths together


def test_a_length_dependent_rotary_scaling_batches_each_length_apart() -> None:
    """Phi-3's LongRoPE reads the padded batch's length: such a model batches prompts of one length together
    (without that, a sequence of the batch would switch to the long factors before it does alone)."""
    lm = tiny("phi3_longrope")
    assert length_dependent(lm) and not length_dependent(tiny("llama"))
    seqs = [[1] * 4, [2] * 2, [3] * 4]
    assert batches(lm, seqs, None) == [[1], [0, 2]]
    long = ["the king and the queen walk to the river in london", "a dog"]
    batch = generate_batch(lm, long, max_new_tokens=8, eos=[])
    single = [generate_batch(lm, [p], max_new_tokens=8, eos=[])[0].token_ids for p in long]
    assert [g.token_ids for g in batch] == single


# ---- capture during generation ----------------------------------------------------------------------------------


def compare_traces(g: Generation, lm: Any, rtol: float) -> None:
    """The generated trace against capture of the finished text (one right-padded batch of one: no padding)."""
    assert g.trace is not None
    ref = capture_batch(lm, [g.ids], ["*"])
    assert g.trace.points == ref.points and g.trace.token_ids.tolist() == g.ids
    want = ref.hidden[:, 0].float()
    assert (g.trace.hidden - want).abs().max() <= rtol * want.abs().max()


@pytest.mark.parametrize("family", CAUSAL)
def test_generated_trace_equals_the_captured_finished_text(family: str) -> None:
    """Every point of every position of each generated sequence, read through the cache in one pass, equals capturing
    its finished text: within 1e-5 of the largest value in float32 (kernels of other shapes: about 5e-7 seen), and
    in bfloat16 within one bfloat16 step (most families: the same bits).  d_t of the walk is the ``final`` point
    (but for LongRoPE, whose positions before its switch to the long factors are computed again after it, while
    each d_t is the one its step chose from)."""
    for dtype, rtol in (("float32", 1e-5), ("bfloat16", 2**-7)):
        lm = tiny(family, dtype)
        gens = generate_batch(lm, PROMPTS, max_new_tokens=N, eos=[], points=["*"], walk=3)
        for g in gens:
            compare_traces(g, lm, rtol)
            assert g.trace is not None
            if length_dependent(lm):
                continue
            final = g.trace.hidden[g.trace.points.index("final")]
            assert torch.equal(torch.stack([s.d for s in g.steps]), final[len(g.prompt_ids) - 1 : -1])


def test_capture_reads_the_cache_not_the_prefix_again() -> None:
    """One call over the padded prompts, then one position per call: nothing of the prefix is computed again (one
    more call feeds the last tokens, so that the finished text is captured whole)."""
    lm = tiny("llama")
    shapes: list[tuple[int, ...]] = []
    with Hooks() as hooks:
        hooks.pre(lm.model, lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
        generate_batch(lm, PROMPTS, max_new_tokens=N, eos=[], points=["L0.resid_post"])
    assert shapes == [(4, 11)] + [(4, 1)] * N
    shapes.clear()
    with Hooks() as hooks:
        hooks.pre(lm.model, lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
        generate_batch(lm, PROMPTS, max_new_tokens=N, eos=[])
    assert shapes == [(4, 11)] + [(4, 1)] * (N - 1)  # without capture, no call for the last token


def test_generated_trace_equals_capture_of_the_text() -> None:
    """Where the text tokenises back to the same ids, the trace equals walklens.capture of the text; a sequence that
    ended early is captured to its end-of-sequence id, however long the others ran."""
    lm = tiny("llama")
    free = generate_batch(lm, PROMPTS, max_new_tokens=N, eos=[])
    stop = free[1].token_ids[1]
    gens = generate_batch(lm, PROMPTS, max_new_tokens=N, eos=[stop], points=["*"])
    assert gens[1].token_ids == free[1].token_ids[:2]
    for g in gens:
        assert g.trace is not None and len(g.trace.tokens) == len(g.ids)
        text = lm.tokenizer.decode(g.ids)
        if lm.tokenizer(text)["input_ids"] == g.ids:
            tr = walklens.capture(lm, text)
            torch.testing.assert_close(g.trace.hidden, tr.hidden, rtol=1e-5, atol=1e-5)
            assert g.trace.tokens == tr.tokens


def test_capture_keeps_the_points_asked_for() -> None:
    lm = tiny("gpt2")
    (g,) = generate_batch(lm, ["the king"], max_new_tokens=3, points=["L1.*"], eos=[])
    assert g.trace is not None and g.trace.points == [
        "L1.resid_pre",
        "L1.attn_out",
        "L1.resid_mid",
        "L1.mlp_out",
        "L1.resid_post",
        "final",
    ]
    assert g.trace.hidden.shape[:2] == (6, 2 + 3)


def test_decoding_walks_equal_decoding_walk_alone() -> None:
    """The decoding walk's d_t, neighbours, P and rank for a batch: each prompt's walk as decoding_walk gives it."""
    for family in ("llama", "t5", "opt_postnorm"):
        lm = tiny(family)
        walks = walklens.analyses.decoding_walks(
            lm, PROMPTS, max_new_tokens=N, sample=True, seeds=SEEDS, temperature=1.5, progress=False
        )
        for p, s, w in zip(PROMPTS, SEEDS, walks):
            one = walklens.decoding_walk(lm, p, N, sample=True, seed=s, temperature=1.5, progress=False)
            assert torch.equal(w.token_ids, one.token_ids) and torch.equal(w.ranks, one.ranks), family
            assert torch.equal(w.top_ids, one.top_ids) and w.seed == s
            torch.testing.assert_close(w.probs, one.probs, rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(w.d, one.d, rtol=1e-5, atol=1e-5)


# ---- bad input ------------------------------------------------------------------------------------------------


def test_bad_input_is_one_line() -> None:
    lm = tiny("llama")
    for prompts, kw, err, match in [
        ([], {}, InputError, "at least one prompt"),
        ("the king", {}, InputError, "at least one prompt"),
        (["the king", "  "], {}, EmptyTextError, "prompt 1: the text is empty"),
        ([[]], {}, EmptyTextError, "prompt 0 has no tokens"),
        ([[10**6]], {}, InputError, "outside the vocabulary"),
        (["the king"], {"max_new_tokens": 0}, InputError, "positive integer"),
        (["the king"], {"max_new_tokens": True}, InputError, "positive integer"),
        (["the king", "red"], {"max_new_tokens": 63}, ContextTooLongError, "at most 62 new tokens fit"),
        (["the king"] * 2, {"seeds": [1]}, InputError, "1 seeds for 2 prompts"),
        (["the king"], {"sample": True, "temperature": 0.0}, InputError, "temperature"),
        (["the king"], {"batch_size": 0}, InputError, "batch_size"),
    ]:
        with pytest.raises(err, match=match) as e:
            generate_batch(lm, prompts, **kw)
        assert "\n" not in str(e.value)
    with pytest.raises(UnsupportedFamilyError, match="masked"):
        generate_batch(tiny("bert"), ["the king"])
    with pytest.raises(UnsupportedFamilyError, match="decoder-only"):
        generate_batch(tiny("t5"), ["the king"], points=["*"])


def test_prompts_from_one_token_to_the_context() -> None:
    """A batch mixing a one-token prompt with one that leaves room for exactly the new tokens."""
    lm = tiny("llama")
    longest = [7] * (64 - 3)
    gens = generate_batch(lm, [[7], longest], max_new_tokens=3, eos=[])
    assert [len(g.token_ids) for g in gens] == [3, 3]
    assert gens[0].token_ids == generate_batch(lm, [[7]], max_new_tokens=3, eos=[])[0].token_ids
    assert gens[1].token_ids == generate_batch(lm, [longest], max_new_tokens=3, eos=[])[0].token_ids
