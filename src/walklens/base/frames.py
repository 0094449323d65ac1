"""Tables as data frames: the ``to_pandas()`` of every tabular result (pandas is an optional extra).

Each result type builds its tables as plain columns, ``_columns(table) -> Columns`` (a dict of column name to a
list or 1-D NumPy array, every column the same length), in long ("tidy") form: one row per (layer, position, ...)
with the papers' names; ``to_pandas(table)`` hands them to :func:`frame`, which imports pandas only then and
refuses in one line when it is missing (``pip install 'walklens[pandas]'``).  The column names of every table
are documented in docs/notebooks.md, "Tables"; they are part of the API.

The helpers here know nothing of models or of the result types: :func:`long_table` flattens arrays indexed by
named axes, :func:`concat_columns` stacks tables, :func:`pick` chooses a table by name.
:func:`similarity_frame` tabulates the plain tensor :func:`walklens.similarity_map` returns.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import InputError, MissingDependencyError

if TYPE_CHECKING:
    from pandas import DataFrame
else:
    DataFrame = Any  # pandas is imported only when a table is asked for

#: A table as plain columns: name -> list or 1-D array, all of one length.
Columns = dict[str, Any]

INSTALL = "pip install 'walklens[pandas]'"

_LAYER_POINT = re.compile(r"^L(\d+)\.(\w+)$")


def pandas() -> ModuleType:
    """The pandas module, or one :class:`~walklens.base.errors.MissingDependencyError` line saying how to get it."""
    try:
        import pandas as pd
    except ImportError:
        raise MissingDependencyError(f"tables as data frames need pandas; run: {INSTALL}") from None
    return pd


# ---- plain columns ---------------------------------------------------------------------------------------------


def values(x: Any) -> np.ndarray:
    """``x`` (a tensor, an array, a list) as a NumPy array; a list holding None or text stays an object array."""
    if hasattr(x, "detach"):  # torch.Tensor
        x = x.detach().cpu()
        if x.dtype.is_complex:
            raise ValueError("complex tensors go in as their real and imaginary parts")
        return np.asarray(x.numpy())
    if isinstance(x, np.ndarray):
        return x
    items = list(x)
    if all(isinstance(v, (bool, np.bool_)) for v in items) or all(
        isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in items
    ):
        return np.asarray(items) if items else np.asarray(items, dtype=object)
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def point_layer(point: str) -> int | None:
    """The layer of a point name (``"L3.resid_mid"`` -> 3; ``embed``/``final`` -> None)."""
    m = _LAYER_POINT.match(point)
    return int(m.group(1)) if m else None


def point_kind(point: str) -> str:
    """The kind of a point name (``"L3.resid_mid"`` -> ``"resid_mid"``; ``embed`` -> ``"embed"``)."""
    m = _LAYER_POINT.match(point)
    return m.group(2) if m else point


def long_table(
    axes: Sequence[tuple[str, Sequence[Any]]],
    cells: Mapping[str, Any] | None = None,
    *,
    by_axis: Mapping[str, Mapping[str, Any]] | None = None,
    wide: Mapping[str, Any] | None = None,
    constants: Mapping[str, Any] | None = None,
) -> Columns:
    """One row per combination of ``axes`` (C order: the last axis varies fastest).

    ``axes``: ``(name, labels)`` pairs; the labels (one per index) are the axis's own column.  ``by_axis``:
    further columns that depend on one axis only (``{"point": {"layer": [...]}}``), placed after it.
    ``cells``: arrays of the axes' shape, flattened into one column each.  ``wide``: arrays with one more,
    trailing axis of size k, spread into columns ``name_0`` ... ``name_{k-1}``.  ``constants``: one value
    repeated on every row, placed first."""
    shape = [len(labels) for _, labels in axes]
    n = math.prod(shape)
    out: Columns = {}
    for name, value in (constants or {}).items():
        out[name] = values([value] * n)
    for i, (name, labels) in enumerate(axes):
        inner, outer = math.prod(shape[i + 1 :]), math.prod(shape[:i])
        out[name] = np.tile(np.repeat(values(labels), inner), outer)
        for extra, col in (by_axis or {}).get(name, {}).items():
            arr = values(col)
            if len(arr) != shape[i]:
                raise ValueError(f"column {extra!r}: {len(arr)} values for axis {name!r} of {shape[i]}")
            out[extra] = np.tile(np.repeat(arr, inner), outer)
    for name, x in (cells or {}).items():
        arr = values(x)
        if list(arr.shape) != shape:
            raise ValueError(f"{name}: shape {list(arr.shape)}, expected {shape}")
        out[name] = arr.reshape(-1)
    for name, x in (wide or {}).items():
        arr = values(x)
        if list(arr.shape[:-1]) != shape:
            raise ValueError(f"{name}: shape {list(arr.shape)}, expected {shape} + [k]")
        flat = arr.reshape(n, arr.shape[-1])
        for j in range(arr.shape[-1]):
            out[f"{name}_{j}"] = flat[:, j]
    return out


def record_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> Columns:
    """Columns from records (dicts); ``columns`` fixes their order (else first appearance); a key a record
    lacks is None there."""
    names = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows for k in r))
    return {k: values([r.get(k) for r in rows]) for k in names}


def attribute_table(items: Iterable[Any], names: Sequence[str]) -> Columns:
    """Columns of the attributes ``names`` (fields or properties) of each item, in that order: one row an item."""
    return record_table([{k: getattr(item, k) for k in names} for item in items], names)


def concat_columns(parts: Sequence[Columns]) -> Columns:
    """The rows of several tables one after the other (a column some lack is None there)."""
    names = list(dict.fromkeys(k for p in parts for k in p))
    sizes = [_length(p) for p in parts]
    out: Columns = {}
    for k in names:
        chunks = []
        for p, n in zip(parts, sizes):
            if k in p:
                chunks.append(np.asarray(p[k], dtype=object) if not isinstance(p[k], np.ndarray) else p[k])
            else:
                chunks.append(np.full(n, None, dtype=object))
        if len({c.dtype.kind for c in chunks}) > 1 or any(c.dtype == object for c in chunks):
            chunks = [c.astype(object) for c in chunks]
        out[k] = np.concatenate(chunks) if chunks else np.empty(0, dtype=object)
    return out


def with_constants(constants: Mapping[str, Any], columns: Columns) -> Columns:
    """``columns`` with ``constants`` (one value each, repeated on every row) as first columns."""
    n = _length(columns)
    return {**{k: values([v] * n) for k, v in constants.items()}, **columns}


def pick(table: str, tables: Mapping[str, Callable[[], Columns]], what: str) -> Columns:
    """The columns of ``tables[table]``, or one :class:`InputError` line naming the tables ``what`` has."""
    if table not in tables:
        raise InputError(f"{what} has no table {table!r}; its tables: {', '.join(tables)}")
    return tables[table]()


def _length(columns: Columns) -> int:
    sizes = {len(v) for v in columns.values()}
    if len(sizes) > 1:
        raise ValueError(f"columns of different lengths: { {k: len(v) for k, v in columns.items()} }")
    return sizes.pop() if sizes else 0


# ---- data frames -----------------------------------------------------------------------------------------------


def _series(pd: ModuleType, col: Any) -> Any:
    """A column for pandas: object columns of integers or booleans with gaps become its nullable ``Int64`` /
    ``boolean`` types, of numbers with gaps float (NaN); others are kept as they are."""
    arr = values(col)
    if arr.dtype != object:
        return arr
    cells = arr.tolist()
    present = [v for v in cells if v is not None]
    gaps = len(present) < len(cells)
    if not present:
        return arr
    if all(isinstance(v, bool) for v in present):
        return pd.array(cells, dtype="boolean") if gaps else np.asarray(cells, dtype=bool)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pd.array(cells, dtype="Int64") if gaps else np.asarray(cells, dtype=np.int64)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return np.asarray([math.nan if v is None else float(v) for v in cells], dtype=np.float64)
    return arr


def frame(columns: Columns, attrs: Mapping[str, Any] | None = None) -> DataFrame:
    """A :class:`pandas.DataFrame` of plain columns (pandas imported here); ``attrs``: the result's scalar
    fields (model name, dtype, ...), kept as ``DataFrame.attrs``."""
    pd = pandas()
    _length(columns)
    df = pd.DataFrame({k: _series(pd, v) for k, v in columns.items()})
    df.attrs.update(dict(attrs or {}))
    return df


# ---- similarity maps -------------------------------------------------------------------------------------------


def similarity_columns(maps: Any, tokens: Sequence[str] | None = None) -> Columns:
    """Columns of :func:`similarity_frame`."""
    keyed = dict(maps) if isinstance(maps, Mapping) else {None: maps}
    parts = []
    for key, m in keyed.items():
        arr = values(m)
        if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
            raise InputError(f"a similarity map is [tokens, tokens], got {list(arr.shape)}")
        T = arr.shape[0]
        if tokens is not None and len(tokens) != T:
            raise InputError(f"{len(tokens)} tokens for a map of {T} positions")
        toks = list(tokens) if tokens is not None else [None] * T
        parts.append(
            long_table(
                [("i", range(T)), ("j", range(T))],
                {"similarity": arr},
                by_axis={"i": {"token_i": toks}, "j": {"token_j": toks}},
                constants={"map": key} if key is not None else None,
            )
        )
    return concat_columns(parts)


__all__ = [
    "Columns",
    "DataFrame",
    "INSTALL",
    "attribute_table",
    "concat_columns",
    "frame",
    "long_table",
    "pandas",
    "pick",
    "point_kind",
    "point_layer",
    "record_table",
    "similarity_columns",
    "values",
    "with_constants",
]
