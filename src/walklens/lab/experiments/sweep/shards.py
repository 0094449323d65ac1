"""The sweep's shards as workers run them (seed 000, sec. 5.1; :mod:`walklens.core.backends`).

Each is ``fn(lm, ctx, payload)``: a pure function of the model, a context shared by the shards of one call and
its own payload, so it gives the same bits in this process or on any Ray worker.  The driver
(:mod:`.run`) fixes every payload before any shard runs:

* :func:`baseline_shard` -- one chunk of :data:`~..runner.CHUNK` consecutive items (the runner's packing);
* :func:`~.bank.forward_shard` -- one batch of texts of equal token length (the bank);
* :func:`test2_batch` -- Test 2 bundles of one NORM and encoding (a batch of :class:`Test2Shard`) over one item
  range, whose context (:meth:`Test2Ctx.of_range`) holds just the bank rows the range reads; they share the
  reading, normalising and composing of those rows (:func:`~.batched.test2_bundles_batched`), and each gives
  the bits it gives alone;
* :func:`test1_shard` -- one Test 1 block (the schemes of one bank layer and word aggregation) over one item
  range, with the bank rows it reads (:func:`~.batched.test1_predictions`, concept sequences shared within it).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ....analyses.concepts.schemes import Scheme
from ....analyses.concepts.vectors import VectorBank
from ...hellaswag.baseline import baseline_items
from ...hellaswag.data import HellaswagItem
from ...hellaswag.store import ItemResult
from .bank import NormedBank
from .batched import EncLayout, test1_predictions, test2_bundles_batched
from .plan import ItemPlan

if TYPE_CHECKING:
    from ....core.loading import LoadedModel


def baseline_shard(
    lm: LoadedModel, ctx: None, payload: tuple[Sequence[HellaswagItem], Sequence[Sequence[HellaswagItem]]]
) -> list[ItemResult]:
    """The baseline of one chunk of items (with their few-shot examples), packed as the runner packs a chunk."""
    items, examples = payload
    with torch.inference_mode():
        return baseline_items(lm, items, examples)


#: Items per matrix product of Test 2 (:func:`~.batched.test2_bundle_batched`'s ``chunk``); item ranges start at
#: multiples of it, so every product sees the same items, padded to the same shapes, however the items are cut.
TEST2_CHUNK = 8


@dataclass
class Test2Ctx:
    """What every Test 2 shard of an item range reads: the bank rows of its items (``vectors`` as a numpy array,
    so Ray shares it without a copy), the layouts of the encoding schemes over its items (indices into those
    rows), the scheme-layer -> bank-layer map and the bank's layer aliases."""

    vectors: np.ndarray
    layers: tuple[str, ...]
    words: tuple[str, ...]
    layouts: dict[str, EncLayout]
    layer_key: dict[str, str]
    alias: list[int]

    @classmethod
    def of_range(
        cls,
        bank: VectorBank,
        layouts: dict[str, EncLayout],
        layer_key: dict[str, str],
        alias: list[int],
        a: int,
        b: int,
    ) -> Test2Ctx:
        """The context of items ``[a, b)``: every item when that is all of them (the bank itself, no copy), else a
        copy of the rows they read (:func:`range_rows`) with the layouts' slices pointing into it.  The layouts
        keep the padded shapes of all items and the bank's layer aliases stay those of all rows, so each item's
        numbers are the very ones of the whole run."""
        n = next(iter(layouts.values())).seg.shape[0]
        if (a, b) == (0, n):
            return cls(
                vectors=bank.vectors.numpy(),
                layers=bank.layers,
                words=bank.words,
                layouts=dict(layouts),
                layer_key=dict(layer_key),
                alias=list(alias),
            )
        rows = range_rows(layouts.values(), a, b)

        def local(idx: torch.Tensor) -> torch.Tensor:
            return torch.searchsorted(rows, idx)

        sub = {
            e: EncLayout(seg=local(l.seg[a:b]), smask=l.smask[a:b], emask=l.emask[a:b], end=local(l.end[a:b]))
            for e, l in layouts.items()
        }
        return cls(
            vectors=bank.vectors[rows].numpy(),
            layers=bank.layers,
            words=bank.words,
            layouts=sub,
            layer_key=dict(layer_key),
            alias=list(alias),
        )


def range_rows(layouts: Iterable[EncLayout], a: int, b: int) -> torch.Tensor:
    """The sorted bank rows items ``[a, b)`` read under ``layouts``, padded entries included (they point at row 0:
    in a range's context too they read that row's vector, though masked out)."""
    return torch.unique(torch.cat([t for l in layouts for t in (l.seg[a:b].reshape(-1), l.end[a:b].reshape(-1))]))


def item_ranges(layouts: Sequence[EncLayout], n: int, row_bytes: int, limit: int | None) -> list[tuple[int, int]]:
    """Consecutive item ranges ``[a, b)`` covering ``n`` items whose bank rows (:func:`range_rows`, ``row_bytes``
    each: layers x words x D x 4 bytes) fit in ``limit`` bytes: all items at once where they fit (or ``limit`` is
    ``None``), else greedily, whole :data:`TEST2_CHUNK`-item chunks at a time (one chunk at least)."""
    if limit is None or range_rows(layouts, 0, n).numel() * row_bytes <= limit:
        return [(0, n)]
    out: list[tuple[int, int]] = []
    a = 0
    rows: set[int] = set()
    for c in range(0, n, TEST2_CHUNK):
        new = set(range_rows(layouts, c, min(n, c + TEST2_CHUNK)).tolist())
        if c > a and (len(rows) + len(new - rows)) * row_bytes > limit:
            out.append((a, c))
            a, rows = c, new
        else:
            rows |= new
    out.append((a, n))
    return out


@dataclass(frozen=True)
class Test2Shard:
    """One Test 2 bundle: context groups sharing (NORM, enc, seg, ex, sim, choice encodings)."""

    norm: str | None
    enc: str
    groups: list[list[Scheme]]


#: Test 2 bundles computed together at most (:func:`test2_batch`): the full grid's bundles of one NORM and
#: encoding (2 SEGMENT_AGG x 3 EXAMPLE_AGG x 2 SIMILARITY_FUNC).  It bounds the picks a batch holds (each bundle's
#: ``[groups, outs, items]``) and the work a killed sweep loses, not any number.
TEST2_BATCH = 12


def test2_batch(lm: LoadedModel, ctx: Test2Ctx, batch: Sequence[Test2Shard]) -> tuple[list[np.ndarray], float]:
    """Predictions ``[groups, outs, items of the range]`` of each bundle of a batch (one NORM), and the seconds
    the batch took."""
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        vectors = torch.from_numpy(ctx.vectors)  # read-only in Ray's object store; never written
    bank = VectorBank(layers=ctx.layers, words=ctx.words, index={}, vectors=vectors)
    norms = {sh.norm for sh in batch}
    if len(norms) != 1:
        raise ValueError(f"a Test 2 batch has one NORM, not {sorted(map(str, norms))}")
    preds = test2_bundles_batched(
        bank,
        batch[0].norm,
        ctx.layouts,
        [(sh.enc, sh.groups) for sh in batch],
        ctx.layer_key,
        chunk=TEST2_CHUNK,
        alias=ctx.alias,
    )
    return preds, time.perf_counter() - t0


@dataclass
class Test1Shard:
    """One Test 1 block over one item range: its schemes (sorted by NORM), the items' plans and continuation
    token ids, and a bank of the rows they read (one layer, one word aggregation) with the scheme -> bank
    layer map."""

    schemes: list[Scheme]
    bank: VectorBank
    items: list[ItemPlan]
    conts: list[list[list[int]]]
    layer_key: dict[str, str]


def test1_shard(lm: LoadedModel, ctx: None, shard: Test1Shard) -> tuple[np.ndarray, float]:
    """Picks ``[2 (acc, acc_norm), schemes, items]`` of one Test 1 shard, and the seconds it took; identical
    concept sequences within the shard are scored once."""
    t0 = time.perf_counter()
    memo: dict[bytes, list[float]] = {}
    out = np.empty((2, len(shard.schemes), len(shard.items)), np.uint8)
    nbank: NormedBank | None = None
    with torch.inference_mode():
        for k, s in enumerate(shard.schemes):
            if nbank is None or nbank.norm != s.norm:
                nbank = NormedBank(shard.bank, s.norm)
            out[:, k] = test1_predictions(lm, shard.bank, nbank, shard.items, s, shard.layer_key, shard.conts, memo)[
                :, 0
            ]
    return out, time.perf_counter() - t0
