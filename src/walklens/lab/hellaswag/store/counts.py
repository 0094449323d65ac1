"""The item partition of the honest-best estimates and per-cell hit counts (:mod:`walklens.lab.experiments.stats`).

Items are cut into ``k`` folds crossed with halves A/B (:class:`Cells`); a sweep's stored picks reduce to one
hit count per scheme and cell (:class:`Counts`), from which every held-out estimate is computed.  The store
(:meth:`~.sweeps.SweepStore.load_counts`) builds the table straight from its packed predictions, so this
module sits beside it and knows nothing of schemes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: correctness entries (schemes x items) reduced per matrix product in :func:`count_cells` (bounds its memory)
BLOCK_ELEMS = 1 << 22


def split_items(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A fixed random split of ``n`` items into halves A and B (item positions)."""
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[: n // 2]), np.sort(perm[n // 2 :])


def kfold_folds(n: int, k: int, seed: int = 0) -> list[np.ndarray]:
    """``k`` folds of ``n`` items from the same seeded permutation as :func:`split_items`."""
    perm = np.random.default_rng(seed).permutation(n)
    return [np.sort(f) for f in np.array_split(perm, k)]


@dataclass(frozen=True)
class Cells:
    """Items cut into ``k`` folds (:func:`kfold_folds`) crossed with halves A/B (:func:`split_items`):
    ``cell[i] = 2 * fold + half``.  Fold and half totals are sums over cells, so one count per cell serves
    both held-out estimates."""

    n: int
    k: int
    seed: int
    cell: np.ndarray

    @classmethod
    def build(cls, n: int, k: int, seed: int = 0) -> Cells:
        if n < 1 or not 1 <= k <= n:
            raise ValueError(f"a partition of {n} items needs 1 <= k <= n, got k={k}")
        fold = np.empty(n, np.int64)
        for f, idx in enumerate(kfold_folds(n, k, seed)):
            fold[idx] = f
        half = np.ones(n, np.int64)
        half[split_items(n, seed)[0]] = 0
        return cls(n=n, k=k, seed=seed, cell=2 * fold + half)

    @property
    def n_cells(self) -> int:
        return 2 * self.k

    def sizes(self) -> np.ndarray:
        """Items per cell ``[2k]``."""
        return np.bincount(self.cell, minlength=self.n_cells)

    def onehot(self, dtype: type = np.float32) -> np.ndarray:
        """``[n, 2k]`` indicator of each item's cell."""
        m: np.ndarray = np.zeros((self.n, self.n_cells), dtype)
        m[np.arange(self.n), self.cell] = 1
        return m


def count_cells(correct: np.ndarray, cells: Cells, onehot: np.ndarray | None = None) -> np.ndarray:
    """Per-scheme hits per cell, int64 ``[S, 2k]``, of a boolean block ``correct[S, items]``.

    One matrix product with the cells' indicator per block of :data:`BLOCK_ELEMS` entries: float32 sums of
    0/1 are exact integers while every partial sum stays below 2^24 (float64 beyond that)."""
    S, n = correct.shape
    if n != cells.n:
        raise ValueError(f"correctness over {n} items, partition of {cells.n}")
    dt = np.float32 if n < (1 << 24) else np.float64
    oh = cells.onehot(dt) if onehot is None else onehot
    out = np.empty((S, cells.n_cells), np.int64)
    step = max(1, BLOCK_ELEMS // max(n, 1))
    for a in range(0, S, step):
        out[a : a + step] = np.rint(correct[a : a + step].astype(dt) @ oh)
    return out


def cell_counts(correct: np.ndarray, cells: Cells) -> Counts:
    """:class:`Counts` of a dense boolean ``correct[schemes, items]``."""
    return Counts(hits=count_cells(correct, cells), cells=cells)


@dataclass(frozen=True)
class Counts:
    """``hits[s, c]``: items of cell ``c`` that scheme ``s`` got right."""

    hits: np.ndarray
    cells: Cells

    @property
    def n_schemes(self) -> int:
        return int(self.hits.shape[0])

    def take(self, rows: np.ndarray | Sequence[int]) -> Counts:
        return Counts(hits=self.hits[np.asarray(rows, dtype=np.int64)], cells=self.cells)

    def totals(self) -> np.ndarray:
        return self.hits.sum(axis=1, dtype=np.int64)

    def by_fold(self) -> np.ndarray:
        """``[S, k]`` hits per fold."""
        return self.hits.reshape(-1, self.cells.k, 2).sum(axis=2, dtype=np.int64)

    def by_half(self) -> np.ndarray:
        """``[S, 2]`` hits on halves A and B."""
        return self.hits.reshape(-1, self.cells.k, 2).sum(axis=1, dtype=np.int64)
