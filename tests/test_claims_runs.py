"""scripts/claims_runs.sh, the long runs behind docs/claims.md: each step runs the command its claims quote (the
same model, shots, pool, scheme and --json), skips a step whose --json is there, and refuses a bad step in one line."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from walklens.lab.claims.registry import load

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "claims_runs.sh"
FLAGS = ("--model", "--shots", "--pool", "--scheme", "--json", "--control", "--test", "--summary-model")


def _dry(tmp_path: Path, *args: str) -> list[dict[str, str]]:
    """The walklens commands the script would run (``WALKLENS=echo``), each as its flags of ``FLAGS``."""
    env = {**os.environ, "WALKLENS": "echo"}
    r = subprocess.run([str(SCRIPT), str(tmp_path), *args], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = []
    for line in r.stdout.splitlines():
        if line.startswith("hellaswag "):
            words = line.split(" ")  # echo joins the arguments with one space; no argument holds one
            out.append({w: words[i + 1] for i, w in enumerate(words[:-1]) if w in FLAGS})
    return out


def _quoted(claim_id: str) -> dict[str, str]:
    """The flags of the first walklens command a claim quotes, up to its first ``then``."""
    (claim,) = [c for c in load() if c.id == claim_id]
    words = shlex.split(claim.command.split(", then")[0].split(" && ")[-1])
    return {w: words[i + 1] for i, w in enumerate(words[:-1]) if w in FLAGS}


@pytest.mark.parametrize("name", ["gemma3_0shot", "smollm2_5shot", "gemma3_5shot"])
def test_fullset_runs_what_its_claims_quote(tmp_path, name):
    steps = _dry(tmp_path, "fullset", name)
    quoted = _quoted(f"T1-best-full-set-{name}")
    committed = (ROOT / quoted["--json"]).exists()
    assert len(steps) == 4 - committed  # the Test (unless committed), then ending, shuffled, random
    for step in steps:
        for flag in ("--model", "--shots", "--pool", "--scheme"):
            assert step[flag] == quoted[flag], (name, flag)
    assert [s.get("--control") for s in steps][-3:] == ["ending", "shuffled", "random"]
    stem = quoted["--json"].removesuffix(".json")
    assert [s["--json"] for s in steps][-3:] == [f"{stem}_{c}.json" for c in ("ending", "shuffled", "random")]


def test_a_committed_step_is_skipped(tmp_path):
    """smollm2 zero-shot's Test 1 file is committed: only the controls not committed run."""
    steps = _dry(tmp_path, "fullset", "smollm2")
    assert all(s.get("--control") for s in steps)
    assert all(not (ROOT / s["--json"]).exists() for s in steps)


@pytest.mark.parametrize(("test", "model", "shots"), [("1", "gemma3-270m", "5"), ("2", "smollm2-135m", "0")])
def test_selection_runs_what_its_claim_quotes(tmp_path, test, model, shots):
    quoted = _quoted(f"T{test}-selection-{model}-{shots}shot")
    steps = _dry(tmp_path, "selection", test, model, shots)
    if (ROOT / quoted["--json"]).exists():
        assert steps == []
        return
    (step,) = steps
    for flag in ("--model", "--shots", "--test", "--json", "--summary-model"):
        assert step[flag] == quoted[flag], flag
    assert step["--pool"] == ("reserved" if shots != "0" else "validation")


@pytest.mark.parametrize("args", [["bogus"], ["fullset", "gpt2"]])
def test_a_bad_step_is_one_line(tmp_path, args):
    r = subprocess.run([str(SCRIPT), str(tmp_path), *args], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("claims_runs.sh: error: ")
