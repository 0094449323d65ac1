"""Running a test over HellaSwag items: few-shot contexts, resume from the store, progress bar, summaries and
normalised scores (seed 000, sec. 5.1: "The scores shown are normalized by the model's baseline hellaswag
score").

``normalised = acc(test) / acc(baseline)`` on the same items, model and shots (likewise for ``acc_norm``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from tqdm.auto import tqdm

from ..errors import InputError
from ..frames import Columns, DataFrame, frame, pick, record_table
from ..hellaswag.baseline import accuracy, baseline_items
from ..hellaswag.data import FEWSHOT_SEED, HellaswagItem, fewshot_examples
from ..hellaswag.encode import arch_of
from ..concepts.schemes import Scheme
from ..hellaswag.store import ItemResult, ResultStore, RunKey
from ..concepts.generation import test1_items
from ..concepts.similarity import test2_item

if TYPE_CHECKING:
    from ..loading import LoadedModel

TESTS = ("baseline", "test1", "test2")
BASELINE_SCHEME = "baseline"


@dataclass
class RunSummary:
    """The outcome of one run over ``items`` (in the order given): accuracies and per-item results."""

    key: RunKey
    results: list[ItemResult]
    computed: int = 0  # items computed in this call (the rest came from the store)
    acc: float | None = None
    acc_norm: float | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.results)

    @property
    def predictions(self) -> list[dict[str, int]]:
        """Per item, the ending picked by each metric: ``{"acc": i, "acc_norm": j}``."""
        return [{"acc": r.pred, "acc_norm": r.pred_norm} for r in self.results]

    def _columns(self, table: str = "items") -> Columns:
        """The plain columns of :meth:`to_pandas`."""
        key = {k: getattr(self.key, k) for k in ("model", "data", "split", "shots", "test", "scheme")}
        width = max((len(r.scores) for r in self.results), default=0)

        def item(r: ItemResult) -> dict[str, Any]:
            return {**key, "item": r.item, "gold": r.gold, "pred": r.pred, "pred_norm": r.pred_norm,
                    "correct": r.pred == r.gold, "correct_norm": r.pred_norm == r.gold,
                    **{f"score_{j}": (r.scores[j] if j < len(r.scores) else None) for j in range(width)}}

        names = [*key, "item", "gold", "pred", "pred_norm", "correct", "correct_norm",
                 *(f"score_{j}" for j in range(width))]
        return pick(table, {
            "items": lambda: record_table([item(r) for r in self.results], names),
            "run": lambda: record_table([{**key, "n": self.n, "computed": self.computed, "acc": self.acc,
                                          "acc_norm": self.acc_norm}])}, "a RunSummary")

    def to_pandas(self, table: str = "items") -> DataFrame:
        """The run as tables (pandas; docs/notebooks.md, "Tables"): ``items`` one row per item (the run's key,
        gold ending, picks by ``acc`` and ``acc_norm``, whether each is right, the four scores ``score_i``);
        ``run`` one row of accuracies."""
        return frame(self._columns(table), {"extra": dict(self.extra)})


def normalised(test: float | None, base: float | None) -> float | None:
    """Test accuracy / baseline accuracy (None when the baseline is 0 or missing)."""
    if test is None or not base:
        return None
    return test / base


def progress_bar(**kw: Any) -> tqdm:
    """A tqdm progress bar on stderr (the runner's and the sweep's)."""
    return tqdm(file=sys.stderr, dynamic_ncols=True, **kw)


BatchFn = Callable[["LoadedModel", Sequence[HellaswagItem], Sequence[Sequence[HellaswagItem]]], list[ItemResult]]

#: Items scored together by one call of a test's batch function (and committed to the store together).
CHUNK = 128


def _batch_fn(test: str, scheme: Scheme | None, cache: Any = None) -> BatchFn:
    """The function scoring a chunk of items (with their few-shot examples) for ``test``: the baseline and
    Test 1 pack the chunk's forward passes (:mod:`.packing`; Test 1 reads and writes its segment vectors in the
    concept ``cache`` when given); Test 2 runs item by item."""
    if test == "baseline":
        return baseline_items
    if scheme is None:
        raise InputError(f"{test} needs a scheme")
    if test == "test1":
        return lambda lm, its, exs: test1_items(lm, its, exs, scheme, cache)
    if test == "test2":
        return lambda lm, its, exs: [test2_item(lm, it, ex, scheme) for it, ex in zip(its, exs)]
    raise InputError(f"unknown test {test!r}; use one of {TESTS}")


def run_key(model: str, items: Sequence[HellaswagItem], *, test: str, scheme: Scheme | None = None, shots: int = 0,
            data: str = "", fewshot_seed: int = FEWSHOT_SEED) -> RunKey:
    """The store key of a run of ``test`` over ``items`` (the few-shot seed is part of the data key unless it is
    the default)."""
    split = items[0].split if items else "validation"
    scheme_key = BASELINE_SCHEME if test == "baseline" else str(scheme)
    data_key = data if fewshot_seed == FEWSHOT_SEED else f"{data}#seed={fewshot_seed}"
    return RunKey(model=model, data=data_key, split=split, shots=int(shots), test=test, scheme=scheme_key)


def run_test(lm: "LoadedModel", items: Sequence[HellaswagItem], *, test: str, scheme: Scheme | None = None,
             shots: int = 0, pool: Sequence[HellaswagItem] | None = None, data: str = "",
             store: ResultStore | None = None, fewshot_seed: int = FEWSHOT_SEED, progress: bool = True,
             desc: str | None = None, cache: Any = None, batch_fn: BatchFn | None = None) -> RunSummary:
    """Run ``test`` (``baseline``, ``test1`` or ``test2``) on ``items``.

    ``pool``: where few-shot examples come from (default: ``items``); ``data``: the data source id used in the
    store key.  With a ``store``, items already stored for the same (model, data, split, shots, test, scheme)
    are read back instead of recomputed, each chunk of new items (:data:`CHUNK`) is committed as soon as it is
    scored, and the run's summary row is updated at the end; an interrupted run therefore resumes where it
    stopped.  ``cache``: the concept cache Test 1 uses (:mod:`walklens.concepts.cache`).  ``batch_fn``: score
    the items with this function instead of a test's own (another ``test`` name, e.g. ``compact``; the store key
    then holds ``str(scheme)``).
    """
    if test not in TESTS and batch_fn is None:
        raise InputError(f"unknown test {test!r}; use one of {TESTS}")
    if test in ("test1", "test2"):
        if scheme is None:
            raise InputError(f"{test} needs a scheme")
        scheme.validate(1 if test == "test1" else 2, arch_of(lm))
    key = run_key(lm.name, items, test=test, scheme=scheme, shots=shots, data=data, fewshot_seed=fewshot_seed)
    stored = store.results(key, [it.index for it in items]) if store is not None else {}
    fn = batch_fn if batch_fn is not None else _batch_fn(test, scheme, cache)
    pool = items if pool is None else pool
    todo = [it for it in items if it.index not in stored]
    computed = 0
    bar = progress_bar(total=len(todo), desc=desc or f"{lm.name} {test}", unit="item", disable=not progress or not todo)
    try:
        with torch.inference_mode():
            for start in range(0, len(todo), CHUNK):
                chunk = todo[start:start + CHUNK]
                exs = [fewshot_examples(pool, shots, it.index, seed=fewshot_seed, query_split=it.split)
                       if shots else [] for it in chunk]
                rs = fn(lm, chunk, exs)
                for r in rs:
                    stored[r.item] = r
                if store is not None:
                    store.add_results(key, rs)
                computed += len(rs)
                bar.update(len(rs))
    finally:
        bar.close()
    results = [stored[it.index] for it in items]
    acc, acc_norm = accuracy(results)
    if store is not None:
        store.record_run(key, len(results), acc, acc_norm)
    return RunSummary(key=key, results=results, computed=computed, acc=acc, acc_norm=acc_norm)
