"""Tensors derived from a model's weights (a prepacked copy, a bfloat16 copy, the rows' norms), made once and kept
while the weight they come from is unchanged.

The key is the weight's storage, shape, dtype and in-place version counter, so a weight edited in place
(``edit_weights``, ``weight[...] *= c``) or replaced has another key and is derived again; the cache is keyed
weakly by the object the tensor belongs to (a model, a layer), so it goes with it.  Written here rather than
with ``functools`` because ``lru_cache`` neither keys by a tensor's version nor lets its owner be collected.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")

_KEPT: weakref.WeakKeyDictionary[object, dict[str, tuple[tuple[Any, ...], Any]]] = weakref.WeakKeyDictionary()


def weight_key(source: torch.Tensor) -> tuple[Any, ...]:
    """What a derived tensor is kept by: ``source``'s storage, shape, dtype and in-place version counter."""
    return (source.data_ptr(), tuple(source.shape), source.dtype, source._version)


def kept(owner: object, name: str, source: torch.Tensor, make: Callable[[], T]) -> T:
    """``make()``, derived from the weight ``source`` and kept under ``owner`` and ``name`` while ``source`` is
    unchanged (:func:`weight_key`); ``owner`` must allow weak references (a module does).  An inference tensor (a
    streamed layer's weight, read inside ``torch.inference_mode``) has no version counter: derived afresh each time,
    never kept (the next read of the layer may reuse its storage with other values)."""
    if source.is_inference():
        return make()
    key = weight_key(source)
    per_owner = _KEPT.setdefault(owner, {})
    hit = per_owner.get(name)
    if hit is not None and hit[0] == key:
        return hit[1]
    out = make()
    per_owner[name] = (key, out)
    return out


def forget(owner: object) -> None:
    """Drop every tensor kept under ``owner`` (a benchmark's "made again on every request")."""
    _KEPT.pop(owner, None)


__all__ = ["forget", "kept", "weight_key"]
