"""Orchestration of a sweep: the baseline, the bank, then every scheme group not yet stored (seed 000, sec. 5.1).

Everything that computes is a shard fixed before any runs (:mod:`.shards`, :func:`~.bank.forward_shard`) and
run by the workers of a backend (:mod:`walklens.backends`: this process, or Ray actors holding the model
once each).  This driver plans the shards, skips those whose results are stored and stores results as they
come back:

* baseline: chunks of :data:`~..runner.CHUNK` consecutive items, stored per item in the results tables
  (shared with ``walklens hellaswag baseline``);
* bank: batches of texts of equal token length, kept per text in the cache folder (``cache_dir``);
* Test 2: one shard per bundle (groups sharing NORM, enc, seg, ex, sim and the choice encodings, over every
  group of the grid, stored or not, so a bundle's matrix shapes never depend on what was stored) and item range
  (one range of all items where the bank fits the workers' ``context_bytes``, else ranges whose bank rows fit,
  whole :data:`~.shards.TEST2_CHUNK`-item chunks each, each range's rows its shards' context); the shards of one
  range, NORM and encoding run together, :data:`~.shards.TEST2_BATCH` at most (a batch: they read, normalise
  and compose the rows once, each giving the bits it gives alone); a range's picks are kept in ``sweep_shards``
  and the bundle's groups committed in one transaction when its last range is in (with one range: as soon as
  its batch is back, so a killed sweep loses at most the batches in flight);
* Test 1: schemes in blocks of one bank layer and word aggregation (concept sequences can be identical only
  within one), each cut into item ranges of ``test1_shard_items``; a range's picks are kept in the store's
  ``sweep_shards`` table and the block's groups committed, dropping them, when its last range is in.

A payload depends only on the grid, the items and the stored whole bundles and blocks, so the stored picks are
the same bits whatever the backend and the number of workers, and a killed sweep (driver or worker) resumes
without computing a stored shard again and ends with the table an uninterrupted run gives.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from ...backends import Backend, LocalWorkers, Workers
from ...errors import InputError
from ...hellaswag.baseline import accuracy, item_tokens
from ...hellaswag.data import FEWSHOT_SEED, HellaswagItem, fewshot_examples
from ...hellaswag.encode import arch_of
from ..grid import group_by_context
from ..runner import CHUNK, RunSummary, progress_bar, run_key
from ...concepts.schemes import WORD_AGG_SCHEMES, Scheme
from ...hellaswag.store import ResultStore, SweepRun, SweepStore
from .bank import VectorBank, build_bank, layer_keys
from .batched import EncLayout
from .plan import ItemPlan, plan_item
from .shards import (TEST2_BATCH, Test1Shard, Test2Ctx, Test2Shard, baseline_shard, item_ranges, test1_shard,
                     test2_batch)

if TYPE_CHECKING:
    from ...loading import LoadedModel

#: ``on_shard(kind, n)``: called after the n-th shard of a kind (baseline, forward, test2, test1) is stored.
OnShard = Callable[[str, int], None]
#: Items per Test 1 shard (fixed: it decides which concept sequences share a packed forward pass).
TEST1_SHARD_ITEMS = 64
#: Test 2 bundles per wave where the items are cut into ranges: each wave puts every range's bank rows in the
#: workers' reach once (the whole bank once per wave), and keeps at most this many bundles' picks in
#: ``sweep_shards`` until their last range is in.
TEST2_WAVE = 32


def _bundles(groups: Sequence[list[Scheme]]
             ) -> tuple[OrderedDict[str, list[list[list[Scheme]]]], dict[int, tuple[str, ...]]]:
    """Test 2 groups bundled by (NORM, enc, seg, ex, sim, choice encodings) and the bundles ordered by NORM
    (``{norm: [bundle, ...]}``), with each group's choice parts (by ``id`` of the group)."""
    bundles: OrderedDict[tuple[object, ...], list[list[Scheme]]] = OrderedDict()
    outs_of: dict[tuple[tuple[str | None, str | None], ...], tuple[str, ...]] = {}  # every group of a grid: the same
    group_outs: dict[int, tuple[str, ...]] = {}
    for members in groups:
        s = members[0]
        raw = tuple((m.out_layer, m.out_word) for m in members)
        if raw not in outs_of:
            outs_of[raw] = tuple(m.out_part() for m in members)
        group_outs[id(members)] = outs = outs_of[raw]
        bundles.setdefault((str(s.norm), s.enc, str(s.seg), str(s.ex), s.sim, outs), []).append(members)
    by_norm: OrderedDict[str, list[list[list[Scheme]]]] = OrderedDict()
    for key, b in bundles.items():
        by_norm.setdefault(str(key[0]), []).append(b)
    return by_norm, group_outs


def _count(on_shard: OnShard | None, counts: dict[str, int] | None, kind: str) -> None:
    if counts is not None:
        counts[kind] = counts.get(kind, 0) + 1
    if on_shard is not None:
        on_shard(kind, counts[kind] if counts is not None else 0)


def evaluate_test2(store: SweepStore, run_id: int, bank: VectorBank, items: Sequence[ItemPlan],
                   schemes: Sequence[Scheme], layer_key: dict[str, str], workers: Workers, *, progress: bool = True,
                   stop_after: int | None = None, on_shard: OnShard | None = None,
                   counts: dict[str, int] | None = None, context_mb: float | None = None) -> int:
    """Evaluate and store every Test 2 context group not yet stored; returns the number of groups stored.

    Bit-identical work is done once: encodings that cut every item identically share a bundle's predictions
    (within one NORM), as do bank layers with identical vectors.  A shard is a bundle over an item range whose
    bank rows fit in ``context_mb`` MB (default: ``workers.context_bytes``; no bound: one range of all items);
    with several ranges, a range's picks are kept in ``sweep_shards`` until the bundle's last range is in, and
    the bundles go in waves of :data:`TEST2_WAVE` (each wave's ranges one after the other).  Within a wave, the
    shards of one range, NORM and encoding go to a worker in batches (:func:`~.shards.test2_batch`) of
    :data:`~.shards.TEST2_BATCH` bundles, fewer where there are more workers than such batches.  ``stop_after`` stops after that many groups (the tests use it to simulate
    an interruption); ``counts["test2"]`` counts the shards computed.
    """
    done = store.done(run_id)
    by_norm, group_outs = _bundles(list(group_by_context(schemes).values()))
    labels = np.array([it.label for it in items], np.uint8)
    layouts: dict[str, EncLayout] = {}
    canon: dict[str, str] = {}  # encoding scheme -> the first one that cuts every item identically
    shards: OrderedDict[tuple[object, ...], Test2Shard] = OrderedDict()
    targets: dict[tuple[object, ...], list[list[list[Scheme]]]] = {}
    todo = 0
    for norm_s, bl in by_norm.items():
        for b in bl:
            s0 = b[0][0]
            if s0.enc not in layouts:
                layouts[s0.enc] = EncLayout.build(bank, items, s0.enc)
                canon[s0.enc] = next((e for e in layouts if e != s0.enc and canon[e] == e
                                      and layouts[e].same_cut(layouts[s0.enc])), s0.enc)
            left = sum(1 for m in b if m[0].context_part() not in done)
            if not left:
                continue
            ckey = (norm_s, canon[s0.enc], str(s0.seg), str(s0.ex), s0.sim, group_outs[id(b[0])],
                    tuple((g[0].layer, g[0].word) for g in b))
            if ckey not in shards:
                shards[ckey] = Test2Shard(norm=None if norm_s == "None" else norm_s, enc=canon[s0.enc], groups=b)
                targets[ckey] = []
            targets[ckey].append(b)
            todo += left
    if not shards:
        return 0
    norm_rank = {n: i for i, n in enumerate(by_norm)}
    enc_rank = {e: i for i, e in enumerate(dict.fromkeys(sh.enc for sh in shards.values()))}
    keys = sorted(shards, key=lambda k: (norm_rank[str(k[0])], enc_rank[shards[k].enc]))  # batches: one NORM, enc
    limit = workers.context_bytes if context_mb is None else int(context_mb * 2**20)
    ranges = item_ranges([layouts[sh.enc] for sh in shards.values()], len(items),
                         bank.vectors[:1].numel() * bank.vectors.element_size(), limit)
    alias = bank.layer_alias()
    kept = store.shards(run_id)
    digest = {k: hashlib.sha256(repr(k).encode()).hexdigest()[:16] for k in keys}
    got: dict[tuple[object, ...], dict[int, tuple[np.ndarray, float]]] = {k: {} for k in keys}
    names: dict[tuple[object, ...], list[str]] = {}  # every kept shard of a bundle (any cut): dropped when stored
    for k in keys:
        names[k] = [n for n in kept if n.startswith(f"test2|{digest[k]}|")]
        for r, (a, b) in enumerate(ranges):
            if f"test2|{digest[k]}|{a}:{b}" in kept:
                got[k][r] = kept[f"test2|{digest[k]}|{a}:{b}"]
    wave = len(keys) if len(ranges) == 1 else TEST2_WAVE
    wave_of = {k: i // wave for i, k in enumerate(keys)}
    # batches: consecutive bundles of one wave, NORM and enc, TEST2_BATCH at most, fewer where that keeps every
    # worker busy (a bundle's bits do not depend on its batch)
    cap = min(TEST2_BATCH, max(1, -(-len(keys) // max(1, workers.n))))
    batch_of: dict[tuple[object, ...], int] = {}
    size, tag = 0, None
    for k in keys:
        if (wave_of[k], k[0], shards[k].enc) != tag or size == cap:
            size, tag = 0, (wave_of[k], k[0], shards[k].enc)
        batch_of[k] = len(batch_of) if size == 0 else batch_of[keys[len(batch_of) - 1]]
        size += 1
    specs: list[tuple[list[tuple[object, ...]], int]] = []  # (bundles, range) still to compute, wave by wave
    for w in range(0, len(keys), wave):
        for r in range(len(ranges)):
            for _, bk in groupby(keys[w:w + wave], key=batch_of.__getitem__):
                if todo_k := [k for k in bk if r not in got[k]]:
                    specs.append((todo_k, r))

    def parts() -> Iterator[tuple[Test2Ctx, list[list[Test2Shard]]]]:
        """One part per (wave, range): the range's context and the wave's batches still to compute there."""
        for (_, r), part in groupby(specs, key=lambda kr: (wave_of[kr[0][0]], kr[1])):
            bs = [[shards[k] for k in ks] for ks, _ in part]
            yield Test2Ctx.of_range(bank, {x.enc: layouts[x.enc] for b in bs for x in b}, layer_key, alias,
                                    *ranges[r]), bs

    bar = progress_bar(total=todo, desc="Test 2 scheme groups", disable=not progress)
    computed = 0

    def finish(k: tuple[object, ...]) -> bool:
        """Store bundle ``k``'s groups if all its ranges are in; True when ``stop_after`` is reached."""
        nonlocal computed
        if len(got[k]) < len(ranges):
            return False
        preds = np.concatenate([got[k][r][0] for r in range(len(ranges))], axis=2)  # [groups, outs, items]
        seconds = sum(sec for _, sec in got[k].values())
        got[k] = {}
        for j, b in enumerate(targets[k]):
            rows = [(m[0].context_part(), group_outs[id(m)], preds[g:g + 1]) for g, m in enumerate(b)
                    if m[0].context_part() not in done]
            if stop_after is not None:
                rows = rows[:max(0, stop_after - computed)]
            store.put_groups(run_id, rows, ["acc"], labels, seconds / len(b),
                             drop_shards=names[k] if j == len(targets[k]) - 1 else ())
            computed += len(rows)
            bar.update(len(rows))
            if stop_after is not None and computed >= stop_after:
                return True
        return False

    try:
        for k in keys:  # bundles whose every range was kept by an interrupted run
            if finish(k):
                return computed
        for i, (batch, seconds) in workers.map_parts(test2_batch, parts()):
            ks, r = specs[i]
            for k, preds in zip(ks, batch):  # each bundle of the batch: kept, or its groups stored
                got[k][r] = (preds, seconds / len(ks))
                if len(got[k]) < len(ranges):
                    a, b = ranges[r]
                    names[k].append(f"test2|{digest[k]}|{a}:{b}")
                    store.put_shard(run_id, names[k][-1], preds, seconds / len(ks))
                elif finish(k):
                    return computed
                _count(on_shard, counts, "test2")
    finally:
        bar.close()
    return computed


def _block_key(s: Scheme, bank: VectorBank, layer_key: dict[str, str], alias: list[int]) -> tuple[str, str]:
    """A Test 1 scheme's block: its bank layer (bit-identical layers as one) and word aggregation."""
    return bank.layers[alias[bank.layer_pos(layer_key[s.layer])]], s.word


def _test1_payload(bank: VectorBank, items: Sequence[ItemPlan], conts: Sequence[Sequence[Sequence[int]]],
                   block: Sequence[Scheme], key: tuple[str, str], a: int, b: int) -> Test1Shard:
    """One Test 1 shard: the block over items ``[a, b)``, with a bank of just the rows and vectors it reads."""
    encs = {s.enc for s in block}
    texts = list(OrderedDict.fromkeys(t for it in items[a:b] for e in sorted(encs) for ex in it.contexts[e]
                                      for t in ex))
    li, wi = bank.layer_pos(key[0]), bank.word_pos(key[1])
    sub = bank.vectors[bank.rows(texts), li:li + 1, wi:wi + 1]  # [texts, 1, 1, D], a copy of just these
    mini = VectorBank(layers=(key[0],), words=(key[1],), index={t: j for j, t in enumerate(texts)}, vectors=sub)
    return Test1Shard(schemes=list(block), bank=mini, items=list(items[a:b]),
                      conts=[[list(map(int, c)) for c in cs] for cs in conts[a:b]],
                      layer_key={s.layer: key[0] for s in block})


def evaluate_test1(store: SweepStore, run_id: int, bank: VectorBank, items: Sequence[ItemPlan],
                   schemes: Sequence[Scheme], layer_key: dict[str, str], conts: Sequence[Sequence[Sequence[int]]],
                   baseline_preds: np.ndarray, workers: Workers, *, progress: bool = True,
                   stop_after: int | None = None, on_shard: OnShard | None = None,
                   counts: dict[str, int] | None = None, shard_items: int = TEST1_SHARD_ITEMS) -> int:
    """Evaluate and store every Test 1 scheme not yet stored (one group each); returns how many were stored.
    ``enc=cross_encoding`` is the baseline itself: its predictions are the baseline's ``[2, items]``.  The
    others run in (block, item range) shards (module docstring); ``counts["test1"]`` counts those computed."""
    done = store.done(run_id)
    labels = np.array([it.label for it in items], np.uint8)
    todo = [s for s in schemes if s.context_part() not in done]
    computed = 0
    for s in (s for s in todo if s.enc == "cross_encoding"):
        store.put_group(run_id, s.context_part(), [""], ["acc", "acc_norm"],
                        baseline_preds.reshape(2, 1, -1).astype(np.uint8), labels, 0.0)
        computed += 1
        if stop_after is not None and computed >= stop_after:
            return computed
    alias = bank.layer_alias()
    blocks: dict[tuple[str, str], list[Scheme]] = {}
    for s in (s for s in todo if s.enc != "cross_encoding"):
        blocks.setdefault(_block_key(s, bank, layer_key, alias), []).append(s)
    order = sorted(blocks, key=lambda k: (bank.layers.index(k[0]), bank.words.index(k[1])))
    kept = store.shards(run_id)
    N = len(items)
    specs: list[tuple[tuple[str, str], int, int, str]] = []  # (block, a, b, shard key) still to compute
    parts: dict[tuple[str, str], dict[str, tuple[int, np.ndarray, float]]] = {}
    for k in order:
        block = blocks[k] = sorted(blocks[k], key=lambda s: (str(s.norm), str(s)))
        digest = hashlib.sha256("\n".join(map(str, block)).encode()).hexdigest()[:16]
        parts[k] = {}
        for a in range(0, N, shard_items):
            name = f"test1|{k[0]}|{k[1]}|{a}:{min(N, a + shard_items)}|{digest}"
            if name in kept:
                parts[k][name] = (a, *kept[name])
            else:
                specs.append((k, a, min(N, a + shard_items), name))
    n_ranges = len(range(0, N, shard_items))
    bar = progress_bar(total=sum(map(len, blocks.values())), desc="Test 1 schemes", disable=not progress or not blocks)

    def finish(k: tuple[str, str]) -> bool:
        """Store block ``k`` if all its ranges are in; True when ``stop_after`` is reached."""
        nonlocal computed
        if len(parts[k]) < n_ranges:
            return False
        preds = np.concatenate([p for _, p, _ in sorted(parts[k].values(), key=lambda x: x[0])], axis=2)
        seconds = sum(sec for _, _, sec in parts[k].values()) / len(blocks[k])
        rows = [(s.context_part(), [""], preds[:, j:j + 1]) for j, s in enumerate(blocks[k])]
        if stop_after is not None:
            rows = rows[:max(0, stop_after - computed)]
        store.put_groups(run_id, rows, ["acc", "acc_norm"], labels, seconds, drop_shards=list(parts[k]))
        computed += len(rows)
        bar.update(len(rows))
        return stop_after is not None and computed >= stop_after

    try:
        for k in order:  # blocks whose every range was kept by an interrupted run
            if finish(k):
                return computed
        payloads: Iterator[Test1Shard] = (_test1_payload(bank, items, conts, blocks[k], k, a, b)
                                          for k, a, b, _ in specs)
        for i, (preds, seconds) in workers.map(test1_shard, None, payloads):
            k, a, _, name = specs[i]
            store.put_shard(run_id, name, preds, seconds)
            parts[k][name] = (a, preds, seconds)
            _count(on_shard, counts, "test1")
            if finish(k):
                return computed
    finally:
        bar.close()
    return computed


def sweep_baseline(workers: Workers, model: str, items: Sequence[HellaswagItem], *, shots: int,
                   pool: Sequence[HellaswagItem], data: str, fewshot_seed: int, store: ResultStore,
                   progress: bool = True, on_shard: OnShard | None = None,
                   counts: dict[str, int] | None = None) -> RunSummary:
    """The baseline of ``items`` as the runner stores it (the same key: shared with ``walklens hellaswag
    baseline``), computed in chunks of :data:`~..runner.CHUNK` consecutive items; a chunk with an item not stored
    runs whole (so its packing never depends on what was stored) and stored items are kept."""
    key = run_key(model, items, test="baseline", shots=shots, data=data, fewshot_seed=fewshot_seed)
    stored = store.results(key, [it.index for it in items])
    chunks = [list(items[a:a + CHUNK]) for a in range(0, len(items), CHUNK)]
    todo = [c for c in chunks if any(it.index not in stored for it in c)]

    def payload(c: list[HellaswagItem]) -> tuple[list[HellaswagItem], list[list[HellaswagItem]]]:
        return c, [fewshot_examples(pool, shots, it.index, seed=fewshot_seed, query_split=it.split) if shots else []
                   for it in c]

    bar = progress_bar(total=sum(map(len, todo)), desc=f"{model} baseline", unit="item", disable=not progress or not todo)
    computed = 0
    try:
        for _, rs in workers.map(baseline_shard, None, (payload(c) for c in todo)):
            store.add_results(key, rs)
            for r in rs:
                computed += r.item not in stored
                stored.setdefault(r.item, r)
            bar.update(len(rs))
            _count(on_shard, counts, "baseline")
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


def plan_bank(lm: LoadedModel, items: Sequence[HellaswagItem], *, test: int, schemes: Sequence[Scheme], shots: int,
              pool: Sequence[HellaswagItem], fewshot_seed: int) -> BankPlan:
    """The :class:`BankPlan` of a sweep of ``schemes`` over ``items`` (what :func:`run_sweep` builds its bank
    from; e.g. to fill a concept cache ahead of it)."""
    composed = [s for s in schemes if s.enc != "cross_encoding"]
    encs = list(dict.fromkeys(s.enc for s in composed))
    exs = [fewshot_examples(pool, shots, it.index, seed=fewshot_seed, query_split=it.split) if shots else []
           for it in items]
    plans = [plan_item(lm, it, ex, encs) for it, ex in zip(items, exs)]
    layer_vals = {s.layer for s in composed}
    word_vals = {s.word for s in composed}
    if test == 2:
        layer_vals |= {s.out_layer_eff for s in schemes}
        word_vals |= {s.out_word_eff for s in schemes}
    lkey = layer_keys(lm, layer_vals)
    return BankPlan(examples=exs, plans=plans, texts=[t for p in plans for t in p.texts()] if encs else [],
                    layers=sorted(set(lkey.values()), key=lambda k: -1 if k == "E" else int(k)),
                    words=[w for w in WORD_AGG_SCHEMES if w in word_vals], layer_key=lkey)


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


def run_sweep(lm: LoadedModel, items: Sequence[HellaswagItem], *, test: int, schemes: Sequence[Scheme],
              db: str | Path, shots: int = 0, pool: Sequence[HellaswagItem] | None = None, data: str = "",
              fewshot_seed: int | None = None, cache_dir: str | Path | None = None, progress: bool = True,
              stop_after: int | None = None, log: Callable[[str], None] = lambda m: None,
              backend: Backend | None = None, workers: Workers | None = None, on_shard: OnShard | None = None,
              test1_shard_items: int = TEST1_SHARD_ITEMS, test2_context_mb: float | None = None) -> SweepOutcome:
    """Sweep ``schemes`` (valid for ``test`` on this model) over ``items``, storing into ``db``.

    1. the baseline of the same items (the runner's store and key, same database: shared with single runs;
       normalised scores divide by it);
    2. every distinct segment text of every encoding scheme used, run once (:func:`~.bank.build_bank`);
    3. every scheme group not yet stored, evaluated and committed (:func:`evaluate_test2`,
       :func:`evaluate_test1`).  Rerunning the same call after an interruption continues where it stopped.

    ``lm`` plans (tokenises, cuts items); the shards run on ``workers`` if given, else on workers opened from
    ``backend`` for this call, else in this process on ``lm``.  The stored results do not depend on which, nor on
    ``test2_context_mb`` (Test 2's bound on an item range's bank rows; default: the workers', see
    :func:`evaluate_test2`).
    """
    seed = FEWSHOT_SEED if fewshot_seed is None else fewshot_seed
    if not items:
        raise InputError("no items to sweep")
    if not schemes:
        raise InputError("the grid has no valid scheme for this test and model")
    if test1_shard_items < 1:
        raise InputError(f"test1_shard_items must be >= 1, got {test1_shard_items}")
    if test2_context_mb is not None and not test2_context_mb > 0:
        raise InputError(f"test2_context_mb must be > 0, got {test2_context_mb}")
    if workers is None:
        with backend.workers(lm) if backend is not None else LocalWorkers(lm) as w:
            return run_sweep(lm, items, test=test, schemes=schemes, db=db, shots=shots, pool=pool, data=data,
                             fewshot_seed=seed, cache_dir=cache_dir, progress=progress, stop_after=stop_after,
                             log=log, workers=w, on_shard=on_shard, test1_shard_items=test1_shard_items,
                             test2_context_mb=test2_context_mb)
    arch = arch_of(lm)
    pool = list(items) if pool is None else list(pool)
    counts: dict[str, int] = {}
    t0 = time.perf_counter()
    with ResultStore(db) as rs:
        base = sweep_baseline(workers, lm.name, items, shots=shots, pool=pool, data=data, fewshot_seed=seed,
                              store=rs, progress=progress, on_shard=on_shard, counts=counts)
    t_base = time.perf_counter() - t0
    base_preds = np.array([[r.pred for r in base.results], [r.pred_norm for r in base.results]], np.uint8)
    data_key = base.key.data
    with SweepStore(db) as store:
        rid = store.run_id(SweepRun(model=lm.name, data=data_key, split=items[0].split, shots=shots, test=test,
                                    labels=[it.label for it in items], item_index=[it.index for it in items],
                                    arch=arch, n_layers=lm.n_layers))
        store.set_baseline(rid, base.acc or 0.0, base.acc_norm or 0.0, base_preds)
        groups = group_by_context(schemes) if test == 2 else {s.context_part(): [s] for s in schemes}
        done = store.done(rid)
        before = sum(1 for g in groups.values() if g[0].context_part() in done)
        log(f"{len(schemes)} schemes in {len(groups)} groups; {before} groups already stored")
        outcome = SweepOutcome(run_id=rid, n_schemes=len(schemes), n_groups=len(groups), groups_stored_before=before,
                               groups_computed=0, n_texts=0, seconds_baseline=t_base, seconds_forward=0.0,
                               seconds_eval=0.0, baseline_acc=base.acc, baseline_acc_norm=base.acc_norm,
                               shards_computed=counts, backend=workers.kind, workers=workers.n)
        if before == len(groups):
            return outcome
        bp = plan_bank(lm, items, test=test, schemes=schemes, shots=shots, pool=pool, fewshot_seed=seed)
        exs, plans, lkey = bp.examples, bp.plans, bp.layer_key
        t1 = time.perf_counter()

        def forward(kind: str, n: int) -> None:
            counts["forward"] = n
            if on_shard is not None:
                on_shard(kind, n)

        bank = build_bank(lm, bp.texts, bp.layers, bp.words, cache_dir=cache_dir, progress=progress, workers=workers,
                          on_shard=forward)
        outcome.n_texts = len(bank.index)
        t2 = time.perf_counter()
        outcome.seconds_forward = t2 - t1
        if test == 2:
            outcome.groups_computed = evaluate_test2(store, rid, bank, plans, schemes, lkey, workers,
                                                     progress=progress, stop_after=stop_after, on_shard=on_shard,
                                                     counts=counts, context_mb=test2_context_mb)
        else:
            conts = [item_tokens(lm, it, ex)[1] for it, ex in zip(items, exs)]
            outcome.groups_computed = evaluate_test1(store, rid, bank, plans, schemes, lkey, conts, base_preds,
                                                     workers, progress=progress, stop_after=stop_after,
                                                     on_shard=on_shard, counts=counts, shard_items=test1_shard_items)
        outcome.seconds_eval = time.perf_counter() - t2
        return outcome
