"""HellaSwag in the terminal (issue 56): where results are stored and how many items were reused vs computed
(never a silent reuse), Wilson intervals and the paired p beside every accuracy, ``--grid small`` for a first
sweep, and ``sweep`` printing its best schemes with their held-out scores."""

from __future__ import annotations

import json
import re

import pytest

from _toy import cli_runner, write_toy
from walklens.analyses.chance import wilson
from walklens.lab.experiments.grid import GridSpec


@pytest.fixture
def run(capsys):
    return cli_runner(capsys)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return write_toy(tmp_path_factory.mktemp("hs_terminal"), rows=6)


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _has(needle: str, text: str) -> bool:
    """Whether ``text`` says ``needle`` wherever the terminal wrapped it (a long path is cut mid-word)."""
    return re.sub(r"\s+", "", needle) in re.sub(r"\s+", "", text)


def test_reuse_is_said_with_the_database_and_how_it_was_chosen(toy, run, tmp_path, monkeypatch):
    db = tmp_path / "r.sqlite"
    common = ["--model", toy.model, "--data", toy.data, "--no-progress"]
    r = run("hellaswag", "baseline", *common, "--db", str(db), "--limit", "4")
    assert r.returncode == 0, r.stderr
    assert _has(f"results: {db} (--db); run: 4 computed, 0 reused", r.stdout)
    r = run("hellaswag", "baseline", *common, "--db", str(db), "--limit", "6")
    assert "run: 2 computed, 4 reused" in _flat(r.stdout)  # the 4 stored items are read back, and said so
    r = run("hellaswag", "test2", *common, "--db", str(db), "--limit", "6")
    assert "test2: 6 computed, 0 reused; baseline: 0 computed, 6 reused" in _flat(r.stdout)
    monkeypatch.delenv("WALKLENS_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    r = run("hellaswag", "baseline", *common, "--limit", "2")
    flat = _flat(r.stdout)
    assert _has(str(tmp_path / "data"), flat) and "(the default database; --db PATH for another)" in flat
    r = run("hellaswag", "baseline", *common, "--limit", "2", "--no-db")
    assert "results: not stored (--no-db); run: 2 computed, 0 reused" in _flat(r.stdout)


def test_every_accuracy_has_its_wilson_interval_and_the_paired_p(toy, run, tmp_path):
    js = tmp_path / "t2.json"
    args = ["--model", toy.model, "--data", toy.data, "--no-progress", "--no-db", "--json", str(js)]
    r = run("hellaswag", "test2", *args)
    assert r.returncode == 0, r.stderr
    doc, flat = json.loads(js.read_text()), _flat(r.stdout)
    for m in ("acc", "acc_norm"):
        pd = doc["paired"][m]
        k = round(doc[m] * doc["n"])
        lo, hi = wilson(k, doc["n"])
        assert f"{doc[m]:.4f} [{lo:.3f}, {hi:.3f}]" in flat
        assert f"{pd['baseline']:.4f} [{pd['baseline_lo']:.3f}, {pd['baseline_hi']:.3f}]" in flat
        assert f"{pd['paired']['p']:.2g}" in flat
    assert "acc [95% Wilson]" in flat and "p (acc)" in flat and "exact McNemar" in flat
    r = run("hellaswag", "baseline", *args)
    b = json.loads(js.read_text())
    lo, hi = wilson(round(b["acc"] * b["n"]), b["n"])
    assert f"{b['acc']:.4f} [{lo:.3f}, {hi:.3f}]" in _flat(r.stdout)


def test_grid_small_is_a_first_sweep():
    one, two = GridSpec.resolve("small", 1, "decoder"), GridSpec.resolve("small", 2, "decoder")
    s1, refused1 = one.enumerate("decoder")
    s2, _ = two.enumerate("decoder")
    assert len(s1) == 8 and not refused1 and len(s2) == 32
    assert {s.layer for s in s1} == {"middle", "-1"}
    assert {s.layer for s in GridSpec.resolve("small", 1, "decoder", ["E", "0", "-1"]).enumerate("decoder")[0]} == {
        "E",
        "0",
        "-1",
    }


def test_sweep_grid_small_prints_its_best_schemes_with_held_out_scores(toy, run, tmp_path):
    db = tmp_path / "s.sqlite"
    args = ["sweep", "--test", "1", "--grid", "small", "--model", toy.model, "--data", toy.data]
    r = run(*args, "--db", str(db), "--no-progress", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "grid small: 8 combinations, 0 refused, 8 schemes to run" in _flat(r.stdout)
    r = run(*args, "--db", str(db), "--no-progress", "--json", str(tmp_path / "s.json"))
    assert r.returncode == 0, r.stderr
    flat, info = _flat(r.stdout), json.loads((tmp_path / "s.json").read_text())
    ho = info["held_out"]["acc"]
    kf = ho["kfold"]
    assert f"acc: {kf['k']}-fold held-out best {kf['acc']:.4f} [{kf['lo']:.3f}, {kf['hi']:.3f}]" in flat
    assert f"paired p {ho['paired']['p']:.2g}" in flat
    assert "best scheme of each fold (chosen on the other folds) and its held-out score" in flat
    assert _has(f"reused from the results database {db} (--db)", flat)
    assert "acc [95% Wilson]" in flat


def test_report_tables_scroll_and_log_axes_read_plainly(toy, run, tmp_path):
    """The sweep report's tables scroll sideways inside the page (overflow-x:auto on every table), and the
    histogram's log axis is labelled with plain numbers, never "4×10^0" (nor the curves' base-2 axis "2^3")."""
    from walklens.lab.experiments.summary import summarise_stored
    from walklens.lab.reports.curves import _plain_log2_x
    from walklens.lab.reports.sweep import _hist_figure
    from walklens.reports.html import pyplot

    db = tmp_path / "s.sqlite"
    r = run("sweep", "--test", "1", "--grid", "small", "--model", toy.model, "--data", toy.data, "--db", str(db),
            "--no-progress")  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = tmp_path / "rep"
    assert run("report", "--db", str(db), "--out", str(out)).returncode == 0
    css = (out / "index.html").read_text()
    assert re.search(r"table\.wl\{[^}]*overflow-x:auto", css)
    s = summarise_stored(db, 1)
    assert s is not None
    fig = _hist_figure(s.metrics["acc"], "t")
    fig.canvas.draw()
    labels = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels() + ax.get_yminorticklabels()]
    shown = [x for x in labels if x]
    assert len(shown) >= 2 and all(re.fullmatch(r"[\d,.]+", x) for x in shown), shown
    fig2, ax = pyplot().subplots()
    ax.plot([1, 2, 4, 8, 16], [1, 2, 3, 4, 5])
    _plain_log2_x(ax)
    fig2.canvas.draw()
    xs = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert xs and all(re.fullmatch(r"[\d.]+", x) for x in xs), xs


def test_folds_print_intervals_and_the_paired_p():
    """``hellaswag folds``: the held-out best and each control beside the baseline, each with its Wilson interval
    and the paired p (it printed the bare accuracies as a dict)."""
    from types import SimpleNamespace

    from rich.console import Console

    from walklens.cli.hellaswag import _print_folds
    from walklens.lab.experiments.heldout import paired_test

    gold = [0, 1, 2, 3] * 5
    picks = SimpleNamespace(
        gold=gold,
        heldout={"acc": gold[:15] + [0] * 5},
        baseline={"acc": [0] * 20},
        controls={"shuffled": {"acc": [1] * 20}},
    )
    con = Console(record=True, width=300)
    _print_folds(con, "tiny", picks, {"kfold_acc_report": {"acc": 0.7}})
    text = _flat(con.export_text())
    lo, hi = wilson(16, 20)
    import numpy as np

    p = paired_test(np.array(picks.heldout["acc"]) == gold, np.array([0] * 20) == gold).p
    assert f"k-fold held-out 0.8000 [{lo:.3f}, {hi:.3f}], paired p {p:.2g}" in text
    assert "baseline 0.2500 [" in text and "control shuffled 0.2500 [" in text
