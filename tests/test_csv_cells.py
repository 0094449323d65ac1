"""No CSV walklens writes holds a cell a spreadsheet would run as a formula (CSV injection): a text cell that
starts with = + - @, a tab or a carriage return gets a leading single quote; numbers stay numbers."""

from __future__ import annotations

import csv

import pytest

from walklens.base.outputs import csv_cell
from walklens.cli import main

EVIL = ['=HYPERLINK("http://evil")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\t=1", "\r=1", " =1"]


@pytest.mark.parametrize("value", EVIL)
def test_formula_cells_are_neutralised(value):
    assert csv_cell(value) == "'" + value
    for plain in ("model", "enc=mean,layer=-1", "", "'=quoted already"):
        assert csv_cell(plain) == plain
    assert csv_cell(-0.5) == -0.5 and csv_cell(-3) == -3 and csv_cell(None) is None


@pytest.mark.parametrize("table", ["runs", "results"])
def test_export_neutralises_every_text_cell(table, tmp_path, capsys):
    from walklens.lab.hellaswag.store import ItemResult, ResultStore, RunKey

    db = tmp_path / "r.sqlite"
    with ResultStore(db) as store:
        for i, evil in enumerate(EVIL):
            key = RunKey(model=evil, data=evil, split="@val", shots=0, test="baseline", scheme="=1+1")
            store.add_results(key, [ItemResult(item=i, gold=1, pred=2, pred_norm=3, scores=(-1.5, 0.0, 2.0, -3.0))])
            store.record_run(key, 1, 0.25, 0.5)
    out = tmp_path / "x.csv"
    assert main(["hellaswag", "export", str(out), "--db", str(db), "--table", table]) == 0
    rows = list(csv.DictReader(out.open(newline="")))
    assert len(rows) == len(EVIL)
    for r in rows:
        for col in ("model", "data", "split", "scheme"):
            assert r[col].startswith("'") and r[col][1:] in [*EVIL, "@val", "=1+1"], r
        assert r["shots"] == "0"
        if table == "runs":
            assert float(r["acc"]) == 0.25 and r["n"] == "1"  # numbers stay numbers
        else:
            assert r["scores"].startswith("[")


def test_sweep_report_csv_neutralises_model_names(tmp_path):
    from walklens.lab.reports.sweep import csv_text

    text = csv_text(["model", "acc"], [['=HYPERLINK("http://evil")', -0.5], ["@x", None]])
    rows = list(csv.reader(text.splitlines()))
    assert rows[1] == ['\'=HYPERLINK("http://evil")', "-0.5"] and rows[2] == ["'@x", ""]
