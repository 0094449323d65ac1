"""The linter and formatter hold: ruff, configured in pyproject.toml (``[tool.ruff]``), finds nothing in src, tests
and benchmarks, and the code is formatted as ``ruff format`` writes it; and both can fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("src", "tests", "benchmarks")


def ruff(*args: str) -> tuple[int, str]:
    """Run ruff (this interpreter's) from the repository root: (exit code, output)."""
    done = subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def test_ruff_finds_nothing() -> None:
    code, out = ruff("check", "--no-cache", *TREES)
    assert code == 0, out


def test_the_code_is_formatted() -> None:
    code, out = ruff("format", "--check", "--no-cache", *TREES)
    assert code == 0, out


def test_both_can_fail(tmp_path: Path) -> None:
    """The project's configuration flags an unused import and a line over 120 characters, and reformats a file
    written in another style."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\nx = '" + "a" * 130 + "'\n")
    code, out = ruff("check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(bad))
    assert code == 1 and "F401" in out and "E501" in out, out
    ugly = tmp_path / "ugly.py"
    ugly.write_text("x = {  'a':1 }\n")
    code, out = ruff("format", "--check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(ugly))
    assert code == 1, out
