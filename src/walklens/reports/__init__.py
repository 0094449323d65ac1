"""Reports: self-contained HTML (inline JS, no CDN) plus PNG figures and attached CSV/JSON files.

One module per topic (``walk``, ``generate``, ``simmap``, ``heads``, ``kernels``, ``power``, ``steer``,
``parity``; the lab's topics are in :mod:`walklens.lab.reports`), each with one builder ``build(result
dataclasses, ...) -> Report`` and ``document(...)``, the topic's JSON document (``--json``): one per result type,
read by the report's page (``assets/results.js``) and sent by the explorer's API to its views, so a field is added
in one place.  Reports draw; they never load or run a model.
"""

from .html import Report

__all__ = ["Report"]
