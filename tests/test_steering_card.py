"""The steering card (seed 002's steering, measured): every method restores the model bit for bit, a killed
card resumes without repeating its stored generations (counted in forward passes), the statistics against a
case with a known answer, the shipped sets, and the command's one-line refusals."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import walklens
from _cli import run
from _steercard import one_thread  # noqa: F401  # shared fixtures
from walklens.analyses.steering import repetition
from walklens.lab.steeringcard import card as card_module
from walklens.lab.steeringcard import load_steering_set, shipped_sets, steering_card
from walklens.lab.steeringcard.stats import bootstrap, choose, pareto, wrong_way
from walklens.testing import tiny_model

TARGETS = [
    {"type": "target", "kind": "token", "name": "paris", "token": " paris", "words": [" paris"],
     "pairs": [["the capital of france is paris", "the capital of england is london"]]},
    {"type": "target", "kind": "topic", "name": "animals", "words": [" dog", " cat"],
     "pairs": [["the dog and the cat", "the car and the house"]]},
    {"type": "target", "kind": "sentiment", "name": "good", "words": [" good"], "negative_words": [" bad"],
     "pairs": [["the king was good", "the king was bad"]]},
]  # fmt: skip
PROMPTS = ["the man walks to the", "she was in the", "the queen of england", "a big red"]


def write_set(path: Path) -> Path:
    recs: list[dict[str, Any]] = list(TARGETS)
    for t in TARGETS:
        for i, p in enumerate(PROMPTS):
            recs.append({"type": "prompt", "target": t["name"], "split": "choose" if i % 2 else "heldout", "text": p})
    recs += [
        {"type": "neutral", "text": "the boy and the girl walk to the city"},
        {"type": "neutral", "text": "two cats eat"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def llama() -> walklens.LoadedModel:
    return tiny_model("llama")


@pytest.fixture()
def tiny_set(tmp_path: Path) -> Path:
    return write_set(tmp_path / "tiny.jsonl")


def state(lm: walklens.LoadedModel) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in lm.model.state_dict().items()}


def hooks_left(lm: walklens.LoadedModel) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in lm.model.modules())


def test_every_method_restores_the_model_bit_for_bit(llama: walklens.LoadedModel, tiny_set: Path) -> None:
    before = state(llama)
    card = steering_card(llama, tiny_set, layers=[0, 1], doses=[0.5, 4.0], max_new_tokens=3, n_boot=100)
    after = state(llama)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert hooks_left(llama) == 0
    assert {c.method for c in card.cells} == {"none", "eigen", "add", "meandiff", "ablate"}
    # one dose scale: activation addition realises exactly its nominal dose on the neutral texts
    adds = [c for c in card.cells if c.method in ("add", "meandiff")]
    assert all(c.realised_dose == pytest.approx(c.dose, rel=1e-4) for c in adds)
    # eigen-steering is calibrated to the same scale (linear in alpha for Llama: its attention write is)
    eig = [c for c in card.cells if c.method == "eigen"]
    assert all(c.realised_dose == pytest.approx(c.dose, rel=1e-3) for c in eig)
    base = [c for c in card.cells if c.method == "none"]
    assert all(c.effect.value == 0 and c.kl.value == 0 for c in base)
    assert card.to_pandas("cells").shape[0] == len(card.cells)


def test_a_killed_card_resumes_without_repeating_stored_generations(
    llama: walklens.LoadedModel, tiny_set: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}

    def count(*_: Any) -> None:
        calls["n"] += 1

    handle = llama.model.register_forward_pre_hook(count)
    kw: dict[str, Any] = {
        "layers": [1],
        "doses": [1.0],
        "methods": ["add", "eigen"],
        "max_new_tokens": 3,
        "n_boot": 100,
    }
    try:
        full = steering_card(llama, tiny_set, store=tmp_path / "full.db", **kw)
        n_full, calls["n"] = calls["n"], 0
        again = steering_card(llama, tiny_set, store=tmp_path / "full.db", **kw)  # everything stored
        n_setup, calls["n"] = calls["n"], 0
        assert again.units_generated == 0 and again.units_stored == full.units_generated
        assert again.cells == full.cells

        real, done = card_module._unit, {"n": 0}

        def dies(*a: Any, **kw: Any) -> Any:
            if done["n"] == 7:
                raise KeyboardInterrupt
            done["n"] += 1
            return real(*a, **kw)

        monkeypatch.setattr(card_module, "_unit", dies)
        with pytest.raises(KeyboardInterrupt):
            steering_card(llama, tiny_set, store=tmp_path / "killed.db", **kw)
        n_killed, calls["n"] = calls["n"], 0
        monkeypatch.setattr(card_module, "_unit", real)
        resumed = steering_card(llama, tiny_set, store=tmp_path / "killed.db", **kw)
        n_resumed = calls["n"]
    finally:
        handle.remove()
    assert resumed.units_stored == 7 and resumed.units_generated == full.units_generated - 7
    assert resumed.cells == full.cells
    # the setup (norms, directions, calibration) runs twice; not one stored generation is repeated
    assert n_killed + n_resumed == n_full + n_setup
    assert n_setup < n_full / 2


def test_statistics_against_a_known_case() -> None:
    rng = np.random.default_rng(1)
    effects = rng.normal(0.5, 1.0, size=400)
    iv = bootstrap(effects.tolist(), seed=3, n_boot=2000)
    assert iv.lo < 0.5 < iv.hi and iv.value == pytest.approx(effects.mean())
    assert iv.hi - iv.lo == pytest.approx(2 * 1.96 / math.sqrt(400), rel=0.15)  # the normal interval's width
    assert bootstrap(effects.tolist(), seed=3, n_boot=2000) == iv  # seeded: the same bits
    known = [-1.0] * 30 + [0.0] * 10 + [2.0] * 60  # a zero effect is not the wrong way
    ww = wrong_way(known, seed=0)
    assert ww.value == 0.3 and ww.lo < 0.3 < ww.hi and ww.n == 100
    assert wrong_way([1.0, math.nan, -1.0], seed=0).n == 2
    assert math.isnan(bootstrap([], seed=0).value)
    assert repetition([1, 2, 3, 1, 2, 3]) == pytest.approx(1 / 4) and repetition([1, 2, 3, 4]) == 0
    # (effect, incoherence): 2 dominates 1; 3 has a NaN
    assert pareto([(1.0, 1.0), (0.5, 2.0), (2.0, 1.0), (math.nan, 0.0), (3.0, 5.0)]) == [2, 4]
    assert choose([(1.0, 1.0), (5.0, 9.0), (2.0, 1.5)], budget=2.0) == 2
    assert choose([(1.0, 3.0)], budget=2.0) is None


def test_the_shipped_sets() -> None:
    assert shipped_sets() == ["sentiment", "token", "topic"]
    every = load_steering_set("all")
    assert len(every.prompts) >= 200 and {t.kind for t in every.targets.values()} == {"token", "topic", "sentiment"}
    assert {p.split for p in every.prompts} == {"choose", "heldout"} and len(every.neutral) >= 8
    assert len({(p.target, p.text) for p in every.prompts}) == len(every.prompts)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('{"type": "target", "kind": "token"\n', "line 1: not valid JSON"),
        ('{"type": "prompt", "target": "x", "split": "heldout", "text": "hi"}\n', "unknown target 'x'"),
        ('{"type": "target", "name": "t", "kind": "mood", "words": ["a"], "pairs": [["a", "b"]]}\n', "kind 'mood'"),
    ],
)
def test_cli_refuses_a_bad_set_in_one_line(
    capfd: pytest.CaptureFixture[str], tmp_path: Path, content: str, needle: str
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content, encoding="utf-8")
    rc, err = run(capfd, "steer", "--card", str(bad))
    assert rc == 2 and len(err) == 1 and err[0].startswith("walklens: error: ") and needle in err[0]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--card", "weddings"], "unknown steering set 'weddings'"),
        (["--card", "nope.jsonl"], "no such file"),
        (["--card", "token", "--methods", "eigen,steer"], "unknown method(s) steer"),
        (["--card", "token", "--doses", "1,-2"], "--doses"),
        (["--card", "token", "a prompt"], "--card takes no PROMPT"),
        (["a prompt", "--layers", "1"], "steer needs --toward"),
        (["a prompt", "--toward", " x", "--layers", "1", "--backend", "ray"], "only the steering card (--card SET)"),
        (["--card", "token", "--workers", "2"], "--workers needs --backend ray"),
        (["--card", "token", "--backend", "ray"], "pip install 'walklens[ray]'"),
    ],
)
def test_cli_one_line_errors(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str], needle: str
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # the ray extra not installed
    rc, err = run(capfd, "steer", *argv)
    assert rc == 2 and len(err) == 1 and err[0].startswith("walklens: error: ") and needle in err[0], err


def test_cli_card_json_and_report(
    capfd: pytest.CaptureFixture[str], tmp_path: Path, tiny_llama_inputs: dict[str, Any]
) -> None:
    tiny = write_set(tmp_path / "tiny.jsonl")
    out, js = tmp_path / "report", tmp_path / "card.json"
    argv = ["steer", "--card", str(tiny), "--model", str(tiny_llama_inputs["model"]), "--layers", "1"]
    argv += ["--doses", "1", "--max-new-tokens", "3", "--n-boot", "100", "--json", str(js), "--out", str(out)]
    rc, err = run(capfd, *argv, "--store", str(tmp_path / "s.db"))
    assert rc == 0, err
    doc = json.loads(js.read_text())
    assert {c["method"] for c in doc["cells"]} == {"none", "eigen", "add", "meandiff", "ablate"}
    assert doc["choices"] and doc["examples"] and "effect" in doc["cells"][0]
    assert "Pareto front" in (out / "index.html").read_text()


def test_committed_card_documents_read_back_as_themselves() -> None:
    """Every committed card (``docs/results/steering``) is a card again (``walklens serve --card FILE``) whose
    document is the file's, and a document that is not a card is one line."""
    from walklens.base.errors import InputError
    from walklens.base.outputs import jsonable
    from walklens.lab.reports.steercard import document
    from walklens.lab.steeringcard import SteeringCard

    files = sorted((Path(__file__).resolve().parents[1] / "docs/results/steering").rglob("*.json"))
    assert files
    for f in files:
        doc = json.loads(f.read_text(encoding="utf-8"))
        assert jsonable(document(SteeringCard.from_document(doc))) == doc, f
    for bad in ([], {"cells": []}, {**doc, "doses": ["x"]}, {**doc, "model_name": 3}):
        with pytest.raises(InputError, match="not a steering card document"):
            SteeringCard.from_document(bad)
