"""Test 2 of a sweep (seed 000, sec. 5.1.2, A.6): a planner that fixes every shard still to run, and an executor
that runs them on the workers and stores what comes back.

:func:`plan_test2` bundles the context groups (one NORM, encoding, SEGMENT_AGG, EXAMPLE_AGG, SIMILARITY_FUNC and
choice parts: :class:`~.keys.BundleKey`), lets encodings that cut every item identically share one bundle's
predictions, cuts the items into ranges whose bank rows fit the workers (:func:`~.shards.item_ranges`), orders the
bundles into waves and batches, and skips what is stored: bundles whose groups are all stored, and (bundle, range)
shards kept by an interrupted call (:class:`~.keys.Test2ShardKey`).  :func:`run_test2` runs the planned shards and
stores a bundle's groups once all its ranges are in; until then a range's picks are kept under its shard name.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import groupby

import numpy as np

from ....analyses.concepts.schemes import Scheme
from ....analyses.concepts.vectors import VectorBank
from ....core.backends import Workers
from ..grid import group_by_context
from .batched import EncLayout
from .keys import BundleKey, Test2ShardKey
from .plan import ItemPlan
from .shards import TEST2_BATCH, Test2Ctx, Test2Shard, item_ranges, test2_batch
from .sink import GroupRow, GroupRun, Sink, Tally

#: Test 2 bundles per wave where the items are cut into ranges: each wave puts every range's bank rows in the
#: workers' reach once (the whole bank once per wave), and keeps at most this many bundles' picks in
#: ``sweep_shards`` until their last range is in.
TEST2_WAVE = 32

#: A bundle as grouped: its NORM (``str``), its choice parts and its context groups.
_Grouped = tuple[str, tuple[str, ...], list[list[Scheme]]]


def _bundles(groups: Sequence[list[Scheme]]) -> list[_Grouped]:
    """Test 2 groups bundled by (NORM, enc, seg, ex, sim, choice encodings), the bundles ordered by NORM."""
    bundles: OrderedDict[tuple[object, ...], _Grouped] = OrderedDict()
    outs_of: dict[tuple[tuple[str | None, str | None], ...], tuple[str, ...]] = {}  # every group of a grid: the same
    for members in groups:
        s = members[0]
        raw = tuple((m.out_layer, m.out_word) for m in members)
        if raw not in outs_of:
            outs_of[raw] = tuple(m.out_part() for m in members)
        outs = outs_of[raw]
        bundles.setdefault((str(s.norm), s.enc, str(s.seg), str(s.ex), s.sim, outs), (str(s.norm), outs, []))[2].append(
            members
        )
    by_norm: OrderedDict[str, list[_Grouped]] = OrderedDict()
    for g in bundles.values():
        by_norm.setdefault(g[0], []).append(g)
    return [g for bl in by_norm.values() for g in bl]


class _Encodings:
    """Each encoding's layout over the items, and its canonical encoding: the first one met that cuts every item
    identically (their predictions are shared)."""

    def __init__(self, bank: VectorBank, items: Sequence[ItemPlan]) -> None:
        self.bank, self.items = bank, items
        self.layouts: dict[str, EncLayout] = {}
        self.canon: dict[str, str] = {}

    def canonical(self, enc: str) -> str:
        if enc not in self.layouts:
            self.layouts[enc] = EncLayout.build(self.bank, self.items, enc)
            self.canon[enc] = next(
                (
                    e
                    for e in self.layouts
                    if e != enc and self.canon[e] == e and self.layouts[e].same_cut(self.layouts[enc])
                ),
                enc,
            )
        return self.canon[enc]


@dataclass
class Bundle:
    """One bundle's work: its key, the shard payload, the bundles (one per encoding sharing its cut) its
    predictions are stored for, the picks of its ranges in so far (by range) and the names of its kept shards
    (any cut), dropped when its groups are stored."""

    key: BundleKey
    shard: Test2Shard
    targets: list[list[list[Scheme]]]
    got: dict[int, tuple[np.ndarray, float]] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Test2Work:
    """One Test 2 shard to run: bundles (positions in :attr:`Test2Plan.bundles`: consecutive, of one wave, NORM
    and encoding) over the item range ``r`` (a position in :attr:`Test2Plan.ranges`)."""

    bundles: tuple[int, ...]
    r: int


@dataclass
class Test2Plan:
    """Every Test 2 shard still to run (``work``, wave by wave, range by range, batch by batch), with the bundles
    in batch order, the item ranges, the encodings' layouts, the groups already stored and the groups to store."""

    bundles: list[Bundle]
    ranges: list[tuple[int, int]]
    layouts: dict[str, EncLayout]
    done: set[str]
    wave: int
    work: list[Test2Work]
    todo: int

    def shard_key(self, i: int, r: int) -> Test2ShardKey:
        """The key of bundle ``i`` over range ``r``."""
        return Test2ShardKey(self.bundles[i].key.digest, *self.ranges[r])


def _planned_bundles(grouped: Sequence[_Grouped], encs: _Encodings, done: set[str]) -> tuple[list[Bundle], int]:
    """The bundles with a group not stored, one per key (encodings sharing a cut share one), in the order met, and
    how many groups are not stored."""
    bundles: OrderedDict[BundleKey, Bundle] = OrderedDict()
    todo = 0
    for norm_s, outs, b in grouped:
        enc = encs.canonical(b[0][0].enc)
        left = sum(1 for m in b if m[0].context_part() not in done)
        if not left:
            continue
        key = BundleKey.of(norm_s, enc, b, outs)
        if key not in bundles:
            bundles[key] = Bundle(key, Test2Shard(norm=None if norm_s == "None" else norm_s, enc=enc, groups=b), [])
        bundles[key].targets.append(b)
        todo += left
    return list(bundles.values()), todo


def _batches(bundles: Sequence[Bundle], wave: int, n_workers: int) -> list[int]:
    """Each bundle's batch (the position of its first bundle): consecutive bundles of one wave, NORM and encoding,
    :data:`~.shards.TEST2_BATCH` at most, fewer where that keeps every worker busy (a bundle's bits do not depend
    on its batch)."""
    cap = min(TEST2_BATCH, max(1, -(-len(bundles) // max(1, n_workers))))
    batch_of: list[int] = []
    size, tag = 0, None
    for i, b in enumerate(bundles):
        if (i // wave, b.key.norm, b.shard.enc) != tag or size == cap:
            size, tag = 0, (i // wave, b.key.norm, b.shard.enc)
        batch_of.append(i if size == 0 else batch_of[i - 1])
        size += 1
    return batch_of


def _work(bundles: Sequence[Bundle], n_ranges: int, wave: int, batch_of: Sequence[int]) -> list[Test2Work]:
    """The shards still to run, wave by wave, range by range, batch by batch: a batch's bundles whose range is
    not in yet."""
    work = []
    for w in range(0, len(bundles), wave):
        for r in range(n_ranges):
            for _, bi in groupby(range(w, min(w + wave, len(bundles))), key=batch_of.__getitem__):
                if todo := tuple(i for i in bi if r not in bundles[i].got):
                    work.append(Test2Work(todo, r))
    return work


def plan_test2(
    sink: Sink,
    bank: VectorBank,
    items: Sequence[ItemPlan],
    schemes: Sequence[Scheme],
    workers: Workers,
    context_mb: float | None = None,
) -> Test2Plan | None:
    """The :class:`Test2Plan` of every Test 2 group of ``schemes`` not stored in ``sink`` (None: all stored).

    A shard is a bundle over an item range whose bank rows fit in ``context_mb`` MB (default:
    ``workers.context_bytes``; no bound: one range of all items); with several ranges the bundles go in waves of
    :data:`TEST2_WAVE`.  A (bundle, range) kept by an interrupted call is not planned again: its picks are read
    back (:class:`~.keys.Test2ShardKey`)."""
    done = sink.done()
    encs = _Encodings(bank, items)
    grouped = _bundles(list(group_by_context(schemes).values()))
    bundles, todo = _planned_bundles(grouped, encs, done)
    if not bundles:
        return None
    limit = workers.context_bytes if context_mb is None else int(context_mb * 2**20)
    ranges = item_ranges(
        [encs.layouts[b.shard.enc] for b in bundles],
        len(items),
        bank.vectors[:1].numel() * bank.vectors.element_size(),
        limit,
    )
    norm_rank = {n: i for i, n in enumerate(dict.fromkeys(g[0] for g in grouped))}
    enc_rank = {e: i for i, e in enumerate(dict.fromkeys(b.shard.enc for b in bundles))}
    bundles.sort(key=lambda b: (norm_rank[b.key.norm], enc_rank[b.shard.enc]))  # batches: one NORM, encoding
    kept = [(name, key, v) for name, v in sink.kept().items() if (key := Test2ShardKey.parse(name)) is not None]
    for b in bundles:
        mine = [(name, key, v) for name, key, v in kept if key.bundle == b.key.digest]
        b.names = [name for name, _, _ in mine]  # every kept range of the bundle, in any cut: dropped when stored
        b.got = {r: v for r, ab in enumerate(ranges) for _, key, v in mine if (key.a, key.b) == ab}
    wave = len(bundles) if len(ranges) == 1 else TEST2_WAVE
    work = _work(bundles, len(ranges), wave, _batches(bundles, wave, workers.n))
    return Test2Plan(bundles=bundles, ranges=ranges, layouts=encs.layouts, done=done, wave=wave, work=work, todo=todo)


class _Test2Run(GroupRun):
    """The executor's state: stores a bundle's groups once all its ranges are in, keeps a range's picks until
    then, and counts the groups stored."""

    def __init__(self, plan: Test2Plan, sink: Sink, tally: Tally) -> None:
        super().__init__(sink, tally, 0, plan.todo, "Test 2 scheme groups")
        self.plan = plan

    def finish(self, b: Bundle) -> bool:
        """Store bundle ``b``'s groups if all its ranges are in; True when ``stop_after`` is reached."""
        n = len(self.plan.ranges)
        if len(b.got) < n:
            return False
        preds = np.concatenate([b.got[r][0] for r in range(n)], axis=2)  # [groups, outs, items]
        seconds = sum(sec for _, sec in b.got.values())
        b.got = {}
        for j, target in enumerate(b.targets):
            rows: list[GroupRow] = [
                (m[0].context_part(), b.key.outs, preds[g : g + 1])
                for g, m in enumerate(target)
                if m[0].context_part() not in self.plan.done
            ]
            if self.store(rows, ["acc"], seconds / len(target), drop=b.names if j == len(b.targets) - 1 else ()):
                return True
        return False

    def take(self, i: int, r: int, preds: np.ndarray, seconds: float) -> bool:
        """Bundle ``i``'s picks over range ``r``: kept, or its groups stored; True when ``stop_after`` is reached."""
        b = self.plan.bundles[i]
        b.got[r] = (preds, seconds)
        if len(b.got) < len(self.plan.ranges):
            b.names.append(self.plan.shard_key(i, r).name)
            self.sink.put_shard(b.names[-1], preds, seconds)
        elif self.finish(b):
            return True
        self.tally.shard("test2")
        return False


def _parts(
    plan: Test2Plan, bank: VectorBank, layer_key: dict[str, str]
) -> Iterator[tuple[Test2Ctx, list[list[Test2Shard]]]]:
    """One part per (wave, range): the range's context and the wave's batches still to run there."""
    alias = bank.layer_alias()
    for (_, r), part in groupby(plan.work, key=lambda w: (w.bundles[0] // plan.wave, w.r)):
        bs = [[plan.bundles[i].shard for i in w.bundles] for w in part]
        yield (
            Test2Ctx.of_range(
                bank, {x.enc: plan.layouts[x.enc] for b in bs for x in b}, layer_key, alias, *plan.ranges[r]
            ),
            bs,
        )


def run_test2(
    plan: Test2Plan, sink: Sink, bank: VectorBank, layer_key: dict[str, str], workers: Workers, tally: Tally
) -> int:
    """Run the shards of ``plan`` on ``workers`` (in batches: :func:`~.shards.test2_batch`) and store them
    (:class:`_Test2Run`); bundles whose every range was kept by an interrupted call are stored first.  Returns
    the number of groups stored; ``tally.shards["test2"]`` counts the (bundle, range) shards computed."""
    with _Test2Run(plan, sink, tally) as run:
        for b in plan.bundles:
            if run.finish(b):
                return run.computed
        for k, (batch, seconds) in workers.map_parts(test2_batch, _parts(plan, bank, layer_key)):
            w = plan.work[k]
            for i, preds in zip(w.bundles, batch):
                if run.take(i, w.r, preds, seconds / len(w.bundles)):
                    return run.computed
    return run.computed


def evaluate_test2(
    sink: Sink,
    bank: VectorBank,
    items: Sequence[ItemPlan],
    schemes: Sequence[Scheme],
    layer_key: dict[str, str],
    workers: Workers,
    tally: Tally,
    context_mb: float | None = None,
) -> int:
    """Evaluate and store every Test 2 context group not yet stored (:func:`plan_test2`, :func:`run_test2`);
    returns the number of groups stored.  Bit-identical work is done once: encodings that cut every item
    identically share a bundle's predictions (within one NORM), as do bank layers with identical vectors."""
    plan = plan_test2(sink, bank, items, schemes, workers, context_mb)
    return 0 if plan is None else run_test2(plan, sink, bank, layer_key, workers, tally)


__all__ = ["TEST2_WAVE", "Bundle", "Test2Plan", "Test2Work", "evaluate_test2", "plan_test2", "run_test2"]
