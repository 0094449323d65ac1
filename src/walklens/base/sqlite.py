"""The SQLite plumbing shared by every walklens file that is an SQLite database: the walklens database
(:mod:`walklens.lab.hellaswag.store`) and the concept cache's index (:mod:`walklens.analyses.concepts.cache`).

* :func:`connect`: a connection with explicit transactions (``isolation_level=None``) and ``busy_timeout``, so
  that a second writer waits for the first instead of failing with "database is locked";
* :func:`quick_check` (a damaged page), :func:`set_mode` (writers: WAL journal, ``synchronous=NORMAL``;
  readers: ``query_only``);
* :func:`transaction`: ``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back when the block raises;
* :func:`closed_on_error`: the connection closed when opening fails, a database error phrased by the caller;
* :class:`ClosedOnExit`: a store as its own context manager (``with`` closes it);
* :func:`tables`, :func:`meta_value`, :func:`schema_version` and :func:`create_tables`: the ``meta`` table
  (``key TEXT PRIMARY KEY, value TEXT``) in which each owner of a set of tables records their schema version;
* :func:`foreign`: a file is recognised by its own ``meta`` table: one that holds tables but no ``meta`` naming
  one of its owners is another application's database, refused before anything is read or created in it.

Nothing here phrases an error for the user: callers know which file they opened and turn ``sqlite3`` errors
into their own one-line :class:`~walklens.base.errors.InputError`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from .errors import InputError

META = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"


def connect(target: str | Path, *, timeout: float = 60.0, uri: bool = False) -> sqlite3.Connection:
    """``sqlite3.connect(target)`` in autocommit mode (every write goes through :func:`transaction`) with a
    ``busy_timeout`` of ``timeout`` seconds.  Raises ``sqlite3.Error`` when the file cannot be opened."""
    conn = sqlite3.connect(str(target), uri=uri, timeout=timeout, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
    except BaseException:
        conn.close()
        raise
    return conn


def quick_check(conn: sqlite3.Connection, limit: int = 3) -> list[str]:
    """What ``PRAGMA quick_check`` finds wrong (at most ``limit`` lines, each on one line); empty when the file
    is sound.  Raises ``sqlite3.DatabaseError`` for a file that is not SQLite at all."""
    found = [str(r[0]) for r in conn.execute(f"PRAGMA quick_check({int(limit)})").fetchall()]
    return [] if found == ["ok"] else [c.replace("\n", " ") for c in found]


def set_mode(conn: sqlite3.Connection, *, readonly: bool) -> None:
    """Readers: ``query_only`` (nothing written, not even the journal mode).  Writers: the WAL journal (readers
    never block a writer) and ``synchronous=NORMAL``."""
    if readonly:
        conn.execute("PRAGMA query_only=ON")
    else:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")


class ClosedOnExit:
    """A store that is its own context manager: ``with Store(...) as s:`` calls its :meth:`close` on exit."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


@contextmanager
def closed_on_error(conn: sqlite3.Connection, refuse: Callable[[sqlite3.DatabaseError], str]) -> Iterator[None]:
    """Close ``conn`` when the block raises; a ``sqlite3.DatabaseError`` becomes one :class:`InputError` line,
    ``refuse(error)`` (the caller names the file), anything else propagates as it is."""
    try:
        yield
    except sqlite3.DatabaseError as e:
        conn.close()
        raise InputError(refuse(e)) from None
    except BaseException:
        conn.close()
        raise


def tables(conn: sqlite3.Connection) -> set[str]:
    """Names of the tables in a database."""
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def meta_value(conn: sqlite3.Connection, key: str) -> str | None:
    """The value recorded under ``key`` in ``meta`` (None when there is no ``meta`` table or no such key)."""
    if "meta" not in tables(conn):
        return None
    row = conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
    return None if row is None else str(row[0])


def schema_version(conn: sqlite3.Connection, key: str) -> int | None:
    """The schema version recorded under ``key`` in ``meta``: None when none is, -1 when it is not a number."""
    value = meta_value(conn, key)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return -1


def foreign(conn: sqlite3.Connection, keys: Sequence[str]) -> str | None:
    """Why the database is not one whose owners record their schema under ``keys`` in ``meta`` (a phrase for
    the caller's one-line refusal), or None: it is one, or it holds no table yet (a new file)."""
    names = tables(conn)
    if not names:
        return None
    shown = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
    if "meta" not in names:
        return f"an SQLite database of something else (tables {shown}; no meta table)"
    try:
        found = [k for k in keys if conn.execute("SELECT 1 FROM meta WHERE key=?", (k,)).fetchone()]
    except sqlite3.OperationalError:  # a meta table of another layout
        found = []
    if not found:
        return f"an SQLite database of something else (its meta table records none of {', '.join(keys)})"
    return None


def create_tables(conn: sqlite3.Connection, ddl: Sequence[str], *, key: str, version: int) -> None:
    """In one transaction: create ``meta`` and the tables of ``ddl`` (``CREATE … IF NOT EXISTS``) and record
    ``version`` under ``key`` unless a version is recorded there already."""
    with transaction(conn):
        conn.execute(META)
        for stmt in ddl:
            conn.execute(stmt)
        conn.execute("INSERT OR IGNORE INTO meta VALUES (?, ?)", (key, str(version)))


__all__ = [
    "META",
    "closed_on_error",
    "connect",
    "create_tables",
    "foreign",
    "meta_value",
    "quick_check",
    "schema_version",
    "set_mode",
    "tables",
    "transaction",
]
