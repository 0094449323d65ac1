"""The steering card's statistics: seeded bootstrap intervals over prompts, the share of prompts moved the
wrong way, the Pareto front of effect against coherence, and the choice of layer and dose on the ``choose``
split (seed 002's steering, measured)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: the confidence level of every interval of the card (percentile bootstrap over prompts)
LEVEL = 0.95


@dataclass
class Interval:
    """A statistic over prompts with its percentile-bootstrap interval ``[lo, hi]`` (level :data:`LEVEL`);
    ``n`` the number of finite values it was computed from (NaN everywhere when none)."""

    value: float
    lo: float
    hi: float
    n: int


def _stat(x: np.ndarray, stat: str) -> np.ndarray:
    """The statistic along the last axis."""
    return np.median(x, axis=-1) if stat == "median" else x.mean(axis=-1)


def bootstrap(values: Sequence[float], *, seed: int, n_boot: int = 1000, stat: str = "mean") -> Interval:
    """``stat`` (``mean`` or ``median``) of the finite ``values`` and its percentile-bootstrap interval: ``n_boot``
    resamples of the prompts, drawn from a generator seeded with ``seed`` (the same seed gives the same bits)."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    rng = np.random.default_rng(seed)
    boot = _stat(x[rng.integers(0, x.size, size=(n_boot, x.size))], stat)
    a = (1 - LEVEL) / 2
    lo, hi = np.quantile(boot, [a, 1 - a])
    return Interval(float(_stat(x, stat)), float(lo), float(hi), int(x.size))


def wrong_way(effects: Sequence[float], *, seed: int, n_boot: int = 1000) -> Interval:
    """The share of prompts whose effect is below zero (moved away from the target; an effect of exactly zero
    is not counted), with its bootstrap interval; non-finite effects are left out."""
    x = [float(e < 0) for e in effects if e is not None and math.isfinite(e)]
    return bootstrap(x, seed=seed, n_boot=n_boot)


def pareto(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the Pareto front of (effect, incoherence) points: no other point has a larger or equal effect
    and a smaller or equal incoherence with one of them strict.  Points with a NaN are never on it."""
    ok = [i for i, (e, c) in enumerate(points) if math.isfinite(e) and math.isfinite(c)]
    front = []
    for i in ok:
        e, c = points[i]
        if not any(
            points[j][0] >= e and points[j][1] <= c and (points[j][0] > e or points[j][1] < c) for j in ok if j != i
        ):
            front.append(i)
    return sorted(front, key=lambda i: (points[i][1], points[i][0]))


def choose(candidates: Sequence[tuple[float, float]], budget: float) -> int | None:
    """The index of the candidate (effect, incoherence) with the largest finite effect among those whose
    incoherence is at most ``budget``; None when none is within it."""
    ok = [i for i, (e, c) in enumerate(candidates) if math.isfinite(e) and math.isfinite(c) and c <= budget]
    return max(ok, key=lambda i: (candidates[i][0], -i)) if ok else None


__all__ = ["LEVEL", "Interval", "bootstrap", "wrong_way", "pareto", "choose"]
