"""The composition-scheme sweep at full scale: one forward pass serves every scheme (seed 000, sec. 5.1, A.6).

How the cost of ~10^6 schemes is kept near the cost of one:

1. **Distinct texts, one pass each.**  Every encoding scheme of A.6 cuts an item's context into segments
   (sentences, context/completion parts, examples, everything); the choices are one segment each.  The set
   of distinct segment texts over all items and encoding schemes is run through the model once each (texts
   of equal token length are batched, so no padding touches the numbers), keeping only the layers of the
   layer set.
2. **Word aggregation once per (text, layer, word scheme).**  The ``[T, D]`` hidden states of a text are
   reduced right away by every WORD_AGG_SCHEME (A.6) into a :class:`VectorBank` ``[texts, layers, words, D]``
   (the hidden states themselves are dropped), optionally cached on disk as safetensors (:mod:`.bank`).
3. **Test 2: one batched product per bundle.**  Context groups (enc, layer, word, NORM, SEGMENT_AGG,
   EXAMPLE_AGG, SIMILARITY_FUNC; each holding its (out_layer, out_word) schemes) that differ only in
   (layer, word) form a bundle.  For a chunk of items, the context sequences of all (layer, word) pairs
   ``[n, m, P, D]`` (masked padding) meet all choice vectors ``[n, C, Q, D]`` in one ``bmm``; the best match
   is a masked max, ``soft_cluster`` uses the weights and a Gram matrix instead of per-choice vectors
   (:mod:`.batched`, scored by :func:`~walklens.lab.concepts.similarity.batched_scores`, the runner's scorer too).
   Bit-identical layers (``E`` = hidden state 0 without absolute positions) and encodings that cut every
   item identically are computed once.
4. **Test 1** still needs a model pass per (concept sequence, ending): the engine's
   :func:`~..packing.packed_logliks` (context once per request, requests packed into shared forward passes).
   Shared across schemes: the segment vectors (from the bank) and identical concept sequences (a bit-exact
   memo, which collapses e.g. every SEGMENT_AGG/EXAMPLE_AGG of a one-segment zero-shot context).  What
   remains is one such call per distinct concept sequence and item.

Items are cut by every encoding scheme once (:mod:`.plan`); :mod:`.run` drives the whole (Test 2 planned and
run by :mod:`.similarity`, Test 1 by :mod:`.generation`, each shard named by its key, :mod:`.keys`) and stores each
group as it is computed in the sweep tables of the run database (:class:`~walklens.lab.hellaswag.store.SweepStore`: a
million
schemes are a few thousand rows).  Everything that computes is a shard fixed before any runs (:mod:`.shards`),
run in this process or on Ray actors (:mod:`walklens.core.backends`) with the same bits either way; a bundle's
groups are written in one transaction, so a killed sweep resumes at the first unstored group and the final
table is identical to an uninterrupted run.
"""

from __future__ import annotations

from .bank import NormedBank, build_bank, layer_keys
from .batched import EncLayout, test1_predictions, test2_bundle_batched
from .generation import TEST1_SHARD_ITEMS, evaluate_test1
from .keys import BlockKey, BundleKey, Test1ShardKey, Test2ShardKey
from .plan import ItemPlan, plan_item
from .run import SweepOutcome, SweepSpec, run_sweep, sweep_baseline
from .similarity import evaluate_test2
from .sink import Sink, Tally

__all__ = [
    "TEST1_SHARD_ITEMS",
    "BlockKey",
    "BundleKey",
    "EncLayout",
    "ItemPlan",
    "NormedBank",
    "Sink",
    "SweepOutcome",
    "SweepSpec",
    "Tally",
    "Test1ShardKey",
    "Test2ShardKey",
    "build_bank",
    "evaluate_test1",
    "evaluate_test2",
    "layer_keys",
    "plan_item",
    "run_sweep",
    "sweep_baseline",
    "test1_predictions",
    "test2_bundle_batched",
]
