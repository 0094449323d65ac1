"""``walklens patch`` (issue 55): the grid to --json and --out (one renderer for the report and the notebook), the
parity card with --attribution, and bad input refused in one line with exit 2."""

from __future__ import annotations

import json

import pytest

from walklens.cli import main

CLEAN = "the capital of france is paris"
CORRUPT = "the capital of england is paris"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from walklens.testing import tiny_model

    root = tmp_path_factory.mktemp("patch_cli")
    lm = tiny_model("llama")
    lm.model.save_pretrained(root / "model")
    lm.tokenizer.save_pretrained(root / "model")
    return str(root / "model")


def _run(capsys, *argv: str) -> tuple[int, str]:
    try:
        code = main(["patch", *argv])
    except SystemExit as e:
        code = int(e.code or 0)
    return code, capsys.readouterr().err


def test_grid_json_and_report(model_dir, tmp_path, capsys) -> None:
    out, js = tmp_path / "rep", tmp_path / "g.json"
    code, err = _run(
        capsys, CLEAN, CORRUPT, "--model", model_dir, "--metric", 'logitdiff:"paris","london"',
        "--points", "resid_pre,mlp_out", "--heads", "--json", str(js), "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(js.read_text())
    assert doc["kind"] == "patching" and doc["method"] == "exact"
    assert len(doc["points"]) == 2 * 2 + 2 * 4 and len(doc["positions"]) == 6
    assert doc["values"][0][3] == pytest.approx(1.0, abs=1e-5)  # L0.resid_pre at the differing token: clean (batched)
    page = (out / "index.html").read_text()
    assert "wl-heatmap" in page and "L0.resid_pre" in page

    from walklens.analyses.patching import PatchResult  # noqa: F401  # the view draws the same document
    from walklens.reports import notebook, patching

    assert notebook.VIEWS["patching"] is patching.build


def test_attribution_reports_its_parity_card(model_dir, tmp_path, capsys) -> None:
    js = tmp_path / "a.json"
    code, err = _run(capsys, CLEAN, CORRUPT, "--model", model_dir, "--metric", "kl", "--attribution", "--json", str(js))
    assert code == 0, err
    doc = json.loads(js.read_text())
    assert doc["method"] == "attribution" and doc["parity"]["cells"] == 2 * 6
    assert set(doc["parity"]) >= {"spearman", "topk_overlap", "agrees", "by_kind"}


@pytest.mark.parametrize(
    "argv,words",
    [
        (["the capital of england", "--metric", "kl"], "position_map"),
        ([CORRUPT, "--points", "L7.resid_pre"], "out of range"),
        ([CORRUPT, "--positions", "0,99"], "out of range"),
        ([CORRUPT, "--metric", "logitdiff:paris"], "needs 2 tokens"),
        ([CORRUPT, "--metric", "rank:paris", "--attribution"], "has none"),
        ([CORRUPT, "--positions", "a,b"], "comma-separated integers"),
        ([CORRUPT, "--position-map", "3"], "C:K pairs"),
        ([CORRUPT, "--max-work", "1e-12"], "TFLOP"),
        ([CORRUPT, "--sender", "L0.H1"], "both --sender and --receivers"),
        ([CORRUPT, "--sender", "L1.H1", "--receivers", "L0.resid_pre"], "after the sender"),
        ([CORRUPT, "--stream", "--heads"], "patching runs on a model held in memory"),
        ([CORRUPT, "--stream", "--attribution"], "patching runs on a model held in memory"),
    ],
)
def test_bad_input_one_line(model_dir, capsys, argv, words) -> None:
    code, err = _run(capsys, CLEAN, *argv, "--model", model_dir)
    assert code == 2 and words in err and err.count("\n") == 1, err
    assert err.startswith("walklens: error: ")


def test_path_patching(model_dir, tmp_path, capsys) -> None:
    js = tmp_path / "p.json"
    argv = [CLEAN, CORRUPT, "--model", model_dir, "--metric", "kl", "--sender", "L0.H1", "--receivers",
            "L1.resid_pre,L1.H0.v", "--json", str(js)]  # fmt: skip
    code, err = _run(capsys, *argv)
    assert code == 0, err
    doc = json.loads(js.read_text())
    assert doc["method"] == "path" and doc["points"] == ["L1.resid_pre", "L1.H0.v"] and len(doc["positions"]) == 6
