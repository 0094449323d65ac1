"""Fuzzing ``walklens reproduce --render`` (hypothesis): copies of the committed result files it reads, tampered
(a value negated, scaled to 1e308, made null, NaN, Infinity, a 400-digit integer, a string, a deep nest; a key or
a row dropped; a CSV cell, column or row changed; the bytes cut), each alone in a ``--root`` tree.

Whatever the file, the answer is exit 0 with every accuracy, share and interval the table prints in range (an
interval holding its value, no 300-digit number, no infinity), or exit 2 with one ``walklens: error:`` line, never
a traceback or an internal error.  Bounded and deterministic: ``max_examples``, ``derandomize=True``, no example
database; 240 hostile files in all (150 JSON, 60 CSV, 30 byte-level).
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import json
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from walklens.base.records import Schema
from walklens.cli import main
from walklens.lab.claims import CLAIMS, schemas

FUZZ: dict[str, Any] = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
ROOT = Path(__file__).resolve().parents[1]
#: every result file the render reads (and, copied untouched beside each curves.csv, its curves.json)
READ = sorted({c.file for c in CLAIMS if c.file and (ROOT / c.file).exists()})  # a run under way has none yet
JSON_FILES = [f for f in READ if f.endswith(".json")]
CSV_FILES = [f for f in READ if f.endswith(".csv")]
#: the keys the readers read (their documents' declared fields, and the keys that lead to them): tampered 3 times
#: in 4 where a node holds one
READ_KEYS = {n for v in vars(schemas).values() if isinstance(v, Schema) for n in v.names} | {
    "runs", "acc", "acc_norm", "as measured", "position 0 removed", "model, position 0 removed", "V/cosine",
    *schemas.COOCCUR_STATS,
}  # fmt: skip
RAW = "@@RAW{}@@"  # a placeholder, replaced by raw JSON text after dumping (what json.dumps never writes)
RAW_TEXT = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1" * 400, "[" * 5000 + "]" * 5000, "1e-400"]
VALUES: list[Any] = [None, -0.306, 1e308, -1e308, 1.5, -1, 0, 0.0, 2**64, True, "", "x" * 10_000, [], {}, [0.5] * 3]
CELLS = ["", "nan", "-nan", "inf", "-1", "1e999", "1e308", "2", "0.5", "x", "max", "\x00", "9" * 5000, '"',
         "8.0", "zero-shot", "method=concept", "-0.82"]  # fmt: skip


@functools.cache
def _doc(rel: str) -> Any:
    return json.loads((ROOT / rel).read_text(encoding="utf-8"))


def _numbers(v: Any, f: Callable[[float], float]) -> Any:
    """``v`` with ``f`` applied to every number in it (booleans kept)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return f(v)
    if isinstance(v, list):
        return [_numbers(x, f) for x in v]
    if isinstance(v, dict):
        return {k: _numbers(x, f) for k, x in v.items()}
    return v


EDITS: list[Callable[[Any], Any]] = [
    lambda v: _numbers(v, lambda x: -x),
    lambda v: _numbers(v, lambda x: x * 1e308),
    lambda v: _numbers(v, lambda x: x + 1),
    lambda v: _numbers(v, lambda x: x * 2),
    lambda v: _numbers(v, lambda x: -1 if isinstance(x, int) else math.nextafter(x, -math.inf) - 1e-3),
]


class Tampered(NamedTuple):
    """A tampered result file: its path in the tree, what was done (hypothesis prints it) and its text."""

    rel: str
    how: str
    text: str

    def __repr__(self) -> str:
        return f"Tampered({self.rel!r}, {self.how!r}, <{len(self.text):,} characters>)"


@st.composite
def _tampered_json(draw: st.DrawFn) -> Tampered:
    """A committed JSON result file with one node replaced, edited or dropped."""
    rel = draw(st.sampled_from(JSON_FILES))
    raws: list[str] = []
    at: list[str] = []

    def swap(v: Any) -> Any:
        how = draw(st.integers(0, 3))
        if how == 0:
            raws.append(draw(st.sampled_from(RAW_TEXT)))
            at.append(f"= {raws[-1][:20]}")
            return RAW.format(len(raws) - 1)
        if how == 1:
            new = draw(st.sampled_from(VALUES))
            at.append(f"= {repr(new)[:20]}")
            return new
        i = draw(st.integers(0, len(EDITS) - 1))
        at.append(f"edit {i}")
        return EDITS[i](v)

    def walk(v: Any) -> Any:
        """``v`` with one node below it tampered: only the containers on the way down are copied."""
        if not isinstance(v, (dict, list)) or not v or draw(st.integers(0, 9)) == 0:
            return swap(v)
        if isinstance(v, dict):
            read = sorted(READ_KEYS.intersection(v))
            bias = draw(st.integers(0, 3)) > 0
            k = draw(st.sampled_from(read if read and bias else sorted(v)))
            at.append(k)
            out = dict(v)
            if draw(st.integers(0, 7)) == 0:
                at.append("deleted")
                del out[k]
            else:
                out[k] = walk(v[k])
            return out
        i = draw(st.one_of(st.just(0), st.integers(0, len(v) - 1)))
        at.append(str(i))
        lst = list(v)
        if draw(st.integers(0, 7)) == 0:
            at.append("repeated" if draw(st.booleans()) else "dropped")
            lst.append(lst[i]) if at[-1] == "repeated" else lst.pop(i)
        else:
            lst[i] = walk(v[i])
        return lst

    text = json.dumps(walk(_doc(rel)), allow_nan=True)
    for i, raw in enumerate(raws):
        text = text.replace(json.dumps(RAW.format(i)), raw)
    return Tampered(rel, " ".join(at), text)


@st.composite
def _tampered_csv(draw: st.DrawFn) -> Tampered:
    """A committed curves.csv with a cell, a column or a row changed."""
    rel = draw(st.sampled_from(CSV_FILES))
    rows = list(csv.reader(io.StringIO((ROOT / rel).read_text(encoding="utf-8"))))
    how = draw(st.integers(0, 5))
    r = draw(st.integers(0, len(rows) - 1))
    c = draw(st.integers(0, len(rows[0]) - 1))
    if how <= 2:
        rows[r][c] = draw(st.sampled_from(CELLS))
    elif how == 3:
        rows = [row[:c] + row[c + 1 :] for row in rows]
    elif how == 4:
        rows.insert(r, list(rows[r])) if draw(st.booleans()) else rows.pop(r)
    else:
        rows[r] = rows[r] + [draw(st.sampled_from(CELLS))]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return Tampered(rel, f"{how} at row {r} column {c}", buf.getvalue())


def _render(tmp_path: Path, rel: str, content: bytes | str | None) -> tuple[int, str, str]:
    """``reproduce --render`` on a root holding only ``rel`` (and a compaction's curves.json): exit code, standard
    error and the table; ``content`` None: ``rel`` is a folder."""
    root, out = tmp_path / "root", tmp_path / "out"
    for p in (root, out):
        shutil.rmtree(p, ignore_errors=True)
    target = root / rel
    target.parent.mkdir(parents=True)
    if rel.endswith(".csv"):
        shutil.copyfile(ROOT / rel.replace(".csv", ".json"), target.with_suffix(".json"))
    if content is None:
        target.mkdir()
    else:
        target.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    err, std = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
        rc = main(["reproduce", "--render", "--out", str(out), "--root", str(root)])
    table = (out / "claims.md").read_text(encoding="utf-8") if rc == 0 else ""
    return rc, err.getvalue(), table


_FLOAT = r"(-?\d+\.\d+|nan)"
#: the accuracies and shares a row prints, each with its interval: ``value [lo, hi]``
SHARES = [
    re.compile(rf"held out {_FLOAT} \[{_FLOAT}, {_FLOAT}\]"),
    re.compile(rf"scored on the next n=[\d,]+: {_FLOAT} \[{_FLOAT}, {_FLOAT}\]"),
    re.compile(rf"\] vs baseline {_FLOAT} \[{_FLOAT}, {_FLOAT}\]"),
    re.compile(rf" {_FLOAT} \[{_FLOAT}, {_FLOAT}\] \(chance"),
]
PERCENT = re.compile(r"(-?[\d.]+)%")


def _check(rel: str, rc: int, err: str, table: str) -> None:
    """Exit 2 with one ``walklens: error:`` line, or exit 0 with ``rel``'s rows in range and nothing odd."""
    assert "internal error" not in err and "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if rc != 0:
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("walklens: error: "), (rc, err)
        return
    assert not lines, err
    rows = [ln for ln in table.splitlines() if ln.endswith(f"| {rel} |")]
    assert rows, rel
    for row in rows:
        measured = row.split(" | ")[2]
        assert len(measured) < 4000 and not re.search(r"\d{17}|\binf\b", measured), measured
        for pat in SHARES:
            for m in pat.finditer(measured):
                assert not any(x.startswith("-") for x in m.groups()), measured  # not even -0.000
                v, lo, hi = (float(x) for x in m.groups())
                assert all(0 <= x <= 1 for x in (v, lo, hi) if not math.isnan(x)), measured
                assert any(map(math.isnan, (v, lo, hi))) or lo - 1e-3 <= v <= hi + 1e-3, measured  # as rounded
        assert all(not p.startswith("-") and float(p) <= 100 for p in PERCENT.findall(measured)), measured


def _fuzz(tmp_path: Path, rel: str, content: bytes | str | None) -> None:
    """Render ``rel`` holding ``content`` and check the answer (hypothesis counts the exits and the errors)."""
    rc, err, table = _render(tmp_path, rel, content)
    event(f"exit {rc}" + (f": {err.rsplit(': ', 1)[-1][:30]}" if rc else ""))
    _check(rel, rc, err, table)


@pytest.mark.slow
@settings(max_examples=150, **FUZZ)
@given(_tampered_json())
def test_render_of_a_tampered_json_result_is_a_table_or_one_line(tmp_path: Path, case: Tampered) -> None:
    _fuzz(tmp_path, case.rel, case.text)


@settings(max_examples=60, **FUZZ)
@given(_tampered_csv())
def test_render_of_a_tampered_curves_csv_is_a_table_or_one_line(tmp_path: Path, case: Tampered) -> None:
    _fuzz(tmp_path, case.rel, case.text)


@settings(max_examples=30, **FUZZ)
@given(st.sampled_from(READ), st.integers(0, 5), st.floats(0, 1), st.binary(max_size=64))
def test_render_of_cut_or_garbled_bytes_is_a_table_or_one_line(
    tmp_path: Path, rel: str, how: int, at: float, junk: bytes
) -> None:
    data = (ROOT / rel).read_bytes()
    cut = int(at * len(data))
    content: bytes | None = [data[:cut], data[:cut] + junk + data[cut:], junk, b"", data[:cut] + b"\x00", None][how]
    _fuzz(tmp_path, rel, content)


@pytest.mark.parametrize("rel", READ)
def test_render_of_each_untouched_result_file_passes_the_check(tmp_path: Path, rel: str) -> None:
    """The check above holds for the committed files (and finds their rows)."""
    rc, err, table = _render(tmp_path, rel, (ROOT / rel).read_bytes())
    assert rc == 0
    _check(rel, rc, err, table)
