"""The steering card generates through walklens.core.generation.generate_batch: the same card as the card built on
the model's own ``generate`` called directly (the way it generated before), and the same continuations as each
prompt's alone under every method."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from _steercard import one_thread  # noqa: F401  # shared fixtures
from test_steering_card import write_set
from walklens.base.outputs import jsonable
from walklens.core.generation import generate_batch
from walklens.lab.steeringcard import run as run_module
from walklens.lab.steeringcard import steering_card
from walklens.lab.steeringcard.run import eos_ids, intervene
from walklens.testing import tiny_model


@torch.no_grad()
def hf_generate(lm: Any, prompts: list[list[int]], n: int) -> tuple[list[list[int]], torch.Tensor]:
    """The card's continuations as it made them before: one left-padded batch of 32 through ``generate``."""
    from transformers import GenerationConfig

    conts: list[list[int]] = []
    firsts = []
    ends = eos_ids(lm)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else min(ends, default=0)
    for b in range(0, len(prompts), 32):
        part = prompts[b : b + 32]
        P = max(len(p) for p in part)
        ids = torch.full((len(part), P), pad, dtype=torch.long)
        mask = torch.zeros((len(part), P), dtype=torch.long)
        for i, p in enumerate(part):
            ids[i, P - len(p) :], mask[i, P - len(p) :] = torch.tensor(p), 1
        cfg = GenerationConfig(
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=sorted(ends) or None,
            use_cache=True,
            output_logits=True,
            return_dict_in_generate=True,
        )
        out = cast(Any, lm.hf).generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
        for row in out.sequences[:, P:].tolist():
            conts.append([int(t) for t in row[: next((j for j, t in enumerate(row) if t in ends), len(row))]])
        firsts.append(torch.log_softmax(out.logits[0].float(), -1))
    return conts, torch.cat(firsts)


def close(a: Any, b: Any, where: str = "") -> None:
    """Two documents equal: texts and integers exactly, numbers within 1e-5 (the first logits of a row come from
    kernels of another batch order)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and not isinstance(b, bool):
        assert isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6), (where, a, b)
    else:
        assert a == b, (where, a, b)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_card_on_generate_batch_is_the_card_of_before(
    family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lm = tiny_model(family)
    sset = write_set(tmp_path / "tiny.jsonl")
    kw: dict[str, Any] = {"layers": [0, 1], "doses": [0.5, 4.0], "max_new_tokens": 4, "n_boot": 100}
    new = steering_card(lm, sset, **kw)
    monkeypatch.setattr(run_module, "generate", hf_generate)
    old = steering_card(lm, sset, **kw)
    close(jsonable(new), jsonable(old))
    assert any(e.text for e in new.examples)


def test_each_continuation_is_the_one_its_prompt_gets_alone(tmp_path: Path) -> None:
    """Under every method, the card's batch of continuations gives each prompt what it gets generated alone."""
    lm = tiny_model("llama")
    prompts = [lm.tokenizer(t)["input_ids"] for t in ("the man walks to the", "a big red", "she was in the city of")]
    u = lm.embedding_matrix().detach()[lm.tokenizer(" paris", add_special_tokens=False)["input_ids"][0]].double()
    u = u / u.norm()
    for method in ("eigen", "add", "meandiff", "ablate"):
        with intervene(lm, method, 1, u, 4.0):
            conts, first = run_module.generate(lm, prompts, 5)
            for i, p in enumerate(prompts):
                (g,) = generate_batch(lm, [p], max_new_tokens=5, eos=eos_ids(lm), logits=1)
                assert conts[i] == (g.token_ids[:-1] if g.stopped_at_eos else g.token_ids)
                torch.testing.assert_close(first[i], torch.log_softmax(g.logits[0], -1), rtol=1e-5, atol=1e-5)
