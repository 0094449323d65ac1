"""The walklens database file's policy over :mod:`walklens.base.sqlite`: opening it with an integrity check (one
:class:`InputError` line naming the file for each way it can be unusable) and the schema version of the tables
each store owns.

Each store records its own schema version in the ``meta`` table (``schema`` for :class:`~.results.ResultStore`,
``sweep_schema`` for :class:`~.sweeps.SweepStore`), so the two sets of tables can change independently.  A
database written by a newer walklens (a higher version) is refused with one line before anything is read or
written; a database without a recorded version holds the first layout, which is the current one.

Every value read from the file is checked by a :class:`Row` before it sizes anything (an allocation, a reshape,
a loop): SQLite keeps any value in any column, so a count, a blob's length or a JSON text may be anything.  A
bad value is one :class:`InputError` line naming the file, the table, the row and the field.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, overload

from ....base.errors import InputError
from ....base.sqlite import closed_on_error, create_tables, foreign, quick_check, schema_version, set_mode
from ....base.sqlite import connect as sqlite_connect

#: What to do about a damaged file (the end of every refusal of one).
FIX = "restore it or start a new database"
#: The ``meta`` keys by which a walklens database is recognised (the stores' schema versions).
OWNER_KEYS = ("schema", "sweep_schema")


def connect(path: Path, *, timeout: float = 60.0, readonly: bool = False) -> sqlite3.Connection:
    """Open a walklens SQLite file (shared by :class:`~.results.ResultStore` and :class:`~.sweeps.SweepStore`).

    Refuses, with one :class:`InputError` naming the file, a path that is not a regular file, a missing file
    when ``readonly`` (reading commands never create a database), a file that is not SQLite, and a database
    that fails ``PRAGMA quick_check`` (a damaged page), so nothing is computed on top of a broken file, and an
    SQLite file of another application (:func:`walklens.base.sqlite.foreign`: no ``meta`` table naming a walklens
    store), so nothing is ever created in it.
    Writers get WAL mode, ``busy_timeout`` and ``synchronous=NORMAL``; readers get ``query_only``
    (:func:`walklens.base.sqlite.set_mode`).
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
        conn = sqlite_connect(uri, uri=True, timeout=timeout)
    except sqlite3.Error as e:
        raise InputError(f"{path}: cannot open the database ({e})") from None
    conn.text_factory = _text
    try:
        problems = quick_check(conn)
        if problems:
            raise InputError(f"{path} is corrupted (quick_check: {'; '.join(problems)}); {FIX}")
        other = foreign(conn, OWNER_KEYS)
        if other:
            raise InputError(f"{path}: not a walklens database: {other}; give another --db")
        set_mode(conn, readonly=readonly)
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


class StoreTables(NamedTuple):
    """One store's tables: ``what`` they hold, the ``meta`` ``key`` of their schema ``version``, their ``ddl``,
    and what a database that fails to open is called (``not a usable {unusable}``)."""

    what: str
    key: str
    version: int
    ddl: Sequence[str]
    unusable: str


def open_store(path: Path, tables: StoreTables, *, timeout: float, readonly: bool) -> sqlite3.Connection:
    """:func:`connect` and :func:`open_tables` for one store's ``tables``: on a database error the connection is
    closed and the error is one line, ``{path}: not a usable {tables.unusable} (error); `` and :data:`FIX`."""
    conn = connect(path, timeout=timeout, readonly=readonly)
    with closed_on_error(conn, lambda e: f"{path}: not a usable {tables.unusable} ({e}); {FIX}"):
        open_tables(
            conn, path, what=tables.what, key=tables.key, version=tables.version, ddl=tables.ddl, readonly=readonly
        )
    return conn


def open_tables(
    conn: sqlite3.Connection, path: Path, *, what: str, key: str, version: int, ddl: Sequence[str], readonly: bool
) -> None:
    """Check the schema version of one store's tables and, unless ``readonly``, create them (``ddl``) and
    record ``version`` under ``key``, in one transaction (:func:`walklens.base.sqlite.create_tables`).

    A database whose recorded version is not ``version`` is refused with one line naming the file, before
    anything is created: a newer one was written by a newer walklens.
    """
    found = schema_version(conn, key)
    if found == -1:
        raise InputError(f"{path}: table meta, row key={key!r}, field value: not a schema version (an integer); {FIX}")
    if found is not None and found != version:
        if found > version:
            raise InputError(
                f"{path}: its {what} tables have schema version {found}, newer than this walklens "
                f"reads ({version}); open it with a newer walklens or use another database"
            )
        raise InputError(
            f"{path}: its {what} tables have schema version {found}, which this walklens does not "
            f"read (it reads {version}); use another database"
        )
    if not readonly:
        create_tables(conn, ddl, key=key, version=version)


def _text(data: bytes) -> str:
    """A TEXT value as read: undecodable bytes kept as lone surrogates, so that the :class:`Row` that reads it names
    its table, row and field (SQLite stores any bytes in a TEXT column; sqlite3 would raise mid-query)."""
    return data.decode("utf-8", "surrogateescape")


def _utf8(v: str) -> bool:
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


#: Largest JSON text read from a database (an item index of a million items is about 7 MB).
MAX_JSON_CHARS = 64 * 2**20


class Row:
    """The checked values of one row of ``table`` in the database ``path``; ``row`` names it in messages
    (``id=3``, ``rowid=12``).  Each reader returns the value, or raises one :class:`InputError` line."""

    def __init__(self, path: Path | str, table: str, row: str) -> None:
        self.where = f"{path}: table {table}, row {row}"

    def fail(self, field: str, why: str) -> InputError:
        return InputError(f"{self.where}, field {field}: {why}; {FIX}")

    def integer(self, field: str, v: Any, lo: int, hi: int) -> int:
        """An integer ``lo <= v <= hi``."""
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise self.fail(field, f"{_show(v)} is not an integer from {lo:,} to {hi:,}")
        return v

    @overload
    def real(self, field: str, v: Any, lo: float, hi: float, null: Literal[False] = False) -> float: ...

    @overload
    def real(self, field: str, v: Any, lo: float, hi: float, null: bool) -> float | None: ...

    def real(self, field: str, v: Any, lo: float, hi: float, null: bool = False) -> float | None:
        """A finite number ``lo <= v <= hi`` (None too when ``null``)."""
        if v is None and null:
            return None
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not (math.isfinite(v) and lo <= v <= hi):
            raise self.fail(field, f"{_show(v)} is not a number from {lo:g} to {hi:g}")
        return float(v)

    def text(self, field: str, v: Any) -> str:
        """A text of UTF-8 (undecodable bytes are refused)."""
        if not isinstance(v, str):
            raise self.fail(field, f"{_show(v)} is not text")
        if not _utf8(v):
            raise self.fail(field, f"{_show(v)} is not UTF-8 text")
        return v

    def blob(self, field: str, v: Any, size: int) -> bytes:
        """A blob of exactly ``size`` bytes."""
        if not isinstance(v, bytes):
            raise self.fail(field, f"{_show(v)} is not a blob")
        if len(v) != size:
            raise self.fail(field, f"a blob of {len(v):,} bytes, not the {size:,} the row's sizes give")
        return v

    def json(self, field: str, v: Any, ok: Callable[[Any], bool], what: str) -> Any:
        """A JSON text whose value passes ``ok`` (``what`` says what it must be)."""
        if not isinstance(v, str) or len(v) > MAX_JSON_CHARS:
            raise self.fail(field, f"{_show(v)} is not a JSON text of at most {MAX_JSON_CHARS:,} characters")
        if not _utf8(v):
            raise self.fail(field, f"{_show(v)} is not UTF-8 text")
        try:
            doc = json.loads(v)
        except (ValueError, RecursionError):
            raise self.fail(field, f"{_show(v)} is not valid JSON") from None
        try:
            good = ok(doc)
        except (TypeError, ValueError, OverflowError):
            good = False
        if not good:
            raise self.fail(field, f"{_show(v)} is not {what}")
        return doc


def _show(v: Any, limit: int = 40) -> str:
    """A value read from the file, short and on one line, for a message."""
    if isinstance(v, bytes):
        return f"a blob of {len(v):,} bytes"
    text = repr(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def int_list(doc: Any, n: int | None = None, lo: int = 0, hi: int = 2**63 - 1) -> bool:
    """Whether ``doc`` is a list (of ``n`` items when given) of integers ``lo <= x <= hi``."""
    return (
        isinstance(doc, list)
        and (n is None or len(doc) == n)
        and all(isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi for x in doc)
    )


def str_list(doc: Any, min_len: int = 0) -> bool:
    """Whether ``doc`` is a list of at least ``min_len`` strings of UTF-8 (a JSON ``"\\ud800"`` is none)."""
    return isinstance(doc, list) and len(doc) >= min_len and all(isinstance(x, str) and _utf8(x) for x in doc)
