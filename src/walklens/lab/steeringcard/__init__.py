"""The steering card (seed 002): eigen-steering next to activation addition, mean-difference steering and
projection ablation on one dose scale, with effects and coherence over a steering set's prompts.

``sets`` (steering sets as JSONL, the shipped ones in ``walklens/lab/data/steering``), ``run`` (directions, doses,
continuations and their scores), ``stats`` (bootstrap intervals, wrong-way share, Pareto front, the choice on
``choose``), ``store`` (resumable generations in SQLite), ``cells`` (the result types) and ``card``
(:func:`steering_card`)."""

from __future__ import annotations

from .card import steering_card
from .cells import CardCell, CardChoice, CardExample, SteeringCard
from .sets import SteeringSet, load_steering_set, shipped_sets

__all__ = [
    "steering_card",
    "SteeringCard",
    "CardCell",
    "CardChoice",
    "CardExample",
    "SteeringSet",
    "load_steering_set",
    "shipped_sets",
]
