"""Position kernels and self-bias statistics (seed 000, sec. 2.2.1 "Position Weighted Bag of Words", A.2,
Figs. 6 and 8).

A head's *position kernel* k_h(delta) is how much the relative position ``delta = key - query`` adds to its
attention, like a 1-D convolution kernel.  :func:`position_kernels` gives it for every supported family:

- **T5 relative buckets** (``scheme="t5_relative"``): read straight from the weights --
  ``relative_attention_bias.weight[bucket(delta), h]`` with the model's own ``_relative_position_bucket``
  (encoder bidirectional, decoder causal).  Units: logits added to q.k.  T5 stores the bias in layer 0 of each
  stack and every layer reuses it, so there is one kernel per head and stack.
- **ALiBi** (``scheme="alibi"``; Falcon, BLOOM, MPT): ``k_h(delta) = slope_h * delta * scale``, measured, not
  assumed: one forward pass with every attention module's input set to zero removes q.k, so the attention is
  the softmax of the additive position bias alone (see :func:`position_only_attention`); each head's logit
  slope is fitted to its log-ratios.  ``slope_h`` are the slopes of the model's own ALiBi builder and
  ``scale`` is fitted to the measured slopes: BLOOM and MPT add the bias unscaled (scale 1); Falcon's
  declared scale is 1/sqrt(d), but transformers 5.x's eager Falcon path adds the ALiBi term twice (once
  inside the attention mask), so the measured scale there is 2/sqrt(d) -- walklens reports what the model
  does.
- **Rotary / learned absolute positions** (``scheme="empirical"``): no additive bias exists, so the kernel is
  estimated as the *mean attention weight by relative distance over shuffled-token inputs*:

      k_h(delta) = mean over samples s, mean over query rows i in Q of A_h^(s)[i, i + delta]

  Each sample is a random permutation of ``length`` tokens drawn from a corpus (shuffling destroys word
  order, so what remains systematic is position).  Q is the same set of rows for every delta -- rows that see
  every distance in the window and never use key position 0 (often an attention sink, an absolute-position
  effect): causal ``Q = {W+1, ..., T-1}``, bidirectional ``Q = {W, ..., T-1-W}`` for window W.  Spread: the
  standard deviation over samples of the per-sample kernel (``spread``) and a 95% confidence half-width
  ``1.96 * std / sqrt(samples)`` (``ci95``).  Units: attention weight (probability).  One kernel per layer and
  head.

**Self-bias classes** (:func:`classify_kernel`) work in logit units: T5/ALiBi kernels as they are, empirical
kernels as ``log`` of the mean weight (differences of log mean weights are log-ratios, comparable to logit
differences because every distance is averaged over the same rows).  With margin m (default 0.1 nats):

- *negative self-bias*: ``k(0) < mean(k(-1), k(+1)) - m`` (causal kernels: ``k(0) < k(-1) - m``) -- the
  query's own position is attenuated relative to its neighbours (A.2);
- *far-amplifying*: on some side, the mean over the far band ``far_from <= |delta| <= W`` exceeds the mean
  over the intermediate band ``3 <= |delta| < far_from`` by m (``far_from = max(4, W // 4)``; Fig. 8);
- *local*: the mean over ``|delta| <= 2`` exceeds the mean over ``|delta| > 2`` by m;
- *flat*: ``max k - min k < m``.

Flags are independent (a head can be both negative-self-bias and far-amplifying); ``label`` is the first of
flat, negative self-bias, far-amplifying, local, other.  Fractions are reported per stack, also for a sweep
of margins.

The package's modules: :mod:`~walklens.analyses.kernels.classes` (the self-bias classes),
:mod:`~walklens.analyses.kernels.result` (:class:`StackKernels`, :class:`PositionKernels`),
:mod:`~walklens.analyses.kernels.weights` (T5 and ALiBi, the
position-only probe), :mod:`~walklens.analyses.kernels.empirical` (the empirical estimator) and
:mod:`~walklens.analyses.kernels.estimate` (:func:`position_kernels`).
"""

from __future__ import annotations

from .classes import CLASSES as CLASSES
from .classes import LABELS as LABELS
from .classes import MARGIN_SWEEP as MARGIN_SWEEP
from .classes import KernelClass, classify_kernel
from .empirical import DEFAULT_CORPUS, empirical_kernels
from .estimate import position_kernels
from .result import PositionKernels, StackKernels
from .weights import position_only_attention, t5_kernel_values

__all__ = [
    "position_kernels",
    "PositionKernels",
    "StackKernels",
    "KernelClass",
    "classify_kernel",
    "empirical_kernels",
    "position_only_attention",
    "t5_kernel_values",
    "DEFAULT_CORPUS",
]
