"""The compression-retention curves of context compaction (seed 000, footnote 11; docs/compaction.md): one
figure per model (rows: ``acc_norm`` kept, ``acc`` kept, scoring time saved; columns: shots x part compacted),
a table and the points as CSV and JSON (:func:`document`)."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import TYPE_CHECKING, Any

from ...base.outputs import csv_row, jsonable
from ...reports.html import Report, fields_of, pyplot

if TYPE_CHECKING:
    from ..experiments.curves import CurvePoint, CurveSet

_STYLE = {"method=avgpool,bounds=even": dict(ls="--", marker="s"), "method=drop": dict(ls=":", marker="x")}
CSV_FIELDS = (
    "shots",
    "what",
    "strategy",
    "ratio",
    "n",
    "acc",
    "acc_norm",
    "kept_acc",
    "kept_acc_lo",
    "kept_acc_hi",
    "kept_acc_norm",
    "kept_acc_norm_lo",
    "kept_acc_norm_hi",
    "tokens_per_vector",
    "inputs",
    "inputs_full",
    "seconds_score",
    "seconds_vectors",
    "seconds_full_score",
    "spec",
)


def row(p: CurvePoint) -> dict[str, Any]:
    """One CSV row of a point (``ratio``: ``max`` for one vector; empty where a value does not apply)."""
    r = "" if p.ratio is None else ("max" if math.isinf(p.ratio) else p.ratio)
    return {
        "shots": p.shots,
        "what": p.what,
        "strategy": p.strategy,
        "ratio": r,
        "n": p.n,
        "acc": p.acc,
        "acc_norm": p.acc_norm,
        "kept_acc": p.kept_acc,
        "kept_acc_lo": p.kept_acc_ci[0],
        "kept_acc_hi": p.kept_acc_ci[1],
        "kept_acc_norm": p.kept_acc_norm,
        "kept_acc_norm_lo": p.kept_acc_norm_ci[0],
        "kept_acc_norm_hi": p.kept_acc_norm_ci[1],
        "tokens_per_vector": p.tokens_per_vector,
        "inputs": p.inputs,
        "inputs_full": p.inputs_full,
        "seconds_score": p.seconds.get("score"),
        "seconds_vectors": p.seconds.get("vectors"),
        "seconds_full_score": p.seconds.get("full_score"),
        "spec": p.spec,
    }


def to_csv(curves: CurveSet) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(CSV_FIELDS))
    w.writeheader()
    for p in curves.points:
        w.writerow(csv_row({k: ("" if v is None else v) for k, v in row(p).items()}))
    return buf.getvalue()


def _x(p: CurvePoint) -> float:
    """Where a point sits: its achieved tokens per vector (the nominal ratio when unknown)."""
    if p.tokens_per_vector is not None and math.isfinite(p.tokens_per_vector):
        return p.tokens_per_vector
    return p.ratio if p.ratio is not None and math.isfinite(p.ratio) else math.nan


def figure(curves: CurveSet) -> Any:
    """The curves of one model (module docstring)."""
    plt = pyplot()
    panels = sorted({(p.shots, p.what) for p in curves.points})
    fig, axes = plt.subplots(
        3, max(1, len(panels)), figsize=(4.2 * max(1, len(panels)), 10.5), squeeze=False, layout="constrained"
    )
    for j, (shots, what) in enumerate(panels):
        pts = [p for p in curves.points if (p.shots, p.what) == (shots, what)]
        strategies = list(dict.fromkeys(p.strategy for p in pts if p.strategy not in ("full", "zero-shot")))
        for i, (metric, label) in enumerate((("kept_acc_norm", "acc_norm kept"), ("kept_acc", "acc kept"))):
            _kept_panel(axes[i][j], pts, strategies, metric, label, f"{shots}-shot, compacting the {what}")
        _time_panel(axes[2][j], pts, strategies)
    # one legend for every panel, below them, where it hides no point (an axes' "best" spot can cover some)
    labelled = {label: h for ax in axes[0] for h, label in zip(*ax.get_legend_handles_labels())}
    if labelled:
        fig.legend(
            list(labelled.values()),
            list(labelled),
            loc="outside lower center",
            fontsize=7,
            ncol=min(3, len(labelled)),
            frameon=False,
        )
    fig.suptitle(f"{curves.model}: HellaSwag, {curves.n_items} items\n{curves.interval}", fontsize=8)
    return fig


def _kept_panel(ax: Any, pts: list[CurvePoint], strategies: list[str], metric: str, label: str, title: str) -> None:
    """One panel of retention (``metric``: ``kept_acc_norm`` or ``kept_acc``) against the compacted tokens per
    vector, each strategy with its interval, next to the full context (1) and zero-shot."""
    ax.axhline(1.0, color="0.3", lw=0.8)
    zero = next((p for p in pts if p.strategy == "zero-shot"), None)
    if zero is not None and getattr(zero, metric) is not None:
        ax.axhline(getattr(zero, metric), color="tab:red", lw=1, ls="-.", label="zero-shot")
    for s in strategies:
        ps = sorted((p for p in pts if p.strategy == s and getattr(p, metric) is not None), key=_x)
        xs = [_x(p) for p in ps]
        ys = [getattr(p, metric) for p in ps]
        ci = [getattr(p, metric + "_ci") for p in ps]
        err = [
            [y - (c[0] if c[0] is not None else y) for y, c in zip(ys, ci)],
            [(c[1] if c[1] is not None else y) - y for y, c in zip(ys, ci)],
        ]
        ax.errorbar(xs, ys, yerr=err, capsize=2, lw=1.2, label=s, **_STYLE.get(s, dict(marker="o")))
    _plain_log2_x(ax)
    ax.set_ylabel(label)
    ax.set_title(title, fontsize=9)


def _plain_log2_x(ax: Any) -> None:
    """A log-2 x axis labelled with plain numbers ("8", not "2^3")."""
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def _time_panel(ax: Any, pts: list[CurvePoint], strategies: list[str]) -> None:
    """One panel of the scoring time each strategy saves against the full context."""
    for s in strategies:
        ps = sorted(
            (p for p in pts if p.strategy == s and p.seconds.get("score") is not None and p.seconds.get("full_score")),
            key=_x,
        )
        ax.plot(
            [_x(p) for p in ps],
            [1 - p.seconds["score"] / p.seconds["full_score"] for p in ps],
            lw=1.2,
            label=s,
            **_STYLE.get(s, dict(marker="o")),
        )
    ax.axhline(0.0, color="0.3", lw=0.8)
    if any(len(line.get_xdata()) for line in ax.lines[:-1]):  # a log axis needs a point (timings may be none)
        _plain_log2_x(ax)
    ax.set_xlabel("compacted tokens per vector")
    ax.set_ylabel("scoring time saved")


def document(curves: CurveSet) -> dict[str, Any]:
    """The JSON document of the curves (footnote 11): every field of the :class:`~walklens.lab.experiments.curves.
    CurveSet` (its points with every field each); ``curves.json`` of the report holds it."""
    return fields_of(curves)


def build(curves: CurveSet) -> Report:
    """The report: the figure, a table of every point, the tuning outcome, ``curves.csv`` and ``curves.json``."""
    rep = Report(
        f"Compaction curves: {curves.model}",
        f"HellaSwag, {curves.n_items} reported items, {curves.n_tune} tuning items; {curves.interval}",
    )
    rep.figure(figure(curves), f"compaction_{curves.model.replace('/', '_')}")
    rep.h2("Points")
    rows = []
    for p in curves.points:
        r = row(p)
        rows.append(
            [
                p.shots,
                p.what,
                p.strategy,
                str(r["ratio"]),
                p.n,
                p.acc_norm,
                "-" if p.kept_acc_norm is None else f"{p.kept_acc_norm:.3f}",
                "-" if p.kept_acc is None else f"{p.kept_acc:.3f}",
            ]
        )
    rep.table(["shots", "part", "strategy", "ratio", "n", "acc_norm", "acc_norm kept", "acc kept"], rows)
    rep.h2("Tuning")
    rep.p(json.dumps(jsonable({w: {k: v for k, v in t.items() if k != "candidates"} for w, t in curves.tuned.items()})))
    rep.attach("curves.csv", to_csv(curves))
    rep.attach("curves.json", json.dumps(jsonable(document(curves)), indent=1))
    return rep


__all__ = ["CSV_FIELDS", "build", "document", "figure", "row", "to_csv"]
