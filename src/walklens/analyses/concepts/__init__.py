"""Concept space (seed 000, sec. 5 and A.6): the composition maths of the HellaSwag experiments.

* :mod:`.schemes` — the A.6 composition schemes (:class:`~.schemes.Scheme`);
* :mod:`.compose` — word / segment / example aggregation, norms, similarities on batched tensors;
* :mod:`.vectors` — word-aggregated segment vectors, computed one way for Test 1, the sweep and compaction;
* :mod:`.cache` — the concept cache those vectors are kept in (footnote 11: "cache frequently used concepts").

The HellaSwag parts (encoding schemes cutting an item's context into segments, Test 1's pyramidal generation,
Test 2's concept similarity) are :mod:`walklens.lab.concepts`; the harness they run in (data, the baseline, the
result store) is :mod:`walklens.lab.hellaswag`; runs over many items and schemes are
:mod:`walklens.lab.experiments`.
"""

from __future__ import annotations

from .schemes import Scheme

__all__ = ["Scheme"]
