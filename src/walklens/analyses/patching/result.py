"""A patching grid as one plain result: the grid, its references, its parity card, its table and its JSON document.
The document (:meth:`PatchResult.document`) is what every view reads: ``--json``, the report's heatmap and the
notebook (:mod:`walklens.reports.patching`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...base.display import Shown
from ...base.frames import Columns, DataFrame, frame, pick
from ...base.outputs import jsonable

#: parity card thresholds: attribution patching disagrees with exact patching beyond these (docs/patching.md)
MIN_SPEARMAN = 0.8
MIN_TOPK_OVERLAP = 0.6
TOP_K = 5


@dataclass(frozen=True)
class AttributionParity:
    """Attribution patching against exact patching on the same cells (per point kind and over all): Spearman's rank
    correlation of the normalised grids, the share of exact patching's top-k cells (by |value - base|) that
    attribution's top-k holds, and whether either is under its threshold (:data:`MIN_SPEARMAN`,
    :data:`MIN_TOPK_OVERLAP`)."""

    spearman: float
    topk_overlap: float
    k: int
    cells: int
    by_kind: dict[str, dict[str, float]] = field(default_factory=dict)
    min_spearman: float = MIN_SPEARMAN
    min_topk_overlap: float = MIN_TOPK_OVERLAP

    @property
    def agrees(self) -> bool:
        """Whether attribution patching stays within both thresholds (a NaN correlation does not)."""
        return bool(self.spearman >= self.min_spearman and self.topk_overlap >= self.min_topk_overlap)


@dataclass(frozen=True)
class PatchResult(Shown, view="patching"):
    """A [points x positions] grid of a patched metric, normalised so the clean run is 1 and the corrupted run 0
    (``values``; ``raw``: the metric itself), with both references.  ``direction``: ``denoise`` (the corrupted run
    with one clean vector) or ``noise`` (the clean run with one corrupted vector).  ``method``: ``exact`` (one patched
    forward pass per cell), ``attribution`` (activation difference x gradient; its ``parity`` card compares it with
    exact patching when measured) or ``path`` (path patching: ``sender``'s change reaches each receiver, a row, alone;
    the columns are the positions of its change).  ``passes``: the forward passes run (batched),
    ``forward_equivalents``: their layer work in whole single-sequence forward passes."""

    model_name: str
    metric: str
    direction: str
    method: str
    points: list[str]
    positions: list[int]
    tokens: list[str]
    clean_tokens: list[str]
    values: np.ndarray
    raw: np.ndarray
    clean_metric: float
    corrupted_metric: float
    answer_position: int
    passes: int = 0
    forward_equivalents: float = 0.0
    parity: AttributionParity | None = None
    notes: list[str] = field(default_factory=list)
    sender: str | None = None

    def _headline(self) -> str:
        return (
            f"{self.method} patching ({self.direction}) of {self.model_name}: {len(self.points)} points x "
            f"{len(self.positions)} positions, {self.metric}"
        )

    def cell(self, point: str, position: int) -> float:
        """The normalised value of one cell."""
        return float(self.values[self.points.index(point), self.positions.index(position)])

    def document(self) -> dict[str, Any]:
        """The result as one JSON document (every view reads this)."""
        return {
            "kind": "patching",
            "model": self.model_name,
            "metric": self.metric,
            "direction": self.direction,
            "method": self.method,
            "points": list(self.points),
            "positions": [int(p) for p in self.positions],
            "tokens": list(self.tokens),
            "clean_tokens": list(self.clean_tokens),
            "values": jsonable(np.asarray(self.values, dtype=float)),
            "raw": jsonable(np.asarray(self.raw, dtype=float)),
            "clean_metric": self.clean_metric,
            "corrupted_metric": self.corrupted_metric,
            "answer_position": self.answer_position,
            "passes": self.passes,
            "forward_equivalents": self.forward_equivalents,
            "parity": None if self.parity is None else {**jsonable(self.parity), "agrees": self.parity.agrees},
            "notes": list(self.notes),
            "sender": self.sender,
        }

    def _columns(self, table: str = "cells") -> Columns:
        def cells() -> Columns:
            P, N = len(self.points), len(self.positions)
            return {
                "point": [p for p in self.points for _ in range(N)],
                "position": [int(q) for _ in range(P) for q in self.positions],
                "token": [self.tokens[j] for _ in range(P) for j in range(N)],
                "value": np.asarray(self.values, dtype=float).reshape(-1),
                "raw": np.asarray(self.raw, dtype=float).reshape(-1),
            }

        return pick(table, {"cells": cells}, "a PatchResult")

    def to_pandas(self, table: str = "cells") -> DataFrame:
        """One row per cell: point, position, token, value (normalised) and raw (the metric)."""
        attrs = {"model": self.model_name, "metric": self.metric, "direction": self.direction, "method": self.method}
        return frame(self._columns(table), attrs)


__all__ = ["PatchResult", "AttributionParity", "MIN_SPEARMAN", "MIN_TOPK_OVERLAP", "TOP_K"]
