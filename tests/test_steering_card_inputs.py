"""The steering card's inputs refused in one line before any work: the steering set is an input no output may
replace, doses finite and in range, the new tokens bounded by the context and the work limit (for ``steer``
without ``--card`` too), a deeply nested set line, and targets that are not one known token."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import walklens
from _cli import run
from _steercard import MINI, card_argv, one_thread, refused, write_mini  # noqa: F401  # shared fixtures
from walklens.base.errors import InputError
from walklens.lab.steeringcard import card as card_module
from walklens.lab.steeringcard import load_steering_set, steering_card
from walklens.testing import tiny_model


@pytest.fixture(scope="module")
def llama() -> walklens.LoadedModel:
    return tiny_model("llama")


@pytest.fixture()
def model(tiny_llama_inputs: dict[str, Any]) -> str:
    return str(tiny_llama_inputs["model"])


@pytest.fixture()
def no_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any unit of work fails the test: a refusal must come before the first generation."""

    monkeypatch.setattr(card_module, "_units", lambda *a, **k: pytest.fail("a unit of work ran"))


# ---- the set is an input: --json / --out never replace it ------------------------------------------------------


@pytest.mark.parametrize("how", ["path", "symlink", "hardlink"])
def test_the_set_is_never_replaced_by_the_json(capfd: pytest.CaptureFixture[str], tmp_path: Path, how: str) -> None:
    sset = write_mini(tmp_path / "set.jsonl")
    before = sset.read_bytes()
    target = tmp_path / "out.json"
    if how == "path":
        target = sset
    elif how == "symlink":
        target.symlink_to(sset)
    else:
        os.link(sset, target)
    # the model is never reached: the output check comes first
    line = refused(capfd, *card_argv(sset, str(tmp_path / "no-such-model"), "--json", str(target)))
    assert "--json" in line and "an output may never replace an input" in line, line
    assert sset.read_bytes() == before


def test_the_set_is_never_replaced_by_a_report_file(
    capfd: pytest.CaptureFixture[str], tmp_path: Path, model: str
) -> None:
    """A set lying where the report writes (``--out DIR`` holding ``index.html``) is refused when written: the
    set was registered as an input when it was read."""
    out = tmp_path / "report"
    out.mkdir()
    sset = write_mini(out / "index.html")
    before = sset.read_bytes()
    line = refused(capfd, *card_argv(sset, model, "--out", str(out)))
    assert "an output may never replace an input" in line, line
    assert sset.read_bytes() == before


def test_the_set_read_through_records_is_an_input(tmp_path: Path) -> None:
    from walklens.base.records import forget_inputs, inputs_read

    forget_inputs()
    sset = write_mini(tmp_path / "s.jsonl")
    load_steering_set(sset)
    assert any(Path(i.path) == sset.resolve() for i in inputs_read())
    forget_inputs()


# ---- doses ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("doses", ["1e308", "1,inf", "nan", "0", "-1", "1e3", "1,,2", "", "1e999"])
def test_doses_finite_and_in_range(capfd: pytest.CaptureFixture[str], tmp_path: Path, doses: str) -> None:
    sset = write_mini(tmp_path / "s.jsonl")
    line = refused(capfd, "steer", "--card", str(sset), "--doses", doses, "--model", str(tmp_path / "none"))
    assert "--doses" in line, line


def test_the_api_refuses_doses_out_of_range(llama: walklens.LoadedModel, tmp_path: Path) -> None:
    sset = write_mini(tmp_path / "s.jsonl")
    for bad in ([1e308], [float("nan")], [0.0], [101.0]):
        with pytest.raises(InputError, match="dose"):
            steering_card(llama, sset, layers=[1], doses=bad, max_new_tokens=2, n_boot=100)


# ---- new tokens: the context, then the work limit -----------------------------------------------------------------


@pytest.mark.usefixtures("no_generation")
@pytest.mark.parametrize("steps", ["1000000000", str(10**30), "61"])
def test_card_new_tokens_bounded_by_the_context(
    capfd: pytest.CaptureFixture[str], tmp_path: Path, model: str, steps: str
) -> None:
    sset = write_mini(tmp_path / "s.jsonl")
    argv = card_argv(sset, model, "--max-work", "1e300")
    argv[argv.index("--max-new-tokens") + 1] = steps
    line = refused(capfd, *argv)
    assert "--max-new-tokens" in line and "context of 64 positions" in line, line
    assert "at most 59 new tokens fit" in line, line  # the longest prompt: 5 tokens


def _fit(line: str, option: str) -> int:
    m = re.search(rf"at most (\d+) new tokens fit \({option}\)", line)
    assert m, line
    return int(m.group(1))


def test_card_new_tokens_bounded_by_the_work_limit(
    capfd: pytest.CaptureFixture[str], tmp_path: Path, model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sset = write_mini(tmp_path / "s.jsonl")
    argv = card_argv(sset, model, "--max-work", "2e-4")
    argv[argv.index("--max-new-tokens") + 1] = "50"
    monkeypatch.setattr(card_module, "_units", lambda *a, **k: pytest.fail("a unit of work ran"))
    line = refused(capfd, *argv)
    monkeypatch.undo()
    assert "steering card" in line and "(--max-work 0.0002)" in line, line
    k = _fit(line, "--max-new-tokens")
    assert 1 <= k < 50
    argv[argv.index("--max-new-tokens") + 1] = str(k)
    rc, err = run(capfd, *argv)
    assert rc == 0, err  # the largest value said to fit runs
    argv[argv.index("--max-new-tokens") + 1] = str(k + 1)
    assert _fit(refused(capfd, *argv), "--max-new-tokens") == k


def test_card_refused_when_no_new_token_fits(capfd: pytest.CaptureFixture[str], tmp_path: Path, model: str) -> None:
    line = refused(capfd, *card_argv(write_mini(tmp_path / "s.jsonl"), model, "--max-work", "1e-12"))
    assert "no --max-new-tokens fits" in line and "--limit" in line, line


def test_api_new_tokens_bounded_by_the_context(llama: walklens.LoadedModel, tmp_path: Path) -> None:
    sset = write_mini(tmp_path / "s.jsonl")
    with pytest.raises(InputError, match="at most 59 new tokens fit"):
        steering_card(llama, sset, layers=[1], doses=[1.0], max_new_tokens=10**9, n_boot=100)


def test_steer_without_card_names_the_new_tokens_that_fit(
    capfd: pytest.CaptureFixture[str], model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import walklens.analyses.steering

    monkeypatch.setattr(walklens.analyses.steering, "steering_sweep", lambda *a, **k: pytest.fail("ran"))
    base = ["steer", "the king", "--toward", " river", "--layers", "0", "--model", model, "--alpha", "1"]
    line = refused(capfd, *base, "--max-new-tokens", "1000000000")
    assert "context of 64 positions" in line and "at most 62 new tokens fit" in line, line
    line = refused(capfd, *base, "--max-new-tokens", "60", "--max-work", "1e-4")
    k = _fit(line, "--max-new-tokens")
    assert 1 <= k < 60
    line = refused(capfd, *base, "--max-new-tokens", str(k + 1), "--max-work", "1e-4")
    assert _fit(line, "--max-new-tokens") == k


# ---- the set's lines -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"[" * 100_000 + b"]" * 100_000 + b"\n", "line 1: nested deeper than"),
        (b'{"type": "neutral", "text": ' + b"[" * 5000 + b"]" * 5000 + b"}\n", "line 1: nested deeper than"),
        (b'{"type": "neutral", "text": "caf\xe9"}\n', "not UTF-8"),
        (b'{"type": "neutral", "text": NaN}\n', "line 1: not valid JSON"),
        (b'{"type": "neutral", "text": 1e999}\n', "'text'"),
    ],
)
def test_a_bad_set_line_is_one_line(
    capfd: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, needle: str
) -> None:
    bad = tmp_path / "deep.jsonl"
    bad.write_bytes(content)
    line = refused(capfd, "steer", "--card", str(bad), "--model", str(tmp_path / "none"))
    assert str(bad) in line and needle in line, line


def test_a_fifo_set_is_refused_without_waiting(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fifo = tmp_path / "set.jsonl"
    os.mkfifo(fifo)
    assert "a FIFO" in refused(capfd, "steer", "--card", str(fifo))


# ---- targets: one known token ----------------------------------------------------------------------------------------


def _with(target: dict[str, Any]) -> list[dict[str, Any]]:
    return [target if r.get("name") == target["name"] else r for r in MINI]


@pytest.mark.usefixtures("no_generation")
@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ({**MINI[0], "token": " paris city"}, "target 'paris': token ' paris city' is 2 tokens"),
        ({**MINI[0], "token": " zebra"}, "target 'paris': token ' zebra' is the unknown token <unk>"),
        ({**MINI[1], "words": [" dog", " zebra"]}, "target 'animals': word ' zebra' is the unknown token <unk>"),
        ({**MINI[1], "pairs": [["dog", "cat"]]}, "target 'animals': pair text 'dog' is 1 token"),
    ],
)
def test_a_target_that_is_not_one_known_token_is_refused(
    capfd: pytest.CaptureFixture[str], tmp_path: Path, model: str, target: dict[str, Any], needle: str
) -> None:
    sset = write_mini(tmp_path / "s.jsonl", _with(target))
    line = refused(capfd, *card_argv(sset, model))
    assert needle in line, line


def test_a_neutral_text_of_one_token_is_refused(llama: walklens.LoadedModel, tmp_path: Path) -> None:
    sset = write_mini(tmp_path / "s.jsonl", [*MINI[:-1], {"type": "neutral", "text": "cat"}])
    with pytest.raises(InputError, match="neutral text 2 'cat' is 1 token"):
        steering_card(llama, sset, layers=[1], doses=[1.0], max_new_tokens=2, n_boot=100)


def test_a_prompt_longer_than_the_context_is_one_line_without_truncate(
    llama: walklens.LoadedModel, tmp_path: Path
) -> None:
    """The card has no --truncate: a set's prompt over the context is refused naming its length, not offering one."""
    long = {"type": "prompt", "target": "paris", "split": "heldout", "text": " ".join(["the man walks"] * 60)}
    sset = write_mini(tmp_path / "s.jsonl", [*MINI, long])
    with pytest.raises(InputError, match="more than the model's context of 64 positions; shorten it") as e:
        steering_card(llama, sset, layers=[1], doses=[1.0], max_new_tokens=2, n_boot=100)
    assert "truncate" not in str(e.value)


def test_a_target_without_prompts_is_refused(tmp_path: Path) -> None:
    sset = write_mini(tmp_path / "s.jsonl", [r for r in MINI if r.get("target") != "animals"])
    with pytest.raises(InputError, match="target 'animals' has no prompt"):
        load_steering_set(sset)


# ---- what the card computes is what its store reads back ---------------------------------------------------------


def test_a_non_finite_unit_is_refused_never_stored(
    llama: walklens.LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An overflowing model's NaN score is one line when the unit is computed (its rank would read 0, the top):
    never a unit written that the store then refuses, never a silently smaller card."""
    from walklens.lab.steeringcard.store import CardStore

    real = card_module.unit_rows

    def overflowed(*a: Any, **k: Any) -> list[dict[str, Any]]:
        rows = real(*a, **k)
        return [{**r, "score": math.nan} for r in rows]

    monkeypatch.setattr(card_module, "unit_rows", overflowed)
    db = tmp_path / "s.db"
    with pytest.raises(InputError, match=r"field 'score' must be .*not nan \(a steered model overflowed"):
        steering_card(llama, write_mini(tmp_path / "s.jsonl"), layers=[1], doses=[1.0], max_new_tokens=2, store=db)
    store = CardStore(db)
    assert store.conn.execute("SELECT COUNT(*) FROM units").fetchone()[0] == 0
    store.close()


@pytest.mark.parametrize(
    ("u", "alpha", "needle"),
    [
        (torch.zeros(4), 1.0, "direction at layer 1 is zero or not finite"),
        (torch.full((4,), math.nan), 1.0, "direction at layer 1 is zero or not finite"),
        (torch.ones(4), math.inf, "needs alpha inf for target 'paris', beyond ±1e+06"),
        (torch.ones(4), 2e6, "needs alpha 2e+06"),
        (torch.ones(4), math.nan, "needs alpha nan"),
    ],
)
def test_a_plan_without_a_direction_or_with_an_alpha_beyond_max_is_refused(
    tmp_path: Path, u: torch.Tensor, alpha: float, needle: str
) -> None:
    sset = load_steering_set(write_mini(tmp_path / "s.jsonl"))
    cell = card_module._Cell("eigen", 1, 1.0, u={"paris": u}, alpha={"paris": alpha})
    with pytest.raises(InputError, match=re.escape(needle)):
        card_module._check_plan(sset, [cell])
    assert card_module._alpha(1.0, 0.0) == math.inf and card_module._alpha(1.0, math.nan) == math.inf
