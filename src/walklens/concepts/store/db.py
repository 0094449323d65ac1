"""The SQLite plumbing shared by the stores of one walklens database file: opening it with an integrity check,
write transactions, and the schema version of the tables each store owns.

Each store records its own schema version in the ``meta`` table (``schema`` for :class:`~.results.ResultStore`,
``sweep_schema`` for :class:`~.sweeps.SweepStore`), so the two sets of tables can change independently.  A
database written by a newer walklens (a higher version) is refused with one line before anything is read or
written; a database without a recorded version holds the first layout, which is the current one.
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from ...errors import InputError

#: What to do about a damaged file (the end of every refusal of one).
FIX = "restore it or start a new database"
_META = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"


def tables(conn: sqlite3.Connection) -> set[str]:
    """Names of the tables in a database."""
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def connect(path: Path, *, timeout: float = 60.0, readonly: bool = False) -> sqlite3.Connection:
    """Open a walklens SQLite file (shared by :class:`~.results.ResultStore` and :class:`~.sweeps.SweepStore`).

    Refuses, with one :class:`InputError` naming the file, a path that is not a regular file, a missing file
    when ``readonly`` (reading commands never create a database), a file that is not SQLite, and a database
    that fails ``PRAGMA quick_check`` (a damaged page), so nothing is computed on top of a broken file.
    Writers get WAL mode, ``busy_timeout`` and ``synchronous=NORMAL``; readers get ``query_only``.
    """
    if str(path) == ":memory:":
        return sqlite3.connect(":memory:", isolation_level=None)
    if path.exists() and not path.is_file():
        raise InputError(f"{path}: not a regular file")
    if readonly and not path.exists():
        raise InputError(f"{path}: no such database")
    if not readonly:
        path.parent.mkdir(parents=True, exist_ok=True)
    uri = path.resolve().as_uri() + ("?mode=rw" if readonly else "?mode=rwc")
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None)
    except sqlite3.Error as e:
        raise InputError(f"{path}: cannot open the database ({e})") from None
    try:
        conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
        check = [str(r[0]) for r in conn.execute("PRAGMA quick_check(3)").fetchall()]
        if check != ["ok"]:
            detail = "; ".join(c.replace("\n", " ") for c in check)
            raise InputError(f"{path} is corrupted (quick_check: {detail}); {FIX}")
        if readonly:
            conn.execute("PRAGMA query_only=ON")
        else:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
    except sqlite3.OperationalError as e:  # locked, unreadable: the file may well be fine
        conn.close()
        raise InputError(f"{path}: cannot use the database ({e})") from None
    except sqlite3.DatabaseError as e:  # "file is not a database", "database disk image is malformed"
        conn.close()
        raise InputError(f"{path}: not a usable SQLite database ({e}); {FIX}") from None
    except BaseException:
        conn.close()
        raise
    return conn


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A write transaction: ``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back when the block raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def schema_version(conn: sqlite3.Connection, key: str) -> int | None:
    """The schema version recorded under ``key`` in ``meta`` (None when none is)."""
    if "meta" not in tables(conn):
        return None
    row = conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
    if row is None:
        return None
    try:
        return int(row[0])
    except ValueError:
        return -1  # not a number: refused by open_tables as not this walklens's


def open_tables(conn: sqlite3.Connection, path: Path, *, what: str, key: str, version: int, ddl: Sequence[str],
                readonly: bool) -> None:
    """Check the schema version of one store's tables and, unless ``readonly``, create them (``ddl``) and
    record ``version`` under ``key``, in one transaction.

    A database whose recorded version is not ``version`` is refused with one line naming the file, before
    anything is created: a newer one was written by a newer walklens.
    """
    found = schema_version(conn, key)
    if found is not None and found != version:
        if found > version:
            raise InputError(f"{path}: its {what} tables have schema version {found}, newer than this walklens "
                             f"reads ({version}); open it with a newer walklens or use another database")
        raise InputError(f"{path}: its {what} tables have schema version {found}, which this walklens does not "
                         f"read (it reads {version}); use another database")
    if readonly:
        return
    with transaction(conn):
        conn.execute(_META)
        for stmt in ddl:
            conn.execute(stmt)
        conn.execute("INSERT OR IGNORE INTO meta VALUES (?, ?)", (key, str(version)))
