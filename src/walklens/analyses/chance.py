"""Counts against chance: the Wilson interval of a proportion, and how many of ``n`` layers, heads or schemes a
band is expected to hold by chance alone (used by the power method's alignment bands and by the lab's sweeps)."""

from __future__ import annotations

import math

Z95 = 1.959963984540054


def wilson(k: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``k/n`` (95% by default); closed form, valid at any ``n``.

    The interval always holds ``k/n`` (``hi`` is exactly 1 at ``k = n``, not 1 - 1e-16 from rounding)."""
    if n <= 0:
        return (math.nan, math.nan)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(max(p * (1 - p) / n + z * z / (4 * n * n), 0.0)) / d
    return (max(0.0, min(c - h, p)), min(1.0, max(c + h, p)))


def expected_by_chance(n: int, alpha: float) -> float:
    """How many of ``n`` layers, heads or schemes are expected above a one-sided ``1 - alpha`` band when none
    differs from the null: ``n * alpha`` (each one crosses its band with probability ``alpha``)."""
    if n < 0 or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"expected_by_chance needs n >= 0 and 0 <= alpha <= 1, got n={n}, alpha={alpha}")
    return n * alpha


def count_above_p(count: int, n: int, alpha: float) -> float:
    """``P(X >= count)`` for ``X ~ Binomial(n, alpha)``: how surprising ``count`` of ``n`` above a band is if the
    ``n`` were independent and null (layers of one model are not independent: a scale, not a test)."""
    from scipy.stats import binom

    return float(binom.sf(count - 1, n, alpha)) if count > 0 else 1.0


def above_band(count: int, n: int, alpha: float) -> str:
    """``"6 of 30 (1.5 expected by chance, P(>= 6) = 0.002)"``: a count above a band with its chance level."""
    p = count_above_p(count, n, alpha)
    return f"{count} of {n} ({expected_by_chance(n, alpha):.3g} expected by chance, P(>= {count}) = {p:.2g})"


__all__ = ["Z95", "above_band", "count_above_p", "expected_by_chance", "wilson"]
