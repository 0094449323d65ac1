"""What a results database holds about its scheme sweeps, as dataclasses (seed 000, sec. 5.1, Fig. 10, Figs. 13-16).

:func:`summarise_db` opens a database read-only and returns one :class:`RunSummary` per sweep run (one model,
shot count, test and item set): per metric the baseline, the standard scheme's score, the honest best scores
(in-sample, split-half and k-fold held-out with Wilson 95% intervals; :mod:`.stats`), the distribution of
scores across the grid, the top 10 schemes and the per-parameter marginal effects.  Reports draw these
(:mod:`walklens.lab.reports.sweep`); nothing here draws or writes a file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...analyses.concepts.schemes import Scheme
from ...base.display import Shown
from ...base.errors import InputError
from ...base.frames import Columns, DataFrame, concat_columns, frame, pick, record_table, with_constants
from ..hellaswag.store import SweepResults, SweepStore
from ..hellaswag.store.db import Row
from .heldout import (
    CANDIDATES,
    REPLICATES,
    Bootstrap,
    Paired,
    bootstrap_heldout,
    candidates,
    kfold_choices,
    kfold_picks,
    paired_test,
)
from .stats import KFold, Score, honest_summary_counts, marginal_effects

#: predictions ``[metrics, len(rows), items]`` of the schemes at the given positions of a run's stored order
RowsOf = Callable[[Sequence[int]], np.ndarray]

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
    expected_above_chance_ci: float
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
    paired: Paired | None = None
    bootstrap: Bootstrap | None = None

    def _estimate_columns(self) -> Columns:
        """The ``estimates`` table: baseline, in-sample best, split-half, k-fold held-out, standard scheme."""
        names = ["estimate", "how", "scheme", "acc", "lo", "hi", "n", "norm", "norm_lo", "norm_hi"]

        def best(estimate: str, s: BestScore) -> dict[str, Any]:
            return {
                "estimate": estimate,
                "how": s.how,
                "scheme": s.scheme,
                "acc": s.acc,
                "lo": s.lo,
                "hi": s.hi,
                "n": s.n,
                "norm": s.norm_score,
                "norm_lo": s.norm_lo,
                "norm_hi": s.norm_hi,
            }

        kf = self.kfold
        rows = [
            {"estimate": "baseline", "acc": self.baseline},
            best("in_sample", self.in_sample),
            *(best("split", s) for s in self.split),
            {"estimate": "split_mean", "acc": self.split_mean, "norm": self.split_mean_norm},
            {
                "estimate": "kfold",
                "how": f"{kf.k}-fold",
                "acc": kf.acc,
                "lo": kf.lo,
                "hi": kf.hi,
                "n": kf.n,
                "norm": kf.norm,
                "norm_lo": kf.norm_lo,
                "norm_hi": kf.norm_hi,
            },
        ]
        if self.standard is not None:
            rows.append(
                {
                    "estimate": "standard",
                    "scheme": self.standard.scheme,
                    "acc": self.standard.acc,
                    "norm": self.standard.norm,
                }
            )
        return record_table(rows, names)

    def _columns(self, table: str = "estimates") -> Columns:
        """The plain columns of :meth:`to_pandas`."""

        def distribution() -> Columns:
            d = self.distribution
            return record_table(
                [
                    {k: v for k, v in d.__dict__.items() if k not in ("quantiles", "hist", "hist_edges")}
                    | dict(d.quantiles)
                ]
            )

        def histogram() -> Columns:
            e = self.distribution.hist_edges
            return record_table(
                [{"bin": i, "lo": e[i], "hi": e[i + 1], "count": c} for i, c in enumerate(self.distribution.hist)],
                ["bin", "lo", "hi", "count"],
            )

        return pick(
            table,
            {
                "estimates": self._estimate_columns,
                "top10": lambda: record_table(
                    [{"rank": s.rank, "scheme": s.scheme, "acc": s.acc, "norm": s.norm} for s in self.top10],
                    ["rank", "scheme", "acc", "norm"],
                ),
                "marginals": lambda: record_table(
                    [
                        {
                            "parameter": p,
                            "value": m.value,
                            "n": m.n,
                            "mean": m.mean,
                            "best": m.best,
                            "mean_norm": m.mean_norm,
                            "best_norm": m.best_norm,
                        }
                        for p, ms in self.marginals.items()
                        for m in ms
                    ],
                    ["parameter", "value", "n", "mean", "best", "mean_norm", "best_norm"],
                ),
                "folds": lambda: record_table(
                    [
                        {"fold": f, "scheme": s, "acc": a}
                        for f, (s, a) in enumerate(zip(self.kfold.fold_schemes, self.kfold.fold_acc))
                    ],
                    ["fold", "scheme", "acc"],
                ),
                "distribution": distribution,
                "histogram": histogram,
            },
            "a MetricSummary",
        )

    def to_pandas(self, table: str = "estimates") -> DataFrame:
        """One metric's summary as tables (pandas; docs/notebooks.md, "Tables"): ``estimates`` (baseline,
        in-sample best, split-half, k-fold held-out, standard scheme), ``top10``, ``marginals``, ``folds``,
        ``distribution`` (one row) and ``histogram``."""
        return frame(self._columns(table))


@dataclass(frozen=True)
class RunSummary(Shown, view="summary"):
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

    def _columns(self, table: str = "estimates") -> Columns:
        """The plain columns of :meth:`to_pandas`: each metric's table after the run's key columns."""
        run = {
            "model": self.model,
            "shots": self.shots,
            "test": self.test,
            "n_items": self.n_items,
            "n_schemes": self.n_schemes,
            "data": self.data,
        }
        return concat_columns(
            [with_constants({**run, "metric": m}, s._columns(table)) for m, s in self.metrics.items()]
        )

    def to_pandas(self, table: str = "estimates") -> DataFrame:
        """The run's summary as one table of every metric (pandas; docs/notebooks.md, "Tables"): the tables of
        :meth:`MetricSummary.to_pandas` with the run's ``model``, ``shots``, ``test``, ``n_items``,
        ``n_schemes``, ``data`` and the ``metric`` first."""
        return frame(self._columns(table))


def standard_name(run: Mapping[str, Any]) -> str:
    """The standard scheme (sec. 5.1) of a stored run's test and architecture."""
    return str(Scheme.standard(int(run["test"]), run.get("arch") or "decoder"))


@dataclass(frozen=True)
class _Procedure:
    """What the procedure's statistics need of one run: the baseline's picks and the chosen rows' predictions."""

    labels: np.ndarray
    base_preds: np.ndarray  # [2, items]: the baseline's acc and acc_norm picks
    rows: dict[int, np.ndarray]  # row of the kept schemes -> predictions [metrics, items]
    replicates: int
    seed: int


def _procedure_stats(proc: _Procedure, counts: Any, metric: str, m: int, n_schemes: int) -> tuple[Paired, Bootstrap]:
    """The held-out best against the baseline on the same items, and the bootstrap of select-then-score."""
    base = proc.base_preds[0 if metric == "acc" else 1] == proc.labels
    correct = {i: p[m] == proc.labels for i, p in proc.rows.items()}
    cand = candidates(counts)
    paired = paired_test(kfold_picks(counts, correct), base)
    boot = bootstrap_heldout(
        np.stack([correct[i] for i in cand]),
        base,
        k=counts.cells.k,
        replicates=proc.replicates,
        seed=proc.seed,
        n_schemes=n_schemes,
    )
    return paired, boot


def _metric(
    res: SweepResults,
    metric: str,
    keep: list[int],
    names: list[str],
    std_i: int | None,
    k: int,
    seed: int,
    proc: _Procedure | None = None,
) -> MetricSummary:
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
    paired, boot = (
        (None, None) if proc is None else _procedure_stats(proc, counts, metric, res.metrics.index(metric), len(names))
    )
    return MetricSummary(
        baseline=base,
        in_sample=BestScore(**h["in_sample"]),
        split=tuple(BestScore(**s) for s in h["split"]),
        split_mean=h["split_mean"],
        split_mean_norm=h["split_mean_norm"],
        kfold=HeldOut(**{**kf, "fold_schemes": tuple(kf["fold_schemes"]), "fold_acc": tuple(kf["fold_acc"])}),
        distribution=Distribution(**h["distribution"]),
        top10=tuple(scored(int(i), r + 1) for r, i in enumerate(order)),
        marginals={p: tuple(Marginal(**row) for row in rows) for p, rows in marginal_effects(names, acc, base).items()},
        standard=None if std_i is None else scored(std_i),
        paired=paired,
        bootstrap=boot,
    )


def _procedure(
    res: SweepResults, keep: list[int], k: int, rows_of: RowsOf | None, replicates: int, seed: int
) -> _Procedure | None:
    """The rows the paired test and the bootstrap read (the k-fold's choices and the bootstrap's candidates of
    every metric), read once; ``None`` without a stored baseline or with ``replicates == 0``."""
    run = res.run
    if replicates <= 0 or run.get("baseline_preds") is None or not keep:
        return None
    want: set[int] = set()
    for metric in res.metrics:
        counts = res.counts(metric, k=k, seed=seed)
        if len(keep) < len(res.schemes):
            counts = counts.take(keep)
        want |= set(kfold_choices(counts)) | set(candidates(counts, CANDIDATES))
    order = sorted(want)
    if res.preds is not None:
        preds = res.preds[:, [keep[i] for i in order]]
    elif rows_of is not None:
        preds = rows_of([keep[i] for i in order])
    else:
        return None
    rows = {i: preds[:, j] for j, i in enumerate(order)}
    return _Procedure(
        labels=np.asarray(res.labels), base_preds=run["baseline_preds"], rows=rows, replicates=replicates, seed=seed
    )


def summarise_run(
    res: SweepResults, k: int = 5, seed: int = 0, *, rows_of: RowsOf | None = None, replicates: int = 0
) -> RunSummary:
    """Honest scores, top 10, marginals and the standard scheme's score of one run, per metric.

    ``res`` holds either predictions or the per-cell hit counts of :meth:`SweepStore.load_counts` (the same
    numbers: the statistics only need the counts).  Test 1's ``enc=cross_encoding`` scheme is the baseline
    itself (no composition): it is reported as the baseline and kept out of the schemes a best is chosen from
    (else Test 1's best would be the baseline, trivially).

    With ``replicates > 0`` and a stored baseline, each metric also gets the paired test of the k-fold held-out
    best against the baseline and the bootstrap of the whole procedure (:mod:`.heldout`); their rows come from
    ``res``'s predictions or, for counts, from ``rows_of``."""
    run = res.run
    keep = [i for i, name in enumerate(res.schemes) if not name.startswith("enc=cross_encoding,")]
    names = [res.schemes[i] for i in keep]
    std = standard_name(run)
    std_i = names.index(std) if std in names else None
    proc = _procedure(res, keep, k, rows_of, replicates, seed)
    return RunSummary(
        model=str(run["model"]),
        shots=int(run["shots"]),
        test=int(run["test"]),
        n_items=int(run["n_items"]),
        n_schemes=len(names),
        data=str(run["data"]),
        metrics={m: _metric(res, m, keep, names, std_i, k, seed, proc) for m in res.metrics},
    )


def stored_schemes(store: SweepStore, run_id: int, names: Sequence[str]) -> list[Scheme]:
    """The schemes of a stored run's names (:meth:`Scheme.parse`; the store checks only a name's shape): a name
    the grammar refuses is one line naming the table, the row and the field that hold it."""
    out = []
    for name in names:
        try:
            out.append(Scheme.parse(name))
        except (InputError, ValueError, TypeError) as e:
            raise _misnamed(store, run_id, name, " ".join(str(e).split())) from None
    return out


def _misnamed(store: SweepStore, run_id: int, name: str, why: str) -> InputError:
    """The refusal of a stored scheme name: the ``sweep_groups`` row whose context part starts it, and the field
    at fault (``context`` when that part alone is no scheme, else ``outs``)."""
    rows = store.con.execute("SELECT rowid, context FROM sweep_groups WHERE run_id=?", (run_id,)).fetchall()
    held = [(r, c) for r, c in rows if isinstance(c, str) and (name == c or name.startswith(c + ","))]
    rowid, ctx = max(held, key=lambda h: len(h[1]), default=("?", ""))
    try:
        Scheme.parse(ctx)
        field = "outs"
    except (InputError, ValueError, TypeError):
        field = "context"
    return Row(store.path, "sweep_groups", f"rowid={rowid}").fail(field, f"{name[:60]!r} is not a scheme: {why[:160]}")


def _checked_counts(store: SweepStore, run_id: int, k: int, seed: int, chunk: int | None = None) -> SweepResults:
    """:meth:`SweepStore.load_counts` with every scheme name read by the grammar (:func:`stored_schemes`)."""
    res = store.load_counts(run_id, k=k, seed=seed, chunk=chunk)
    stored_schemes(store, run_id, res.schemes)
    return res


def _rows_of(store: SweepStore, run_id: int) -> RowsOf:
    def rows_of(rows: Sequence[int]) -> np.ndarray:
        return store.load_rows(run_id, rows)

    return rows_of


def summarise_stored(
    db: str | Path, run_id: int, k: int = 5, seed: int = 0, replicates: int = REPLICATES
) -> RunSummary | None:
    """:func:`summarise_run` of one stored sweep run (``None`` when it holds no scheme), read like
    :func:`summarise_db` reads each run: streamed counts, then the rows the paired test and the bootstrap need."""
    with SweepStore(db, readonly=True) as store:
        res = _checked_counts(store, run_id, k, seed)
        if not res.schemes:
            return None
        return summarise_run(res, k=k, seed=seed, rows_of=_rows_of(store, run_id), replicates=replicates)


def summarise_db(
    db: str | Path, k: int = 5, seed: int = 0, chunk: int | None = None, replicates: int = REPLICATES
) -> list[RunSummary]:
    """:func:`summarise_run` of every sweep run stored in ``db`` that holds schemes, in the order stored.

    The database is opened read-only (never created or changed; a damaged file is refused) and each run's
    predictions are streamed ``chunk`` schemes at a time (:meth:`SweepStore.load_counts`), so a full grid over
    all 10,042 HellaSwag items fits in a few hundred MB.  The paired test and the bootstrap (``replicates``; 0
    leaves them out) read the few rows they need in one more streamed pass (:meth:`SweepStore.load_rows`)."""
    out = []
    with SweepStore(db, readonly=True) as store:
        for run in store.runs():
            res = _checked_counts(store, run["id"], k, seed, chunk)
            if res.schemes:
                out.append(
                    summarise_run(res, k=k, seed=seed, rows_of=_rows_of(store, run["id"]), replicates=replicates)
                )
    return out


__all__ = [
    "BestScore",
    "Distribution",
    "HeldOut",
    "Marginal",
    "MetricSummary",
    "RunSummary",
    "SchemeScore",
    "standard_name",
    "stored_schemes",
    "summarise_db",
    "summarise_run",
    "summarise_stored",
]
