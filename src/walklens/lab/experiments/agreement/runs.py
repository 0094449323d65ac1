"""One stored run (the baseline, a Test 1 or Test 2 scheme) in both dtypes: per metric the share of identical
picks and the paired difference of the accuracies, and the per-ending score differences."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ....analyses.chance import wilson
from ....base.errors import InputError
from ...hellaswag.store import KEY_COLUMNS, ResultStore, RunKey
from .paired import PairedDifference, _paired

SCORE_QUANTILES = (0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0)
ABS_QUANTILES = (0.5, 0.9, 0.99, 1.0)


@dataclass(frozen=True)
class PickAgreement:
    """How often one metric's pick is the same in both dtypes, and the difference of its accuracies."""

    metric: str
    n: int
    same: int
    share: float
    share_lo: float
    share_hi: float
    difference: PairedDifference


@dataclass(frozen=True)
class ScoreDifferences:
    """Per ending, ``other - reference`` score (log-likelihood for the baseline and Test 1, similarity for Test
    2).  ``flip_gap_max``: the largest reference score gap between the two ``acc`` picks where they differ (how
    near a tie the reference was wherever the other dtype picked otherwise)."""

    n_items: int
    n_endings: int
    mean: float
    mean_abs: float
    max_abs: float
    max_abs_item: int
    quantiles: dict[str, float]
    abs_quantiles: dict[str, float]
    n_flips: int
    flip_gap_max: float | None


@dataclass(frozen=True)
class RunAgreement:
    """One stored run (baseline, Test 1 or Test 2 scheme) in both dtypes, on the items both hold."""

    test: str
    scheme: str
    reference: str
    other: str
    n: int
    only_reference: int  # items stored for one dtype only (left out)
    only_other: int
    picks: tuple[PickAgreement, ...]
    scores: ScoreDifferences


def _qname(q: float) -> str:
    return f"q{q * 100:g}"


def score_differences(items: Sequence[int], ref: np.ndarray, other: np.ndarray) -> ScoreDifferences:
    """:class:`ScoreDifferences` of scores ``[items, endings]`` in the two dtypes (``items``: their indices)."""
    d = other - ref
    flat, a = d.ravel(), np.abs(d).ravel()
    i = int(np.argmax(a))
    pr, po = ref.argmax(1), other.argmax(1)
    flips = np.flatnonzero(pr != po)
    gaps = ref[flips, pr[flips]] - ref[flips, po[flips]]
    return ScoreDifferences(
        n_items=int(d.shape[0]),
        n_endings=int(d.size),
        mean=float(flat.mean()),
        mean_abs=float(a.mean()),
        max_abs=float(a[i]),
        max_abs_item=int(items[i // d.shape[1]]),
        quantiles={_qname(q): float(v) for q, v in zip(SCORE_QUANTILES, np.quantile(flat, SCORE_QUANTILES))},
        abs_quantiles={_qname(q): float(v) for q, v in zip(ABS_QUANTILES, np.quantile(a, ABS_QUANTILES))},
        n_flips=int(flips.size),
        flip_gap_max=float(gaps.max()) if flips.size else None,
    )


def pick_agreement(metric: str, gold: np.ndarray, ref: np.ndarray, other: np.ndarray) -> PickAgreement:
    """:class:`PickAgreement` of one metric's picks ``[items]`` in the two dtypes."""
    n = int(gold.size)
    same = int((ref == other).sum())
    lo, hi = wilson(same, n)
    return PickAgreement(metric, n, same, same / n if n else math.nan, lo, hi, _paired(gold, ref, other))


def _what(key: RunKey) -> str:
    scheme = "" if key.test == "baseline" else f", scheme {key.scheme}"
    return f"{key.test} run of {key.model} ({key.shots}-shot{scheme}, data {key.data})"


def compare_runs(
    store: ResultStore, reference: RunKey, other: RunKey, items: int | None = None, hints: Sequence[str] = ("", "")
) -> RunAgreement:
    """:class:`RunAgreement` of two stored runs.  ``items``: compare the first ``items`` items (both runs must
    hold every one), else every item both hold.  ``hints``: what produces each run (added to the error)."""
    got = []
    for key, hint in zip((reference, other), hints):
        if not store.runs(**dict(zip(KEY_COLUMNS, key.values()))):
            raise InputError(f"{store.path}: no stored {_what(key)}{hint}")
        res = store.results(key)
        if items is not None and any(i not in res for i in range(items)):
            have = sum(i in res for i in range(items))
            raise InputError(f"{store.path}: the {_what(key)} holds {have} of the first {items} items{hint}")
        got.append(res)
    ref, oth = got
    common = list(range(items)) if items is not None else sorted(set(ref) & set(oth))
    if not common:
        raise InputError(f"{store.path}: the {_what(reference)} and the {_what(other)} have no item in common")
    gold = np.array([ref[i].gold for i in common])
    if not np.array_equal(gold, [oth[i].gold for i in common]):
        raise InputError(f"{store.path}: the {_what(reference)} and the {_what(other)} disagree on gold endings")
    metrics = ("acc",) if reference.test == "test2" else ("acc", "acc_norm")
    picks = []
    for metric in metrics:
        attr = "pred" if metric == "acc" else "pred_norm"
        picks.append(
            pick_agreement(
                metric,
                gold,
                np.array([getattr(ref[i], attr) for i in common]),
                np.array([getattr(oth[i], attr) for i in common]),
            )
        )
    scores = score_differences(
        common,
        np.array([ref[i].scores for i in common], np.float64),
        np.array([oth[i].scores for i in common], np.float64),
    )
    return RunAgreement(
        test=reference.test,
        scheme=reference.scheme,
        reference=reference.model,
        other=other.model,
        n=len(common),
        only_reference=len(set(ref) - set(common)),
        only_other=len(set(oth) - set(common)),
        picks=tuple(picks),
        scores=scores,
    )
