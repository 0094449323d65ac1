"""Every value read back from a steering store is checked: a tampered unit (a bad number, a row too many, another
prompt's id, text that is not JSON, a BLOB, a NULL, deep nesting) is one line ``walklens: error: steering store
PATH: table units, row (run ..., unit ...), field ...`` and exit 2, never an internal error and never a silently
different card; harmless changes (the JSON re-spaced, a unit deleted) give the same card.  Property tests tamper
the store's rows and the steering set's lines in many ways (hypothesis, bounded and derandomized)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from _cli import run
from _steercard import MINI, card_argv, one_error, one_thread, write_mini  # noqa: F401  # shared fixtures

FUZZ = dict(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
#: what differs between two runs of one card: how many units it generated and read from the store
COUNTS = ("units_generated", "units_stored")
#: the tiny Llama's vocabulary; the card runs with --max-new-tokens 3
VOCAB, NEW = 126, 3


class Stored:
    """A card run once into a store: the pristine store, the set, the model and the card's document."""

    def __init__(self, root: Path, model: str) -> None:
        from walklens.cli import main

        self.root, self.model = root, model
        self.set = write_mini(root / "mini.jsonl")
        self.db = root / "pristine.db"
        assert main([*card_argv(self.set, model, "--store", str(self.db), "--json", str(root / "ref.json"))]) == 0
        self.doc = self.card(root / "ref.json")
        with sqlite3.connect(self.db) as con:
            self.units = {u: json.loads(r) for u, r in con.execute("SELECT unit, rows FROM units ORDER BY unit")}
            self.run = con.execute("SELECT run FROM units").fetchone()[0]
        con.close()

    @staticmethod
    def card(path: Path) -> dict[str, Any]:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return {k: v for k, v in doc.items() if k not in COUNTS}

    def copy(self, name: str) -> Path:
        dst = self.root / f"{name}.db"
        for suffix in ("-wal", "-shm"):
            Path(f"{dst}{suffix}").unlink(missing_ok=True)
        shutil.copyfile(self.db, dst)
        return dst

    def rerun(self, capfd: pytest.CaptureFixture[str], db: Path) -> tuple[int, list[str]]:
        """The card again over the (tampered) store: exit 0 with the same card, or one line and exit 2."""
        out = self.root / "again.json"
        out.unlink(missing_ok=True)
        rc, err = run(capfd, *card_argv(self.set, self.model, "--store", str(db), "--json", str(out)))
        if rc == 0:
            assert self.card(out) == self.doc, "a tampered store gave a different card"
        else:
            one_error(rc, err)
        return rc, err


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory, tiny_llama_inputs: dict[str, Any]) -> Stored:
    return Stored(tmp_path_factory.mktemp("store"), str(tiny_llama_inputs["model"]))


def put_text(db: Path, run_key: str, unit: str, value: str | bytes | None) -> None:
    """Replace a unit's stored ``rows`` (TEXT, BLOB or NULL: the table rebuilt without NOT NULL)."""
    con = sqlite3.connect(db)
    if value is None:
        con.executescript(
            "ALTER TABLE units RENAME TO old; CREATE TABLE units (run TEXT, unit TEXT, rows TEXT, "
            "PRIMARY KEY (run, unit)); INSERT INTO units SELECT * FROM old; DROP TABLE old;"
        )
    con.execute("UPDATE units SET rows=? WHERE run=? AND unit=?", (value, run_key, unit))
    con.commit()
    con.close()


PRICES = "add/L1/d1/paris/prompts"  # a token target's rows (with a rank)
TOPIC = "add/L1/d1/animals/prompts"  # a topic target's rows (no rank)
NEUTRAL = "add/L1/d1/paris/neutral"


def _field(unit: str, i: int, key: str, raw: str) -> Callable[[list[Any]], str]:
    """Rows with row ``i``'s ``key`` set to the raw JSON text ``raw`` (``NaN`` and ``1e999`` included)."""

    def f(rows: list[Any]) -> str:
        rows = json.loads(json.dumps(rows))
        rows[i][key] = "@@RAW@@"
        return json.dumps(rows).replace('"@@RAW@@"', raw)

    return f


def _drop(i: int, key: str) -> Callable[[list[Any]], str]:
    return lambda rows: json.dumps([{k: v for k, v in r.items() if k != key or j != i} for j, r in enumerate(rows)])


#: (unit, tampering of its rows, what the one line names); from the hardening of the card's store
CASES: list[tuple[str, Callable[[list[Any]], str | bytes | None], str]] = [
    (PRICES, _field(PRICES, 0, "score", "NaN"), "not valid JSON"),
    (PRICES, _field(PRICES, 0, "score", "null"), "field 'score' must not be null"),
    (PRICES, _field(PRICES, 0, "score", "1e300"), "field 'score' must be"),
    (PRICES, _field(PRICES, 1, "log_ppl", "1e999"), "field 'log_ppl' must be"),
    (PRICES, _field(PRICES, 0, "log_ppl", "-1"), "field 'log_ppl' must be"),
    (NEUTRAL, _field(NEUTRAL, 0, "kl", "-5"), "field 'kl' must be"),
    (NEUTRAL, _field(NEUTRAL, 1, "dose", "null"), "field 'dose' must not be null"),
    (NEUTRAL, _field(NEUTRAL, 1, "dose", "NaN"), "not valid JSON"),
    (PRICES, _field(PRICES, 0, "rank", "-5"), "field 'rank' must be"),
    (PRICES, _field(PRICES, 0, "rank", "1.5"), "field 'rank' must be"),
    (PRICES, _field(PRICES, 0, "rank", "1e30"), "field 'rank' must be"),
    (PRICES, _field(PRICES, 0, "rank", str(VOCAB)), "field 'rank' must be"),
    (PRICES, _field(PRICES, 0, "rank", '"3"'), "field 'rank' must be an int, not a string"),
    (PRICES, _field(PRICES, 1, "repetition", "7"), "field 'repetition' must be"),
    (PRICES, _field(PRICES, 1, "n_tokens", str(NEW + 1)), "field 'n_tokens' must be"),
    (PRICES, _field(PRICES, 1, "n_tokens", "3.0"), "field 'n_tokens' must be an int"),
    (PRICES, _field(PRICES, 0, "score", '"-1.5"'), "field 'score' must be a float, not a string"),
    (PRICES, _field(PRICES, 0, "text", "7"), "field 'text' must be a str"),
    (PRICES, _field(PRICES, 0, "id", '"animals/choose/0"'), "animals/choose/0"),
    (TOPIC, _field(TOPIC, 0, "rank", "0"), "field 'rank' is not one of"),
    (PRICES, _drop(0, "rank"), "field 'rank' is missing"),
    (PRICES, _drop(1, "score"), "field 'score' is missing"),
    (PRICES, lambda rows: json.dumps(rows[::-1]), "paris/heldout/0"),  # swapped ids
    (PRICES, lambda rows: json.dumps(rows + rows[:1]), "rows"),  # a row stored twice
    (PRICES, lambda rows: json.dumps(rows * 6), "rows"),  # 12 rows
    (PRICES, lambda rows: json.dumps(rows[:1] + rows[:1]), "repeats id"),
    (NEUTRAL, lambda rows: json.dumps(rows + rows), "rows"),
    (PRICES, lambda rows: "[]", "rows"),
    (PRICES, lambda rows: "{}", "must be a list"),
    (PRICES, lambda rows: json.dumps(rows)[:-3], "not valid JSON"),
    (PRICES, lambda rows: "[" * 100_000 + "]" * 100_000, "nested deeper than"),
    (PRICES, lambda rows: json.dumps(rows).encode(), "a BLOB"),
    (PRICES, lambda rows: None, "NULL"),
    (PRICES, lambda rows: json.dumps([{**r, "extra": 1} for r in rows]), "field 'extra' is not one of"),
    (PRICES, lambda rows: json.dumps([[1]] + rows[1:]), "must be an object"),
    (TOPIC, lambda rows: json.dumps(rows[:1]), "rows"),  # a prompt left out
]


@pytest.mark.parametrize(("unit", "tamper", "needle"), CASES)
def test_a_tampered_unit_is_one_line(
    capfd: pytest.CaptureFixture[str],
    stored: Stored,
    unit: str,
    tamper: Callable[[list[Any]], str | bytes | None],
    needle: str,
) -> None:
    db = stored.copy("case")
    put_text(db, stored.run, unit, tamper(stored.units[unit]))
    rc, err = stored.rerun(capfd, db)
    line = one_error(rc, err)
    assert line.startswith(f"walklens: error: steering store {db}: table units, row (run ") and unit in line, line
    assert needle in line, line


@pytest.mark.parametrize(
    "tamper",
    [
        lambda rows: json.dumps(rows, indent=3),
        lambda rows: json.dumps([dict(reversed(list(r.items()))) for r in rows]),
        lambda rows: json.dumps(rows, separators=(" ,\n", " :\t")),
    ],
)
def test_a_harmless_change_gives_the_same_card(
    capfd: pytest.CaptureFixture[str], stored: Stored, tamper: Callable[[list[Any]], str]
) -> None:
    db = stored.copy("harmless")
    for unit, rows in stored.units.items():
        put_text(db, stored.run, unit, tamper(rows))
    rc, err = stored.rerun(capfd, db)
    assert rc == 0, err


def test_a_deleted_unit_is_generated_again(capfd: pytest.CaptureFixture[str], stored: Stored) -> None:
    db = stored.copy("deleted")
    with sqlite3.connect(db) as con:
        con.execute("DELETE FROM units WHERE unit=?", (PRICES,))
    con.close()
    rc, err = stored.rerun(capfd, db)
    assert rc == 0, err


@pytest.mark.parametrize(
    ("sql", "needle"),
    [
        ("ALTER TABLE units RENAME COLUMN rows TO other", "table units is not usable"),
        (
            "ALTER TABLE units RENAME TO old; CREATE TABLE units (run TEXT, unit TEXT, rows TEXT); "
            "INSERT INTO units SELECT * FROM old; INSERT INTO units SELECT * FROM old; DROP TABLE old",
            "stored twice",
        ),
        ("UPDATE meta SET value='1' WHERE key='steering_card_schema'", "schema version 1, this walklens reads 2"),
        ("DROP TABLE units; CREATE VIEW units AS SELECT 1 AS run", "table units is not usable"),
        ("UPDATE units SET unit=unit || '/x' WHERE unit LIKE 'add/%'", None),  # never read: generated again
    ],
)
def test_a_tampered_table_is_one_line(
    capfd: pytest.CaptureFixture[str], stored: Stored, sql: str, needle: str | None
) -> None:
    db = stored.copy("table")
    con = sqlite3.connect(db)
    con.executescript(sql)
    con.close()
    rc, err = stored.rerun(capfd, db)
    assert (rc == 0) if needle is None else (needle in one_error(rc, err) and f"steering store {db}" in err[0]), err


# ---- property tests ---------------------------------------------------------------------------------------------

#: raw JSON texts no numeric field of a stored row may hold (not JSON, not a number, not finite, out of range)
NOT_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e999", '"1"', '""', "[]", "{}", "[1]", '{"a": 1}', "true", "false"]
HOSTILE: dict[str, list[str]] = {
    "score": [*NOT_NUMBERS, "null", "1e300", "-1e300", "3.5e38", "-3.5e38", "1e39"],
    "log_ppl": [*NOT_NUMBERS, "-1", "-1e-9", "1e300", "3.5e38"],
    "repetition": [*NOT_NUMBERS, "-0.5", "1.0000001", "7", "1e300"],
    "n_tokens": [*NOT_NUMBERS, "null", "-1", str(NEW + 1), "1.5", "1e30", str(10**400)],
    "rank": [*NOT_NUMBERS, "null", "-1", "-5", "1.5", str(VOCAB), "1e30", str(10**30)],
    "text": ["null", "7", "[]", "{}", "true", json.dumps("x" * 5000)],
    "id": ["null", "7", '""', '"paris/choose/9"', '"animals/heldout/0"', "[]", '"' + "a" * 300 + '"'],
    "kl": [*NOT_NUMBERS, "null", "-5", "-1e-12", "1e300", "1e39"],
    "dose": [*NOT_NUMBERS, "null", "-1", "1e300", "1e39"],
}
ROWS_TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["[]", "{}", "null", "0", '"rows"', "[null]", "[[]]", "[{}]", "[" * 3000 + "]" * 3000]),
    st.integers(min_value=1, max_value=200).map(lambda k: "[" * k * 500),
)


def _hostile_row_edits(rows: list[dict[str, Any]]) -> st.SearchStrategy[str]:
    """Rows text with one hostile edit of a field, a row or the list (never a plausible value)."""
    n = len(rows)
    fields = st.tuples(st.integers(0, n - 1), st.sampled_from(sorted(rows[0]))).flatmap(
        lambda ik: (
            st.sampled_from(
                HOSTILE[ik[1]]
                + (["null"] if ik[1] == "log_ppl" and rows[ik[0]]["n_tokens"] > 0 else [])
                + (["null"] if ik[1] == "repetition" and rows[ik[0]]["n_tokens"] >= 3 else [])
                + (["0.5"] if ik[1] == "repetition" and rows[ik[0]]["n_tokens"] < 3 else [])
            )
            .filter(lambda raw: raw != json.dumps(rows[ik[0]].get(ik[1])))
            .map(lambda raw: _field("", ik[0], ik[1], raw)(rows))
        )
    )
    structure = st.sampled_from(
        [
            json.dumps(rows[1:]),
            json.dumps(rows + rows[-1:]),
            json.dumps(rows[::-1]) if n > 1 and "id" in rows[0] else json.dumps(rows * 2),
            json.dumps([{**r, "more": None} for r in rows]),
            json.dumps([{k: v for k, v in r.items() if k != sorted(r)[0]} for r in rows]),
            json.dumps([7, *rows[1:]]),
            json.dumps(rows)[: len(json.dumps(rows)) // 2],
            json.dumps(rows) + "]",
            json.dumps({"rows": rows}),
        ]
    )
    return st.one_of(fields, structure, ROWS_TEXT)


@st.composite
def tamperings(draw: st.DrawFn, stored: Stored) -> tuple[str, str | bytes | None, bool]:
    """(unit, new rows value, whether it is harmless)."""
    unit = draw(st.sampled_from(sorted(stored.units)))
    rows = stored.units[unit]
    kind = draw(st.sampled_from(["edit", "edit", "edit", "blob", "null", "other-unit", "harmless"]))
    if kind == "blob":
        return unit, draw(st.binary(max_size=30)) or b"[]", False
    if kind == "null":
        return unit, None, False
    if kind == "other-unit":  # rows of a unit of another target or part: never this unit's
        t, part = unit.split("/")[-2:]
        others = [u for u in stored.units if u.split("/")[-1] != part or (part == "prompts" and f"/{t}/" not in u)]
        return unit, json.dumps(stored.units[draw(st.sampled_from(sorted(others)))]), False
    if kind == "harmless":
        return unit, json.dumps(rows, indent=draw(st.integers(0, 4)), sort_keys=draw(st.booleans())), True
    return unit, draw(_hostile_row_edits(rows)), False


@settings(max_examples=130, **FUZZ)
@given(data=st.data())
def test_fuzz_a_tampered_store_is_the_same_card_or_one_line(
    capfd: pytest.CaptureFixture[str], stored: Stored, data: st.DataObject
) -> None:
    unit, value, harmless = data.draw(tamperings(stored))
    db = stored.copy("fuzz")
    put_text(db, stored.run, unit, value)
    rc, err = stored.rerun(capfd, db)
    assert (rc == 0) == harmless, (unit, value, err)
    if rc:
        assert f"steering store {db}: table units, row (run " in err[0] and unit in err[0], err
    event("same card" if rc == 0 else "refused: " + err[0].split("), ", 1)[1].split(":")[0])


LINE_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.text(max_size=6), max_size=3),
    st.lists(st.lists(st.text(max_size=6), max_size=3), max_size=2),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


@st.composite
def set_lines(draw: st.DrawFn) -> bytes:
    """The small set with one line tampered: a field's value, a line replaced, dropped, repeated or nested."""
    lines = [json.dumps(r) for r in MINI]
    i = draw(st.integers(0, len(lines) - 1))
    how = draw(st.sampled_from(["value", "value", "drop-key", "replace", "drop", "repeat", "nest", "bytes"]))
    rec = dict(MINI[i])
    if how == "value":
        key = draw(st.sampled_from([*sorted(rec), "extra"]))
        rec[key] = draw(LINE_VALUES)
        lines[i] = json.dumps(rec)
    elif how == "drop-key":
        rec.pop(draw(st.sampled_from(sorted(rec))))
        lines[i] = json.dumps(rec)
    elif how == "replace":
        lines[i] = draw(st.one_of(st.text(max_size=30), st.sampled_from(["[]", "{}", "null", '{"type": 1}', "1e999"])))
    elif how == "drop":
        del lines[i]
    elif how == "repeat":
        lines.insert(i, lines[i])
    elif how == "nest":
        k = draw(st.integers(min_value=10, max_value=60_000))
        lines[i] = lines[i][:-1] + ', "deep": ' + "[" * k + "]" * k + "}"
    else:
        return "\n".join(lines).encode() + draw(st.binary(min_size=1, max_size=20))
    return "\n".join(lines).encode()


@settings(max_examples=90, **FUZZ)
@given(content=set_lines())
def test_fuzz_a_tampered_set_is_one_line(
    capfd: pytest.CaptureFixture[str], tmp_path_factory: pytest.TempPathFactory, tiny_llama_inputs: dict[str, Any],
    content: bytes,
) -> None:  # fmt: skip
    """Whatever the set's lines, the card refuses in one line (under a work limit nothing fits, the limit's own
    line once the set, its targets and the context are checked): never a traceback or an internal error."""
    path = tmp_path_factory.getbasetemp() / "fuzzed.jsonl"
    path.write_bytes(content)
    rc, err = run(capfd, *card_argv(path, str(tiny_llama_inputs["model"]), "--max-work", "1e-12"))
    line = one_error(rc, err)
    event("the set and its targets accepted (the work limit)" if "--max-work 1e-12" in line else "the set refused")
