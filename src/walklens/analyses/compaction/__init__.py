"""Context compaction with concept vectors (seed 000, footnote 11: property 1 "can be applied to 1) compact long
contexts by replacing them with preaggregated concepts and 2) cache frequently used concepts").

* :mod:`.core` — :func:`compact` a text into ``k`` concept vectors (any A.6 layer / word aggregation / NORM;
  boundaries chosen to fit the budget; a verbatim recent window), the average-pooling and drop baselines;
* :mod:`.spec` — the ``--compact SPEC`` grammar (:class:`CompactSpec`);
* :mod:`.explain` — what each vector stands for (nearest tokens) and how a held-out continuation scores.

HellaSwag with a compacted prefix and compression-retention curves are experiments
(:mod:`walklens.lab.experiments.compaction`, :mod:`walklens.lab.experiments.curves`).

Segment vectors come from :func:`walklens.analyses.concepts.vectors.text_vectors`, so they are read from and kept in
the concept cache (:mod:`walklens.analyses.concepts.cache`) shared with Test 1 and the sweep.  docs/compaction.md.
"""

from __future__ import annotations

from .core import Compacted, compact, compact_ids, compacted_embeds, prefix_embeds
from .explain import CompactionReport, explain
from .spec import CompactSpec

__all__ = [
    "CompactSpec",
    "Compacted",
    "CompactionReport",
    "compact",
    "compact_ids",
    "compacted_embeds",
    "explain",
    "prefix_embeds",
]
