"""Interventions restore the model bit for bit (every parameter and buffer torch.equal, no hook left, layer list
and config back), also when the body raises; hooks registered through Hooks never outlive their block."""

from __future__ import annotations

import contextlib

import pytest
import torch

from walklens.base.errors import InputError
from walklens.core.interventions import (
    Hooks,
    ablate_mlps,
    add_to_residual,
    edit_weights,
    eigen_edit,
    resolve_layers,
    tied_layers,
)
from walklens.testing import tiny_model

FAMILIES = ("llama", "gpt2", "gemma3", "albert")  # grouped-query, multi-head, sliding-window layers, shared layer
TEXT = "the cat and the dog walk to the house"


def _n_hooks(lm) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in lm.model.modules())


def _snapshot(lm) -> dict:
    return {
        "params": {n: p.detach().clone() for n, p in lm.model.named_parameters(remove_duplicate=False)},
        "buffers": {n: b.detach().clone() for n, b in lm.model.named_buffers(remove_duplicate=False)},
        "modules": [(n, id(m)) for n, m in lm.model.named_modules(remove_duplicate=False)],
        "config": lm.model.config.to_dict(),
    }


def _assert_restored(lm, before: dict) -> None:
    now = _snapshot(lm)
    assert now["modules"] == before["modules"]
    assert now["config"] == before["config"]
    for kind in ("params", "buffers"):
        assert now[kind].keys() == before[kind].keys()
        for name, t in before[kind].items():
            assert torch.equal(now[kind][name], t), (kind, name)
    assert _n_hooks(lm) == 0


def _logits(lm) -> torch.Tensor:
    ids = lm.tokenizer(TEXT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return lm.model(input_ids=ids).logits


def _direction(lm) -> torch.Tensor:
    u = torch.randn(
        lm.adapter.head_weights(lm.model, 0).d_model, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    return u / u.norm()


INTERVENTIONS = {
    "ablate_mlps": lambda lm: ablate_mlps(lm),
    "add_to_residual": lambda lm: add_to_residual(lm, [0, -1], _direction(lm), alpha=3.0),
    "eigen_edit": lambda lm: eigen_edit(lm, [0, 1], _direction(lm), 2.0),
    "edit_weights": lambda lm: edit_weights([(p, torch.ones_like(p)) for p in list(lm.model.parameters())[:3]]),
    "tied_layers": lambda lm: tied_layers(lm, 0, 4),
}


@pytest.mark.parametrize("fail", [False, True], ids=["exit", "raise"])
@pytest.mark.parametrize("name", list(INTERVENTIONS))
@pytest.mark.parametrize("family", FAMILIES)
def test_intervention_acts_then_restores_bit_for_bit(family, name, fail):
    lm = tiny_model(family)
    before, base = _snapshot(lm), _logits(lm)
    with pytest.raises(RuntimeError, match="boom") if fail else contextlib.nullcontext():
        with INTERVENTIONS[name](lm):
            assert not torch.equal(_logits(lm), base)  # the intervention really acts inside the block
            if fail:
                raise RuntimeError("boom")
    _assert_restored(lm, before)
    assert torch.equal(_logits(lm), base)


def test_eigen_edit_refuses_bad_layers_before_touching_anything():
    lm = tiny_model("llama")
    before = _snapshot(lm)
    with pytest.raises(InputError, match="out of range"):
        with eigen_edit(lm, [0, 9], _direction(lm), 2.0):
            pass
    _assert_restored(lm, before)


def test_hooks_are_removed_when_registration_fails_halfway():
    lm = tiny_model("llama")
    layers = lm.model.model.layers
    with pytest.raises(AttributeError):
        with Hooks() as hooks:
            hooks.post(layers[0], lambda *_: None)
            hooks.pre(layers[1], lambda *_: None, with_kwargs=True)
            assert len(hooks) == 2 and _n_hooks(lm) == 2
            hooks.post(layers.no_such_module, lambda *_: None)
    assert _n_hooks(lm) == 0


def test_hooks_replace_outputs_inside_the_block_only():
    lm = tiny_model("gpt2")
    base = _logits(lm)
    with Hooks() as hooks:
        hooks.post(lm.model.transformer.ln_f, lambda _m, _i, out: torch.zeros_like(out))
        zeroed = _logits(lm)
    assert torch.allclose(zeroed, zeroed[..., :1].expand_as(zeroed))  # logits of a zero vector: all equal
    assert torch.equal(_logits(lm), base)


def test_resolve_layers():
    lm = tiny_model("llama")  # 2 layers
    assert resolve_layers(lm, -1) == [1] and resolve_layers(lm, [0, 1, -2, 0]) == [0, 1]
    for bad in ([], [2], -3):
        with pytest.raises(InputError):
            resolve_layers(lm, bad)
