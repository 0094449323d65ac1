"""The composition-scheme sweep (issue 7): grid, vectorised evaluation vs the single-scheme runner, resumable
storage, held-out statistics, report and CLI."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hst

from _ties import assert_picks_match, assert_same_picks
from _toy import write_items
from oracles import reference_test2_bundle, score_batch
from walklens.analyses.concepts.schemes import Scheme
from walklens.base.errors import InputError
from walklens.lab.experiments import stats
from walklens.lab.experiments.grid import DEFAULT_LAYERS, GridSpec, group_by_context
from walklens.lab.hellaswag.store import SweepRun, SweepStore, pack_predictions, unpack_predictions


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small tensors on shared cores: one intra-op thread is many times faster than spinning OpenMP workers."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ---- grid ---------------------------------------------------------------------------------------------------


def test_full_grid_sizes_are_the_product_minus_invalid() -> None:
    g1 = GridSpec.full(1)
    v1, refused1 = g1.enumerate("decoder")
    # Test 1: enc 6 x layer 5 x word 11 x norm 4 x seg 2 x ex 3; soft_cluster and composed cross_encoding refused
    assert g1.product_size() == 6 * 5 * 11 * 4 * 2 * 3
    assert len(v1) == 5 * 5 * 11 * 4 * 2 * 2 + 1  # + the one cross_encoding scheme (the baseline, layer E)
    assert sum(refused1.values()) == g1.product_size() - len(v1)
    assert all(s.validate(1, "decoder") for s in v1[:50])
    names = [str(s) for s in v1]
    assert len(set(names)) == len(names)
    assert all(Scheme.parse(n) == s and hash(Scheme.parse(n)) == hash(s) for n, s in zip(names, v1))


def test_standard_and_toml_grids(tmp_path: Path) -> None:
    std, _ = GridSpec.standard(2, "decoder").enumerate("decoder")
    assert [str(s) for s in std] == [str(Scheme.standard(2, "decoder"))]
    f = tmp_path / "g.toml"
    f.write_text('base = "standard"\nlayers = ["-1", "middle"]\nnorm = ["None", "L2"]\n', encoding="utf-8")
    g = GridSpec.from_toml(f, 2, "decoder")
    schemes, _ = g.enumerate("decoder")
    assert len(schemes) == 2 * 2 * 2  # layer x norm x out_layer
    assert {s.norm for s in schemes} == {None, "L2"}
    f.write_text('layer = ["-1"]\nbogus = [1]\n', encoding="utf-8")
    with pytest.raises(InputError, match="unknown parameter 'bogus'"):
        GridSpec.from_toml(f, 2, "decoder")
    f.write_text("layer = [", encoding="utf-8")
    with pytest.raises(InputError, match="not valid TOML"):
        GridSpec.from_toml(f, 2, "decoder")


def test_group_by_context_shares_everything_but_the_choice_side() -> None:
    f = GridSpec(
        test=2,
        values={
            "enc": ("concat_each_example",),
            "layer": ("-1", "E"),
            "word": ("mean",),
            "norm": ("None",),
            "seg": ("mean",),
            "ex": ("mean",),
            "sim": ("dot", "cosine"),
            "out_layer": DEFAULT_LAYERS,
            "out_word": ("mean", "last"),
        },
    )
    schemes, _ = f.enumerate("decoder")
    groups = group_by_context(schemes)
    assert len(groups) == 4 and all(len(g) == len(DEFAULT_LAYERS) * 2 for g in groups.values())


# ---- packing and storage --------------------------------------------------------------------------------------


def test_pack_roundtrip() -> None:
    rng = np.random.default_rng(0)
    for n in (0, 1, 3, 4, 5, 203):
        p = rng.integers(0, 4, size=n).astype(np.uint8)
        assert np.array_equal(unpack_predictions(pack_predictions(p), n), p)
    with pytest.raises(ValueError):
        pack_predictions(np.array([4]))


def _fill(store: SweepStore, rid: int, labels: np.ndarray, groups: list[str], stop: int | None = None) -> None:
    rng = np.random.default_rng(1)
    for i, g in enumerate(groups):
        preds = rng.integers(0, 4, size=(1, 3, len(labels))).astype(np.uint8)
        if stop is not None and i >= stop:
            return
        if g in store.done(rid):
            continue
        store.put_group(
            rid,
            g,
            ["out_layer=-1,out_word=mean", "out_layer=E,out_word=mean", "out_layer=0,out_word=mean"],
            ["acc"],
            preds,
            labels,
            0.0,
        )


def test_store_resume_gives_identical_table(tmp_path: Path) -> None:
    labels = np.array([0, 1, 2, 3, 1, 2], np.uint8)
    groups = [f"enc=concat_each_example,layer={l},word=mean,norm=None,seg=mean,ex=mean,sim=dot" for l in range(5)]
    run = SweepRun(
        model="m",
        data="d",
        split="validation",
        shots=0,
        test=2,
        labels=labels,
        item_index=range(6),
        arch="decoder",
        n_layers=4,
    )
    with SweepStore(tmp_path / "a.sqlite") as a:
        rid = a.run_id(run)
        _fill(a, rid, labels, groups)
        full = a.load(rid)
    with SweepStore(tmp_path / "b.sqlite") as b:  # interrupted after 2 groups, then resumed
        rid = b.run_id(run)
        _fill(b, rid, labels, groups, stop=2)
        assert len(b.done(rid)) == 2
    with SweepStore(tmp_path / "b.sqlite") as b:
        assert b.run_id(run) == rid
        _fill(b, rid, labels, groups)
        res = b.load(rid)
    assert res.schemes == full.schemes and np.array_equal(res.preds, full.preds)
    assert np.allclose(res.acc, (res.preds[0] == labels).mean(-1))
    with sqlite3.connect(tmp_path / "b.sqlite") as con:
        assert con.execute("SELECT count(*) FROM sweep_groups").fetchone()[0] == 5
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_two_writers_at_once_do_not_corrupt_the_store(tmp_path: Path) -> None:
    import threading

    labels = np.array([0, 1, 2, 3], np.uint8)
    run = SweepRun(
        model="m",
        data="d",
        split="validation",
        shots=0,
        test=2,
        labels=labels,
        item_index=range(4),
        arch="decoder",
        n_layers=4,
    )
    db = tmp_path / "c.sqlite"
    with SweepStore(db) as st:
        rid = st.run_id(run)
    groups = [f"enc=concat_each_example,layer={l},word=mean,norm=None,seg=mean,ex=mean,sim=dot" for l in range(40)]
    errors: list[BaseException] = []

    def writer(order: list[str]) -> None:
        try:
            with SweepStore(db) as st:
                for g in order:  # both writers store every group; the content is the same
                    preds = np.full((1, 1, 4), len(g) % 4, np.uint8)
                    st.put_groups(rid, [(g, ["out_layer=-1,out_word=mean"], preds)], ["acc"], labels, 0.0)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(o,)) for o in (groups, groups[::-1])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert con.execute("SELECT count(*) FROM sweep_groups").fetchone()[0] == 40


def test_store_refuses_a_non_database(tmp_path: Path) -> None:
    bad = tmp_path / "x.sqlite"
    bad.write_bytes(b"not a database at all" * 100)
    with pytest.raises(InputError, match="not a usable SQLite database"):
        SweepStore(bad)


# ---- statistics -----------------------------------------------------------------------------------------------


def test_wilson_interval_hand_values() -> None:
    lo, hi = stats.wilson(50, 100)
    assert abs(lo - 0.4038) < 1e-3 and abs(hi - 0.5962) < 1e-3
    assert stats.wilson(0, 10)[0] == 0.0


def test_held_out_removes_selection_bias_on_pure_noise() -> None:
    rng = np.random.default_rng(0)
    correct = rng.random((4000, 200)) < 0.25  # 4000 coin-flip schemes at chance
    names = [f"s{i}" for i in range(len(correct))]
    ins = stats.in_sample_best(correct, names)
    kf = stats.held_out_kfold(correct, names, k=5)
    split = stats.held_out_split(correct, names)
    assert ins.acc > 0.33  # the in-sample best of noise looks far better than chance
    assert abs(kf.acc - 0.25) < 0.07 and kf.lo < 0.25 < kf.hi  # held out, it is chance again
    assert all(abs(s.acc - 0.25) < 0.1 for s in split)
    assert stats.chance_max(4000, 200) > 0.33


def test_held_out_finds_a_real_signal() -> None:
    rng = np.random.default_rng(1)
    correct = rng.random((500, 300)) < 0.25
    correct[123] = rng.random(300) < 0.6  # one genuinely good scheme
    names = [f"s{i}" for i in range(len(correct))]
    kf = stats.held_out_kfold(correct, names, k=5)
    assert set(kf.fold_schemes) == {"s123"} and kf.acc > 0.5


def test_distribution_and_marginals() -> None:
    acc = np.array([0.2, 0.3, 0.5, 0.25])
    d = stats.distribution(acc, n_items=100)
    assert d["n_schemes"] == 4 and d["quantiles"]["q100"] == 0.5 and d["frac_above_chance"] == 0.5
    names = [
        f"enc=concat_each_example,layer={l},word={w},norm=None,seg=mean,ex=mean"
        for l, w in (("1", "mean"), ("1", "last"), ("2", "mean"), ("2", "last"))
    ]
    m = stats.marginal_effects(names, acc, baseline=0.5)
    row = {r["value"]: r for r in m["layer"]}
    assert row["1"]["mean"] == pytest.approx(0.25) and row["2"]["best"] == 0.5 and row["2"]["best_norm"] == 1.0
    assert [(r["value"], r["n"]) for r in m["word"]] == [("mean", 2), ("last", 2)]
    assert [(r["value"], r["n"]) for r in m["norm"]] == [("None", 4)] and "sim" not in m  # Test 1 names: no sim
    with pytest.raises(InputError, match="unknown scheme key 'a'"):  # names are schemes, read by Scheme.parse
        stats.marginal_effects(["a=1,b=x"], acc[:1], baseline=0.5)


def test_scheme_parts_are_the_string_form_cut_in_two() -> None:
    """Scheme.context_part / out_part (the keys the sweep stores groups under) put together give str(scheme),
    and Scheme.parse reads the whole back, over a grid holding every value of every parameter."""
    schemes = GridSpec.full(2, layers=("E", "-1", "middle")).enumerate("decoder")[0][::97]
    schemes += GridSpec.full(1).enumerate("decoder")[0][::53]
    schemes.append(Scheme(enc="concat_each_example", layer="-1", word="mean", sim="dot", out_word="last"))
    for s in schemes:
        assert s.context_part() + ("," + s.out_part() if s.out_part() else "") == str(s)
        assert Scheme.parse(s.context_part()) == replace(s, out_layer=None, out_word=None)
        assert dict(s.pairs()) == {k: v for k, v in (p.split("=", 1) for p in str(s).split(","))}
        assert Scheme.parse(str(s)) == s
    assert {s.out_part() for s in schemes if s.sim is None} == {""}
    assert schemes[-1].out_part() == "out_word=last"


# ---- the vectorised sweep equals the single-scheme runner ------------------------------------------------------

_W = (
    "the a of to and in is was it that he she they on for with as at by from this his her their capital "
    "france paris city river london england king queen man woman boy girl dog cat house car red blue green "
    "one two three four five big small run runs ran walk walks eat eats good bad"
).split()


def _items(n: int = 8, seed: int = 0) -> list:
    from walklens.lab.hellaswag.data import HellaswagItem

    rng = np.random.default_rng(seed)

    def sent(k: int) -> str:
        return " ".join(rng.choice(_W, size=k))

    out = []
    for i in range(n):
        ctx = f"{sent(1)}: {sent(int(rng.integers(3, 7)))}. {sent(int(rng.integers(2, 6)))}"
        endings = tuple(sent(int(rng.integers(1, 5))) + ("." if rng.random() < 0.5 else "") for _ in range(4))
        out.append(HellaswagItem(index=i, activity_label="x", ctx=ctx, endings=endings, label=int(rng.integers(0, 4))))
    return out


def sweep_db(
    lm: Any,
    items: Any,
    db: Path,
    spec: Any,
    *,
    cache: Any = None,
    on_shard: Any = None,
    stop_after: int | None = None,
    **setup: Any,
) -> Any:
    """:func:`~walklens.lab.experiments.sweep.run_sweep` of ``spec`` into the database ``db`` (and the concept cache
    folder ``cache``), opened for the call; ``setup``: the other :class:`RunSetup` fields (data ``toy``, no
    progress bars unless given)."""
    from walklens.analyses.concepts.cache import open_cache
    from walklens.lab.experiments.runsetup import RunSetup
    from walklens.lab.experiments.sweep import run_sweep
    from walklens.lab.hellaswag.store import ResultStore

    setup = {"data": "toy", "progress": False, **setup}
    concepts = open_cache(cache)
    try:
        with ResultStore(db) as store:
            return run_sweep(
                lm,
                items,
                spec,
                RunSetup(store=store, cache=concepts, **setup),
                on_shard=on_shard,
                stop_after=stop_after,
            )
    finally:
        if concepts is not None:
            concepts.close()


def _sample(schemes: list, k: int, seed: int = 0) -> list:
    idx = np.random.default_rng(seed).choice(len(schemes), size=min(k, len(schemes)), replace=False)
    return [schemes[i] for i in sorted(idx)]


@pytest.mark.slow
@pytest.mark.parametrize("family,shots,layers", [("llama", 2, ("E", "-1")), ("gemma3", 0, ("E", "0", "-1"))])
def test_test2_sweep_matches_single_scheme_runner(
    tmp_path: Path, family: str, shots: int, layers: tuple[str, ...]
) -> None:
    """Zero-shot, the example-level encodings cut each item identically and E equals hidden state 0 (both
    are computed once and shared); 2-shot, every encoding differs."""
    from walklens.lab.concepts.similarity import test2_item
    from walklens.lab.experiments.sweep import SweepSpec
    from walklens.lab.hellaswag.data import fewshot_examples
    from walklens.testing import tiny_model

    lm = tiny_model(family)
    items = _items(8)
    grid = GridSpec.full(2, layers=layers)
    schemes, _ = grid.enumerate("decoder")
    db = tmp_path / "r.sqlite"
    out = sweep_db(lm, items, db, SweepSpec(2, schemes), shots=shots)
    assert out.groups_computed == out.n_groups
    with SweepStore(db) as st:
        res = st.load(out.run_id)
    L = len(layers)
    assert len(res.schemes) == len(schemes) == 5 * L * 11 * 4 * 2 * 3 * 2 * L * 11
    pos = {n: i for i, n in enumerate(res.schemes)}
    preds = res.preds[0]
    # every value of every parameter appears in the sample; standard scheme included
    sample = _sample(schemes, 40) + [
        Scheme.standard(2, "decoder"),
        Scheme.parse(  # exact ties: E/last of "x."
            "enc=sentence_level_segmentation,layer=E,word=-relu+|w1mean,norm=None,seg=None,ex=soft_cluster,sim=cosine,"
            "out_layer=E,out_word=last"
        ),
    ]
    # the sweep's picks against the single-scheme runner's scores: equal but for near-ties (tests/_ties.py)
    ref = np.array(
        [
            [test2_item(lm, it, fewshot_examples(items, shots, it.index) if shots else [], s).scores for it in items]
            for s in sample
        ]
    )  # [schemes, items, 4]
    assert_picks_match(np.stack([preds[pos[str(s)]] for s in sample]), ref, "Test 2 sweep vs single runner")
    acc = (preds == res.labels[None]).mean(1)
    assert np.allclose(res.acc[0], acc)
    assert len(np.unique(preds, axis=0)) > 10  # the schemes really differ


def test_test1_sweep_matches_single_scheme_runner(tmp_path: Path) -> None:
    from walklens.lab.concepts.generation import test1_item
    from walklens.lab.experiments.sweep import SweepSpec
    from walklens.lab.hellaswag.data import fewshot_examples
    from walklens.testing import tiny_model

    lm = tiny_model("gemma3")  # scales its input embeddings and prefixes a BOS: the harder case
    items = _items(4, seed=3)
    f = tmp_path / "g.toml"
    f.write_text(
        'layers = ["E", "-1"]\nword = ["last", "relu|w1mean"]\nnorm = ["None", "zNorm"]\n'
        'enc = ["concat_each_example", "sentence_level_segmentation", "cross_encoding"]\n',
        encoding="utf-8",
    )
    schemes, _ = GridSpec.from_toml(f, 1, "decoder").enumerate("decoder")
    db = tmp_path / "r.sqlite"
    out = sweep_db(lm, items, db, SweepSpec(1, schemes), shots=1)
    with SweepStore(db) as st:
        res = st.load(out.run_id)
    pos = {n: i for i, n in enumerate(res.schemes)}
    chars = np.array([[len(e) for e in it.endings] for it in items], np.float64)
    for s in _sample(schemes, 8, seed=1):
        ll = np.array([test1_item(lm, it, fewshot_examples(items, 1, it.index), s).scores for it in items])
        assert_picks_match(res.preds[0, pos[str(s)]], ll, f"acc {s}")
        assert_picks_match(res.preds[1, pos[str(s)]], ll / chars, f"acc_norm {s}")
    base = [r for r in res.schemes if r.startswith("enc=cross_encoding")]
    assert len(base) == 1  # the baseline itself, as the cross_encoding scheme
    assert res.acc[0, pos[base[0]]] == pytest.approx(res.baseline("acc"))


def test_interrupted_sweep_resumes_to_the_identical_table(tmp_path: Path) -> None:
    from walklens.lab.experiments.sweep import SweepSpec
    from walklens.testing import tiny_model

    lm = tiny_model("llama")
    items = _items(5, seed=2)
    f = tmp_path / "g.toml"
    f.write_text('layers = ["E", "-1"]\nword = ["mean", "last"]\nout_word = ["w1mean", "last"]\n', encoding="utf-8")
    schemes, _ = GridSpec.from_toml(f, 2, "decoder").enumerate("decoder")
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    spec = SweepSpec(2, schemes)
    full = sweep_db(lm, items, a, spec)
    part = sweep_db(lm, items, b, spec, stop_after=7)
    assert part.groups_computed == 7 < full.n_groups
    rest = sweep_db(lm, items, b, spec)
    assert rest.groups_stored_before == 7 and rest.groups_computed == full.n_groups - 7
    again = sweep_db(lm, items, b, spec)
    assert again.groups_computed == 0 and again.n_texts == 0  # nothing recomputed, not even a forward pass
    with SweepStore(a) as sa, SweepStore(b) as sb:
        ra, rb = sa.load(full.run_id), sb.load(rest.run_id)
    assert ra.schemes == rb.schemes
    # the resumed bundles hold fewer groups (other matrix shapes): equal picks but for near-ties of the
    # single-scheme runner's scores, computed only where the two tables differ
    from walklens.lab.concepts.similarity import test2_item

    def ref(p: tuple[int, ...]) -> list[float]:
        return list(test2_item(lm, items[p[2]], [], Scheme.parse(ra.schemes[p[1]])).scores)

    assert_same_picks(ra.preds, rb.preds, ref, "resumed vs uninterrupted sweep")
    for r in (ra, rb):  # each stored accuracy is its own predictions'
        assert np.array_equal(r.acc[0], (r.preds[0] == r.labels[None]).mean(-1).astype(np.float32))


# ---- command line and report ----------------------------------------------------------------------------------


def test_cli_sweep_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from walklens.cli import main
    from walklens.testing import tiny_model

    lm = tiny_model("llama")
    mdir = tmp_path / "tiny"
    lm.model.save_pretrained(mdir)
    lm.tokenizer.save_pretrained(mdir)
    data = write_items(tmp_path / "items.jsonl", [(it.ctx, "", it.endings, it.label) for it in _items(6, seed=5)])
    grid = tmp_path / "g.toml"
    grid.write_text(
        'layers = ["E", "-1"]\nword = ["mean", "last"]\nnorm = ["None"]\nout_word = ["mean"]\n', encoding="utf-8"
    )
    db = tmp_path / "r.sqlite"
    args = [
        "sweep",
        "--test",
        "2",
        "--grid",
        str(grid),
        "--model",
        str(mdir),
        "--data",
        str(data),
        "--db",
        str(db),
        "--no-progress",
    ]
    assert main(args + ["--dry-run"]) == 0
    assert "schemes to run" in capsys.readouterr().out
    assert main(args + ["--json", str(tmp_path / "s.json")]) == 0
    info = json.loads((tmp_path / "s.json").read_text())
    assert info["n_schemes"] == 5 * 2 * 2 * 2 * 3 * 2 * 2 and info["groups_computed"] == info["n_groups"]
    ho = info["held_out"]["acc"]  # the held-out best against its procedure, as the report computes it
    assert ho["paired"]["n"] == 6 and ho["bootstrap"]["replicates"] == 200
    assert ho["paired"]["diff"] == pytest.approx(ho["kfold"]["acc"] - ho["baseline"])
    assert main(args) == 0  # rerun: everything stored, nothing recomputed
    assert "0 groups computed now" in capsys.readouterr().out
    out = tmp_path / "rep"
    assert main(["report", "--db", str(db), "--out", str(out)]) == 0
    assert (out / "index.html").is_file() and (out / "summary.csv").is_file()
    assert list(out.glob("top10_*_acc.csv")) and list(out.glob("fig10_test2_acc.png"))
    html = (out / "index.html").read_text()
    assert "<script src=" not in html and "held-out" in html
    rows = (out / "summary.csv").read_text().splitlines()
    assert len(rows) == 2 and rows[0].startswith("model,test,shots")
    md = (out / "summary.md").read_text().splitlines()
    assert len(md) == 3 and md[2].startswith(f"| {mdir} | 2 | 0 | 6 | 480 | acc |")
    # bad input: one line, exit 2
    grid.write_text("layer = [", encoding="utf-8")
    assert main(args) == 2
    assert main(["report", "--db", str(tmp_path / "missing.sqlite"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "not valid TOML" in err and "no such database" in err


def test_batched_evaluation_equals_the_per_item_reference() -> None:
    """test2_bundle_batched (items in chunks, masked padding, soft_cluster via the Gram matrix, tie handling)
    gives the per-item reference's predictions for every scheme of a grid covering every enc/norm/seg/ex/sim."""
    from walklens.analyses.concepts.schemes import WORD_AGG_SCHEMES
    from walklens.lab.experiments.sweep import (
        EncLayout,
        NormedBank,
        build_bank,
        layer_keys,
        plan_item,
        test2_bundle_batched,
    )
    from walklens.lab.hellaswag.data import fewshot_examples
    from walklens.testing import tiny_model

    lm = tiny_model("llama")
    items = _items(6, seed=7)
    g = GridSpec(
        test=2,
        values={
            **GridSpec.full(2, layers=("E", "-1")).values,
            "word": ("mean", "last", "relu|w1mean"),
            "out_word": ("w1mean", "last"),
        },
    )
    schemes, _ = g.enumerate("decoder")
    encs = list(dict.fromkeys(s.enc for s in schemes))
    plans = [plan_item(lm, it, fewshot_examples(items, 2, it.index), encs) for it in items]
    lk = layer_keys(lm, ["E", "-1"])
    bank = build_bank(
        lm, [t for p in plans for t in p.texts()], sorted(set(lk.values())), list(WORD_AGG_SCHEMES), progress=False
    )
    bundles: dict = {}
    for members in group_by_context(schemes).values():
        s = members[0]
        bundles.setdefault((str(s.norm), s.enc, str(s.seg), str(s.ex), s.sim), []).append(members)
    assert len(bundles) == 5 * 4 * 2 * 3 * 2
    for (norm, enc, *_), b in bundles.items():
        nb = NormedBank(bank, None if norm == "None" else norm)
        ref, ref_scores = reference_test2_bundle(bank, nb, plans, b, lk)  # the per-item oracle's picks and scores
        fast = test2_bundle_batched(bank, nb, EncLayout.build(bank, plans, enc), b, lk, chunk=4)
        assert np.array_equal(ref, ref_scores.argmax(-1))  # the scores are the ones it picked from
        assert_picks_match(fast, ref_scores, f"batched vs per-item {(norm, enc, *_)}")


def _score_scale(ctx: torch.Tensor, ends: torch.Tensor, sim: str, soft: bool) -> torch.Tensor:
    """The size of float32 rounding in each Test 2 score ``[C]``: the sum of the magnitudes of the terms a score
    adds up, over its normaliser (for soft_cluster cosine, ``sum_j w_j |k_j| / |k̄_c|``: large where the
    weighted average cancels)."""
    import torch

    ctx, ends = ctx.double(), ends.double()
    kn, en = ctx.norm(dim=-1), ends.norm(dim=-1)
    if not soft:
        return torch.ones(len(ends), dtype=torch.float64) if sim == "cosine" else kn.max() * en
    w = torch.softmax(ends @ ctx.T, dim=-1)  # [C, m]
    terms = (w * kn).sum(-1)
    return terms / (w @ ctx).norm(dim=-1).clamp_min(1e-12) if sim == "cosine" else terms * en


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    m=hst.integers(1, 5),
    pad=hst.integers(0, 3),
    c=hst.integers(1, 4),
    d=hst.integers(1, 9),
    sim=hst.sampled_from(["dot", "cosine"]),
    soft=hst.booleans(),
    seed=hst.integers(0, 2**16),
)
def test_one_scorer_for_the_runner_and_the_sweep(
    m: int, pad: int, c: int, d: int, sim: str, soft: bool, seed: int
) -> None:
    """The runner's Test 2 (test2_from_vectors) is the batched scorer on one item.  Against the plain per-item
    oracle (explicit soft-cluster vectors) in float64, it is as accurate as that oracle in float32 (the previous
    runner): both within 1e-6 of the scale of float32 rounding in the score (:func:`_score_scale`; 2,000 random
    cases measured at most 3.1e-7 for either, and 5.8e-6 for the Gram normaliser in float32).  Padded
    positions change no score beyond rounding, and identical endings score identically."""
    import torch

    from walklens.lab.concepts.similarity import batched_scores, test2_from_vectors

    g = torch.Generator().manual_seed(seed)
    ctx, ends = torch.randn(m, d, generator=g), torch.randn(c, d, generator=g)
    if c > 1 and seed % 3 == 0:
        ends[-1] = ends[0]  # identical endings: identical scores, the first wins
    s = Scheme(enc="concat_each_example", layer="-1", word="mean", ex="soft_cluster" if soft else "mean", sim=sim)
    truth = score_batch(ctx[None].double(), ends[None].double(), sim, soft)[0, 0]  # [C]
    tol = 1e-6 * _score_scale(ctx, ends, sim, soft)
    old = score_batch(ctx[None], ends[None], sim, soft)[0, 0].double()
    got = test2_from_vectors(ctx, ends, s)
    assert got.dtype == torch.float32 and bool(((old - truth).abs() <= tol).all()), (old, truth, tol)
    assert bool(((got.double() - truth).abs() <= tol).all()), (got, truth, tol)
    if c > 1 and seed % 3 == 0:
        assert got[-1] == got[0]
    padded = torch.cat([ctx, 1e3 * torch.randn(pad, d, generator=g)])[None, :, None, :]  # [1, m+pad, 1, D]
    mask = torch.arange(m + pad)[None] < m
    got_padded = batched_scores(padded, mask, ends[None, :, None, :], sim, soft)[0, 0, :, 0]
    assert bool(((got_padded - got).double().abs() <= tol).all())


def test_soft_cluster_cosine_where_the_average_cancels() -> None:
    """Two nearly opposite context vectors and short endings (near-uniform weights): k̄_c is ~300 times shorter
    than the vectors it averages, so |k̄_c|^2 = w^T G w cancels.  The scorer recomputes such norms from k̄_c and
    stays within 1e-6 of the rounding scale of the float64 oracle (as the explicit float32 oracle does; w^T G w
    alone is off by ~1e-4 of it)."""
    import torch

    from walklens.lab.concepts.similarity import test2_from_vectors

    g = torch.Generator().manual_seed(1)
    v, u = torch.randn(8, generator=g), torch.randn(8, generator=g)
    ctx, ends = torch.stack([v, -v + 1e-3 * u]), 1e-3 * torch.randn(3, 8, generator=g)
    s = Scheme(enc="concat_each_example", layer="-1", word="mean", ex="soft_cluster", sim="cosine")
    truth = score_batch(ctx[None].double(), ends[None].double(), "cosine", True)[0, 0]
    scale = _score_scale(ctx, ends, "cosine", True)
    assert bool((scale > 250).all())  # the case is ill-conditioned
    got = test2_from_vectors(ctx, ends, s).double()
    assert bool(((got - truth).abs() <= 1e-6 * scale).all()), (got, truth)


def test_sweep_and_hellaswag_sweep_are_one_command(capsys: pytest.CaptureFixture[str]) -> None:
    """`walklens hellaswag sweep` is the name, `walklens sweep` its alias: both parse to the same function with the
    same options, and both helps say they are the same command."""
    from walklens.cli import build_parser, sweep

    argv = ["--test", "2", "--grid", "standard", "--limit", "3"]
    named = build_parser().parse_args(["hellaswag", "sweep", *argv])
    alias = build_parser().parse_args(["sweep", *argv])
    assert named.func is alias.func is sweep.run
    chosen = ("command", "hellaswag_command")  # which name was typed, and nothing else, differs
    assert {k: v for k, v in vars(named).items() if k not in chosen} == {
        k: v for k, v in vars(alias).items() if k not in chosen
    }
    for prefix, said in ((["hellaswag"], "(also `walklens sweep`)"), ([], "alias of `walklens hellaswag sweep`")):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*prefix, "--help"])
        assert said in " ".join(capsys.readouterr().out.split())
    for prefix in (["hellaswag", "sweep"], ["sweep"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*prefix, "--help"])
        assert "are the same command" in " ".join(capsys.readouterr().out.split())


def test_bank_cache_is_reused_and_serves_subsets(tmp_path, monkeypatch) -> None:
    """--cache: a second run reads the bank back without a forward pass, and a run needing fewer layers and
    word aggregations (a Test 1 grid after a Test 2 grid) is served from the larger cache by slicing."""
    import torch

    from walklens.analyses.concepts import (
        vectors as bank_mod,
    )  # where the bank's forward passes run (the concept cache)
    from walklens.lab.experiments.sweep import build_bank
    from walklens.testing import tiny_model

    lm = tiny_model("llama")
    texts = ["the man walks to the river.", "he runs.", "the dog eats a red car."]
    full = build_bank(lm, texts, ["E", "1", "2"], ["mean", "last", "w1mean"], cache=tmp_path, progress=False)
    monkeypatch.setattr(bank_mod, "hidden_states", lambda *a, **k: pytest.fail("ran a forward pass"))
    again = build_bank(lm, texts, ["E", "1", "2"], ["mean", "last", "w1mean"], cache=tmp_path, progress=False)
    assert torch.equal(again.vectors, full.vectors)
    sub = build_bank(lm, texts[::-1], ["2", "E"], ["last"], cache=tmp_path, progress=False)
    assert torch.equal(sub.vectors, full.vectors[[2, 1, 0]][:, [2, 0]][:, :, [1]])
    with pytest.raises(pytest.fail.Exception):  # a layer the cache does not hold needs the model
        build_bank(lm, texts, ["0"], ["last"], cache=tmp_path, progress=False)


def test_report_keeps_the_baseline_scheme_out_of_the_best() -> None:
    """Test 1's enc=cross_encoding scheme is the baseline itself; a best chosen among schemes that include it
    would be the baseline, trivially.  The summary leaves it out of selection and of the scheme count."""
    from walklens.base.outputs import jsonable
    from walklens.lab.experiments.summary import summarise_run
    from walklens.lab.hellaswag.store import SweepResults

    rng = np.random.default_rng(0)
    n = 60
    labels = rng.integers(0, 4, n).astype(np.uint8)
    base = "enc=cross_encoding,layer=E,word=last,norm=None,seg=None,ex=None"
    names = [base] + [f"enc=concat_all_examples,layer={i},word=mean,norm=None,seg=None,ex=None" for i in range(5)]
    preds = rng.integers(0, 4, (2, len(names), n)).astype(np.uint8)
    preds[:, 0] = labels  # the baseline scheme is perfect here
    correct = preds == labels[None, None]
    run = {
        "model": "m",
        "shots": 0,
        "test": 1,
        "n_items": n,
        "data": "d",
        "labels": labels,
        "baseline_acc": 1.0,
        "baseline_acc_norm": 1.0,
    }
    res = SweepResults(run=run, schemes=names, metrics=["acc", "acc_norm"], acc=correct.mean(axis=2), preds=preds)
    s = jsonable(summarise_run(res))
    assert s["n_schemes"] == 5
    for m in ("acc", "acc_norm"):
        assert s["metrics"][m]["in_sample"]["scheme"] != base
        assert all(t["scheme"] != base for t in s["metrics"][m]["top10"])
        assert s["metrics"][m]["in_sample"]["acc"] < 1.0


# ---- Test 2 over item ranges (issue 15: a worker's memory bounded by its range) ---------------------------------

T2_RANGE_GRID = 'layers = ["E", "-1"]\nword = ["mean", "last"]\nnorm = ["None", "L2"]\nout_word = ["w1mean", "last"]\n'


def _table(db: Path) -> tuple[list[str], bytes, bytes]:
    """A database's one sweep run as bytes: scheme names, accuracies, picks."""
    with SweepStore(db) as st:
        (run,) = st.runs()
        r = st.load(run["id"])
    return r.schemes, r.acc.tobytes(), r.preds.tobytes()


def _kept(db: Path) -> int:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT count(*) FROM sweep_shards").fetchone()[0]


def test_test2_item_ranges_read_the_numbers_of_the_whole_bank(tmp_path: Path) -> None:
    """Each range's context holds only the bank rows its items read, at most the workers' bound (one 8-item chunk
    at least), and gives every item exactly the padded vectors the whole bank gives it; the stored table is the
    one-range table bit for bit."""
    from walklens.core.backends import LocalWorkers
    from walklens.lab.experiments.sweep import SweepSpec
    from walklens.lab.experiments.sweep.shards import TEST2_CHUNK
    from walklens.lab.experiments.sweep.similarity import TEST2_WAVE
    from walklens.testing import tiny_model

    class Recording(LocalWorkers):
        """The local workers, keeping every context they are handed."""

        ctxs: list[Any]

        def map_parts(self, fn: Any, parts: Iterable[tuple[Any, Iterable[Any]]]) -> Iterator[tuple[int, Any]]:
            def seen() -> Iterator[tuple[Any, Iterable[Any]]]:
                for ctx, ps in parts:
                    self.ctxs.append(ctx)
                    yield ctx, ps

            self.ctxs = []
            return super().map_parts(fn, seen())

    lm = tiny_model("llama")
    items = _items(21, seed=5)
    (tmp_path / "g.toml").write_text(T2_RANGE_GRID, encoding="utf-8")
    schemes, _ = GridSpec.from_toml(tmp_path / "g.toml", 2, "decoder").enumerate("decoder")
    whole, cut = Recording(lm), Recording(lm)
    one = sweep_db(lm, items, tmp_path / "a.sqlite", SweepSpec(2, schemes), shots=1, workers=whole)
    (w,) = whole.ctxs  # no bound: one context, the bank itself
    cut.context_bytes = limit = w.vectors.nbytes // 2
    many = sweep_db(lm, items, tmp_path / "b.sqlite", SweepSpec(2, schemes), shots=1, workers=cut)
    assert _table(tmp_path / "a.sqlite") == _table(tmp_path / "b.sqlite")
    ranges, a = [], 0  # the contexts of the first wave: one per range, in order
    for ctx in cut.ctxs:
        b = a + next(iter(ctx.layouts.values())).seg.shape[0]
        assert a % TEST2_CHUNK == 0
        assert ctx.vectors.nbytes <= limit or b - a <= TEST2_CHUNK
        assert ctx.vectors.shape[0] < w.vectors.shape[0]
        for e, lay in ctx.layouts.items():
            big = w.layouts[e]
            for mine, theirs in ((lay.seg, big.seg[a:b]), (lay.end, big.end[a:b])):  # same padded shapes, same bits
                assert np.array_equal(ctx.vectors[mine.numpy()], w.vectors[theirs.numpy()])
            assert np.array_equal(lay.smask.numpy(), big.smask[a:b].numpy())
        ranges.append((a, b))
        a = 0 if b == len(items) else b
    n = ranges.index((ranges[-1][0], len(items))) + 1
    assert n >= 2 and ranges == ranges[:n] * (len(ranges) // n)  # every wave of bundles: the same ranges
    bundles = one.shards_computed["test2"]
    assert len(ranges) // n == -(-bundles // TEST2_WAVE) and many.shards_computed["test2"] == n * bundles


def _grid_sweeper(tmp_path: Path, grid: str, *, n: int, seed: int, shots: int) -> Callable[..., Any]:
    """``sweep(db, **kw)``: the Test 2 sweep of ``grid`` (TOML text) on a tiny llama over ``n`` toy items, into
    ``tmp_path / db``."""
    from walklens.lab.experiments.sweep import SweepSpec
    from walklens.testing import tiny_model

    lm = tiny_model("llama")
    items = _items(n, seed=seed)
    (tmp_path / "g.toml").write_text(grid, encoding="utf-8")
    schemes, _ = GridSpec.from_toml(tmp_path / "g.toml", 2, "decoder").enumerate("decoder")

    def sweep(db: str, test2_context_mb: float | None = None, **kw: Any) -> Any:
        return sweep_db(
            lm, items, tmp_path / db, SweepSpec(2, schemes, test2_context_mb=test2_context_mb), shots=shots, **kw
        )

    return sweep


def test_test2_item_ranges_resume_to_the_one_range_table(tmp_path: Path) -> None:
    """A sweep cut into 8-item ranges, interrupted after its 4th shard, keeps those ranges' picks; rerun with the
    same ranges it computes only the other shards, rerun in one range it drops the kept ones: the one-range table
    bit for bit either way, no shard left over."""
    sweep = _grid_sweeper(tmp_path, T2_RANGE_GRID, n=21, seed=5, shots=2)

    def crash(kind: str, n: int) -> None:
        if kind == "test2" and n == 4:
            raise KeyboardInterrupt

    one = sweep("one.sqlite")
    tiny = 1e-9  # every range one 8-item chunk: 3 ranges
    for db, rerun in (("same.sqlite", tiny), ("other.sqlite", None)):
        with pytest.raises(KeyboardInterrupt):
            sweep(db, test2_context_mb=tiny, on_shard=crash)
        assert _kept(tmp_path / db) == 4
        again = sweep(db, test2_context_mb=rerun)
        per_range = 3 if rerun else 1
        assert again.shards_computed["test2"] == per_range * one.shards_computed["test2"] - (4 if rerun else 0)
        assert _table(tmp_path / db) == _table(tmp_path / "one.sqlite")
        assert _kept(tmp_path / db) == 0


def test_a_range_context_holds_its_rows_and_pads_as_the_whole_bank() -> None:
    """Items 8..15 read rows 10..29 only: their context holds just those (and row 0, where padding points), and
    every entry, padded ones included, reads the whole bank's vector; ranges are cut at 8-item chunks to fit."""
    import torch

    from walklens.analyses.concepts.vectors import VectorBank
    from walklens.lab.experiments.sweep.batched import EncLayout
    from walklens.lab.experiments.sweep.shards import Test2Ctx, item_ranges, range_rows

    g = torch.Generator().manual_seed(0)
    vectors = torch.randn(30, 2, 2, 4, generator=g)
    bank = VectorBank(layers=("E", "1"), words=("mean", "last"), index={}, vectors=vectors)
    seg = torch.cat([torch.randint(0, 10, (8, 2, 3), generator=g), torch.randint(10, 30, (8, 2, 3), generator=g)])
    smask = torch.rand(16, 2, 3, generator=g) < 0.7
    smask[:, :, 0] = True
    seg[~smask] = 0  # padding points at row 0, as EncLayout.build pads
    lay = EncLayout(seg=seg, smask=smask, emask=smask.any(-1), end=torch.randint(10, 30, (16, 4), generator=g))
    lay.end[:8] = torch.randint(0, 10, (8, 4), generator=g)
    ctx = Test2Ctx.of_range(bank, {"e": lay}, {"E": "E"}, [0, 1], 8, 16)
    rows = range_rows([lay], 8, 16)
    assert rows[0] == 0 and rows[1:].min() >= 10 and ctx.vectors.shape == (len(rows), 2, 2, 4)
    sub = ctx.layouts["e"]
    for mine, theirs in ((sub.seg, seg[8:16]), (sub.end, lay.end[8:16])):
        assert np.array_equal(ctx.vectors[mine.numpy()], bank.vectors[theirs].numpy())
    whole = Test2Ctx.of_range(bank, {"e": lay}, {"E": "E"}, [0, 1], 0, 16)
    assert np.shares_memory(whole.vectors, bank.vectors.numpy())  # all items: the bank itself, no copy
    row = 2 * 2 * 4 * 4
    assert item_ranges([lay], 16, row, None) == item_ranges([lay], 16, row, 30 * row) == [(0, 16)]
    assert item_ranges([lay], 16, row, 25 * row) == item_ranges([lay], 16, row, 1) == [(0, 8), (8, 16)]
