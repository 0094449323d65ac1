"""Compaction on the command line (issue 17): ``walklens compact``, ``walklens hellaswag baseline --compact SPEC``
and the resumable curve runner ``walklens hellaswag compaction``; the SPEC grammar's messages (fuzzed in
tests/test_fuzz_compact.py); the paired-bootstrap interval of the kept ratio."""

from __future__ import annotations

import json
import math
import sqlite3
from types import SimpleNamespace

import numpy as np
import pytest

from _toy import cli_runner, write_toy
from walklens.analyses.compaction import CompactSpec
from walklens.base.errors import InputError
from walklens.lab.experiments.curves import kept


@pytest.fixture
def run(capsys):
    return cli_runner(capsys)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return write_toy(tmp_path_factory.mktemp("compact"))


def one_line_error(r: SimpleNamespace, needle: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("walklens: error:") and needle in lines[0], r.stderr


# ---- the SPEC grammar -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,needle",
    [
        ("", "empty compact spec"),
        ("what=all", "invalid what='all'"),
        ("ratio=0.5", "a number >= 1"),
        ("ratio=4,budget=3", "exactly one of"),
        ("bounds=scheme,ratio=2", "no ratio or budget"),
        ("method=drop,layer=E", "takes no layer"),
        ("enc=concat_all_examples", "bounds=scheme only"),
        ("what=both,what=both", "given twice"),
        ("colour=red", "unknown compact spec key"),
        ("ratio", "expected key=value"),
        ("layer=banana", "invalid layer"),
        ("word=max", "invalid word"),
        ("recent=-1", "integer from 0"),
        ("bounds=scheme,recent=3", "no recent window"),
        ("method=avgpool,bounds=scheme", "needs method=concept"),
        ("bounds=scheme,enc=token_level", "no text segments"),
    ],
)
def test_bad_specs_say_why(text: str, needle: str) -> None:
    with pytest.raises(InputError, match=None) as e:
        CompactSpec.parse(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


# ---- walklens compact ---------------------------------------------------------------------------------------------


def test_compact_command_fits_80_columns_and_writes_json(toy, run, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    text = "the man walks to the river and he runs to the city and the dog eats a red car and she walks to london"
    out = tmp_path / "c.json"
    r = run(
        "compact", text, "--budget", "3", "--model", toy.model, "--cache", str(tmp_path / "cache"), "--json", str(out)
    )
    assert r.returncode == 0, r.stderr
    assert max(len(line) for line in r.stdout.splitlines()) <= 80, r.stdout
    assert "what each vector stands for" in r.stdout and "held-out continuation" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["k"] == len(doc["vectors"]) <= 3 and len(doc["vector_values"]) == doc["k"]
    assert doc["delta_per_token"] == pytest.approx(doc["compacted"]["per_token"] - doc["full"]["per_token"])
    assert all(len(v["nearest"]) == 5 for v in doc["vectors"])
    assert (tmp_path / "cache" / "index.sqlite").is_file()


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--budget", "0"], "positive integer"),
        (["--ratio", "0.5"], ">= 1"),
        (["--scheme", "enc=x"], "lacks"),
        (["--holdout", "500"], "--holdout must be"),
        (["--continuation", " x", "--holdout", "2"], "not both"),
        (["--bounds", "scheme", "--budget", "2"], "--bounds scheme"),
    ],
)
def test_compact_command_errors_are_one_line(toy, run, extra, needle) -> None:
    one_line_error(run("compact", "the man walks to the river", "--model", toy.model, *extra), needle)


def test_a_bad_cache_folder_is_refused_before_the_model_loads(toy, run, tmp_path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    one_line_error(
        run("compact", "the man walks", "--model", str(tmp_path / "no-such-model"), "--cache", str(f)), "--cache"
    )


# ---- walklens hellaswag baseline --compact ------------------------------------------------------------------------


def test_baseline_with_a_compacted_prefix(toy, run, tmp_path) -> None:
    common = [
        "--model",
        toy.model,
        "--data",
        toy.data,
        "--db",
        str(tmp_path / "r.sqlite"),
        "--no-progress",
        "--shots",
        "1",
    ]
    r = run(
        "hellaswag",
        "baseline",
        *common,
        "--compact",
        "what=examples,method=drop,ratio=1",
        "--json",
        str(tmp_path / "d.json"),
    )
    assert r.returncode == 0, r.stderr
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["compact"] == "what=examples,method=drop,bounds=even,ratio=1,recent=0"
    assert d["acc"] == d["baseline"]["acc"] and d["normalised"]["acc_norm"] in (None, 1.0)  # every token kept
    r = run("hellaswag", "baseline", *common, "--compact", "what=both,ratio=max", "--json", str(tmp_path / "m.json"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "m.json").read_text())["compact"].startswith("what=both,method=concept")
    with sqlite3.connect(tmp_path / "r.sqlite") as con:
        tests = {row[0] for row in con.execute("SELECT DISTINCT test FROM runs")}
    assert tests == {"baseline", "compact"}


@pytest.mark.parametrize("spec,needle", [("what=nothing", "invalid what"), ("ratio=-2", ">= 1"), ("", "empty")])
def test_baseline_compact_errors_are_one_line_before_loading(run, tmp_path, spec, needle) -> None:
    one_line_error(
        run("hellaswag", "baseline", "--model", str(tmp_path / "no-such-model"), "--no-db", "--compact", spec), needle
    )


def test_compacting_examples_needs_shots(toy, run) -> None:
    one_line_error(
        run("hellaswag", "baseline", "--model", toy.model, "--data", toy.data, "--no-db", "--compact", "what=examples"),
        "--shots",
    )


# ---- the curves ---------------------------------------------------------------------------------------------------


def test_kept_ratio_and_its_paired_interval() -> None:
    rng = np.random.default_rng(0)
    f = (rng.random(1000) < 0.4).astype(float)
    c = f.copy()
    c[np.flatnonzero(f)[:20]] = 0  # the compacted run loses 20 of the full run's ~400 hits, nothing else changes
    r, lo, hi = kept(c, f)
    assert r == pytest.approx(c.sum() / f.sum()) and lo <= r <= hi
    # paired: the runs share items, so the spread is that of the losses among the full run's hits, 1.96 *
    # sqrt(q (1 - q) / hits) each side with q = 20 / hits; two independent accuracies would spread ~5x wider
    hits = f.sum()
    q = 20 / hits
    assert hi - lo == pytest.approx(2 * 1.96 * math.sqrt(q * (1 - q) / hits), rel=0.25)
    from scipy.stats import bootstrap

    unpaired = bootstrap(
        (c, f),
        lambda a, b, axis=-1: a.mean(axis) / b.mean(axis),
        paired=False,
        vectorized=True,
        n_resamples=2000,
        method="percentile",
        random_state=np.random.default_rng(0),
    )
    assert unpaired.confidence_interval.high - unpaired.confidence_interval.low > 3 * (hi - lo)
    assert kept(f, f)[1:] == (1.0, 1.0)
    assert kept(np.ones(5), np.zeros(5)) == (None, None, None)


def test_the_curve_runner_is_resumable_and_draws(toy, run, tmp_path) -> None:
    db, out = tmp_path / "r.sqlite", tmp_path / "out"
    argv = [
        "hellaswag",
        "compaction",
        "--model",
        toy.model,
        "--data",
        toy.data,
        "--db",
        str(db),
        "--out",
        str(out),
        "--limit",
        "4",
        "--tune",
        "2",
        "--shots",
        "1",
        "--what",
        "examples",
        "--strategies",
        "bounds=even",
        "--ratios",
        "2,max",
        "--candidates",
        "layer=E,word=mean;layer=-1,word=w1mean",
        "--timing-items",
        "1",
        "--no-progress",
        "--json",
        str(tmp_path / "c.json"),
    ]
    r = run(*argv)
    assert r.returncode == 0, r.stderr
    assert {"index.html", "curves.csv", "curves.json", "timings.json"} <= {p.name for p in out.iterdir()}
    assert any(p.suffix == ".png" for p in out.iterdir())
    doc = json.loads((tmp_path / "c.json").read_text())
    strategies = {(p["strategy"], p["ratio"]) for p in doc["points"]}
    assert {
        ("full", 1.0),
        ("zero-shot", None),
        ("bounds=even", 2.0),
        ("method=drop", 2.0),
        ("method=avgpool,bounds=even", 2.0),
    } <= strategies
    assert len(doc["tuned"]["examples"]["candidates"]) == 2
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        tuned_items = {i for (i,) in con.execute("SELECT DISTINCT item FROM results WHERE scheme LIKE '%ratio=4%'")}
    assert tuned_items == {4, 5}  # tuning items: the last two, none of the four reported ones
    again = run(*argv)
    assert again.returncode == 0, again.stderr
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT COUNT(*) FROM results").fetchone()[0] == rows  # nothing computed twice
    one_line_error(run(*argv[:-2], "--strategies", "bounds=nowhere"), "invalid bounds")
    one_line_error(run(*argv[:-2], "--limit", "5", "--tune", "2"), "exceeds")


def test_test1_command_shares_the_cache(toy, run, tmp_path, monkeypatch) -> None:
    """``walklens hellaswag test1 --cache DIR``: the second run computes no segment vector, same numbers."""
    from walklens.analyses.concepts import vectors

    calls = []
    real = vectors.hidden_states
    monkeypatch.setattr(vectors, "hidden_states", lambda *a, **k: calls.append(1) or real(*a, **k))
    argv = [
        "hellaswag",
        "test1",
        "--model",
        toy.model,
        "--data",
        toy.data,
        "--no-db",
        "--no-progress",
        "--shots",
        "1",
        "--cache",
        str(tmp_path / "cache"),
    ]
    first = run(*argv, "--json", str(tmp_path / "a.json"))
    assert first.returncode == 0, first.stderr
    assert calls
    calls.clear()
    second = run(*argv, "--json", str(tmp_path / "b.json"))
    assert second.returncode == 0 and calls == []
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert a["predictions"] == b["predictions"] and a["acc"] == b["acc"]


def test_the_curves_legend_hides_no_point() -> None:
    """Every strategy of every panel is named once, in one legend below the panels; matplotlib's "best" spot
    inside an axes covered points of a full panel (the gemma3 10-shot context figure's ratio-8 points)."""
    import matplotlib.pyplot as plt

    from walklens.lab.experiments.curves import CurvePoint, CurveSet
    from walklens.lab.reports.curves import figure

    strategies = [
        "bounds=even",
        "bounds=sentence",
        "bounds=sentence,recent=16",
        "method=avgpool,bounds=even",
        "method=drop",
        "method=drop,recent=16",
    ]
    rng = np.random.default_rng(0)
    pts = []
    for shots, what in ((5, "context"), (10, "examples")):
        for s, r in [("full", 1.0), ("zero-shot", None)] + [(s, r) for s in strategies for r in (2.0, 8.0, math.inf)]:
            k = float(rng.uniform(0.6, 1.0))
            ci = (k - 0.05, k + 0.05)
            pts.append(
                CurvePoint(
                    shots=shots,
                    what=what,
                    strategy=s,
                    ratio=r,
                    spec=s,
                    n=1000,
                    acc=0.3,
                    acc_norm=0.4,
                    acc_ci=(0.27, 0.33),
                    acc_norm_ci=(0.37, 0.43),
                    kept_acc=k,
                    kept_acc_ci=ci,
                    kept_acc_norm=k,
                    kept_acc_norm_ci=ci,
                    tokens_per_vector=None if r is None else (r if math.isfinite(r) else 30.0),
                    seconds={"score": 1.0, "full_score": 2.0} if s != "zero-shot" else {},
                )
            )
    fig = figure(CurveSet(model="m", n_items=1000, n_tune=200, tuned={}, points=pts))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    assert all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["zero-shot"] + strategies
    box = legend.get_window_extent(renderer)
    overlapped = [ax.get_title() for ax in fig.axes if box.overlaps(ax.get_tightbbox(renderer))]
    plt.close(fig)
    assert overlapped == []
