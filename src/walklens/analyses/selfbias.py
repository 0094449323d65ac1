"""How many heads have negative self-bias, counted against chance (seed 000, A.2, Figs. 5-8).

Built on the empirical position kernels (:func:`walklens.analyses.kernels.position_kernels`), which keep every sample's
kernel.  Per head, the *self gap* of sample s is ``k_s(0) - k_s(nb)``: the mean attention weight at the
query's own position minus that at its neighbours (causal ``nb = -1``; bidirectional the mean of -1 and +1),
in attention-weight units.  Two counts per stack:

- ``negative``: heads flagged negative self-bias at the margin (:func:`walklens.analyses.kernels.classify_kernel` on the
  log mean kernel), the fraction docs/attention.md reports; a point estimate with no chance level;
- ``significant``: heads whose mean gap is below zero by a one-sided t-test at level ``alpha`` over the N
  samples (t = mean / (std / sqrt(N)) < t_{alpha, N-1}).  Were no head self-biased (every gap's mean zero),
  each would cross with probability ``alpha``: ``expected = heads * alpha`` (heads of one model are not
  independent, so ``p_chance``, the binomial tail of the count, is a scale, not a test).

Run on kernels fitted with position 0 removed (``sink=True``), the same counts are the attention-sink control.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..base.display import Shown
from ..base.errors import InputError
from ..base.frames import DataFrame, frame, long_table
from .kernels import PositionKernels, StackKernels

ALPHA = 0.05


@dataclass(frozen=True)
class SelfBiasCount(Shown):
    """The negative-self-bias counts of one stack's empirical kernels (module docstring): ``gap`` [K, H] the
    mean self gap over samples, ``t`` its t statistic; ``negative`` heads flagged at ``margin``,
    ``significant`` heads with the gap below zero at one-sided level ``alpha``, ``expected`` their number by
    chance and ``p_chance`` the binomial tail ``P(X >= significant)``."""

    model_name: str
    stack: str
    heads: int
    samples: int
    margin: float
    alpha: float
    negative: int
    significant: int
    expected: float
    p_chance: float
    sink_removed: bool
    gap: torch.Tensor
    t: torch.Tensor

    def _headline(self) -> str:
        ctl = "position 0 removed" if self.sink_removed else "as measured"
        return (
            f"{self.model_name} {self.stack or 'model'} ({ctl}): {self.negative}/{self.heads} flagged at "
            f"{self.margin:g} nats; {self.significant}/{self.heads} below zero at {self.alpha:g} "
            f"({self.expected:.3g} by chance)"
        )

    def to_pandas(self) -> DataFrame:
        """One row per (layer, head): the mean self ``gap`` and its ``t`` statistic (pandas; docs/notebooks.md,
        "Tables"); the counts as ``attrs``."""
        K, H = self.gap.shape
        table = long_table([("layer", range(K)), ("head", range(H))], {"gap": self.gap, "t": self.t})
        counts = ("heads", "samples", "margin", "alpha", "negative", "significant", "expected", "p_chance")
        attrs = {"model": self.model_name, "stack": self.stack, "sink_removed": self.sink_removed}
        return frame(table, {**attrs, **{k: getattr(self, k) for k in counts}})


def self_gaps(s: StackKernels) -> torch.Tensor:
    """Per sample, layer and head the self gap ``k_s(0) - k_s(nb)`` [N, K, H] (module docstring)."""
    if s.samples is None:
        raise InputError("self-bias counts need empirical kernels (their per-sample kernels); not weight kernels")
    dist = list(s.distances)
    nb = [dist.index(d) for d in (-1, 1) if d in dist]
    if 0 not in dist or not nb:
        raise InputError("self-bias counts need the kernel at distance 0 and at a neighbour")
    x = s.samples.double()
    return x[..., dist.index(0)] - x[..., nb].mean(-1)


def self_bias_count(pk: PositionKernels, stack: str = "", alpha: float = ALPHA) -> SelfBiasCount:
    """The counts of one stack of ``pk`` (module docstring)."""
    from scipy.stats import binom
    from scipy.stats import t as student

    if not 0.0 < alpha < 1.0:
        raise InputError(f"alpha must be in (0, 1), not {alpha}")
    s = pk.stack(stack)
    d = self_gaps(s)
    N = d.shape[0]
    if N < 2:
        raise InputError("self-bias counts need at least 2 samples")
    mean, sd = d.mean(0), d.std(0)
    t = mean / (sd / math.sqrt(N)).clamp_min(1e-300)
    sig = int((t < float(student.ppf(alpha, N - 1))).sum())
    n = int(mean.numel())
    neg = sum(c.negative_self for row in s.classes for c in row)
    return SelfBiasCount(
        model_name=pk.model_name,
        stack=s.stack,
        heads=n,
        samples=N,
        margin=pk.margin,
        alpha=alpha,
        negative=int(neg),
        significant=sig,
        expected=n * alpha,
        p_chance=float(binom.sf(sig - 1, n, alpha)) if sig > 0 else 1.0,
        sink_removed=s.sink_removed,
        gap=mean.float(),
        t=t.float(),
    )


__all__ = ["ALPHA", "SelfBiasCount", "self_bias_count", "self_gaps"]
