"""A walklens database is recognised by its own ``meta`` table (any other SQLite file is refused in one line,
nothing created in it), and every value read from one is validated before it sizes anything: a bad value is
one line naming the table, row and field (exit 2; a 400 in the explorer), never an internal error."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from walklens.cli import main
from walklens.errors import InputError


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


FOREIGN = {"no meta": "CREATE TABLE foo (x INTEGER)",
           "a meta of its own": "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)",
           "a meta of another layout": "CREATE TABLE meta (a INTEGER, b BLOB)"}


@pytest.mark.parametrize("kind", FOREIGN)
@pytest.mark.parametrize("argv", [["hellaswag", "baseline", "--no-progress", "--db", "{db}", "--data", "{data}"],
                                  ["sweep", "--test", "2", "--db", "{db}", "--data", "{data}"],
                                  ["report", "--db", "{db}", "--out", "{out}"],
                                  ["hellaswag", "export", "{out}/x.csv", "--db", "{db}"],
                                  ["serve", "--db", "{db}", "--port", "0"]])
def test_foreign_sqlite_file_refused_untouched(kind, argv, tmp_path, capsys, monkeypatch):
    import walklens.loading as loading

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
    from walklens.concepts.store import ResultStore, SweepStore

    for store, other in ((ResultStore, SweepStore), (SweepStore, ResultStore)):
        path = tmp_path / f"{store.__name__}.sqlite"
        store(path).close()  # a database holding only one store's tables is a walklens database
        other(path).close()
        other(path, readonly=True).close()
    empty = tmp_path / "empty.sqlite"
    empty.touch()  # a file with no table is a new database
    ResultStore(empty).close()


def test_concept_cache_refuses_a_foreign_index_untouched(tmp_path):
    from walklens.concept_cache import ConceptCache

    for kind, ddl in FOREIGN.items():
        root = tmp_path / kind.replace(" ", "_")
        root.mkdir()
        before = _foreign(root / "index.sqlite", ddl)
        with pytest.raises(InputError, match="not a concept-cache index: an SQLite database of something else"):
            ConceptCache(root)
        assert (root / "index.sqlite").read_bytes() == before
