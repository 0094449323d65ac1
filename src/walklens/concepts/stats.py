"""Honest best scores for a scheme sweep: in-sample best, held-out best (fixed split and k-fold) with
confidence intervals, and the distribution of scores across the grid next to chance.

Seed 000 (sec. 5.1.1) takes each model's best composition scheme as "a proxy for the ideal machine-learnt
scheme" and reports its score as the true test score (the star markers of Fig. 10).  The maximum of many
noisy accuracies measured on the same few hundred items is biased upward: with 10^6 schemes even a grid of
coin flips has a best far above chance.  Here the best scheme is also *chosen* on one part of the items and
*scored* on the rest, which removes that selection bias:

* fixed split: items shuffled with a fixed seed, cut in two halves A and B; best on A scored on B, and the
  reverse; both reported with Wilson 95% intervals;
* k-fold: for each fold, the best scheme on the other k-1 folds is scored on the fold; the pooled held-out
  accuracy (each item scored once, by a scheme chosen without it) gets a Wilson interval.

All functions take a boolean correctness matrix ``correct[schemes, items]`` and work in chunks of schemes,
so a million schemes over hundreds of items fit in memory.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

Z95 = 1.959963984540054
CHUNK = 65536


def wilson(k: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``k/n`` (95% by default)."""
    if n <= 0:
        return (math.nan, math.nan)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(max(p * (1 - p) / n + z * z / (4 * n * n), 0.0)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def _col_sums(correct: np.ndarray, cols: np.ndarray | None = None) -> np.ndarray:
    """Per-scheme count of correct items (over ``cols`` if given), chunked; int64 ``[S]``."""
    S = correct.shape[0]
    out = np.empty(S, np.int64)
    for a in range(0, S, CHUNK):
        block = correct[a:a + CHUNK]
        if cols is not None:
            block = block[:, cols]
        out[a:a + CHUNK] = block.sum(axis=1, dtype=np.int64)
    return out


def best_index(scores: np.ndarray) -> int:
    """Index of the best scheme; ties go to the first in the stored order (deterministic)."""
    return int(np.argmax(scores))


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


def in_sample_best(correct: np.ndarray, names: Sequence[str]) -> Score:
    """The best scheme chosen and scored on the same items (upward biased; the seed's star markers)."""
    n = correct.shape[1]
    sums = _col_sums(correct)
    i = best_index(sums)
    lo, hi = wilson(int(sums[i]), n)
    return Score(acc=float(sums[i]) / n, lo=lo, hi=hi, n=n, scheme=names[i], how="in-sample")


def split_items(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A fixed random split of ``n`` items into halves A and B (item positions)."""
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[: n // 2]), np.sort(perm[n // 2:])


def held_out_split(correct: np.ndarray, names: Sequence[str], seed: int = 0) -> list[Score]:
    """Best on half A scored on half B, and best on B scored on A."""
    a, b = split_items(correct.shape[1], seed)
    out = []
    for sel, ev, tag in ((a, b, "chosen on A, scored on B"), (b, a, "chosen on B, scored on A")):
        i = best_index(_col_sums(correct, sel))
        k = int(correct[i, ev].sum())
        lo, hi = wilson(k, len(ev))
        out.append(Score(acc=k / len(ev), lo=lo, hi=hi, n=len(ev), scheme=names[i], how=tag))
    return out


def kfold_folds(n: int, k: int, seed: int = 0) -> list[np.ndarray]:
    perm = np.random.default_rng(seed).permutation(n)
    return [np.sort(f) for f in np.array_split(perm, k)]


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


def held_out_kfold(correct: np.ndarray, names: Sequence[str], k: int = 5, seed: int = 0) -> KFold:
    """For each of ``k`` folds, the best scheme on the other folds scored on this fold; pooled."""
    n = correct.shape[1]
    if k < 2 or k > n:
        raise ValueError(f"k-fold needs 2 <= k <= n items ({n}), got k={k}")
    folds = kfold_folds(n, k, seed)
    total = _col_sums(correct)
    hits = 0
    chosen: list[str] = []
    accs: list[float] = []
    for f in folds:
        train_sums = total - _col_sums(correct, f)
        i = best_index(train_sums)
        h = int(correct[i, f].sum())
        hits += h
        chosen.append(names[i])
        accs.append(h / len(f))
    lo, hi = wilson(hits, n)
    return KFold(k=k, acc=hits / n, lo=lo, hi=hi, n=n, fold_schemes=tuple(chosen), fold_acc=tuple(accs))


def chance_max(n_schemes: int, n_items: int, p: float = 0.25) -> float:
    """Expected best accuracy of ``n_schemes`` *independent* chance-level schemes on ``n_items`` items.

    ``E[max] = sum_k P(max >= k) / n`` with ``P(max < k) = F(k-1)^S`` (binomial CDF F).  Real schemes are
    strongly correlated, so this is an upper bound on the pure-selection inflation, shown for scale.
    """
    cdf = 0.0
    pmf = [math.comb(n_items, j) * p ** j * (1 - p) ** (n_items - j) for j in range(n_items + 1)]
    e = 0.0
    for kk in range(1, n_items + 1):
        cdf += pmf[kk - 1]
        e += 1.0 - min(cdf, 1.0) ** n_schemes
    return e / n_items


def distribution(acc: np.ndarray, n_items: int, chance: float = 0.25) -> dict[str, Any]:
    """Quantiles of scheme accuracies, the share above chance and above its 95% Wilson upper bound, and a
    histogram (20 bins over [0, 1])."""
    a = np.asarray(acc, dtype=np.float64)
    qs = [0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0]
    quant = np.quantile(a, qs) if a.size else np.full(len(qs), np.nan)
    upper = wilson(chance * n_items, n_items)[1]
    hist, edges = np.histogram(a, bins=20, range=(0.0, 1.0))
    return {
        "n_schemes": int(a.size), "n_items": int(n_items), "chance": chance,
        "mean": float(a.mean()) if a.size else math.nan,
        "quantiles": {f"q{int(q * 100)}": float(v) for q, v in zip(qs, quant)},
        "frac_above_chance": float((a > chance).mean()) if a.size else math.nan,
        "frac_above_chance_ci": float((a > upper).mean()) if a.size else math.nan,
        "chance_upper95": upper,
        "expected_best_if_all_chance": chance_max(int(a.size), int(n_items), chance) if a.size else math.nan,
        "hist": hist.tolist(), "hist_edges": edges.tolist(),
    }


def honest_summary(correct: np.ndarray, names: Sequence[str], baseline: float | None, k: int = 5,
                   seed: int = 0) -> dict[str, Any]:
    """Everything :mod:`walklens.reports.sweep` shows for one (model, shots, test, metric): in-sample best,
    both split-half scores, k-fold, and the grid distribution, each also normalised by the baseline."""
    n = correct.shape[1]
    ins = in_sample_best(correct, names)
    split = held_out_split(correct, names, seed)
    kf = held_out_kfold(correct, names, k=min(k, n), seed=seed)
    acc = _col_sums(correct) / n
    split_mean = float(np.mean([s.acc for s in split]))
    return {
        "baseline": baseline,
        "in_sample": {**asdict(ins), **{f"norm_{a}": b for a, b in ins.normalised(baseline).items()}},
        "split": [{**asdict(s), **{f"norm_{a}": b for a, b in s.normalised(baseline).items()}} for s in split],
        "split_mean": split_mean,
        "split_mean_norm": split_mean / baseline if baseline else None,
        "kfold": {**asdict(kf), "norm": kf.acc / baseline if baseline else None,
                  "norm_lo": kf.lo / baseline if baseline else None,
                  "norm_hi": kf.hi / baseline if baseline else None},
        "distribution": distribution(acc, n),
    }


def marginal_effects(names: Sequence[str], acc: np.ndarray, baseline: float | None) -> dict[str, list[dict[str, Any]]]:
    """Per parameter and value: the number of schemes, the mean and the best (normalised) score."""
    fields: dict[str, dict[str, list[int]]] = {}
    for i, nm in enumerate(names):
        for part in nm.split(","):
            if "=" not in part:
                continue
            k, v = part.split("=", 1)
            fields.setdefault(k, {}).setdefault(v, []).append(i)
    a = np.asarray(acc, dtype=np.float64)
    out: dict[str, list[dict[str, Any]]] = {}
    for k, vals in fields.items():
        rows = []
        for v, idx in vals.items():
            sub = a[idx]
            rows.append({"value": v, "n": len(idx), "mean": float(sub.mean()), "best": float(sub.max()),
                         "mean_norm": float(sub.mean()) / baseline if baseline else None,
                         "best_norm": float(sub.max()) / baseline if baseline else None})
        out[k] = rows
    return out
