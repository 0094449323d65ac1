"""Typed exceptions. Every user-facing failure is one of these; the CLI prints one line and exits 2.

Text is UTF-8 everywhere, and the one rule for a string that UTF-8 cannot carry (a lone surrogate: what
``os.fsdecode`` and Python's ``argv`` make of undecodable bytes, or a JSON ``"\\ud800"``) lives here too: a text to
analyse is refused in one line (:func:`utf8_text`), a name or a path shown in a view or a message is escaped
(:func:`displayable`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

_T = TypeVar("_T")


class WalklensError(Exception):
    """Base class for all errors walklens raises on bad input or a bad environment."""

    exit_code: int = 2


class UnknownModelError(WalklensError):
    """The model spec is neither a known name, a local path, a .gguf file nor a cached hub id."""


class UnsupportedFamilyError(WalklensError):
    """The model's ``config.model_type`` has no adapter."""


class MissingDependencyError(WalklensError):
    """An optional package (a model package, gguf, chromium, ...) is not installed."""


class InputError(WalklensError):
    """Bad user input: empty text, bad option value, malformed file."""


class EmptyTextError(InputError):
    """The text to analyse is empty or tokenises to nothing."""


class ContextTooLongError(InputError):
    """The text is longer than the model's context window (use truncate=True / --truncate)."""


class DataFormatError(InputError):
    """A data file is malformed; the message names the file and line."""


class WalklensWarning(UserWarning):
    """Base class of walklens' warnings; the CLI prints each as one line ``walklens: warning: ...``."""


class SlowDtypeWarning(WalklensWarning):
    """The model's dtype has no fast kernels on the chosen device (e.g. bfloat16 on a CPU without AMX)."""


class NonFiniteWarning(WalklensWarning):
    """A computation produced NaN or inf (an overflowing dose, a float16 model): its numbers are reported as
    NaN and never ranked."""


class ReducedWarning(WalklensWarning):
    """An option's value was reduced to what the model allows (``kernels --length`` cut to its context)."""


class StaleCacheWarning(WalklensWarning):
    """A cache entry failed its check when read back (tampered, truncated, out of range): it is discarded and
    computed again, said in one line."""


def find(items: Iterable[_T], match: Callable[[_T], bool], missing: str) -> _T:
    """The first of ``items`` that ``match`` accepts; an :class:`InputError` saying ``missing`` when none does."""
    for x in items:
        if match(x):
            return x
    raise InputError(missing)


def utf8_text(text: str, what: str = "the text") -> str:
    """``text`` when UTF-8 can carry it, else one :class:`InputError` line naming ``what`` and the character of its
    first lone surrogate."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"{what} holds a lone surrogate at character {e.start}; walklens reads UTF-8 text") from None
    return text


def displayable(text: str) -> str:
    """``text`` as a page, a terminal or a log can show it: a lone surrogate escaped (``\\udcff``), the rest as it
    is."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def first_line(e: BaseException, limit: int = 240) -> str:
    """An exception's message on one line (its lines joined), cut to ``limit`` characters."""
    text = " ".join(str(e).split()) or e.__class__.__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = [
    "WalklensError",
    "UnknownModelError",
    "UnsupportedFamilyError",
    "MissingDependencyError",
    "InputError",
    "EmptyTextError",
    "ContextTooLongError",
    "DataFormatError",
    "WalklensWarning",
    "SlowDtypeWarning",
    "NonFiniteWarning",
    "ReducedWarning",
    "StaleCacheWarning",
    "displayable",
    "find",
    "first_line",
    "utf8_text",
]
