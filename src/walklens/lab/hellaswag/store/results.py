"""The results tables: HellaSwag single runs and their per-item results, with resume and CSV/Parquet export.

Layout (in the walklens database file, :mod:`.db`; WAL journal so readers never block a writer and two writers
wait for each other instead of corrupting the file; every write is one ``BEGIN IMMEDIATE`` transaction):

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

import csv
import json
import os
import sqlite3
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from platformdirs import user_data_dir

from ....base.errors import InputError
from ....base.extras import missing_extra
from ....base.outputs import atomic_open, check_file, csv_row
from ....base.sqlite import ClosedOnExit, tables, transaction
from .db import Row, StoreTables, open_store

SCHEMA_VERSION = 1
KEY_COLUMNS: tuple[str, ...] = ("model", "data", "split", "shots", "test", "scheme")

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS runs (
    model TEXT NOT NULL, data TEXT NOT NULL, split TEXT NOT NULL, shots INTEGER NOT NULL,
    test TEXT NOT NULL, scheme TEXT NOT NULL,
    n INTEGER, acc REAL, acc_norm REAL,
    created TEXT NOT NULL, updated TEXT NOT NULL,
    PRIMARY KEY (model, data, split, shots, test, scheme)
)""",
    """CREATE TABLE IF NOT EXISTS results (
    model TEXT NOT NULL, data TEXT NOT NULL, split TEXT NOT NULL, shots INTEGER NOT NULL,
    test TEXT NOT NULL, scheme TEXT NOT NULL, item INTEGER NOT NULL,
    gold INTEGER NOT NULL, pred INTEGER NOT NULL, pred_norm INTEGER NOT NULL, scores TEXT NOT NULL,
    PRIMARY KEY (model, data, split, shots, test, scheme, item)
) WITHOUT ROWID""",
)
_TABLES = StoreTables("results", "schema", SCHEMA_VERSION, _SCHEMA, "results database")


_TEXT = ("model", "data", "split", "test", "scheme", "created", "updated")
_FLOAT_MAX = sys.float_info.max


def _numbers(doc: Any) -> bool:
    """1 to 64 numbers a float holds (NaN and infinities too: a score the writer stored; an integer of 400 digits is
    no float)."""
    return (
        isinstance(doc, list)
        and 1 <= len(doc) <= 64
        and all(
            isinstance(x, float) or (isinstance(x, int) and not isinstance(x, bool) and abs(x) <= _FLOAT_MAX)
            for x in doc
        )
    )


def checked(path: Path, table: str, d: dict[str, Any]) -> dict[str, Any]:
    """A row of ``runs`` or ``results`` checked field by field (:class:`~.db.Row`): texts, counts, picks 0..3,
    accuracies 0..1 and the scores (a JSON list of numbers)."""
    r = Row(path, table, repr(tuple(d.get(k) for k in ("model", "test", "shots", "item") if k in d))[:80])
    for k in _TEXT:
        if k in d:
            r.text(k, d[k])
    r.integer("shots", d["shots"], 0, 1_000_000)
    if table == "runs":
        if d["n"] is not None:
            r.integer("n", d["n"], 0, 2**63 - 1)
        for k in ("acc", "acc_norm"):
            r.real(k, d[k], 0.0, 1.0, null=True)
    else:
        r.integer("item", d["item"], 0, 2**63 - 1)
        for k in ("gold", "pred", "pred_norm"):
            r.integer(k, d[k], 0, 3)
        r.json("scores", d["scores"], _numbers, "a JSON list of 1 to 64 numbers")
    return d


def default_db_path() -> Path:
    """``$WALKLENS_DB``, else ``<user data dir>/walklens/results.sqlite``."""
    env = os.environ.get("WALKLENS_DB")
    if env:
        return Path(env).expanduser()
    return Path(user_data_dir("walklens")) / "results.sqlite"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


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


class ResultStore(ClosedOnExit):
    """SQLite store of runs and per-item results (WAL mode, transactions, ``INSERT OR IGNORE`` resume)."""

    def __init__(
        self, path: str | os.PathLike[str] | None = None, timeout: float = 60.0, readonly: bool = False
    ) -> None:
        """Open (and create, unless ``readonly``) the database; ``readonly`` refuses a missing file and never
        writes (no schema, no journal-mode change).  A database of a newer schema is refused
        (:func:`~.db.open_tables`)."""
        self.path = Path(path).expanduser() if path is not None else default_db_path()
        self._conn = open_store(self.path, _TABLES, timeout=timeout, readonly=readonly)

    # ---- plumbing ------------------------------------------------------------------------------------------
    def close(self) -> None:
        self._conn.close()

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """A write transaction (``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on error)."""
        return transaction(self._conn)

    # ---- writing -------------------------------------------------------------------------------------------
    def add_results(self, key: RunKey, results: Iterable[ItemResult]) -> int:
        """Insert per-item results in one transaction; items already stored are left untouched.  Returns the
        number of rows actually inserted."""
        rows = [
            key.values()
            + (int(r.item), int(r.gold), int(r.pred), int(r.pred_norm), json.dumps([float(x) for x in r.scores]))
            for r in results
        ]
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
                key.values() + (int(n), acc, acc_norm, now, now),
            )

    # ---- reading -------------------------------------------------------------------------------------------
    def done_items(self, key: RunKey) -> set[int]:
        """Indices of the items already stored for this run."""
        cur = self._conn.execute(
            "SELECT item FROM results WHERE model=? AND data=? AND split=? AND shots=? AND test=? AND scheme=?",
            key.values(),
        )
        return {Row(self.path, "results", f"item={r[0]!r}"[:80]).integer("item", r[0], 0, 2**63 - 1) for r in cur}

    def results(self, key: RunKey, items: Sequence[int] | None = None) -> dict[int, ItemResult]:
        """Stored results of a run, by item index (only ``items`` when given)."""
        cur = self._conn.execute(
            "SELECT item, gold, pred, pred_norm, scores FROM results WHERE model=? AND data=? AND split=? "
            "AND shots=? AND test=? AND scheme=? ORDER BY item",
            key.values(),
        )
        want = set(items) if items is not None else None
        out: dict[int, ItemResult] = {}
        for item, gold, pred, pred_norm, scores in cur:
            if want is None or item in want:
                d = checked(
                    self.path,
                    "results",
                    dict(
                        zip(("item", "gold", "pred", "pred_norm", "scores"), (item, gold, pred, pred_norm, scores)),
                        shots=key.shots,
                    ),
                )
                out[item] = ItemResult(item, gold, pred, pred_norm, tuple(json.loads(d["scores"])))
        return out

    def runs(self, **filters: Any) -> list[dict[str, Any]]:
        """Run summaries as dicts, optionally filtered by key columns (``runs(model="smollm2-135m")``)."""
        bad = set(filters) - set(KEY_COLUMNS)
        if bad:
            raise InputError(f"unknown run filter(s) {sorted(bad)}; use {KEY_COLUMNS}")
        self._need("runs")
        where = " AND ".join(f"{k}=?" for k in filters) or "1"
        cur = self._conn.execute(
            f"SELECT * FROM runs WHERE {where} ORDER BY model, data, shots, test, scheme", tuple(filters.values())
        )
        cols = [d[0] for d in cur.description]
        return [checked(self.path, "runs", dict(zip(cols, r))) for r in cur]

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
            yield checked(self.path, table, dict(zip(cols, r)))

    # ---- export --------------------------------------------------------------------------------------------
    def export(self, out: str | os.PathLike[str], table: str = "results", **filters: Any) -> Path:
        """Write a table (``runs`` or ``results``, optionally filtered) to ``.csv`` or ``.parquet`` (by suffix),
        atomically by the output rules of :mod:`walklens.base.outputs`.  Parquet needs ``pyarrow``."""
        out = Path(out)
        if out.suffix not in (".csv", ".parquet"):
            raise InputError(f"{out}: export to .csv or .parquet")
        check_file(out)  # a bad path fails before the rows are read
        rows = list(self.iter_rows(table, **filters))
        cols = [d for d in (rows[0].keys() if rows else self._columns(table))]
        if out.suffix == ".csv":
            with atomic_open(out, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=cols)
                w.writerow(csv_row({c: c for c in cols}))
                w.writerows(csv_row(r) for r in rows)
        else:
            try:
                import pyarrow as pa
                import pyarrow.parquet as pq
            except ImportError:
                raise missing_extra("data", "Parquet export", "pyarrow") from None
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
