"""A model folder whose weights the config does not describe, and a cache root that is not a folder, are refused
in one line (exit 2), never loaded or turned into an internal error."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from walklens.base.errors import InputError, UnknownModelError
from walklens.cli import main
from walklens.core.loading import cache_dir, load_model
from walklens.testing import tiny_model


@pytest.fixture(scope="module")
def two_layer_dirs(tmp_path_factory) -> dict[str, Path]:
    """Tiny llama and gpt2 models (2 layers) saved as model folders."""
    out = {}
    for family in ("llama", "gpt2"):
        lm = tiny_model(family)
        d = tmp_path_factory.mktemp(family)
        lm.model.save_pretrained(str(d), safe_serialization=True)
        lm.tokenizer.save_pretrained(str(d))
        out[family] = d
    return out


def _with_layers(src: Path, dst: Path, n: int) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((dst / "config.json").read_text())
    cfg["n_layer" if "n_layer" in cfg else "num_hidden_layers"] = n
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize(
    "n,needle",
    [(0, "gives 0 layers"), (-3, "gives -3 layers"), (1, "gives n?[a-z_]*layers? 1, but the weights hold 2 layers")],
)
def test_weights_the_config_does_not_use_are_refused(family, n, needle, two_layer_dirs, tmp_path, capsys):
    model = _with_layers(two_layer_dirs[family], tmp_path / "m", n)
    with pytest.raises(UnknownModelError, match=needle):
        load_model(str(model))
    assert main(["walk", "hello", "--model", str(model)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("walklens: error: ") and re.search(needle, err[0]), err
    assert load_model(str(two_layer_dirs[family])).n_layers == 2  # the untouched folder loads


@pytest.mark.parametrize("where", ["file", "file/sub"])
def test_walklens_cache_on_a_file_is_one_line(where, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("WALKLENS_CACHE", str(tmp_path / where))
    with pytest.raises(InputError, match="WALKLENS_CACHE.*is not a directory"):
        cache_dir()
    assert main(["walk", "hello", "--model", "smollm2-135m"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("walklens: error: $WALKLENS_CACHE") and "not a directory" in err[0]
    assert (tmp_path / "file").read_text() == "not a folder"
    monkeypatch.setenv("WALKLENS_CACHE", str(tmp_path / "new" / "cache"))
    assert cache_dir() == tmp_path / "new" / "cache"  # a folder still to be made is fine
