"""A given vector patched in (a steering direction, a concept vector): each cell equals its single-patch forward pass
bit for bit, an added vector equals an independent hook adding it, the clean run's own vector put in place scores
what activation patching scores, prompts of different token counts need no map, and bad input is one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from walklens.analyses.patching import patch
from walklens.analyses.patching.vectors import patch_vector
from walklens.base.errors import InputError
from walklens.core.patching import Site, record, run_logits
from walklens.models.base import get_module
from walklens.testing import tiny_model

CLEAN = "the capital of france is paris"
CORRUPT = "the capital of england is paris"
METRIC = "logitdiff:paris,london"


def _state(lm) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in lm.model.state_dict().items()}


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
def test_each_cell_is_its_single_patch_pass_and_the_model_is_restored(family: str) -> None:
    lm = tiny_model(family)
    before = _state(lm)
    v = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(0))
    kw = dict(points=["resid_pre", "mlp_out"], positions=[1, 3, -1], metric=METRIC, scale=2.0)
    single = patch_vector(lm, CLEAN, CORRUPT, v, batch=1, incremental=False, **kw)
    incremental = patch_vector(lm, CLEAN, CORRUPT, v, batch=1, **kw)
    batched = patch_vector(lm, CLEAN, CORRUPT, v, **kw)
    assert single.method == "vector" and np.isfinite(single.raw).all()
    assert np.array_equal(incremental.raw, single.raw)
    np.testing.assert_allclose(batched.raw, single.raw, rtol=0, atol=1e-5)
    after = _state(lm)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert np.abs(single.raw - single.corrupted_metric).max() > 1e-3  # the vector moves the metric: a check can fail


def test_an_added_vector_equals_an_independent_hook() -> None:
    """Adding v to layer 1's input at position 3 with the house's patching equals a plain forward pre-hook that adds
    it (written here, not taken from walklens)."""
    lm = tiny_model("llama")
    v = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(1))
    r = patch_vector(lm, CLEAN, CORRUPT, v, points="L1.resid_pre", positions=[3], metric=METRIC, scale=3.0, batch=1)
    layer = get_module(lm.model, f"{lm.adapter.stack().layers}.1")

    def add(_m, args, kwargs):
        x = (args[0] if args else kwargs["hidden_states"]).clone()
        x[:, 3] = x[:, 3] + (3.0 * v.double()).to(x.dtype)
        return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})

    h = layer.register_forward_pre_hook(add, with_kwargs=True)
    try:
        with torch.no_grad():
            logits = run_logits(lm, lm.tokenizer(CORRUPT, return_tensors="pt")["input_ids"], -1)[0]
    finally:
        h.remove()
    tok = lm.tokenizer
    expect = float(logits[tok.convert_tokens_to_ids("paris")] - logits[tok.convert_tokens_to_ids("london")])
    assert r.raw[0, 0] == pytest.approx(expect, abs=1e-5)


def test_the_clean_vector_put_in_place_is_activation_patching() -> None:
    """Replacing with the clean run's own vector at L0.resid_pre, position 3 (where the prompts differ) is the
    activation patch of that cell: 1 exactly."""
    lm = tiny_model("llama")
    cids = lm.tokenizer(CLEAN, return_tensors="pt")["input_ids"]
    clean_v = record(lm, cids, [Site(0, "resid_pre")], -1).vectors["L0.resid_pre"][3]
    r = patch_vector(lm, CLEAN, CORRUPT, clean_v, mode="replace", points="L0.resid_pre", positions=[3], metric=METRIC)
    a = patch(lm, CLEAN, CORRUPT, points="L0.resid_pre", positions=[3], metric=METRIC)
    assert r.raw[0, 0] == a.raw[0, 0] and r.values[0, 0] == 1.0


def test_prompts_of_different_lengths_and_a_head_vector() -> None:
    lm = tiny_model("llama")
    d = int(lm.head_weights(0).d_head)
    r = patch_vector(lm, "the capital of france", CORRUPT, torch.ones(d), points="L1.H0", metric="kl")
    assert r.values.shape == (1, len(lm.tokenizer(CORRUPT)["input_ids"])) and r.clean_tokens == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(vector=[1.0, 2.0]), "the vector has 2 numbers"),
        (dict(vector=torch.ones(2, 3)), "give one vector"),
        (dict(vector=torch.full((64,), float("nan"))), "NaN"),
        (dict(mode="multiply"), "give add or replace"),
        (dict(direction="noise"), "direction is denoise"),
        (dict(position_map={0: 0}), "position_map"),
    ],
)
def test_bad_input_is_one_line(kwargs: dict, message: str) -> None:
    lm = tiny_model("llama")
    kw = {"vector": torch.ones(lm.d_model), "points": "L0.resid_pre", "metric": METRIC, **kwargs}
    with pytest.raises(InputError, match=message) as e:
        patch_vector(lm, CLEAN, CORRUPT, **kw)
    assert "\n" not in str(e.value)


def test_the_cli_patches_a_vector_from_a_file(tmp_path, capsys) -> None:
    """``walklens patch --vector`` reads a .npy (never a pickle) or a one-tensor .safetensors and equals the API;
    bad files are one line, exit 2."""
    from safetensors.torch import save_file

    from walklens.cli import main

    lm = tiny_model("llama")
    lm.model.save_pretrained(tmp_path / "model")
    lm.tokenizer.save_pretrained(tmp_path / "model")
    v = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(2))
    np.save(tmp_path / "v.npy", v.numpy())
    save_file({"direction": v}, str(tmp_path / "v.safetensors"))
    save_file({"a": v, "b": v.clone()}, str(tmp_path / "two.safetensors"))
    np.save(tmp_path / "obj.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)

    def run(*argv: str) -> tuple[int, str]:
        try:
            code = main(["patch", CLEAN, CORRUPT, "--model", str(tmp_path / "model"), "--metric", METRIC, *argv])
        except SystemExit as e:
            code = int(e.code or 0)
        return code, capsys.readouterr().err

    expect = patch_vector(lm, CLEAN, CORRUPT, v, mode="replace", scale=0.5, points="L1.resid_pre", metric=METRIC)
    for name in ("v.npy", "v.safetensors"):
        js = tmp_path / f"{name}.json"
        argv = ["--points", "L1.resid_pre", "--vector", str(tmp_path / name), "--vector-mode", "replace",
                "--scale", "0.5", "--json", str(js)]  # fmt: skip
        code, err = run(*argv)
        assert code == 0, err
        doc = __import__("json").loads(js.read_text())
        assert doc["method"] == "vector" and np.allclose(doc["raw"], expect.raw, rtol=0, atol=1e-5)
    for argv, words in [
        (["--vector", str(tmp_path / "two.safetensors")], "holds 2 tensors"),
        (["--vector", str(tmp_path / "obj.npy")], "cannot be read"),
        (["--vector", str(tmp_path / "missing.npy")], "cannot be read"),
        (["--vector", str(tmp_path / "v.txt")], "give a .npy or a .safetensors"),
        (["--vector", str(tmp_path / "v.npy"), "--direction", "noise"], "not with --sender"),
    ]:
        code, err = run(*argv)
        assert code == 2 and words in err and err.count("\n") == 1 and err.startswith("walklens: error: "), err
