"""A checkpoint's config is checked against its weights before a model is built (the safetensors headers only,
no tensor loaded): a layer count, hidden size, vocabulary or head count the weights contradict is one line naming
the field, its value and what the weights say, at once (a billion layers used to build for minutes).  Shards named
by ``model.safetensors.index.json`` must lie inside the model folder, exist and hold what the index says."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import walklens
from walklens.base.errors import WalklensError
from walklens.cli import main
from walklens.testing import tiny_model


def _save(family: str, folder: Path, **kw: object) -> Path:
    lm = tiny_model(family)
    lm.model.save_pretrained(str(folder), safe_serialization=True, **kw)
    lm.tokenizer.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny llama and gpt2 (adapter files), arcee (derived) and a llama in several shards, as model folders."""
    root = tmp_path_factory.mktemp("ckpt")
    return {
        "llama": _save("llama", root / "llama"),
        "arcee": _save("arcee", root / "arcee"),
        "gpt2": _save("gpt2", root / "gpt2"),
        "sharded": _save("llama", root / "sharded", max_shard_size="20KB"),
    }


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WALKLENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _copy(src: Path, dst: Path, **config: object) -> Path:
    shutil.copytree(src, dst)
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _one_line(argv: list[str], capfd: pytest.CaptureFixture[str]) -> str:
    capfd.readouterr()
    assert main(argv) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("walklens: error: "), err
    return err[0]


# ---- the config against the weights ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("family,command", [("arcee", "walk"), ("llama", "verify"), ("gpt2", "walk")])
def test_a_billion_layers_are_refused_at_once(family, command, saved, tmp_path):
    """A derived family, or an adapter family under verify, used to build for over 90 s."""
    field = "n_layer" if family == "gpt2" else "num_hidden_layers"
    d = _copy(saved[family], tmp_path / "m", **{field: 1_000_000_000})
    argv = [command, *(["hello", "--model"] if command == "walk" else []), str(d)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    code = f"import sys; from walklens.cli import main; sys.exit(main({argv!r}))"
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - start < 45
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and err[0].startswith("walklens: error: "), r.stderr
    assert f"{field} 1000000000" in err[0] and "the weights hold 2 layers" in err[0], err


@pytest.mark.parametrize(
    "field,value,says",
    [
        ("num_hidden_layers", 3, "the weights hold 2 layers"),
        ("hidden_size", 1_000_000_000, "width 32"),
        ("hidden_size", 64, "width 32"),
        ("vocab_size", 1_000_000_000, "126 tokens"),
        ("vocab_size", 100, "126 tokens"),
        ("num_attention_heads", 8, "model.layers.0.self_attn.q_proj.weight [32, 32]"),
        ("num_key_value_heads", 4, "model.layers.0.self_attn.k_proj.weight [16, 32]"),
        ("head_dim", 16, "model.layers.0.self_attn.q_proj.weight [32, 32]"),
        ("intermediate_size", 1_000_000_000, "no tensor of the weights has a dimension over 126"),
    ],
)
def test_config_sizes_the_weights_contradict_are_one_line(field, value, says, saved, tmp_path, capfd):
    d = _copy(saved["llama"], tmp_path / "m", **{field: value})
    line = _one_line(["walk", "hello", "--model", str(d)], capfd)
    assert "config.json gives" in line and f"{field} {value}" in line and says in line, line


def test_config_checks_pass_on_every_tiny_family(tmp_path):
    """Nothing valid is refused: every family's tiny model loads back from its folder."""
    from walklens.testing import TINY_FAMILIES

    for family in TINY_FAMILIES:
        d = _save(family, tmp_path / family)
        assert walklens.load_model(str(d)).adapter is not None, family


# ---- shards named by the index ---------------------------------------------------------------------------------


def _index(d: Path) -> dict:
    return json.loads((d / "model.safetensors.index.json").read_text())


def _rewrite_index(d: Path, change) -> None:
    doc = _index(d)
    change(doc["weight_map"])
    (d / "model.safetensors.index.json").write_text(json.dumps(doc))


def test_a_sharded_checkpoint_loads(saved):
    assert len(set(_index(saved["sharded"])["weight_map"].values())) > 1
    assert walklens.load_model(str(saved["sharded"])).n_layers == 2


@pytest.mark.parametrize("how", ["parent", "absolute", "symlink"])
def test_a_shard_outside_the_model_folder_is_refused(how, saved, tmp_path, capfd):
    d = _copy(saved["sharded"], tmp_path / "m")
    first = sorted(set(_index(d)["weight_map"].values()))[0]
    outside = tmp_path / "outside.safetensors"
    shutil.move(d / first, outside)
    if how == "symlink":
        (d / first).symlink_to(outside)
    else:
        name = "../outside.safetensors" if how == "parent" else str(outside)
        _rewrite_index(d, lambda m: m.update({k: name for k, v in m.items() if v == first}))
    line = _one_line(["walk", "hello", "--model", str(d)], capfd)
    assert "lies outside the folder" in line and "model.safetensors.index.json" in line, line


def test_a_missing_shard_is_refused(saved, tmp_path, capfd):
    d = _copy(saved["sharded"], tmp_path / "m")
    first = sorted(set(_index(d)["weight_map"].values()))[0]
    (d / first).unlink()
    line = _one_line(["walk", "hello", "--model", str(d)], capfd)
    assert f"the shard {first!r}" in line and "is missing" in line, line


def test_shards_that_disagree_with_their_index_are_refused(saved, tmp_path, capfd):
    d = _copy(saved["sharded"], tmp_path / "m")
    shards = sorted(set(_index(d)["weight_map"].values()))
    name = next(k for k, v in _index(d)["weight_map"].items() if v == shards[0])
    _rewrite_index(d, lambda m: m.update({name: shards[1]}))  # mapped to a shard that does not hold it
    line = _one_line(["walk", "hello", "--model", str(d)], capfd)
    assert name in line and shards[1] in line and "which lacks it" in line, line
    d2 = _copy(saved["sharded"], tmp_path / "m2")
    wmap = _index(d2)["weight_map"]
    held = next(k for k, v in wmap.items() if sum(w == v for w in wmap.values()) > 1)  # a shard of several
    _rewrite_index(d2, lambda m: m.pop(held))  # a tensor of a shard the index names, not mapped to it
    line = _one_line(["walk", "hello", "--model", str(d2)], capfd)
    assert held in line and "the index does not map" in line, line


@pytest.mark.parametrize(
    "index",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"weight_map": 5}',
        b'{"weight_map": {"model.norm.weight": 7}}',
        b'{"weight_map": {"model.norm.weight": ""}}',
        b"not json",
    ],
)
def test_a_malformed_index_is_one_line(index, saved, tmp_path, capfd):
    d = _copy(saved["sharded"], tmp_path / "m")
    (d / "model.safetensors.index.json").write_bytes(index)
    line = _one_line(["walk", "hello", "--model", str(d)], capfd)
    assert "model.safetensors.index.json" in line, line


def test_an_index_that_is_a_fifo_is_never_waited_on(saved, tmp_path):
    d = _copy(saved["sharded"], tmp_path / "m")
    (d / "model.safetensors.index.json").unlink()
    os.mkfifo(d / "model.safetensors.index.json")
    with pytest.raises(WalklensError, match="FIFO"):
        walklens.load_model(str(d))


def test_a_hub_snapshot_linking_into_its_blobs_loads(saved, tmp_path):
    """A hub snapshot's files are links into its repository's blobs: inside the repository, so followed."""
    repo = tmp_path / "hub" / "models--org--tiny"
    snap = repo / "snapshots" / ("0" * 40)
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(saved["sharded"].iterdir())):
        shutil.copy(f, repo / "blobs" / f"blob{i}")
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / f"blob{i}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    env = {k: v for k, v in os.environ.items() if "OFFLINE" not in k and "PROXY" not in k.upper()}
    env.update(HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1", WALKLENS_CACHE=str(tmp_path / "wl"))
    code = "import walklens; lm = walklens.load_model('org/tiny'); print(lm.adapter.family, lm.n_layers)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["llama", "2"]
