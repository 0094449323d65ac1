"""The SQLite store: WAL, INSERT OR IGNORE, export, and resume after a deliberate interruption."""

from __future__ import annotations

import csv
import sqlite3

import pytest

from walklens.concepts import runner
from walklens.concepts.data import HellaswagItem
from walklens.concepts.schemes import Scheme
from walklens.concepts.store import ItemResult, ResultStore, RunKey, default_db_path
from walklens.testing import tiny_model

KEY = RunKey(model="m", data="d:abc", split="validation", shots=0, test="test1", scheme="enc=x")


def test_store_basics(tmp_path, monkeypatch):
    db = tmp_path / "r.sqlite"
    with ResultStore(db) as st:
        assert st._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert st.add_results(KEY, [ItemResult(0, 1, 1, 2, (-1.0, -2.0, -3.0, -4.0)),
                                    ItemResult(1, 0, 3, 3, (0.5,) * 4)]) == 2
        # INSERT OR IGNORE: a second write of item 0 neither duplicates nor overwrites it
        assert st.add_results(KEY, [ItemResult(0, 1, 0, 0, (9.0,) * 4)]) == 0
        assert st.done_items(KEY) == {0, 1}
        assert st.results(KEY)[0] == ItemResult(0, 1, 1, 2, (-1.0, -2.0, -3.0, -4.0))
        st.record_run(KEY, 2, 0.5, 0.0)
        created = st.runs()[0]["created"]
        st.record_run(KEY, 2, 0.5, 1.0)
        (run,) = st.runs(model="m")
        assert (run["n"], run["acc"], run["acc_norm"], run["created"]) == (2, 0.5, 1.0, created)
        csv_path = st.export(tmp_path / "out" / "r.csv")
        parquet_path = st.export(tmp_path / "r.parquet", table="runs")
    rows = list(csv.DictReader(open(csv_path)))
    assert [r["item"] for r in rows] == ["0", "1"] and rows[0]["scores"] == "[-1.0, -2.0, -3.0, -4.0]"
    import pyarrow.parquet as pq

    assert pq.read_table(parquet_path).to_pylist()[0]["acc_norm"] == 1.0
    monkeypatch.setenv("WALKLENS_DB", str(tmp_path / "env.sqlite"))
    assert default_db_path() == tmp_path / "env.sqlite"


def test_two_connections_do_not_corrupt(tmp_path):
    db = tmp_path / "r.sqlite"
    a, b = ResultStore(db), ResultStore(db)
    for i in range(20):
        (a if i % 2 else b).add_results(KEY, [ItemResult(i, 0, 0, 0, (float(i),) * 4)])
    assert a.done_items(KEY) == set(range(20)) == b.done_items(KEY)
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    a.close(), b.close()


def _items(n: int) -> list[HellaswagItem]:
    words = ["the man runs.", "a dog eats.", "she walks to the city.", "they ran."]
    return [HellaswagItem(index=i, activity_label="the city", ctx=f"the city: the {w} he",
                          endings=tuple(words[(i + j) % 4] for j in range(4)), label=i % 4)
            for i, w in enumerate(["boy", "girl", "king", "queen", "cat", "dog", "man"][:n])]


@pytest.mark.parametrize("test", ["baseline", "test1", "test2"])
def test_resume_after_interruption_gives_identical_rows(tmp_path, monkeypatch, test):
    lm = tiny_model("gpt2")
    items = _items(7)
    scheme = None if test == "baseline" else Scheme.standard(1 if test == "test1" else 2, "decoder")
    kw = dict(test=test, scheme=scheme, shots=1, data="toy", progress=False)
    monkeypatch.setattr(runner, "CHUNK", 2)  # items are scored and committed two at a time
    with ResultStore(tmp_path / "full.sqlite") as st:
        full = runner.run_test(lm, items, store=st, **kw)
        full_rows = list(st.iter_rows("results"))
    real = runner._batch_fn
    calls = []

    def flaky(test_, scheme_):
        fn = real(test_, scheme_)

        def wrapped(*a):
            if len(calls) == 2:
                raise KeyboardInterrupt  # interrupted while scoring the third chunk (items 5 and 6)
            calls.append(1)
            return fn(*a)
        return wrapped

    monkeypatch.setattr(runner, "_batch_fn", flaky)
    with ResultStore(tmp_path / "resumed.sqlite") as st:
        with pytest.raises(KeyboardInterrupt):
            runner.run_test(lm, items, store=st, **kw)
        assert len(st.done_items(full.key)) == 4  # what was scored before the interruption is kept
    monkeypatch.setattr(runner, "_batch_fn", real)
    with ResultStore(tmp_path / "resumed.sqlite") as st:
        again = runner.run_test(lm, items, store=st, **kw)
        assert again.computed == 3  # only the missing items
        assert list(st.iter_rows("results")) == full_rows
        assert (again.acc, again.acc_norm, again.predictions) == (full.acc, full.acc_norm, full.predictions)
        third = runner.run_test(lm, items, store=st, **kw)
        assert third.computed == 0 and list(st.iter_rows("results")) == full_rows
