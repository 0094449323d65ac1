"""Reports: self-contained HTML (inline JS, no CDN) plus PNG figures and attached CSV/JSON files.

One module per topic (``walk``, ``generate``, ``simmap``, ``heads``, ``kernels``, ``power``, ``steer``,
``sweep``), each with one builder ``build(result dataclasses, ...) -> Report`` and, where the command writes
``--json``, ``document(...)`` (the JSON-ready dict).  Reports draw; they never load or run a model.
"""

from .html import Report

__all__ = ["Report"]
