"""Attribution patching: every cell's patched metric estimated to first order, ``m + (a_source - a_base) . dm/da``,
from one forward and one backward pass of the patched run (Nanda 2023, "Attribution Patching: Activation Patching At
Industrial Scale"; Syed, Rager & Conmy 2023, "Attribution Patching Outperforms Automated Circuit Discovery", sec. 2).

An approximation whose error is measured, not assumed: :func:`attribute` reports an
:class:`~.result.AttributionParity` -- Spearman's rank correlation and top-k overlap with exact patching on the
same cells, over all and per point kind -- and warns (:class:`ParityWarning`) where they fall under the
thresholds of :mod:`.result` (docs/patching.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Unpack

import numpy as np
import torch

from ...base.errors import InputError, WalklensWarning
from ...core.patching import Recorded
from .exact import Cells, Setup, exact_grid, make_result, references, setup
from .result import TOP_K, AttributionParity, PatchResult

if TYPE_CHECKING:
    from ...core.loading import LoadedModel


class ParityWarning(WalklensWarning):
    """Attribution patching disagrees with exact patching beyond the parity card's thresholds."""


def _check_gradients(lm: LoadedModel, s: Setup) -> None:
    if not s.metric.differentiable:
        raise InputError(f"attribution patching needs a gradient: metric {s.metric.name} has none (use exact patching)")
    if not lm.dtype.is_floating_point:
        raise InputError(f"attribution patching needs gradients: the model holds {lm.dtype} weights")


def attribution_grid(s: Setup, rec_clean: Recorded, rec_corr: Recorded) -> np.ndarray:
    """The first-order estimate of every cell's raw metric [sites, positions]: the patched run's metric plus the
    activation difference dotted with the metric's gradient at the cell (one backward pass)."""
    lm = s.lm
    base, source = s.base_and_source(rec_clean, rec_corr)
    m = s.metric.tensor(base.logits, rec_clean.logits.detach())
    if m.grad_fn is None:
        raise InputError(
            "attribution patching: the metric has no gradient through this model (a frozen or integer path)"
        )
    keys = list(dict.fromkeys(_key(site) for site in s.sites))
    grads = torch.autograd.grad(m, [base.grad_of[k] for k in keys], allow_unused=True)
    T = int(s.base_ids.shape[1])
    g = {
        k: (torch.zeros_like(base.grad_of[k]) if gr is None else gr).detach().reshape(-1, T, _width(base, k))[base.row]
        for k, gr in zip(keys, grads)
    }  # [T, width]: the patched run's row of the pass (OPT's MLP output is [B T, D])
    d = lm.head_shape[1]
    m0 = float(m.detach())
    cols = [s.cell_positions(j) for j in range(len(s.positions))]
    p_base, p_src = [c[0] for c in cols], [c[1] for c in cols]
    out = np.full((len(s.sites), len(s.positions)), np.nan)
    for i, site in enumerate(s.sites):  # one row of cells at once: [positions, width]
        key = _key(site)
        delta = source.vectors[key].detach()[p_src] - base.vectors[key].detach()[p_base]
        grad = g[key][p_base]
        if site.kind == "head":
            assert site.head is not None
            delta, grad = delta[:, site.head * d : (site.head + 1) * d], grad[:, site.head * d : (site.head + 1) * d]
        out[i] = m0 + (delta.double() * grad.double()).sum(-1).numpy()
    return out


def _width(run: Recorded, key: str) -> int:
    return int(run.grad_of[key].shape[-1])


def _key(site: Any) -> str:
    return f"L{site.layer}.heads" if site.kind == "head" else site.name


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks of ``x`` (ties: their mean rank)."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=float)
    for v in np.unique(x):
        tie = x == v
        if tie.sum() > 1:
            ranks[tie] = ranks[tie].mean()
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two equally long vectors (NaN when either is constant)."""
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def topk_overlap(exact: np.ndarray, approx: np.ndarray, k: int) -> float:
    """The share of ``exact``'s k largest cells (by |value|) that are among ``approx``'s k largest."""
    k = min(k, exact.size)
    top = set(np.argsort(-np.abs(exact), kind="stable")[:k].tolist())
    got = set(np.argsort(-np.abs(approx), kind="stable")[:k].tolist())
    return len(top & got) / k if k else float("nan")


def parity_card(exact: PatchResult, approx: PatchResult, k: int = TOP_K) -> AttributionParity:
    """Attribution patching (``approx``) against exact patching on the same cells: Spearman and top-k overlap of the
    effects (value - 0 when denoising, 1 - value when noising), over all cells and per point kind."""
    if exact.points != approx.points or exact.positions != approx.positions:
        raise InputError("the parity card compares grids of the same cells")
    base = 0.0 if exact.direction == "denoise" else 1.0
    e, a = np.asarray(exact.values) - base, np.asarray(approx.values) - base
    by_kind: dict[str, dict[str, float]] = {}
    kinds = ["head" if ".H" in p else p.split(".", 1)[1] for p in exact.points]
    for kind in dict.fromkeys(kinds):
        rows = [i for i, kd in enumerate(kinds) if kd == kind]
        ek, ak = e[rows].ravel(), a[rows].ravel()
        by_kind[kind] = {"spearman": spearman(ek, ak), "topk_overlap": topk_overlap(ek, ak, k), "cells": ek.size}
    return AttributionParity(
        spearman=spearman(e.ravel(), a.ravel()),
        topk_overlap=topk_overlap(e.ravel(), a.ravel(), k),
        k=k,
        cells=e.size,
        by_kind=by_kind,
    )


def attribute(
    lm: LoadedModel,
    clean: str | Sequence[int] | torch.Tensor,
    corrupted: str | Sequence[int] | torch.Tensor,
    *,
    parity: bool = True,
    **cells: Unpack[Cells],
) -> PatchResult:
    """Attribution patching of the same cells :func:`~.exact.patch` takes (same arguments), normalised the same way;
    ``parity``: exact patching runs on the same cells too and the result carries the :class:`AttributionParity` (a
    :class:`ParityWarning` when it disagrees beyond the thresholds).  Refuses, in one line, a metric without a gradient
    (``rank``) or a model without one."""
    s = setup(lm, clean, corrupted, **cells)
    _check_gradients(lm, s)
    rec_clean, rec_corr, m_clean, m_corr = references(s, graph=True)
    passes = 1 if s.clean_ids.shape == s.corrupted_ids.shape else 2  # one batched pass, or one per run
    approx = make_result(s, attribution_grid(s, rec_clean, rec_corr), m_clean, m_corr, "attribution", passes, 0.0)
    if not parity:
        return approx
    rec_clean, rec_corr, m_clean, m_corr = references(s)  # exact patching's own references, bit for bit
    raw, _passes, _work = exact_grid(s, rec_clean, rec_corr)
    card = parity_card(make_result(s, raw, m_clean, m_corr, "exact", 0, 0.0), approx)
    notes = []
    if not card.agrees:
        notes.append(
            f"attribution patching disagrees with exact patching: Spearman {card.spearman:.3g} (threshold "
            f"{card.min_spearman:g}), top-{card.k} overlap {card.topk_overlap:.3g} "
            f"(threshold {card.min_topk_overlap:g})"
        )
        warnings.warn(notes[-1], ParityWarning, stacklevel=2)
    from dataclasses import replace

    return replace(approx, parity=card, notes=notes)


__all__ = ["attribute", "attribution_grid", "parity_card", "spearman", "topk_overlap", "ParityWarning"]
