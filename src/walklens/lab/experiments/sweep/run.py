"""Orchestration of a sweep: the baseline, the bank, then every scheme group not yet stored (seed 000, sec. 5.1).

Everything that computes is a shard fixed before any runs (:mod:`.shards`, :func:`~.bank.forward_shard`) and
run by the workers of a backend (:mod:`walklens.core.backends`: this process, or Ray actors holding the model
once each).  This driver plans the shards, skips those whose results are stored and stores results as they
come back:

* baseline: chunks of :data:`~..runner.CHUNK` consecutive items, stored per item in the results tables
  (shared with ``walklens hellaswag baseline``);
* bank: batches of texts of equal token length, kept per text in the concept cache (``RunSetup.cache``);
* Test 2: one shard per bundle (groups sharing NORM, enc, seg, ex, sim and the choice encodings, over every
  group of the grid, stored or not, so a bundle's matrix shapes never depend on what was stored) and item range
  (one range of all items where the bank fits the workers' ``context_bytes``, else ranges whose bank rows fit,
  whole :data:`~.shards.TEST2_CHUNK`-item chunks each, each range's rows its shards' context); the shards of one
  range, NORM and encoding run together, :data:`~.shards.TEST2_BATCH` at most (a batch: they read, normalise
  and compose the rows once, each giving the bits it gives alone); a range's picks are kept in ``sweep_shards``
  and the bundle's groups committed in one transaction when its last range is in (with one range: as soon as
  its batch is back, so a killed sweep loses at most the batches in flight);
* Test 1: schemes in blocks of one bank layer and word aggregation (concept sequences can be identical only
  within one), each cut into item ranges of ``SweepSpec.test1_shard_items``; a range's picks are kept in the store's
  ``sweep_shards`` table and the block's groups committed, dropping them, when its last range is in.

Test 2 is planned and run by :mod:`.similarity`, Test 1 by :mod:`.generation`; a shard's key (:mod:`.keys`) names what
it computed and the kept picks.  A payload depends only on the grid, the items and the stored whole bundles and
blocks, so the stored picks are the same bits whatever the backend and the number of workers, and a killed sweep
(driver or worker) resumes without computing a stored shard again and ends with the table an uninterrupted run
gives.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from ....analyses.concepts.schemes import WORD_AGG_SCHEMES, Scheme
from ....base.errors import InputError
from ....core.backends import LocalWorkers, Workers
from ....core.scoring.encode import arch_of
from ...hellaswag.baseline import accuracy, item_tokens
from ...hellaswag.data import HellaswagItem
from ...hellaswag.store import ResultStore, SweepRun, SweepStore
from ..grid import group_by_context
from ..runner import BASELINE_SCHEME, CHUNK, RunSummary, progress_bar
from ..runsetup import RunSetup
from .bank import build_bank, layer_keys
from .generation import TEST1_SHARD_ITEMS, Test1Items, evaluate_test1
from .plan import ItemPlan, plan_item
from .shards import baseline_shard
from .similarity import evaluate_test2
from .sink import OnShard, Sink, Tally

if TYPE_CHECKING:
    from ....core.loading import LoadedModel


@dataclass(frozen=True)
class SweepSpec:
    """What a sweep runs: Test ``test``'s ``schemes`` (valid for it on the model), and how the work is cut into
    shards: Test 1's items per shard, Test 2's bound on an item range's bank rows in MB (None: the workers'
    ``context_bytes``).  The stored results do not depend on the bound; Test 1's shard size names its shards."""

    test: int
    schemes: Sequence[Scheme]
    test1_shard_items: int = TEST1_SHARD_ITEMS
    test2_context_mb: float | None = None

    def check(self) -> None:
        """One :class:`~walklens.base.errors.InputError` line for an empty grid or a bad shard size."""
        if not self.schemes:
            raise InputError("the grid has no valid scheme for this test and model")
        if self.test1_shard_items < 1:
            raise InputError(f"test1_shard_items must be >= 1, got {self.test1_shard_items}")
        if self.test2_context_mb is not None and not self.test2_context_mb > 0:
            raise InputError(f"test2_context_mb must be > 0, got {self.test2_context_mb}")


def _store(setup: RunSetup) -> ResultStore:
    if setup.store is None:
        raise InputError("a sweep stores its results: give it a results database (RunSetup(store=...))")
    return setup.store


def sweep_baseline(
    workers: Workers, model: str, items: Sequence[HellaswagItem], setup: RunSetup, tally: Tally | None = None
) -> RunSummary:
    """The baseline of ``items`` as the runner stores it (the same key: shared with ``walklens hellaswag
    baseline``) in ``setup.store``, computed on ``workers`` in chunks of :data:`~..runner.CHUNK` consecutive
    items; a chunk with an item not stored runs whole (so its packing never depends on what was stored) and
    stored items are kept.  ``tally`` counts the chunks computed (kind ``baseline``)."""
    tally = Tally(progress=setup.progress) if tally is None else tally
    store = _store(setup)
    key = setup.run_key(model, items, "baseline", BASELINE_SCHEME)
    stored = store.results(key, [it.index for it in items])
    chunks = [list(items[a : a + CHUNK]) for a in range(0, len(items), CHUNK)]
    todo = [c for c in chunks if any(it.index not in stored for it in c)]
    pooled = setup.with_pool(items)
    payloads = ((c, pooled.examples(c)) for c in todo)
    bar = progress_bar(
        total=sum(map(len, todo)), desc=f"{model} baseline", unit="item", disable=not tally.progress or not todo
    )
    computed = 0
    try:
        for _, rs in workers.map(baseline_shard, None, payloads):
            store.add_results(key, rs)
            for r in rs:
                computed += r.item not in stored
                stored.setdefault(r.item, r)
            bar.update(len(rs))
            tally.shard("baseline")
    finally:
        bar.close()
    results = [stored[it.index] for it in items]
    acc, acc_norm = accuracy(results)
    store.record_run(key, len(results), acc, acc_norm)
    return RunSummary(key=key, results=results, computed=computed, acc=acc, acc_norm=acc_norm)


@dataclass
class BankPlan:
    """What a sweep asks of the bank: each item's few-shot examples and :class:`~.plan.ItemPlan`, every segment
    text (with repeats, in order), the bank layers (keys) and word aggregations, and the scheme layer -> bank
    key map."""

    examples: list[list[HellaswagItem]]
    plans: list[ItemPlan]
    texts: list[str]
    layers: list[str]
    words: list[str]
    layer_key: dict[str, str]


def plan_bank(lm: LoadedModel, items: Sequence[HellaswagItem], spec: SweepSpec, setup: RunSetup) -> BankPlan:
    """The :class:`BankPlan` of the sweep ``spec`` over ``items`` with ``setup``'s few-shot examples (what
    :func:`run_sweep` builds its bank from; e.g. to fill a concept cache ahead of it)."""
    composed = [s for s in spec.schemes if s.enc != "cross_encoding"]
    encs = list(dict.fromkeys(s.enc for s in composed))
    exs = setup.examples(items)
    plans = [plan_item(lm, it, ex, encs) for it, ex in zip(items, exs)]
    layer_vals = {s.layer for s in composed}
    word_vals = {s.word for s in composed}
    if spec.test == 2:
        layer_vals |= {s.out_layer_eff for s in spec.schemes}
        word_vals |= {s.out_word_eff for s in spec.schemes}
    lkey = layer_keys(lm, layer_vals)
    return BankPlan(
        examples=exs,
        plans=plans,
        texts=[t for p in plans for t in p.texts()] if encs else [],
        layers=sorted(set(lkey.values()), key=lambda k: -1 if k == "E" else int(k)),
        words=[w for w in WORD_AGG_SCHEMES if w in word_vals],
        layer_key=lkey,
    )


@dataclass
class SweepOutcome:
    """What one call of :func:`run_sweep` did (``shards_computed``: per kind, the shards run by this call)."""

    run_id: int
    n_schemes: int
    n_groups: int
    groups_stored_before: int
    groups_computed: int
    n_texts: int
    seconds_baseline: float
    seconds_forward: float
    seconds_eval: float
    baseline_acc: float | None
    baseline_acc_norm: float | None
    refused: dict[str, int] = field(default_factory=dict)
    shards_computed: dict[str, int] = field(default_factory=dict)
    backend: str = "local"
    workers: int = 1


def _workers(lm: LoadedModel, setup: RunSetup) -> Workers:
    """Where the shards run: ``setup.workers``, else this process on ``lm``."""
    return setup.workers if setup.workers is not None else LocalWorkers(lm)


def _evaluate(
    lm: LoadedModel,
    items: Sequence[HellaswagItem],
    spec: SweepSpec,
    setup: RunSetup,
    sink: Sink,
    base_preds: np.ndarray,
    tally: Tally,
    outcome: SweepOutcome,
) -> None:
    """The bank (:func:`~.bank.build_bank`), then every scheme group not yet stored, both timed in ``outcome``."""
    workers = _workers(lm, setup)
    bp = plan_bank(lm, items, spec, setup)
    t1 = time.perf_counter()
    bank = build_bank(
        lm,
        bp.texts,
        bp.layers,
        bp.words,
        cache=setup.cache,
        progress=setup.progress,
        workers=workers,
        on_shard=tally.set,
    )
    outcome.n_texts = len(bank.index)
    t2 = time.perf_counter()
    outcome.seconds_forward = t2 - t1
    if spec.test == 2:
        outcome.groups_computed = evaluate_test2(
            sink, bank, bp.plans, spec.schemes, bp.layer_key, workers, tally, spec.test2_context_mb
        )
    else:
        conts = [item_tokens(lm, it, ex)[1] for it, ex in zip(items, bp.examples)]
        outcome.groups_computed = evaluate_test1(
            sink,
            bank,
            Test1Items(bp.plans, conts, base_preds),
            spec.schemes,
            bp.layer_key,
            workers,
            tally,
            spec.test1_shard_items,
        )
    outcome.seconds_eval = time.perf_counter() - t2


def run_sweep(
    lm: LoadedModel,
    items: Sequence[HellaswagItem],
    spec: SweepSpec,
    setup: RunSetup,
    *,
    log: Callable[[str], None] = lambda m: None,
    on_shard: OnShard | None = None,
    stop_after: int | None = None,
) -> SweepOutcome:
    """Sweep ``spec.schemes`` (valid for ``spec.test`` on this model) over ``items``, storing into the results
    database ``setup.store`` (its sweep tables too).

    1. the baseline of the same items (the runner's store and key, same database: shared with single runs;
       normalised scores divide by it);
    2. every distinct segment text of every encoding scheme used, run once (:func:`~.bank.build_bank`; read
       from and kept in the concept cache ``setup.cache`` when given);
    3. every scheme group not yet stored, evaluated and committed (:func:`~.similarity.evaluate_test2`,
       :func:`~.generation.evaluate_test1`).  Rerunning the same call after an interruption continues where it stopped.

    ``lm`` plans (tokenises, cuts items); the shards run on ``setup.workers`` if given, else in this process on
    ``lm``.  The stored results do not depend on which.  ``on_shard(kind, n)`` follows the shards stored;
    ``stop_after`` stops after that many groups (the tests use it to simulate an interruption).
    """
    if not items:
        raise InputError("no items to sweep")
    spec.check()
    store = _store(setup)
    setup = setup.with_pool(items)
    workers = _workers(lm, setup)
    tally = Tally(progress=setup.progress, on_shard=on_shard, stop_after=stop_after)
    t0 = time.perf_counter()
    base = sweep_baseline(workers, lm.name, items, setup, tally)
    t_base = time.perf_counter() - t0
    base_preds = np.array([[r.pred for r in base.results], [r.pred_norm for r in base.results]], np.uint8)
    with SweepStore(store.path) as st:
        rid = _register(st, lm, items, spec, setup, base, base_preds)
        groups = group_by_context(spec.schemes) if spec.test == 2 else {s.context_part(): [s] for s in spec.schemes}
        done = st.done(rid)
        before = sum(1 for g in groups.values() if g[0].context_part() in done)
        log(f"{len(spec.schemes)} schemes in {len(groups)} groups; {before} groups already stored")
        outcome = _outcome(rid, spec, len(groups), before, t_base, base, tally, workers)
        if before == len(groups):
            return outcome
        sink = Sink(st, rid, np.array([it.label for it in items], np.uint8))
        _evaluate(lm, items, spec, replace(setup, workers=workers), sink, base_preds, tally, outcome)
        return outcome


def _register(
    st: SweepStore,
    lm: LoadedModel,
    items: Sequence[HellaswagItem],
    spec: SweepSpec,
    setup: RunSetup,
    base: RunSummary,
    base_preds: np.ndarray,
) -> int:
    """The id of the sweep run of ``items`` in the store ``st`` (found again on a rerun), its baseline set."""
    rid = st.run_id(
        SweepRun(
            model=lm.name,
            data=base.key.data,
            split=items[0].split,
            shots=setup.shots,
            test=spec.test,
            labels=[it.label for it in items],
            item_index=[it.index for it in items],
            arch=arch_of(lm),
            n_layers=lm.n_layers,
        )
    )
    st.set_baseline(rid, base.acc or 0.0, base.acc_norm or 0.0, base_preds)
    return rid


def _outcome(
    rid: int,
    spec: SweepSpec,
    n_groups: int,
    before: int,
    t_base: float,
    base: RunSummary,
    tally: Tally,
    workers: Workers,
) -> SweepOutcome:
    """The outcome of a sweep before its groups are evaluated: ``before`` of ``n_groups`` groups already stored."""
    return SweepOutcome(
        run_id=rid,
        n_schemes=len(spec.schemes),
        n_groups=n_groups,
        groups_stored_before=before,
        groups_computed=0,
        n_texts=0,
        seconds_baseline=t_base,
        seconds_forward=0.0,
        seconds_eval=0.0,
        baseline_acc=base.acc,
        baseline_acc_norm=base.acc_norm,
        shards_computed=tally.shards,
        backend=workers.kind,
        workers=workers.n,
    )


__all__ = ["BankPlan", "SweepOutcome", "SweepSpec", "plan_bank", "run_sweep", "sweep_baseline"]
