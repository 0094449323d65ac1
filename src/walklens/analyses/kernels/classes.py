"""Self-bias classes of a position kernel (seed 000, A.2, Fig. 8): negative self-bias, far-amplifying, local and
flat, each a flag decided in logit units at a margin (the rules: :mod:`walklens.analyses.kernels`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ...base.errors import InputError

CLASSES = ("negative_self", "far_amplifying", "local", "flat")
LABELS = {
    "flat": "flat",
    "negative_self": "negative self-bias",
    "far_amplifying": "far-amplifying",
    "local": "local",
    "other": "other",
}
MARGIN_SWEEP = (0.0, 0.1, 0.25, 0.5, 1.0)


@dataclass(frozen=True)
class KernelClass:
    """Flags of one kernel (the rules: :mod:`walklens.analyses.kernels`) and its label."""

    negative_self: bool
    far_amplifying: bool
    local: bool
    flat: bool

    @property
    def label(self) -> str:
        for k in ("flat", "negative_self", "far_amplifying", "local"):
            if getattr(self, k):
                return LABELS[k]
        return LABELS["other"]


def _mean_at(k: torch.Tensor, sel: torch.Tensor) -> float | None:
    return float(k[sel].mean()) if bool(sel.any()) else None


def classify_kernel(values: torch.Tensor, distances: Sequence[int], margin: float = 0.1) -> KernelClass:
    """Classify one kernel given in logit units (``values[i]`` at ``distances[i] = key - query``)."""
    k = torch.as_tensor(values, dtype=torch.float64)
    dist = torch.as_tensor(list(distances), dtype=torch.long)
    if k.shape != dist.shape or not bool((dist == 0).any()):
        raise InputError("a kernel needs one value per distance, including distance 0")
    W = int(dist.abs().max())
    self_v = float(k[dist == 0][0])
    neigh = _mean_at(k, dist.abs() == 1)
    negative_self = neigh is not None and self_v < neigh - margin
    far_from = max(4, W // 4)
    far_amp = False
    for side in (-1, 1):
        s = dist * side
        far = _mean_at(k, (s >= far_from) & (s <= W))
        mid = _mean_at(k, (s >= 3) & (s < far_from))
        if far is not None and mid is not None and far > mid + margin:
            far_amp = True
    near = _mean_at(k, dist.abs() <= 2)
    rest = _mean_at(k, dist.abs() > 2)
    local = near is not None and rest is not None and near > rest + margin
    flat = float(k.max() - k.min()) < margin
    return KernelClass(negative_self, far_amp, local, flat)
