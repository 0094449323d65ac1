"""The one check of every number a user gives: finite, of the right kind (integer or not) and in range.

A :class:`Range` describes what a value may be; the same object checks a command-line string
(:meth:`Range.parse`, and :meth:`Range.arg` as an argparse ``type=``), a value of the explorer's JSON requests
and a value of a TOML experiment or grid file (:meth:`Range.check`).  Every refusal is one line
``{name} must be {what}, not {value}`` (a :class:`NumberError`), whatever the input: ``nan``, ``inf``,
``1e309``, an empty string, a 400-digit integer, a boolean, a list.  Callers turn it into their own error
(argparse's one line, the explorer's 400, the experiment file's ``FILE: key: ...``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import InputError

SHOWN = 40  # characters of a refused value quoted in a message


class NumberError(InputError):
    """A number that is not finite, not of the right kind or out of its range."""


def show(value: Any, limit: int = SHOWN) -> str:
    """A refused value as a message quotes it: ``repr``, cut to ``limit`` characters (a 400-digit integer is
    not printed whole)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**limit:
        return f"an integer of {len(str(abs(value))) if value.bit_length() < 14_000 else 'over 4,000'} digits"
    r = repr(value)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def kind(value: Any) -> str:
    """A refused value that is not a number, by its kind only (``a string``, ``a list``): a request's text is
    never echoed into an error."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return show(value)
    names: dict[type[object], str] = {str: "a string", list: "a list", dict: "an object (a table)", tuple: "a list"}
    return names.get(type(value), f"a {type(value).__name__}")


@dataclass(frozen=True)
class Range:
    """What a number may be: ``integer`` or any finite number, ``lo <= v <= hi`` (``None``: unbounded;
    ``open_lo``: ``v > lo``).  ``what`` replaces the generated description (``"an integer from 0 to 2**63-1"``)."""

    lo: float | None = None
    hi: float | None = None
    integer: bool = False
    open_lo: bool = False
    what: str | None = None

    def describe(self) -> str:
        """``"from 1 to 64 (an integer)"``, ``"a positive integer"``, ``"an integer from 0 up"``, ``"within ±1e+06 (a
        finite number)"``,
        ``"a finite number > 0"``."""
        if self.what:
            return self.what
        noun = "an integer" if self.integer else "a finite number"
        lo, hi = self.lo, self.hi
        if lo is not None and hi is not None:
            if self.open_lo:
                return f"{noun} > {_num(lo)} and <= {_num(hi)}"
            if not self.integer and lo == -hi:
                return f"within ±{hi:g} ({noun})"
            return f"from {_num(lo)} to {_num(hi)} ({noun})"
        if lo == 1 and hi is None and self.integer and not self.open_lo:
            return "a positive integer"
        if lo is not None and self.integer and not self.open_lo:
            return f"{noun} from {_num(lo)} up"
        if lo is not None:
            return f"{noun} {'>' if self.open_lo else '>='} {_num(lo)}"
        if hi is not None:
            return f"{noun} <= {_num(hi)}"
        return noun

    def refuse(self, name: str, shown: str) -> NumberError:
        """The one-line refusal ``{name} must be {what}, not {shown}``."""
        head = f"{name} must be" if name else "must be"
        return NumberError(f"{head} {self.describe()}, not {shown}")

    def check(self, value: Any, name: str = "") -> Any:
        """``value`` (a JSON or TOML value) as an int (``integer``) or a float, else :class:`NumberError`.
        Booleans and non-numbers are refused; integral floats are accepted as integers; a huge integer is
        compared exactly (never converted to a float that overflows)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.refuse(name, kind(value))
        if isinstance(value, float):
            if not math.isfinite(value) or (self.integer and not value.is_integer()):
                raise self.refuse(name, show(value))
            value = int(value) if self.integer else value
        elif self.integer is False and abs(value) > 2**1023:
            raise self.refuse(name, show(value))  # beyond any float: refused before float() overflows
        if not self._within(value):
            raise self.refuse(name, show(value))
        return value if self.integer else float(value)

    def _within(self, v: int | float) -> bool:
        if self.lo is not None and (v <= self.lo if self.open_lo else v < self.lo):
            return False
        return self.hi is None or v <= self.hi

    def parse(self, text: str, name: str = "") -> Any:
        """A command-line string as :meth:`check` wants it: an integer literal (``integer``) or a float
        literal; an empty, blank or over-long string is refused like any other bad value."""
        t = text.strip()
        if not t or len(t) > 400:
            raise self.refuse(name, show(text))
        try:
            value: Any = int(t) if self.integer else float(t)
        except (ValueError, OverflowError):
            raise self.refuse(name, show(text)) from None
        try:
            return self.check(value, name)
        except NumberError:
            raise self.refuse(name, show(text)) from None

    def arg(self, name: str = "") -> Callable[[str], Any]:
        """An argparse ``type=``: :meth:`parse`, its refusal as argparse's one line ``argument --x: ...``."""

        def parse(text: str) -> Any:
            try:
                return self.parse(text, name)
            except NumberError as e:
                raise argparse.ArgumentTypeError(str(e)) from None

        parse.__name__ = "number"  # argparse names the type in some messages
        return parse


def _num(v: float) -> str:
    """A bound as a message shows it: ``64``, ``1e+06``; a huge integer bound by its digit count."""
    if isinstance(v, int) and abs(v) >= 10**30:
        return f"a {len(str(abs(v)))}-digit {'-' if v < 0 else ''}integer"
    return str(v) if isinstance(v, int) else (str(int(v)) if v.is_integer() and abs(v) < 1e16 else f"{v:g}")


# ---- the ranges the commands, the explorer and the experiment files share ----------------------------------------

SEED = Range(0, 2**63 - 1, integer=True, what="an integer from 0 to 2**63-1")  # torch and numpy both take these
COUNT = Range(0, integer=True)  # a count that may be 0 (--shots, --recent)
POSITIVE_INT = Range(1, integer=True)  # a count of at least 1 (--limit, --k, --max-new-tokens)
FINITE = Range()  # any finite number (--margin)
POSITIVE = Range(0, open_lo=True, what="a positive number (finite)")  # > 0: --temperature, --max-memory
NON_NEGATIVE = Range(0, what="a non-negative number (finite)")  # a finite number >= 0
PROBABILITY = Range(0, 1, open_lo=True)  # a mass 0 < p <= 1 (--top-p)
MAX_ALPHA = 1e6  # |alpha| of steering: beyond it float32 activations overflow for every family we run
ALPHA = Range(-MAX_ALPHA, MAX_ALPHA)
PORT = Range(0, 65535, integer=True)


def numbers_list(text: str, rng: Range, name: str) -> list[Any]:
    """A comma-separated list of numbers (``--alpha 0,2,4``), each checked by ``rng``; an empty list or an
    empty item is refused."""
    parts = text.split(",")
    if not text.strip() or any(not p.strip() for p in parts):
        raise NumberError(f"{name} must be comma-separated numbers, each {rng.describe()}, not {show(text)}")
    return [rng.parse(p, name) for p in parts]


__all__ = [
    "Range",
    "NumberError",
    "show",
    "numbers_list",
    "SEED",
    "COUNT",
    "POSITIVE_INT",
    "FINITE",
    "POSITIVE",
    "NON_NEGATIVE",
    "PROBABILITY",
    "ALPHA",
    "MAX_ALPHA",
    "PORT",
]
