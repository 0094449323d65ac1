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


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"short name, .gguf path, local directory or hub id (default: {DEFAULT_MODEL})")


def add_output_args(p: argparse.ArgumentParser, out: bool = True) -> None:
    p.add_argument("--json", metavar="FILE", help="write every number to this JSON file")
    if out:
        p.add_argument("--out", metavar="DIR", help="write a self-contained HTML report (and PNGs) here")


def add_text_args(p: argparse.ArgumentParser, name: str = "text") -> None:
    p.add_argument(name, help="the text (use @FILE to read it from a file)")
    p.add_argument("--truncate", action="store_true", help="cut a text longer than the model's context")


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
    """Check the output paths, then load ``--model``."""
    check_outputs(args)
    return load_model(args.model)


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
