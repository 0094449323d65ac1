"""Interventions and steering on a streamed model (walklens.core.interventions, walklens.core.streaming): every kind
acts on the layers as they are read from disk, bit for bit as in memory (float32 and bfloat16); a weight edit is
applied each time its layer is read and is gone with the layer's weights; the checkpoint's files are never written;
what cannot act on a streamed layer's parameters is refused in one line."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import torch

import walklens
from _cli import run as run_cli
from _toy import saved_tiny
from walklens.base.errors import InputError
from walklens.core import interventions as iv
from walklens.core.loading import LoadedModel, load_model

TEXT = "The capital of France is Paris, and"


def digests(folder: Path) -> dict[str, tuple[str, int]]:
    """Each file of a model folder: the sha256 of its bytes and its mtime."""
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in folder.iterdir()}


def layer_param(lm: LoadedModel, layer: int) -> str:
    """The name of the first matrix of layer ``layer``'s module (in ``lm.model``)."""
    module = lm.adapter.layer_modules(lm.model)[layer]
    prefix = next(n for n, m in lm.model.named_modules() if m is module)
    return next(f"{prefix}.{n}" for n, p in module.named_parameters() if p.dim() == 2)


def resident_param(lm: LoadedModel) -> str:
    """The name of the token embedding matrix (a tensor a streamed model holds throughout)."""
    E = lm.embedding_matrix()
    return next(n for n, p in lm.model.named_parameters() if p is E)


Kind = Callable[[LoadedModel, torch.Tensor], AbstractContextManager[Any]]
KINDS: dict[str, Kind] = {
    "ablate_mlps": lambda lm, u: iv.ablate_mlps(lm),
    "add_to_residual": lambda lm, u: iv.add_to_residual(lm, [1], u.float(), 3.0),
    "add_per_sequence": lambda lm, u: iv.add_to_residual(lm, [0, -1], u.float(), [2.0]),
    "ablate_direction": lambda lm, u: iv.ablate_direction(lm, [0, 1], u.float()),
    "eigen_edit": lambda lm, u: iv.eigen_edit(lm, [0, 1], u, 2.0),
    "edit_named": lambda lm, u: iv.edit_named(
        lm,
        [
            (layer_param(lm, 1), torch.full((1,), 0.25)),
            (layer_param(lm, 1), torch.full((1,), -0.125)),
            (resident_param(lm), torch.full((1,), 0.5)),
        ],
    ),  # fmt: skip
    "tied_layers": lambda lm, u: iv.tied_layers(lm, 1, 5),
    "upcast": lambda lm, u: iv.upcast(iv.outside_layers(lm)),
    "attention_kernel": lambda lm, u: iv.attention_kernel(lm, "sdpa"),
    "prepacked_linears": lambda lm, u: iv.prepacked_linears(lm),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["llama", "gpt2", "albert", "t5", "qwen3_moe", "falcon"])
def test_every_intervention_on_a_streamed_model_equals_in_memory(family: str, dtype: str, tmp_path: Path) -> None:
    folder = saved_tiny(family, dtype, tmp_path)
    before = digests(folder)
    whole = load_model(str(folder), dtype=dtype, progress=False, stream=False)
    streamed = load_model(str(folder), dtype=dtype, progress=False, stream=True)
    base = walklens.capture(whole, TEXT).hidden
    u = torch.randn(base.shape[-1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    u = u / u.norm()
    differ, refused, acted = [], {}, []
    for name, kind in KINDS.items():
        try:
            with kind(whole, u) as a:
                x = walklens.capture(whole, TEXT).hidden
        except Exception as e:  # a kind this family or dtype does not take: refused the same way streamed
            with pytest.raises(type(e)), kind(streamed, u):
                walklens.capture(streamed, TEXT)
            refused[name] = type(e).__name__
            continue
        with kind(streamed, u) as b:
            y = walklens.capture(streamed, TEXT).hidden
        if not torch.equal(x, y) or (isinstance(a, list) and a != b):  # (a list: eigen_edit's measured edits)
            differ.append(name)
        if not torch.equal(x, base):
            acted.append(name)
    assert differ == []
    assert {"ablate_mlps", "edit_named", "tied_layers"} - set(refused) <= set(acted)  # (they do change the pass)
    if family != "albert":  # (ALBERT's embeddings are narrower than its residual: no token direction)
        assert {"add_to_residual", "ablate_direction", "eigen_edit"} <= set(acted)
    # every edit is gone: the streamed model is the checkpoint again, its layers back on meta, its files unchanged
    assert torch.equal(walklens.capture(streamed, TEXT).hidden, base) and streamed.stream.edits == {}
    for path, layer in streamed.stream.layers.items():
        assert all(p.device.type == "meta" for p in layer.parameters()), path
    assert digests(folder) == before


def test_an_edit_is_applied_each_time_the_layer_is_read_and_gone_after(tmp_path: Path) -> None:
    folder = saved_tiny("llama", "float32", tmp_path)
    lm = load_model(str(folder), progress=False, stream=True)
    stream = lm.stream
    assert stream is not None
    name = layer_param(lm, 1)
    path = next(p for p in stream.layers if name.startswith(p + "."))
    rel = name[len(path) + 1 :]
    with stream.held(path):
        plain = stream.layers[path].get_parameter(rel).detach().clone()
    delta = torch.randn(plain.shape, generator=torch.Generator().manual_seed(1))
    with iv.edit_named(lm, [(name, delta)]):
        for _ in range(2):  # read twice: the delta is added to each fresh read, once
            with stream.held(path):
                assert torch.equal(stream.layers[path].get_parameter(rel), plain + delta)
            assert stream.layers[path].get_parameter(rel).device.type == "meta"
        with stream.held(path), pytest.raises(InputError, match="while they are held"):
            with stream.edited(path, rel, delta):
                pass
    with stream.held(path):
        assert torch.equal(stream.layers[path].get_parameter(rel), plain)


def test_in_place_changes_to_a_streamed_layer_are_refused_in_one_line(tmp_path: Path) -> None:
    lm = load_model(str(saved_tiny("llama", "float32", tmp_path)), progress=False, stream=True)
    p = lm.model.get_parameter(layer_param(lm, 0))
    assert p.device.type == "meta"
    with pytest.raises(InputError, match="cannot be edited in place; edit it by name") as e:
        with iv.edit_weights([(p, torch.ones(1))]):
            pass
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="upcast holds only tensors in memory") as e:
        with iv.upcast([p]):
            pass
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="the model has no parameter 'model.nowhere.weight'"):
        with iv.edit_named(lm, [("model.nowhere.weight", torch.ones(1))]):
            pass


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_walklens_steer_streamed_writes_what_it_writes_in_memory(dtype: str, tmp_path: Path, capfd) -> None:
    """``walklens steer --stream``: eigen-steering (its sign chosen on the prompts) and activation addition,
    generation included, give the same JSON as in memory, and the model's files stay as they were."""
    folder = saved_tiny("llama", dtype, tmp_path)
    before = digests(folder)
    args = ["steer", "The capital of France is", "--toward", " Paris", "--layers", "1", "--layers", "0-1",
            "--alpha", "0,4", "--method", "both", "--max-new-tokens", "3", "--model", str(folder), "--dtype", dtype,
            "--no-progress"]  # fmt: skip
    for how in ("stream", "no-stream"):
        rc, err = run_cli(capfd, *args, f"--{how}", "--json", str(tmp_path / f"{how}.json"))
        assert rc == 0, err
    assert (tmp_path / "stream.json").read_bytes() == (tmp_path / "no-stream.json").read_bytes()
    assert digests(folder) == before
