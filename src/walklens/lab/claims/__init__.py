"""The claims of both seeds that walklens measures, in one registry, the data file ``claims.toml`` (checked on
load: :mod:`walklens.lab.claims.registry`): each claim's seed section, what the seed says, the command that measures
it, the committed result file it is read from, its reader and the rule of its verdict (seed 000, Singh: sec. 5.1,
A.2, footnote 11; seed 002, Li & Altafini).

:func:`render` reads every claim's figure from its result file and writes the table of docs/claims.md, so a
number there is its file's number (a test re-renders it); a claim without a result file is listed with the
verdict "not measured yet" and why.  ``walklens reproduce`` runs the commands (``--quick``: a tiny model).
"""

from .base import Claim, Cost, Measured
from .readers import MEASURES, alignment_counts, steering_settings
from .registry import CLAIMS, load
from .rules import RULES
from .table import QUICK_SUMMARY, Source, assess, committed, quick, ratios_markdown, render

__all__ = [
    "CLAIMS",
    "MEASURES",
    "QUICK_SUMMARY",
    "RULES",
    "Claim",
    "Cost",
    "Measured",
    "Source",
    "alignment_counts",
    "assess",
    "committed",
    "load",
    "quick",
    "ratios_markdown",
    "render",
    "steering_settings",
]
