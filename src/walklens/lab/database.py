"""A results database as data frames (pandas): :func:`summarise_db` (seed 000, sec. 5.1, Figs. 10, 13-16).

The database is read through its own readers, read-only (:class:`~walklens.lab.hellaswag.store.ResultStore` and
:class:`~walklens.lab.hellaswag.store.SweepStore` opened with ``readonly=True``: never created or changed; a
missing, damaged or foreign file is refused in one line), and the sweep statistics are those of
:func:`walklens.lab.experiments.summary.summarise_run`.  Column names: docs/notebooks.md, "Tables".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..analyses.concepts.schemes import Scheme
from ..base.frames import Columns, DataFrame, concat_columns, frame, pandas, record_table, with_constants
from ..base.sqlite import tables
from .experiments.summary import stored_schemes, summarise_run
from .hellaswag.store import KEY_COLUMNS, ResultStore, SweepStore

#: The tables :func:`summarise_db` returns made from a sweep run's summary (:class:`RunSummary` tables).
SUMMARY_TABLES = ("estimates", "top10", "marginals", "folds", "distribution", "histogram")

_RUN_COLUMNS = [*KEY_COLUMNS, "n", "acc", "acc_norm", "created", "updated"]
_ITEM_COLUMNS = [*KEY_COLUMNS, "item", "gold", "pred", "pred_norm", "correct", "correct_norm"]
_SWEEP_RUN_COLUMNS = [
    "run_id",
    "model",
    "data",
    "split",
    "shots",
    "test",
    "n_items",
    "items_hash",
    "arch",
    "n_layers",
    "baseline_acc",
    "baseline_acc_norm",
]


def _single_runs(store: ResultStore) -> tuple[Columns, Columns]:
    """The ``runs`` and per-item ``results`` of single runs (``walklens hellaswag run``)."""
    runs = record_table([{k: r.get(k) for k in _RUN_COLUMNS} for r in store.iter_rows("runs")], _RUN_COLUMNS)
    items = [(r, [float(x) for x in json.loads(r["scores"])]) for r in store.iter_rows("results")]
    width = max((len(scores) for _, scores in items), default=0)
    names = [*_ITEM_COLUMNS, *(f"score_{j}" for j in range(width))]
    return runs, record_table(
        [
            {
                **{k: r[k] for k in _ITEM_COLUMNS[:-2]},
                "correct": r["pred"] == r["gold"],
                "correct_norm": r["pred_norm"] == r["gold"],
                **{f"score_{j}": scores[j] if j < len(scores) else None for j in range(width)},
            }
            for r, scores in items
        ],
        names,
    )


def _schemes(
    run_id: int,
    schemes: list[str],
    parsed: list[Scheme],
    metrics: list[str],
    acc: Any,
    baselines: dict[str, float | None],
) -> Columns:
    """One row per (scheme, metric) of a sweep run, the scheme's parameters as columns."""
    params = [dict(s.pairs()) for s in parsed]
    keys = list(dict.fromkeys(k for p in params for k in p))
    rows = []
    for mi, m in enumerate(metrics):
        base = baselines.get(m)
        for si, (s, p) in enumerate(zip(schemes, params)):
            a = float(acc[mi, si])
            rows.append(
                {
                    "run_id": run_id,
                    "scheme": s,
                    "metric": m,
                    "acc": a,
                    "normalised": a / base if base else None,
                    **{k: p.get(k) for k in keys},
                }
            )
    return record_table(rows, ["run_id", "scheme", "metric", "acc", "normalised", *keys])


def summarise_db(path: str | Path, k: int = 5, seed: int = 0, chunk: int | None = None) -> dict[str, DataFrame]:
    """Every table of a results database as pandas data frames, read-only (docs/notebooks.md, "Tables").

    ``runs`` and ``results``: single runs and their per-item results; ``sweep_runs``: the sweep runs (one per
    model, shots, test and item set, with their baselines); ``schemes``: every stored scheme's accuracy per
    sweep run and metric, with its parameters as columns; ``estimates``, ``top10``, ``marginals``, ``folds``,
    ``distribution``, ``histogram``: each sweep run's summary (honest best scores, top 10, per-parameter effects,
    k-fold choices; :meth:`~walklens.lab.experiments.summary.RunSummary.to_pandas`, ``k`` folds, ``seed``), keyed
    by ``run_id``.  A table the database does not hold is empty.  ``chunk``: schemes streamed at a time
    (:meth:`~walklens.lab.hellaswag.store.SweepStore.load_counts`)."""
    pandas()  # one line before any work when pandas is missing
    path = Path(path)
    out: dict[str, Columns] = {}
    with SweepStore(path, readonly=True) as sweeps:
        names = tables(sweeps.con)
        if {"runs", "results"} <= names:
            with ResultStore(path, readonly=True) as store:
                out["runs"], out["results"] = _single_runs(store)
        else:
            out["runs"], out["results"] = record_table([], _RUN_COLUMNS), record_table([], _ITEM_COLUMNS)
        sweep_rows, scheme_parts = [], []
        summary: dict[str, list[Columns]] = {t: [] for t in SUMMARY_TABLES}
        for run in sweeps.runs():
            sweep_rows.append({"run_id": run["id"], **{c: run.get(c) for c in _SWEEP_RUN_COLUMNS[1:]}})
            res = sweeps.load_counts(run["id"], k=k, seed=seed, chunk=chunk)
            parsed = stored_schemes(sweeps, run["id"], res.schemes)
            baselines = {m: res.baseline(m) for m in res.metrics}
            scheme_parts.append(_schemes(run["id"], res.schemes, parsed, res.metrics, res.acc, baselines))
            if res.schemes:
                rs = summarise_run(res, k=k, seed=seed)
                for t in SUMMARY_TABLES:
                    summary[t].append(with_constants({"run_id": run["id"]}, rs._columns(t)))
    out["sweep_runs"] = record_table(sweep_rows, _SWEEP_RUN_COLUMNS)
    out["schemes"] = (
        concat_columns(scheme_parts)
        if scheme_parts
        else record_table([], ["run_id", "scheme", "metric", "acc", "normalised"])
    )
    for t in SUMMARY_TABLES:
        out[t] = concat_columns(summary[t])
    return {name: frame(cols, {"database": str(path)}) for name, cols in out.items()}


__all__ = ["SUMMARY_TABLES", "summarise_db"]
