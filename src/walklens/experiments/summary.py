"""What a results database holds about its scheme sweeps, as dataclasses (seed 000, sec. 5.1, Fig. 10, Figs. 13-16).

:func:`summarise_db` opens a database read-only and returns one :class:`RunSummary` per sweep run (one model,
shot count, test and item set): per metric the baseline, the standard scheme's score, the honest best scores
(in-sample, split-half and k-fold held-out with Wilson 95% intervals; :mod:`.stats`), the distribution of
scores across the grid, the top 10 schemes and the per-parameter marginal effects.  Reports draw these
(:mod:`walklens.reports.sweep`); nothing here draws or writes a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..concepts.schemes import Scheme
from .stats import KFold, Score, honest_summary_counts, marginal_effects
from ..hellaswag.store import SweepResults, SweepStore

TOP = 10  # schemes listed per run and metric (Figs. 13-16)


@dataclass(frozen=True)
class BestScore(Score):
    """A best scheme's :class:`~.stats.Score` (accuracy, Wilson 95% interval over ``n`` items, how it was
    chosen) and the same numbers divided by the baseline."""

    norm_score: float | None
    norm_lo: float | None
    norm_hi: float | None


@dataclass(frozen=True)
class HeldOut(KFold):
    """The k-fold held-out best (:class:`~.stats.KFold`) and its accuracy and interval divided by the baseline."""

    norm: float | None
    norm_lo: float | None
    norm_hi: float | None


@dataclass(frozen=True)
class Distribution:
    """Scores across the grid next to chance (:func:`.stats.distribution`)."""

    n_schemes: int
    n_items: int
    chance: float
    mean: float
    quantiles: dict[str, float]
    frac_above_chance: float
    frac_above_chance_ci: float
    chance_upper95: float
    expected_best_if_all_chance: float
    hist: list[int]
    hist_edges: list[float]


@dataclass(frozen=True)
class SchemeScore:
    """One scheme's accuracy and normalised score (accuracy / baseline accuracy); ``rank`` 1 is the best."""

    scheme: str
    acc: float
    norm: float | None
    rank: int | None = None


@dataclass(frozen=True)
class Marginal:
    """The schemes holding one parameter value: how many, their mean and best score (and normalised)."""

    value: str
    n: int
    mean: float
    best: float
    mean_norm: float | None
    best_norm: float | None


@dataclass(frozen=True)
class MetricSummary:
    """One run's results for one metric (``acc`` or ``acc_norm``)."""

    baseline: float | None
    in_sample: BestScore
    split: tuple[BestScore, ...]
    split_mean: float
    split_mean_norm: float | None
    kfold: HeldOut
    distribution: Distribution
    top10: tuple[SchemeScore, ...]
    marginals: dict[str, tuple[Marginal, ...]]
    standard: SchemeScore | None


@dataclass(frozen=True)
class RunSummary:
    """One sweep run (model, shots, test, items) and its :class:`MetricSummary` per metric."""

    model: str
    shots: int
    test: int
    n_items: int
    n_schemes: int
    data: str
    metrics: dict[str, MetricSummary]

    @property
    def k(self) -> int:
        """The number of folds of its k-fold estimates (``--folds``, capped at the item count)."""
        return next(iter(self.metrics.values())).kfold.k


def standard_name(run: Mapping[str, Any]) -> str:
    """The standard scheme (sec. 5.1) of a stored run's test and architecture."""
    return str(Scheme.standard(int(run["test"]), run.get("arch") or "decoder"))


def _metric(res: SweepResults, metric: str, keep: list[int], names: list[str], std_i: int | None, k: int,
            seed: int) -> MetricSummary:
    base = res.baseline(metric)
    acc = res.acc[res.metrics.index(metric)].astype(np.float64)[keep]
    counts = res.counts(metric, k=k, seed=seed)
    if len(keep) < len(res.schemes):
        counts = counts.take(keep)
    h = honest_summary_counts(counts, names, base)

    def scored(i: int, rank: int | None = None) -> SchemeScore:
        return SchemeScore(scheme=names[i], acc=float(acc[i]), norm=float(acc[i]) / base if base else None, rank=rank)

    order = np.lexsort((np.arange(len(acc)), -acc))[:TOP]  # ties: stored order
    kf = h["kfold"]
    return MetricSummary(
        baseline=base, in_sample=BestScore(**h["in_sample"]), split=tuple(BestScore(**s) for s in h["split"]),
        split_mean=h["split_mean"], split_mean_norm=h["split_mean_norm"],
        kfold=HeldOut(**{**kf, "fold_schemes": tuple(kf["fold_schemes"]), "fold_acc": tuple(kf["fold_acc"])}),
        distribution=Distribution(**h["distribution"]),
        top10=tuple(scored(int(i), r + 1) for r, i in enumerate(order)),
        marginals={p: tuple(Marginal(**row) for row in rows)
                   for p, rows in marginal_effects(names, acc, base).items()},
        standard=None if std_i is None else scored(std_i))


def summarise_run(res: SweepResults, k: int = 5, seed: int = 0) -> RunSummary:
    """Honest scores, top 10, marginals and the standard scheme's score of one run, per metric.

    ``res`` holds either predictions or the per-cell hit counts of :meth:`SweepStore.load_counts` (the same
    numbers: the statistics only need the counts).  Test 1's ``enc=cross_encoding`` scheme is the baseline
    itself (no composition): it is reported as the baseline and kept out of the schemes a best is chosen from
    (else Test 1's best would be the baseline, trivially)."""
    run = res.run
    keep = [i for i, name in enumerate(res.schemes) if not name.startswith("enc=cross_encoding,")]
    names = [res.schemes[i] for i in keep]
    std = standard_name(run)
    std_i = names.index(std) if std in names else None
    return RunSummary(model=str(run["model"]), shots=int(run["shots"]), test=int(run["test"]),
                      n_items=int(run["n_items"]), n_schemes=len(names), data=str(run["data"]),
                      metrics={m: _metric(res, m, keep, names, std_i, k, seed) for m in res.metrics})


def summarise_db(db: str | Path, k: int = 5, seed: int = 0, chunk: int | None = None) -> list[RunSummary]:
    """:func:`summarise_run` of every sweep run stored in ``db`` that holds schemes, in the order stored.

    The database is opened read-only (never created or changed; a damaged file is refused) and each run's
    predictions are streamed ``chunk`` schemes at a time (:meth:`SweepStore.load_counts`), so a full grid over
    all 10,042 HellaSwag items fits in a few hundred MB."""
    out = []
    with SweepStore(db, readonly=True) as store:
        for run in store.runs():
            res = store.load_counts(run["id"], k=k, seed=seed, chunk=chunk)
            if res.schemes:
                out.append(summarise_run(res, k=k, seed=seed))
    return out


__all__ = ["BestScore", "Distribution", "HeldOut", "Marginal", "MetricSummary", "RunSummary", "SchemeScore",
           "standard_name", "summarise_db", "summarise_run"]
