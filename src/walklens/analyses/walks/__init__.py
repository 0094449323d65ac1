"""Encoding walks, decoding walks and similarity maps (seed 000: sec. 2.1, 2.2.2, A.1, A.2; Figs. 3, 9, 11, 12).

- :func:`encoding_walk` follows every position's vector up the stack (the *encoding walk*, sec. 2.2.2) and
  reads it against the token vectors: nearest tokens, rank and probability of the input token w_t and of
  the next token w_{t+1}, step lengths and angles, and where w_{t+1} first outranks w_t (A.2).
- :func:`~walklens.analyses.decoding.decoding_walk` (in :mod:`walklens.analyses.decoding`) generates text and records
the
  decoding vector d_t of every step (eqs. 8-15), with ``target=`` teacher-forcing a target path (A.1).
- :meth:`EncodingWalk.first_top` / :meth:`EncodingWalk.rank_of`: where a chosen token (``encoding_walk(...,
  target=" Paris")``) first becomes top-1 and stays, with its rank at every point (:class:`TargetAnswer`).
- :func:`similarity_map` gives the [tokens, tokens] similarity of the vectors at one point (Figs. 3, 11, 12).

Which matrix each reading compares with (``against``):

- ``norm="none"`` (the papers' reading, default ``against="embed"``): the raw captured vector x against the
  rows of V, the input embedding matrix (eq. 12 with tied embeddings: P_t = softmax(d_t V^T)).
- ``norm="final"`` (the logit-lens reading, default ``against="unembed"``): the model's own final norm is
  applied to x (never twice: the ``final`` point already is its output) and the result is read through the
  model's own head, so ``metric="dot"`` scores are exactly the model's logits (W_U, its bias, T5's
  d_model**-0.5 scale, Gemma's soft-capping, the MLM transform of BERT/ALBERT).  Cosines then compare the
  head's input with the rows of W_U.  For tied models W_U is V.
- ``against="embed"``/``"unembed"`` chooses the matrix explicitly; without the head (``norm="none"``, or
  ``against="embed"``) scores are plain inner products x·m_i.

BERT and ALBERT have no final norm: their residual stream is already the output of a LayerNorm at every
layer, so ``norm="final"`` applies no norm and reads through the MLM head.  ALBERT's V lives in E-space
(E may differ from D); comparing D-sized vectors with it raises a clear :class:`~walklens.base.errors.InputError`
(use ``norm="final"``, which reads through the MLM head that maps D to E).

Ranks are counts of scores strictly greater than the token's score (rank 0 = nearest), never a sort: rows are
read in chunks (at most 512) against the matrix one vocabulary tile at a time by :mod:`walklens.core.ranking`
(one float32 product per tile, compared while in cache; a token never outranks itself, see there), so memory
stays bounded (never points x tokens x |V| at once).  Probabilities are always softmax of the inner products
(eq. 12), whatever the metric.  ``k=0, probs=False`` leaves out the top-k and softmax passes: the rank maps
(and escape points) cost the products and the counts alone, which is what ``walklens serve`` computes for its
heatmap (docs/explorer.md, Benchmark).

Speed: the products dominate (|V| x D multiply-adds per row and point: 28 M for smollm2-135m, ~6.5x its
forward pass per token over 32 points) and stay float32.  A bfloat16 (AMX) screen with float32 verification
was measured and rejected: the rigorous bound of its error leaves thousands of tokens per row to re-score
(:mod:`walklens.core.ranking`); ``screen=True`` uses the bfloat16 products alone for provisional ranks.

Precision: scores, ranks and probabilities are float32 computations whatever the model's dtype.  A bfloat16 or
float16 model's vectors are recorded in float32 (:func:`~walklens.core.capture.capture`), its V / W_U are read in
float32, and with ``norm="final"`` its final norm and head run in float32 from its own weights
(:func:`~walklens.core.interventions.upcast`, exact conversions), so ranks are not decided by 16-bit rounding
ties.  :attr:`EncodingWalk.model_dtype` records the model's dtype.

The package's modules: :mod:`~walklens.analyses.walks.result` (:class:`EncodingWalk`),
:mod:`~walklens.analyses.walks.encoding` (:func:`encoding_walk`, :func:`walk_rows`, :func:`join_walks`),
:mod:`~walklens.analyses.walks.reading` (the token
matrix, the final norm and head, the chunked reading) and :mod:`~walklens.analyses.walks.similarity`
(:func:`similarity_map`).
"""

from __future__ import annotations

from .encoding import encoding_walk
from .encoding import join_walks as join_walks
from .encoding import labels_for as labels_for
from .encoding import walk_rows as walk_rows
from .reading import _CHUNK_BYTES as _CHUNK_BYTES
from .reading import final_norm_fn as final_norm_fn
from .reading import point_aligned_chunks as point_aligned_chunks
from .reading import walk_chunk_rows as walk_chunk_rows
from .reading import walk_matrix_bytes as walk_matrix_bytes
from .result import Against as Against
from .result import EncodingWalk
from .result import Metric as Metric
from .result import Norm as Norm
from .similarity import similarity_map
from .target import TargetAnswer

__all__ = ["EncodingWalk", "TargetAnswer", "encoding_walk", "similarity_map"]
