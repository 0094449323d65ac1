"""The position-kernels report (``walklens kernels``; seed 000, A.2, Figs. 6, 8) and its JSON document: each
head's kernel per stack and the self-bias fractions.  Draws a :class:`~walklens.analyses.kernels.PositionKernels`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .html import Report, fields_of

if TYPE_CHECKING:
    from ..analyses.kernels import PositionKernels, StackKernels


#: the fields of a stack's kernels in their own units; ``logit_only`` documents keep ``log_values`` alone
RAW = ("values", "spread", "ci95")


def stack_document(s: StackKernels, *, logit_only: bool = False) -> dict[str, Any]:
    """The document of one :class:`~walklens.analyses.kernels.StackKernels` (A.2): every field, each kernel's class
    label (``labels`` [K][H]) and the fractions per class; ``logit_only``: without :data:`RAW`."""
    return {
        **fields_of(s, (*RAW, "samples") if logit_only else ("samples",)),
        "labels": [[c.label for c in row] for row in s.classes],
        "fractions": s.fractions(),
    }


def document(pk: PositionKernels, *, logit_only: bool = False) -> dict[str, Any]:
    """The ``--json`` document: every field, kernels, classes and fractions of every stack
    (:func:`stack_document`), the margin sweep; the explorer sends it too (``logit_only``)."""
    return {
        "model": pk.model_name,
        **fields_of(pk, ("stacks",)),
        "fractions": pk.fractions(),
        "margin_sweep": pk.margin_sweep(),
        "stacks": [stack_document(s, logit_only=logit_only) for s in pk.stacks],
    }


def add_kernels(report: Report, pk: PositionKernels) -> Report:
    """Position kernels (Figs. 6, 8) per stack, and the self-bias fractions (A.2)."""
    report.h2(f"position kernels ({pk.scheme}, {pk.units})")
    report.p(pk.estimator, note=True)
    if pk.notes and pk.notes != pk.estimator:
        report.p(pk.notes, note=True)
    _class_tables(report, pk)
    for s in pk.stacks:
        _stack_kernels(report, s, pk.units)
    return report


def _class_tables(report: Report, pk: PositionKernels) -> None:
    """The self-bias classes (A.2): the fraction of kernels in each class per stack, at the margin used and at
    the other margins."""
    report.h2(f"self-bias classes (margin {pk.margin:g} nats)")
    fr = pk.fractions()
    cols = ["negative_self", "far_amplifying", "local", "flat"]
    report.table(
        ["stack", "kernels", *cols],
        [
            [st, sum(len(r) for r in pk.stack(st if st != "model" else "").classes), *[f"{f[c]:.1%}" for c in cols]]
            for st, f in fr.items()
        ],
    )
    sweep = pk.margin_sweep()
    rows = []
    for st, per in sweep.items():
        for m, f in per.items():
            rows.append([st, m, f"{f['negative_self']:.1%}", f"{f['far_amplifying']:.1%}"])
    report.p("fractions for other margins:", note=True)
    report.table(["stack", "margin", "negative self-bias", "far-amplifying"], rows)


def _stack_kernels(report: Report, s: StackKernels, units: str) -> None:
    """One stack's kernels (Figs. 6, 8): every kernel relative to distance 0, drawn from :func:`stack_document` by
    ``walklensResults.kernelStack`` (the explorer's kernels view draws it too), the curves, and each kernel's
    class."""
    H = s.values.shape[1]
    row_labels = [f"{'L' + str(l) + ' ' if l is not None else ''}h{h}" for l in s.layers for h in range(H)]
    labels = [c.label for row in s.classes for c in row]
    report.result("kernel_stack", stack_document(s))
    _kernel_curves(report, s, labels, units)
    report.table(["kernel", "class"], [[row_labels[r], labels[r]] for r in range(len(labels))])


def _kernel_curves(report: Report, s: StackKernels, labels: list[str], units: str) -> None:
    """The kernels as curves: every head's where a kernel is shared by every layer (Figs. 6 and 8), else each
    head's at the first, middle and last layer with its 95% CI band."""
    name = s.stack or "model"
    K, H, _ = s.values.shape
    if s.layers == [None]:  # one kernel per head: draw them as curves (Figs. 6 and 8)
        for start in range(0, H, 8):
            series = [{"name": f"h{h} ({labels[h]})", "y": s.values[0, h]} for h in range(start, min(H, start + 8))]
            report.lines(
                s.distances,
                series,
                title=f"{name}: heads {start}-{min(H, start + 8) - 1}",
                xlabel="distance (key - query)",
            )
    else:  # per-layer (empirical) kernels: curves with 95% CI bands for the first, middle and last layer
        for r in sorted({0, K // 2, K - 1}):
            band = s.ci95[r] if s.ci95 is not None else None
            series = [
                {
                    "name": f"h{h} ({labels[r * H + h]})",
                    "y": s.values[r, h],
                    **({"band": [s.values[r, h] - band[h], s.values[r, h] + band[h]]} if band is not None else {}),
                }
                for h in range(H)
            ]
            report.lines(
                s.distances,
                series,
                title=f"{name}: layer {s.layers[r]} ({units}, 95% CI bands)",
                xlabel="distance (key - query)",
            )


def build(
    pk: PositionKernels, title: str, subtitle: str = "position kernels and self-bias (seed 000, A.2, Figs. 6, 8)"
) -> Report:
    """The ``walklens kernels`` report."""
    return add_kernels(Report(title, subtitle), pk)


__all__ = ["RAW", "add_kernels", "build", "document", "stack_document"]
