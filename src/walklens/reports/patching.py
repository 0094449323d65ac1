"""The patching views, each drawn from its result's JSON document by one function of the reports' script
(``assets/results.js``), so ``walklens patch --out``, the notebook view and the explorer (``walklens serve --patch``)
draw the same thing from the same data:

- the grid (:meth:`~walklens.analyses.patching.PatchResult.document`, ``walklensResults.draw.patching``): a heatmap
  of the normalised values (clean 1, corrupted 0) with each cell's raw metric on hover, the two references and, for
  attribution patching, its parity card; path patching's rows are the receivers of its sender's change;
- the walk beside the test (:meth:`~walklens.analyses.patching.WalkBeside.document`,
  ``walklensResults.draw.walk_beside``): per layer, the restoration at the last position beside the answer's rank
  in the walk, both first layers marked, then the grid."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..base.errors import InputError
from .html import Report
from .schemas import DOCUMENTS, Record

if TYPE_CHECKING:
    from ..analyses.patching import PatchResult, WalkBeside

#: the document kinds these views draw
KINDS = ("patching", "walk_beside")


def _doc(result: Any) -> Mapping[str, Any]:
    return result if isinstance(result, Mapping) else result.document()


def title(doc: Mapping[str, Any]) -> str:
    """A document's title: ``Path patching (denoise) from L0.H1``, or the walk beside the test of a model."""
    if doc.get("kind") == "walk_beside":
        return f"The walk beside the test: {doc['model']}"
    sender = f" from {doc['sender']}" if doc.get("method") == "path" and doc.get("sender") else ""
    return f"{str(doc['method']).capitalize()} patching ({doc['direction']}){sender}"


def subtitle(doc: Mapping[str, Any]) -> str:
    """A document's second line: the model, the grid's size (path patching: receivers) and the metric."""
    if doc.get("kind") == "walk_beside":
        return f"{doc['clean']!r} against {doc['corrupted']!r}, {doc['metric']}"
    rows = "receivers" if doc.get("method") == "path" else "points"
    return f"{doc['model']}: {len(doc['points'])} {rows} x {len(doc['positions'])} positions, {doc['metric']}"


def add_grid(report: Report, doc: Mapping[str, Any]) -> Report:
    """The grid, drawn by ``walklensResults.draw.patching`` from its document."""
    return report.result("patching", doc)


def build(result: PatchResult | Mapping[str, Any]) -> Report:
    """The page of a patching grid (a :class:`PatchResult` or its document)."""
    doc = _doc(result)
    return add_grid(Report(title(doc), subtitle(doc)), doc)


def add_beside(report: Report, doc: Mapping[str, Any]) -> Report:
    """The walk beside the test, drawn by ``walklensResults.draw.walk_beside`` from its document."""
    return report.result("walk_beside", doc)


def build_beside(results: WalkBeside | Mapping[str, Any] | Sequence[WalkBeside | Mapping[str, Any]]) -> Report:
    """The page of the walk beside the test for one model or several (results or their documents), one section
    each."""
    many = [results] if isinstance(results, Mapping) or hasattr(results, "document") else list(results)
    docs = [_doc(r) for r in many]
    if len(docs) == 1:
        return add_beside(Report(title(docs[0]), subtitle(docs[0])), docs[0])
    rep = Report("The walk beside the test", ", ".join(str(d["model"]) for d in docs))
    for d in docs:
        rep.h2(f"{d['model']}: {subtitle(d)}")
        add_beside(rep, d)
    return rep


def _checked(doc: Any, node: Any, where: str) -> None:
    if not isinstance(node, Record):
        return
    if not isinstance(doc, Mapping):
        raise InputError(f"{where}: not a JSON object")
    missing = sorted(node.names - node.optional - doc.keys())
    if missing:
        raise InputError(f"{where}: no field {missing[0]!r}")


def _lists(doc: Mapping[str, Any], names: str, n: int | None, where: str) -> int:
    """The length the lists ``names`` of ``doc`` share (``n`` when given); refused in one line otherwise."""
    for name in names.split():
        v = doc[name]
        if not isinstance(v, list) or (n is not None and len(v) != n):
            raise InputError(f"{where}: {name} is not a list" + (f" of {n}" if n is not None else ""))
        n = len(v)
    return n or 0


def _grid(grid: Mapping[str, Any], where: str) -> None:
    """A grid's labels and values of one shape: [points x positions], a token per position."""
    rows, cols = _lists(grid, "points", None, where), _lists(grid, "positions tokens", None, where)
    for name in ("values", "raw"):
        v = grid[name]
        if not isinstance(v, list) or len(v) != rows or any(not isinstance(r, list) or len(r) != cols for r in v):
            raise InputError(f"{where}: {name} is not a grid of {rows} x {cols} cells")


def checked(doc: Any, where: str = "the document") -> list[dict[str, Any]]:
    """The documents of a patching view in ``doc`` (one, or a list of them: the walk beside the test of several
    models), each checked to hold its declared fields, lists of one length per axis and a grid of its labels'
    shape; refused in one line."""
    docs = doc if isinstance(doc, list) else [doc]
    if not docs:
        raise InputError(f"{where}: an empty list")
    for i, d in enumerate(docs):
        at = f"{where}[{i}]" if isinstance(doc, list) else where
        kind = d.get("kind") if isinstance(d, Mapping) else None
        if kind not in KINDS:
            raise InputError(f"{at}: not a patching document (kind {kind!r}; the --json of walklens patch)")
        _checked(d, DOCUMENTS[kind], at)
        grid = d["patch"] if kind == "walk_beside" else d
        _checked(grid, DOCUMENTS["patching"], f"{at}.patch" if kind == "walk_beside" else at)
        _grid(grid, f"{at}.patch" if kind == "walk_beside" else at)
        if kind == "walk_beside":
            n = _lists(d, "layers restored restored_raw", None, at)
            _lists(d, "levels", None, at), _lists(d, "readings", None, at)
            for j, r in enumerate(d["readings"]):
                _checked(r, DOCUMENTS[kind].fields["readings"].of, f"{at}.readings[{j}]")  # type: ignore[union-attr]  # a list field's Record
                _lists(r, "ranks", n, f"{at}.readings[{j}]")
            for j, lv in enumerate(d["levels"]):
                _checked(lv, DOCUMENTS[kind].fields["levels"].of, f"{at}.levels[{j}]")  # type: ignore[union-attr]  # a list field's Record
    return docs


__all__ = ["KINDS", "add_beside", "add_grid", "build", "build_beside", "checked", "subtitle", "title"]
