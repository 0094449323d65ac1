"""Causal tests of the walk: activation patching and attribution patching on every named point (docs/patching.md).

- :func:`patch` (:mod:`.exact`) -- each (point, position) cell scored by one patched forward pass, batched by layer
  and started at the cell's layer from the stored residual (:mod:`walklens.core.patching`);
- :func:`attribute` (:mod:`.attribution`) -- attribution patching (activation difference x gradient, one forward and
  one backward), reported with its parity card against exact patching on the same cells;
- :func:`path_patch` (:mod:`.paths`) -- path patching from a head or sublayer to the residual entering later layers;
- :func:`patch_vector` (:mod:`.vectors`) -- a given vector (a steering direction, a concept vector) added to or put in
  place of the corrupted run's vector at each cell;
- :func:`walk_beside_patch` (:mod:`.beside`) -- the walk beside the test: where the answer first becomes the walk's
  top token, beside where restoring the residual at the last position restores it;
- :mod:`.metrics` -- logit difference, log-probability, rank, KL to the clean distribution, or a callable;
- :class:`PatchResult` (:mod:`.result`) -- the grid, its references, ``to_pandas()`` and its JSON document.

Analyses load no model and draw nothing: the views are :mod:`walklens.reports.patching`.
"""

from __future__ import annotations

from .attribution import attribute, parity_card
from .beside import WalkBeside, walk_beside_patch
from .exact import DIRECTIONS, expand_points, patch
from .metrics import Metric, parse_metric
from .paths import path_patch
from .result import MIN_SPEARMAN, MIN_TOPK_OVERLAP, AttributionParity, PatchResult
from .vectors import patch_vector

__all__ = [
    "patch",
    "attribute",
    "path_patch",
    "patch_vector",
    "walk_beside_patch",
    "WalkBeside",
    "parity_card",
    "expand_points",
    "DIRECTIONS",
    "Metric",
    "parse_metric",
    "PatchResult",
    "AttributionParity",
    "MIN_SPEARMAN",
    "MIN_TOPK_OVERLAP",
]
