"""The notebook views of the lab's results (:mod:`walklens.reports.notebook`): a HellaSwag run, a sweep's summary,
compaction's curves and the steering card, drawn by the same builders as their commands' reports.

Imported by :mod:`walklens.lab` itself, so any lab result has its view once its module is imported, and the lab's
documents their schemas (:mod:`.reports.schemas`); the instrument never imports the lab (docs/architecture.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..reports.html import Report
from ..reports.notebook import add_views
from ..reports.parts import add_columns
from .reports import curves, steercard, sweep
from .reports import schemas as _schemas  # noqa: F401  # registers the lab's documents (walklens.reports.schemas)

if TYPE_CHECKING:
    from .experiments.runner import RunSummary


def run(s: RunSummary) -> Report:
    """A run's items: each item's gold, pick and scores (Tests 1 and 2, the baseline)."""
    rep = Report(f"Run {s.key}", f"acc {s.acc}, acc_norm {s.acc_norm}; {len(s.results)} items")
    return add_columns(rep, s._columns("items"), "RunSummary")


add_views(
    {
        "steering_card": steercard.build,
        "curves": curves.build,
        "run": run,
        "summary": lambda s: sweep.build([s]),
    }
)

__all__ = ["run"]
