"""The sweep's typed shard keys and the run setup: the names kept in ``sweep_shards`` are those earlier sweeps
stored, byte for byte, so a database an interrupted sweep left resumes from its kept shards without computing
them again; the planners skip what is stored; one default few-shot seed."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from test_sweep import T2_RANGE_GRID, _items, _table, sweep_db
from walklens.lab.experiments.grid import GridSpec
from walklens.lab.experiments.sweep import SweepSpec, keys

#: The shard names an interrupted sweep stored before the keys were typed (recorded from that code): Test 2's
#: grid T2_RANGE_GRID over 21 items in 8-item ranges, 2-shot, stopped after its 4th shard; Test 1's grid T1_GRID
#: over 7 items in 3-item shards, stopped after its 2nd.  A word aggregation may hold ``|``.
OLD_TEST2 = [
    "test2|5effa6d9f138dafe|0:8",
    "test2|b91318f63a06296c|0:8",
    "test2|d6fa319be389f2c8|0:8",
    "test2|dc9e49928b5d218c|0:8",
]
OLD_TEST1 = ["test1|E|relu|w1mean|0:3|432d18b00c8b45f8", "test1|E|relu|w1mean|3:6|432d18b00c8b45f8"]
T1_GRID = (
    'layers = ["E", "-1"]\nword = ["last", "relu|w1mean"]\nnorm = ["None", "zNorm"]\n'
    'enc = ["concat_each_example", "cross_encoding"]\n'
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_shard_names_parse_back_to_their_keys() -> None:
    for name in OLD_TEST2:
        key = keys.Test2ShardKey.parse(name)
        assert key is not None and key.name == name and keys.Test1ShardKey.parse(name) is None
    k1 = keys.Test1ShardKey.parse(OLD_TEST1[1])
    assert k1 == keys.Test1ShardKey("E", "relu|w1mean", 3, 6, "432d18b00c8b45f8") and k1.name == OLD_TEST1[1]
    assert k1.block == keys.BlockKey("E", "relu|w1mean") and keys.Test2ShardKey.parse(OLD_TEST1[0]) is None
    for bad in (
        "",
        "test2|5effa6d9f138dafe|0:8|x",
        "test2|5EFFA6D9F138DAFE|0:8",
        "test2|5effa6d9f138dafe|00:8",
        "test1|E||0:3|432d18b00c8b45f8",
        "test1|E|last|0-3|432d18b00c8b45f8",
        "test3|x|0:1",
    ):
        assert keys.Test2ShardKey.parse(bad) is None and keys.Test1ShardKey.parse(bad) is None, bad


def test_a_bundle_digest_is_the_sha256_of_its_tuple() -> None:
    import hashlib

    key = keys.BundleKey(
        norm="None",
        enc="concat_each_example",
        seg="mean",
        ex="mean",
        sim="dot",
        outs=("out_layer=E,out_word=last",),
        pairs=(("E", "mean"), ("-1", "last")),
    )
    old = (
        "None",
        "concat_each_example",
        "mean",
        "mean",
        "dot",
        ("out_layer=E,out_word=last",),
        (("E", "mean"), ("-1", "last")),
    )
    assert key.digest == hashlib.sha256(repr(old).encode()).hexdigest()[:16]


def _crash(kind: str, at: int) -> Callable[[str, int], None]:
    def on_shard(k: str, n: int) -> None:
        if k == kind and n == at:
            raise KeyboardInterrupt

    return on_shard


def _kept(db: Path) -> list[str]:
    with sqlite3.connect(db) as con:
        return sorted(r[0] for r in con.execute("SELECT shard FROM sweep_shards"))


@pytest.mark.parametrize("test", [2, 1])
def test_a_database_with_shards_under_the_stored_names_resumes_without_recomputing(tmp_path: Path, test: int) -> None:
    """An interrupted sweep keeps its shards under the names recorded from the code before the keys were typed;
    rerun, it reads them back by name (computing exactly the other shards) and ends with the uninterrupted table,
    no kept shard left over."""
    from walklens.testing import tiny_model

    lm = tiny_model("llama")
    (tmp_path / "g.toml").write_text(T2_RANGE_GRID if test == 2 else T1_GRID, encoding="utf-8")
    schemes, _ = GridSpec.from_toml(tmp_path / "g.toml", test, "decoder").enumerate("decoder")
    if test == 2:
        items, shots, old = _items(21, seed=5), 2, OLD_TEST2
        spec = SweepSpec(2, schemes, test2_context_mb=1e-9)
    else:
        items, shots, old = _items(7, seed=3), 1, OLD_TEST1
        spec = SweepSpec(1, schemes, test1_shard_items=3)
    kind = f"test{test}"

    def sweep(db: str, **kw: Any) -> Any:
        return sweep_db(lm, items, tmp_path / db, spec, shots=shots, **kw)

    full = sweep("full.sqlite")
    with pytest.raises(KeyboardInterrupt):
        sweep("old.sqlite", on_shard=_crash(kind, len(old)))
    assert _kept(tmp_path / "old.sqlite") == old  # the very names earlier sweeps stored
    again = sweep("old.sqlite")
    assert again.shards_computed[kind] == full.shards_computed[kind] - len(old)  # the kept ones are not run again
    assert "baseline" not in again.shards_computed  # stored before the interruption
    assert _table(tmp_path / "old.sqlite") == _table(tmp_path / "full.sqlite")
    assert _kept(tmp_path / "old.sqlite") == []


def test_the_planners_skip_what_is_stored(tmp_path: Path) -> None:
    """plan_test2 plans no (bundle, range) kept in the store, plan_test1 no (block, range); each planned shard's
    name is new to the store."""
    import numpy as np

    from walklens.core.backends import LocalWorkers
    from walklens.lab.experiments.sweep import Sink, build_bank, layer_keys, plan_item
    from walklens.lab.experiments.sweep.generation import plan_test1
    from walklens.lab.experiments.sweep.similarity import plan_test2
    from walklens.lab.hellaswag.store import SweepRun, SweepStore
    from walklens.testing import tiny_model

    lm = tiny_model("llama")
    items = _items(21, seed=5)
    (tmp_path / "g.toml").write_text(T2_RANGE_GRID, encoding="utf-8")
    schemes, _ = GridSpec.from_toml(tmp_path / "g.toml", 2, "decoder").enumerate("decoder")
    encs = list(dict.fromkeys(s.enc for s in schemes))
    plans = [plan_item(lm, it, [], encs) for it in items]
    lk = layer_keys(lm, {s.layer for s in schemes} | {s.out_layer_eff for s in schemes})
    words = list(dict.fromkeys(w for s in schemes for w in (s.word, s.out_word_eff)))
    bank = build_bank(lm, [t for p in plans for t in p.texts()], sorted(set(lk.values())), words, progress=False)
    labels = np.array([it.label for it in items], np.uint8)
    with SweepStore(tmp_path / "s.sqlite") as st:
        rid = st.run_id(
            SweepRun(
                model="m",
                data="d",
                split="validation",
                shots=0,
                test=2,
                labels=labels,
                item_index=[it.index for it in items],
                arch="decoder",
                n_layers=lm.n_layers,
            )
        )
        sink = Sink(st, rid, labels)
        plan = plan_test2(sink, bank, plans, schemes, LocalWorkers(lm), context_mb=1e-9)
        assert plan is not None and len(plan.ranges) == 3
        every = {plan.shard_key(i, w.r).name for w in plan.work for i in w.bundles}
        assert len(every) == len(plan.bundles) * 3
        kept = sorted(every)[:5]
        for name in kept:
            sink.put_shard(name, np.zeros((1, 1, 8), np.uint8), 0.0)
        again = plan_test2(sink, bank, plans, schemes, LocalWorkers(lm), context_mb=1e-9)
        assert again is not None
        left = {again.shard_key(i, w.r).name for w in again.work for i in w.bundles}
        assert left == every - set(kept)
        assert sum(len(b.got) for b in again.bundles) == 5
        # Test 1: the same for a block's item ranges
        t1 = [
            s
            for s in GridSpec.from_toml(_t1(tmp_path), 1, "decoder").enumerate("decoder")[0]
            if s.enc != "cross_encoding"
        ]
        lk1 = layer_keys(lm, {s.layer for s in t1})
        p1 = plan_test1(sink, bank, t1, lk1, len(items), shard_items=8)
        assert len(p1.work) == len(p1.blocks) * 3 and p1.n_ranges == 3
        sink.put_shard(p1.work[1].name, np.zeros((2, 1, 8), np.uint8), 0.0)
        q1 = plan_test1(sink, bank, t1, lk1, len(items), shard_items=8)
        assert q1.work == p1.work[:1] + p1.work[2:] and list(q1.blocks[p1.work[1].block].parts) == [p1.work[1]]


def _t1(tmp_path: Path) -> Path:
    f = tmp_path / "g1.toml"
    f.write_text(
        'layers = ["E", "-1"]\nword = ["mean", "last"]\nnorm = ["None"]\nenc = ["concat_each_example"]\n',
        encoding="utf-8",
    )
    return f


def test_one_default_few_shot_seed_and_its_data_key() -> None:
    """The few-shot seed's default is the harness's (hellaswag.data.FEWSHOT_SEED), in the run setup only; a run
    with another seed is stored under ``DATA#seed=S``."""
    import inspect

    from walklens.lab.experiments import compaction, curves, runner
    from walklens.lab.experiments.runsetup import RunSetup
    from walklens.lab.experiments.sweep import run as sweep_run
    from walklens.lab.hellaswag.data import FEWSHOT_SEED, HellaswagItem

    assert RunSetup().fewshot_seed == FEWSHOT_SEED
    assert RunSetup(data="d").data_key == "d" and RunSetup(data="d", fewshot_seed=7).data_key == "d#seed=7"
    it = HellaswagItem(index=0, activity_label="x", ctx="a b", endings=("c",) * 4, label=0)
    key = RunSetup(shots=2, data="d", fewshot_seed=7).run_key("m", [it], "test1", "s")
    assert key.values() == ("m", "d#seed=7", "validation", 2, "test1", "s")
    for mod in (runner, compaction, curves, sweep_run):
        assert "fewshot_seed" not in inspect.getsource(mod), mod.__name__
