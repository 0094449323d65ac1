"""Options and helpers shared by the sub-commands."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError
from ..loading import DEFAULT_MODEL, LoadedModel, load_model


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
        return path.read_text(encoding="utf-8")
    return value


def load(args: argparse.Namespace) -> LoadedModel:
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


def write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Write JSON atomically (a temp file renamed), so an interruption never leaves half a file."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_jsonable(data), separators=(",", ":")), encoding="utf-8")
    tmp.replace(path)
    return path
