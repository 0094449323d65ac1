"""Figures a reader can read (issue 56): every heatmap has a colour bar (PNG figures and the pages' canvas maps), the
copying map says which sign copies, axis labels stay readable at 92 columns, ``heads --out`` writes PNG figures,
``heads --layer L`` shows only layer L's A.3 identity and names the heads that copy, and ``copying_score()`` of one
matrix is a Python float."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import walklens
from walklens.reports.html import MAX_TICKS, pyplot, ticks
from walklens.testing import tiny_model

ASSETS = Path(walklens.__file__).parent / "reports" / "assets"


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def test_copying_score_of_one_matrix_is_a_float(llama):
    hm = walklens.head_matrices(llama, 0)
    one = hm.vo()[0]
    score = one.copying_score()
    assert type(score) is float and round(score, 2) == round(score, 2)
    batch = hm.vo().copying_score()
    assert isinstance(batch, torch.Tensor) and batch.shape == (hm.n_heads,)
    assert score == pytest.approx(float(batch[0]))


def test_ticks_stay_readable_at_any_number_of_points():
    labels = [f"{t}:tok{t}" for t in range(92)]
    at, shown = ticks(labels)
    assert len(at) <= MAX_TICKS and at[0] == 0 and shown == [labels[i] for i in at]
    assert ticks(labels[:12]) == (list(range(12)), labels[:12])


def test_walk_rank_figure_at_92_columns_has_a_colour_bar_and_few_labels():
    from walklens.reports.walk import _rank_figure

    z = torch.rand(32, 92)
    fig = _rank_figure(z, [f"L{i}" for i in range(32)], [f"{t}:w" for t in range(92)], "ranks")
    ax = fig.axes[0]
    assert len(fig.axes) == 2  # the map and its colour bar
    assert len(ax.get_xticks()) <= MAX_TICKS and all(t.get_fontsize() >= 7 for t in ax.get_xticklabels())
    pyplot().close(fig)


def test_every_canvas_heatmap_draws_a_colour_bar_and_the_copying_map_its_sign():
    plots = (ASSETS / "plots.js").read_text()
    body = plots[plots.index("function heatmap(el)") :]
    assert "colourBar(el, lo, hi, spec)" in body.split("function lines(")[0]
    assert "spec.legend" in plots
    results = (ASSETS / "results.js").read_text()
    copying = results[results.index("W_vo copying score") :][:400]
    assert re.search(r"legend: \"red: the head copies[^\"]*\(\+1\); blue: it negates it \(-1\)\"", copying)


def test_heads_out_writes_pngs_and_layer_shows_one_layer(tmp_path, saved_model, capfd, monkeypatch):
    from walklens.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    model = str(saved_model(tiny_model("llama")))
    out = tmp_path / "heads"
    capfd.readouterr()
    assert main(["heads", "the cat and the dog", "--model", model, "--layer", "1", "--out", str(out)]) == 0
    text = capfd.readouterr().out
    assert "L1.attn" in text and "L0.attn" not in text
    assert re.search(r"layer 1: heads that copy \(W_vo copying score > 0.5", text)
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "copying_model.png" in pngs and any(p.startswith("self_mass_") for p in pngs), pngs
    capfd.readouterr()
    assert main(["heads", "the cat and the dog", "--model", model]) == 0
    every = capfd.readouterr().out
    assert "L0.attn" in every and "L1.attn" in every  # no --layer: every layer's identity
