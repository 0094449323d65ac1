"""Fuzzing the ``--compact SPEC`` grammar (issue 17), bounded and deterministic like tests/test_fuzz_inputs.py:
whatever the text, :meth:`CompactSpec.parse` gives a spec whose string form parses back to it, or one
:class:`~walklens.base.errors.InputError` line; through the command line, one ``walklens: error:`` line and exit 2
before any model loads."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from walklens.analyses.compaction import CompactSpec
from walklens.analyses.compaction.spec import WHATS
from walklens.base.errors import InputError

FUZZ = dict(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])

VALUES = st.sampled_from(
    [
        "examples",
        "context",
        "both",
        "concept",
        "avgpool",
        "drop",
        "even",
        "sentence",
        "scheme",
        "4",
        "2.5",
        "max",
        "0",
        "1",
        "-3",
        "nan",
        "inf",
        "1e400",
        "E",
        "middle",
        "-1",
        "w1mean",
        "last",
        "relu|mean",
        "None",
        "L2",
        "zNorm",
        "mean",
        "concat_each_example",
        "sentence_level_segmentation",
        "soft_cluster",
        "",
        " ",
    ]
) | st.text(max_size=8)
KEYS = st.sampled_from(
    ["what", "method", "bounds", "ratio", "budget", "recent", "layer", "word", "norm", "enc", "seg", "ex"]
) | st.text(max_size=6)


@settings(max_examples=200, **FUZZ)
@given(pairs=st.lists(st.tuples(KEYS, VALUES), max_size=7), junk=st.sampled_from(["", ",", "x", "=,", ",,"]))
def test_any_spec_is_a_spec_or_one_input_error(pairs: list[tuple[str, str]], junk: str) -> None:
    text = ",".join(f"{k}={v}" for k, v in pairs) + junk
    try:
        spec = CompactSpec.parse(text)
    except InputError as e:
        assert "\n" not in str(e) and len(str(e)) < 400
        return
    assert CompactSpec.parse(str(spec)) == spec and str(CompactSpec.parse(str(spec))) == str(spec)


@st.composite
def specs(draw: st.DrawFn) -> CompactSpec:
    method = draw(st.sampled_from(["concept", "avgpool", "drop"]))
    bounds = draw(st.sampled_from(["even", "sentence"] + (["scheme"] if method == "concept" else [])))
    kw: dict = dict(what=draw(st.sampled_from(WHATS)), method=method, bounds=bounds)
    if bounds == "scheme":
        kw.update(
            ratio=None,
            enc=draw(st.sampled_from(["concat_each_example", "sentence_level_segmentation"])),
            seg=draw(st.sampled_from(["mean", None])),
            ex=draw(st.sampled_from(["mean", None])),
        )
    else:
        size = draw(st.sampled_from(["ratio", "budget", "max"]))
        kw.update(
            ratio=draw(st.floats(1, 1e6)) if size == "ratio" else (math.inf if size == "max" else None),
            budget=draw(st.integers(1, 10**6)) if size == "budget" else None,
            recent=draw(st.integers(0, 500)),
        )
    if method == "concept":
        kw.update(
            layer=draw(st.sampled_from(["E", "middle", "-1", "0", "+3"])),
            word=draw(st.sampled_from(["mean", "w1mean", "last", "-relu+|w1mean"])),
            norm=draw(st.sampled_from([None, "L2", "varNorm", "zNorm"])),
        )
    return CompactSpec(**kw)


@settings(max_examples=200, **FUZZ)
@given(spec=specs())
def test_spec_string_round_trip(spec: CompactSpec) -> None:
    assert CompactSpec.parse(str(spec)) == spec


@settings(max_examples=60, **FUZZ)
@given(pairs=st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=5))
def test_the_command_line_answers_a_spec_in_one_line(pairs: list[tuple[str, str]]) -> None:
    import contextlib
    import io

    from walklens.cli import main

    text = ",".join(f"{k}={v}" for k, v in pairs)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:  # a model that does not exist: a good SPEC fails on it, a bad one before it
            code = main(
                ["hellaswag", "baseline", "--no-db", "--limit", "1", "--model", "/nonexistent/model", "--compact", text]
            )
        except SystemExit as e:
            code = e.code
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("walklens: error:"), err.getvalue()
    try:
        CompactSpec.parse(text)
    except InputError as e:
        assert lines[0] == f"walklens: error: {e}"
