"""A walklens database is recognised by its own ``meta`` table (any other SQLite file is refused in one line,
nothing created in it), and every value read from one is validated before it sizes anything: a bad value is
one line naming the table, row and field (exit 2; a 400 in the explorer), never an internal error."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from walklens.base.errors import InputError
from walklens.cli import main


def _one_error(capsys: Any, argv: list[str], *needles: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("walklens: error: "), (code, err)
    assert all(n in lines[0] for n in needles), err
    return lines[0]


# ---- foreign SQLite files ------------------------------------------------------------------------------------------


def _foreign(path: Path, ddl: str = "CREATE TABLE foo (x INTEGER)") -> bytes:
    con = sqlite3.connect(path)
    con.execute(ddl)
    con.execute("INSERT INTO foo VALUES (1)" if "foo" in ddl else "SELECT 1")
    con.commit()
    con.close()
    return path.read_bytes()


FOREIGN = {
    "no meta": "CREATE TABLE foo (x INTEGER)",
    "a meta of its own": "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)",
    "a meta of another layout": "CREATE TABLE meta (a INTEGER, b BLOB)",
}


@pytest.mark.parametrize("kind", FOREIGN)
@pytest.mark.parametrize(
    "argv",
    [
        ["hellaswag", "baseline", "--no-progress", "--db", "{db}", "--data", "{data}"],
        ["sweep", "--test", "2", "--db", "{db}", "--data", "{data}"],
        ["report", "--db", "{db}", "--out", "{out}"],
        ["hellaswag", "export", "{out}/x.csv", "--db", "{db}"],
        ["serve", "--db", "{db}", "--port", "0"],
    ],
)
def test_foreign_sqlite_file_refused_untouched(kind, argv, tmp_path, capsys, monkeypatch):
    import walklens.core.loading as loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    db = tmp_path / "other.sqlite"
    before = _foreign(db, FOREIGN[kind])
    args = [a.format(db=db, data=tmp_path / "none.jsonl", out=tmp_path / "out") for a in argv]
    _one_error(capsys, args, str(db), "not a walklens database", "something else")
    assert db.read_bytes() == before
    assert {p.name for p in tmp_path.iterdir()} <= {"other.sqlite", "out"}  # no journal left, nothing created
    con = sqlite3.connect(db)
    assert {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")} <= {"foo", "meta"}
    con.close()


def test_walklens_databases_and_new_files_are_accepted(tmp_path):
    from walklens.lab.hellaswag.store import ResultStore, SweepStore

    for store, other in ((ResultStore, SweepStore), (SweepStore, ResultStore)):
        path = tmp_path / f"{store.__name__}.sqlite"
        store(path).close()  # a database holding only one store's tables is a walklens database
        other(path).close()
        other(path, readonly=True).close()
    empty = tmp_path / "empty.sqlite"
    empty.touch()  # a file with no table is a new database
    ResultStore(empty).close()


def test_concept_cache_refuses_a_foreign_index_untouched(tmp_path):
    from walklens.analyses.concepts.cache import ConceptCache

    for kind, ddl in FOREIGN.items():
        root = tmp_path / kind.replace(" ", "_")
        root.mkdir()
        before = _foreign(root / "index.sqlite", ddl)
        with pytest.raises(InputError, match="not a concept-cache index: an SQLite database of something else"):
            ConceptCache(root)
        assert (root / "index.sqlite").read_bytes() == before


# ---- values read from a walklens database --------------------------------------------------------------------------

HOST = "127.0.0.1:8765"
TOKEN = "test-token_0123456789"
H = {"X-Walklens-Token": TOKEN}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> bytes:
    """A valid walklens database: a Test 2 sweep run of 8 items (18 schemes, a baseline, one kept shard) and
    two HellaSwag results with their run."""
    import numpy as np

    from _explorer import sweep_db
    from walklens.lab.hellaswag.store import ItemResult, ResultStore, RunKey, SweepStore

    path = sweep_db(tmp_path_factory.mktemp("template") / "r.sqlite", model="tiny", n_items=8)
    with SweepStore(path) as st:
        st.put_shard(1, "block 0 items 0-8", np.zeros((2, 3, 8), np.uint8), 0.5)
    with ResultStore(path) as rs:
        key = RunKey(model="tiny", data="toy", split="validation", shots=0, test="baseline", scheme="baseline")
        rs.add_results(key, [ItemResult(i, 1, i % 4, 2, (-1.0, -2.5, 0.0, -3.0)) for i in range(2)])
        rs.record_run(key, 2, 0.5, 0.5)
    return path.read_bytes()


@pytest.fixture(scope="module")
def tiny():
    from walklens.testing import tiny_model

    return {"llama": tiny_model("llama")}


def _mutated(template: bytes, path: Path, changes: list[tuple[str, str, bool, Any]]) -> Path:
    """The template with each ``(table, column, first row only, value)`` written (a change the schema refuses,
    such as a duplicate key or a NULL in a NOT NULL column, is skipped)."""
    path.write_bytes(template)
    con = sqlite3.connect(path)
    for table, col, first, value in changes:
        where = f" WHERE rowid=(SELECT min(rowid) FROM {table})" if first and table != "results" else ""
        if first and table == "results":
            where = " WHERE item=(SELECT min(item) FROM results)"
        try:
            con.execute(f"UPDATE {table} SET {col}=?{where}", (value,))
        except sqlite3.IntegrityError:
            pass
    con.commit()
    con.close()
    return path


def _explorer_statuses(tiny: dict[str, Any], db: Path) -> list[tuple[int, str]]:
    """Status and body of the explorer's sweeps endpoints over ``db``: the list, and run 1 (whole, filtered)."""
    from starlette.testclient import TestClient

    from walklens.server.app import create_app
    from walklens.server.security import allowed_hosts
    from walklens.server.state import Explorer

    app = create_app(Explorer(dict(tiny), db), TOKEN, allowed_hosts("127.0.0.1", 8765))
    with TestClient(app, base_url=f"http://{HOST}", raise_server_exceptions=False) as c:
        out = [c.get("/api/sweeps", headers=H)]
        out += [
            c.post("/api/sweeps/run", json={"run": run, **extra}, headers=H)
            for run in (1,)
            for extra in ({}, {"metric": "acc", "filters": {"layer": "E"}})
        ]
    return [(r.status_code, r.text) for r in out]


ROW11 = [
    ("sweep_runs", "n_items", 10**12),
    ("sweep_runs", "n_items", -5),
    ("sweep_runs", "n_items", 3 * 10**8),
    ("sweep_runs", "labels", b"\x01"),
    ("sweep_runs", "baseline_preds", b"\x01"),
    ("sweep_groups", "preds", b"\x01"),
    ("sweep_groups", "acc", b"\x01"),
    ("sweep_groups", "outs", "not json"),
    ("sweep_runs", "item_index", "[1,"),
    ("sweep_groups", "metrics", '["acc", "acc"]'),
    ("sweep_groups", "context", "zzz"),
    ("sweep_runs", "arch", "quantum"),
    ("sweep_runs", "test", 7),
    ("sweep_runs", "baseline_acc", 1e300),
    ("sweep_groups", "outs", "[" * 100_000),
]


@pytest.mark.parametrize("table,field,value", ROW11, ids=[f"{t}.{f}={str(v)[:12]}" for t, f, v in ROW11])
def test_bad_values_are_one_line_naming_table_row_and_field(table, field, value, template, tiny, tmp_path, capsys):
    db = _mutated(template, tmp_path / "bad.sqlite", [(table, field, True, value)])
    line = _one_error(
        capsys, ["report", "--db", str(db), "--out", str(tmp_path / "out")], f"table {table}, row ", f"field {field}"
    )
    assert len(line) < 400
    statuses = _explorer_statuses(tiny, db)
    assert all(s < 500 for s, _ in statuses), statuses
    assert any(s == 400 and f"field {field}" in body for s, body in statuses), statuses


def test_results_values_are_checked(template, tmp_path, capsys):
    from walklens.lab.hellaswag.store import ResultStore, RunKey

    key = RunKey(model="tiny", data="toy", split="validation", shots=0, test="baseline", scheme="baseline")
    for field, value in (("gold", 9), ("scores", "[1, "), ("scores", '"x"'), ("pred", "two")):
        db = _mutated(template, tmp_path / f"{field}.sqlite", [("results", field, True, value)])
        with ResultStore(db, readonly=True) as store, pytest.raises(InputError, match=f"table results.*field {field}"):
            store.results(key)
        _one_error(capsys, ["hellaswag", "export", str(tmp_path / "x.csv"), "--db", str(db)], f"field {field}")
    db = _mutated(template, tmp_path / "acc.sqlite", [("runs", "acc", True, 5.0)])
    _one_error(
        capsys,
        ["hellaswag", "export", str(tmp_path / "x.csv"), "--db", str(db), "--table", "runs"],
        "table runs",
        "field acc",
    )


def test_a_valid_edge_database_still_reports(template, tmp_path, capsys):
    """Values at the edges of their ranges are read and reported (the real report, PNGs and all)."""
    db = _mutated(
        template,
        tmp_path / "edge.sqlite",
        [
            ("sweep_runs", "baseline_acc", False, 0.0),
            ("sweep_runs", "model", False, "=\u2028 model"),
            ("sweep_groups", "acc", True, b"\x00" * 12),
        ],
    )
    assert main(["report", "--db", str(db), "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    assert (tmp_path / "out" / "index.html").is_file()


# ---- fuzzing: any value in any column --------------------------------------------------------------------------

_COLUMNS = {
    "meta": ("key", "value"),
    "runs": ("model", "data", "split", "shots", "test", "scheme", "n", "acc", "acc_norm", "created", "updated"),
    "results": ("model", "data", "split", "shots", "test", "scheme", "item", "gold", "pred", "pred_norm", "scores"),
    "sweep_runs": (
        "id",
        "model",
        "data",
        "split",
        "shots",
        "test",
        "items_hash",
        "n_items",
        "labels",
        "item_index",
        "arch",
        "n_layers",
        "baseline_acc",
        "baseline_acc_norm",
        "baseline_preds",
        "created",
    ),
    "sweep_groups": ("run_id", "context", "outs", "metrics", "acc", "preds", "seconds"),
    "sweep_shards": ("run_id", "shard", "shape", "preds", "seconds"),
}
_CELLS = [(t, c) for t, cols in _COLUMNS.items() for c in cols]
_TRICKY = [
    "[]",
    "[1, 2, 3]",
    '["acc"]',
    '["acc", "acc_norm"]',
    '[""]',
    "[" * 5000,
    '{"a": 1}',
    "[1e999]",
    "null",
    "[-1]",
    "[0, 0, 0, 0, 0, 0, 0, 0]",
    '["x"]',
    "[2, 3, 8]",
    "[100000000000]",
    "enc=mean,layer=-1,word=mean",
    "out_layer=-1,out_word=mean",
    "decoder",
    "encoder",
    "acc",
    "",
    0,
    1,
    2,
    3,
    7,
    10**12,
    3 * 10**8,
    -5,
    2**63 - 1,
    -(2**63),
    0.5,
    -0.0,
    1e300,
    float("nan"),
    float("inf"),
    b"",
    b"\x01",
    b"\xff" * 12,
    b"\x00" * 6,
]


def _value_strategy() -> Any:
    from hypothesis import strategies as st

    return st.one_of(
        st.sampled_from(_TRICKY),
        st.none(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(),
        st.text(max_size=24),
        st.binary(max_size=40),
    )


def _changes() -> Any:
    """Hypothesis: 1 to 3 ``(table, column, first row only, value)`` changes."""
    from hypothesis import strategies as st

    return st.lists(st.tuples(st.sampled_from(_CELLS), st.booleans(), _value_strategy()), min_size=1, max_size=3)


def _fuzz(examples: int) -> Any:
    """Bounded, reproducible hypothesis settings (a fixed derandomized run of ``examples`` cases)."""
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=examples, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
    )


def test_fuzz_database_contents_never_an_internal_error(template, tmp_path_factory, monkeypatch):
    """Any value in any column of a valid walklens database: ``report`` and ``hellaswag export`` (CSV and
    Parquet) give a result or one error line, never an internal error.  The report's HTML build is replaced by
    a stand-in that walks the summaries (it is slow; what reaches it has been read and checked, and the real
    build runs in test_a_valid_edge_database_still_reports)."""
    import contextlib
    import io

    from hypothesis import given
    from hypothesis import strategies as st

    import walklens.lab.reports.sweep as sweep_report
    from walklens.base.outputs import jsonable

    class Stub:
        def __init__(self, summaries: Any, source: str) -> None:
            self.data = jsonable(summaries)

        def save(self, out: Any) -> Path:
            return Path(out) / "index.html"

    monkeypatch.setattr(sweep_report, "build", Stub)

    @_fuzz(20)
    @given(_changes(), st.sampled_from(["runs", "results"]), st.sampled_from(["csv", "parquet"]))
    def check(changes: list[Any], table: str, ext: str) -> None:
        d = tmp_path_factory.mktemp("fuzz")
        db = _mutated(template, d / "f.sqlite", [(t, c, first, v) for (t, c), first, v in changes])
        for argv in (
            ["report", "--db", str(db), "--out", str(d / "out")],
            ["hellaswag", "export", str(d / f"x.{ext}"), "--db", str(db), "--table", table],
        ):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = main(argv)
            assert code in (0, 2) and "internal error" not in err.getvalue(), (changes, argv, err.getvalue())
            assert code == 0 or len(err.getvalue().strip().splitlines()) == 1, err.getvalue()

    check()


def test_fuzz_database_contents_never_a_500_in_the_explorer(template, tiny, tmp_path_factory):
    """Any value in any column of a valid walklens database: the explorer's sweeps endpoints answer 200 or a
    4xx with a one-line error, never a 500."""
    from hypothesis import given

    @_fuzz(15)
    @given(_changes())
    def check(changes: list[Any]) -> None:
        db = _mutated(
            template, tmp_path_factory.mktemp("fuzz") / "f.sqlite", [(t, c, first, v) for (t, c), first, v in changes]
        )
        for status, body in _explorer_statuses(tiny, db):
            assert status < 500, (changes, status, body)

    check()
