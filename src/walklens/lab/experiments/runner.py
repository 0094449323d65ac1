"""Running a test over HellaSwag items: few-shot contexts, resume from the store, progress bar, summaries and
normalised scores (seed 000, sec. 5.1: "The scores shown are normalized by the model's baseline hellaswag
score").

``normalised = acc(test) / acc(baseline)`` on the same items, model and shots (likewise for ``acc_norm``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from ...analyses.concepts.schemes import Scheme
from ...base.display import Shown
from ...base.errors import InputError
from ...base.frames import Columns, DataFrame, frame, pick, record_table
from ...core.scoring.encode import arch_of
from ..concepts.generation import test1_items
from ..concepts.similarity import test2_item
from ..hellaswag.baseline import accuracy, baseline_items
from ..hellaswag.data import HellaswagItem
from ..hellaswag.store import ItemResult, RunKey
from .runsetup import RunSetup

if TYPE_CHECKING:
    from ...analyses.concepts.cache import ConceptCache
    from ...core.loading import LoadedModel
    from ..concepts.controls import Control

TESTS = ("baseline", "test1", "test2")
BASELINE_SCHEME = "baseline"


@dataclass
class RunSummary(Shown, view="run"):
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
            return {
                **key,
                "item": r.item,
                "gold": r.gold,
                "pred": r.pred,
                "pred_norm": r.pred_norm,
                "correct": r.pred == r.gold,
                "correct_norm": r.pred_norm == r.gold,
                **{f"score_{j}": (r.scores[j] if j < len(r.scores) else None) for j in range(width)},
            }

        names = [
            *key,
            "item",
            "gold",
            "pred",
            "pred_norm",
            "correct",
            "correct_norm",
            *(f"score_{j}" for j in range(width)),
        ]
        return pick(
            table,
            {
                "items": lambda: record_table([item(r) for r in self.results], names),
                "run": lambda: record_table(
                    [{**key, "n": self.n, "computed": self.computed, "acc": self.acc, "acc_norm": self.acc_norm}]
                ),
            },
            "a RunSummary",
        )

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


def progress_bar(**kw: Any) -> tqdm[Any]:
    """A tqdm progress bar on stderr (the runner's and the sweep's)."""
    return tqdm(file=sys.stderr, dynamic_ncols=True, **kw)


#: Scores a chunk of items with their few-shot examples: ``fn(lm, items, examples, cache)``, reading and writing
#: segment vectors in the concept ``cache`` where the test uses one.
BatchFn = Callable[
    ["LoadedModel", Sequence[HellaswagItem], Sequence[Sequence[HellaswagItem]], "ConceptCache | None"], list[ItemResult]
]

#: Items scored together by one call of a scorer's batch function (and committed to the store together).
CHUNK = 128


@dataclass(frozen=True)
class Scorer:
    """What the runner runs over items: the test's name and the scheme's name in the store key
    (:class:`~walklens.lab.hellaswag.store.RunKey`), and the function scoring a chunk of items (:data:`BatchFn`).
    The baseline, Test 1 and Test 2 (:func:`scorer`) and compaction
    (:func:`~walklens.lab.experiments.compaction.compact_scorer`) each provide one."""

    test: str
    scheme: str
    batch: BatchFn


def baseline_scorer() -> Scorer:
    """The lm-evaluation-harness baseline (sec. 5: ``acc``/``acc_norm``), its chunks packed
    (:mod:`walklens.core.scoring.packing`); stored under scheme ``baseline``."""
    return Scorer(
        test="baseline",
        scheme=BASELINE_SCHEME,
        batch=lambda lm, items, examples, cache: baseline_items(lm, items, examples),
    )


def _key(scheme: Scheme, control: Control | None) -> str:
    return str(scheme) if control is None else control.key(str(scheme))


def test1_scorer(lm: LoadedModel, scheme: Scheme, control: Control | None = None) -> Scorer:
    """Test 1, pyramidal generation (sec. 5.1.1), with ``scheme`` checked for Test 1 on this model: the chunk's
    forward passes packed, its segment vectors read from and written to the concept cache.  With a ``control``
    (:mod:`walklens.lab.concepts.controls`) the same endings after the control's vectors, stored under its key."""
    scheme.validate(1, arch_of(lm))
    return Scorer(
        test="test1",
        scheme=_key(scheme, control),
        batch=lambda lm, items, examples, cache: test1_items(lm, items, examples, scheme, cache, control),
    )


def test2_scorer(lm: LoadedModel, scheme: Scheme, control: Control | None = None) -> Scorer:
    """Test 2, concept similarity (sec. 5.1.2), with ``scheme`` checked for Test 2 on this model: item by item
    (a ``control``'s vectors in place of the context's, as for Test 1)."""
    scheme.validate(2, arch_of(lm))
    return Scorer(
        test="test2",
        scheme=_key(scheme, control),
        batch=lambda lm, items, examples, cache: [
            test2_item(lm, it, ex, scheme, control) for it, ex in zip(items, examples)
        ],
    )


def scorer(lm: LoadedModel, test: str, scheme: Scheme | None = None, control: Control | None = None) -> Scorer:
    """The scorer of ``test`` (one of :data:`TESTS`; Test 1 and Test 2 need a ``scheme``, and take a
    ``control``)."""
    if test == "baseline":
        return baseline_scorer()
    if test not in TESTS:
        raise InputError(f"unknown test {test!r}; use one of {TESTS}")
    if scheme is None:
        raise InputError(f"{test} needs a scheme")
    return test1_scorer(lm, scheme, control) if test == "test1" else test2_scorer(lm, scheme, control)


def run_test(
    lm: LoadedModel,
    items: Sequence[HellaswagItem],
    scorer: Scorer,
    setup: RunSetup = RunSetup(),
    *,
    desc: str | None = None,
) -> RunSummary:
    """Run ``scorer`` (:func:`scorer`: the baseline, Test 1 or Test 2; or compaction's) on ``items``.

    With a results store (``setup.store``), items already stored under the same key (:meth:`RunSetup.run_key`:
    model, data, split, shots, the scorer's test and scheme) are read back instead of recomputed, each chunk of new
    items (:data:`CHUNK`) is committed as soon as it is scored, and the run's summary row is updated at the end;
    an interrupted run therefore resumes where it stopped.  Few-shot examples come from ``setup.pool`` (default:
    ``items``); ``setup.cache`` is the concept cache the scorer reads and writes
    (:mod:`walklens.analyses.concepts.cache`).
    """
    store = setup.store
    setup = setup.with_pool(items)
    key = setup.run_key(lm.name, items, scorer.test, scorer.scheme)
    stored = store.results(key, [it.index for it in items]) if store is not None else {}
    todo = [it for it in items if it.index not in stored]
    computed = 0
    bar = progress_bar(
        total=len(todo), desc=desc or f"{lm.name} {scorer.test}", unit="item", disable=not setup.progress or not todo
    )
    try:
        with torch.inference_mode():
            for start in range(0, len(todo), CHUNK):
                chunk = todo[start : start + CHUNK]
                rs = scorer.batch(lm, chunk, setup.examples(chunk), setup.cache)
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
