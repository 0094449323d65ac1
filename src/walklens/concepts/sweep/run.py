"""Orchestration of a sweep: the baseline, the bank, then every scheme group not yet stored (seed 000, sec. 5.1).

Test 2 groups are bundled by (NORM, enc, seg, ex, sim, choice encodings) so one batched product scores every
(layer, word) of a bundle (:func:`~.batched.test2_bundle_batched`); a bundle's groups are committed in one
transaction, so a killed sweep resumes at the first unstored group and the final table is identical to an
uninterrupted run.  Test 1 schemes are one group each (:func:`~.batched.test1_predictions`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ...errors import InputError
from ..baseline import item_tokens
from ..data import FEWSHOT_SEED, HellaswagItem, fewshot_examples
from ..encode import arch_of
from ..grid import group_by_context
from ..runner import progress_bar, run_test
from ..schemes import WORD_AGG_SCHEMES, Scheme
from ..store import ResultStore, SweepStore
from .bank import NormedBank, VectorBank, build_bank, layer_keys
from .batched import EncLayout, test1_predictions, test2_bundle_batched
from .plan import ItemPlan, plan_item

if TYPE_CHECKING:
    from ...loading import LoadedModel


def _bundles(groups: Sequence[list[Scheme]], done: set[str]
             ) -> tuple[OrderedDict[str, list[list[list[Scheme]]]], dict[int, tuple[str, ...]]]:
    """The Test 2 groups not yet stored, bundled by (NORM, enc, seg, ex, sim, choice encodings) and the bundles
    ordered by NORM (``{norm: [bundle, ...]}``), with each group's choice parts (by ``id`` of the group)."""
    bundles: OrderedDict[tuple[object, ...], list[list[Scheme]]] = OrderedDict()
    outs_of: dict[tuple[tuple[str | None, str | None], ...], tuple[str, ...]] = {}  # every group of a grid: the same
    group_outs: dict[int, tuple[str, ...]] = {}
    for members in groups:
        s = members[0]
        if s.context_part() in done:
            continue
        raw = tuple((m.out_layer, m.out_word) for m in members)
        if raw not in outs_of:
            outs_of[raw] = tuple(m.out_part() for m in members)
        group_outs[id(members)] = outs = outs_of[raw]
        bundles.setdefault((str(s.norm), s.enc, str(s.seg), str(s.ex), s.sim, outs), []).append(members)
    by_norm: OrderedDict[str, list[list[list[Scheme]]]] = OrderedDict()
    for key, b in bundles.items():
        by_norm.setdefault(str(key[0]), []).append(b)
    return by_norm, group_outs


def evaluate_test2(store: SweepStore, run_id: int, bank: VectorBank, items: Sequence[ItemPlan],
                   schemes: Sequence[Scheme], layer_key: dict[str, str], progress: bool = True,
                   stop_after: int | None = None) -> int:
    """Evaluate and store every Test 2 context group not yet stored; returns the number computed.

    Bit-identical work is done once: encodings that cut every item identically share a bundle's predictions
    (within one NORM), as do bank layers with identical vectors.  ``stop_after`` stops after that many groups
    (the tests use it to simulate an interruption).
    """
    by_norm, group_outs = _bundles(list(group_by_context(schemes).values()), store.done(run_id))
    labels = np.array([it.label for it in items], np.uint8)
    todo = sum(len(b) for bl in by_norm.values() for b in bl)
    bar = progress_bar(total=todo, desc="Test 2 scheme groups", disable=not progress or not todo)
    computed = 0
    layouts: dict[str, EncLayout] = {}
    canon: dict[str, str] = {}  # encoding scheme -> the first one that cuts every item identically
    cache: dict[tuple[object, ...], np.ndarray] = {}
    alias = bank.layer_alias()
    try:
        for norm_s, bl in by_norm.items():
            nbank = NormedBank(bank, None if norm_s == "None" else norm_s)
            cache.clear()
            for b in bl:
                t0 = time.perf_counter()
                s0 = b[0][0]
                if s0.enc not in layouts:
                    layouts[s0.enc] = EncLayout.build(bank, items, s0.enc)
                    canon[s0.enc] = next((e for e in layouts if e != s0.enc and canon[e] == e
                                          and layouts[e].same_cut(layouts[s0.enc])), s0.enc)
                ckey = (canon[s0.enc], str(s0.seg), str(s0.ex), s0.sim, group_outs[id(b[0])],
                        tuple((g[0].layer, g[0].word) for g in b))
                preds = cache.get(ckey)
                if preds is None:
                    preds = cache[ckey] = test2_bundle_batched(bank, nbank, layouts[s0.enc], b, layer_key, alias=alias)
                dt = (time.perf_counter() - t0) / len(b)
                if stop_after is not None:
                    b = b[:max(0, stop_after - computed)]
                store.put_groups(run_id, [(m[0].context_part(), group_outs[id(m)], preds[g:g + 1])
                                          for g, m in enumerate(b)], ["acc"], labels, dt)
                computed += len(b)
                bar.update(len(b))
                if stop_after is not None and computed >= stop_after:
                    return computed
    finally:
        bar.close()
    return computed


def evaluate_test1(lm: LoadedModel, store: SweepStore, run_id: int, bank: VectorBank, items: Sequence[ItemPlan],
                   schemes: Sequence[Scheme], layer_key: dict[str, str], conts: Sequence[Sequence[Sequence[int]]],
                   baseline_preds: np.ndarray, progress: bool = True, stop_after: int | None = None) -> int:
    """Evaluate and store every Test 1 scheme not yet stored (one group each); returns how many were computed.
    ``enc=cross_encoding`` is the baseline itself: its predictions are the baseline's ``[2, items]``."""
    done = store.done(run_id)
    labels = np.array([it.label for it in items], np.uint8)
    todo = sorted((s for s in schemes if s.context_part() not in done), key=lambda s: str(s.norm))
    memo: dict[bytes, list[float]] = {}
    bar = progress_bar(total=len(todo), desc="Test 1 schemes", disable=not progress or not todo)
    computed = 0
    nbank: NormedBank | None = None
    try:
        for s in todo:
            t0 = time.perf_counter()
            if s.enc == "cross_encoding":
                preds = baseline_preds.reshape(2, 1, -1).astype(np.uint8)
            else:
                if nbank is None or nbank.norm != s.norm:
                    nbank = NormedBank(bank, s.norm)
                preds = test1_predictions(lm, bank, nbank, items, s, layer_key, conts, memo)
            store.put_group(run_id, s.context_part(), [""], ["acc", "acc_norm"], preds, labels,
                            time.perf_counter() - t0)
            computed += 1
            bar.update(1)
            if stop_after is not None and computed >= stop_after:
                break
    finally:
        bar.close()
    return computed


@dataclass
class SweepOutcome:
    """What one call of :func:`run_sweep` did."""

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


def run_sweep(lm: LoadedModel, items: Sequence[HellaswagItem], *, test: int, schemes: Sequence[Scheme],
              db: str | Path, shots: int = 0, pool: Sequence[HellaswagItem] | None = None, data: str = "",
              fewshot_seed: int | None = None, cache_dir: str | Path | None = None, progress: bool = True,
              stop_after: int | None = None, log: Callable[[str], None] = lambda m: None) -> SweepOutcome:
    """Sweep ``schemes`` (valid for ``test`` on this model) over ``items``, storing into ``db``.

    1. the baseline of the same items (the runner and the results store, same database: shared with single
       runs; normalised scores divide by it);
    2. every distinct segment text of every encoding scheme used, run once (:func:`~.bank.build_bank`);
    3. every scheme group not yet stored, evaluated and committed one by one (:func:`evaluate_test2`,
       :func:`evaluate_test1`).  Rerunning the same call after an interruption continues where it stopped.
    """
    seed = FEWSHOT_SEED if fewshot_seed is None else fewshot_seed
    if not items:
        raise InputError("no items to sweep")
    if not schemes:
        raise InputError("the grid has no valid scheme for this test and model")
    arch = arch_of(lm)
    pool = list(items) if pool is None else list(pool)
    t0 = time.perf_counter()
    with ResultStore(db) as rs:
        base = run_test(lm, items, test="baseline", shots=shots, pool=pool, data=data, store=rs,
                        fewshot_seed=seed, progress=progress, desc=f"{lm.name} baseline")
    t_base = time.perf_counter() - t0
    base_preds = np.array([[r.pred for r in base.results], [r.pred_norm for r in base.results]], np.uint8)
    data_key = data if seed == FEWSHOT_SEED else f"{data}#seed={seed}"
    with SweepStore(db) as store:
        rid = store.run_id(model=lm.name, data=data_key, split=items[0].split, shots=shots, test=test,
                           labels=[it.label for it in items], item_index=[it.index for it in items], arch=arch,
                           n_layers=lm.n_layers)
        store.set_baseline(rid, base.acc or 0.0, base.acc_norm or 0.0, base_preds)
        groups = group_by_context(schemes) if test == 2 else {s.context_part(): [s] for s in schemes}
        done = store.done(rid)
        before = sum(1 for g in groups.values() if g[0].context_part() in done)
        log(f"{len(schemes)} schemes in {len(groups)} groups; {before} groups already stored")
        outcome = SweepOutcome(run_id=rid, n_schemes=len(schemes), n_groups=len(groups), groups_stored_before=before,
                               groups_computed=0, n_texts=0, seconds_baseline=t_base, seconds_forward=0.0,
                               seconds_eval=0.0, baseline_acc=base.acc, baseline_acc_norm=base.acc_norm)
        if before == len(groups):
            return outcome
        composed = [s for s in schemes if s.enc != "cross_encoding"]
        encs = list(dict.fromkeys(s.enc for s in composed))
        exs = [fewshot_examples(pool, shots, it.index, seed=seed, query_split=it.split) if shots else []
               for it in items]
        plans = [plan_item(lm, it, ex, encs) for it, ex in zip(items, exs)]
        layer_vals = {s.layer for s in composed}
        word_vals = {s.word for s in composed}
        if test == 2:
            layer_vals |= {s.out_layer_eff for s in schemes}
            word_vals |= {s.out_word_eff for s in schemes}
        lkey = layer_keys(lm, layer_vals)
        bank_layers = sorted(set(lkey.values()), key=lambda k: -1 if k == "E" else int(k))
        words = [w for w in WORD_AGG_SCHEMES if w in word_vals]
        texts = [t for p in plans for t in p.texts()] if encs else []
        t1 = time.perf_counter()
        bank = build_bank(lm, texts, bank_layers, words, cache_dir=cache_dir, progress=progress)
        outcome.n_texts = len(bank.index)
        t2 = time.perf_counter()
        outcome.seconds_forward = t2 - t1
        if test == 2:
            outcome.groups_computed = evaluate_test2(store, rid, bank, plans, schemes, lkey, progress, stop_after)
        else:
            conts = [item_tokens(lm, it, ex)[1] for it, ex in zip(items, exs)]
            outcome.groups_computed = evaluate_test1(lm, store, rid, bank, plans, schemes, lkey, conts, base_preds,
                                                     progress, stop_after)
        outcome.seconds_eval = time.perf_counter() - t2
        return outcome
