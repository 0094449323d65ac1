"""The position kernels' result types (seed 000, A.2): :class:`StackKernels` (the kernels of one stack with their
self-bias classes) and :class:`PositionKernels` (every stack of a model, and its tables)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ...base.display import Shown
from ...base.errors import find
from ...base.frames import Columns, DataFrame, concat_columns, frame, long_table, pick, record_table
from .classes import CLASSES, LABELS, MARGIN_SWEEP, KernelClass, classify_kernel


@dataclass
class StackKernels:
    """Kernels of one stack: ``values`` [K, H, n] at ``distances`` (key - query), one row per entry of
    ``layers`` (``None``: one kernel shared by every layer).  ``log_values`` are the logit-unit kernels the
    classes use; ``spread``/``ci95`` (empirical only) the std over samples and 95% CI half-width."""

    stack: str
    causal: bool
    distances: list[int]
    layers: list[int | None]
    values: torch.Tensor
    log_values: torch.Tensor
    spread: torch.Tensor | None = None
    ci95: torch.Tensor | None = None
    classes: list[list[KernelClass]] = field(default_factory=list)
    #: empirical only: the per-sample kernels [N, K, H, n] the mean, spread and self-bias tests come from
    samples: torch.Tensor | None = field(default=None, repr=False)
    #: empirical only: rows renormalised without key 0 (the attention-sink control)
    sink_removed: bool = False

    @property
    def n_heads(self) -> int:
        return self.values.shape[1]

    def fractions(self, margin: float | None = None) -> dict[str, float]:
        """Fraction of kernels (layer x head) with each flag, and per label."""
        cls = self.classes if margin is None else self._classify(margin)
        flat = [c for row in cls for c in row]
        n = max(len(flat), 1)
        out = {k: sum(getattr(c, k) for c in flat) / n for k in CLASSES}
        for lab in LABELS.values():
            out[f"label: {lab}"] = sum(c.label == lab for c in flat) / n
        return out

    def _classify(self, margin: float) -> list[list[KernelClass]]:
        return [
            [classify_kernel(self.log_values[r, h], self.distances, margin) for h in range(self.n_heads)]
            for r in range(self.values.shape[0])
        ]

    def classify(self, margin: float) -> None:
        self.classes = self._classify(margin)

    def kernel(self, head: int, layer: int | None = None) -> torch.Tensor:
        """The kernel of one head (of ``layer`` for per-layer kernels)."""
        row = 0 if self.layers == [None] else self.layers.index(layer if layer is not None else self.layers[0])
        return self.values[row, head]


@dataclass
class PositionKernels(Shown, view="kernels"):
    """Position kernels of a model, per stack, with their self-bias classes (seed 000, A.2)."""

    model_name: str
    scheme: str
    units: str
    estimator: str
    margin: float
    stacks: list[StackKernels]
    notes: str = ""
    alibi_slopes: torch.Tensor | None = None
    alibi_scale: float | None = None

    def stack(self, name: str) -> StackKernels:
        return find(
            self.stacks, lambda s: s.stack == name, f"no stack {name!r}; stacks: {[s.stack for s in self.stacks]}"
        )

    def fractions(self, margin: float | None = None) -> dict[str, dict[str, float]]:
        """Per stack: fraction of kernels in each class (at ``margin``, default the one used)."""
        return {s.stack or "model": s.fractions(margin) for s in self.stacks}

    def margin_sweep(self, margins: Sequence[float] = MARGIN_SWEEP) -> dict[str, dict[str, dict[str, float]]]:
        """Fractions of negative-self-bias and far-amplifying kernels per stack for several margins."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for s in self.stacks:
            out[s.stack or "model"] = {
                f"{m:g}": {k: v for k, v in s.fractions(m).items() if k in ("negative_self", "far_amplifying")}
                for m in margins
            }
        return out

    def _columns(self, table: str = "kernels") -> Columns:
        """The plain columns of :meth:`to_pandas`."""
        return pick(
            table,
            {
                "kernels": lambda: _kernel_columns(self.stacks),
                "classes": lambda: _class_columns(self.stacks),
                "fractions": lambda: _fraction_columns(self.stacks, self.margin),
                "margin_sweep": lambda: _margin_sweep_columns(self.stacks),
                "alibi": lambda: _alibi_columns(self.alibi_slopes),
            },
            "PositionKernels",
        )

    def to_pandas(self, table: str = "kernels") -> DataFrame:
        """The kernels as tables (pandas; docs/notebooks.md, "Tables"): ``kernels`` one row per (stack, layer,
        head, distance) (``layer`` missing for a kernel every layer shares); ``classes`` the self-bias classes
        per (stack, layer, head); ``fractions`` (at this margin) and ``margin_sweep`` the fractions per class;
        ``alibi`` the ALiBi slopes per head."""
        return frame(
            self._columns(table),
            {
                "model": self.model_name,
                "scheme": self.scheme,
                "units": self.units,
                "estimator": self.estimator,
                "margin": self.margin,
                "notes": self.notes,
                "alibi_scale": self.alibi_scale,
            },
        )


def _kernel_columns(stacks: list[StackKernels]) -> Columns:
    """The ``kernels`` table: one row per (stack, layer, head, distance)."""
    parts = []
    for s in stacks:
        cells = {"value": s.values.float(), "log_value": s.log_values.float()}
        for name in ("spread", "ci95"):
            t = getattr(s, name)
            cells[name] = t.float() if t is not None else torch.full(tuple(s.values.shape), math.nan)
        parts.append(
            long_table(
                [("layer", list(s.layers)), ("head", range(s.n_heads)), ("distance", list(s.distances))],
                cells,
                constants={"stack": s.stack, "causal": s.causal},
            )
        )
    return concat_columns(parts)


def _class_columns(stacks: list[StackKernels]) -> Columns:
    """The ``classes`` table: the self-bias flags and label per (stack, layer, head)."""
    return record_table(
        [
            {
                "stack": s.stack,
                "layer": layer,
                "head": h,
                **{k: getattr(c, k) for k in CLASSES},
                "label": c.label,
            }
            for s in stacks
            for layer, row in zip(s.layers, s.classes)
            for h, c in enumerate(row)
        ]
    )


def _fraction_columns(stacks: list[StackKernels], margin: float) -> Columns:
    """The ``fractions`` table: the fraction of kernels in each class per stack, at ``margin`` (the one used)."""
    return record_table(
        [
            {"stack": s.stack, "margin": margin, "name": k, "fraction": v}
            for s in stacks
            for k, v in s.fractions().items()
        ]
    )


def _margin_sweep_columns(stacks: list[StackKernels]) -> Columns:
    """The ``margin_sweep`` table: the negative-self-bias and far-amplifying fractions per stack and margin."""
    return record_table(
        [
            {"stack": s.stack, "margin": float(m), "name": k, "fraction": v}
            for s in stacks
            for m in MARGIN_SWEEP
            for k, v in s.fractions(m).items()
            if k in ("negative_self", "far_amplifying")
        ]
    )


def _alibi_columns(alibi_slopes: torch.Tensor | None) -> Columns:
    """The ``alibi`` table: the ALiBi slope per head (none for other schemes)."""
    slopes = alibi_slopes if alibi_slopes is not None else torch.zeros(0)
    return long_table([("head", range(len(slopes)))], {"slope": slopes.float()})
