"""docs/parity.md's numbers are the committed result files': the generated blocks equal a fresh rendering, and an
edited number is caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from walklens.testing.reach import render_docs

ROOT = Path(__file__).resolve().parents[1]
DOCS, RESULTS = ROOT / "docs" / "parity.md", ROOT / "docs" / "results" / "parity"


def test_parity_docs_match_their_result_files(tmp_path):
    assert render_docs(DOCS, RESULTS) == DOCS.read_text()
    assert "| smollm2-135m | float32 |" in DOCS.read_text()


def test_an_edited_number_is_caught(tmp_path):
    text = DOCS.read_text()
    i = text.index("| smollm2-135m@bfloat16 | bfloat16 |")
    line = text[i : text.index("\n", i)]
    edited = tmp_path / "parity.md"
    edited.write_text(text.replace(line, line.replace("| pass |", "| FAIL |")))
    assert render_docs(edited, RESULTS) != edited.read_text()


@pytest.mark.slow
def test_reach_groups_each_type_and_resumes(tmp_path):
    import json

    from walklens.testing import reach

    assert reach.main(["--types", "arcee,afmoe", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "reach.json").read_text())
    groups = {r["model_type"]: r["group"] for r in doc["records"]}
    assert groups == {"arcee": "derived", "afmoe": "refused"}
    arcee = next(r for r in doc["records"] if r["model_type"] == "arcee")
    assert arcee["cards"]["float32"]["passed"] and arcee["cards"]["bfloat16"]["passed"]
    assert "| afmoe | refused |" in (tmp_path / "reach.md").read_text()
    assert reach.main(["--types", "arcee", "--out", str(tmp_path)]) == 0  # again: the other record is kept
    assert {r["model_type"] for r in json.loads((tmp_path / "reach.json").read_text())["records"]} == {"arcee", "afmoe"}
