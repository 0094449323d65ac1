"""The walklens database file's policy over :mod:`walklens.sqlite`: opening it with an integrity check (one
:class:`InputError` line naming the file for each way it can be unusable) and the schema version of the tables
each store owns.

Each store records its own schema version in the ``meta`` table (``schema`` for :class:`~.results.ResultStore`,
``sweep_schema`` for :class:`~.sweeps.SweepStore`), so the two sets of tables can change independently.  A
database written by a newer walklens (a higher version) is refused with one line before anything is read or
written; a database without a recorded version holds the first layout, which is the current one.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Sequence

from ... import sqlite
from ...errors import InputError

#: What to do about a damaged file (the end of every refusal of one).
FIX = "restore it or start a new database"
#: The ``meta`` keys by which a walklens database is recognised (the stores' schema versions).
OWNER_KEYS = ("schema", "sweep_schema")


def connect(path: Path, *, timeout: float = 60.0, readonly: bool = False) -> sqlite3.Connection:
    """Open a walklens SQLite file (shared by :class:`~.results.ResultStore` and :class:`~.sweeps.SweepStore`).

    Refuses, with one :class:`InputError` naming the file, a path that is not a regular file, a missing file
    when ``readonly`` (reading commands never create a database), a file that is not SQLite, and a database
    that fails ``PRAGMA quick_check`` (a damaged page), so nothing is computed on top of a broken file, and an
    SQLite file of another application (:func:`walklens.sqlite.foreign`: no ``meta`` table naming a walklens
    store), so nothing is ever created in it.
    Writers get WAL mode, ``busy_timeout`` and ``synchronous=NORMAL``; readers get ``query_only``
    (:func:`walklens.sqlite.set_mode`).
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
        conn = sqlite.connect(uri, uri=True, timeout=timeout)
    except sqlite3.Error as e:
        raise InputError(f"{path}: cannot open the database ({e})") from None
    try:
        problems = sqlite.quick_check(conn)
        if problems:
            raise InputError(f"{path} is corrupted (quick_check: {'; '.join(problems)}); {FIX}")
        other = sqlite.foreign(conn, OWNER_KEYS)
        if other:
            raise InputError(f"{path}: not a walklens database: {other}; give another --db")
        sqlite.set_mode(conn, readonly=readonly)
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


def open_tables(conn: sqlite3.Connection, path: Path, *, what: str, key: str, version: int, ddl: Sequence[str],
                readonly: bool) -> None:
    """Check the schema version of one store's tables and, unless ``readonly``, create them (``ddl``) and
    record ``version`` under ``key``, in one transaction (:func:`walklens.sqlite.create_tables`).

    A database whose recorded version is not ``version`` is refused with one line naming the file, before
    anything is created: a newer one was written by a newer walklens.
    """
    found = sqlite.schema_version(conn, key)
    if found is not None and found != version:
        if found > version:
            raise InputError(f"{path}: its {what} tables have schema version {found}, newer than this walklens "
                             f"reads ({version}); open it with a newer walklens or use another database")
        raise InputError(f"{path}: its {what} tables have schema version {found}, which this walklens does not "
                         f"read (it reads {version}); use another database")
    if not readonly:
        sqlite.create_tables(conn, ddl, key=key, version=version)
