"""Text is UTF-8 everywhere: a lone surrogate (what ``os.fsdecode`` and Python's argv make of undecodable bytes, or a
JSON ``"\\ud800"``) in a text to analyse is refused in one line naming the character, and in a name or a text a view
shows it is escaped (``\\udcff``), never a ``UnicodeEncodeError`` (docs/notebooks.md, "Views")."""

from __future__ import annotations

import copy
import dataclasses
import html
import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import walklens
from _cli import run
from walklens.base.errors import InputError, displayable, utf8_text

#: a name from a folder whose name holds the byte 0xff (os.fsdecode: surrogateescape), and a lone high surrogate
NAME = os.fsdecode(b"model-\xff")
LONE = "\ud800"
#: the text fields of the results that hold a model's name, a text or a label (others are choices, not texts)
TEXT_FIELDS = {"model_name", "model", "model_hint", "label", "toward", "prompt", "text", "continuation", "set_name"}
TOKEN_FIELDS = {"tokens", "prompt_tokens", "prompts"}


def _tainted(r: Any) -> Any:
    """A copy of result ``r`` with :data:`NAME` in its name fields and :data:`LONE` in its texts and first token."""
    if isinstance(r, walklens.analyses.SimilarityMap):
        return type(r).of(r.plain(), [LONE + t for t in r.tokens], r.point, r.metric, r.normed, NAME)
    out = copy.copy(r)
    for f in dataclasses.fields(r):
        v = getattr(r, f.name)
        if f.name in TEXT_FIELDS and isinstance(v, str):
            object.__setattr__(out, f.name, (NAME if "model" in f.name else LONE) + v)
        elif f.name in TOKEN_FIELDS and isinstance(v, list) and v and isinstance(v[0], str):
            object.__setattr__(out, f.name, [LONE + v[0], *v[1:]])
        elif f.name == "labels" and isinstance(v, dict) and v:
            object.__setattr__(out, f.name, {k: LONE + str(s) for k, s in v.items()})
    return out


def test_every_view_escapes_a_lone_surrogate(every_result: dict[str, Any]) -> None:
    """Every result type's ``_repr_html_`` and repr with a surrogate in its model name and its texts: UTF-8 output,
    the surrogate shown as ``\\udcff`` / ``\\ud800``."""
    failed = {}
    for name, r in every_result.items():
        bad = _tainted(r)
        try:
            out = bad._repr_html_()
            text = repr(bad)
            out.encode("utf-8")  # what the notebook stores
            text.encode("utf-8")
        except UnicodeError as e:
            failed[name] = f"{type(e).__name__}: {e}"
            continue
        page = html.unescape(out)
        if getattr(bad, "model_name", None) == NAME + getattr(r, "model_name", ""):
            assert "\\udcff" in page, name
    assert not failed, failed


def test_a_report_page_with_a_surrogate_is_written_as_utf8(tmp_path: Any) -> None:
    from walklens.reports.html import Report

    rep = Report(f"walk of {NAME}", LONE).p(LONE).table(["model"], [[NAME]]).attach("t.csv", f"{NAME},1\n")
    page = rep.save(tmp_path / "out")
    assert "\\udcff" in page.read_text(encoding="utf-8")
    assert (tmp_path / "out" / "t.csv").read_text(encoding="utf-8") == "model-\\udcff,1\n"


def test_the_helpers() -> None:
    assert displayable("plain é") == "plain é" and displayable(NAME) == "model-\\udcff"
    assert utf8_text("plain é") == "plain é"
    with pytest.raises(
        InputError, match=r"^the text holds a lone surrogate at character 2; walklens reads UTF-8 text$"
    ):
        utf8_text("ab" + LONE)
    with pytest.raises(InputError, match=r"^the target holds a lone surrogate at character 0;"):
        utf8_text(LONE, "the target")


@pytest.fixture(scope="module")
def tiny() -> Any:
    from walklens.testing import tiny_model

    return tiny_model("llama")


def test_analyses_refuse_a_lone_surrogate_in_one_line(tiny: Any) -> None:
    """``capture`` and the analyses that tokenise a text of their own refuse it before the tokenizer sees it."""
    from walklens.analyses.compaction import explain
    from walklens.analyses.parity import verify

    calls = {
        "capture": lambda: walklens.capture(tiny, "the cat " + LONE),
        "decoding_walk": lambda: walklens.decoding_walk(tiny, "the " + LONE, max_new_tokens=1),
        "decoding_walk target": lambda: walklens.decoding_walk(tiny, "the cat", target="the " + LONE),
        "steer toward": lambda: walklens.steer(tiny, "cat" + LONE, [1], 1.0).__enter__(),
        "explain": lambda: explain(tiny, "the cat " + LONE + " and the dog", continuation=" and the", budget=2),
        "verify": lambda: verify(tiny, texts=("the " + LONE,), quick=True),
    }
    for what, call in calls.items():
        with pytest.raises(InputError, match="holds a lone surrogate at character") as e:
            call()
        assert "\n" not in str(e.value), what


@settings(max_examples=60, derandomize=True, deadline=None, database=None)
@given(
    st.text(alphabet=st.sampled_from("the cat dog"), min_size=1, max_size=12),
    st.integers(0, 12),
    st.integers(0xD800, 0xDFFF),
)
def test_fuzz_capture_refuses_any_lone_surrogate_anywhere(tiny: Any, text: str, at: int, code: int) -> None:
    at = min(at, len(text))
    bad = text[:at] + chr(code) + text[at:]
    with pytest.raises(InputError) as e:
        walklens.capture(tiny, bad)
    assert str(e.value) == f"the text holds a lone surrogate at character {at}; walklens reads UTF-8 text"


@pytest.mark.parametrize(
    "argv",
    [
        ["walk", "{bad}"],
        ["generate", "{bad}", "--max-new-tokens", "1"],
        ["generate", "the cat", "--target", "{bad}"],
        ["heads", "{bad}"],
        ["simmap", "{bad}"],
        ["compact", "{bad}"],
    ],
)
def test_cli_refuses_a_surrogate_text_argument(argv: list[str], capfd: Any, tiny_llama_inputs: dict[str, str]) -> None:
    """The text of a command, as Python's argv holds undecodable bytes: one line, exit 2, before any model loads."""
    args = [a.format(bad=os.fsdecode(b"the \xff cat")) for a in argv] + ["--model", tiny_llama_inputs["model"]]
    rc, err = run(capfd, *args)
    assert rc == 2 and len(err) == 1, (rc, err)
    assert err[0] == "walklens: error: the text holds a lone surrogate at character 4; walklens reads UTF-8 text", err


@pytest.mark.slow
def test_cli_refuses_undecodable_bytes_in_argv(tiny_llama_inputs: dict[str, str]) -> None:
    """The real path: a process started with the bytes 0xff in its text argument."""
    exe = [sys.executable, "-m", "walklens", "walk"]
    r = subprocess.run(
        [*map(os.fsencode, exe), b"the \xff cat", b"--model", os.fsencode(tiny_llama_inputs["model"])],
        capture_output=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr[-500:]
    assert r.stderr.decode().strip().splitlines() == [
        "walklens: error: the text holds a lone surrogate at character 4; walklens reads UTF-8 text"
    ]


def test_hellaswag_data_with_an_escaped_lone_surrogate_is_refused(tmp_path: Any) -> None:
    """JSON spells a lone surrogate ``"\\ud800"``: the item is refused naming its line and field, not tokenised."""
    import json

    from walklens.lab.hellaswag.data import load_hellaswag

    doc = {"activity_label": "Run", "ctx_a": "a man", "ctx_b": "runs", "endings": ["a", "b", "c", "d"], "label": 0}
    for field, value in (("ctx_a", "a \ud800 man"), ("endings", ["a", "b", "\udcff", "d"])):
        path = tmp_path / f"{field}.jsonl"
        path.write_text(json.dumps(dict(doc, **{field: value})) + "\n", encoding="utf-8")  # ASCII: escapes
        with pytest.raises(InputError, match="holds a lone surrogate at character") as e:
            load_hellaswag(path)
        assert ("'ctx_a'" if field == "ctx_a" else "ending 2") in str(e.value) and "\n" not in str(e.value)
