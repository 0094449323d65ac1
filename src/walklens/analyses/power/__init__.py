"""The power-method view of a layer (seed 002, Li & Altafini, "Analogies between Transformer Layers and Power
Method"): eigen-analysis of F = W_V W_O (:mod:`walklens.core.ov`) and alignment of tokens with F's principal
eigenvector through depth; the idealised (feed-forward-free) dynamics and shared-weight models are in
:mod:`walklens.analyses.idealised`, steering in :mod:`walklens.analyses.steering`.

Only the seed's abstract is available, so the definitions used here are walklens' own, stated once:

- **F of a layer** (seed 000, sec. 2.2.1 and A.3): ``F = sum_h W_v,h W_o,h`` in the row convention, computed
  through its thin factors (:func:`~walklens.core.ov.ov_factors`, :func:`~walklens.core.ov.eigen_factored`).
- **Power step** (the seed's simplified layer reduced to its linear core): ``x <- x F / |x F|``.  In the row
  convention it converges to F's principal *left* eigenvector v1 (``v1 F = lambda1 v1``), which is the
  principal (right) eigenvector of ``F^T = W_O^T W_V^T``, i.e. of the seed's "output times value" matrix
  in the column convention.  walklens' ``v1`` is this vector; ``v1_right`` (``F v = lambda1 v``) is kept too.
  If lambda1 is one of a complex-conjugate pair, the iteration converges to a real 2-D invariant subspace
  (the plane spanned by Re and Im of the eigenvector): ``basis`` then holds 2 orthonormal rows, alignment is
  measured against the plane, and the gap is ``|lambda3| / |lambda1|``.
- **Convergence rate**: ``tan theta_l = tan theta_0 * rho^l`` with ``rho = |lambda2| / |lambda1|`` (the spectral
  gap; the next distinct modulus for a complex pair), which is exact when x_0 has two eigen-components and the
  asymptotic rate otherwise.  For the residual form ``x <- Norm(x + x F)`` (post-norm, no feed-forward) the
  same holds for ``I + F``: eigenvalues ``1 + lambda_i`` (and 1 on F's null space).
- **Alignment** of a token x with layer l: ``|cos(x, v1(F_l))|`` (the norm of x's projection on the plane,
  over |x|, for a complex pair), at layer l's input, mid-residual and output.

Precision: whatever the model's dtype, F's factors, eigenvalues and eigenvectors are float64 computations from
the model's own weights (:mod:`walklens.core.ov`; a bfloat16 weight converts exactly), and alignment reads vectors
recorded in float32 (:func:`~walklens.core.capture.capture`) in float64.  Results record the model's dtype
(``model_dtype``).

Analyses return plain dataclasses and never draw (:mod:`walklens.reports.power` draws).

The package's modules: :mod:`~walklens.analyses.power.spectra` (:func:`power_spectra`),
:mod:`~walklens.analyses.power.depth` (:func:`alignment`, :func:`alignment_from_states`) and
:mod:`~walklens.analyses.power.analytic` (:func:`power_iterate`,
:func:`predicted_alignment`, :func:`fitted_rate`).
"""

from __future__ import annotations

from .analytic import fitted_rate, power_iterate, predicted_alignment
from .depth import Alignment, alignment, alignment_from_states
from .depth import as_texts as as_texts
from .depth import cos_to_bases as cos_to_bases
from .depth import random_bases as random_bases
from .spectra import HeadSpectrum, LayerSpectrum, PowerSpectra, power_spectra

__all__ = [
    "power_spectra",
    "alignment",
    "alignment_from_states",
    "PowerSpectra",
    "LayerSpectrum",
    "HeadSpectrum",
    "Alignment",
    "power_iterate",
    "predicted_alignment",
    "fitted_rate",
]
