"""Command line: one-line errors, exit code 2, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "walklens", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("args,msg", [
    (("walk", "hi", "--model", "nope"), "unknown model"),
    (("walk", "", "--model", "smollm2-135m"), "empty"),
    (("walk", "@/no/such/file"), "no such file"),
    (("nosuchcommand",), "invalid choice"),
])
def test_bad_input_one_line_exit_2(args, msg):
    r = run(*args)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = [l for l in r.stderr.splitlines() if l.startswith("walklens:")]
    assert len(lines) == 1 and msg in lines[0]


@pytest.mark.real
def test_walk_json(tmp_path, smollm2):
    out = tmp_path / "w.json"
    r = run("walk", "The capital of France is", "--json", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["tokens"][-1] == " is"


def test_an_error_message_with_a_newline_stays_one_line(tmp_path, capsys):
    """A path holding a newline (or a library message over several lines) is still one stderr line."""
    from walklens.cli import main

    bad = tmp_path / "two\nlines.txt"
    rc = main(["walk", f"@{bad}"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("walklens: error: "), err
