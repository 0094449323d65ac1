"""Compression-retention curves on HellaSwag (seed 000, footnote 11; docs/compaction.md).

For one model, each shot count and each part compacted (``what``: the few-shot examples or the item's own
context), every strategy runs at every ratio (compacted tokens per vector, ``max`` = one vector) on the
reported items; the uncompacted run (the lm-eval-exact baseline with the same shots), the zero-shot run and
two baselines at every ratio (plain average pooling over even segments; dropping the part's tokens down to the
same number of model inputs, keeping the last ones) share the items.  Every run goes through the results
database (test ``compact``, scheme ``str(spec)``), so an interrupted curve resumes where it stopped.

* **Kept**: ``acc(compacted) / acc(full)`` (and ``acc_norm``) on the same items.  Its 95% interval is a paired
  bootstrap (:func:`scipy.stats.bootstrap`, ``paired=True``: items resampled with both runs' outcomes; 2,000
  resamples, percentile interval, fixed seed): the two accuracies share items, so their ratio's spread is not
  that of two independent proportions.  Each raw accuracy also gets its Wilson interval
  (:func:`~walklens.analyses.chance.wilson`).
* **Tuning** (the concept method's layer, word aggregation and NORM): every candidate runs at one ratio on
  tuning items disjoint from the reported ones; the best ``acc_norm`` is used for every concept strategy.
* **Time**: on the first ``timing_items`` reported items, the packed scoring of the endings after the
  compacted context vs after the full one (the vectors taken as given, the concept cache's use), and the cost
  of computing the vectors from nothing; plus the mean model inputs per item (deterministic).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ...analyses.chance import wilson
from ...analyses.compaction.spec import CompactSpec
from ...base.display import Shown
from ...base.errors import InputError
from ...base.frames import Columns, DataFrame, frame, pick, record_table
from ...core.scoring.packing import packed_logliks
from ..hellaswag.baseline import baseline_request
from ..hellaswag.data import HellaswagItem
from .compaction import compact_requests, compact_run, plan_item
from .runner import RunSummary, baseline_scorer, run_test
from .runsetup import RunSetup

if TYPE_CHECKING:
    from ...core.loading import LoadedModel

DEFAULT_RATIOS: tuple[float, ...] = (2.0, 4.0, 8.0, 16.0, 32.0, math.inf)
DEFAULT_STRATEGIES: tuple[str, ...] = ("bounds=even", "bounds=sentence", "bounds=sentence,recent=16")
BASELINE_STRATEGIES: tuple[str, ...] = ("method=avgpool,bounds=even", "method=drop")
DEFAULT_CANDIDATES: tuple[str, ...] = tuple(
    f"layer={l},word={w}" for l in ("E", "middle", "-1") for w in ("mean", "w1mean", "last")
)
TUNE_RATIO = 4.0
N_RESAMPLES = 2000


def kept(
    compact: np.ndarray, full: np.ndarray, n_resamples: int = N_RESAMPLES, seed: int = 0
) -> tuple[float | None, float | None, float | None]:
    """``mean(compact) / mean(full)`` of paired 0/1 outcomes and its 95% paired-bootstrap percentile interval
    (None where the full accuracy is 0)."""
    from scipy.stats import DegenerateDataWarning, bootstrap

    c, f = np.asarray(compact, dtype=np.float64), np.asarray(full, dtype=np.float64)
    if c.shape != f.shape or c.ndim != 1:
        raise ValueError("kept() needs two outcome vectors over the same items")
    if not len(f) or f.sum() == 0:
        return None, None, None
    point = float(c.mean() / f.mean())
    if len(f) < 2:
        return point, None, None

    def ratio(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return a.mean(axis=axis) / b.mean(axis=axis)

    if np.array_equal(c, f):  # every resample gives 1 (scipy warns about such degenerate data)
        return point, point, point
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        # degenerate resamples (one loss among many items; no full-run hit in a small resample) are expected
        warnings.simplefilter("ignore", category=DegenerateDataWarning)
        res = bootstrap(
            (c, f),
            ratio,
            paired=True,
            vectorized=True,
            n_resamples=n_resamples,
            method="percentile",
            confidence_level=0.95,
            random_state=np.random.default_rng(seed),
        )
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return point, (lo if math.isfinite(lo) else None), (hi if math.isfinite(hi) else None)


@dataclass
class CurvePoint:
    """One run on the reported items, against the full run with the same shots."""

    shots: int
    what: str
    strategy: str
    ratio: float | None
    spec: str
    n: int
    acc: float
    acc_norm: float
    acc_ci: tuple[float, float]
    acc_norm_ci: tuple[float, float]
    kept_acc: float | None
    kept_acc_ci: tuple[float | None, float | None]
    kept_acc_norm: float | None
    kept_acc_norm_ci: tuple[float | None, float | None]
    tokens_per_vector: float | None = None
    inputs: float | None = None
    inputs_full: float | None = None
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class CurveSet(Shown, view="curves"):
    """Every point of one model's curves, the tuning outcome and what was measured how."""

    model: str
    n_items: int
    n_tune: int
    tuned: dict[str, Any]
    points: list[CurvePoint]
    interval: str = (
        "kept: 95% paired bootstrap, percentile, 2000 resamples (scipy.stats.bootstrap); accuracies: 95% Wilson"
    )

    def _columns(self, table: str = "points") -> Columns:
        """The plain columns of :meth:`to_pandas`."""
        timed = list(dict.fromkeys(k for p in self.points for k in p.seconds))

        def row(p: CurvePoint) -> dict[str, Any]:
            d: dict[str, Any] = {"model": self.model}
            for k in (
                "shots",
                "what",
                "strategy",
                "ratio",
                "spec",
                "n",
                "acc",
                "acc_ci",
                "acc_norm",
                "acc_norm_ci",
                "kept_acc",
                "kept_acc_ci",
                "kept_acc_norm",
                "kept_acc_norm_ci",
            ):
                v = getattr(p, k)
                if k.endswith("_ci"):
                    d[f"{k[:-3]}_lo"], d[f"{k[:-3]}_hi"] = v
                else:
                    d[k] = v
            d.update(tokens_per_vector=p.tokens_per_vector, inputs=p.inputs, inputs_full=p.inputs_full)
            d.update({f"seconds_{k}": p.seconds.get(k) for k in timed})
            return d

        return pick(table, {"points": lambda: record_table([row(p) for p in self.points])}, "a CurveSet")

    def to_pandas(self, table: str = "points") -> DataFrame:
        """The curves as one table (pandas; docs/notebooks.md, "Tables"): one row per point (shots, what,
        strategy, ratio), accuracies with their intervals as ``*_lo``/``*_hi``, the share ``kept_*`` of the
        full run's accuracy, and the timings as ``seconds_*``."""
        return frame(
            self._columns(table),
            {
                "model": self.model,
                "n_items": self.n_items,
                "n_tune": self.n_tune,
                "tuned": dict(self.tuned),
                "interval": self.interval,
            },
        )


def point(
    summary: RunSummary, full: RunSummary, *, shots: int, what: str, strategy: str, ratio: float | None, spec: str
) -> CurvePoint:
    """A :class:`CurvePoint` of ``summary`` against ``full`` (the same items, in the same order)."""
    if [r.item for r in summary.results] != [r.item for r in full.results]:
        raise ValueError("a curve point and its full run must hold the same items")
    c = np.array([r.pred == r.gold for r in summary.results])
    cn = np.array([r.pred_norm == r.gold for r in summary.results])
    f = np.array([r.pred == r.gold for r in full.results])
    fn = np.array([r.pred_norm == r.gold for r in full.results])
    n = len(c)
    ka, ka_lo, ka_hi = kept(c, f)
    kn, kn_lo, kn_hi = kept(cn, fn)
    return CurvePoint(
        shots=shots,
        what=what,
        strategy=strategy,
        ratio=ratio,
        spec=spec,
        n=n,
        acc=float(c.mean()),
        acc_norm=float(cn.mean()),
        acc_ci=wilson(int(c.sum()), n),
        acc_norm_ci=wilson(int(cn.sum()), n),
        kept_acc=ka,
        kept_acc_ci=(ka_lo, ka_hi),
        kept_acc_norm=kn,
        kept_acc_norm_ci=(kn_lo, kn_hi),
    )


def sizes(
    lm: LoadedModel, items: Sequence[HellaswagItem], exs: Sequence[Sequence[HellaswagItem]], spec: CompactSpec
) -> dict[str, float]:
    """Mean tokens per vector and model inputs per item, compacted and full, from the plans alone (no model)."""
    rep = vec = inp = full = 0
    for it, ex in zip(items, exs):
        p = plan_item(lm, it, ex, spec)
        k = min(p.k, p.b - p.a) if spec.method == "drop" else (len(p.cut.spans) if p.cut is not None else 0)
        rep, vec = rep + p.b - p.a, vec + k
        inp, full = inp + len(p.ctx) - (p.b - p.a) + k, full + len(p.ctx)
    n = max(1, len(items))
    return {"tokens_per_vector": rep / vec if vec else math.inf, "inputs": inp / n, "inputs_full": full / n}


def timing(
    lm: LoadedModel, items: Sequence[HellaswagItem], exs: Sequence[Sequence[HellaswagItem]], spec: CompactSpec | None
) -> dict[str, float]:
    """Seconds on ``items``: ``score`` (packed scoring of the endings after the context: compacted with the
    vectors given, or full when ``spec`` is None) and ``vectors`` (computing the compacted contexts from nothing,
    no cache)."""
    t0 = time.perf_counter()
    reqs = (
        [baseline_request(lm, it, ex) for it, ex in zip(items, exs)]
        if spec is None
        else compact_requests(lm, items, exs, spec, cache=None)
    )
    t1 = time.perf_counter()
    packed_logliks(lm, reqs)
    t2 = time.perf_counter()
    return {"score": t2 - t1, "vectors": t1 - t0}


def tune(
    lm: LoadedModel,
    tune_items: Sequence[HellaswagItem],
    setup: RunSetup,
    *,
    what: str,
    candidates: Sequence[str],
    ratio: float = TUNE_RATIO,
) -> tuple[CompactSpec, list[dict[str, Any]]]:
    """The candidate (``layer=..,word=..[,norm=..]``) with the best ``acc_norm`` (ties: the first) at ``ratio``
    with sentence bounds on ``tune_items`` (``setup.shots``-shot), and every candidate's scores."""
    scores = []
    best: tuple[float, CompactSpec] | None = None
    for cand in candidates:
        spec = CompactSpec.parse(f"what={what},bounds=sentence,ratio={ratio},{cand}")
        s = compact_run(lm, tune_items, spec, setup)
        scores.append({"candidate": cand, "spec": str(spec), "acc": s.acc, "acc_norm": s.acc_norm, "n": s.n})
        if best is None or (s.acc_norm or 0.0) > best[0]:
            best = ((s.acc_norm or 0.0), spec)
    if best is None:
        raise InputError("no tuning candidates")
    return best[1], scores


@dataclass(frozen=True)
class CurveGrid:
    """What the curves measure: the shot counts, the parts compacted (``whats``), the strategies run at every
    ratio (the two baselines always run too), the tuning candidates (none: no tuning) and the items timed per
    point."""

    shots: Sequence[int] = (5, 10)
    whats: Sequence[str] = ("examples", "context")
    strategies: Sequence[str] = DEFAULT_STRATEGIES
    ratios: Sequence[float] = DEFAULT_RATIOS
    candidates: Sequence[str] = DEFAULT_CANDIDATES
    timing_items: int = 16


@dataclass
class _Curves:
    """One model's curves in the making: the reported items, the grid, the measured seconds by point
    (``timings``, filled where missing; ``on_timing`` keeps them) and the log."""

    lm: LoadedModel
    items: Sequence[HellaswagItem]
    grid: CurveGrid
    timings: dict[str, dict[str, float]]
    on_timing: Callable[[dict[str, dict[str, float]]], None] | None
    log: Callable[[str], None]

    def measure(self, key: str, exs: Sequence[Sequence[HellaswagItem]], spec: CompactSpec | None) -> None:
        """:func:`timing` of ``spec`` on the first ``grid.timing_items`` items, unless ``key`` is measured."""
        n = self.grid.timing_items
        if n and key not in self.timings:
            self.timings[key] = timing(self.lm, self.items[:n], exs[:n], spec)
            if self.on_timing:
                self.on_timing(self.timings)

    def tuned(self, tune_items: Sequence[HellaswagItem], setup: RunSetup) -> dict[str, Any]:
        """Per part compacted, the tuned layer, word aggregation and NORM with every candidate's scores
        (:func:`tune` at the first shot count; the defaults without tuning items or candidates)."""
        g = self.grid
        tuned: dict[str, Any] = {}
        for what in g.whats:
            if tune_items and g.candidates:
                best, scores = tune(
                    self.lm, tune_items, replace(setup, shots=g.shots[0]), what=what, candidates=g.candidates
                )
                self.log(
                    f"tuned ({what}, {g.shots[0]}-shot, {len(tune_items)} items): {best.layer},{best.word},{best.norm}"
                )
            else:
                best, scores = CompactSpec(what=what), []
            tuned[what] = {"layer": best.layer, "word": best.word, "norm": best.norm, "candidates": scores}
        return tuned

    def strategy_points(self, setup: RunSetup, full: RunSummary, what: str, tuned: dict[str, Any]) -> list[CurvePoint]:
        """The points of every strategy and ratio compacting ``what`` at ``setup.shots`` against the full run."""
        lm, items, shots = self.lm, self.items, setup.shots
        exs = setup.examples(items)
        points = []
        for strategy in list(self.grid.strategies) + list(BASELINE_STRATEGIES):
            for r in self.grid.ratios:
                spec = CompactSpec.parse(f"what={what},{strategy},ratio={'max' if math.isinf(r) else r}")
                if spec.method == "concept":
                    spec = replace(spec, layer=tuned["layer"], word=tuned["word"], norm=tuned["norm"])
                s = compact_run(lm, items, spec, setup)
                pt = point(s, full, shots=shots, what=what, strategy=strategy, ratio=float(r), spec=str(spec))
                for k, v in sizes(lm, items, exs, spec).items():
                    setattr(pt, k, v)
                key = f"{shots}|{spec}"
                self.measure(key, exs, spec)
                pt.seconds = {
                    **self.timings.get(key, {}),
                    "full_score": self.timings.get(f"full|{shots}", {}).get("score", math.nan),
                }
                points.append(pt)
                self.log(f"{shots}-shot {what} {strategy} ratio={r}: acc_norm kept {pt.kept_acc_norm}")
        return points


def run_curves(
    lm: LoadedModel,
    items: Sequence[HellaswagItem],
    tune_items: Sequence[HellaswagItem],
    setup: RunSetup,
    grid: CurveGrid = CurveGrid(),
    *,
    timings: dict[str, dict[str, float]] | None = None,
    on_timing: Callable[[dict[str, dict[str, float]]], None] | None = None,
    log: Callable[[str], None] = lambda m: None,
) -> CurveSet:
    """Every point of the curves (module docstring), each run resumed from the results store of ``setup`` (its
    pool, data id, few-shot seed, concept cache and progress; the shot counts are ``grid.shots``).  ``timings``
    holds the measured seconds by point (filled where missing; ``on_timing`` is called after each new
    measurement so the caller can keep them)."""
    if {it.index for it in items} & {it.index for it in tune_items}:
        raise InputError("tuning items must be disjoint from the reported items")
    curves = _Curves(lm, items, grid, {} if timings is None else timings, on_timing, log)
    tuned = curves.tuned(tune_items, setup)
    points: list[CurvePoint] = []
    for shots in grid.shots:
        at = replace(setup, shots=shots)
        full = run_test(lm, items, baseline_scorer(), at, desc=f"{lm.name} baseline {shots}-shot")
        zero = run_test(lm, items, baseline_scorer(), replace(setup, shots=0), desc=f"{lm.name} zero-shot")
        tkey = f"full|{shots}"
        curves.measure(tkey, at.examples(items), None)
        for what in grid.whats:
            full_s = curves.timings.get(tkey, {}).get("score")
            points.append(
                replace(
                    point(full, full, shots=shots, what=what, strategy="full", ratio=1.0, spec="baseline"),
                    seconds={} if full_s is None else {"score": full_s},
                )
            )
            points.append(
                point(zero, full, shots=shots, what=what, strategy="zero-shot", ratio=None, spec="baseline, 0-shot")
            )
            points += curves.strategy_points(at, full, what, tuned[what])
    return CurveSet(model=lm.name, n_items=len(items), n_tune=len(tune_items), tuned=tuned, points=points)


__all__ = [
    "BASELINE_STRATEGIES",
    "CurveGrid",
    "CurvePoint",
    "CurveSet",
    "DEFAULT_CANDIDATES",
    "DEFAULT_RATIOS",
    "DEFAULT_STRATEGIES",
    "kept",
    "point",
    "run_curves",
    "sizes",
    "timing",
    "tune",
]
