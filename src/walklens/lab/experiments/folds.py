"""The k-fold held-out best of a committed sweep, item by item, with its controls (seed 000, sec. 5.1.1, Fig. 10;
docs/claims.md, "Paired evidence").

A sweep report's ``summary.json`` names the scheme each fold chose (``kfold.fold_schemes``) but keeps no picks,
and the sweep databases are not committed.  :func:`run_folds` scores, on the same items, each fold's scheme on
its fold (the items :func:`~walklens.lab.hellaswag.store.counts.kfold_folds` puts there), the baseline on all of
them and each control (:mod:`walklens.lab.concepts.controls`) of each fold's scheme on that fold, so the held-out
best's picks, the baseline's and the controls' lie side by side.  :func:`picks_document` writes them compactly
(one digit per item) with the recomputed k-fold accuracy beside the report's, so a reader can check the picks are
the sweep's before any paired test is computed from them (:mod:`walklens.lab.claims.paired`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...analyses.concepts.schemes import Scheme
from ...base.errors import InputError
from ...core.scoring.encode import arch_of
from ..hellaswag.data import HellaswagItem
from ..hellaswag.store.counts import kfold_folds
from .runner import baseline_scorer, run_test, scorer
from .runsetup import RunSetup

if TYPE_CHECKING:
    from ...core.loading import LoadedModel
    from ..concepts.controls import Control

METRICS = ("acc", "acc_norm")
#: ``walklens hellaswag folds --json`` (:func:`picks_document`): its fields, declared with the lab's documents
FOLDS_FIELDS = (
    *("model", "summary_model", "test", "shots", "data", "pool", "command", "n", "k", "fold_seed", "fold_schemes"),
    *("kfold_acc", "kfold_acc_report", "items", "gold", "baseline", "heldout", "controls"),
)
try:  # the lab's documents join walklens.reports.schemas' registry where it exists
    from ...reports.schemas import declare, plain
except ImportError:  # pragma: no cover - an install without the registry
    pass
else:
    declare("folds", plain("fold picks document", *FOLDS_FIELDS))
TEST_NAMES = {1: "test1", 2: "test2"}


@dataclass(frozen=True)
class FoldPlan:
    """Which scheme scores which item position: per metric, the scheme of each fold and the folds' positions."""

    n: int
    k: int
    seed: int
    schemes: Mapping[str, Sequence[str]]  # metric -> one scheme per fold

    def folds(self) -> list[list[int]]:
        return [[int(i) for i in f] for f in kfold_folds(self.n, self.k, self.seed)]

    def positions(self) -> dict[str, list[int]]:
        """Per distinct scheme, the item positions some metric scores with it (sorted)."""
        out: dict[str, set[int]] = {}
        for schemes in self.schemes.values():
            for s, fold in zip(schemes, self.folds()):
                out.setdefault(s, set()).update(fold)
        return {s: sorted(p) for s, p in out.items()}


def summary_run(doc: Any, model: str, test: int, shots: int, n_items: int) -> dict[str, Any]:
    """The one run of a sweep report's ``summary.json`` (``doc``) with this model, test, shots and number of items;
    one line naming them where there is not exactly one."""
    runs = doc["runs"] if isinstance(doc, dict) and "runs" in doc else doc
    hits = [
        r
        for r in runs
        if isinstance(r, dict)
        and (r.get("model"), r.get("test"), r.get("shots"), r.get("n_items")) == (model, test, shots, n_items)
    ]
    if len(hits) != 1:
        raise InputError(f"the summary holds {len(hits)} runs of {model}, Test {test}, {shots}-shot, {n_items} items")
    return dict(hits[0])


def plan_from_summary(
    doc: Any, model: str, test: int, shots: int, n_items: int, metrics: Sequence[str] = ("acc",)
) -> tuple[FoldPlan, dict[str, Any]]:
    """The :class:`FoldPlan` of the run of a report's ``summary.json`` (``doc``) with this model, test, shots and
    number of items, for ``metrics`` (the seed's is ``acc``), and that run's ``metrics`` (one line naming what is
    missing where it is not there)."""
    run = summary_run(doc, model, test, shots, n_items)
    schemes = {m: list(v["kfold"]["fold_schemes"]) for m, v in run["metrics"].items() if m in metrics}
    if not schemes:
        raise InputError(f"the run holds none of the metrics {', '.join(metrics)}")
    k = len(next(iter(schemes.values())))
    return FoldPlan(n=n_items, k=k, seed=0, schemes=schemes), run["metrics"]


@dataclass(frozen=True)
class FoldPicks:
    """Per item position: gold, the baseline's picks, the held-out best's and each control's (per metric)."""

    items: list[int]
    gold: list[int]
    baseline: dict[str, list[int]]
    heldout: dict[str, list[int]]
    controls: dict[str, dict[str, list[int]]]


def _picks(results: Sequence[Any], metric: str) -> list[int]:
    return [int(r.pred if metric == "acc" else r.pred_norm) for r in results]


def run_folds(
    lm: LoadedModel,
    items: Sequence[HellaswagItem],
    test: int,
    plan: FoldPlan,
    setup: RunSetup,
    controls: Sequence[Control] = (),
) -> FoldPicks:
    """Score the plan on ``items`` (the sweep's, in order): the baseline on all, every fold's scheme and each
    control of it on the fold's items, each run through the results store (resumable)."""
    if len(items) != plan.n:
        raise InputError(f"the plan is of {plan.n} items, the data gives {len(items)}")
    base = run_test(lm, items, baseline_scorer(), setup, desc=f"{lm.name} baseline")
    per_scheme: dict[tuple[str, str], dict[int, Any]] = {}
    for s, pos in plan.positions().items():
        scheme = Scheme.from_spec(s, test, arch_of(lm))
        for c in (None, *controls):
            name = "test" if c is None else c.name
            sub = [items[i] for i in pos]
            summ = run_test(lm, sub, scorer(lm, TEST_NAMES[test], scheme, c), setup, desc=f"{lm.name} {name}")
            per_scheme[(s, name)] = dict(zip(pos, summ.results))
    folds = plan.folds()

    def assemble(name: str, metric: str) -> list[int]:
        out = [0] * plan.n
        for s, fold in zip(plan.schemes[metric], folds):
            for i in fold:
                r = per_scheme[(s, name)][i]
                out[i] = int(r.pred if metric == "acc" else r.pred_norm)
        return out

    metrics = list(plan.schemes)
    return FoldPicks(
        items=[it.index for it in items],
        gold=[r.gold for r in base.results],
        baseline={m: _picks(base.results, m) for m in METRICS},
        heldout={m: assemble("test", m) for m in metrics},
        controls={c.name: {m: assemble(c.name, m) for m in metrics} for c in controls},
    )


def digits(picks: Sequence[int]) -> str:
    """Picks of endings 0-3 as one digit per item (the compact form of the files)."""
    return "".join(str(int(p)) for p in picks)


def picks_document(picks: FoldPicks, plan: FoldPlan, head: Mapping[str, Any], summary: Any) -> dict[str, Any]:
    """The compact document: ``head`` (model, test, shots, command...), the plan, each row of picks as digits and
    the recomputed k-fold accuracy beside the report's (``summary``: that run's ``metrics``)."""
    acc = {m: sum(p == g for p, g in zip(picks.heldout[m], picks.gold)) / plan.n for m in picks.heldout}
    return {
        **head,
        "n": plan.n,
        "k": plan.k,
        "fold_seed": plan.seed,
        "fold_schemes": {m: list(v) for m, v in plan.schemes.items()},
        "kfold_acc": acc,
        "kfold_acc_report": {m: summary[m]["kfold"]["acc"] for m in picks.heldout if m in summary},
        "items": picks.items,
        "gold": digits(picks.gold),
        "baseline": {m: digits(v) for m, v in picks.baseline.items()},
        "heldout": {m: digits(v) for m, v in picks.heldout.items()},
        "controls": {c: {m: digits(v) for m, v in per.items()} for c, per in picks.controls.items()},
    }


__all__ = ["FoldPicks", "FoldPlan", "digits", "picks_document", "plan_from_summary", "run_folds", "summary_run"]
