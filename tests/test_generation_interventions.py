"""Interventions during batched generation: every steering method and intervention active for a batch gives each
sequence the tokens it gets alone under the same intervention; activation addition takes a batch of doses (and of
directions) in one pass, each sequence's tokens those of its own dose alone; the model is restored bit for bit after."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest
import torch

from walklens.analyses.steering import steer
from walklens.base.errors import InputError
from walklens.core.capture import capture_batch
from walklens.core.generation import generate_batch
from walklens.core.interventions import (
    ablate_direction,
    ablate_mlps,
    add_to_residual,
    edit_weights,
    eigen_edit,
)
from walklens.testing import tiny_model

PROMPTS = ["the capital of france", "a dog", "the king and the queen walk to the river in london", "red"]
N = 6
FAMILIES = ["llama", "gpt2", "gemma3", "falcon_alibi", "phi", "opt", "mpt", "qwen3_moe"]

_models: dict[str, Any] = {}


def tiny(family: str) -> Any:
    if family not in _models:
        _models[family] = tiny_model(family)
    return _models[family]


def state(lm: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in lm.model.state_dict(keep_vars=True).items()}


def hooks_left(lm: Any) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in lm.model.modules())


@contextmanager
def restored(lm: Any) -> Iterator[None]:
    """The body leaves every parameter and buffer bit for bit as it was and no hook behind."""
    before, hooks = state(lm), hooks_left(lm)
    yield
    after = state(lm)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert hooks_left(lm) == hooks


def directions(lm: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A token direction (the unit row of V of 'paris') and a mean-difference direction at layer 0's output
    (mean residual over one text minus over another, unit)."""
    V = lm.embedding_matrix().detach().double()
    u = V[lm.tokenizer("paris", add_special_tokens=False)["input_ids"][0]]
    a, b = (capture_batch(lm, [lm.tokenizer(t)["input_ids"]], ["L0.resid_post"]) for t in ("the dog", "the cat"))
    md = (a.hidden[0, 0].mean(0) - b.hidden[0, 0].mean(0)).double()
    return u / u.norm(), md / md.norm()


def methods(lm: Any) -> dict[str, Callable[[], AbstractContextManager[Any]]]:
    """Every steering method and intervention, as a fresh context manager each time."""
    u, md = directions(lm)
    p = next(p for p in lm.adapter.layer_modules(lm.model)[0].parameters() if p.dim() == 2)
    delta = torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.3
    return {
        "eigen": lambda: eigen_edit(lm, [0], u, 3.0),
        "eigen-steer": lambda: steer(lm, "paris", [0], 3.0),
        "add": lambda: add_to_residual(lm, [0], u.float(), 2.0),
        "meandiff": lambda: add_to_residual(lm, [-1], md.float(), 2.0),
        "ablate": lambda: ablate_direction(lm, [0], md.float()),
        "ablate_mlps": lambda: ablate_mlps(lm),
        "edit_weights": lambda: edit_weights([(p, delta)]),
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_every_intervention_in_a_batch_gives_the_tokens_of_one_at_a_time(family: str) -> None:
    lm = tiny(family)
    for name, make in methods(lm).items():
        with restored(lm):
            with make():
                batch = generate_batch(lm, PROMPTS, max_new_tokens=N, eos=[], points=["final"])
                alone = [generate_batch(lm, [p], max_new_tokens=N, eos=[])[0] for p in PROMPTS]
        assert [g.token_ids for g in batch] == [g.token_ids for g in alone], name
        for g in batch:  # the intervention acts, and capture during generation sees the steered states
            ref = capture_batch(lm, [g.ids], ["final"]).hidden[0, 0]
            assert g.trace is not None and not torch.allclose(g.trace.hidden[0], ref, atol=1e-3), name


@pytest.mark.parametrize("family", FAMILIES)
def test_a_batch_of_doses_in_one_pass(family: str) -> None:
    """Activation addition with one dose (and one direction) per sequence: each sequence's tokens are those of its
    own dose alone, in one pass over the batch, whatever the batch size it is split into."""
    lm = tiny(family)
    u, md = directions(lm)
    doses = [0.0, 1.0, 3.0, -2.0]
    vecs = torch.stack([u, md, u, md]).float()
    alone = []
    for i, p in enumerate(PROMPTS):
        with add_to_residual(lm, [0], vecs[i], doses[i]):
            alone.append(generate_batch(lm, [p], max_new_tokens=N, eos=[], sample=True, seeds=i)[0].token_ids)
    for size in (None, 3):
        with restored(lm):
            got = generate_batch(
                lm,
                PROMPTS,
                max_new_tokens=N,
                eos=[],
                sample=True,
                seeds=[0, 1, 2, 3],
                batch_size=size,
                within=lambda rows: add_to_residual(lm, [0], vecs[rows], [doses[r] for r in rows]),
            )
        assert [g.token_ids for g in got] == alone
    with add_to_residual(lm, [0], u.float(), 0.0):
        assert generate_batch(lm, [PROMPTS[0]], max_new_tokens=N, eos=[])[0].token_ids == (
            generate_batch(lm, [PROMPTS[0]], max_new_tokens=N, eos=[])[0].token_ids
        )


def test_per_sequence_doses_are_the_scalar_dose_bit_for_bit() -> None:
    """Row b of a batch of doses adds exactly what the scalar dose adds alone (float32 and bfloat16 residuals)."""
    for dtype in ("float32", "bfloat16"):
        lm = tiny_model("llama", dtype=dtype)
        u, _ = directions(lm)
        ids = lm.tokenizer("the capital of france")["input_ids"]
        with add_to_residual(lm, [0], u.float(), [0.3, 7.1]):
            both = capture_batch(lm, [ids, ids], ["L0.resid_post"], dtype=None).hidden[0]
        for b, a in enumerate((0.3, 7.1)):
            with add_to_residual(lm, [0], u.float(), a):
                one = capture_batch(lm, [ids], ["L0.resid_post"], dtype=None).hidden[0, 0]
            assert torch.equal(both[b], one)


def test_a_dose_that_overflows_ends_its_row_unranked() -> None:
    """A dose that makes a row's logits NaN (an infinite residual, which the final norm turns into NaN) ends that
    row (no token, finite False); the others are as without it."""
    lm = tiny("llama")
    u, _ = directions(lm)
    doses = [0.0, float("inf"), 0.0, 0.0]
    got = generate_batch(
        lm,
        PROMPTS,
        max_new_tokens=N,
        eos=[],
        logits=1,
        within=lambda rows: add_to_residual(lm, [0], u.float(), [doses[r] for r in rows]),
    )
    assert not got[1].finite and got[1].token_ids == [] and not torch.isfinite(got[1].logits[0]).all()
    plain = generate_batch(lm, PROMPTS, max_new_tokens=N, eos=[])
    assert [g.token_ids for i, g in enumerate(got) if i != 1] == [g.token_ids for i, g in enumerate(plain) if i != 1]


def test_doses_for_another_batch_size_are_one_line() -> None:
    lm = tiny("llama")
    u, _ = directions(lm)
    with add_to_residual(lm, [0], u.float(), [1.0, 2.0, 3.0]), pytest.raises(InputError, match="3 per-sequence doses"):
        generate_batch(lm, PROMPTS, max_new_tokens=2)
    with pytest.raises(InputError, match="2 doses for 3 vectors"):
        with add_to_residual(lm, [0], torch.stack([u, u, u]).float(), [1.0, 2.0]):
            pass
    assert hooks_left(lm) == 0
