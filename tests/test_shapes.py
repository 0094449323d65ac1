"""Models of real shapes (walklens.testing.shapes): each config builds with its published parameter count, the
parameter list matches the architecture's own arithmetic, a written folder (a truncated, narrowed copy: same code
path) loads through walklens and transformers alike, its numbers are the seed's whatever the shard size, the
writer holds at most a shard in memory, and a used folder or a full disk is refused in one line."""

from __future__ import annotations

import json
import math
import weakref
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from safetensors import safe_open

from walklens.base.errors import InputError
from walklens.testing import shapes
from walklens.testing.shapes import (
    REAL_SHAPES,
    real_shape_config,
    real_shape_size,
    real_shape_specs,
    real_shape_tensor,
    write_real_shape,
)

#: the published total parameter counts (model cards)
PUBLISHED = {"llama-3.1-8b": 8.03e9, "qwen3-14b": 14.8e9, "gemma-2-9b": 9.24e9, "qwen3-30b-a3b": 30.5e9}
#: a narrow width for the written tests; the vocabulary, the expert count and everything else stay real
NARROW: dict[str, Any] = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
NARROW_BY = {n: dict(NARROW, head_dim=16, **({"moe_intermediate_size": 32} if "a3b" in n else {})) for n in REAL_SHAPES}
TEXT = "the capital of france is paris"


def _by_formula(c: dict[str, Any]) -> int:
    """Parameters of a llama-like checkpoint from its config alone (attention, MLP or experts, norms, embeddings)."""
    h, v, layers = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    attn = 2 * h * q + 2 * h * kv
    if c["model_type"] == "qwen3_moe":
        mlp = c["num_experts"] * 3 * h * c["moe_intermediate_size"] + c["num_experts"] * h
    else:
        mlp = 3 * h * c["intermediate_size"]
    norms = {"gemma2": 4 * h, "qwen3": 2 * h + 2 * hd, "qwen3_moe": 2 * h + 2 * hd}.get(c["model_type"], 2 * h)
    embeddings = v * h * (1 if c["tie_word_embeddings"] else 2)
    return embeddings + layers * (attn + mlp + norms) + h


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    out: dict[str, torch.Tensor] = {}
    for file in sorted(set(index["weight_map"].values())):
        with safe_open(str(folder / file), "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    assert sorted(out) == sorted(index["weight_map"])
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype.itemsize == 2 else t.view(torch.int32)


@pytest.mark.parametrize("name", sorted(REAL_SHAPES))
def test_each_shape_builds_with_its_published_parameter_count(name: str) -> None:
    config = real_shape_config(name)
    model = shapes.meta_model(config)
    built = sum(p.numel() for p in model.parameters())  # a tied embedding counts once
    listed = sum(math.prod(s.shape) for s in real_shape_specs(name))
    assert built == listed == _by_formula(config)
    assert abs(built - PUBLISHED[name]) / PUBLISHED[name] < 0.01
    assert real_shape_size(name, torch.bfloat16) == 2 * built and real_shape_size(name, "float32") == 4 * built
    hf = model.config  # the published field names mean what transformers reads them as
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        assert getattr(hf, key) == config[key]
    assert (
        hf.num_hidden_layers == config["num_hidden_layers"] and hf.tie_word_embeddings == config["tie_word_embeddings"]
    )
    assert hf.rope_parameters["rope_theta"] == config["rope_theta"]
    if config.get("rope_scaling"):
        assert hf.rope_parameters["rope_type"] == "llama3" and hf.rope_parameters["factor"] == 8.0
    assert not any(isinstance(t, torch.Tensor) and t.device.type != "meta" for t in model.state_dict().values())


def test_the_shapes_read_their_family_specific_fields() -> None:
    gemma = shapes.meta_model(real_shape_config("gemma-2-9b")).config
    assert (gemma.attn_logit_softcapping, gemma.final_logit_softcapping) == (50.0, 30.0)
    assert (gemma.query_pre_attn_scalar, gemma.sliding_window, gemma.head_dim) == (256, 4096, 256)
    moe = shapes.meta_model(real_shape_config("qwen3-30b-a3b")).config
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (128, 8, 768)
    names = {s.name for s in real_shape_specs("qwen3-30b-a3b", layers=1)}  # the checkpoint's own per-expert layout
    assert "model.layers.0.mlp.experts.127.down_proj.weight" in names and "model.layers.0.mlp.gate.weight" in names
    assert not any("gate_up_proj" in n for n in names)
    assert "lm_head.weight" not in {s.name for s in real_shape_specs("gemma-2-9b", layers=1)}  # tied


def test_tensors_are_written_in_the_order_a_real_checkpoint_holds_them() -> None:
    for name in REAL_SHAPES:
        names = [s.name for s in real_shape_specs(name, layers=3)]
        assert names[0] == "model.embed_tokens.weight" and names[-1] in ("lm_head.weight", "model.norm.weight"), name
        layers = [int(n.split(".")[2]) for n in names if n.startswith("model.layers.")]
        assert layers == sorted(layers) and set(layers) == {0, 1, 2}, name
        assert names.index("model.norm.weight") > max(i for i, n in enumerate(names) if n.startswith("model.layers."))
    moe = [s.name for s in real_shape_specs("qwen3-30b-a3b", layers=1) if ".experts." in s.name]
    assert moe[:3] == [f"model.layers.0.mlp.experts.0.{p}_proj.weight" for p in ("down", "gate", "up")]
    assert moe[3].startswith("model.layers.0.mlp.experts.1.")  # natural order: 1, 2, ..., 10, not 1, 10, 100


def test_norms_start_as_the_model_starts_them() -> None:
    inits = {n: {(s.init, s.value) for s in real_shape_specs(n, layers=1) if "norm" in s.name} for n in REAL_SHAPES}
    assert inits["gemma-2-9b"] == {("constant", 0.0)}  # Gemma's norms scale by 1 + w
    assert inits["llama-3.1-8b"] == inits["qwen3-14b"] == {("constant", 1.0)}
    assert {s.init for s in real_shape_specs("llama-3.1-8b", layers=1) if len(s.shape) == 2} == {"normal"}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each shape truncated to two layers and narrowed, written once in small shards."""
    root = tmp_path_factory.mktemp("shapes")
    return {
        n: write_real_shape(n, root / n, layers=2, shard_bytes=2**24, progress=False, config_overrides=NARROW_BY[n])
        for n in sorted(REAL_SHAPES)
    }


@pytest.mark.real
@pytest.mark.parametrize("name", sorted(REAL_SHAPES))
def test_a_written_shape_loads_in_walklens_and_transformers_alike(
    name: str, written: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    import walklens

    folder = written[name]
    config = json.loads((folder / "config.json").read_text())
    assert config == dict(real_shape_config(name, 2, NARROW_BY[name]), torch_dtype="bfloat16")
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in folder.iterdir()}
    assert len(list(folder.glob("model-*-of-*.safetensors"))) > 1
    real = transformers.AutoModelForCausalLM.from_pretrained
    calls: list[str] = []

    def spy(source: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(str(source))
        return real(source, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    lm = walklens.load_model(str(folder), progress=False)  # its checks and its own forward-pass check run
    assert calls == [str(folder)] and lm.n_layers == 2 and lm.adapter.family == config["model_type"]
    monkeypatch.undo()
    plain = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="eager"
    )
    ids = lm.tokenizer(TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        ours, theirs = lm.model(ids).logits, plain(ids).logits
    assert torch.equal(ours, theirs) and bool(torch.isfinite(ours).all())
    stored = _tensors(folder)  # what was loaded is what was written, rounded from bfloat16
    for key, value in plain.state_dict().items():
        if key in stored:
            assert torch.equal(value, stored[key].float()), key


@pytest.mark.real
def test_the_size_is_the_written_bytes(written: dict[str, Path]) -> None:
    for name, folder in written.items():
        stored = _tensors(folder)
        nbytes = sum(t.numel() * t.element_size() for t in stored.values())
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        assert nbytes == index["metadata"]["total_size"] == real_shape_size(name, "bfloat16", 2, NARROW_BY[name])
        assert {k: tuple(v.shape) for k, v in stored.items()} == {
            s.name: s.shape for s in real_shape_specs(name, 2, NARROW_BY[name])
        }


@pytest.mark.real
def test_the_seed_fixes_every_tensor_whatever_the_shard_size(tmp_path: Path) -> None:
    name, over = "llama-3.1-8b", NARROW_BY["llama-3.1-8b"]
    one = write_real_shape(name, tmp_path / "one", layers=1, progress=False, config_overrides=over)
    many = write_real_shape(name, tmp_path / "many", layers=1, shard_bytes=2**15, progress=False, config_overrides=over)
    other = write_real_shape(name, tmp_path / "other", layers=1, seed=1, progress=False, config_overrides=over)
    assert len(list(one.glob("*.safetensors"))) == 1 and len(list(many.glob("*.safetensors"))) > 4
    a, b, c = _tensors(one), _tensors(many), _tensors(other)
    assert a.keys() == b.keys() == c.keys()
    for key in a:
        assert torch.equal(_bits(a[key]), _bits(b[key])), key
        alone = real_shape_tensor(name, key, "bfloat16", 0, 1, over)
        assert torch.equal(_bits(alone), _bits(a[key])), key
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    emb = a["model.embed_tokens.weight"].float()  # normal(0, initializer_range)
    assert abs(emb.mean().item()) < 1e-3 and abs(emb.std().item() - 0.02) < 1e-3


@pytest.mark.real
def test_at_most_a_shard_is_held_while_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[weakref.ref[torch.Tensor]] = []
    held: list[tuple[int, int]] = []  # (bytes of the shard saved, bytes of every made tensor still alive)
    make, save = shapes.make_tensor, safetensors.torch.save_file

    def counted_make(*args: Any, **kwargs: Any) -> torch.Tensor:
        t = make(*args, **kwargs)
        made.append(weakref.ref(t))
        return t

    def alive() -> int:
        return sum(t.numel() * t.element_size() for r in made if (t := r()) is not None)

    def counted_save(tensors: dict[str, torch.Tensor], *args: Any, **kwargs: Any) -> None:
        held.append((sum(t.numel() * t.element_size() for t in tensors.values()), alive()))
        save(tensors, *args, **kwargs)

    monkeypatch.setattr(shapes, "make_tensor", counted_make)
    monkeypatch.setattr(shapes, "save_file", counted_save)
    over, limit = NARROW_BY["qwen3-14b"], 2**16
    write_real_shape("qwen3-14b", tmp_path / "m", layers=2, shard_bytes=limit, progress=False, config_overrides=over)
    biggest = max(s.nbytes(torch.bfloat16) for s in real_shape_specs("qwen3-14b", 2, over))
    assert len(held) > 3 and sum(s for s, _ in held) == real_shape_size("qwen3-14b", "bfloat16", 2, over)
    assert all(live == shard <= max(limit, biggest) for shard, live in held)  # earlier shards are gone
    assert alive() == 0


@pytest.mark.real
def test_a_float32_write_holds_the_bfloat16_numbers_unrounded(tmp_path: Path) -> None:
    over = NARROW_BY["gemma-2-9b"]
    f32 = write_real_shape("gemma-2-9b", tmp_path / "f", "float32", layers=1, progress=False, config_overrides=over)
    assert json.loads((f32 / "config.json").read_text())["torch_dtype"] == "float32"
    key = "model.layers.0.self_attn.q_proj.weight"
    full = _tensors(f32)[key]
    assert full.dtype == torch.float32 and torch.equal(
        full.bfloat16(), real_shape_tensor("gemma-2-9b", key, layers=1, config_overrides=over)
    )


def _one_line(e: pytest.ExceptionInfo[InputError]) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


def test_a_used_folder_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("mine")
    (tmp_path / "file").write_text("a file")
    for folder in (tmp_path / "used", tmp_path / "file"):
        with pytest.raises(InputError) as e:
            write_real_shape("llama-3.1-8b", folder, progress=False)
        assert "exists and is not an empty folder" in _one_line(e)
    assert [p.name for p in (tmp_path / "used").iterdir()] == ["notes.txt"]


def test_a_full_disk_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    full = SimpleNamespace(total=10**12, used=10**12 - 10**9, free=10**9)
    monkeypatch.setattr("shutil.disk_usage", lambda p: full)
    with pytest.raises(InputError) as e:
        write_real_shape("llama-3.1-8b", tmp_path / "new" / "model", progress=False)
    assert "needs 16.08 GB free" in _one_line(e) and "has 1.00 GB free" in _one_line(e)
    assert not (tmp_path / "new").exists()


def test_bad_arguments_are_refused_in_one_line(tmp_path: Path) -> None:
    for call in (
        lambda: write_real_shape("llama-9t", tmp_path / "a"),
        lambda: write_real_shape("llama-3.1-8b", tmp_path / "a", layers=33),
        lambda: write_real_shape("llama-3.1-8b", tmp_path / "a", layers=0),
        lambda: write_real_shape("llama-3.1-8b", tmp_path / "a", dtype="int8"),
        lambda: write_real_shape("llama-3.1-8b", tmp_path / "a", shard_bytes=0),
        lambda: write_real_shape("llama-3.1-8b", tmp_path / "a", seed=0.5),  # type: ignore[arg-type]
        lambda: real_shape_tensor("llama-3.1-8b", "no.such.weight", layers=1),
        lambda: real_shape_size("llama-3.1-8b", layers=1, config_overrides={"hidden_act": "no-such-activation"}),
    ):
        with pytest.raises(InputError) as e:
            call()
        _one_line(e)
    assert not (tmp_path / "a").exists()


@pytest.mark.real
def test_a_vocabulary_below_the_tokenizer_is_refused(tmp_path: Path) -> None:
    over = dict(NARROW_BY["llama-3.1-8b"], vocab_size=32000)  # Mixtral's: below the default tokenizer's 49152
    with pytest.raises(InputError) as e:
        write_real_shape("llama-3.1-8b", tmp_path / "m", layers=1, progress=False, config_overrides=over)
    assert "vocabulary of 32000" in _one_line(e) and not (tmp_path / "m").exists()


def test_the_command_refuses_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x").write_text("")
    assert shapes.main(["llama-3.1-8b", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("walklens: error: ") and err.count("\n") == 1
