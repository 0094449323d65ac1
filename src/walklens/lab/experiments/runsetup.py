"""What a run over HellaSwag items runs with, beside the model, the items and what it scores (seed 000, sec. 5.1):
the few-shot contexts (``k`` examples drawn from a pool with a seed, as lm-evaluation-harness draws them), the
data id of the store key, the results store, the concept cache, the workers and the progress bars.

One :class:`RunSetup` travels through the runner (:func:`~.runner.run_test`), compaction's runs
(:func:`~.compaction.compact_run`, :func:`~.curves.run_curves`) and the sweep (:func:`~.sweep.run_sweep`), so a
new run option is one field here.  The few-shot seed's default is :data:`~walklens.lab.hellaswag.data.FEWSHOT_SEED`,
here only; a run with another seed is stored under the data key ``DATA#seed=S``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..hellaswag.data import FEWSHOT_SEED, HellaswagItem, fewshot_examples
from ..hellaswag.store import ResultStore, RunKey

if TYPE_CHECKING:
    from ...analyses.concepts.cache import ConceptCache
    from ...core.backends import Workers


@dataclass(frozen=True)
class RunSetup:
    """The settings and resources of a run (module docstring).

    ``pool``: where few-shot examples come from (None: the run's own items); ``data``: the data source id in the
    store key (:func:`~walklens.lab.hellaswag.data.data_id`); ``store``: the results database a run resumes from and
    writes to (None: none; a sweep needs one); ``cache``: the concept cache of segment vectors (Test 1, the
    sweep's bank, compaction); ``workers``: where a sweep's shards run (None: this process; the runner always
    scores in this process)."""

    shots: int = 0
    pool: Sequence[HellaswagItem] | None = None
    fewshot_seed: int = FEWSHOT_SEED
    data: str = ""
    store: ResultStore | None = None
    cache: ConceptCache | None = None
    workers: Workers | None = None
    progress: bool = True
    pool_kind: str = "validation"  # the few-shot pool: validation (the whole file) or reserved (a partition)

    @property
    def data_key(self) -> str:
        """The data column of the store key: ``data``, with ``#seed=S`` unless the seed is the default and
        ``#pool=reserved`` for few-shot examples from the reserved pool (never resumed from another pool's rows)."""
        key = self.data if self.fewshot_seed == FEWSHOT_SEED else f"{self.data}#seed={self.fewshot_seed}"
        return key + ("#pool=reserved" if self.shots and self.pool_kind == "reserved" else "")

    def run_key(self, model: str, items: Sequence[HellaswagItem], test: str, scheme: str) -> RunKey:
        """The store key of a run of ``test`` (scheme name ``scheme``) of ``model`` over ``items``."""
        split = items[0].split if items else "validation"
        return RunKey(model=model, data=self.data_key, split=split, shots=int(self.shots), test=test, scheme=scheme)

    def with_pool(self, items: Sequence[HellaswagItem]) -> RunSetup:
        """This setup with its pool fixed: ``items`` when it has none."""
        return self if self.pool is not None else replace(self, pool=list(items))

    def examples(self, items: Sequence[HellaswagItem]) -> list[list[HellaswagItem]]:
        """Each item's few-shot examples (none zero-shot), drawn from the pool (``items`` when there is none)."""
        if not self.shots:
            return [[] for _ in items]
        pool = items if self.pool is None else self.pool
        return [
            fewshot_examples(pool, self.shots, it.index, seed=self.fewshot_seed, query_split=it.split) for it in items
        ]


__all__ = ["RunSetup"]
