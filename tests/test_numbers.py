"""Numeric options are finite and range-checked by one shared validator (:mod:`walklens.base.numbers`) used by the
command line, the explorer's JSON API and experiment files alike; a computation that overflows reports NaN and
never ranks it; empty option values are refused; layer ranges are checked against the model's depth before
they are expanded."""

from __future__ import annotations

import argparse
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _cli import run
from walklens.base.errors import InputError, NonFiniteWarning
from walklens.base.numbers import ALPHA, POSITIVE, POSITIVE_INT, SEED, NumberError, Range
from walklens.lab.experiments.experiment import _Reader
from walklens.server.bounds import ApiError, float_arg, int_arg

FUZZ = dict(max_examples=200, deadline=None, derandomize=True, database=None)
VALUES = st.one_of(
    st.integers(-(10**500), 10**500),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from walklens.testing import tiny_model

    d = tmp_path_factory.mktemp("numbers") / "model"
    lm = tiny_model("llama")
    lm.model.save_pretrained(d)
    lm.tokenizer.save_pretrained(d)
    return str(d)


# ---- one validator, three front doors ----------------------------------------------------------------------------


@settings(**FUZZ)
@given(value=VALUES)
def test_the_api_and_experiment_files_share_the_validator(value: Any) -> None:
    """Any JSON/TOML value: the explorer's readers and the experiment file's reader accept exactly what the
    shared range accepts (same result) and refuse the rest with its one-line message; never OverflowError."""
    rng = Range(-1e6, 1e6)
    if value is None:  # a JSON null is the argument's default
        assert float_arg({"alpha": None}, "alpha", 0.5, 1e6) == 0.5
        return
    try:
        want = rng.check(value, "alpha")
    except NumberError as e:
        with pytest.raises(ApiError) as api:
            float_arg({"alpha": value}, "alpha", 0.0, 1e6)
        assert api.value.status == 400 and api.value.message == str(e) and "\n" not in str(e)
    else:
        assert float_arg({"alpha": value}, "alpha", 0.0, 1e6) == want and math.isfinite(want)
    reader = _Reader(Path("exp.toml"))
    try:
        got = POSITIVE_INT.check(value)
    except NumberError as e:
        with pytest.raises(InputError, match="exp.toml: workers: ") as toml:
            reader.integer(value, "workers", 1)
        assert str(e) in str(toml.value)
        with pytest.raises(ApiError):
            int_arg({"k": value}, "k", None, 1, 10**600)
    else:
        assert reader.integer(value, "workers", 1) == got == int_arg({"k": value}, "k", None, 1, 10**600)


@settings(**FUZZ)
@given(
    text=st.one_of(
        st.text(max_size=8),
        st.sampled_from(["inf", "-inf", "nan", "1e309", "", " ", "1e39", "3e38", "9" * 500, "0x10", "1_000"]),
    )
)
def test_command_line_numbers_are_finite_and_in_range(text: str) -> None:
    """An argparse type built from a range returns a finite value in it, or refuses in one line."""
    for rng in (POSITIVE, ALPHA, SEED, POSITIVE_INT):
        try:
            v = rng.arg()(text)
        except argparse.ArgumentTypeError as e:
            assert "\n" not in str(e) and str(e).startswith("must be ")
        else:
            rng.check(v)
            assert math.isfinite(v)


def test_huge_integers_are_refused_exactly() -> None:
    """A 400-digit integer (JSON has no limit) is refused by the range, never converted to a float."""
    with pytest.raises(NumberError, match="alpha must be within ±1e\\+06 \\(a finite number\\), not an integer "):
        ALPHA.check(10**399, "alpha")
    with pytest.raises(ApiError, match="alpha must be"):
        float_arg({"alpha": -(10**399)}, "alpha", 0.0, 1e6)


# ---- the commands ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["inf", "1e309", "nan", "0", "-1"])
def test_generate_temperature_must_be_finite_and_positive(capfd: pytest.CaptureFixture[str], value: str) -> None:
    """``generate --sample --temperature inf`` used to sample uniformly and record ``"temperature": null``."""
    rc, err = run(capfd, "generate", "the king", "--model", "tiny-none", "--sample", f"--temperature={value}")
    assert rc == 2 and err == [
        f"walklens: error: argument --temperature: must be a positive number (finite), not {value!r}"
    ]


@pytest.mark.parametrize("alpha", ["--alpha=0,1e39", "--alpha=0,3e38", "--add-alpha=1e20", "--alpha=1,,2"])
def test_steer_refuses_overflowing_alphas_before_loading(capfd: pytest.CaptureFixture[str], alpha: str) -> None:
    """``steer --alpha 0,1e39`` used to overflow float32 and report the target at rank 0; the CLI shares the
    explorer's bound (±1e6) and refuses before any model loads (the model named here does not exist)."""
    rc, err = run(
        capfd,
        "steer",
        "My favourite city is",
        "--toward",
        " Paris",
        "--layers",
        "1",
        alpha,
        "--model",
        "/nonexistent/model",
    )
    assert rc == 2 and len(err) == 1 and err[0].startswith("walklens: error: --") and "within ±1e+06" in err[0], err


def test_an_overflowing_steer_is_reported_as_nan_never_ranked() -> None:
    """The library accepts any finite alpha: when the logits overflow, p(target) is NaN, the rank and the top
    token are absent (never rank 0, token id 0) and a warning says so."""
    from walklens.analyses.steering import steering_sweep
    from walklens.testing import tiny_model

    lm = tiny_model("llama")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        sw = steering_sweep(lm, ["the king"], " river", [[1]], alphas=[0.0, 1e39], add_alphas=[1e20], max_new_tokens=2)
    base, *blown = sw.rows
    assert base.target_rank is not None and math.isfinite(base.target_prob)
    for r in blown:
        assert r.target_rank is None and math.isnan(r.target_prob) and r.top_token == "", r
    assert any(issubclass(w.category, NonFiniteWarning) and "not finite" in str(w.message) for w in seen)
    assert math.isnan(sw.curve("eigen", [1], "target_rank")[1][1])


def test_layer_ranges_are_checked_against_the_depth_before_expanding(
    capfd: pytest.CaptureFixture[str], tiny_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``steer --layers 0-999999999`` used to expand the range first (MemoryError, or 20 s for 10**8)."""
    import builtins

    import walklens.analyses.steering

    real_range = builtins.range

    def small_range(*a: int) -> Any:
        assert len(real_range(*a)) < 10**6, f"range{a} expanded"
        return real_range(*a)

    monkeypatch.setattr(walklens.analyses.steering, "steering_sweep", lambda *a, **k: pytest.fail("steered"))
    monkeypatch.setattr("walklens.cli.steer.range", small_range, raising=False)
    for spec in ("0-999999999", "-999999999-1", "0-99999999,1"):
        rc, err = run(capfd, "steer", "the king", "--toward", " river", f"--layers={spec}", "--model", tiny_dir)
        assert rc == 2 and len(err) == 1 and "out of range: the model has 2 layers" in err[0], err


@pytest.mark.parametrize(
    "argv",
    [
        ["walk", "the king", "--json", ""],
        ["walk", "the king", "--points="],
        ["walk", "the king", "--out", " "],
        ["steer", "the king", "--toward", " river", "--layers="],
        ["steer", "the king", "--toward", "x", "--layers", "1", "--alpha="],
    ],
)
def test_empty_option_values_are_refused(capfd: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """``--json ""``, ``--points ""``, ``--layers=`` used to mean the default silently."""
    rc, err = run(capfd, *argv, "--model", "/nonexistent/model")
    assert rc == 2 and len(err) == 1 and "an empty value" in err[0], err
