"""The result documents :mod:`.readers` reads, declared once: the fields each reader takes from a committed result
file (the names its writer writes: ``tests/test_claims.py`` checks them against the writers' dataclasses and
columns) and the range of every value, so an impossible figure (a negative accuracy, an interval that misses its
value, a 300-digit number) is refused in one line naming the file, the row or key path and the field, never
rendered.  Files are read by :mod:`walklens.base.records`: regular files only, their size capped before reading, their
nesting bounded, and each registered as an input that no output may replace.

NaN is reported as NaN and never ranked: a field may be NaN (``nan=True``; written as null, since JSON has no
NaN) only where its writer writes one for a reason (a ratio with no baseline hit, a jackknife of too few groups).
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...base.errors import InputError
from ...base.numbers import NumberError, Range, kind, show
from ...base.records import Field, Schema, read_json, read_text

#: The most bytes a result file may hold (the largest committed one, a ``power --json`` file, holds 1.7 MB).
RESULT_BYTES = 32 * 2**20
#: The most rows a result file's list may hold (runs, steering rows, compaction points).
MAX_ROWS = 100_000
NAME = 400  # the longest model name, label or key a row prints
LABEL = "result"  # messages: "result: FILE: ...", "is the result file FILE"

ACC = Range(0, 1)  # an accuracy, a share, a probability, a p-value
BASELINE = Range(0, 1, open_lo=True)  # an accuracy a figure is divided by
DIFF = Range(-1, 1)  # a difference of two accuracies; a cosine
COUNT = Range(0, 2**53, integer=True)
POSITIVE = Range(1, 2**53, integer=True)
SCALE = Range(0, 1e6)  # a normalised figure, a share kept, a margin, a rank: finite, >= 0
WIDE = Range(-1e6, 1e6)  # the bounds of a jackknife interval of a correlation
SIMILARITY = Range(-1e15, 1e15)  # inner products grow with the model's norms (1e7 is real)
LAYER = Range(-(10**6), 10**6, integer=True)


class _Schema(Schema):
    """A :class:`~walklens.base.records.Schema` whose numbers read ``-0.0`` as ``0.0`` (a negated zero never prints as
    ``-0.000``)."""

    def check(self, record: Any, where: str) -> dict[str, Any]:
        out = super().check(record, where)
        return {k: v + 0.0 if isinstance(v, float) else v for k, v in out.items()}


def _num(name: str, rng: Range, **kw: Any) -> Field:
    return Field(name, "float", rng, **kw)


def _int(name: str, rng: Range = COUNT, **kw: Any) -> Field:
    return Field(name, "int", rng, **kw)


def _str(name: str, max_len: int = NAME, **kw: Any) -> Field:
    return Field(name, "str", max_len=max_len, **kw)


def _obj(name: str, **kw: Any) -> Field:
    return Field(name, "dict", **kw)


def _list(name: str, **kw: Any) -> Field:
    return Field(name, "list", max_len=MAX_ROWS, **kw)


def _doc(name: str, *fields: Field) -> Schema:
    """A declared document or record: the fields a reader takes (the file may hold more, kept as they are)."""
    return _Schema(name, fields, extra=True)


def _interval(lo: str = "lo", hi: str = "hi", rng: Range = ACC, nan: bool = False) -> tuple[Field, Field]:
    return _num(lo, rng, nan=nan), _num(hi, rng, nan=nan)


# ---- walklens report's summary.json: a sweep's runs -------------------------------------------------------------

SWEEP_RUN = _doc("sweep run", _str("model"), _int("test", Range(1, 2, integer=True)), _int("shots"),
                 _int("n_items", POSITIVE), _int("n_schemes", POSITIVE), _obj("metrics"))  # fmt: skip
SWEEP_METRIC = _doc("metric", _num("baseline", BASELINE), _obj("kfold"), _obj("bootstrap", required=False,
                    nullable=True), _obj("paired", required=False, nullable=True))  # fmt: skip
STANDARD = _doc("standard scheme", _str("scheme", 4000), _num("acc", ACC))
KFOLD = _doc("k-fold held-out best", _num("acc", ACC), *_interval())
BOOTSTRAP = _doc("bootstrap", *_interval("norm_lo", "norm_hi", SCALE, nan=True))
PAIRED = _doc("paired test", _num("diff", DIFF), *_interval(rng=DIFF), _num("p", ACC))

# ---- walklens hellaswag test1|test2 --skip N --json: one scheme scored beside the baseline -----------------------

HELDOUT_RUN = _doc("held-out run", _str("model"), Field("test", "str", choices=("test1", "test2")), _int("shots"),
                   _str("scheme", 4000), _int("skip", POSITIVE), _int("n", POSITIVE),
                   _obj("paired", required=False, nullable=True))  # fmt: skip
HELDOUT_METRIC = _doc("paired figures", _num("acc", ACC), *_interval(), _num("baseline", ACC),
                      *_interval("baseline_lo", "baseline_hi"), _num("norm", SCALE, nan=True),
                      *_interval("norm_lo", "norm_hi", SCALE, nan=True), _obj("paired"))  # fmt: skip

HELDOUT_PICKS = _doc("held-out picks", _str("model"), Field("test", "str", choices=("test1", "test2")), _int("shots"),
                     _str("scheme", 4000), _int("skip", POSITIVE), _list("gold"), _list("predictions"),
                     _list("baseline_predictions", required=False, nullable=True))  # fmt: skip

# ---- walklens hellaswag folds --json: a sweep's k-fold held-out best item by item, with its controls -----------

FOLDS_DOC = _doc("fold picks", _str("model"), _int("test", Range(1, 2, integer=True)), _int("shots"),
                 _int("n", POSITIVE), _str("gold", MAX_ROWS), _obj("baseline"), _obj("heldout"), _obj("controls"),
                 _obj("fold_schemes"), _obj("kfold_acc_report"))  # fmt: skip

# ---- walklens hellaswag selection --json: a sweep's top schemes in sample, each held out item by item --------------

SELECTION_DOC = _doc("selection picks", _str("model"), _int("test", Range(1, 2, integer=True)), _int("shots"),
                     _str("metric", 20), _int("chosen_on", POSITIVE), _int("skip", POSITIVE), _int("n", POSITIVE),
                     _str("gold", MAX_ROWS), _obj("baseline"), _list("schemes"))  # fmt: skip

# ---- walklens hellaswag compaction: curves.csv (its columns) and curves.json -------------------------------------

COMPACTION_POINT = _doc("compaction point", _int("shots"), _str("strategy"), _str("ratio", 40, nullable=True),
                        _int("n"), _num("kept_acc", SCALE, nan=True),
                        *_interval("kept_acc_lo", "kept_acc_hi", SCALE, nan=True), _str("spec", 4000),
                        _num("kept_acc_norm", SCALE, nan=True, nullable=True),
                        *_interval("kept_acc_norm_lo", "kept_acc_norm_hi", SCALE, nan=True),
                        _num("inputs", SCALE, nan=True, nullable=True),
                        _num("inputs_full", SCALE, nan=True, nullable=True))  # fmt: skip
COMPACTION_DOC = _doc("compaction document", _str("model", required=False))

# ---- the --json of heads, power, steer, cooccur, simmap --blocks, kernels, walk --self-rank, concept-eval --------

SELF_MASS_DOC = _doc("heads document", _str("model", required=False), _obj("self_mass"))
SELF_MASS = _doc("self mass", _list("mass"), _list("uniform"))
ALIGNMENT_SERIES = ("mean", "random_mean", "other_mean", "random_hi", "other_hi")
ALIGNMENT_DOC = _doc("power document", _str("model"), _obj("alignment"))
ALIGNMENT = _doc("alignment", _list("points"), _int("n_tokens"), *map(_list, ALIGNMENT_SERIES))
STEER_ROW = _doc("steering row", _str("method", 40), Field("layers", "list", max_len=256),
                 _num("alpha", SIMILARITY), _int("target_rank"), _num("target_prob", ACC, nan=True))  # fmt: skip
COOCCUR_STATS = ("pmi_dot", "pmi_cos", "dot_cos", "partial_cos", "matched_cos", "excess_cos")
COOCCUR_COUNTS = ("n_pairs", "window", "min_count", "n_tokens", "n_groups", "n_clusters")
COOCCUR = _doc("co-occurrence document", _str("model_name"), *map(_int, COOCCUR_COUNTS), *map(_obj, COOCCUR_STATS))
CORRELATION = _doc("correlation", _num("rho", Range(-2, 2), nan=True), *_interval(rng=WIDE, nan=True))
BLOCKS_DOC = _doc("similarity blocks document", _str("model"), _list("tokens"), _obj("maps"))
BLOCK_MAP = _doc("map", _list("classes"))
BLOCK_CLASS = _doc("class contrast", _str("cls"), _int("n"), _num("contrast", SIMILARITY),
                   *_interval(rng=SIMILARITY), _num("p_above", ACC))  # fmt: skip
SELF_BIAS_DOC = _doc("kernels document", _str("model"), _obj("self_bias"))
SELF_BIAS = _doc("self-bias count", _int("heads", POSITIVE), _int("negative"), _int("significant"),
                 _num("margin", SCALE), _num("alpha", Range(0, 1, open_lo=True)), _num("expected", SCALE),
                 _num("p_chance", ACC))  # fmt: skip
SELF_RANK_DOC = _doc("walk document", _str("model"), Field("encoder_decoder", "bool"), _list("stacks"))
SELF_RANK = _doc("stack reading", _str("stack", nullable=True), _int("vocab"), _list("token_ids"),
                 _num("closer", ACC), *_interval("closer_lo", "closer_hi"), _obj("summary"))  # fmt: skip
RANK_SUMMARY = _doc("rank summary", _num("median_rank_own", SCALE), _num("median_rank_control", SCALE))
CONCEPT_DOC = _doc("concept-eval document", _str("model"), _int("n_items"), _obj("comparisons"))
COMPARISON = _doc("comparison", _num("share", ACC), *_interval(), _num("chance", ACC))


# ---- reading and checking ------------------------------------------------------------------------------------------


def load_json(path: str | os.PathLike[str]) -> Any:
    """A result file's JSON, read by :func:`walklens.base.records.read_json` (an input of the command)."""
    return read_json(path, LABEL, RESULT_BYTES)


def name(key: Any) -> str:
    """A key of a file as a message quotes it (a long one cut)."""
    return show(str(key), 60)


def key(doc: Any, k: str, where: str, what: str) -> Any:
    """``doc[k]``, or one line: ``doc`` is not an object, or holds no ``what`` ``k``."""
    if not isinstance(doc, Mapping):
        raise InputError(f"{where}: must be an object, not {kind(doc)}")
    if k not in doc:
        raise InputError(f"{where}: no {what} {name(k)}")
    return doc[k]


def ordered(rec: Mapping[str, Any], where: str, *fields: str) -> None:
    """Refuse an interval whose bounds do not hold its value: ``rec[fields[0]] <= rec[fields[1]] <= ...`` (a NaN
    is not compared: it is reported as NaN)."""
    vals = [rec[f] for f in fields]
    for (a, x), (b, y) in zip(zip(fields, vals), zip(fields[1:], vals[1:])):
        if not (math.isnan(x) or math.isnan(y)) and x > y + 1e-9 * max(1.0, abs(y)):
            raise InputError(f"{where}: field {a!r} ({x:.6g}) is above field {b!r} ({y:.6g})")


def numbers(values: Any, rng: Range, where: str, field: str, depth: int = 1) -> list[float]:
    """The numbers of a list field (``depth`` 2: a list of lists, flattened), each in ``rng``."""
    rows = values if depth == 2 else [values]
    if not isinstance(rows, list):
        raise InputError(f"{where}: field {field!r} must be a list, not {kind(rows)}")
    out: list[float] = []
    for i, row in enumerate(rows):
        at = f"[{i}]" if depth == 2 else ""
        if not isinstance(row, list):
            raise InputError(f"{where}: field {field!r}{at} must be a list, not {kind(row)}")
        for j, v in enumerate(row):
            try:
                out.append(float(rng.check(v)))
            except NumberError as e:
                raise InputError(f"{where}: field {field!r}{at}[{j}] {e}") from None
    return out


def _cell(f: Field, cell: str | None, where: str) -> Any:
    """A CSV cell as its field's kind: empty is null (NaN for a ``nan`` field), ``nan`` a NaN float."""
    if cell is None or cell == "":
        return None
    if f.kind not in ("int", "float"):
        return cell
    try:
        return int(cell) if f.kind == "int" else float(cell)
    except ValueError:
        what = "an integer" if f.kind == "int" else "a number"
        raise InputError(f"{where}: field {f.name!r} must be {what}, not {show(cell)}") from None


def read_csv(path: Path, schema: Schema) -> list[tuple[str, dict[str, Any]]]:
    """A result CSV's rows (``where`` and record), each checked against ``schema`` (``where``: file and line)."""
    text = read_text(path, LABEL, RESULT_BYTES)
    out: list[tuple[str, dict[str, Any]]] = []
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        for row in reader:
            where = f"{path} line {reader.line_num}"
            if len(out) >= MAX_ROWS:
                raise InputError(f"{path}: holds over the {MAX_ROWS:,} rows a result file may hold")
            rec = {f.name: _cell(f, row[f.name], where) for f in schema.fields if f.name in row}
            out.append((where, schema.check(rec, where)))
    except csv.Error as e:
        raise InputError(f"{path}: not CSV ({str(e)[:120]})") from None
    return out


__all__ = ["RESULT_BYTES", "MAX_ROWS", "key", "load_json", "name", "numbers", "ordered", "read_csv"]
