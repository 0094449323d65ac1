"""The sweeps view: browse the results database named at start (``--db``; the browser never names a file).

Runs are listed from :class:`~walklens.lab.hellaswag.store.SweepStore` opened read-only; a run's schemes are
loaded once as per-cell hit counts (:meth:`~walklens.lab.hellaswag.store.SweepStore.load_counts`), filtered by any
scheme parameter (``layer=-1``, ``norm=L2``, ...), and summarised by the report's own statistics
(:func:`walklens.lab.experiments.summary.summarise_run`: the histogram of accuracies next to chance, the top 10, the
in-sample, split-half and k-fold held-out best with Wilson intervals, the marginal effect of each value).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from starlette.requests import Request

from ..lab.experiments.summary import stored_schemes, summarise_run
from ..lab.hellaswag.store import SweepResults, SweepStore
from .bounds import ApiError, int_arg
from .routing import api
from .state import Explorer, Job, run_job

FOLDS, SEED = 5, 0  # the k-fold held-out best, as `walklens report` computes it by default
MAX_FILTERS = 16


def _runs(ex: Explorer) -> list[dict[str, Any]]:
    def load() -> list[dict[str, Any]]:
        assert ex.db is not None  # the handlers refuse a request without --db first
        with SweepStore(ex.db, readonly=True) as st:
            return [
                {k: r[k] for k in ("id", "model", "data", "split", "shots", "test", "n_items", "arch")}
                for r in st.runs()
            ]

    return ex.results.get(("sweeps", "runs"), load)


def _loaded(ex: Explorer, run: int) -> tuple[SweepResults, list[dict[str, str]]]:
    """A run's counts and each scheme's parameters (cached)."""

    def load() -> tuple[SweepResults, list[dict[str, str]]]:
        assert ex.db is not None  # the handlers refuse a request without --db first
        with SweepStore(ex.db, readonly=True) as st:
            res = st.load_counts(run, k=FOLDS, seed=SEED)
            return res, [dict(s.pairs()) for s in stored_schemes(st, run, res.schemes)]

    return ex.results.get(("sweeps", "run", run), load)


@api(exact=True)
async def sweeps(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """-> the sweep runs of the database (model, data, test, shots, items); ``db`` false without ``--db``."""
    if ex.db is None:
        return {"db": False, "runs": []}
    return {"db": True, "name": ex.db.name, "runs": await run_job(request, ex, None, lambda job: _runs(ex))}


@api(exact=True)
async def sweep_run(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{run, metric, filters: {param: value}}`` -> the run's parameters and values, and for the schemes
    matching every filter: the histogram, top 10, honest best scores, standard scheme and marginal effects."""
    if ex.db is None:
        raise ApiError("no database: start walklens serve with --db PATH", 404)
    run = int_arg(body, "run", None, 0, 2**62)
    filters = body.get("filters") or {}
    if (
        not isinstance(filters, dict)
        or len(filters) > MAX_FILTERS
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in filters.items())
    ):
        raise ApiError(f"filters must be an object of at most {MAX_FILTERS} parameter: value strings")
    metric = body.get("metric", "acc")

    def compute(job: Job) -> dict[str, Any]:
        if run not in {r["id"] for r in _runs(ex)}:
            raise ApiError(f"no sweep run {run} in the database")
        res, params = _loaded(ex, run)
        if metric not in res.metrics:
            raise ApiError(f"metric must be one of {', '.join(res.metrics)}")
        values: dict[str, list[str]] = {}
        for p in params:
            for k, v in p.items():
                if v not in values.setdefault(k, []):
                    values[k].append(v)
        unknown = [k for k in filters if k not in values]
        if unknown:
            raise ApiError(f"unknown scheme parameter {unknown[0]!r}; parameters: {', '.join(values)}")
        keep = [i for i, p in enumerate(params) if all(p.get(k) == v for k, v in filters.items())]
        names = [res.schemes[i] for i in keep]
        if not any(not n.startswith("enc=cross_encoding,") for n in names):
            raise ApiError("no scheme matches these filters")
        sub = dataclasses.replace(
            res, schemes=names, acc=res.acc[:, keep], hits=res.hits[:, keep] if res.hits is not None else None
        )
        m = summarise_run(sub, k=FOLDS, seed=SEED).metrics[metric]
        return {
            "run": run,
            "metric": metric,
            "metrics": res.metrics,
            "filters": filters,
            "parameters": values,
            "n_schemes": len(res.schemes),
            "n_matching": len(keep),
            "summary": m,
        }

    return await run_job(request, ex, None, compute)
