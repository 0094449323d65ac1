"""Progress that fits the host (docs/notebooks.md, "Progress"): every long call draws a ``tqdm.auto`` bar (a widget
in a notebook, a line on stderr in a terminal) and draws nothing with ``progress=False``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tqdm.auto

import walklens
from walklens.lab.experiments import runner
from walklens.lab.experiments.runsetup import RunSetup
from walklens.testing import tiny_model

TEXT = "the cat and the dog walk to the house"


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.fixture()
def bars(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every ``tqdm.auto`` bar created during the test (the calls import it when they run); ``bar.drawn``: it was
    not disabled."""
    made: list[Any] = []
    base = tqdm.auto.tqdm

    class Spy(base):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.drawn = not self.disable  # close() sets disable
            made.append(self)

    monkeypatch.setattr(tqdm.auto, "tqdm", Spy)
    return made


def _items() -> list[Any]:
    from _toy import ROWS
    from walklens.lab.hellaswag.data import make_item

    return [
        make_item({"activity_label": a, "ctx_a": ca, "ctx_b": cb, "endings": e, "label": l}, i)
        for i, (a, ca, cb, e, l) in enumerate(ROWS)
    ]


#: The long calls (name, call(lm, progress)); each is small here but runs the same code path as a long one.
CALLS: list[tuple[str, Callable[[Any, bool], Any]]] = [
    ("power_spectra", lambda lm, p: walklens.power_spectra(lm, progress=p)),
    ("alignment", lambda lm, p: walklens.alignment(lm, [TEXT], n_random=4, n_shuffles=2, progress=p)),
    ("dynamics", lambda lm, p: walklens.analyses.dynamics(lm, [TEXT], progress=p)),
    ("shared_weights", lambda lm, p: walklens.analyses.shared_weights(lm, [TEXT], n_layers=3, progress=p)),
    (
        "steering_sweep",
        lambda lm, p: walklens.analyses.steering_sweep(
            lm, ["the dog"], " cat", [[1]], alphas=[0.0, 1.0], max_new_tokens=2, progress=p
        ),
    ),
    ("position_kernels", lambda lm, p: walklens.position_kernels(lm, samples=4, length=16, progress=p)),
    (
        "encoding_walk",
        lambda lm, p: walklens.encoding_walk(walklens.capture(lm, TEXT), k=2, chunk_rows=4, progress=p),
    ),
    (
        "decoding_walk",
        lambda lm, p: walklens.decoding_walk(lm, "the king", max_new_tokens=16, stop_at_eos=False, progress=p),
    ),
    ("verify", lambda lm, p: walklens.verify(lm, texts=("the cat sat", "a dog ran"), quick=True, progress=p)),
    (
        "run_test (baseline)",
        lambda lm, p: runner.run_test(lm, _items(), runner.baseline_scorer(), RunSetup(progress=p)),
    ),
]


@pytest.mark.parametrize("name, call", CALLS, ids=[c[0] for c in CALLS])
def test_long_calls_draw_a_bar_only_when_asked(
    name: str, call: Callable[[Any, bool], Any], llama: Any, bars: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    call(llama, False)
    assert capsys.readouterr().err == "", name
    assert not any(b.drawn for b in bars), name
    call(llama, True)
    err = capsys.readouterr().err
    drawn = [b for b in bars if b.drawn]
    if name == "run_test (baseline)":  # the runner imports tqdm.auto when it is imported: no spy, stderr only
        assert "baseline" in err and "item" in err
        return
    assert drawn and all(isinstance(b, tqdm.auto.tqdm) for b in drawn), name
    assert err.strip(), name


def test_gguf_conversion_draws_a_bar_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bars: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from test_fuzz_inputs import write_tiny_gguf

    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WALKLENS_CACHE", str(tmp_path / "quiet"))
    capsys.readouterr()
    walklens.load_model(str(gguf), progress=False)
    assert capsys.readouterr().err == ""
    assert not any(b.drawn for b in bars)
    monkeypatch.setenv("WALKLENS_CACHE", str(tmp_path / "shown"))  # a cold cache: de-quantized again
    lm = walklens.load_model(str(gguf))
    err = capsys.readouterr().err
    assert "de-quantizing tiny.gguf" in err
    (bar,) = [b for b in bars if b.drawn]
    assert bar.n == bar.total == 2 + 11  # the config and tokenizer, the tiny file's 11 tensors, the index
    walklens.load_model(str(gguf))  # cached: nothing to draw
    assert capsys.readouterr().err == ""
    assert lm.n_layers == 1
