"""Steering moves toward what it names (issue 56): the default method is activation addition (the steering
card's held-out verdict), eigen-steering's sign is chosen and reported so that the target rises on the prompts,
coherence is the card's (KL on neutral text, repetition, distinct-2), every prompt's continuation is shown, one
statistic per column in the table and the plot, and the README's steering example raises p(target) on the
default model."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch

import walklens
from walklens.analyses.steering import (
    NEUTRAL,
    direction,
    distinct_n,
    repetition,
    steering_sweep,
    target_score,
)
from walklens.base.errors import WalklensWarning
from walklens.testing import tiny_model

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["the dog and the", "a big red", "the cat sat on the"]


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def test_default_method_is_activation_addition(llama):
    with walklens.steer(llama, toward=" cat", layers=[1], alpha=2.0) as r:
        assert r.method == "add" and r.edits == [] and r.sign == 1


def test_eigen_sign_is_chosen_so_the_target_rises_on_the_prompts(llama):
    """Layer 0, alpha 2 on the tiny Llama: the seed's edit as given (sign +1) lowers ' cat' on the prompts; the
    chosen sign (-1, reported) raises it."""
    u, tid, _ = direction(llama, " cat")
    base = target_score(llama, PROMPTS, u, tid, last=True)
    with walklens.steer(llama, " cat", [0], 2.0, method="eigen", sign=1):
        as_given = target_score(llama, PROMPTS, u, tid, last=True)
    assert as_given < base  # the planted case: the seed's sign moves away
    with walklens.steer(llama, " cat", [0], 2.0, method="eigen", prompts=PROMPTS) as r:
        chosen = target_score(llama, PROMPTS, u, tid, last=True)
    assert chosen > base and r.sign == -1 and r.chosen_on == "prompts"
    assert r.gain == pytest.approx(chosen - base, abs=1e-9)


def test_eigen_without_prompts_chooses_on_neutral_texts_and_warns_when_no_sign_helps(llama):
    with walklens.steer(llama, " cat", [1], 2.0, method="eigen") as r:
        assert r.chosen_on == "neutral texts" and r.sign in (1, -1)
    with walklens.steer(llama, " cat", [1], 0.0, method="eigen") as r:
        assert r.chosen_on == "given" and r.sign == 1
    with pytest.raises(walklens.InputError):
        with walklens.steer(llama, " cat", [1], 2.0, method="eigen", sign=2):
            pass
    u, tid, _ = direction(llama, " cat")
    with warnings.catch_warnings(record=True) as caught:  # a gain that is not positive is said in one warning
        warnings.simplefilter("always")
        from walklens.analyses import steering

        real = steering.choose_sign
        try:
            steering.choose_sign = lambda *a, **k: (1, -0.5)  # type: ignore[assignment]
            with walklens.steer(llama, " cat", [1], 2.0, method="eigen", prompts=PROMPTS):
                pass
        finally:
            steering.choose_sign = real  # type: ignore[assignment]
    assert any(issubclass(w.category, WalklensWarning) and "whichever its sign" in str(w.message) for w in caught)


def test_sweep_eigen_positive_alpha_raises_the_target_and_rows_carry_coherence(llama):
    sw = steering_sweep(llama, PROMPTS, " cat", [[0]], alphas=[-2.0, 0.0, 2.0], methods=["eigen"], max_new_tokens=4)
    mean = {a: sum(r.target_logit for r in sw.rows if r.alpha == a) for a in (-2.0, 0.0, 2.0)}
    assert mean[2.0] > mean[0.0] > mean[-2.0]
    assert {r.sign for r in sw.rows if r.alpha != 0} == {-1} and all(r.sign == 1 for r in sw.rows if r.alpha == 0)
    for r in sw.rows:
        assert r.kl >= 0 and 0 <= r.repetition <= 1 and 0 < r.distinct <= 1
        assert (r.kl == 0) == (r.alpha == 0)
    assert len({r.kl for r in sw.rows if r.alpha == 2.0}) == 1  # one KL per method, layers and alpha


def test_coherence_measures():
    assert repetition([1, 2, 3, 1, 2, 3]) == pytest.approx(0.25)  # 4 trigrams, (1,2,3) repeats once
    assert distinct_n([1, 2, 1, 2]) == pytest.approx(2 / 3)
    assert distinct_n([5]) != distinct_n([5])  # NaN: no bigram


def test_neutral_texts_are_the_cards():
    lines = (ROOT / "src/walklens/lab/data/steering/token.jsonl").read_text().splitlines()
    card = [json.loads(line)["text"] for line in lines if json.loads(line)["type"] == "neutral"]
    assert list(NEUTRAL) == card


def test_cli_default_add_every_continuation_one_statistic_no_progress(tmp_path, llama, capsys):
    from walklens.cli import main
    from walklens.reports.steer import METRICS, steering_figure

    d = tmp_path / "m"
    llama.model.save_pretrained(str(d), safe_serialization=True)
    llama.tokenizer.save_pretrained(str(d))
    js = tmp_path / "s.json"
    args = ["steer", *PROMPTS[:2], "--toward", " cat", "--layers", "1", "--alpha", "0,4", "--max-new-tokens", "3"]
    assert main([*args, "--model", str(d), "--json", str(js), "--no-progress", "--threads", "1"]) == 0
    out = capsys.readouterr()
    assert "steering:" not in out.err  # no progress bar
    rows = json.loads(js.read_text())["rows"]
    assert {r["method"] for r in rows} == {"add"} and len(rows) == 4
    text = re.sub(r"\s+", " ", out.out)
    for r in rows:  # every prompt's continuation, not only the first
        assert repr(r["text"]).strip("'")[:8] in text, r["text"]
    for head in ("mean p(target)", "median rank (0 = top)", "mean KL neutral", "mean repeated 3-grams"):
        assert head in text, head
    assert "ppl (unsteered)" not in text
    stats = dict((m, s) for m, _, s in METRICS)
    assert stats["target_rank"] == "median" and stats["target_prob"] == "mean"
    sw = steering_sweep(llama, PROMPTS[:2], " cat", [[1]], alphas=[0.0, 4.0], methods=["add"], max_new_tokens=3)
    fig = steering_figure(sw)
    titles = [ax.get_title() for ax in fig.axes]
    assert "Activation addition: median rank of target (0 = top)" in titles
    assert "Activation addition: mean p(target)" in titles


# ---- the README's example on the default model -----------------------------------------------------------------------

EXAMPLE = re.compile(
    r'with walklens\.steer\(lm, toward="(?P<toward>[^"]+)", layers=\[(?P<layer>\d+)\], alpha=(?P<alpha>[\d.]+)\)'
    r'[^\n]*\n\s*\w+ = walklens\.capture\(lm, "(?P<prompt>[^"]+)"\)'
)


@pytest.mark.real
@pytest.mark.slow
def test_readme_steering_example_raises_the_target(smollm2):
    """The README's steering example, read from the README: on the default model the prompt does not already
    answer the target (rank > 0), and steering raises p(target) to the top."""
    m = EXAMPLE.search((ROOT / "README.md").read_text())
    assert m, "the README's steering example is gone"
    tid = smollm2.tokenizer(m["toward"], add_special_tokens=False)["input_ids"][0]

    def p_rank() -> tuple[float, int]:
        lg = walklens.capture(smollm2, m["prompt"], points=["final"]).logits()[-1].double()
        return float(torch.softmax(lg, -1)[tid]), int((lg > lg[tid]).sum())

    p0, r0 = p_rank()
    with walklens.steer(smollm2, toward=m["toward"], layers=[int(m["layer"])], alpha=float(m["alpha"])):
        p1, r1 = p_rank()
    assert r0 > 0, "the unsteered model already answers the README's prompt"
    assert p1 > 2 * p0 and r1 == 0, (p0, p1, r0, r1)
