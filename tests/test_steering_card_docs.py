"""docs/power.md's steering-card tables are the committed result files' (docs/results/steering/*.json), rendered by
benchmarks/steering_card_table.py; an edited number is caught."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEERING = ROOT / "docs" / "results" / "steering"
FILES = sorted(STEERING.glob("*.json"))  # SmolLM2-135M, --limit 8
GEMMA3 = sorted((STEERING / "gemma3").glob("*.json"))  # Gemma 3 270M, --limit 8
COMPLETE = sorted((STEERING / "complete").glob("smollm2-135m_*.json"))  # every held-out prompt, every method
COMPLETE_GEMMA3 = sorted((STEERING / "complete").glob("gemma3-270m_*.json"))


def render(files: list[Path] = FILES) -> str:
    script = ROOT / "benchmarks" / "steering_card_table.py"
    names = [str(f.relative_to(ROOT)) for f in files]
    return subprocess.run(
        [sys.executable, str(script), *names], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


@pytest.mark.parametrize(
    "files",
    [FILES, GEMMA3, COMPLETE, COMPLETE_GEMMA3],
    ids=["smollm2", "gemma3", "smollm2-complete", "gemma3-complete"],
)
def test_the_docs_tables_are_the_result_files(files: list[Path]) -> None:
    assert len(files) == 3, "a committed steering card per shipped set"
    tables = render(files)
    assert tables.strip() and tables in (ROOT / "docs" / "power.md").read_text(encoding="utf-8")
    assert tables.replace("0.", "9.", 1) not in (ROOT / "docs" / "power.md").read_text(encoding="utf-8")
