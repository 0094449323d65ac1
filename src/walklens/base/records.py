"""The one check of every value walklens reads back: a file's kind and size before it is read, JSON's nesting and
constants, and each record's fields against a declared :class:`Schema`.

Stores, caches and committed result files are inputs like any other: a value read back from one is checked
before use, and a bad one is one :class:`~walklens.base.errors.InputError` line naming the file (or table), the row
and the field.  Reads never block or run away: only regular files are read (a FIFO, a device or a folder is
refused without waiting on it), their size is compared with a cap by ``fstat`` before a byte is read, and JSON
deeper than :data:`MAX_DEPTH` is refused instead of recursing.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InputError
from .numbers import NumberError, Range, kind

#: The deepest JSON any walklens file holds is 6 levels; 64 leaves room and stops a 100,000-deep line early.
MAX_DEPTH = 64
#: The default cap on one file read back (a steering set, a cache entry, a result file).
MAX_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Input:
    """A path a command reads: ``label`` names it in messages (``--db``, ``--data``, ``FILE``); ``folder``: a
    folder whose every file is an input (a concept cache and its index, a model directory)."""

    label: str
    path: Path
    folder: bool = False


#: Every file read through this module (and every path given to :func:`note_input`) since the command started:
#: :func:`walklens.base.outputs.atomic_open` refuses to write over any of them (the one rule for inputs and outputs).
_READ: dict[tuple[str, bool], Input] = {}
_READ_CAP = 100_000  # a long-lived explorer keeps at most this many (the oldest are forgotten)


def note_input(path: str | os.PathLike[str], label: str, folder: bool = False) -> None:
    """Register ``path`` as an input of the running command: no output may replace it (or, for a ``folder``,
    anything inside it) until :func:`forget_inputs`."""
    real = os.path.realpath(path)
    if len(_READ) >= _READ_CAP:
        _READ.pop(next(iter(_READ)))
    _READ[(real, folder)] = Input(label, Path(real), folder)


def inputs_read() -> list[Input]:
    """The inputs registered since the command started (:func:`note_input`, :func:`read_bytes`)."""
    return list(_READ.values())


def forget_inputs() -> None:
    """Start afresh: no input registered."""
    _READ.clear()


@contextlib.contextmanager
def one_command() -> Iterator[None]:
    """The inputs of one command: none registered inside the block, and the outer command's back after it (a
    command run by another, as ``reproduce`` runs ``sweep``, has its own)."""
    outer = dict(_READ)
    _READ.clear()
    try:
        yield
    finally:
        _READ.clear()
        _READ.update(outer)


def _kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _where(path: str | os.PathLike[str], label: str) -> str:
    """How a message names a file: ``label: path``, or the path alone when the label is the path."""
    return str(path) if label == str(path) else f"{label}: {path}"


def _read(path: str | os.PathLike[str], label: str, n: int, cap: int | None) -> tuple[bytes, int]:
    """The first ``n`` bytes of the regular file ``path`` and its size; ``cap``: refuse a file larger than it.

    Opened without blocking, so a FIFO is refused instead of waited on; the path is registered as an input."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    where = _where(path, label)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise InputError(f"{where}: cannot read it ({e.strerror or e})") from None
    note_input(path, label)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{where}: is {_kind_of(st.st_mode)}, not a regular file")
        if cap is not None and st.st_size > cap:
            raise InputError(f"{where}: holds {st.st_size:,} bytes, over the {cap:,} this file may hold")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(n), st.st_size
    except OSError as e:
        raise InputError(f"{where}: cannot read it ({e.strerror or e})") from None
    finally:
        os.close(fd)


def read_bytes(path: str | os.PathLike[str], label: str, max_bytes: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (symbolic links followed), at most ``max_bytes``.

    Opened without blocking, so a FIFO is refused instead of waited on; anything but a regular file, a file over
    the cap, or one that cannot be read is one :class:`InputError` line starting with ``label``."""
    data, _ = _read(path, label, max_bytes + 1, max_bytes)
    if len(data) > max_bytes:  # grew while being read
        raise InputError(f"{_where(path, label)}: holds over the {max_bytes:,} bytes this file may hold")
    return data


def read_head(path: str | os.PathLike[str], label: str, n: int) -> tuple[bytes, int]:
    """The first ``n`` bytes of the regular file ``path`` (fewer when it is shorter) and its size, opened and
    checked as :func:`read_bytes` does; nothing past ``n`` is read (a weights file's header)."""
    return _read(path, label, n, None)


def read_text(path: str | os.PathLike[str], label: str, max_bytes: int = MAX_BYTES) -> str:
    """:func:`read_bytes` decoded as UTF-8 (one line naming the offset of an undecodable byte)."""
    data = read_bytes(path, label, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{_where(path, label)}: not UTF-8 text (undecodable byte at offset {e.start})") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _depth(value: Any, limit: int) -> int:
    """The nesting depth of a parsed JSON value, counted without recursion (stops past ``limit``)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def parse_json(text: str | bytes, where: str, max_depth: int = MAX_DEPTH) -> Any:
    """``text`` as JSON, refused in one line when it is not JSON, holds ``NaN`` or ``Infinity`` (not JSON), an
    integer of over 4,300 digits, or nests deeper than ``max_depth``."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise InputError(f"{where}: nested deeper than {max_depth} levels") from None
    except (ValueError, TypeError) as e:  # JSONDecodeError, UnicodeDecodeError, the 4,300-digit limit
        raise InputError(f"{where}: not valid JSON ({str(e).splitlines()[0][:120]})") from None
    if _depth(value, max_depth) > max_depth:
        raise InputError(f"{where}: nested deeper than {max_depth} levels")
    return value


def read_json(path: str | os.PathLike[str], label: str, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """:func:`read_bytes` then :func:`parse_json`; every refusal names ``label`` and ``path``."""
    return parse_json(read_bytes(path, label, max_bytes), _where(path, label), max_depth)


_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "list": (list,),
    "dict": (dict,),
}


@dataclass(frozen=True)
class Field:
    """One declared field of a record: its JSON ``kind`` (``int``, ``float``, ``str``, ``bool``, ``list``,
    ``dict`` or ``any``), the :class:`~walklens.base.numbers.Range` a number must lie in, whether it may be missing
    (``required=False``), null (``nullable``; a number stored as null is read as NaN when ``nan``), or a NaN float
    (``nan``: reported as NaN, never ranked), the values a string may take (``choices``) and a string's or list's
    longest length (``max_len``)."""

    name: str
    kind: str
    range: Range | None = None
    required: bool = True
    nullable: bool = False
    nan: bool = False
    choices: tuple[str, ...] | None = None
    max_len: int | None = None

    def check(self, value: Any, where: str) -> Any:
        """``value`` checked (an int for ``int``, a float for ``float``), or one line naming ``where`` and the
        field."""
        here = f"{where}: field {self.name!r}"
        if value is None:
            if self.nan and self.kind == "float":
                return math.nan
            if self.nullable:
                return None
            raise InputError(f"{here} must not be null")
        if self.kind == "any":
            return value
        types = _TYPES[self.kind]
        if isinstance(value, bool) and self.kind != "bool" or not isinstance(value, types):
            raise InputError(f"{here} must be {'an' if self.kind == 'int' else 'a'} {self.kind}, not {kind(value)}")
        if self.kind in ("int", "float"):
            if isinstance(value, float) and math.isnan(value) and self.nan:
                return math.nan
            rng = self.range or Range(integer=self.kind == "int")
            try:
                return rng.check(value, "")
            except NumberError as e:
                raise InputError(f"{here} {e}") from None
        if self.max_len is not None and isinstance(value, (str, list, dict)) and len(value) > self.max_len:
            raise InputError(f"{here} is longer than {self.max_len:,}")
        if self.choices is not None and value not in self.choices:
            raise InputError(f"{here} must be one of {', '.join(self.choices)}, not {kind(value)}")
        return value


@dataclass(frozen=True)
class Schema:
    """A record's declared fields (the one place its names and ranges are written); ``extra``: whether keys not
    declared are kept (True) or refused."""

    name: str
    fields: tuple[Field, ...]
    extra: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def check(self, record: Any, where: str) -> dict[str, Any]:
        """``record`` (a JSON object) with every declared field checked: one :class:`InputError` line naming
        ``where`` (file or table, and row) and the field for a missing, extra or bad one."""
        if not isinstance(record, Mapping):
            raise InputError(f"{where}: a {self.name} must be an object, not {kind(record)}")
        out: dict[str, Any] = {}
        for f in self.fields:
            if f.name not in record:
                if f.required:
                    raise InputError(f"{where}: field {f.name!r} is missing")
                continue
            out[f.name] = f.check(record[f.name], where)
        unknown = [k for k in record if k not in out and k not in self.names]
        if unknown:
            if not self.extra:
                raise InputError(f"{where}: field {str(unknown[0])[:40]!r} is not one of a {self.name}'s")
            out.update({k: record[k] for k in unknown})
        return out

    def check_all(self, records: Any, where: str, max_rows: int | None = None) -> list[dict[str, Any]]:
        """A JSON list of records, each checked (``where`` + ``row i``); refused when not a list or longer than
        ``max_rows``."""
        if not isinstance(records, list):
            raise InputError(f"{where}: must be a list of {self.name}s, not {kind(records)}")
        if max_rows is not None and len(records) > max_rows:
            raise InputError(f"{where}: holds {len(records):,} rows, over the {max_rows:,} it may hold")
        return [self.check(r, f"{where} row {i}") for i, r in enumerate(records)]


def unique(rows: Iterable[Mapping[str, Any]], key: tuple[str, ...], where: str) -> None:
    """Refuse rows that repeat ``key`` (a row stored twice would be counted twice)."""
    seen: set[tuple[Any, ...]] = set()
    for i, r in enumerate(rows):
        k = tuple(r.get(n) for n in key)
        if k in seen:
            raise InputError(f"{where} row {i}: repeats {', '.join(key)} {str(k)[:80]} of an earlier row")
        seen.add(k)


def confined(folder: str | os.PathLike[str], name: str, label: str) -> Path:
    """``folder / name`` when that path stays inside ``folder`` once resolved (a shard named ``../x`` or an absolute
    path, or a symbolic link leading out, is refused in one line)."""
    top = Path(os.path.realpath(folder))
    target = Path(os.path.realpath(top / name))
    if target != top and top not in target.parents:
        raise InputError(f"{label}: {name[:80]!r} lies outside the folder {folder}")
    return target


__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "Field",
    "Input",
    "forget_inputs",
    "inputs_read",
    "note_input",
    "one_command",
    "Schema",
    "confined",
    "parse_json",
    "read_bytes",
    "read_head",
    "read_json",
    "read_text",
    "unique",
]
