"""The steering cards view: the cards given at start (``walklens serve --card FILE``, each the ``--json``
document of ``walklens steer --card SET``; the browser never names a file), listed, and one drawn as its report
draws it: the report's own parts (:func:`walklens.lab.reports.steercard.view`: dose-response curves with their
bootstrap bands, Pareto fronts, the choices table and example continuations), sent as data and drawn by the
reports' script (``results.js``, ``parts``), every string as text."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from ..lab.reports import steercard as card_report
from .bounds import ApiError, int_arg
from .routing import api
from .state import Explorer, Job, run_job


@api(exact=True)
async def cards(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """-> the steering cards given at start: per card its index, file name, model, set and cell count."""
    return {
        "cards": [
            {"id": i, "file": name, "model": c.model_name, "set": c.set_name, "n_cells": len(c.cells)}
            for i, (name, c) in enumerate(ex.cards)
        ]
    }


@api
async def card(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{card}`` (an index of ``/api/cards``) -> its title and the parts of its report (built once, cached)."""
    if not ex.cards:
        raise ApiError("no steering card: start walklens serve with --card FILE", 404)
    i = int_arg(body, "card", None, 0, len(ex.cards) - 1)

    def compute(job: Job) -> dict[str, Any]:
        name, c = ex.cards[i]
        title = f"Steering card: {c.model_name} on {c.set_name}"
        return ex.results.get(("card", i), lambda: {"file": name, "title": title, "parts": card_report.view(c)})

    return await run_job(request, ex, None, compute)
