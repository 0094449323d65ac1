"""Small things of issue 56: the default model named exactly (SmolLM2-135M-Instruct, as its GGUF file is), a model
folder without a tokenizer refused in one line naming it, and the parity card's title saying whether the family is
read by an adapter file or derived."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from walklens.core import loading
from walklens.testing import tiny_model

ROOT = Path(__file__).resolve().parents[1]


def test_default_model_is_named_exactly(capsys):
    from walklens.cli import main

    source = inspect.getsource(loading._smollm2_gguf)
    assert "SmolLM2-135M-Instruct" in source  # the file the default model is read from
    assert loading.NAMED_MODEL_SOURCES[loading.DEFAULT_MODEL].startswith("SmolLM2-135M-Instruct")
    with pytest.raises(SystemExit):
        main(["walk", "--help"])
    assert "SmolLM2-135M-Instruct" in " ".join(capsys.readouterr().out.split())
    readme = (ROOT / "README.md").read_text()
    for line in readme.splitlines():
        if "default" in line and "SmolLM2-135M" in line:  # where the README names the default model
            assert "SmolLM2-135M-Instruct" in line, line


def test_folder_without_tokenizer_is_one_line(tmp_path, capfd):
    from walklens.cli import main

    lm = tiny_model("llama")
    lm.model.save_pretrained(tmp_path / "m")
    capfd.readouterr()
    assert main(["walk", "the cat", "--model", str(tmp_path / "m")]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("walklens: error: ")
    assert f"{tmp_path / 'm'} holds no tokenizer" in err[0] and "You need to have senten" not in err[0]


def test_parity_card_title_says_how_the_family_is_read():
    from walklens.analyses.parity import verify
    from walklens.reports.parity import build, read_by

    card = verify(tiny_model("llama"), texts=("the cat sat", "a dog ran"), quick=True, progress=False)
    assert read_by(card) == "adapter file"
    page = build(card).render()
    assert re.search(r"<title>[^<]*adapter file[^<]*</title>|<h1>[^<]*adapter file", page)
    import dataclasses

    derived = dataclasses.replace(card, derived=True)
    assert "derived adapter" in build(derived).render().split("</h1>")[0]
