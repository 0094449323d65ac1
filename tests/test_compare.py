"""Comparisons (issue 56): ``walklens simmap TEXT_A TEXT_B`` and ``compare_maps`` draw two texts' maps side by side
on one colour scale; ``SimilarityMap.to_pandas()`` is the similarity frame of the map."""

from __future__ import annotations

import html
import json
import re

import pytest
import torch

import walklens
from walklens.analyses import compare_maps, similarity_frame
from walklens.base.errors import InputError
from walklens.reports.simmap import shared_range
from walklens.testing import tiny_model

A, B = "the cat and the dog", "a house by the river and a tree"


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def test_similarity_map_to_pandas(llama):
    pd = pytest.importorskip("pandas")
    m = walklens.similarity_map(walklens.capture(llama, A), "final")
    df = m.to_pandas()
    pd.testing.assert_frame_equal(df, similarity_frame(m.plain(), m.tokens), check_like=True)
    assert df.attrs["point"] == "final" and list(df["token_i"][: len(m.tokens)]) == [m.tokens[0]] * len(m.tokens)


def test_pair_frame_view_and_refusal(llama):
    pytest.importorskip("pandas")
    a = walklens.similarity_map(walklens.capture(llama, A), "final", metric="cosine")
    b = walklens.similarity_map(walklens.capture(llama, B), "final", metric="cosine")
    pair = compare_maps(a, b)
    df = pair.to_pandas()
    assert list(df["text"].unique()) == ["A", "B"] and len(df) == a.numel() + b.numel()
    page = pair._repr_html_()
    assert page.count("simmap_view") >= 2
    with pytest.raises(InputError, match="read differently"):
        compare_maps(a, walklens.similarity_map(walklens.capture(llama, B), "final", metric="dot"))


def test_shared_range_covers_both():
    a, b = torch.zeros(3, 3), torch.full((3, 3), 10.0)
    a[0, 1], b[1, 0] = -2.0, 12.0
    lo, hi, _ = shared_range(a, b)
    assert lo <= 0.0 and hi >= 10.0


def test_cli_two_texts_one_scale(tmp_path, saved_model, capfd, monkeypatch):
    from walklens.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    model = str(saved_model(tiny_model("llama")))
    out, js = tmp_path / "pair", tmp_path / "pair.json"
    capfd.readouterr()
    argv = ["simmap", A, B, "--model", model, "--point", "final", "--metric", "cosine", "--out", str(out)]
    assert main([*argv, "--json", str(js)]) == 0
    text = capfd.readouterr().out
    assert "A final/cosine" in text and "B final/cosine" in text and "one colour scale" in text
    page = (out / "index.html").read_text()
    docs = [json.loads(html.unescape(d)) for d in re.findall(r"data-result='simmap_view' data-doc='([^']*)'", page)]
    if not docs:
        docs = [json.loads(html.unescape(d)) for d in re.findall(r'data-doc="([^"]*)"', page) if "scale" in d]
    assert len(docs) == 2 and docs[0]["scale"] == docs[1]["scale"]
    assert (out / "simmap_pair_final_cosine.png").exists()
    doc = json.loads(js.read_text())
    assert [d["text"] for d in doc["compared"]] == [A, B]
