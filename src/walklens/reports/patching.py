"""The patching grid's one view: a heatmap of the normalised values (clean 1, corrupted 0) with each cell's
raw metric on hover, the two references and, for attribution patching, its parity card against exact patching.  It
reads the result's JSON document (:meth:`~walklens.analyses.patching.PatchResult.document`), so ``walklens patch
--out``, the notebook view and any other reader draw the same thing from the same data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .html import Report

if TYPE_CHECKING:
    from ..analyses.patching import PatchResult


def _doc(result: PatchResult | Mapping[str, Any]) -> Mapping[str, Any]:
    return result if isinstance(result, Mapping) else result.document()


def add_grid(report: Report, doc: Mapping[str, Any]) -> Report:
    """The grid as a heatmap (rows: points, columns: positions and their tokens; hover: the raw metric), then the
    references and the parity card."""
    cols = [f"{p} {t!r}" for p, t in zip(doc["positions"], doc["tokens"])]
    hover = [[f"{doc['metric']} = {'nan' if r is None else f'{r:.6g}'}" for r in row] for row in doc["raw"]]
    report.heatmap(
        doc["values"],
        row_labels=doc["points"],
        col_labels=cols,
        title=f"{doc['method']} patching, {doc['direction']}: 1 = the clean run, 0 = the corrupted run",
        hover=hover,
        diverging=True,
        vmin=-1.0,
        vmax=1.0,
    )
    report.table(
        ["reference", doc["metric"]],
        [["clean run", doc["clean_metric"]], ["corrupted run", doc["corrupted_metric"]]],
    )
    parity = doc.get("parity")
    if parity:
        rows = [["all cells", parity["spearman"], parity["topk_overlap"], parity["cells"]]]
        rows += [[kind, v["spearman"], v["topk_overlap"], v["cells"]] for kind, v in parity["by_kind"].items()]
        report.h2("Attribution patching against exact patching (the parity card)")
        report.table(["cells", "Spearman", f"top-{parity['k']} overlap", "n"], rows)
        verdict = "agrees" if parity["agrees"] else "DISAGREES"
        report.p(
            f"Attribution patching {verdict} with exact patching on the same cells (thresholds: Spearman >= "
            f"{parity['min_spearman']:g}, top-{parity['k']} overlap >= {parity['min_topk_overlap']:g}).",
            note=True,
        )
    for note in doc.get("notes", []):
        report.p(note, note=True)
    return report


def build(result: PatchResult | Mapping[str, Any]) -> Report:
    """The page of a patching grid (a :class:`PatchResult` or its document)."""
    doc = _doc(result)
    sub = f"{doc['model']}: {len(doc['points'])} points x {len(doc['positions'])} positions, {doc['metric']}"
    return add_grid(Report(f"{doc['method'].capitalize()} patching ({doc['direction']})", sub), doc)


__all__ = ["add_grid", "build"]
