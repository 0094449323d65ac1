"""Running an experiment file (:mod:`..experiment`): every (model, few-shot seed, shots, test) into one database,
through the same engine and backend as ``walklens sweep`` (:func:`.run.run_sweep`, :mod:`walklens.core.backends`).

Each model is loaded once by the driver and once per worker (its runs share the workers).  The database and
the cache folder are checked before any model loads; every run resumes where an interrupted one stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ....analyses.concepts.cache import open_cache
from ....analyses.concepts.schemes import Scheme, resolve_layer
from ....base.errors import InputError
from ....base.outputs import check_dir
from ....core.backends import Backend
from ....core.scoring.encode import arch_of
from ...hellaswag.data import HF_PREFIX, HellaswagItem, data_id, load_hellaswag
from ...hellaswag.store import ResultStore, SweepStore
from ..experiment import Experiment, ModelEntry
from ..grid import GridSpec
from ..runsetup import RunSetup
from .run import SweepOutcome, SweepSpec, run_sweep
from .sink import OnShard

if TYPE_CHECKING:
    from ....core.loading import LoadedModel


@dataclass
class StudyRun:
    """One run of an experiment and what it did."""

    model: str
    test: int
    shots: int
    seed: int
    grid: str
    n_items: int
    outcome: SweepOutcome
    seconds: float


def default_cache(db: str | Path) -> Path:
    """The vector bank's cache folder of a study without ``cache = ...``: ``DB.bank`` next to the database."""
    p = Path(db)
    return p.with_name(p.name + ".bank")


def study_items(exp: Experiment) -> tuple[list[HellaswagItem], list[HellaswagItem] | None, str]:
    """The items of the study's range, the few-shot pool when it is not those items (the whole file, or the hub's
    train split), and the data key."""
    start, stop = exp.items
    items = load_hellaswag(exp.data, limit=stop)
    if start >= len(items):
        raise InputError(f"{exp.path}: items: the range starts at {start}, but the data holds {len(items)} items")
    if stop is not None and stop > len(items):
        raise InputError(f"{exp.path}: items: the range ends at {stop}, but the data holds {len(items)} items")
    items = items[start:]
    pool = None
    if any(exp.shots):
        hub = exp.data is not None and str(exp.data).startswith(HF_PREFIX)
        if hub:
            pool = load_hellaswag(exp.data, split="train")
        elif start or stop is not None:
            pool = load_hellaswag(exp.data)
        others = len(pool if pool is not None else items) - (0 if hub else 1)  # the query is never its own shot
        if max(exp.shots) > others:
            raise InputError(
                f"{exp.path}: shots: {max(exp.shots)}-shot needs {max(exp.shots)} other items in the "
                f"few-shot pool, which has {others}"
            )
    return items, pool, data_id(exp.data)


def run_experiment(
    exp: Experiment,
    backend: Backend,
    *,
    db: str | Path,
    progress: bool = True,
    log: Callable[[str], None] = lambda m: None,
    on_run: Callable[[StudyRun], None] | None = None,
    on_shard: OnShard | None = None,
) -> list[StudyRun]:
    """Run every ``(model, seed, shots, test)`` of ``exp`` (:meth:`~..experiment.Experiment.runs`) into ``db``;
    ``on_run`` is called after each run.  The cache folder is ``exp.cache`` (``False``: none; default:
    :func:`default_cache`)."""
    for m in exp.models:  # a device the workers cannot have: refused before anything loads or is written
        backend.check_device(m.device)
    cache: str | Path | None = None
    if exp.cache is not False:
        cache = exp.cache if isinstance(exp.cache, str) and exp.cache else default_cache(db)
    if cache is not None:
        check_dir(cache, "cache")
    with SweepStore(db):  # an unusable database is refused before any model loads
        pass
    items, pool, data = study_items(exp)
    out: list[StudyRun] = []
    concepts = open_cache(cache)
    try:
        with ResultStore(db) as store:
            setup = RunSetup(pool=pool, data=data, store=store, cache=concepts, progress=progress)
            for model in exp.models:
                out += _model_runs(exp, backend, model, items, setup, _Hooks(log, on_run, on_shard))
    finally:
        if concepts is not None:
            concepts.close()
    return out


@dataclass(frozen=True)
class _Hooks:
    """What a study reports: log lines, each run when done, each shard stored."""

    log: Callable[[str], None]
    on_run: Callable[[StudyRun], None] | None
    on_shard: OnShard | None


def _grids(exp: Experiment, lm: LoadedModel) -> dict[int, tuple[GridSpec, list[Scheme]]]:
    """Each test's grid and its schemes on ``lm``: every grid fits this model before any of its work."""
    arch = arch_of(lm)
    grids: dict[int, tuple[GridSpec, list[Scheme]]] = {}
    for t in exp.tests:
        g = GridSpec.resolve(exp.grids[t], t, arch, exp.layers)
        for layer in g.layers():
            resolve_layer(layer, lm.n_layers)
        schemes, _ = g.enumerate(arch)
        if not schemes:
            raise InputError(f"{exp.path}: the grid of Test {t} has no valid scheme for {lm.name}")
        grids[t] = (g, schemes)
    return grids


def _model_runs(
    exp: Experiment, backend: Backend, model: ModelEntry, items: list[HellaswagItem], setup: RunSetup, hooks: _Hooks
) -> list[StudyRun]:
    """Every run of one model of ``exp``, on workers opened once for them."""
    runs = [r for r in exp.runs() if r[0] == model]
    lm = backend.driver_model(model.spec, dtype=model.dtype, device=model.device)
    grids = _grids(exp, lm)
    hooks.log(f"{lm.name}: {len(runs)} run(s) on {backend.describe()}")
    out: list[StudyRun] = []
    with backend.workers(lm) as workers:
        for _, seed, shots, test in runs:
            g, schemes = grids[test]
            t0 = time.perf_counter()
            o = run_sweep(
                lm,
                items,
                SweepSpec(test=test, schemes=schemes),
                replace(setup, shots=shots, fewshot_seed=seed, workers=workers),
                log=hooks.log,
                on_shard=hooks.on_shard,
            )
            run = StudyRun(
                model=lm.name,
                test=test,
                shots=shots,
                seed=seed,
                grid=g.name,
                n_items=len(items),
                outcome=o,
                seconds=time.perf_counter() - t0,
            )
            out.append(run)
            if hooks.on_run is not None:
                hooks.on_run(run)
    return out
