"""``walklens export TEXT --names transformerlens --out FILE.safetensors`` (issue 56): the activations of a text as
one safetensors file under TransformerLens hook names, equal to ``tl_cache`` of the same capture; the output path
checked before the model loads (a folder or a FIFO is refused, never replaced)."""

from __future__ import annotations

import json
import os

import pytest
import torch

import walklens
from walklens.core.tlnames import tl_cache
from walklens.testing import tiny_model

TEXT = "the cat and the dog"


def test_export_transformerlens_names_equal_tl_cache(tmp_path, saved_model, capfd):
    from safetensors import safe_open

    from walklens.cli import main

    lm = tiny_model("llama")
    model = str(saved_model(lm))
    out = tmp_path / "acts.safetensors"
    argv = ["export", TEXT, "--model", model, "--names", "transformerlens", "--out", str(out)]
    assert main([*argv, "--points", "blocks.*.hook_resid_post"]) == 0
    want = tl_cache(walklens.capture(lm, TEXT, points=["L*.resid_post"]))
    with safe_open(str(out), "pt") as f:
        assert sorted(f.keys()) == sorted(want) and all(k.startswith("blocks.") for k in f.keys())
        for k in f.keys():
            assert torch.allclose(f.get_tensor(k), want[k].float(), atol=1e-5)
        meta = f.metadata()
    assert meta["names"] == "transformerlens"
    assert json.loads(meta["token_ids"]) == walklens.capture(lm, TEXT).token_ids.reshape(-1).tolist()


def test_export_refuses_before_loading(tmp_path, capfd, monkeypatch):
    import walklens.cli.export as export
    from walklens.cli import main

    monkeypatch.setattr(export, "load", lambda args: pytest.fail("the model loaded before the output was checked"))
    folder = tmp_path / "a.safetensors"
    folder.mkdir()
    capfd.readouterr()
    assert main(["export", TEXT, "--out", str(folder)]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("walklens: error: --out") and "refusing to replace" in err[0]
    fifo = tmp_path / "p.safetensors"
    os.mkfifo(fifo)
    assert main(["export", TEXT, "--out", str(fifo)]) == 2
    assert main(["export", TEXT, "--out", str(tmp_path / "x.pt")]) == 2
    assert "name a .safetensors file" in capfd.readouterr().err
