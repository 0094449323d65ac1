"""An embedded SQLite store for HellaSwag runs and per-item results, with resume and CSV/Parquet export.

Layout (one file; WAL journal so readers never block a writer and two writers wait for each other instead of
corrupting the file; every write is one ``BEGIN IMMEDIATE`` transaction):

* ``runs``: one row per (model, data, split, shots, test, scheme) with the latest summary: ``n``, ``acc``,
  ``acc_norm`` and ``created``/``updated`` timestamps (UTC, ISO 8601);
* ``results``: one row per (model, data, split, shots, test, scheme, item): the gold index, the ending picked by
  ``acc`` and by ``acc_norm``, and the four scores (log-likelihoods for the baseline and Test 1, similarities for
  Test 2) as a JSON list.  Rows are written with ``INSERT OR IGNORE``: a resumed run skips stored items and can
  never duplicate or overwrite one.

``test`` is ``baseline``, ``test1`` or ``test2``; ``scheme`` is ``str(Scheme)`` (``baseline`` for the baseline).
The default file is ``platformdirs.user_data_dir("walklens")/results.sqlite``, or ``$WALKLENS_DB``.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from ..errors import InputError, MissingDependencyError
from ..outputs import atomic_open, check_file

SCHEMA_VERSION = 1
KEY_COLUMNS: tuple[str, ...] = ("model", "data", "split", "shots", "test", "scheme")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    model TEXT NOT NULL, data TEXT NOT NULL, split TEXT NOT NULL, shots INTEGER NOT NULL,
    test TEXT NOT NULL, scheme TEXT NOT NULL,
    n INTEGER, acc REAL, acc_norm REAL,
    created TEXT NOT NULL, updated TEXT NOT NULL,
    PRIMARY KEY (model, data, split, shots, test, scheme)
);
CREATE TABLE IF NOT EXISTS results (
    model TEXT NOT NULL, data TEXT NOT NULL, split TEXT NOT NULL, shots INTEGER NOT NULL,
    test TEXT NOT NULL, scheme TEXT NOT NULL, item INTEGER NOT NULL,
    gold INTEGER NOT NULL, pred INTEGER NOT NULL, pred_norm INTEGER NOT NULL, scores TEXT NOT NULL,
    PRIMARY KEY (model, data, split, shots, test, scheme, item)
) WITHOUT ROWID;
"""


def default_db_path() -> Path:
    """``$WALKLENS_DB``, else ``<user data dir>/walklens/results.sqlite``."""
    env = os.environ.get("WALKLENS_DB")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("walklens")) / "results.sqlite"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def tables(conn: sqlite3.Connection) -> set[str]:
    """Names of the tables in a database."""
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def connect(path: Path, *, timeout: float = 60.0, readonly: bool = False) -> sqlite3.Connection:
    """Open a walklens SQLite file (shared by :class:`ResultStore` and :class:`~.sweep.SweepStore`).

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
    fix = "restore it or start a new database"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None)
    except sqlite3.Error as e:
        raise InputError(f"{path}: cannot open the database ({e})") from None
    try:
        conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
        check = [str(r[0]) for r in conn.execute("PRAGMA quick_check(3)").fetchall()]
        if check != ["ok"]:
            detail = "; ".join(c.replace("\n", " ") for c in check)
            raise InputError(f"{path} is corrupted (quick_check: {detail}); {fix}")
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
        raise InputError(f"{path}: not a usable SQLite database ({e}); {fix}") from None
    except BaseException:
        conn.close()
        raise
    return conn


@dataclass(frozen=True)
class RunKey:
    """What identifies a run: model, data source id, split, shot count, test and scheme string."""

    model: str
    data: str
    split: str
    shots: int
    test: str
    scheme: str

    def values(self) -> tuple[Any, ...]:
        return (self.model, self.data, self.split, int(self.shots), self.test, self.scheme)


@dataclass(frozen=True)
class ItemResult:
    """One item's outcome: gold index, pick by ``acc`` (max score) and ``acc_norm`` (max score per character;
    the same as ``pred`` for Test 2), and the four scores."""

    item: int
    gold: int
    pred: int
    pred_norm: int
    scores: tuple[float, ...]


class ResultStore:
    """SQLite store of runs and per-item results (WAL mode, transactions, ``INSERT OR IGNORE`` resume)."""

    def __init__(self, path: str | os.PathLike[str] | None = None, timeout: float = 60.0,
                 readonly: bool = False) -> None:
        """Open (and create, unless ``readonly``) the database; ``readonly`` refuses a missing file and never
        writes (no schema, no journal-mode change)."""
        self.path = Path(path).expanduser() if path is not None else default_db_path()
        self._conn = connect(self.path, timeout=timeout, readonly=readonly)
        try:
            if not readonly:
                with self.transaction():
                    for stmt in _SCHEMA.strip().split(";"):
                        if stmt.strip():
                            self._conn.execute(stmt)
                    if self._conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone() is None:
                        self._conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            if "meta" in tables(self._conn):
                row = self._conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
                if row is not None and int(row[0]) != SCHEMA_VERSION:
                    raise InputError(f"{self.path}: results database schema {row[0]}, this walklens reads "
                                     f"{SCHEMA_VERSION}")
        except sqlite3.DatabaseError as e:
            self._conn.close()
            raise InputError(f"{self.path}: not a usable results database ({e})") from None
        except BaseException:
            self._conn.close()
            raise

    # ---- plumbing ------------------------------------------------------------------------------------------
    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    class _Tx:
        def __init__(self, conn: sqlite3.Connection) -> None:
            self.conn = conn

        def __enter__(self) -> sqlite3.Connection:
            self.conn.execute("BEGIN IMMEDIATE")
            return self.conn

        def __exit__(self, et: type | None, *rest: object) -> None:
            self.conn.execute("COMMIT" if et is None else "ROLLBACK")

    def transaction(self) -> "ResultStore._Tx":
        """A write transaction (``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on error)."""
        return ResultStore._Tx(self._conn)

    # ---- writing -------------------------------------------------------------------------------------------
    def add_results(self, key: RunKey, results: Iterable[ItemResult]) -> int:
        """Insert per-item results in one transaction; items already stored are left untouched.  Returns the
        number of rows actually inserted."""
        rows = [key.values() + (int(r.item), int(r.gold), int(r.pred), int(r.pred_norm),
                                json.dumps([float(x) for x in r.scores]))
                for r in results]
        if not rows:
            return 0
        with self.transaction() as c:
            before = c.total_changes
            c.executemany("INSERT OR IGNORE INTO results VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
            return c.total_changes - before

    def record_run(self, key: RunKey, n: int, acc: float | None, acc_norm: float | None) -> None:
        """Create or update the run's summary row (``created`` is kept from the first time)."""
        now = _now()
        with self.transaction() as c:
            c.execute(
                "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(model, data, split, shots, test, scheme) "
                "DO UPDATE SET n=excluded.n, acc=excluded.acc, acc_norm=excluded.acc_norm, updated=excluded.updated",
                key.values() + (int(n), acc, acc_norm, now, now))

    # ---- reading -------------------------------------------------------------------------------------------
    def done_items(self, key: RunKey) -> set[int]:
        """Indices of the items already stored for this run."""
        cur = self._conn.execute(
            "SELECT item FROM results WHERE model=? AND data=? AND split=? AND shots=? AND test=? AND scheme=?",
            key.values())
        return {int(r[0]) for r in cur}

    def results(self, key: RunKey, items: Sequence[int] | None = None) -> dict[int, ItemResult]:
        """Stored results of a run, by item index (only ``items`` when given)."""
        cur = self._conn.execute(
            "SELECT item, gold, pred, pred_norm, scores FROM results WHERE model=? AND data=? AND split=? "
            "AND shots=? AND test=? AND scheme=? ORDER BY item", key.values())
        want = set(items) if items is not None else None
        out: dict[int, ItemResult] = {}
        for item, gold, pred, pred_norm, scores in cur:
            if want is None or item in want:
                out[int(item)] = ItemResult(int(item), int(gold), int(pred), int(pred_norm),
                                            tuple(json.loads(scores)))
        return out

    def runs(self, **filters: Any) -> list[dict[str, Any]]:
        """Run summaries as dicts, optionally filtered by key columns (``runs(model="smollm2-135m")``)."""
        bad = set(filters) - set(KEY_COLUMNS)
        if bad:
            raise InputError(f"unknown run filter(s) {sorted(bad)}; use {KEY_COLUMNS}")
        self._need("runs")
        where = " AND ".join(f"{k}=?" for k in filters) or "1"
        cur = self._conn.execute(f"SELECT * FROM runs WHERE {where} ORDER BY model, data, shots, test, scheme",
                                 tuple(filters.values()))
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur]

    def iter_rows(self, table: str = "results", **filters: Any) -> Iterator[dict[str, Any]]:
        if table not in ("runs", "results"):
            raise InputError(f"unknown table {table!r}: use runs or results")
        bad = set(filters) - set(KEY_COLUMNS)
        if bad:
            raise InputError(f"unknown filter(s) {sorted(bad)}; use {KEY_COLUMNS}")
        self._need(table)
        where = " AND ".join(f"{k}=?" for k in filters) or "1"
        order = ", ".join(KEY_COLUMNS) + (", item" if table == "results" else "")
        cur = self._conn.execute(f"SELECT * FROM {table} WHERE {where} ORDER BY {order}", tuple(filters.values()))
        cols = [d[0] for d in cur.description]
        for r in cur:
            yield dict(zip(cols, r))

    # ---- export --------------------------------------------------------------------------------------------
    def export(self, out: str | os.PathLike[str], table: str = "results", **filters: Any) -> Path:
        """Write a table (``runs`` or ``results``, optionally filtered) to ``.csv`` or ``.parquet`` (by suffix),
        atomically by the output rules of :mod:`walklens.outputs`.  Parquet needs ``pyarrow``."""
        out = Path(out)
        if out.suffix not in (".csv", ".parquet"):
            raise InputError(f"{out}: export to .csv or .parquet")
        check_file(out)  # a bad path fails before the rows are read
        rows = list(self.iter_rows(table, **filters))
        cols = [d for d in (rows[0].keys() if rows else self._columns(table))]
        if out.suffix == ".csv":
            import csv

            with atomic_open(out, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=cols)
                w.writeheader()
                w.writerows(rows)
        else:
            try:
                import pyarrow as pa
                import pyarrow.parquet as pq
            except ImportError:
                raise MissingDependencyError("Parquet export needs pyarrow; run: pip install pyarrow") from None
            tbl = pa.Table.from_pylist(rows) if rows else pa.table({c: [] for c in cols})
            with atomic_open(out, "wb") as fb:
                pq.write_table(tbl, fb)
        return out

    def _need(self, table: str) -> None:
        """A database opened ``readonly`` may lack the tables (it is never changed): say so in one line."""
        if table not in tables(self._conn):
            raise InputError(f"{self.path}: has no '{table}' table (not a walklens results database)")

    def _columns(self, table: str) -> list[str]:
        return [r[1] for r in self._conn.execute(f"PRAGMA table_info({table})")]
