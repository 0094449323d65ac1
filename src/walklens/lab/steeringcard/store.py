"""Where a steering card keeps its generations: an SQLite file (through :mod:`walklens.base.sqlite`) holding each
finished unit of work (one method x layer x dose over one target's prompts of one split) as JSON rows, so a
card that was killed resumes without generating what it stored (seed 002's steering, measured).

The store is an input like any other: every unit read back is checked against the one declaration of a stored
row (:func:`row_schema`) and against the unit it must be (:class:`Expected`: its prompts' ids in order, or its
number of neutral texts) before the card uses it; a bad value is one :class:`~walklens.base.errors.InputError` line
naming the file, the table, the row (run, unit) and the field.  The same check runs on a unit before it is
written, so what is written is what reading accepts (a NaN is stored as null where the card records one)."""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...base.errors import InputError
from ...base.numbers import Range
from ...base.records import MAX_BYTES, Field, Schema, parse_json, unique
from ...base.sqlite import closed_on_error, connect, create_tables, foreign, schema_version, set_mode, transaction

KEY = "steering_card_schema"
#: 2: a NaN stored as null (JSON has no NaN) and every unit checked when read back
VERSION = 2
DDL = (
    "CREATE TABLE IF NOT EXISTS units (run TEXT NOT NULL, unit TEXT NOT NULL, rows TEXT NOT NULL, "
    "PRIMARY KEY (run, unit))",
)

#: the largest float32: every score, log perplexity, KL and dose is a float32 computation
F32_MAX = 3.4028234663852886e38
#: characters of a continuation's text per new token (and a margin): a bound, far above any tokenizer's
TEXT_PER_TOKEN, TEXT_MARGIN = 256, 1024
FINITE32 = Range(-F32_MAX, F32_MAX, what="a finite number within ±3.4e38 (float32)")
NON_NEGATIVE32 = Range(0, F32_MAX, what="a finite number from 0 to 3.4e38 (float32)")
SHARE = Range(0, 1)
#: the neutral rows: KL(unsteered || steered) on one neutral text and the dose it realised (never NaN)
NEUTRAL_ROW = Schema("neutral row", (Field("kl", "float", NON_NEGATIVE32), Field("dose", "float", NON_NEGATIVE32)))


def row_schema(vocab: int, max_new_tokens: int, ranked: bool) -> Schema:
    """The one declaration of a stored prompt row (:func:`walklens.lab.steeringcard.run.unit_rows`): ``id`` the
    prompt's, ``score`` finite, ``rank`` (token targets only, ``ranked``) an integer below ``vocab``, ``log_ppl``
    >= 0 and NaN (null) exactly when the continuation is empty, ``repetition`` a share and NaN exactly when it has
    no 3-gram, ``n_tokens`` at most ``max_new_tokens``, ``text`` the continuation."""
    return Schema(
        "prompt row",
        (
            Field("id", "str"),
            Field("log_ppl", "float", NON_NEGATIVE32, nan=True),
            Field("repetition", "float", SHARE, nan=True),
            Field("n_tokens", "int", Range(0, max_new_tokens, integer=True)),
            Field("score", "float", FINITE32),
            *((Field("rank", "int", Range(0, vocab - 1, integer=True)),) if ranked else ()),
            Field("text", "str", max_len=TEXT_PER_TOKEN * max_new_tokens + TEXT_MARGIN),
        ),
    )


@dataclass(frozen=True)
class Expected:
    """What one unit's rows must be: prompt rows (``schema``) of the prompts ``ids`` in order, or (``ids`` None)
    ``count`` neutral rows."""

    schema: Schema
    ids: tuple[str, ...] | None = None
    count: int = 0

    @property
    def n_rows(self) -> int:
        return self.count if self.ids is None else len(self.ids)


def check_rows(data: Any, expect: Expected, where: str) -> list[dict[str, Any]]:
    """A unit's rows (parsed JSON) checked against ``expect``: one :class:`InputError` line naming ``where``."""
    rows = expect.schema.check_all(data, where, max_rows=expect.n_rows)
    if len(rows) != expect.n_rows:
        raise InputError(f"{where}: holds {len(rows)} rows, the unit has {expect.n_rows}")
    if expect.ids is None:
        return rows
    unique(rows, ("id",), where)
    for i, (r, want) in enumerate(zip(rows, expect.ids)):
        if r["id"] != want:
            raise InputError(f"{where} row {i}: field 'id' is {r['id'][:80]!r}, the unit's prompt there is {want!r}")
        n = r["n_tokens"]
        for name, nan_when, why in (("log_ppl", n == 0, "empty"), ("repetition", n < 3, "shorter than 3 tokens")):
            if math.isnan(r[name]) != nan_when:
                raise InputError(
                    f"{where} row {i}: field {name!r} is {'a number' if nan_when else 'null'} for a continuation "
                    f"of {n} tokens (null exactly when it is {why})"
                )
    return rows


def _encoded(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as JSON holds them: a NaN as null (read back as NaN where the schema allows one, refused elsewhere)."""
    return [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in rows]


class CardStore:
    """The generations of steering cards in one SQLite file (``path``) or in memory (``None``).  ``run`` keys a
    card's settings (model, weights, set, continuation length, calibration); ``unit`` one unit of work."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = None if path is None else Path(path)
        where = ":memory:" if self.path is None else str(self.path)
        self.where = where
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
                raise InputError(
                    f"steering store {where}: schema version {version}, this walklens reads {VERSION} "
                    "(give a new --store; the card generates its units again)"
                )
            set_mode(self.conn, readonly=False)
            create_tables(self.conn, DDL, key=KEY, version=VERSION)

    @contextmanager
    def _sql(self) -> Iterator[None]:
        """A database error while reading or writing the table as one line naming the file."""
        try:
            yield
        except sqlite3.Error as e:
            raise InputError(f"steering store {self.where}: table units is not usable ({e})") from None

    def _row(self, run: str, unit: str) -> str:
        return f"steering store {self.where}: table units, row (run {run!r}, unit {unit!r})"

    def get(self, run: str, unit: str, expect: Expected) -> list[dict[str, Any]] | None:
        """The stored rows of a unit, checked (module docstring), or None when it was never finished."""
        where = self._row(run, unit)
        with self._sql():
            found = self.conn.execute(
                "SELECT typeof(rows), length(CAST(rows AS BLOB)) FROM units WHERE run=? AND unit=? LIMIT 2",
                (run, unit),
            ).fetchall()
        if not found:
            return None
        if len(found) > 1:
            raise InputError(f"{where}: stored twice")
        kind, size = found[0]
        if kind != "text":
            shown = {"null": "NULL", "blob": "a BLOB", "integer": "an integer"}.get(kind, f"a {kind}")
            raise InputError(f"{where}, field rows: must be JSON text, not {shown}")
        if size > MAX_BYTES:
            raise InputError(f"{where}, field rows: holds {size:,} bytes, over the {MAX_BYTES:,} a unit may hold")
        with self._sql():
            text = self.conn.execute("SELECT rows FROM units WHERE run=? AND unit=?", (run, unit)).fetchone()[0]
        where = f"{where}, field rows (JSON)"
        return check_rows(parse_json(text, where), expect, where)

    def put(self, run: str, unit: str, rows: Sequence[dict[str, Any]], expect: Expected) -> None:
        """Store a finished unit's rows in one transaction (all of them or none), checked as :meth:`get` reads
        them: a non-finite number (an overflowing model) is one line, never a unit the store cannot read."""
        try:
            check_rows(list(rows), expect, f"steering card: unit {unit!r}")
        except InputError as e:
            raise InputError(f"{e} (a steered model overflowed? try smaller --doses or --dtype float32)") from None
        text = json.dumps(_encoded(rows), allow_nan=False)
        with self._sql(), transaction(self.conn):
            self.conn.execute("INSERT OR REPLACE INTO units VALUES (?, ?, ?)", (run, unit, text))

    def count(self, run: str) -> int:
        """How many units of ``run`` are stored."""
        with self._sql():
            return int(self.conn.execute("SELECT COUNT(*) FROM units WHERE run=?", (run,)).fetchone()[0])

    def close(self) -> None:
        self.conn.close()


__all__ = ["CardStore", "Expected", "VERSION", "check_rows", "row_schema"]
