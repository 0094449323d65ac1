"""Typed exceptions. Every user-facing failure is one of these; the CLI prints one line and exits 2."""

from __future__ import annotations


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
]
