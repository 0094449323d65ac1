"""Hostile inputs of the experiment files and the minor points of the same standard: one line before any model
loads (a TOML file nested thousands deep, more shots than the few-shot pool holds, junk --candidates even with
--tune 0), a warning line when an option is cut to the model's context, control characters shown escaped in a
report's table, and one success line whatever the --out path holds."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from _cli import run
from walklens.base.errors import InputError
from walklens.lab.experiments.experiment import read_experiment


@pytest.fixture(scope="module")
def tiny(tiny_llama_inputs: dict[str, str]) -> dict[str, str]:
    """A tiny Llama saved as a model directory and a three-item HellaSwag file (conftest)."""
    return tiny_llama_inputs


@pytest.mark.parametrize("nested", ["x = " + "[" * 5000 + "]" * 5000, "x = " + "{a = " * 3000 + "1" + "}" * 3000])
def test_a_toml_file_nested_thousands_deep_is_one_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], nested: str
) -> None:
    """Used to end in ``internal error: RecursionError``."""
    exp = tmp_path / "exp.toml"
    exp.write_text(f'tests = [2]\ngrid = "standard"\nmodels = ["m"]\n{nested}\n', encoding="utf-8")
    with pytest.raises(InputError, match="nested too deeply"):
        read_experiment(exp)
    rc, err = run(capfd, "experiment", "run", str(exp), "--db", str(tmp_path / "r.sqlite"))
    assert rc == 2 and len(err) == 1 and "nested too deeply" in err[0], err
    rc, err = run(capfd, "sweep", "--test", "2", "--grid", str(exp), "--model", "m", "--dry-run")
    assert rc == 2 and len(err) == 1 and "nested too deeply" in err[0], err


def test_more_shots_than_the_pool_holds_are_refused_before_the_model_loads(
    tiny: dict[str, str], tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``shots = [100000]`` used to be refused only after the model loaded, under a progress line."""
    from walklens.core.backends.base import LocalBackend

    monkeypatch.setattr(LocalBackend, "driver_model", lambda *a, **k: pytest.fail("the model loaded"))
    exp = tmp_path / "exp.toml"
    exp.write_text(
        f'tests = [2]\ngrid = "standard"\nshots = [0, 100000]\ndata = "{tiny["data"]}"\nmodels = ["{tiny["model"]}"]\n',
        encoding="utf-8",
    )
    rc, err = run(capfd, "experiment", "run", str(exp), "--db", str(tmp_path / "r.sqlite"), "--no-progress")
    assert rc == 2 and err == [
        f"walklens: error: {exp}: shots: 100000-shot needs 100000 other items in the few-shot pool, which has 2"
    ], err


def test_junk_candidates_are_refused_even_with_tune_0(
    tiny: dict[str, str], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    rc, err = run(
        capfd,
        "hellaswag",
        "compaction",
        "--tune",
        "0",
        "--candidates",
        "zzz;also junk",
        "--model",
        "/nonexistent",
        "--data",
        tiny["data"],
        "--out",
        str(tmp_path / "out"),
    )
    assert rc == 2 and len(err) == 1 and "zzz" in err[0], err
    assert not (tmp_path / "out").exists()


def test_kernels_length_cut_to_the_context_says_so(
    tiny: dict[str, str], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """``kernels --length 1000000`` is cut to the model's context (64): a warning line, not only a JSON field."""
    rc, err = run(
        capfd,
        "kernels",
        "--model",
        tiny["model"],
        "--method",
        "empirical",
        "--samples",
        "2",
        "--length",
        "1000000",
        "--json",
        str(tmp_path / "k.json"),
    )
    assert rc == 0
    assert "walklens: warning: --length 1000000 is cut to the model's context: samples of 64 tokens" in err, err


def test_report_tables_show_control_characters_escaped(tmp_path: Path) -> None:
    """The steer report's prompt column used to hold raw NUL characters; the page holds none."""
    from walklens.analyses.steering import steering_sweep
    from walklens.reports import steer as steer_report
    from walklens.testing import tiny_model

    sw = steering_sweep(
        tiny_model("llama"), ["the\x00 king\x1b"], " river", [[1]], alphas=[0.0], methods=["eigen"], max_new_tokens=1
    )
    page = Path(steer_report.build(sw).save(tmp_path / "rep")).read_text(encoding="utf-8")
    assert "\x00" not in page and "\x1b" not in page
    # the table of runs is drawn from the embedded document by results.js, whose visible() escapes them as
    # reports/html.py's does (tests/test_browser.py renders this page; test_explorer_browser.py compares both)
    assert "the\\u0000 king\\u001b" in html.unescape(page)


def test_a_success_line_stays_one_line_whatever_the_path(
    tiny: dict[str, str], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "a\nb"
    rc, err = run(capfd, "walk", "the king", "--model", tiny["model"], "--out", str(out))
    assert rc == 0 and (out / "index.html").is_file()
    written = [line for line in err if "report written" in line]
    shown = str(out / "index.html").replace("\n", "\\n")
    assert written == [f"walklens: report written to {shown}"], err
