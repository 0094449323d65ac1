"""Honest best scores for a scheme sweep: in-sample best, held-out best (fixed split and k-fold) with
confidence intervals, and the distribution of scores across the grid next to chance.

Seed 000 (sec. 5.1.1) takes each model's best composition scheme as "a proxy for the ideal machine-learnt
scheme" and reports its score as the true test score (the star markers of Fig. 10).  The maximum of many
noisy accuracies measured on the same items is biased upward: with 10^6 schemes even a grid of coin flips
has a best far above chance.  Here the best scheme is also *chosen* on one part of the items and *scored* on
the rest, which removes that selection bias:

* fixed split: items shuffled with a fixed seed, cut in two halves A and B; best on A scored on B, and the
  reverse; both reported with Wilson 95% intervals;
* k-fold: for each fold, the best scheme on the other k-1 folds is scored on the fold; the pooled held-out
  accuracy (each item scored once, by a scheme chosen without it) gets a Wilson interval.

Every estimate needs only, per scheme, the number of items it got right in each *cell* of one partition of
the items (fold x half, :class:`Cells`): a :class:`Counts` table ``[schemes, 2k]``.  The table is built from a
boolean correctness matrix ``correct[schemes, items]`` in chunks of schemes (:func:`cell_counts`) or, for a
stored sweep, straight from the packed predictions (:meth:`~walklens.lab.hellaswag.store.SweepStore.load_counts`), so a
full grid
(726,000 schemes) over the whole HellaSwag validation set (10,042 items) never forms the dense matrix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ...analyses.chance import wilson
from ...analyses.concepts.schemes import Scheme
from ..hellaswag.store.counts import Cells, Counts, cell_counts


def best_index(scores: np.ndarray) -> int:
    """Index of the best scheme; ties go to the first in the stored order (deterministic)."""
    return int(np.argmax(scores))


# ---- estimates ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    """An accuracy with its 95% interval, the scheme that produced it and how it was chosen."""

    acc: float
    lo: float
    hi: float
    n: int
    scheme: str
    how: str

    def normalised(self, baseline: float | None) -> dict[str, float | None]:
        if not baseline:
            return {"score": None, "lo": None, "hi": None}
        return {"score": self.acc / baseline, "lo": self.lo / baseline, "hi": self.hi / baseline}


@dataclass(frozen=True)
class KFold:
    """Pooled k-fold held-out accuracy and the scheme chosen for each fold."""

    k: int
    acc: float
    lo: float
    hi: float
    n: int
    fold_schemes: tuple[str, ...]
    fold_acc: tuple[float, ...]


def in_sample_from(counts: Counts, names: Sequence[str]) -> Score:
    """The best scheme chosen and scored on the same items (upward biased; the seed's star markers)."""
    n = counts.cells.n
    sums = counts.totals()
    i = best_index(sums)
    lo, hi = wilson(int(sums[i]), n)
    return Score(acc=float(sums[i]) / n, lo=lo, hi=hi, n=n, scheme=names[i], how="in-sample")


def split_from(counts: Counts, names: Sequence[str]) -> list[Score]:
    """Best on half A scored on half B, and best on B scored on A."""
    halves = counts.by_half()
    size = counts.cells.sizes().reshape(-1, 2).sum(axis=0)
    out = []
    for sel, ev, tag in ((0, 1, "chosen on A, scored on B"), (1, 0, "chosen on B, scored on A")):
        i = best_index(halves[:, sel])
        k, n = int(halves[i, ev]), int(size[ev])
        lo, hi = wilson(k, n)
        out.append(Score(acc=k / n, lo=lo, hi=hi, n=n, scheme=names[i], how=tag))
    return out


def kfold_from(counts: Counts, names: Sequence[str]) -> KFold:
    """For each fold, the best scheme on the other folds scored on this fold; pooled over folds."""
    cells = counts.cells
    if cells.k < 2:
        raise ValueError(f"k-fold needs 2 <= k <= n items ({cells.n}), got k={cells.k}")
    folds = counts.by_fold()
    size = cells.sizes().reshape(-1, 2).sum(axis=1)
    total = folds.sum(axis=1)
    hits = 0
    chosen: list[str] = []
    accs: list[float] = []
    for f in range(cells.k):
        i = best_index(total - folds[:, f])
        h = int(folds[i, f])
        hits += h
        chosen.append(names[i])
        accs.append(h / int(size[f]))
    lo, hi = wilson(hits, cells.n)
    return KFold(
        k=cells.k, acc=hits / cells.n, lo=lo, hi=hi, n=cells.n, fold_schemes=tuple(chosen), fold_acc=tuple(accs)
    )


def in_sample_best(correct: np.ndarray, names: Sequence[str]) -> Score:
    """:func:`in_sample_from` of a dense ``correct[schemes, items]``."""
    return in_sample_from(cell_counts(correct, Cells.build(correct.shape[1], 1)), names)


def held_out_split(correct: np.ndarray, names: Sequence[str], seed: int = 0) -> list[Score]:
    """:func:`split_from` of a dense ``correct[schemes, items]``."""
    return split_from(cell_counts(correct, Cells.build(correct.shape[1], 1, seed)), names)


def held_out_kfold(correct: np.ndarray, names: Sequence[str], k: int = 5, seed: int = 0) -> KFold:
    """:func:`kfold_from` of a dense ``correct[schemes, items]``."""
    n = correct.shape[1]
    if k < 2 or k > n:
        raise ValueError(f"k-fold needs 2 <= k <= n items ({n}), got k={k}")
    return kfold_from(cell_counts(correct, Cells.build(n, k, seed)), names)


# ---- chance and the distribution across the grid --------------------------------------------------------------


def chance_max(n_schemes: int, n_items: int, p: float = 0.25) -> float:
    """Expected best accuracy of ``n_schemes`` *independent* chance-level schemes on ``n_items`` items.

    ``E[max] = sum_{j=0}^{n-1} P(max > j) / n`` with ``P(max <= j) = F(j)^S`` (binomial CDF F, scipy), each term
    ``-expm1(S log F(j))`` with ``log F`` from ``log1p(-sf)`` in the upper tail: no overflow or cancellation at
    any ``n``.  Only the window where a term is neither 1 nor below 1e-20 is evaluated, its ends from
    Hoeffding's bound ``P(|X - np| >= t) <= exp(-2 t^2 / n)`` (rigorous, unlike quantiles far in the tails):
    below it every term is 1.0 in float64 (``S log F < -40``), above it ``S sf(j) < 1e-20``.  Real schemes are
    strongly correlated, so this is an upper bound on the pure-selection inflation, shown for scale.
    """
    from scipy.stats import binom

    if n_items <= 0 or n_schemes <= 0:
        return math.nan
    S, n = float(n_schemes), int(n_items)
    lo = max(0, math.floor(n * p - math.sqrt(20.0 * n / S)) - 1)  # j < lo: F(j)^S < e^-40, the term is 1.0
    hi = min(n, math.ceil(n * p + math.sqrt(n * math.log(S * 1e20) / 2)) + 1)  # j >= hi: S sf(j) < 1e-20
    j = np.arange(lo, max(lo, hi))
    cdf = binom.cdf(j, n, p)
    with np.errstate(divide="ignore"):
        logf = np.where(cdf < 0.5, binom.logcdf(j, n, p), np.log1p(-binom.sf(j, n, p)))
    return float((lo - np.expm1(S * logf).sum()) / n)


def distribution(acc: np.ndarray, n_items: int, chance: float = 0.25) -> dict[str, Any]:
    """Quantiles of scheme accuracies, the share above chance and above its 95% Wilson upper bound (with the
    share a chance-level scheme has of crossing that bound, ``P(Binomial(n, chance) > n * upper)``), and a
    histogram (20 bins over [0, 1])."""
    from scipy.stats import binom

    a = np.asarray(acc, dtype=np.float64)
    qs = [0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0]
    quant = np.quantile(a, qs) if a.size else np.full(len(qs), np.nan)
    upper = wilson(chance * n_items, n_items)[1]
    hist, edges = np.histogram(a, bins=20, range=(0.0, 1.0))
    return {
        "n_schemes": int(a.size),
        "n_items": int(n_items),
        "chance": chance,
        "mean": float(a.mean()) if a.size else math.nan,
        "quantiles": {f"q{int(q * 100)}": float(v) for q, v in zip(qs, quant)},
        "frac_above_chance": float((a > chance).mean()) if a.size else math.nan,
        "frac_above_chance_ci": float((a > upper).mean()) if a.size else math.nan,
        "chance_upper95": upper,
        "expected_above_chance_ci": float(binom.sf(math.floor(upper * n_items), n_items, chance))
        if n_items
        else math.nan,
        "expected_best_if_all_chance": chance_max(int(a.size), int(n_items), chance) if a.size else math.nan,
        "hist": hist.tolist(),
        "hist_edges": edges.tolist(),
    }


def _scored(s: Score, baseline: float | None) -> dict[str, Any]:
    return {**asdict(s), **{f"norm_{a}": b for a, b in s.normalised(baseline).items()}}


def honest_summary_counts(counts: Counts, names: Sequence[str], baseline: float | None) -> dict[str, Any]:
    """Everything :mod:`walklens.lab.reports.sweep` shows for one (model, shots, test, metric): in-sample best,
    both split-half scores, k-fold (``k = counts.cells.k``), and the grid distribution, each also normalised
    by the baseline."""
    n = counts.cells.n
    ins = in_sample_from(counts, names)
    split = split_from(counts, names)
    kf = kfold_from(counts, names)
    split_mean = float(np.mean([s.acc for s in split]))
    return {
        "baseline": baseline,
        "in_sample": _scored(ins, baseline),
        "split": [_scored(s, baseline) for s in split],
        "split_mean": split_mean,
        "split_mean_norm": split_mean / baseline if baseline else None,
        "kfold": {
            **asdict(kf),
            "norm": kf.acc / baseline if baseline else None,
            "norm_lo": kf.lo / baseline if baseline else None,
            "norm_hi": kf.hi / baseline if baseline else None,
        },
        "distribution": distribution(counts.totals() / n, n),
    }


def honest_summary(
    correct: np.ndarray, names: Sequence[str], baseline: float | None, k: int = 5, seed: int = 0
) -> dict[str, Any]:
    """:func:`honest_summary_counts` of a dense ``correct[schemes, items]`` (``k`` capped at the item count)."""
    n = correct.shape[1]
    return honest_summary_counts(cell_counts(correct, Cells.build(n, min(k, n), seed)), names, baseline)


def marginal_effects(names: Sequence[str], acc: np.ndarray, baseline: float | None) -> dict[str, list[dict[str, Any]]]:
    """Per parameter and value: the number of schemes, the mean and the best (normalised) score.

    Values are coded per scheme in one int32 array per parameter (not a list of scheme indices per value), so
    a million schemes cost a few MB; parameters and values keep their order of first appearance.  ``names`` are
    scheme strings (:meth:`~walklens.analyses.concepts.schemes.Scheme.parse`; a parameter a scheme leaves out, such
    as Test 1's ``sim``,
    is not counted for it)."""
    S = len(names)
    values: dict[str, dict[str, int]] = {}
    codes: dict[str, np.ndarray] = {}
    for i, nm in enumerate(names):
        for k, v in Scheme.parse(nm).pairs():
            vals = values.setdefault(k, {})
            col = codes.get(k)
            if col is None:
                col = codes[k] = np.full(S, -1, np.int32)
            col[i] = vals.setdefault(v, len(vals))
    a = np.asarray(acc, dtype=np.float64)
    out: dict[str, list[dict[str, Any]]] = {}
    for k, vals in values.items():
        rows = []
        for v, code in vals.items():
            sub = a[np.flatnonzero(codes[k] == code)]
            mean, best = float(sub.mean()), float(sub.max())
            rows.append(
                {
                    "value": v,
                    "n": int(sub.size),
                    "mean": mean,
                    "best": best,
                    "mean_norm": mean / baseline if baseline else None,
                    "best_norm": best / baseline if baseline else None,
                }
            )
        out[k] = rows
    return out
