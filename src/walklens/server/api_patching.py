"""The patching view: the documents given at start (``walklens serve --patch FILE``, each the ``--json`` of
``walklens patch`` or the walk beside the test of one or several models; the browser never names a file), listed, and
one sent as it is: the page draws it with the reports' own functions (``results.js``: ``patching``,
``walk_beside``), as the report and the notebook view do, every string as text."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from ..reports import patching as patching_report
from .bounds import ApiError, int_arg
from .routing import api
from .state import Explorer


@api(exact=True)
async def patches(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """-> the patching documents given at start: per document its index, file name, kind and title."""
    return {
        "patches": [
            {"id": i, "file": name, "kind": d["kind"], "title": patching_report.title(d)}
            for i, (name, d) in enumerate(ex.patches)
        ]
    }


@api
async def patch(request: Request, ex: Explorer, body: dict[str, Any]) -> dict[str, Any]:
    """``{patch}`` (an index of ``/api/patches``) -> its file, title and subtitle and the document under its kind
    (``patching`` or ``walk_beside``)."""
    if not ex.patches:
        raise ApiError("no patching document: start walklens serve with --patch FILE", 404)
    i = int_arg(body, "patch", None, 0, len(ex.patches) - 1)
    name, d = ex.patches[i]
    return {
        "id": i,
        "file": name,
        "title": patching_report.title(d),
        "subtitle": patching_report.subtitle(d),
        d["kind"]: d,
    }
