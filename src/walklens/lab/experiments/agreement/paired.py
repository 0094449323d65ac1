"""The paired difference of two accuracies on the same items (Newcombe 1998, method 10), with McNemar's exact
test."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ....analyses.chance import Z95, wilson

NEWCOMBE = "Newcombe (1998) method 10: Wilson score intervals of both accuracies, continuity-corrected phi"


@dataclass(frozen=True)
class PairedDifference:
    """``other - reference`` accuracy on the same ``n`` items, from the paired 2x2 table of right/wrong."""

    n: int
    both: int  # items both got right
    only_reference: int
    only_other: int
    neither: int
    reference: float
    other: float
    diff: float
    lo: float
    hi: float
    mcnemar_p: float  # exact two-sided McNemar test (binomial on the discordant items); 1.0 when there are none
    method: str = NEWCOMBE


def paired_difference(
    both: int, only_reference: int, only_other: int, neither: int, z: float = Z95
) -> PairedDifference:
    """The 95% interval (``z``) of a difference of paired proportions by Newcombe's method 10 (Stat. Med. 17,
    2635-2650, 1998): each accuracy gets a Wilson interval (:func:`~.stats.wilson`) and the two are combined
    with the correlation phi of the 2x2 table, its numerator corrected by n/2 towards 0 (as in Newcombe and
    in Fagerland et al.'s ``contingencytables``).  McNemar's exact p-value is scipy's ``binomtest``."""
    from scipy.stats import binomtest

    cells = (both, only_reference, only_other, neither)
    if min(cells) < 0:
        raise ValueError(f"negative count in {cells}")
    n = sum(cells)
    if n == 0:
        return PairedDifference(0, 0, 0, 0, 0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
    p1, p2 = (both + only_other) / n, (both + only_reference) / n  # other, reference
    l1, u1 = wilson(both + only_other, n, z)
    l2, u2 = wilson(both + only_reference, n, z)
    margins = (both + only_other) * (only_reference + neither) * (both + only_reference) * (only_other + neither)
    a = both * neither - only_other * only_reference
    if margins == 0 or 0 <= a <= n / 2:
        phi = 0.0
    else:
        phi = (a - n / 2 if a > 0 else a) / math.sqrt(margins)
    lo = p1 - p2 - math.sqrt(max((p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2), 0.0))
    hi = p1 - p2 + math.sqrt(max((p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1), 0.0))
    m = only_reference + only_other
    p = 1.0 if m == 0 else float(binomtest(only_other, m, 0.5).pvalue)
    return PairedDifference(
        n, both, only_reference, only_other, neither, p2, p1, (only_other - only_reference) / n, lo, hi, p
    )


def _paired(gold: np.ndarray, ref: np.ndarray, other: np.ndarray) -> PairedDifference:
    cr, co = ref == gold, other == gold
    return paired_difference(int((cr & co).sum()), int((cr & ~co).sum()), int((~cr & co).sum()), int((~cr & ~co).sum()))
