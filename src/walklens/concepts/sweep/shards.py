"""The sweep's shards as workers run them (seed 000, sec. 5.1; :mod:`walklens.backends`).

Each is ``fn(lm, ctx, payload)``: a pure function of the model, a context shared by the shards of one call and
its own payload, so it gives the same bits in this process or on any Ray worker.  The driver
(:mod:`.run`) fixes every payload before any shard runs:

* :func:`baseline_shard` -- one chunk of :data:`~..runner.CHUNK` consecutive items (the runner's packing);
* :func:`~.bank.forward_shard` -- one batch of texts of equal token length (the bank);
* :func:`test2_shard` -- one Test 2 bundle over all items (:func:`~.batched.test2_bundle_batched`);
* :func:`test1_shard` -- one Test 1 block (the schemes of one bank layer and word aggregation) over one item
  range, with the bank rows it reads (:func:`~.batched.test1_predictions`, concept sequences shared within it).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from ..baseline import baseline_items
from ..data import HellaswagItem
from ..schemes import Scheme
from ..store import ItemResult
from .bank import NormedBank, VectorBank
from .batched import EncLayout, test1_predictions, test2_bundle_batched
from .plan import ItemPlan

if TYPE_CHECKING:
    from ...loading import LoadedModel


def baseline_shard(lm: LoadedModel, ctx: None,
                   payload: tuple[Sequence[HellaswagItem], Sequence[Sequence[HellaswagItem]]]) -> list[ItemResult]:
    """The baseline of one chunk of items (with their few-shot examples), packed as the runner packs a chunk."""
    items, examples = payload
    with torch.inference_mode():
        return baseline_items(lm, items, examples)


@dataclass
class Test2Ctx:
    """What every Test 2 shard of a run reads: the bank (``vectors`` as a numpy array, so Ray shares it without a
    copy), the layouts of the encoding schemes, the scheme-layer -> bank-layer map and the bank's layer aliases."""

    vectors: np.ndarray
    layers: tuple[str, ...]
    words: tuple[str, ...]
    layouts: dict[str, EncLayout]
    layer_key: dict[str, str]
    alias: list[int]


@dataclass(frozen=True)
class Test2Shard:
    """One Test 2 bundle: context groups sharing (NORM, enc, seg, ex, sim, choice encodings)."""

    norm: str | None
    enc: str
    groups: list[list[Scheme]]


def test2_shard(lm: LoadedModel, ctx: Test2Ctx, shard: Test2Shard) -> tuple[np.ndarray, float]:
    """Predictions ``[groups, outs, items]`` of one bundle, and the seconds it took."""
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        vectors = torch.from_numpy(ctx.vectors)  # read-only in Ray's object store; never written
    bank = VectorBank(layers=ctx.layers, words=ctx.words, index={}, vectors=vectors)
    preds = test2_bundle_batched(bank, NormedBank(bank, shard.norm), ctx.layouts[shard.enc], shard.groups,
                                 ctx.layer_key, alias=ctx.alias)
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
            out[:, k] = test1_predictions(lm, shard.bank, nbank, shard.items, s, shard.layer_key, shard.conts,
                                          memo)[:, 0]
    return out, time.perf_counter() - t0
