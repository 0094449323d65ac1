"""``walklens.lab.summarise_db`` and the sweep summaries' ``to_pandas`` over tampered databases: any value in any cell
(wrong types, NULLs, BLOBs, NaN, huge numbers, numbers as strings, text of undecodable bytes, scheme names the
grammar refuses) gives data frames or one :class:`InputError` line naming the table, the row and the field, never
another exception (the values a store reads back are checked by its :class:`~walklens.lab.hellaswag.store.db.Row`)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import test_db_contents
from test_db_contents import _CELLS, _fuzz, _value_strategy
from walklens.base.errors import InputError

template = test_db_contents.template  # the fixture: a valid walklens database's bytes

#: where a bad value was found: ``table T, row R, field F``
WHERE = re.compile(r"table \w+, row .+, field \w+")
#: a group's three output parts (the template's groups hold three), the last one's word given
OUTS3 = '["out_layer=-1,out_word=mean","out_layer=E,out_word=mean","out_layer=0,out_word={}"]'


class Raw:
    """A cell value written as SQL: ``CAST(bytes AS TEXT)`` (text of undecodable bytes) or a real SQLite can hold
    but Python's sqlite3 cannot bind (an integer past 2**63 becomes a REAL; ``9e999`` is infinity)."""

    def __init__(self, sql: str, arg: Any) -> None:
        self.sql, self.arg = sql, arg

    def bound(self) -> tuple[str, tuple[Any, ...]]:
        """The SQL and its arguments (an integer bound as its digits)."""
        if self.arg is None:
            return self.sql, ()
        return self.sql, (str(self.arg) if isinstance(self.arg, int) else self.arg,)

    def __repr__(self) -> str:
        return f"Raw({self.sql}, {self.arg!r})"


HOSTILE = [
    Raw("CAST(? AS TEXT)", b"\xff\xfe"),
    Raw("CAST(? AS TEXT)", b'["acc\xff"]'),
    Raw("CAST(? AS TEXT)", b"enc=\xc3(,layer=-1"),
    Raw("?", 10**30),  # as text: sqlite3 binds no int past int64
    Raw("9e999", None),
    Raw("-9e999", None),
    Raw("CAST(? AS REAL)", "1e308"),
    "0.5",
    "1",
    " 2",
    "1e3",
    "NaN",
    "[NaN, 1, 2, 3]",
    "[1" + "0" * 400 + ", 1, 2, 3]",
    '["\\ud800"]',
    '["out_layer=-1,out_word=\\ud800"]',
    "foo=bar",
    "enc=mean,layer=-1,word=mean",
    "enc=concat_each_example,layer=zz,word=mean,norm=None,seg=mean,ex=mean,sim=dot",
    OUTS3.format("nope"),
    OUTS3.format("\\ud800"),
    '["acc_norm"]',
    "=\u2028 model",
]


def _write(template: bytes, path: Path, changes: list[tuple[tuple[str, str], bool, Any]]) -> Path:
    """The template with each ``((table, column), first row only, value)`` written; a change the schema refuses
    (a duplicate key, a NULL in a NOT NULL column) is skipped."""
    path.write_bytes(template)
    con = sqlite3.connect(path)
    for (table, col), first, value in changes:
        where = ""
        if first:
            where = (
                " WHERE item=(SELECT min(item) FROM results)"
                if table == "results"
                else f" WHERE rowid=(SELECT min(rowid) FROM {table})"
            )
        sql, args = ("?", (value,)) if not isinstance(value, Raw) else value.bound()
        try:
            con.execute(f"UPDATE {table} SET {col}={sql}{where}", args)
        except sqlite3.IntegrityError:
            pass
    con.commit()
    con.close()
    return path


def _changes() -> Any:
    """1 to 3 changes: any cell, the first row or every row, a hostile value or any value."""
    value = st.one_of(st.sampled_from(HOSTILE), _value_strategy())
    return st.lists(st.tuples(st.sampled_from(_CELLS), st.booleans(), value), min_size=1, max_size=3)


def _one_line_naming_the_cell(e: InputError, changes: Any) -> None:
    msg = str(e)
    assert "\n" not in msg and len(msg) < 600, (changes, msg)
    whole = ("not a walklens database", "corrupted", "not a usable SQLite", "tables have schema version")
    if any(w in msg for w in whole):
        return  # the file as a whole (a meta table of another layout, another schema version), not a value
    assert WHERE.search(msg), (changes, msg)


@pytest.mark.slow
def test_the_hostile_values_one_by_one(template: bytes, tmp_path: Path) -> None:
    """Each hostile value in each cell it could be mistaken for: frames or one line naming the cell."""
    from walklens.lab.database import summarise_db

    for i, value in enumerate(HOSTILE):
        for cell in _CELLS:
            db = _write(template, tmp_path / f"h{i}.sqlite", [(cell, True, value)])
            try:
                frames = summarise_db(db)
            except InputError as e:
                _one_line_naming_the_cell(e, (cell, value))
            else:
                assert {"runs", "results", "sweep_runs", "schemes"} <= set(frames)


@pytest.mark.parametrize(
    "cell,value,field",
    [
        (("results", "scores"), "[1" + "0" * 400 + ", 1, 2, 3]", "scores"),  # an int no float holds: OverflowError
        (("runs", "model"), Raw("CAST(? AS TEXT)", b"m\xff"), "model"),  # undecodable text: OperationalError
        (("results", "scheme"), Raw("CAST(? AS TEXT)", b"\xff"), "scheme"),
        (("sweep_groups", "context"), "foo=bar", "context"),  # the grammar's refusal named no table
        (("sweep_groups", "outs"), OUTS3.format("nope"), "outs"),
        (("sweep_groups", "outs"), OUTS3.format("\\ud800"), "outs"),  # JSON's escape of a lone surrogate
        (("sweep_groups", "metrics"), '["acc_norm"]', "metrics"),  # "mixes metrics" named no row
        (("meta", "value"), "x", "value"),  # "schema version -1"
    ],
)
def test_bad_values_that_escaped_or_named_no_cell(
    template: bytes, tmp_path: Path, cell: tuple[str, str], value: Any, field: str
) -> None:
    from walklens.lab.database import summarise_db

    db = _write(template, tmp_path / "bad.sqlite", [(cell, True, value)])
    with pytest.raises(InputError) as e:
        summarise_db(db)
    _one_line_naming_the_cell(e.value, (cell, value))
    assert f"table {cell[0]}, row " in str(e.value) and f"field {field}" in str(e.value), str(e.value)


def test_nan_and_infinite_scores_are_read_as_stored(template: bytes, tmp_path: Path) -> None:
    """The writer stores a score of NaN or -inf (a float16 log-likelihood) as JSON's NaN / -Infinity: read back."""
    from walklens.lab.database import summarise_db

    db = _write(template, tmp_path / "nan.sqlite", [(("results", "scores"), True, "[NaN, -Infinity, 0.5, 1e999]")])
    row = summarise_db(db)["results"].iloc[0]
    assert str(row["score_0"]) == "nan" and row["score_1"] == float("-inf") and row["score_3"] == float("inf")


@pytest.mark.filterwarnings("ignore")
def test_fuzz_summarise_db(template: bytes, tmp_path_factory: pytest.TempPathFactory) -> None:
    import pandas as pd

    from walklens.lab.database import summarise_db

    @_fuzz(150)
    @given(_changes())
    def check(changes: list[Any]) -> None:
        db = _write(template, tmp_path_factory.mktemp("fuzz") / "f.sqlite", changes)
        try:
            frames = summarise_db(db)
        except InputError as e:
            _one_line_naming_the_cell(e, changes)
        else:
            assert all(isinstance(df, pd.DataFrame) for df in frames.values())

    check()


@pytest.mark.filterwarnings("ignore")
def test_fuzz_run_summaries_to_pandas(template: bytes, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The sweep summaries (``walklens.lab.experiments.summary.summarise_db``, the report's reader) and every table of
    their ``to_pandas``."""
    from walklens.lab.experiments.summary import summarise_db

    tables = ("estimates", "top10", "marginals", "folds", "distribution", "histogram")

    @_fuzz(60)
    @given(_changes())
    def check(changes: list[Any]) -> None:
        db = _write(template, tmp_path_factory.mktemp("fuzz") / "f.sqlite", changes)
        try:
            summaries = summarise_db(db, replicates=20)
            for s in summaries:
                for t in tables:
                    s.to_pandas(t)
        except InputError as e:
            _one_line_naming_the_cell(e, changes)

    check()
