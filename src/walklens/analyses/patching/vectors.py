"""A given vector patched in: a steering direction (seed 002's steering; activation addition) or a Test 2 concept vector
(seed 000, sec. 5.1.2) added to, or put in place of, the corrupted run's vector at each (point, position) cell, scored
like activation patching: 1 = the clean run, 0 = the corrupted run unpatched (docs/patching.md).

It is exact patching with another source: each cell's vector is ``old + scale v`` (``add``) or ``scale v``
(``replace``) instead of the clean run's, so each cell equals its single-patch forward pass bit for bit and the
model is restored bit for bit (:func:`~.exact.exact_grid`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Unpack

import torch

from ...base.errors import InputError
from .exact import Cells, exact_grid, make_result, references, setup
from .result import PatchResult

if TYPE_CHECKING:
    from ...core.loading import LoadedModel

MODES = ("add", "replace")


def _vector(vector: torch.Tensor | Sequence[float], scale: float) -> torch.Tensor:
    try:
        v = torch.as_tensor(vector).detach()
    except (TypeError, ValueError, RuntimeError) as e:
        raise InputError(f"the vector: not a vector of numbers ({e})") from None
    if v.dim() != 1 or v.numel() == 0:
        raise InputError(f"the vector: give one vector (1-D), not a tensor of shape {tuple(v.shape)}")
    if not (v.is_floating_point() or v.dtype in (torch.int32, torch.int64)):
        raise InputError(f"the vector: give real numbers, not {v.dtype}")
    v = v.to(torch.float64)
    if not torch.isfinite(v).all() or not torch.isfinite(torch.tensor(float(scale))):
        raise InputError("the vector or its scale holds a NaN or an infinity")
    return v


def patch_vector(
    lm: LoadedModel,
    clean: str | Sequence[int] | torch.Tensor,
    corrupted: str | Sequence[int] | torch.Tensor,
    vector: torch.Tensor | Sequence[float],
    *,
    mode: str = "add",
    scale: float = 1.0,
    batch: int | None = None,
    incremental: bool = True,
    **cells: Unpack[Cells],
) -> PatchResult:
    """``vector`` patched into the corrupted run at every (point, position) cell (the cells: :class:`~.exact.Cells`;
    ``direction`` is ``denoise``, ``position_map`` none: the prompts' token counts may differ): ``mode="add"`` puts
    ``old + scale * vector`` there, ``"replace"`` ``scale * vector``.  ``vector`` has every point's width (the model's
    D; a head's d_head for head points).  Normalised like :func:`~.exact.patch` (clean 1, corrupted 0);
    ``method="vector"``."""
    if mode not in MODES:
        raise InputError(f"mode {mode!r}: give add or replace")
    if cells.get("direction", "denoise") != "denoise":
        raise InputError("a vector is patched into the corrupted run: the direction is denoise")
    v = _vector(vector, scale)
    s = setup(lm, clean, corrupted, paired=False, **cells)
    d_head = lm.head_shape[1]
    for site in s.sites:
        width = d_head if site.kind == "head" else lm.d_model
        if v.numel() != width:
            raise InputError(f"the vector has {v.numel()} numbers; {site.name} holds vectors of {width}")
    new = (float(scale) * v).to(lm.dtype)
    rec_clean, rec_corr, m_clean, m_corr = references(s)

    def value(_site: object, _j: int, old: torch.Tensor) -> torch.Tensor:
        return old + new if mode == "add" else new

    raw, passes, work = exact_grid(s, rec_clean, rec_corr, batch=batch, incremental=incremental, value=value)
    result = make_result(s, raw, m_clean, m_corr, "vector", passes, work)
    what = f"added x {scale:g} to" if mode == "add" else f"x {scale:g} in place of"
    result.notes.append(
        f"a vector of norm {float(v.norm()):.4g} {what} the corrupted run's vector at each cell; 1 = the clean run, "
        "0 = the corrupted run unpatched"
    )
    return result


__all__ = ["patch_vector", "MODES"]
