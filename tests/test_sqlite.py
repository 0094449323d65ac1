"""walklens.base.sqlite, the SQLite plumbing of the result store and the concept cache: a transaction commits or rolls
back as a whole, a second writer waits for the first under ``busy_timeout`` (and fails at once without it), and
the ``meta`` table records each owner's schema version once."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from walklens.base.errors import InputError
from walklens.base.sqlite import (
    closed_on_error,
    connect,
    create_tables,
    meta_value,
    quick_check,
    schema_version,
    set_mode,
    tables,
    transaction,
)

DDL = ("CREATE TABLE IF NOT EXISTS t (x INTEGER)",)


def rows(path: Path) -> list[int]:
    """The rows of ``t`` as another connection sees them (only what was committed)."""
    with sqlite3.connect(path) as other:
        return [r[0] for r in other.execute("SELECT x FROM t ORDER BY x")]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "db.sqlite"
    conn = connect(path, timeout=5.0)
    set_mode(conn, readonly=False)
    create_tables(conn, DDL, key="t_schema", version=1)
    conn.close()
    return path


def test_a_transaction_commits_when_the_block_ends(db: Path) -> None:
    conn = connect(db)
    with transaction(conn) as c:
        assert c is conn and conn.in_transaction
        c.execute("INSERT INTO t VALUES (1)")
        c.execute("INSERT INTO t VALUES (2)")
        assert rows(db) == []  # not visible to others before COMMIT
    assert not conn.in_transaction and rows(db) == [1, 2]


@pytest.mark.parametrize("error", [ValueError("boom"), KeyboardInterrupt()])
def test_a_transaction_rolls_back_when_the_block_raises(db: Path, error: BaseException) -> None:
    conn = connect(db)
    with transaction(conn) as c:
        c.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(type(error)):
        with transaction(conn) as c:
            c.execute("INSERT INTO t VALUES (2)")
            c.execute("INSERT INTO t VALUES (3)")
            raise error
    assert not conn.in_transaction and rows(db) == [1]
    with transaction(conn) as c:  # the connection is usable again
        c.execute("INSERT INTO t VALUES (4)")
    assert rows(db) == [1, 4]


def test_a_transaction_the_database_ended_itself_is_not_rolled_back_twice(db: Path) -> None:
    """A statement error that SQLite answers with its own rollback leaves no transaction to roll back: the
    block's error is what propagates, not "cannot rollback - no transaction is active"."""
    conn = connect(db)
    with pytest.raises(RuntimeError, match="after the rollback"):
        with transaction(conn) as c:
            c.execute("INSERT INTO t VALUES (5)")
            c.execute("ROLLBACK")
            raise RuntimeError("after the rollback")
    assert rows(db) == []


def _hold_the_write_lock(path: Path, locked: threading.Event, waiter_started: threading.Event, done: list[str]) -> None:
    conn = connect(path, timeout=5.0)
    with transaction(conn) as c:
        c.execute("INSERT INTO t VALUES (1)")
        locked.set()
        waiter_started.wait(30)
        time.sleep(0.3)  # let the waiter reach the lock (not a timing assertion: the test holds either way)
        done.append("holder")
    conn.close()


def test_a_second_writer_waits_under_busy_timeout(db: Path) -> None:
    locked, waiter_started, done = threading.Event(), threading.Event(), []
    holder = threading.Thread(target=_hold_the_write_lock, args=(db, locked, waiter_started, done))
    holder.start()
    try:
        assert locked.wait(30)
        conn = connect(db, timeout=30.0)
        conn.set_trace_callback(lambda sql: waiter_started.set() if sql == "BEGIN IMMEDIATE" else None)
        with transaction(conn) as c:  # blocks until the holder commits, then goes on
            done.append("waiter")
            c.execute("INSERT INTO t VALUES (2)")
        conn.close()
    finally:
        waiter_started.set()
        holder.join(30)
    assert done == ["holder", "waiter"] and rows(db) == [1, 2]


def test_without_a_busy_timeout_the_second_writer_fails_at_once(db: Path) -> None:
    """The counterpart of the test above: the lock really is held, and the wait is busy_timeout's doing."""
    holder = connect(db, timeout=5.0)
    with transaction(holder) as c:
        c.execute("INSERT INTO t VALUES (1)")
        impatient = connect(db, timeout=0.0)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            with transaction(impatient):
                pass
        assert not impatient.in_transaction
        impatient.close()
    assert rows(db) == [1]


def test_the_meta_table_records_each_owners_schema_version_once(tmp_path: Path) -> None:
    conn = connect(tmp_path / "m.sqlite")
    assert tables(conn) == set() and meta_value(conn, "a") is None and schema_version(conn, "a") is None
    create_tables(conn, DDL, key="a", version=3)
    create_tables(conn, (), key="b", version=1)
    create_tables(conn, DDL, key="a", version=4)  # a version already recorded is kept
    assert tables(conn) == {"meta", "t"}
    assert (meta_value(conn, "a"), schema_version(conn, "a"), schema_version(conn, "b")) == ("3", 3, 1)
    assert schema_version(conn, "c") is None
    conn.execute("UPDATE meta SET value='x' WHERE key='b'")
    assert schema_version(conn, "b") == -1  # not a number: no version this walklens reads


def test_modes_and_quick_check(db: Path, tmp_path: Path) -> None:
    writer = connect(db)
    set_mode(writer, readonly=False)
    assert writer.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert writer.execute("PRAGMA busy_timeout").fetchone()[0] == 60000
    assert quick_check(writer) == []
    reader = connect(db, timeout=2.5)
    set_mode(reader, readonly=True)
    assert reader.execute("PRAGMA busy_timeout").fetchone()[0] == 2500
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader.execute("INSERT INTO t VALUES (9)")
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database at all" * 100)
    with pytest.raises(sqlite3.DatabaseError, match="not a database"):
        quick_check(connect(garbage))


def test_closed_on_error_phrases_database_errors_and_closes(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database at all" * 100)
    conn = connect(garbage)
    with pytest.raises(InputError, match=r"^garbage: file is not a database$"):
        with closed_on_error(conn, lambda e: f"garbage: {e}"):
            tables(conn)
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        conn.execute("SELECT 1")
    conn = connect(tmp_path / "fine.sqlite")
    with pytest.raises(KeyError):  # not a database error: propagates as it is, the connection closed all the same
        with closed_on_error(conn, lambda e: "unused"):
            raise KeyError("x")
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        conn.execute("SELECT 1")
    conn = connect(tmp_path / "fine.sqlite")
    with closed_on_error(conn, lambda e: "unused"):
        tables(conn)
    assert conn.execute("SELECT 1").fetchone() == (1,)  # left open when nothing went wrong
