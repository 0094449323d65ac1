"""How much the pick matters (seed 000, sec. 5.1.1, Figs. 13-16; docs/claims.md, "The selection's variance"): the
ten schemes a 200-item sweep ranks best in sample, each scored on items it was not chosen on, beside the baseline
on the same items.

A sweep picks one scheme out of thousands on 200 items, and every full-set row scores that one pick.  The seed's
claim is about the best scheme, not one pick: :func:`run_selection` sweeps the in-sample top ten
(:func:`~.sweep.run_sweep`: one forward pass per distinct segment text serving all of them, resumable from the
results database) over the held-out items, and :func:`selection_document` writes each scheme's picks compactly (one
digit per item) beside the baseline's, so the paired tests of docs/claims.md
(:func:`walklens.lab.claims.pairs.selection_picks`) run on committed data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...analyses.concepts.schemes import Scheme
from ...base.errors import InputError
from ...core.scoring.encode import arch_of
from ..hellaswag.data import HellaswagItem
from ..hellaswag.store import SweepStore
from .folds import METRICS, digits, summary_run
from .runner import baseline_scorer, run_test
from .runsetup import RunSetup
from .sweep import SweepSpec, run_sweep

if TYPE_CHECKING:
    from ...core.loading import LoadedModel

#: ``walklens hellaswag selection --json`` (:func:`selection_document`): its fields
SELECTION_FIELDS = (
    *("model", "summary_model", "test", "shots", "data", "pool", "metric", "command", "chosen_on", "skip", "n"),
    *("items", "gold", "baseline", "schemes"),
)
try:  # the lab's documents join walklens.reports.schemas' registry where it exists
    from ...reports.schemas import declare, plain
except ImportError:  # pragma: no cover - an install without the registry
    pass
else:
    declare("selection", plain("selection picks document", *SELECTION_FIELDS))


@dataclass(frozen=True)
class Ranked:
    """A scheme of a sweep's in-sample ranking: its rank (1 = best) and its in-sample accuracy by the ranking's
    metric on the sweep's items."""

    rank: int
    scheme: str
    in_sample: float


def top_schemes(
    doc: Any, model: str, test: int, shots: int, n_items: int, metric: str = "acc", k: int = 10
) -> list[Ranked]:
    """The ``k`` best schemes in sample (``top10`` of a sweep report's ``summary.json``, ``doc``) of the run with
    this model, test, shots and number of items, by ``metric``; one line naming what is missing otherwise."""
    top = summary_run(doc, model, test, shots, n_items).get("metrics", {}).get(metric, {}).get("top10")
    if not isinstance(top, list) or len(top) < k:
        raise InputError(f"the run's {metric} ranking holds {0 if not isinstance(top, list) else len(top)} schemes, "
                         f"not {k}")  # fmt: skip
    return [Ranked(int(t["rank"]), str(t["scheme"]), float(t["acc"])) for t in top[:k]]


@dataclass(frozen=True)
class SelectionPicks:
    """Per held-out item: its index, gold ending, the baseline's picks and each scheme's (per metric)."""

    items: list[int]
    gold: list[int]
    baseline: dict[str, list[int]]
    schemes: dict[str, dict[str, list[int]]]  # scheme -> metric -> picks


def run_selection(
    lm: LoadedModel, items: Sequence[HellaswagItem], test: int, schemes: Sequence[str], setup: RunSetup
) -> SelectionPicks:
    """Sweep ``schemes`` (Test ``test``) over ``items`` with ``setup`` (a results store is needed: the sweep
    resumes from it) and read back every scheme's picks and the baseline's, item by item."""
    if setup.store is None:
        raise InputError("the selection runs a sweep, which stores its results: give it a results database")
    parsed = [Scheme.from_spec(s, test, arch_of(lm)) for s in schemes]
    out = run_sweep(lm, items, SweepSpec(test, parsed), setup)
    base = run_test(lm, items, baseline_scorer(), setup, desc=f"{lm.name} baseline")  # stored by the sweep: read
    with SweepStore(setup.store.path, readonly=True) as st:
        got = st.load(out.run_id)
    assert got.preds is not None  # loaded with its predictions
    picks: dict[str, dict[str, list[int]]] = {}
    for given, scheme in zip(schemes, parsed):
        if str(scheme) not in got.schemes:
            raise InputError(f"the sweep's store holds no picks of {given!r}")
        row = got.schemes.index(str(scheme))
        # Test 2 stores one metric: its picks are the same by acc and acc_norm (no per-character normalisation)
        picks[given] = {
            m: [int(x) for x in got.preds[got.metrics.index(m if m in got.metrics else "acc"), row]] for m in METRICS
        }
    return SelectionPicks(
        items=[it.index for it in items],
        gold=[r.gold for r in base.results],
        baseline={"acc": [r.pred for r in base.results], "acc_norm": [r.pred_norm for r in base.results]},
        schemes=picks,
    )


def selection_document(picks: SelectionPicks, ranked: Sequence[Ranked], head: Mapping[str, Any]) -> dict[str, Any]:
    """The compact document: ``head`` (model, test, shots, command, ...), then per item position the gold ending and
    the baseline's picks as digits, and per scheme (in its in-sample rank) its in-sample accuracy and its picks."""
    n = len(picks.items)

    def acc(p: Sequence[int]) -> float:
        return sum(a == g for a, g in zip(p, picks.gold)) / n

    return {
        **head,
        "n": n,
        "items": picks.items,
        "gold": digits(picks.gold),
        "baseline": {m: digits(v) for m, v in picks.baseline.items()},
        "schemes": [
            {
                "rank": r.rank,
                "scheme": r.scheme,
                "in_sample": r.in_sample,
                "heldout": {m: acc(v) for m, v in picks.schemes[r.scheme].items()},
                "picks": {m: digits(v) for m, v in picks.schemes[r.scheme].items()},
            }
            for r in ranked
        ],
    }


__all__ = ["Ranked", "SelectionPicks", "run_selection", "selection_document", "top_schemes"]
