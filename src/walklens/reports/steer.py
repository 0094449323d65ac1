"""The steering report (``walklens steer``; seed 002) and its JSON document: target probability, rank,
perplexity and push against the strength for eigen-steering and activation addition, and every run.  It draws
a :class:`~walklens.analyses.steering.SteeringSweep`; it never loads a model.

:func:`document` is the ``--json`` document; the page's table of runs is drawn from it by
``assets/results.js``, and the explorer's steering playground (``walklens serve``) gets the same document from
its API and draws its runs with the same script."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .html import Report, fields_of, pyplot

if TYPE_CHECKING:
    from ..analyses.steering import SteeringSweep

#: the curves against alpha, each a :class:`~walklens.analyses.steering.SteerRow` field: (field, label, statistic over
#: the prompts); the page's charts, the PNG and the terminal's table (``walklens steer``) all show these, each with
#: its one statistic; coherence as the steering card measures it (KL on neutral text, repetition, distinct-2)
METRICS = (
    ("target_prob", "p(target)", "mean"),
    ("target_rank", "rank of target (0 = top)", "median"),
    ("kl", "KL(unsteered || steered) on neutral text", "mean"),
    ("repetition", "share of repeated 3-grams", "mean"),
    ("distinct", "distinct-2 of the continuation", "mean"),
    ("push", "push along u", "mean"),
)
#: the terminal's short column names of :data:`METRICS`: (field, short name, statistic)
COLUMNS = tuple(
    (f, short, stat)
    for (f, _, stat), short in zip(METRICS, ("p(target)", "rank (0 = top)", "KL neutral", "repeated 3-grams",
                                             "distinct-2", "push along u"))
)  # fmt: skip
NAMES = {"eigen": "Eigen-steering", "add": "Activation addition"}


def document(sweep: SteeringSweep) -> dict[str, Any]:
    """The ``--json`` document (seed 002): every field of the sweep, each run a row of every
    :class:`~walklens.analyses.steering.SteerRow` field."""
    return fields_of(sweep)


def signs(sweep: SteeringSweep, method: str, layers: list[int]) -> dict[float, str]:
    """Eigen-steering's sign per alpha of one layer set (``"+"``, ``"-"``, or ``"±"`` where it differed
    between rows); empty for activation addition."""
    if method != "eigen":
        return {}
    out: dict[float, set[int]] = {}
    for r in sweep.rows:
        if r.method == method and list(r.layers) == list(layers) and r.alpha != 0:
            out.setdefault(r.alpha, set()).add(r.sign)
    return {a: "±" if len(v) > 1 else "+" if 1 in v else "-" for a, v in out.items()}


def steering_figure(sweep: SteeringSweep) -> Any:
    """Matplotlib figure: one row per method, one panel per :data:`METRICS` entry, one curve per layer set."""
    plt = pyplot()
    fig, axes = plt.subplots(len(sweep.methods), len(METRICS), figsize=(17, 3.4 * len(sweep.methods)), squeeze=False)
    for row, m in zip(axes, sweep.methods):
        for ax, (metric, label, stat) in zip(row, METRICS):
            for s in sweep.layer_sets:
                xs, ys = sweep.curve(m, s, metric, stat)
                ax.plot(xs, ys, "o-", ms=3, label="layers " + ",".join(map(str, s)))
            ax.set_title(f"{NAMES.get(m, m)}: {stat} {label}", fontsize=9)
            ax.set_xlabel("alpha")
            if metric == "target_rank":
                ax.set_yscale("symlog")  # 0-based ranks can be 0
        row[0].legend(fontsize=8)
    fig.suptitle(f"{sweep.model_name}: steering toward {sweep.target_token!r} over {len(sweep.prompts)} prompts")
    fig.tight_layout()
    return fig


def build(sweep: SteeringSweep, title: str = "") -> Report:
    """The ``walklens steer`` report: the :data:`METRICS` against alpha for each method and layer set, and every
    run (drawn from :func:`document`)."""
    r = Report(
        title or f"Steering {sweep.model_name} toward {sweep.target_token!r}",
        "Activation addition (alpha u added to the residual at the layers) and eigen-steering (seed 002: "
        "rank-one W_O edit, F' = F + alpha w u^T, its sign chosen on the prompts so that a positive alpha raises "
        "the target); coherence as the steering card measures it: KL on neutral text, repetition, distinct-2.",
    )
    r.p(
        "reach |P u| of the target direction in each layer's value space: "
        + ", ".join(f"L{l}: {v:.3f}" for l, v in sorted(sweep.reach.items())),
        note=True,
    )
    for m in sweep.methods:
        r.h2(NAMES.get(m, m))
        for metric, label, stat in METRICS:
            series = []
            xs: list[float] = []
            values: list[float] = []
            for s in sweep.layer_sets:
                xs, ys = sweep.curve(m, s, metric, stat)
                series.append({"name": "layers " + ",".join(map(str, s)), "y": ys})
                values += ys
            if all(math.isnan(y) for y in values):  # e.g. no 3-gram in a 2-token continuation
                r.p(f"{label}: not defined for any run (NaN: the continuations are too short)", note=True)
                continue
            r.lines(
                [f"{a:g}" for a in xs],
                series,
                title=f"{label} ({stat} over {len(sweep.prompts)} prompts)",
                xlabel="alpha",
                height=240,
            )
    r.figure(steering_figure(sweep), "steering", embed=False)  # repeats the charts above
    r.h2("Generations")
    r.result("steering", document(sweep))
    return r


__all__ = ["COLUMNS", "METRICS", "build", "document", "signs", "steering_figure"]
