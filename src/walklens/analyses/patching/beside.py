"""The walk beside the test: for one prompt, the layer where the answer first becomes the top token of the last
position's encoding walk, beside the layer where restoring the clean residual entering a layer at the last position
restores the answer (activation patching of ``resid_pre``, denoising).  One result, one document; the view is
:func:`walklens.reports.patching.add_beside`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ...base.display import Shown
from ...base.errors import InputError
from ...base.frames import DataFrame, frame
from ...base.outputs import jsonable
from ...core.capture import capture
from ..walks import encoding_walk
from ..walks.target import READING, TargetAnswer
from .exact import patch
from .result import PatchResult

if TYPE_CHECKING:
    from ...core.loading import LoadedModel

#: the levels of restoration the view marks (the first layer restoring at least this share of the clean metric)
LEVELS = (0.5, 0.9)


@dataclass(frozen=True)
class WalkBeside(Shown, view="walk_beside"):
    """The answer through the clean prompt's walk at its last position (``walks``: one
    :class:`~walklens.analyses.walks.target.TargetAnswer` per reading) beside the activation patching grid of
    ``resid_pre`` at every layer (``patch``: clean 1, corrupted 0; its column at the last position is the
    restoration curve)."""

    model_name: str
    clean: str
    corrupted: str
    answer: str
    other: str
    walks: list[TargetAnswer]
    patch: PatchResult

    def _headline(self) -> str:
        return f"{self.model_name}: {self.answer!r} vs {self.other!r}, {len(self.layers)} layers"

    @property
    def layers(self) -> list[int]:
        """The layers of the grid's rows (``L{l}.resid_pre``)."""
        return [int(p.split(".")[0][1:]) for p in self.patch.points]

    @property
    def position(self) -> int:
        """The last position of the corrupted prompt (the grid's column read as the restoration curve)."""
        return self.patch.answer_position

    def restored(self, raw: bool = False) -> list[float]:
        """The normalised value (``raw``: the metric) of restoring each layer's input at the last position."""
        grid = self.patch.raw if raw else self.patch.values
        return [float(v) for v in np.asarray(grid)[:, self.patch.positions.index(self.position)]]

    def first_restored(self, level: float) -> int | None:
        """The first layer whose restoration reaches ``level`` (None: none does)."""
        return next((lay for lay, v in zip(self.layers, self.restored()) if v >= level), None)

    def layer_ranks(self, walk: TargetAnswer) -> list[int | None]:
        """The answer's rank in ``walk`` at each layer's input (``L{l}.resid_pre``: the vector the grid restores)."""
        at = {p: r for p, r in zip(walk.points, walk.ranks)}
        return [at.get(f"L{lay}.resid_pre") for lay in self.layers]

    def document(self) -> dict[str, Any]:
        """The result as one JSON document (every view reads this)."""
        return {
            "kind": "walk_beside",
            "model": self.model_name,
            "clean": self.clean,
            "corrupted": self.corrupted,
            "answer": self.answer,
            "other": self.other,
            "metric": self.patch.metric,
            "layers": self.layers,
            "position": self.position,
            "restored": self.restored(),
            "restored_raw": self.restored(raw=True),
            "levels": [{"level": lv, "layer": self.first_restored(lv)} for lv in LEVELS],
            "readings": [
                {
                    "reading": w.reading,
                    "name": READING.get(w.reading, w.reading),
                    "point": w.point,
                    "layer": w.layer,
                    "ranks": self.layer_ranks(w),
                }
                for w in self.walks
            ],
            "walks": [jsonable(w) for w in self.walks],
            "patch": self.patch.document(),
        }

    def to_pandas(self) -> DataFrame:
        """One row per layer: ``layer``, ``restored`` (clean 1, corrupted 0), ``raw`` (the metric) and the answer's
        rank at the layer's input in each reading (``rank_none``, ``rank_final``)."""
        cols: dict[str, Any] = {"layer": self.layers, "restored": self.restored(), "raw": self.restored(raw=True)}
        for w in self.walks:
            cols[f"rank_{w.reading}"] = self.layer_ranks(w)
        return frame(cols, {"model": self.model_name, "answer": self.answer, "metric": self.patch.metric})


def walk_beside_patch(
    lm: LoadedModel,
    clean: str,
    corrupted: str,
    answer: str,
    other: str,
    *,
    positions: Sequence[int] | None = None,
    readings: Sequence[Literal["none", "final"]] = ("none", "final"),
    batch: int | None = None,
) -> WalkBeside:
    """The encoding walk of ``clean`` read for ``answer`` at its last position (each of ``readings``: ``none`` raw,
    ``final`` the logit lens) beside activation patching of ``resid_pre`` at every layer (denoising, metric
    ``logitdiff:answer,other``) at ``positions`` of ``corrupted`` (default every one; the last is always in)."""
    if not readings:
        raise InputError("give at least one reading of the walk: none, final")
    bad = [r for r in readings if r not in ("none", "final")]
    if bad:
        raise InputError(f"reading {bad[0]!r}: give none (raw) or final (the logit lens)")
    tr = capture(lm, clean)
    walks = []
    for norm in readings:
        w = encoding_walk(tr, norm=norm, target=answer, progress=False)
        walks.append(w.first_top(answer))
    T = len(tr.tokens)
    pos = None if positions is None else sorted({int(p) + T if int(p) < 0 else int(p) for p in positions} | {T - 1})
    metric = f"logitdiff:{answer!r},{other!r}"
    r = patch(lm, clean, corrupted, points="resid_pre", positions=pos, metric=metric, batch=batch)
    return WalkBeside(lm.name, clean, corrupted, answer, other, walks, r)


__all__ = ["LEVELS", "WalkBeside", "walk_beside_patch"]
