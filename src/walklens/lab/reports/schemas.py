"""The lab's documents and the explorer's replies that carry them, declared into the one registry of
:mod:`walklens.reports.schemas` (the instrument never imports the lab, so the lab declares its own, the same way):
a sweep's ``summary.json`` (:func:`.sweep.document`), compaction's curves (:func:`.curves.document`,
``curves.csv``), the steering card (:func:`.steercard.document`, and its report's parts the explorer draws), and
the files the lab's commands compose (``walklens hellaswag concept-eval`` and ``test1|test2 --json``)."""

from __future__ import annotations

from ...reports.schemas import VALUE, ListOf, MapOf, declare, plain, record_of, reply
from ..concepteval import ConceptEval
from ..experiments.curves import CurveSet
from ..experiments.heldout import Paired
from ..experiments.summary import MetricSummary, RunSummary
from ..steeringcard import SteeringCard
from .curves import CSV_FIELDS

RUN = record_of(RunSummary, "sweep run")
#: ``walklens report``'s document; its ``summary.json`` holds the runs
SWEEP = declare("sweep", plain("sweep document", "source", runs=ListOf(RUN)))
declare("curves", record_of(CurveSet, "curves document"))
#: compaction's ``curves.csv``: one row per point, the columns :data:`.curves.CSV_FIELDS`
declare("curves_csv", ListOf(plain("curves row", *CSV_FIELDS)))
declare("steering_card", record_of(SteeringCard, "steering card document"))
#: a report's parts as data (:class:`.steercard.Parts`), drawn by ``walklensResults.draw.parts``: each a ``part``
#: (h2, p, table or lines) and the fields of its kind
PART_FIELDS = ("text", "note", "headers", "rows", "title", "spec")
PARTS = declare(
    "parts",
    ListOf(plain("part", "part", *PART_FIELDS, optional=PART_FIELDS)),
)

declare("concept_eval", record_of(ConceptEval, "concept-eval document", add={"model": VALUE}))
#: the run against the baseline on the same items, per metric (:func:`..experiments.heldout.paired_against`)
PAIRED_FIGURES = plain(
    "paired figures",
    "acc",
    "lo",
    "hi",
    "baseline",
    "baseline_lo",
    "baseline_hi",
    "norm",
    "norm_lo",
    "norm_hi",
    paired=record_of(Paired),
)
#: ``walklens hellaswag test1|test2|baseline --json`` (cli/hellaswag.py)
declare(
    "hellaswag_run",
    plain(
        "HellaSwag run document",
        "model",
        "data",
        "split",
        "shots",
        "test",
        "compact",
        "scheme",
        "n",
        "acc",
        "acc_norm",
        "computed",
        "db",
        "command",
        "skip",
        "predictions",
        "gold",
        "baseline_predictions",
        baseline=plain("baseline", "acc", "acc_norm"),
        normalised=plain("normalised", "acc", "acc_norm"),
        paired=plain("paired", "n", acc=PAIRED_FIGURES, acc_norm=PAIRED_FIGURES),
    ),
)

# ---- the explorer's sweeps and cards views (server/api_sweeps.py, api_cards.py) -------------------------------------

SWEEP_ROW = plain("sweep run row", "id", "model", "data", "split", "shots", "test", "n_items", "arch")
reply("/api/sweeps", plain("sweeps reply", "db", "name", runs=ListOf(SWEEP_ROW)))
reply(
    "/api/sweeps/run",
    plain(
        "sweep run reply",
        "run",
        "metric",
        "metrics",
        "n_schemes",
        "n_matching",
        filters=MapOf(None),
        parameters=MapOf(None),
        summary=record_of(MetricSummary),
    ),
)
CARD_ROW = plain("card row", "id", "file", "model", "set", "n_cells")
reply("/api/cards", plain("cards reply", cards=ListOf(CARD_ROW)))
reply("/api/card", plain("card reply", "file", "title", parts=PARTS))

__all__: list[str] = []  # declared into walklens.reports.schemas; nothing exported here
