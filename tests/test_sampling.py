"""Sampling takes any positive finite temperature: one so small that logits / temperature overflows (or the
temperature itself is 0 in float32) samples the limit, the most probable token (ties: uniformly), instead of
``RuntimeError: probability tensor contains inf/nan``; ``generate --sample --temperature 1e-320`` is the greedy walk."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import walklens
from _cli import run
from walklens.core.sampling import sampler as _sampler
from walklens.testing import tiny_model


@pytest.fixture(scope="module")
def lm() -> Any:
    return tiny_model("llama")


@pytest.mark.parametrize("temperature", [1e-320, 5e-324, 1e-45, 1e-38, 1e-30])
def test_a_tiny_temperature_samples_the_greedy_walk(lm: Any, temperature: float) -> None:
    greedy = walklens.decoding_walk(lm, "the king", max_new_tokens=4, stop_at_eos=False, progress=False)
    cold = walklens.decoding_walk(
        lm, "the king", max_new_tokens=4, sample=True, temperature=temperature, stop_at_eos=False, progress=False
    )
    assert torch.equal(cold.token_ids, greedy.token_ids) and cold.temperature == temperature


def test_generate_with_a_denormal_temperature_is_greedy(capfd: Any, tiny_llama_inputs: dict[str, str]) -> None:
    model = tiny_llama_inputs["model"]
    rc, err = run(capfd, "generate", "the king", "--model", model, "--sample", "--temperature", "1e-320")
    assert rc == 0 and not any("error" in line for line in err), err


@settings(max_examples=120, derandomize=True, deadline=None, database=None)
@given(
    temperature=st.one_of(
        st.floats(min_value=5e-324, max_value=1e-30),
        st.floats(min_value=1e-30, max_value=1e308),
        st.sampled_from([5e-324, 1e-320, 1.4e-45, 1e-38, 3.4e38, 1.7e308]),
    ),
    scale=st.sampled_from([1.0, 1e3, 1e30, 3e38]),
    top_k=st.one_of(st.none(), st.integers(1, 20)),
    top_p=st.one_of(st.none(), st.floats(min_value=1e-9, max_value=1.0)),
    masked=st.integers(0, 10),
    seed=st.integers(0, 2**31),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)
def test_fuzz_sampling_any_temperature_and_logits(
    temperature: float, scale: float, top_k: int | None, top_p: float | None, masked: int, seed: int, dtype: Any
) -> None:
    """Any positive finite temperature over logits up to the dtype's range (some masked to -inf): a token among the
    allowed ones; the most probable one when logits / temperature overflows."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.rand(20, generator=g) * 2 - 1) * scale
    logits = logits.clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).to(dtype)
    logits[:masked] = float("-inf")
    pick = _sampler(temperature, top_k, top_p, seed)
    i = pick(logits)
    assert 0 <= i < 20 and logits[i] > float("-inf")
    if not torch.isfinite((logits.float() / torch.tensor(temperature, dtype=torch.float32))[masked:]).all():
        assert logits[i] == logits.max()
