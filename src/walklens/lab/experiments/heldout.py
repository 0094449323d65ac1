"""Statistics that match the held-out procedure: the held-out best against the baseline on the same items, and
an interval that resamples the whole select-then-score procedure (seed 000, sec. 5.1.1, Fig. 10).

The k-fold held-out best (:func:`.stats.kfold_from`) scores every item once, by a scheme chosen without it.  Its
pooled Wilson interval treats the k folds as one fixed scheme and the baseline as exact; neither holds.  Here:

* :func:`paired_test`: the held-out picks and the baseline's on the *same* items, compared item by item: the
  exact McNemar test (a two-sided sign test on the discordant pairs) and an interval for the paired difference
  (Clopper-Pearson on the discordant split, conditional on their number, so it excludes 0 exactly when
  ``p < alpha``);
* :func:`bootstrap_heldout`: items resampled with replacement, the folds redrawn on each replicate (a
  duplicated item stays in one fold), the best scheme chosen on the other folds and scored on each fold; the
  baseline scored on the same resample, so the normalised figure (held-out / baseline) and the difference are
  computed per replicate and carry the baseline's uncertainty.  Percentile intervals, seeded.

Both read boolean correctness rows of a few schemes (:func:`kfold_rows` names the ones the k-fold chose); the
bootstrap's candidates are the ``max_candidates`` best schemes by full-sample hits (all of them in a grid that
small; a scheme far below them is chosen in no replicate, and the result says how many were kept).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...analyses.chance import wilson
from ..hellaswag.store.counts import Counts
from .stats import best_index

if TYPE_CHECKING:
    from .runner import RunSummary

#: HellaSwag's chance level (four endings): the floor of a chance-corrected ratio
CHANCE = 0.25
#: the bootstrap's default number of replicates and candidate schemes
REPLICATES = 200
CANDIDATES = 2000


@dataclass(frozen=True)
class Paired:
    """The held-out picks against the baseline's on the same ``n`` items (exact McNemar test).

    ``only_best``: items the held-out best got right and the baseline wrong; ``only_base``: the reverse;
    ``diff = (only_best - only_base) / n`` with its ``1 - alpha`` interval ``[lo, hi]``; ``p`` two-sided."""

    n: int
    only_best: int
    only_base: int
    diff: float
    lo: float
    hi: float
    p: float
    alpha: float


@dataclass(frozen=True)
class Bootstrap:
    """Percentile intervals of the held-out accuracy, of held-out / baseline and of held-out - baseline over
    ``replicates`` resamples of the whole select-then-score procedure (``k`` folds redrawn each time)."""

    replicates: int
    k: int
    seed: int
    alpha: float
    candidates: int
    n_schemes: int
    acc_lo: float
    acc_hi: float
    norm_lo: float | None
    norm_hi: float | None
    diff_lo: float
    diff_hi: float
    share_below_baseline: float
    corrected_lo: float | None = None  # (held-out - 0.25) / (baseline - 0.25), same replicates
    corrected_hi: float | None = None


def sign_test_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p of ``b`` and ``c`` discordant pairs: ``min(1, 2 P(X <= min(b, c)))`` with
    ``X ~ Binomial(b + c, 1/2)`` (1.0 when there is no discordant pair)."""
    from scipy.stats import binom

    m = b + c
    if m == 0:
        return 1.0
    return float(min(1.0, 2.0 * binom.cdf(min(b, c), m, 0.5)))


def _clopper_pearson(x: int, m: int, alpha: float) -> tuple[float, float]:
    from scipy.stats import beta

    lo = 0.0 if x == 0 else float(beta.ppf(alpha / 2, x, m - x + 1))
    hi = 1.0 if x == m else float(beta.ppf(1 - alpha / 2, x + 1, m - x))
    return lo, hi


def paired_test(best: np.ndarray, base: np.ndarray, alpha: float = 0.05) -> Paired:
    """The exact McNemar test of two boolean correctness vectors on the same items, with the paired difference
    ``mean(best) - mean(base)`` and its interval: Clopper-Pearson on the share ``theta`` of discordant pairs the
    held-out best wins, mapped to ``(2 theta - 1) m / n`` (conditional on the ``m`` discordant pairs)."""
    a = np.asarray(best, dtype=bool)
    z = np.asarray(base, dtype=bool)
    if a.shape != z.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"paired test needs two equal non-empty vectors, got {a.shape} and {z.shape}")
    n = int(a.size)
    b = int((a & ~z).sum())
    c = int((~a & z).sum())
    m = b + c
    if m == 0:
        lo = hi = 0.0
    else:
        tlo, thi = _clopper_pearson(b, m, alpha)
        lo, hi = (2 * tlo - 1) * m / n, (2 * thi - 1) * m / n
    return Paired(n=n, only_best=b, only_base=c, diff=(b - c) / n, lo=lo, hi=hi, p=sign_test_p(b, c), alpha=alpha)


def kfold_choices(counts: Counts) -> list[int]:
    """The scheme (row of ``counts``) :func:`.stats.kfold_from` chooses for each fold."""
    folds = counts.by_fold()
    total = folds.sum(axis=1)
    return [best_index(total - folds[:, f]) for f in range(counts.cells.k)]


def kfold_picks(counts: Counts, rows: dict[int, np.ndarray]) -> np.ndarray:
    """Per item, whether the scheme chosen without its fold got it right (``rows``: correctness of each chosen
    scheme, keyed by its row in ``counts``).  Its mean is :func:`.stats.kfold_from`'s accuracy."""
    cells = counts.cells
    fold = cells.cell // 2
    out = np.zeros(cells.n, dtype=bool)
    for f, i in enumerate(kfold_choices(counts)):
        sel = fold == f
        out[sel] = rows[i][sel]
    return out


def candidates(counts: Counts, limit: int = CANDIDATES) -> list[int]:
    """The ``limit`` schemes with the most full-sample hits (ties: stored order), in stored order."""
    tot = counts.totals()
    if tot.size <= limit:
        return list(range(int(tot.size)))
    order = np.lexsort((np.arange(tot.size), -tot))[:limit]
    return sorted(int(i) for i in order)


def _weights(n: int, k: int, reps: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per replicate the multiplicity of each item ``[reps, n]`` and its fold ``[reps, n]`` (a permutation of the
    original items cut in ``k``, so an item drawn twice stays in one fold)."""
    w = np.empty((reps, n), np.int64)
    fold = np.empty((reps, n), np.int64)
    cut = np.repeat(np.arange(k), [len(a) for a in np.array_split(np.arange(n), k)])
    for r in range(reps):
        w[r] = np.bincount(rng.integers(0, n, n), minlength=n)
        fold[r, rng.permutation(n)] = cut
    return w, fold


def _replicate_scores(correct: np.ndarray, w: np.ndarray, fold: np.ndarray, k: int, batch: int = 50) -> np.ndarray:
    """Weighted held-out hits per replicate: per fold, the candidate with the most weighted hits on the other
    folds (ties: first) scored by its weighted hits on the fold.  ``batch`` replicates share one matrix product
    (float32 sums of integer weights are exact below 2^24)."""
    reps, n = w.shape
    dt = np.float32 if n < (1 << 24) else np.float64
    x = correct.astype(dt)
    out = np.zeros(reps)
    for a in range(0, reps, batch):
        rb = min(batch, reps - a)
        W = np.zeros((n, rb, k), dt)
        for j in range(rb):
            W[np.arange(n), j, fold[a + j]] = w[a + j]
        H = (x @ W.reshape(n, rb * k)).astype(np.float64).reshape(-1, rb, k)  # [candidates, rb, k]
        total = H.sum(axis=2)
        for j in range(rb):
            out[a + j] = sum(H[best_index(total[:, j] - H[:, j, f]), j, f] for f in range(k))
    return out


def bootstrap_heldout(
    correct: np.ndarray,
    base: np.ndarray,
    *,
    k: int = 5,
    replicates: int = REPLICATES,
    seed: int = 0,
    alpha: float = 0.05,
    n_schemes: int | None = None,
) -> Bootstrap:
    """Percentile intervals of the whole k-fold select-then-score procedure over ``replicates`` item resamples
    (``correct[candidates, items]``, ``base[items]`` the baseline's correctness on the same items)."""
    S, n = correct.shape
    if base.shape != (n,) or not 2 <= k <= n or S == 0:
        raise ValueError(f"bootstrap needs correct [S>0, n], base [n] and 2 <= k <= n; got {correct.shape}, k={k}")
    w, fold = _weights(n, k, replicates, np.random.default_rng(seed))
    acc = _replicate_scores(correct, w, fold, k) / n
    b = (w @ np.asarray(base, np.float64)) / n
    q = (alpha / 2, 1 - alpha / 2)
    diff = np.quantile(acc - b, q)
    ok = b > 0
    ratio = np.quantile(acc[ok] / b[ok], q) if ok.any() else (math.nan, math.nan)
    alo, ahi = np.quantile(acc, q)
    point = float(base.mean())
    above = b > CHANCE
    cc = np.quantile((acc[above] - CHANCE) / (b[above] - CHANCE), q) if above.all() else (None, None)
    return Bootstrap(
        replicates=replicates,
        k=k,
        seed=seed,
        alpha=alpha,
        candidates=S,
        n_schemes=S if n_schemes is None else n_schemes,
        acc_lo=float(alo),
        acc_hi=float(ahi),
        norm_lo=float(ratio[0]) if point > 0 else None,
        norm_hi=float(ratio[1]) if point > 0 else None,
        diff_lo=float(diff[0]),
        diff_hi=float(diff[1]),
        share_below_baseline=float((acc < b).mean()),
        corrected_lo=None if cc[0] is None else float(cc[0]),
        corrected_hi=None if cc[1] is None else float(cc[1]),
    )


def ratio_interval(
    run: np.ndarray, base: np.ndarray, replicates: int = 2000, seed: int = 0, alpha: float = 0.05
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``mean(run) / mean(base)`` over items resampled in pairs: the
    normalised figure with the baseline's uncertainty in it (both are scored on every resample)."""
    a, z = np.asarray(run, dtype=np.float64), np.asarray(base, dtype=np.float64)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, size=(replicates, a.size))
    num, den = a[idx].mean(axis=1), z[idx].mean(axis=1)
    r = num[den > 0] / den[den > 0]  # a resample with no baseline hit has no ratio (none at HellaSwag's n)
    return float(np.quantile(r, alpha / 2)), float(np.quantile(r, 1 - alpha / 2))


def corrected(acc: float, base: float, chance: float = CHANCE) -> float:
    """The chance-corrected ratio ``(acc - chance) / (base - chance)``: 0 at chance, 1 at the baseline (NaN when
    the baseline is not above chance).  The raw ``acc / base`` makes ``chance / base`` its floor (0.76 at a
    baseline of 0.33), so a scorer at chance would seem to keep three quarters of the ordinary run."""
    return (acc - chance) / (base - chance) if base > chance else math.nan


def corrected_interval(
    run: np.ndarray, base: np.ndarray, replicates: int = 2000, seed: int = 0, alpha: float = 0.05
) -> tuple[float, float]:
    """Percentile bootstrap interval of :func:`corrected` over items resampled in pairs (both accuracies from the
    same resample; NaN bounds when a resample's baseline is not above chance)."""
    a, z = np.asarray(run, dtype=np.float64), np.asarray(base, dtype=np.float64)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, size=(replicates, a.size))
    num, den = a[idx].mean(axis=1) - CHANCE, z[idx].mean(axis=1) - CHANCE
    if (den <= 0).any():
        return math.nan, math.nan
    r = num / den
    return float(np.quantile(r, alpha / 2)), float(np.quantile(r, 1 - alpha / 2))


def paired_against(run: RunSummary, base: RunSummary) -> dict[str, Any]:
    """One run against the baseline on the same items, per metric (``acc``, ``acc_norm``): both accuracies with
    Wilson intervals, the exact McNemar test (:func:`paired_test`) and the bootstrap interval of the normalised
    figure (:func:`ratio_interval`).  For a scheme fixed before these items were seen (e.g. chosen on other
    items), this is the whole held-out procedure: nothing is selected on them."""
    if [r.item for r in run.results] != [r.item for r in base.results]:
        raise ValueError("the run and the baseline must cover the same items in the same order")
    out: dict[str, Any] = {"n": run.n}
    for metric, field in (("acc", "pred"), ("acc_norm", "pred_norm")):
        a = np.array([getattr(r, field) == r.gold for r in run.results])
        z = np.array([getattr(r, field) == r.gold for r in base.results])
        lo, hi = wilson(int(a.sum()), a.size)
        blo, bhi = wilson(int(z.sum()), z.size)
        nlo, nhi = ratio_interval(a, z) if z.any() else (None, None)
        out[metric] = {
            "acc": float(a.mean()),
            "lo": lo,
            "hi": hi,
            "baseline": float(z.mean()),
            "baseline_lo": blo,
            "baseline_hi": bhi,
            "norm": float(a.mean() / z.mean()) if z.any() else None,
            "norm_lo": nlo,
            "norm_hi": nhi,
            "paired": asdict(paired_test(a, z)),
        }
    return out


__all__ = [
    "CHANCE",
    "corrected",
    "corrected_interval",
    "paired_against",
    "ratio_interval",
    "CANDIDATES",
    "REPLICATES",
    "Bootstrap",
    "Paired",
    "bootstrap_heldout",
    "candidates",
    "kfold_choices",
    "kfold_picks",
    "paired_test",
    "sign_test_p",
]
