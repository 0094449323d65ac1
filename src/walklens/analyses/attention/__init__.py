"""Attention as *filter, then cluster & aggregate* (seed 000, sec. 2.2.1, Result 2, derivation in A.3).

Vectors are rows.  Head h of an attention layer computes (A.3)

    O_h = A_h V_h W_o,h = A_h X W_v,h W_o,h = A_h X W_vo,h,        W_vo,h = W_v,h W_o,h  (D x D, rank <= d)
    A_h = softmax(X W_q,h W_k,h^T X^T * scale + B) = softmax(X W_qk,h X^T * scale + B)

and the layer outputs ``O = sum_h O_h + b_o``.  This module gives

- :class:`~walklens.core.ov.FactoredMatrix` (in :mod:`walklens.core.ov`) -- a D x D matrix kept as two thin
factors
  (``A`` [D, d] @ ``B`` [d, D]); norms, SVD and eigenvalues come from d x d products, never from the dense matrix;
- :func:`head_matrices` -- W_vo,h and W_qk,h of every head of one attention module (grouped-query attention:
  query head h uses key/value head ``kv_head[h]``), with their bias terms;
- :func:`attention_identity` -- the A.3 identity checked numerically against the module's real output;
- :func:`cluster_view` and :func:`self_mass` -- the cluster & aggregate reading of one query position (its
  soft-cluster memberships, the centroid it moves to, and the self-association pull of A.2).

**Biases.**  With biases the value path is ``A_h (X W_v,h + 1 b_v,h) W_o,h = A_h X W_vo,h + 1 (b_v,h W_o,h)``
because every row of A_h sums to 1: b_v passes through the attention unchanged and contributes the constant
row ``b_v,h W_o,h`` (:meth:`HeadMatrices.vo_bias`); ``b_o`` is added once per layer, not per head.  On the
query/key side ``(x W_q + b_q)(y W_k + b_k)^T = x W_qk y^T + x (W_q b_k^T) + (b_q W_k^T) y^T + b_q b_k^T``:
the terms that depend only on the query (x W_q b_k^T and b_q b_k^T) are the same for every key and cancel in
the softmax; the key-side term ``(b_q W_k^T) y^T`` (:meth:`HeadMatrices.qk_key_bias`) does change attention.
Rotary models rotate q and k by position, so their W_qk is the position-0 (no rotation) form; Gemma 3
normalises q and k per head, so W_qk is only a direction-level summary there (``HeadWeights.qk_norm``).

The package's modules: :mod:`~walklens.analyses.attention.matrices` (:class:`HeadMatrices`, :class:`HeadStats`),
:mod:`~walklens.analyses.attention.identity` (the A.3 identity) and :mod:`~walklens.analyses.attention.cluster` (the
cluster & aggregate reading, :class:`SelfMass`).
"""

from __future__ import annotations

from .cluster import ClusterView, SelfMass, cluster_view, self_mass
from .identity import IdentityCheck, IdentityResult, attention_identity
from .identity import MatricesFn as MatricesFn
from .matrices import HeadMatrices, HeadStats, head_matrices, head_stats

__all__ = [
    "HeadStats",
    "head_stats",
    "HeadMatrices",
    "head_matrices",
    "attention_identity",
    "IdentityResult",
    "IdentityCheck",
    "ClusterView",
    "cluster_view",
    "SelfMass",
    "self_mass",
]
