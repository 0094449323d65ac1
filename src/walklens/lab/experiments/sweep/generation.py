"""Test 1 of a sweep (seed 000, sec. 5.1.1, A.6): a planner that fixes every shard still to run, and an executor
that runs them on the workers and stores what comes back.

``enc=cross_encoding`` is the baseline itself: its picks are the baseline's, stored at once.  The other schemes
go in blocks of one bank layer and word aggregation (:class:`~.keys.BlockKey`: concept sequences can be identical
only within one), each cut into item ranges of ``shard_items``; :func:`plan_test1` skips the (block, range)
shards kept by an interrupted call (:class:`~.keys.Test1ShardKey`), and :func:`run_test1` keeps each new shard's
picks in ``sweep_shards`` and commits a block's groups, dropping them, when its last range is in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ....analyses.concepts.schemes import Scheme
from ....analyses.concepts.vectors import VectorBank
from ....core.backends import Workers
from .keys import BlockKey, Test1ShardKey
from .plan import ItemPlan
from .shards import Test1Shard, test1_shard
from .sink import GroupRow, GroupRun, Sink, Tally

#: Items per Test 1 shard (fixed: it decides which concept sequences share a packed forward pass).
TEST1_SHARD_ITEMS = 64


@dataclass(frozen=True)
class Test1Items:
    """The items as Test 1 reads them: their plans (:class:`~.plan.ItemPlan`), each ending's token ids and the
    baseline's picks ``[2 (acc, acc_norm), items]``."""

    plans: Sequence[ItemPlan]
    conts: Sequence[Sequence[Sequence[int]]]
    baseline: np.ndarray


@dataclass
class Block:
    """One block's work: its schemes (sorted by NORM, then name) and the picks of its ranges in so far
    (``parts``: by shard key, with the range's first item and the seconds it took)."""

    key: BlockKey
    schemes: list[Scheme]
    parts: dict[Test1ShardKey, tuple[int, np.ndarray, float]] = field(default_factory=dict)


@dataclass
class Test1Plan:
    """Every Test 1 shard still to run (``work``), the blocks in bank order and the number of item ranges."""

    blocks: dict[BlockKey, Block]
    n_ranges: int
    work: list[Test1ShardKey]


def _block_key(s: Scheme, bank: VectorBank, layer_key: dict[str, str], alias: list[int]) -> BlockKey:
    """A Test 1 scheme's block: its bank layer (bit-identical layers as one) and word aggregation."""
    return BlockKey(bank.layers[alias[bank.layer_pos(layer_key[s.layer])]], s.word)


def plan_test1(
    sink: Sink,
    bank: VectorBank,
    schemes: Sequence[Scheme],
    layer_key: dict[str, str],
    n_items: int,
    shard_items: int = TEST1_SHARD_ITEMS,
) -> Test1Plan:
    """The :class:`Test1Plan` of the composed ``schemes`` (none ``enc=cross_encoding``) over ``n_items`` items:
    every (block, item range) shard not kept in ``sink`` by an interrupted call."""
    alias = bank.layer_alias()
    grouped: dict[BlockKey, list[Scheme]] = {}
    for s in schemes:
        grouped.setdefault(_block_key(s, bank, layer_key, alias), []).append(s)
    order = sorted(grouped, key=lambda k: (bank.layers.index(k.layer), bank.words.index(k.word)))
    kept = sink.kept()
    blocks: dict[BlockKey, Block] = {}
    work: list[Test1ShardKey] = []
    for k in order:
        block = blocks[k] = Block(k, sorted(grouped[k], key=lambda s: (str(s.norm), str(s))))
        digest = BlockKey.digest(block.schemes)
        for a in range(0, n_items, shard_items):
            key = Test1ShardKey(k.layer, k.word, a, min(n_items, a + shard_items), digest)
            if key.name in kept:
                block.parts[key] = (a, *kept[key.name])
            else:
                work.append(key)
    return Test1Plan(blocks=blocks, n_ranges=len(range(0, n_items, shard_items)), work=work)


def _payload(bank: VectorBank, items: Test1Items, block: Block, key: Test1ShardKey) -> Test1Shard:
    """One Test 1 shard: the block over items ``[key.a, key.b)``, with a bank of just the rows and vectors it
    reads."""
    a, b = key.a, key.b
    plans, conts = items.plans, items.conts
    encs = {s.enc for s in block.schemes}
    texts = list(
        OrderedDict.fromkeys(t for it in plans[a:b] for e in sorted(encs) for ex in it.contexts[e] for t in ex)
    )
    li, wi = bank.layer_pos(key.layer), bank.word_pos(key.word)
    sub = bank.vectors[bank.rows(texts), li : li + 1, wi : wi + 1]  # [texts, 1, 1, D], a copy of just these
    mini = VectorBank(layers=(key.layer,), words=(key.word,), index={t: j for j, t in enumerate(texts)}, vectors=sub)
    return Test1Shard(
        schemes=list(block.schemes),
        bank=mini,
        items=list(plans[a:b]),
        conts=[[list(map(int, c)) for c in cs] for cs in conts[a:b]],
        layer_key={s.layer: key.layer for s in block.schemes},
    )


class _Test1Run(GroupRun):
    """The executor's state: stores a block's groups once all its ranges are in, and counts the groups stored."""

    def __init__(self, plan: Test1Plan, sink: Sink, tally: Tally, computed: int) -> None:
        total = sum(len(b.schemes) for b in plan.blocks.values())
        super().__init__(sink, tally, computed, total, "Test 1 schemes", show=bool(plan.blocks))
        self.plan = plan

    def finish(self, block: Block) -> bool:
        """Store ``block`` if all its ranges are in; True when ``stop_after`` is reached."""
        if len(block.parts) < self.plan.n_ranges:
            return False
        preds = np.concatenate([p for _, p, _ in sorted(block.parts.values(), key=lambda x: x[0])], axis=2)
        seconds = sum(sec for _, _, sec in block.parts.values()) / len(block.schemes)
        rows: list[GroupRow] = [(s.context_part(), [""], preds[:, j : j + 1]) for j, s in enumerate(block.schemes)]
        return self.store(rows, ["acc", "acc_norm"], seconds, drop=[k.name for k in block.parts])


def run_test1(
    plan: Test1Plan, sink: Sink, items: Test1Items, bank: VectorBank, workers: Workers, tally: Tally, computed: int = 0
) -> int:
    """Run the shards of ``plan`` on ``workers`` (:func:`~.shards.test1_shard`) and store them; blocks whose every
    range was kept by an interrupted call are stored first.  Returns the number of groups stored (``computed``:
    those stored before, counted against ``stop_after``); ``tally.shards["test1"]`` counts the shards computed."""
    with _Test1Run(plan, sink, tally, computed) as run:
        for block in plan.blocks.values():
            if run.finish(block):
                return run.computed
        payloads: Iterator[Test1Shard] = (_payload(bank, items, plan.blocks[k.block], k) for k in plan.work)
        for i, (preds, seconds) in workers.map(test1_shard, None, payloads):
            key = plan.work[i]
            sink.put_shard(key.name, preds, seconds)
            plan.blocks[key.block].parts[key] = (key.a, preds, seconds)
            tally.shard("test1")
            if run.finish(plan.blocks[key.block]):
                return run.computed
    return run.computed


def evaluate_test1(
    sink: Sink,
    bank: VectorBank,
    items: Test1Items,
    schemes: Sequence[Scheme],
    layer_key: dict[str, str],
    workers: Workers,
    tally: Tally,
    shard_items: int = TEST1_SHARD_ITEMS,
) -> int:
    """Evaluate and store every Test 1 scheme not yet stored (one group each); returns how many were stored.
    ``enc=cross_encoding`` is the baseline itself: its picks are the baseline's ``[2, items]``.  The others run in
    (block, item range) shards (:func:`plan_test1`, :func:`run_test1`)."""
    done = sink.done()
    todo = [s for s in schemes if s.context_part() not in done]
    computed = 0
    for s in (s for s in todo if s.enc == "cross_encoding"):
        sink.put_groups(
            [(s.context_part(), [""], items.baseline.reshape(2, 1, -1).astype(np.uint8))], ["acc", "acc_norm"], 0.0
        )
        computed += 1
        if tally.stop(computed):
            return computed
    plan = plan_test1(
        sink, bank, [s for s in todo if s.enc != "cross_encoding"], layer_key, len(items.plans), shard_items
    )
    return run_test1(plan, sink, items, bank, workers, tally, computed)


__all__ = ["TEST1_SHARD_ITEMS", "Block", "Test1Items", "Test1Plan", "evaluate_test1", "plan_test1", "run_test1"]
