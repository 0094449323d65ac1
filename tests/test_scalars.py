"""Results alike everywhere (issue 56): a result's scalar fields are Python numbers, never 0-d tensors or NumPy
scalars (``round()``, ``json`` and f-strings take them as they are), checked on one instance of every public result
type (tests/_views.py)."""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import numpy as np
import torch

SCALARS = {"float": float, "int": int, "float | None": float, "int | None": int, "bool": bool}


def not_python_scalars(result: Any) -> list[str]:
    """The fields declared as a Python scalar that hold something else (a tensor, a NumPy number)."""
    bad = []
    for f in dataclasses.fields(result):
        want = SCALARS.get(str(f.type))
        v = getattr(result, f.name)
        if want is None or v is None:
            continue
        if isinstance(v, (torch.Tensor, np.generic)) or not isinstance(v, (want, numbers.Number)):
            bad.append(f"{type(result).__name__}.{f.name}: {type(v).__name__}")
    return bad


def test_every_result_holds_python_scalars(every_result: dict[str, Any]) -> None:
    results = [r for r in every_result.values() if dataclasses.is_dataclass(r)]
    assert len(results) >= 20
    assert [b for r in results for b in not_python_scalars(r)] == []


def test_a_tensor_scalar_is_found() -> None:
    @dataclasses.dataclass
    class R:
        score: float

    assert not_python_scalars(R(torch.tensor(0.5))) == ["R.score: Tensor"]  # type: ignore[arg-type]
    assert not_python_scalars(R(np.float32(0.5))) == ["R.score: float32"]  # type: ignore[arg-type]
    assert not_python_scalars(R(0.5)) == []
