"""Fuzzing the CLI's options (hypothesis): numbers and text (negative, zero, huge, nan, inf, junk) through
``walklens.cli.main`` on a tiny saved model.  Each call either succeeds (exit 0) or prints exactly one stderr line
``walklens: error: ...`` and exits 2; never ``internal error``.

The tiny model is loaded from its directory once and reused (``load_model`` is memoised here; loading itself is
fuzzed in test_fuzz_inputs.py), so that the examples that pass validation run in a fraction of a second.
Bounded and deterministic: ``max_examples``, ``derandomize=True``, no example database.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import walklens.cli.common
import walklens.core.loading
from walklens.cli import main

FUZZ = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.integers(-3, 12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["0", "-1", "1", "2", "nan", "inf", "-inf", "1e308", "-0", "", " ", "0x10", "1_000", "٣", "1,2"]),
    st.text(max_size=6),
)
_LOADED: dict[str, Any] = {}


@pytest.fixture(scope="module")
def tiny(tiny_llama_inputs: dict[str, str]) -> dict[str, str]:
    """A tiny Llama saved as a model directory and a three-item HellaSwag file (conftest)."""
    return tiny_llama_inputs


@pytest.fixture
def cli(
    tiny: dict[str, str], monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int, list[str]]]:
    """``cli(*argv)`` runs ``walklens.cli.main`` and checks the one-line rule; returns (exit code, stderr lines)."""
    real = walklens.core.loading.load_model

    def memo(spec: str, **kw: Any) -> Any:
        if spec not in _LOADED:
            _LOADED[spec] = real(spec, **kw)
        return _LOADED[spec]

    monkeypatch.setattr(walklens.core.loading, "load_model", memo)
    monkeypatch.setattr(walklens.cli.common, "load_model", memo)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def run(*argv: str) -> tuple[int, list[str]]:
        capfd.readouterr()
        try:
            rc = main(list(argv))
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 2
        err = capfd.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert "internal error" not in err, (argv, err)
        if rc != 0:
            assert rc == 2 and len(lines) == 1 and lines[0].startswith("walklens: error: "), (argv, rc, err)
        return rc, lines

    return run


# ---- explicit defects (issue 12, part D) ---------------------------------------------------------------------


def test_walk_points_that_match_nothing_is_one_line(cli: Callable[..., Any], tiny: dict[str, str]) -> None:
    """Used to print a 'raw reading skipped' note and then the same error."""
    rc, lines = cli("walk", "the king", "--model", tiny["model"], "--points", "nosuch*")
    assert rc == 2 and "no captured point matches nosuch*" in lines[0]


def test_sweep_layers_are_applied_to_the_standard_grid(
    cli: Callable[..., Any], tiny: dict[str, str], capfd: pytest.CaptureFixture[str]
) -> None:
    """``--layers 99 --grid standard`` used to be ignored (and run the top layer)."""
    base = ("sweep", "--test", "2", "--grid", "standard", "--model", tiny["model"], "--data", tiny["data"], "--dry-run")
    rc, lines = cli(*base, "--layers", "99")
    assert rc == 2 and "layer 99 is out of range for a 2-layer stack" in lines[0]
    capfd.readouterr()
    assert main([*base, "--layers", "1,-1"]) == 0
    assert "grid standard: 4 combinations, 0 refused, 4 schemes to run" in capfd.readouterr().out


def test_empty_scheme_is_refused_before_the_data(cli: Callable[..., Any], tiny: dict[str, str]) -> None:
    """``--scheme ""`` used to run the standard scheme; it is refused before the data or the model load."""
    rc, lines = cli("hellaswag", "test1", "--scheme", "", "--model", tiny["model"], "--data", "/no/such/file.jsonl")
    assert rc == 2 and lines == [
        "walklens: error: argument --scheme: an empty value (''); leave the option out for its default"
    ]  # every option's empty value is refused by the parser


def test_sweep_grid_not_utf8_is_one_line(cli: Callable[..., Any], tiny: dict[str, str]) -> None:
    bad = Path(tiny["root"]) / "bad.toml"
    bad.write_bytes(b'layer = ["\xff\xfe"]\n')
    rc, lines = cli("sweep", "--test", "1", "--grid", str(bad), "--model", tiny["model"], "--dry-run")
    assert rc == 2 and lines == [f"walklens: error: {bad}: not UTF-8 text (undecodable byte at offset 10)"]


# ---- fuzzed numeric and text options -------------------------------------------------------------------------


def _cmd(tiny: dict[str, str], command: str) -> list[str]:
    m, d = tiny["model"], tiny["data"]
    return {
        "walk": ["walk", "the king", "--model", m],
        "generate": ["generate", "the king", "--model", m, "--sample", "--max-new-tokens", "3"],
        "heads": ["heads", "the king", "--model", m],
        "kernels": ["kernels", "--model", m, "--method", "empirical", "--samples", "2", "--length", "8"],
        "sweep": ["sweep", "--test", "2", "--grid", "standard", "--model", m, "--data", d, "--dry-run"],
        "baseline": ["hellaswag", "baseline", "--model", m, "--data", d, "--no-db", "--no-progress"],
    }[command]


#: (command, option) pairs fuzzed here; power and steer are not fuzzed (each run costs seconds), their defects
#: found by fuzzing are tested below.
OPTIONS = [
    ("walk", "--k"),
    ("walk", "--points"),
    ("generate", "--k"),
    ("generate", "--max-new-tokens"),
    ("generate", "--seed"),
    ("kernels", "--seed"),
    ("kernels", "--max-distance"),
    ("generate", "--temperature"),
    ("generate", "--top-k"),
    ("generate", "--top-p"),
    ("heads", "--layer"),
    ("heads", "--position"),
    ("heads", "--maps"),
    ("kernels", "--margin"),
    ("sweep", "--limit"),
    ("sweep", "--shots"),
    ("sweep", "--layers"),
    ("sweep", "--seed"),
    ("baseline", "--limit"),
    ("baseline", "--shots"),
    ("baseline", "--seed"),
]


@settings(max_examples=60, **FUZZ)
@given(which=st.sampled_from(OPTIONS), value=NUMBERS)
@example(which=("walk", "--points"), value="nosuch*")  # a note and then the error: two lines
@example(which=("sweep", "--layers"), value="99")  # ignored with --grid standard
@example(which=("sweep", "--layers"), value="9" * 5000)  # int() refuses > 4300 digits
@example(which=("sweep", "--layers"), value="E,E")  # product_size counted the copy
def test_numeric_options_succeed_or_fail_in_one_line(
    cli: Callable[..., Any], tiny: dict[str, str], which: tuple[str, str], value: str
) -> None:
    command, option = which
    cli(*_cmd(tiny, command), f"{option}={value}")


SCHEMES = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "standard",
            "",
            " ",
            "enc=concat_each_example,layer=-1,word=w1mean",
            "enc=concat_each_example,layer=-1,word=w1mean,sim=dot",
            "enc=segment_each_example,layer=E,word=last,norm=L2",
            "enc=concat_each_example,layer=99,word=mean",
            "enc=token_level,layer=E,word=last,seg=None,ex=None",
            "layer=-1,word=mean",
        ]
    ),
)


@settings(max_examples=25, **FUZZ)
@given(test=st.sampled_from(("test1", "test2")), scheme=SCHEMES)
@example(test="test1", scheme="")  # used to run the standard scheme
def test_scheme_option_succeeds_or_fails_in_one_line(
    cli: Callable[..., Any], tiny: dict[str, str], test: str, scheme: str
) -> None:
    cli(
        "hellaswag",
        test,
        "--model",
        tiny["model"],
        "--data",
        tiny["data"],
        "--limit",
        "2",
        "--no-db",
        "--no-progress",
        f"--scheme={scheme}",
    )


# ---- defects found by fuzzing the other commands (each fixed; one line, exit 2, before any work) --------------


def _base(tiny: dict[str, str], command: str) -> list[str]:
    m = tiny["model"]
    return {
        "generate": ["generate", "the king", "--model", m, "--sample", "--max-new-tokens", "2"],
        "kernels": _cmd(tiny, "kernels"),
        "steer": ["steer", "the king", "--toward", " river", "--layers", "0", "--model", m, "--max-new-tokens", "2"],
        "power": ["power", "the king", "--model", m, "--no-dynamics"],
        "report": ["report", "--db", str(Path(tiny["root"]) / "no.db"), "--out", str(Path(tiny["root"]) / "rep")],
    }[command]


@pytest.mark.parametrize(
    "command,argv,message",
    [
        ("generate", ["--seed=18446744073709551616"], "argument --seed: a seed must be an integer from 0 to 2**63-1"),
        ("kernels", ["--seed=18446744073709551616"], "argument --seed: a seed must be an integer from 0 to 2**63-1"),
        ("report", ["--seed=-1"], "argument --seed: a seed must be an integer from 0 to 2**63-1, not '-1'"),
        ("kernels", ["--max-distance=5000"], "--max-distance 5000 is too large: at most 6 for samples of 8 tokens"),
        ("kernels", ["--max-distance=7"], "--max-distance 7 is too large: at most 6 for samples of 8 tokens"),
        ("kernels", ["--max-distance=1000000"], "--max-distance must be from 1 to 65536, not 1000000"),
        ("kernels", ["--margin=nan"], "argument --margin: must be a finite number, not 'nan'"),
        ("kernels", ["--margin=-1"], "--margin must be >= 0"),
        ("steer", ["--alpha=1,nan"], "--alpha must be within ±1e+06 (a finite number), not 'nan'"),
        ("power", ["--shared-layer=3"], "--shared-layer 3 out of range: the model has 2 layers"),
    ],
)
def test_fuzzed_defects_are_one_line_before_any_work(
    cli: Callable[..., Any], tiny: dict[str, str], command: str, argv: list[str], message: str
) -> None:
    """Used to end in an internal error (seed overflow in torch.manual_seed, a bad arange, numpy's negative seed),
    to accept nan, or to print progress bars before the error line (checked by ``cli``: one stderr line)."""
    rc, lines = cli(*_base(tiny, command), *argv)
    assert rc == 2 and lines[0].startswith(f"walklens: error: {message}"), lines


def _no_work(monkeypatch: pytest.MonkeyPatch, *targets: tuple[Any, str]) -> None:
    """Make each analysis raise when called, so that a run the CLI failed to refuse ends at once, never hangs
    (or allocates) without end."""

    def refuse(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the analysis ran: the option was not refused before the work")

    for module, name in targets:
        monkeypatch.setattr(module, name, refuse)


def test_huge_shared_depth_is_refused_up_front(
    cli: Callable[..., Any], tiny: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``power --shared-depth=10**30`` used to allocate until the OOM killer ended it."""
    import walklens.analyses.idealised
    import walklens.analyses.power

    _no_work(
        monkeypatch,
        (walklens.analyses.power, "power_spectra"),
        (walklens.analyses.power, "alignment"),
        (walklens.analyses.idealised, "shared_weights"),
    )
    rc, lines = cli(*_base(tiny, "power"), f"--shared-depth={10**30}")
    line = lines[0]
    assert rc == 2 and "a smaller --shared-depth" in line and "of memory beside the model's" in line, lines


@pytest.mark.parametrize("command", ["steer", "generate"])
def test_huge_max_new_tokens_is_refused_up_front(
    cli: Callable[..., Any], tiny: dict[str, str], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """``steer --max-new-tokens=10**30`` used to generate without end; both commands bound the new tokens by the
    model's context window (64 positions for the tiny model), even when the work limit is raised."""
    import walklens.analyses.decoding
    import walklens.analyses.steering

    _no_work(monkeypatch, (walklens.analyses.steering, "steering_sweep"), (walklens.analyses.decoding, "decoding_walk"))
    for steps in (10**30, 63):
        rc, lines = cli(*_base(tiny, command), f"--max-new-tokens={steps}", "--max-work=1e300")
        assert (
            rc == 2
            and lines[0].startswith("walklens: error: --max-new-tokens: a prompt of ")
            and f"tokens and {steps} new tokens exceed the model's context of 64 positions" in lines[0]
        ), lines
