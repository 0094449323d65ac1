"""The SQLite store: WAL, INSERT OR IGNORE, export, and resume after a deliberate interruption."""

from __future__ import annotations

import csv
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from _toy import write_items
from walklens.analyses.concepts.schemes import Scheme
from walklens.lab.experiments import runner
from walklens.lab.experiments.runsetup import RunSetup
from walklens.lab.hellaswag.data import HellaswagItem
from walklens.lab.hellaswag.store import ItemResult, ResultStore, RunKey, default_db_path
from walklens.testing import tiny_model

KEY = RunKey(model="m", data="d:abc", split="validation", shots=0, test="test1", scheme="enc=x")


def test_store_basics(tmp_path, monkeypatch):
    db = tmp_path / "r.sqlite"
    with ResultStore(db) as st:
        assert st._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert (
            st.add_results(KEY, [ItemResult(0, 1, 1, 2, (-1.0, -2.0, -3.0, -4.0)), ItemResult(1, 0, 3, 3, (0.5,) * 4)])
            == 2
        )
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
    return [
        HellaswagItem(
            index=i,
            activity_label="the city",
            ctx=f"the city: the {w} he",
            endings=tuple(words[(i + j) % 4] for j in range(4)),
            label=i % 4,
        )
        for i, w in enumerate(["boy", "girl", "king", "queen", "cat", "dog", "man"][:n])
    ]


@pytest.mark.parametrize("test", ["baseline", "test1", "test2"])
def test_resume_after_interruption_gives_identical_rows(tmp_path, monkeypatch, test):
    lm = tiny_model("gpt2")
    items = _items(7)
    scheme = None if test == "baseline" else Scheme.standard(1 if test == "test1" else 2, "decoder")
    sc = runner.scorer(lm, test, scheme)
    monkeypatch.setattr(runner, "CHUNK", 2)  # items are scored and committed two at a time

    def setup(st: ResultStore) -> RunSetup:
        return RunSetup(shots=1, data="toy", store=st, progress=False)

    with ResultStore(tmp_path / "full.sqlite") as st:
        full = runner.run_test(lm, items, sc, setup(st))
        full_rows = list(st.iter_rows("results"))
    calls = []

    def flaky(*a):
        if len(calls) == 2:
            raise KeyboardInterrupt  # interrupted while scoring the third chunk (items 5 and 6)
        calls.append(1)
        return sc.batch(*a)

    with ResultStore(tmp_path / "resumed.sqlite") as st:
        with pytest.raises(KeyboardInterrupt):
            runner.run_test(lm, items, replace(sc, batch=flaky), setup(st))
        assert len(st.done_items(full.key)) == 4  # what was scored before the interruption is kept
    with ResultStore(tmp_path / "resumed.sqlite") as st:
        again = runner.run_test(lm, items, sc, setup(st))
        assert again.computed == 3  # only the missing items
        assert list(st.iter_rows("results")) == full_rows
        assert (again.acc, again.acc_norm, again.predictions) == (full.acc, full.acc_norm, full.predictions)
        third = runner.run_test(lm, items, sc, setup(st))
        assert third.computed == 0 and list(st.iter_rows("results")) == full_rows


# ---- integrity: damaged and missing databases -------------------------------------------------------------------

PAGE = 4096


def _finished_db(path: Path) -> None:
    """A small finished database: single-run results and a sweep whose groups span several pages each."""
    import numpy as np

    from walklens.lab.hellaswag.store import SweepRun, SweepStore

    rng = np.random.default_rng(0)
    with ResultStore(path) as rs:
        rs.add_results(KEY, [ItemResult(i, i % 4, (i * 7) % 4, i % 3, (-1.5, -2.0, -0.5, -3.0)) for i in range(300)])
        rs.record_run(KEY, 300, 0.25, 0.25)
    n = 301
    labels = rng.integers(0, 4, n).astype(np.uint8)
    outs = [f"out_layer={o},out_word=mean" for o in range(55)]  # 55 x 301 predictions: 4,139 bytes per group
    with SweepStore(path) as st:
        run = SweepRun(
            model="m",
            data="d",
            split="validation",
            shots=0,
            test=2,
            labels=labels,
            item_index=range(n),
            arch="decoder",
            n_layers=4,
        )
        rid = st.run_id(run)
        st.set_baseline(rid, 0.3, 0.3, np.zeros((2, n), np.uint8))
        for g in range(30):
            preds = rng.integers(0, 4, (1, len(outs), n)).astype(np.uint8)
            st.put_groups(
                rid,
                [(f"enc=concat_each_example,layer={g},word=mean,norm=None,seg=mean,ex=mean,sim=dot", outs, preds)],
                ["acc"],
                labels,
                0.0,
            )


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("walklens: error: ") and "internal error" not in err, err
    return lines[0]


def test_a_damaged_page_is_refused_by_every_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One random 4 KB page written over a finished database: reading (report, export) and writing (a sweep,
    a single run) refuse it with one line naming the file, never an internal error or a 'done'."""
    import numpy as np

    from walklens.base.errors import InputError
    from walklens.cli import main
    from walklens.lab.hellaswag.store import SweepStore

    good = tmp_path / "good.sqlite"
    _finished_db(good)
    assert not Path(f"{good}-wal").exists()  # checkpointed: every page is in the main file
    with sqlite3.connect(good) as con:
        pages = con.execute("PRAGMA page_count").fetchone()[0]
        assert con.execute("PRAGMA page_size").fetchone()[0] == PAGE
        assert con.execute("PRAGMA freelist_count").fetchone()[0] == 0  # no free page: every page holds data
    assert pages > 40 and good.stat().st_size == pages * PAGE
    assert main(["report", "--db", str(good), "--out", str(tmp_path / "ok")]) == 0  # intact: it works
    capsys.readouterr()
    rng = np.random.default_rng(12)
    chosen = [1] + sorted(rng.choice(np.arange(2, pages + 1), size=8, replace=False).tolist())
    for page in chosen:  # page 1 holds the header and the schema; the rest tables, indexes and overflow blobs
        bad = tmp_path / f"bad{page}.sqlite"
        data = bytearray(good.read_bytes())
        data[(page - 1) * PAGE : page * PAGE] = rng.integers(0, 256, PAGE, dtype=np.uint8).tobytes()
        bad.write_bytes(bytes(data))
        assert main(["report", "--db", str(bad), "--out", str(tmp_path / f"rep{page}")]) == 2, page
        line = _one_error_line(capsys.readouterr().err)
        assert str(bad) in line and ("corrupted" in line or "not a usable SQLite database" in line), line
        assert main(["hellaswag", "export", str(tmp_path / "x.csv"), "--db", str(bad)]) == 2, page
        assert str(bad) in _one_error_line(capsys.readouterr().err)
        for store in (SweepStore, ResultStore):  # what `walklens sweep` and single runs open before any work
            with pytest.raises(InputError, match="restore it or start a new database"):
                store(bad)
        assert bad.read_bytes() == bytes(data)  # refused, not "repaired" or extended


def test_sweep_command_refuses_a_damaged_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:

    import numpy as np

    from walklens.cli import main

    db = tmp_path / "r.sqlite"
    _finished_db(db)
    data = bytearray(db.read_bytes())
    data[5 * PAGE : 6 * PAGE] = np.random.default_rng(3).integers(0, 256, PAGE, dtype=np.uint8).tobytes()
    db.write_bytes(bytes(data))
    lm = tiny_model("llama")
    lm.model.save_pretrained(tmp_path / "tiny")
    lm.tokenizer.save_pretrained(tmp_path / "tiny")
    items = write_items(
        tmp_path / "items.jsonl",
        [(f"the {w} runs.", "he", ["eats.", "ran.", "is red.", "walks."], 1) for w in ("man", "dog")],
    )
    capsys.readouterr()
    code = main(
        [
            "hellaswag",
            "sweep",
            "--test",
            "2",
            "--grid",
            "standard",
            "--model",
            str(tmp_path / "tiny"),
            "--data",
            str(items),
            "--db",
            str(db),
            "--no-progress",
        ]
    )
    out = capsys.readouterr()
    assert code == 2 and "done" not in out.out
    assert str(db) in _one_error_line(out.err) and "corrupted" in out.err


def test_reading_commands_refuse_a_missing_database_and_never_create_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from walklens.base.errors import InputError
    from walklens.cli import main
    from walklens.lab.hellaswag.store import SweepStore

    missing = tmp_path / "sub" / "missing.sqlite"
    csv_out = tmp_path / "out.csv"
    assert main(["hellaswag", "export", str(csv_out), "--db", str(missing)]) == 2
    assert "no such database" in _one_error_line(capsys.readouterr().err)
    assert main(["report", "--db", str(missing), "--out", str(tmp_path / "rep")]) == 2
    assert "no such database" in _one_error_line(capsys.readouterr().err)
    monkeypatch.setenv("WALKLENS_DB", str(missing))  # the default database, when --db is not given
    assert main(["hellaswag", "export", str(csv_out)]) == 2
    assert str(missing) in _one_error_line(capsys.readouterr().err)
    for store in (ResultStore, SweepStore):
        with pytest.raises(InputError, match="no such database"):
            store(missing, readonly=True)
    assert not missing.exists() and not missing.parent.exists() and not csv_out.exists()
    # an existing database is read, never changed, by export
    db = tmp_path / "r.sqlite"
    _finished_db(db)
    before = db.read_bytes()
    assert main(["hellaswag", "export", str(csv_out), "--db", str(db)]) == 0
    assert len(csv_out.read_text().splitlines()) == 301 and db.read_bytes() == before
    assert main(["report", "--db", str(db), "--out", str(tmp_path / "rep")]) == 0  # ... and by report
    assert db.read_bytes() == before and not Path(f"{db}-wal").exists()
    only_results = tmp_path / "single.sqlite"  # single runs, no sweep tables: an empty report, tables not added
    ResultStore(only_results).close()
    before = only_results.read_bytes()
    assert main(["report", "--db", str(only_results), "--out", str(tmp_path / "rep2")]) == 0
    assert "No sweep results" in (tmp_path / "rep2" / "index.html").read_text()
    assert only_results.read_bytes() == before
    # a file that is not a database: one line
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 300)
    assert main(["hellaswag", "export", str(csv_out), "--db", str(junk)]) == 2
    assert "not a usable SQLite database" in _one_error_line(capsys.readouterr().err)


# ---- schema versions ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["schema", "sweep_schema"])
def test_a_newer_schema_is_refused_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str) -> None:
    """Each store records its tables' schema version in ``meta``; a database written by a newer walklens (a
    higher version, for either store) is refused on open, by every command, and left as it is."""
    from walklens.base.errors import InputError
    from walklens.cli import main
    from walklens.lab.hellaswag.store import SweepStore

    db = tmp_path / "r.sqlite"
    _finished_db(db)
    with sqlite3.connect(db) as con:
        assert dict(con.execute("SELECT key, value FROM meta")) == {"schema": "1", "sweep_schema": "1"}
        con.execute("UPDATE meta SET value='7' WHERE key=?", (key,))
    con.close()
    before = db.read_bytes()
    store = SweepStore if key == "sweep_schema" else ResultStore
    for readonly in (False, True):
        with pytest.raises(InputError, match=r"schema version 7, newer than this walklens reads \(1\)"):
            store(db, readonly=readonly)
    cmd = (
        ["report", "--db", str(db), "--out", str(tmp_path / "rep")]
        if key == "sweep_schema"
        else ["hellaswag", "export", str(tmp_path / "x.csv"), "--db", str(db)]
    )
    assert main(cmd) == 2
    assert str(db) in _one_error_line(capsys.readouterr().err)
    assert db.read_bytes() == before and not list(tmp_path.glob("rep/*")) and not (tmp_path / "x.csv").exists()
    other = ResultStore if store is SweepStore else SweepStore
    other(db, readonly=True).close()  # the other store's tables are still readable


def test_a_database_without_a_sweep_version_is_the_first_layout(tmp_path: Path) -> None:
    """Sweep tables written before versions were recorded are version 1: read as they are, and the version is
    recorded by the next writer."""
    import numpy as np

    from walklens.lab.hellaswag.store import SweepStore

    db = tmp_path / "r.sqlite"
    _finished_db(db)
    with sqlite3.connect(db) as con:
        con.execute("DELETE FROM meta WHERE key='sweep_schema'")
    con.close()
    with SweepStore(db, readonly=True) as st:
        (run,) = st.runs()
        assert st.load(run["id"]).acc.shape == (1, 30 * 55)
    with SweepStore(db) as st:
        assert st.con.execute("SELECT value FROM meta WHERE key='sweep_schema'").fetchone() == ("1",)
        assert np.array_equal(st.load(run["id"]).labels, run["labels"])


@pytest.mark.parametrize("item", ["x", 1.5, -1, b"\x00"])
def test_a_tampered_item_index_is_one_line_naming_it(tmp_path: Path, item: object) -> None:
    """``done_items`` (what a resumed run skips) checks every stored item index: a tampered one is one line naming
    the table, row and field, never an internal error or an item silently skipped."""
    from walklens.base.errors import InputError

    db = tmp_path / "r.sqlite"
    with ResultStore(db) as st:
        st.add_results(KEY, [ItemResult(0, 1, 1, 2, (-1.0, -2.0, -3.0, -4.0))])
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("PRAGMA ignore_check_constraints = ON")
        conn.execute("UPDATE results SET item=?", (item,))
    conn.close()
    with ResultStore(db) as st, pytest.raises(InputError, match="table results, row item=.*field item"):
        st.done_items(KEY)
