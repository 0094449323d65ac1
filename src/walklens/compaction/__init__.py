"""Context compaction with concept vectors (seed 000, footnote 11: property 1 "can be applied to 1) compact long
contexts by replacing them with preaggregated concepts and 2) cache frequently used concepts").

* :mod:`.core` — :func:`compact` a text into ``k`` concept vectors (any A.6 layer / word aggregation / NORM;
  boundaries chosen to fit the budget; a verbatim recent window), the average-pooling and drop baselines;
* :mod:`.spec` — the ``--compact SPEC`` grammar (:class:`CompactSpec`);
* :mod:`.hellaswag` — HellaSwag with a compacted prefix, the endings scored the lm-eval-exact way;
* :mod:`.explain` — what each vector stands for (nearest tokens) and how a held-out continuation scores;
* :mod:`.curves` — compression-retention curves, resumable through the results database.

Segment vectors come from :func:`walklens.concepts.vectors.text_vectors`, so they are read from and kept in
the concept cache (:mod:`walklens.concept_cache`) shared with Test 1 and the sweep.  docs/compaction.md.
"""

from __future__ import annotations

from .core import Compacted, compact, compact_ids, compacted_embeds, prefix_embeds
from .explain import CompactionReport, explain
from .hellaswag import compact_items, compact_run
from .spec import CompactSpec

__all__ = ["CompactSpec", "Compacted", "CompactionReport", "compact", "compact_ids", "compact_items", "compact_run",
           "compacted_embeds", "explain", "prefix_embeds"]
