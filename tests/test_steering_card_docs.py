"""docs/power.md's steering-card tables are the committed result files' (docs/results/steering/*.json), rendered by
benchmarks/steering_card_table.py; an edited number is caught."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted((ROOT / "docs" / "results" / "steering").glob("*.json"))


def render() -> str:
    script = ROOT / "benchmarks" / "steering_card_table.py"
    names = [str(f.relative_to(ROOT)) for f in FILES]
    return subprocess.run(
        [sys.executable, str(script), *names], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


def test_the_docs_tables_are_the_result_files() -> None:
    assert FILES, "no committed steering card"
    tables = render()
    assert tables.strip() and tables in (ROOT / "docs" / "power.md").read_text(encoding="utf-8")
    assert tables.replace("0.", "9.", 1) not in (ROOT / "docs" / "power.md").read_text(encoding="utf-8")
