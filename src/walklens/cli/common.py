"""Options and helpers shared by the sub-commands."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError
from ..loading import DEFAULT_MODEL, LoadedModel, load_model
from ..outputs import STDOUT, check_dir, check_file, write_atomic
from ..precision import DEFAULT_DTYPE, DEVICES, DTYPES


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"short name, .gguf path, local directory or hub id (default: {DEFAULT_MODEL})")
    p.add_argument("--dtype", choices=tuple(DTYPES), default=DEFAULT_DTYPE,
                   help=f"the dtype the model runs in (default: {DEFAULT_DTYPE}; see docs/dtype.md)")
    p.add_argument("--device", choices=DEVICES, default="cpu", help="where the model runs (default: cpu)")


def add_output_args(p: argparse.ArgumentParser, out: bool = True) -> None:
    p.add_argument("--json", metavar="FILE", help="write every number to this JSON file")
    if out:
        p.add_argument("--out", metavar="DIR", help="write a self-contained HTML report (and PNGs) here")


def add_text_args(p: argparse.ArgumentParser, name: str = "text") -> None:
    p.add_argument(name, help="the text (use @FILE to read it from a file)")
    p.add_argument("--truncate", action="store_true", help="cut a text longer than the model's context")


SEED_LIMIT = 2 ** 63  # torch.manual_seed and numpy accept 0 <= seed < 2**63 (and more, but not for both)


def seed_arg(text: str) -> int:
    """argparse ``type=`` of a ``--seed``: an integer 0 <= seed < 2**63, refused in one line otherwise."""
    try:
        v = int(text)
    except ValueError:
        v = -1
    if not 0 <= v < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"a seed must be an integer from 0 to 2**63-1, not {text[:40]!r}")
    return v


def finite_arg(text: str) -> float:
    """argparse ``type=`` of a finite number (nan and inf refused in one line)."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text[:40]!r}")
    return v


def read_text(value: str) -> str:
    """A literal text, or the contents of FILE when given as ``@FILE``."""
    if value.startswith("@"):
        path = Path(value[1:])
        if not path.is_file():
            raise InputError(f"{path}: no such file")
        try:
            return path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{path}: not UTF-8 text (undecodable byte at offset {e.start})") from None
        except OSError as e:
            raise InputError(f"{path}: {e.strerror}") from None
    return value


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse bad output paths (``--json`` FILE or ``-``, ``--out`` DIR, ``--cache`` DIR) before any model loads
    or any computation: one :class:`InputError` line naming the option (rules: :mod:`walklens.outputs`)."""
    js = getattr(args, "json", None)
    if js and js != STDOUT:
        check_file(js, "--json")
    for opt in ("out", "cache"):
        value = getattr(args, opt, None)
        if value:
            check_dir(value, f"--{opt}")


def load(args: argparse.Namespace) -> LoadedModel:
    """Check the output paths, then load ``--model`` in ``--dtype`` on ``--device``."""
    check_outputs(args)
    return load_model(args.model, **model_options(args))


def model_options(args: argparse.Namespace) -> dict[str, str]:
    """``load_model``'s ``dtype`` and ``device`` from ``--dtype`` and ``--device`` (:func:`add_model_args`)."""
    return {"dtype": getattr(args, "dtype", DEFAULT_DTYPE), "device": getattr(args, "device", "cpu")}


def _jsonable(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return _jsonable(x.tolist())
    if isinstance(x, complex):
        return [_jsonable(x.real), _jsonable(x.imag)]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "__dataclass_fields__"):
        return {k: _jsonable(getattr(x, k)) for k in x.__dataclass_fields__ if not k.startswith("_")}
    return x


def write_json(path: str | os.PathLike[str], data: Any) -> Path | None:
    """Write JSON to standard output (``-``) or to a file by the rules of :mod:`walklens.outputs` (atomic
    replace of a regular file, symlinks written through, devices/FIFOs/folders refused)."""
    text = json.dumps(_jsonable(data), separators=(",", ":"))
    if str(path) == STDOUT:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return None
    return write_atomic(path, text, "--json")
