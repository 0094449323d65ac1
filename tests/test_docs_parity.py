"""docs/parity.md's numbers are the committed result files': the generated blocks equal a fresh rendering, and an
edited number is caught."""

from __future__ import annotations

from pathlib import Path

from walklens.testing.reach import render_docs

ROOT = Path(__file__).resolve().parents[1]
DOCS, RESULTS = ROOT / "docs" / "parity.md", ROOT / "docs" / "results" / "parity"


def test_parity_docs_match_their_result_files(tmp_path):
    assert render_docs(DOCS, RESULTS) == DOCS.read_text()
    assert "| smollm2-135m | float32 |" in DOCS.read_text()


def test_an_edited_number_is_caught(tmp_path):
    text = DOCS.read_text()
    i = text.index("| smollm2-135m@bfloat16 | bfloat16 |")
    line = text[i:text.index("\n", i)]
    edited = tmp_path / "parity.md"
    edited.write_text(text.replace(line, line.replace("| pass |", "| FAIL |")))
    assert render_docs(edited, RESULTS) != edited.read_text()
