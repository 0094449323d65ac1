"""Where a steering card keeps its generations: an SQLite file (through :mod:`walklens.sqlite`) holding each
finished unit of work (one method x layer x dose over one target's prompts of one split) as JSON rows, so a
card that was killed resumes without generating what it stored (seed 002's steering, measured)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..sqlite import closed_on_error, connect, create_tables, foreign, schema_version, set_mode, transaction

KEY = "steering_card_schema"
VERSION = 1
DDL = (
    "CREATE TABLE IF NOT EXISTS units (run TEXT NOT NULL, unit TEXT NOT NULL, rows TEXT NOT NULL, "
    "PRIMARY KEY (run, unit))",
)


class CardStore:
    """The generations of steering cards in one SQLite file (``path``) or in memory (``None``).  ``run`` keys a
    card's settings (model, weights, set, continuation length, calibration); ``unit`` one unit of work."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = None if path is None else Path(path)
        where = ":memory:" if self.path is None else str(self.path)
        try:
            self.conn = connect(where)
        except sqlite3.Error as e:
            raise InputError(f"steering store {where}: cannot open it ({e})") from None
        with closed_on_error(self.conn, lambda e: f"steering store {where}: not a usable SQLite file ({e})"):
            why = foreign(self.conn, [KEY])
            if why:
                raise InputError(f"steering store {where}: {why}")
            version = schema_version(self.conn, KEY)
            if version not in (None, VERSION):
                raise InputError(f"steering store {where}: schema version {version}, this walklens reads {VERSION}")
            set_mode(self.conn, readonly=False)
            create_tables(self.conn, DDL, key=KEY, version=VERSION)

    def get(self, run: str, unit: str) -> list[dict[str, Any]] | None:
        """The stored rows of a unit, or None when it was never finished."""
        row = self.conn.execute("SELECT rows FROM units WHERE run=? AND unit=?", (run, unit)).fetchone()
        return None if row is None else list(json.loads(row[0]))

    def put(self, run: str, unit: str, rows: Sequence[dict[str, Any]]) -> None:
        """Store a finished unit's rows in one transaction (all of them or none)."""
        with transaction(self.conn):
            self.conn.execute("INSERT OR REPLACE INTO units VALUES (?, ?, ?)", (run, unit, json.dumps(list(rows))))

    def count(self, run: str) -> int:
        """How many units of ``run`` are stored."""
        return int(self.conn.execute("SELECT COUNT(*) FROM units WHERE run=?", (run,)).fetchone()[0])

    def close(self) -> None:
        self.conn.close()


__all__ = ["CardStore"]
