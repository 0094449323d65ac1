"""The Test 2 sweep's shared evaluation (issue 12): bundles of one NORM computed together give, bit for bit, the
picks each gave alone before (``oracles.test2_bundle_v1``: every bundle re-reading and re-normalising whole
rows), on random banks with every NORM, SEGMENT_AGG, EXAMPLE_AGG and SIMILARITY_FUNC, ``word=last`` (no NORM),
aliased layers, padding, ties and degenerate vectors; and the sweep's tables do not depend on the batching."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hst

import oracles
from walklens.analyses.concepts.schemes import NORMS, WORD_AGG_SCHEMES, Scheme
from walklens.analyses.concepts.vectors import VectorBank
from walklens.lab.experiments.sweep import EncLayout, NormedBank, batched

ENCS = ("sentence_level_segmentation", "concat_each_example")
LK = {"E": "E", "0": "0", "-1": "2"}  # scheme layer -> bank layer; E and 0 bit-identical (aliased)


from test_sweep import _one_thread  # noqa: E402,F401  (autouse: one intra-op thread in this module too)


def _bits(x: torch.Tensor) -> np.ndarray:
    """A float32 tensor's bit patterns (NaN, -0.0 and inf compared exactly)."""
    return x.contiguous().view(torch.int32).numpy()


def _bank(g: torch.Generator, texts: int, words: tuple[str, ...], d: int) -> VectorBank:
    """Random vectors of varied scale and offset, hidden state 0 a copy of E, and degenerate vectors: zeros and
    constants (varNorm gives NaN and inf there, zNorm zeros)."""
    v = torch.randn(texts, 3, len(words), d, generator=g) * torch.rand(texts, 3, len(words), 1, generator=g) * 5
    v += torch.randn(texts, 3, len(words), 1, generator=g)
    v[:, 1] = v[:, 0]
    odd = torch.rand(texts, 3, len(words), generator=g)
    v[odd < 0.04] = 0.0
    v[(odd > 0.96)] = 2.5
    v[:, 1] = v[:, 0]
    return VectorBank(layers=("E", "0", "2"), words=words, index={}, vectors=v)


def _layout(g: torch.Generator, n: int, E: int, S: int, texts: int, ties: bool) -> EncLayout:
    """Random padded rows of ``n`` items with up to ``E`` examples of up to ``S`` segments; padding points at
    row 0 (as :meth:`EncLayout.build`); with ``ties``, some items' endings repeat a row (identical choices)."""
    smask = torch.rand(n, E, S, generator=g) < 0.6
    smask[:, 0, 0] = True
    smask[:, :, 0] |= torch.rand(n, E, generator=g) < 0.5
    seg = torch.randint(0, texts, (n, E, S), generator=g) * smask
    end = torch.randint(0, texts, (n, 4), generator=g)
    if ties:
        end[::2, 3] = end[::2, 1]
    return EncLayout(seg=seg, smask=smask, emask=smask.any(-1), end=end)


def _groups(
    enc: str,
    norm: str | None,
    seg: str | None,
    ex: str,
    sim: str,
    pairs: list[tuple[str, str]],
    outs: list[tuple[str, str]],
) -> list[list[Scheme]]:
    return [
        [
            Scheme(enc=enc, layer=l, word=w, norm=norm, seg=seg, ex=ex, sim=sim, out_layer=ol, out_word=ow)
            for ol, ow in outs
        ]
        for l, w in pairs
    ]


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    norm=hst.sampled_from(NORMS),
    seed=hst.integers(0, 2**16),
    rows=hst.integers(1, 40),
    d=hst.sampled_from([3, 16, 576]),
)
def test_normed_pairs_are_the_bits_of_whole_normed_rows(norm: str | None, seed: int, rows: int, d: int) -> None:
    """NormedBank.pairs (just some rows' chosen (layer, word) vectors, normalised) reads every vector with the
    bits of the whole rows normalised together (NORM acts on each vector by itself; not after ``last``)."""
    g = torch.Generator().manual_seed(seed)
    words = ("mean", "last", "w1mean")
    bank = _bank(g, 12, words, d)
    idx = torch.randint(0, 12, (rows,), generator=g)
    k = int(torch.randint(1, 10, (1,), generator=g))
    pl, pw = torch.randint(0, 3, (k,), generator=g), torch.randint(0, 3, (k,), generator=g)
    nb = NormedBank(bank, norm)
    got = nb.pairs(idx, pl, pw)
    assert got.shape == (rows, k, d)
    assert np.array_equal(_bits(got), _bits(oracles._v1_normed(bank, norm, idx)[:, pl, pw]))
    assert np.array_equal(_bits(got), _bits(nb[idx][:, pl, pw]))


def _case(
    seed: int, norm: str | None, n: int, d: int, chunk: int, combos: list[tuple[int, str | None, str, str]]
) -> None:
    """Bundles ``combos`` (enc index, seg, ex, sim) of one NORM over ``n`` random items: all at once, and in
    random sub-batches, equal the v1 picks of each bundle alone, bit for bit."""
    g = torch.Generator().manual_seed(seed)
    words = tuple(w for w in WORD_AGG_SCHEMES if w in ("mean", "last", "relu|w1mean", "w1mean"))
    texts = 30
    bank = _bank(g, texts, words, d)
    layouts = {ENCS[0]: _layout(g, n, 2, 4, texts, ties=seed % 2 == 0), ENCS[1]: _layout(g, n, 1, 1, texts, ties=True)}
    pairs = [(l, w) for l in LK for w in words]
    outs = [(l, w) for l in LK for w in words]
    keep_p = torch.randperm(len(pairs), generator=g)[: max(2, len(pairs) // 2)].tolist()
    bundles = [
        (ENCS[e], _groups(ENCS[e], norm, seg, ex, sim, [pairs[i] for i in keep_p] if j % 2 else pairs, outs))
        for j, (e, seg, ex, sim) in enumerate(combos)
    ]
    ref = [oracles.test2_bundle_v1(bank, norm, layouts[e], grp, LK, chunk=chunk) for e, grp in bundles]
    together = batched.test2_bundles_batched(bank, norm, layouts, bundles, LK, chunk=chunk)
    assert len(together) == len(ref)
    for r, t, (e, grp) in zip(ref, together, bundles):
        assert t.shape == r.shape == (len(grp), len(outs), n) and t.dtype == np.uint8
        assert np.array_equal(t, r), (e, grp[0][0])
    order = torch.randperm(len(bundles), generator=g).tolist()[: max(1, len(bundles) // 2)]
    alone = batched.test2_bundles_batched(bank, norm, layouts, [bundles[i] for i in order], LK, chunk=chunk)
    for i, t in zip(order, alone):
        assert np.array_equal(t, ref[i])


COMBOS = [
    (e, seg, ex, sim)
    for e in range(2)
    for seg in ("mean", None)
    for ex in ("mean", None, "soft_cluster")
    for sim in ("dot", "cosine")
]


@pytest.mark.parametrize("norm", NORMS)
def test_every_bundle_of_a_norm_at_once_gives_the_v1_bits(norm: str | None) -> None:
    """All 24 (enc, seg, ex, sim) bundles of one NORM in one call, 11 items in chunks of 8 (a padded last chunk),
    D = 576 as smollm2's."""
    _case(seed=3, norm=norm, n=11, d=576, chunk=8, combos=COMBOS)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(
    norm=hst.sampled_from(NORMS),
    seed=hst.integers(0, 2**16),
    n=hst.integers(1, 19),
    d=hst.sampled_from([4, 33, 64]),
    chunk=hst.sampled_from([1, 3, 8]),
    combos=hst.lists(hst.sampled_from(COMBOS), min_size=1, max_size=6),
)
def test_random_batches_give_the_v1_bits(
    norm: str | None, seed: int, n: int, d: int, chunk: int, combos: list[tuple[int, str | None, str, str]]
) -> None:
    """Random banks, item counts, chunk sizes and batches of bundles (repeats included)."""
    _case(seed=seed, norm=norm, n=n, d=d, chunk=chunk, combos=combos)


def test_a_batch_has_one_norm() -> None:
    g = torch.Generator().manual_seed(0)
    bank = _bank(g, 10, ("mean", "last"), 4)
    lay = {ENCS[1]: _layout(g, 3, 1, 1, 10, ties=False)}
    b = [(ENCS[1], _groups(ENCS[1], "L2", "mean", "mean", "dot", [("E", "mean")], [("E", "last")]))]
    with pytest.raises(ValueError):
        batched.test2_bundles_batched(bank, None, lay, b, LK)


# ---- the sweep: batches change no stored bit; a killed run resumes per batch ------------------------------------

GRID = (
    'layers = ["E", "-1"]\nword = ["mean", "last"]\nnorm = ["None", "varNorm"]\nout_word = ["w1mean", "last"]\n'
    'enc = ["sentence_level_segmentation", "concat_each_example", "merge_all_segments"]\n'
)


def test_sweep_tables_do_not_depend_on_the_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stored table is the same bits with batches of one bundle, of the default size, and cut in item
    ranges; a sweep killed after its 3rd bundle has stored those bundles' groups, and resumed computes only the
    others and ends with the same table, no kept shard left over."""
    from test_sweep import _grid_sweeper, _table
    from walklens.lab.experiments.sweep import similarity as run_mod

    sweep = _grid_sweeper(tmp_path, GRID, n=11, seed=4, shots=1)

    seen: list[list[Any]] = []
    real = run_mod.test2_batch

    def spy(lm: Any, ctx: Any, batch: list[Any]) -> Any:
        seen.append(batch)
        return real(lm, ctx, batch)

    monkeypatch.setattr(run_mod, "test2_batch", spy)
    whole = sweep("batched.sqlite")
    bundles = whole.shards_computed["test2"]
    assert len(seen) < bundles and max(map(len, seen)) > 1  # bundles did share calls
    assert all(len({(s.norm, s.enc) for s in b}) == 1 and len(b) <= run_mod.TEST2_BATCH for b in seen)
    default = run_mod.TEST2_BATCH
    monkeypatch.setattr(run_mod, "TEST2_BATCH", 1)
    seen.clear()
    one = sweep("one.sqlite")
    assert len(seen) == bundles == one.shards_computed["test2"]
    monkeypatch.setattr(run_mod, "TEST2_BATCH", default)
    cut = sweep("cut.sqlite", test2_context_mb=1e-9)  # 8-item ranges: 2 per bundle
    assert cut.shards_computed["test2"] == 2 * bundles

    def crash(kind: str, n: int) -> None:
        if kind == "test2" and n == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep("killed.sqlite", on_shard=crash)
    again = sweep("killed.sqlite")
    assert again.groups_stored_before >= 3 * 4  # three bundles of 4 groups (layer x word) each
    assert again.shards_computed["test2"] == bundles - 3
    ref = _table(tmp_path / "batched.sqlite")
    for db in ("one.sqlite", "cut.sqlite", "killed.sqlite"):
        assert _table(tmp_path / db) == ref, db
        with sqlite3.connect(tmp_path / db) as con:
            assert con.execute("SELECT count(*) FROM sweep_shards").fetchone()[0] == 0
