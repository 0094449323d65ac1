"""The steering report (``walklens steer``; seed 002): target probability, rank and perplexity against the
strength for eigen-steering and activation addition, and the generations.  It draws a
:class:`~walklens.steering.SteeringSweep` (which is also the ``--json`` document); it never loads a model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .html import Report, pyplot

if TYPE_CHECKING:
    from ..steering import SteeringSweep


def steering_figure(sweep: SteeringSweep) -> Any:
    plt = pyplot()
    metrics = (("target_prob", "mean p(target)", "mean"), ("target_rank", "median rank of target (0 = top)", "median"),
               ("perplexity", "median perplexity (unsteered model)", "median"))
    fig, axes = plt.subplots(len(sweep.methods), 3, figsize=(13, 3.4 * len(sweep.methods)), squeeze=False)
    names = {"eigen": "eigen-steering", "add": "activation addition"}
    for row, m in zip(axes, sweep.methods):
        for ax, (metric, label, stat) in zip(row, metrics):
            for s in sweep.layer_sets:
                xs, ys = sweep.curve(m, s, metric, stat)
                ax.plot(xs, ys, "o-", ms=3, label="layers " + ",".join(map(str, s)))
            ax.set_title(f"{names.get(m, m)}: {label}")
            ax.set_xlabel("alpha")
            if metric in ("target_rank", "perplexity"):
                ax.set_yscale("symlog" if metric == "target_rank" else "log")  # 0-based ranks can be 0
        row[0].legend(fontsize=8)
    fig.suptitle(f"{sweep.model_name}: steering toward {sweep.target_token!r} over {len(sweep.prompts)} prompts")
    fig.tight_layout()
    return fig


def build(sweep: SteeringSweep, title: str = "") -> Report:
    """The ``walklens steer`` report: target probability / rank / perplexity against alpha for each method
    and layer set, and the generations."""
    r = Report(title or f"Steering {sweep.model_name} toward {sweep.target_token!r}",
               "Eigen-steering (seed 002: rank-one W_O edit, F' = F + alpha w u^T) next to activation addition "
               "(alpha u added to the residual at the same layers).")
    r.p("reach |P u| of the target direction in each layer's value space: "
        + ", ".join(f"L{l}: {v:.3f}" for l, v in sorted(sweep.reach.items())), note=True)
    names = {"eigen": "Eigen-steering", "add": "Activation addition"}
    for m in sweep.methods:
        r.h2(names.get(m, m))
        for metric, label in (("target_prob", "p(target)"), ("target_rank", "rank of target (0 = top)"),
                              ("perplexity", "perplexity under the unsteered model"), ("push", "push along u")):
            series = []
            xs: list[float] = []
            for s in sweep.layer_sets:
                xs, ys = sweep.curve(m, s, metric)
                series.append({"name": "layers " + ",".join(map(str, s)), "y": ys})
            r.lines([f"{a:g}" for a in xs], series, title=f"{label} (mean over {len(sweep.prompts)} prompts)",
                    xlabel="alpha", height=240)
    r.figure(steering_figure(sweep), "steering", embed=False)  # repeats the charts above
    r.h2("Generations")
    rows = [[x.method, ",".join(map(str, x.layers)), x.alpha, x.prompt, x.text, x.target_prob, x.target_rank,
             x.perplexity] for x in sweep.rows]
    r.table(["method", "layers", "alpha", "prompt", "greedy continuation", "p(target)", "rank (0 = top)", "ppl"], rows)
    return r


__all__ = ["build", "steering_figure"]
