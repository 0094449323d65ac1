"""Concept space (seed 000, sec. 5 and A.6): the composition maths of the HellaSwag experiments.

* :mod:`.schemes` — the A.6 composition schemes (:class:`~.schemes.Scheme`);
* :mod:`.segment` — the encoding schemes (how a context is cut into examples and segments);
* :mod:`.compose` — word / segment / example aggregation, norms, similarities on batched tensors;
* :mod:`.vectors` — word-aggregated segment vectors, computed one way for Test 1, the sweep and compaction;
* :mod:`.cache` — the concept cache those vectors are kept in (footnote 11: "cache frequently used concepts");
* :mod:`.generation` — Test 1, pyramidal generation (sec. 5.1.1);
* :mod:`.similarity` — Test 2, concept similarity (sec. 5.1.2).

The harness they run in (data, requests, packed scoring, the baseline, the result store) is
:mod:`walklens.hellaswag`; runs over many items and schemes are :mod:`walklens.experiments`.
"""

from __future__ import annotations

from .schemes import Scheme

__all__ = ["Scheme"]
