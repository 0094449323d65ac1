"""A claim, its measured cost and a measured figure: the records every part of the registry passes around."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CHANCE = 0.25  # HellaSwag: four endings
SIZE = {"smollm2": "135m", "gemma3": "270m"}
BAND_ALPHA = 0.05  # a null layer ends above the top (95th percentile) of a 5-95 % chance band
#: the methods a steering card's verdict compares eigen-steering with, in the order of ``facts["other"]``
CARD_OTHERS = ("add", "meandiff")
#: the card's control: projection ablation moves the text with no direction toward the target
CARD_CONTROL = "ablate"


@dataclass(frozen=True)
class Cost:
    """Where a run's measured cost is written: the ``timings`` file (relative to the repository), the section of
    it whose first line starts with ``entry``, and the line of that section starting with ``line`` (its first time
    is the cost: :func:`walklens.lab.claims.timings.cost`)."""

    timings: str
    entry: str
    line: str


@dataclass(frozen=True)
class Claim:
    """One claim: ``measure`` names how its figure is read from ``file`` (``select``: which run or rows),
    ``rule`` how the figure becomes a verdict (``target``: the seed's own figure, where the rule compares)."""

    id: str
    seed: str
    says: str
    command: str
    file: str | None = None
    measure: str = ""
    select: Mapping[str, Any] = field(default_factory=dict)
    rule: str = ""
    target: float | None = None
    why: str = ""  # for a claim without a result file: why not, and what it takes ("{cost}": its cost)
    cost: Cost | None = None  # where the "{cost}" of ``why`` is measured


@dataclass(frozen=True)
class Measured:
    """A figure read from a result file: its value and interval, the model and items, and the comparison."""

    model: str
    n: int
    value: float
    lo: float
    hi: float
    text: str
    facts: Mapping[str, float] = field(default_factory=dict)
