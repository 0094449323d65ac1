"""The sweep report (``walklens report``; seed 000, Fig. 10 and Figs. 13-16): the dataclasses of
:func:`walklens.lab.experiments.summary.summarise_db` drawn as a page, charts and tables.

For every sweep run in a database (one model, shot count and test): the top-10 schemes table with their
parameters, accuracy and normalised score (like Figs. 13-16), the honest best scores (in-sample, split-half and
k-fold held-out with 95% intervals; :mod:`walklens.lab.experiments.stats`), the distribution of scores across the grid
next to chance, and per-parameter marginal effects (mean and best normalised score per value).  Across models:
the normalised-score bar chart with a marker for each model's best scheme (like Fig. 10), here with the
held-out best beside the in-sample one.

:func:`document` is the JSON document of the summaries; :func:`build` returns the :class:`~.html.Report`; saving it
writes ``index.html`` (self-contained, offline), PNG
charts, CSV tables (``summary.csv``, ``top10_*.csv``, ``marginals_*.csv``), ``summary.json`` (every summary)
and ``summary.md`` (the summary table in Markdown).  Nothing here reads the database or computes a statistic.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...analyses.concepts.schemes import Scheme
from ...base.outputs import csv_cell, csv_row, jsonable
from ...reports.html import Report, pyplot
from ..experiments.heldout import corrected
from ..experiments.summary import MetricSummary, RunSummary

PARAMS = ("enc", "layer", "word", "norm", "seg", "ex", "sim", "out_layer", "out_word")
TEST1_PARAMS = PARAMS[:6]  # Test 1 schemes have no similarity and no output encoding


def _bar_label(s: RunSummary) -> str:
    """A Fig. 10 bar's label, a line each for the model, its dtype (stored as ``name@dtype``) and the run, so that
    neighbouring labels stay as narrow as their bars."""
    name, _, dtype = Path(s.model).name.partition("@")
    return "\n".join([name, *([dtype] if dtype else []), f"{s.shots}-shot, {s.n_items} items"])


def _tag(s: RunSummary) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(s.model).name)
    return f"{safe}_test{s.test}_{s.shots}shot_{s.n_items}items"


def csv_text(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A CSV table (floats with 6 significant digits, None as an empty cell, no cell a spreadsheet formula:
    :func:`walklens.base.outputs.csv_cell`)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(csv_row(headers))
    for r in rows:  # strings neutralised before floats are formatted: -0.5 stays a number
        w.writerow(["" if v is None else (f"{v:.6g}" if isinstance(v, float) else csv_cell(v)) for v in r])
    return buf.getvalue()


def plain_log_y(ax: Any, top: float) -> None:
    """A log y axis of counts that reads plainly: ticks at 1, 10, 100, ... labelled as numbers ("10", not
    "10^1"), no labels on the minor ticks (which read "4×10^0" by default), and at least two labelled ticks."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.set_ylim(0.8, max(10.0, 1.5 * float(top)))
    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _hist_figure(m: MetricSummary, title: str) -> Any:
    plt = pyplot()
    d = m.distribution
    fig, ax = plt.subplots(figsize=(6.4, 2.8))
    edges = np.array(d.hist_edges)
    ax.bar(edges[:-1], d.hist, width=np.diff(edges), align="edge", color="#7aa6c2", edgecolor="white")
    ax.axvline(d.chance, color="k", ls="--", lw=1, label=f"chance ({d.chance:.0%})")
    if m.baseline:
        ax.axvline(m.baseline, color="#c0392b", lw=1.2, label="baseline")
    ax.axvline(m.in_sample.acc, color="#e67e22", lw=1, ls=":", label="in-sample best")
    ax.axvline(m.kfold.acc, color="#27ae60", lw=1, ls="-.", label=f"{m.kfold.k}-fold held-out best")
    ax.set_xlabel("accuracy")
    ax.set_ylabel("schemes")
    plain_log_y(ax, max(d.hist, default=1))
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return fig


def bar_chart(summaries: Sequence[RunSummary], test: int, metric: str = "acc") -> Any:
    """Fig. 10 style: per (model, shots) the standard scheme's normalised score as a bar, the in-sample best
    as a star and the k-fold held-out best as a diamond with its 95% interval."""
    plt = pyplot()
    rows = sorted(
        (s for s in summaries if s.test == test and metric in s.metrics), key=lambda s: (s.model, s.shots, s.n_items)
    )
    fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(rows) + 1.5), 3.4))
    xs = np.arange(len(rows))
    seen: set[str] = set()

    def once(label: str) -> str | None:
        if label in seen:
            return None
        seen.add(label)
        return label

    for x, s in zip(xs, rows):
        m = s.metrics[metric]
        std = m.standard
        if std and std.norm is not None:
            ax.bar(x, std.norm, color="#7aa6c2", width=0.6, label=once("standard scheme"))
        ins = m.in_sample.norm_score
        if ins is not None:
            ax.plot(x, ins, marker="*", ms=13, color="#e67e22", ls="none", label=once("best, in-sample"))
        kf = m.kfold
        if kf.norm is not None and kf.norm_lo is not None and kf.norm_hi is not None:
            ax.errorbar(
                x + 0.18,
                kf.norm,
                yerr=[[kf.norm - kf.norm_lo], [kf.norm_hi - kf.norm]],
                marker="D",
                ms=6,
                color="#27ae60",
                capsize=3,
                ls="none",
                label=once(f"best, {kf.k}-fold held-out (95% CI)"),
            )
        if m.baseline:
            ax.plot(
                [x - 0.35, x + 0.35],
                [m.distribution.chance / m.baseline] * 2,
                color="k",
                ls="--",
                lw=0.8,
                label=once("chance"),
            )
    ax.axhline(1.0, color="#c0392b", lw=0.8)
    labels = [_bar_label(s) for s in rows]
    ax.set_xticks(xs, labels, fontsize=8)
    ax.set_ylabel(f"normalised score ({metric} / baseline {metric})")
    ax.set_title(f"Test {test}: {'pyramidal generation' if test == 1 else 'concept similarity'}", fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        lines = max(label.count("\n") for label in labels) + 1  # the legend goes below the tallest label
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1 - 0.05 * lines), ncol=2, frameon=False)
    ax.set_xlim(-0.7, len(rows) - 0.3)
    return fig


def _fmt(x: Any, places: int = 3) -> str:
    return "-" if x is None else f"{x:.{places}f}"


def kfold_label(summaries: Sequence[RunSummary]) -> str:
    """``"5-fold"`` when every run used k = 5 folds (``--folds``, capped at a run's item count), else
    ``"k-fold"``."""
    ks = {s.k for s in summaries}
    return f"{ks.pop()}-fold" if len(ks) == 1 else "k-fold"


def _cc(acc: float | None, baseline: float | None) -> str:
    """The chance-corrected ratio (acc - 0.25) / (baseline - 0.25), two places."""
    return "-" if acc is None or baseline is None else _fmt(corrected(acc, baseline), 2)


def summary_markdown(summaries: Sequence[RunSummary]) -> str:
    """The summary as one Markdown table (the one docs/sweep.md quotes): per run and metric the baseline, the
    standard scheme, the in-sample, split-half and k-fold held-out best (normalised in brackets), the median
    scheme and the expected best of as many coin-flip schemes; the k-fold held-out best also chance-corrected."""
    kf_ = kfold_label(summaries)
    lines = [
        "| model | test | shots | items | schemes | metric | baseline | standard (norm) | best in-sample (norm) "
        f"| split-half held-out (norm) | {kf_} held-out [95% CI] (norm) | chance-corrected | median scheme "
        "| E[best] if all chance |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        for metric, m in s.metrics.items():
            std, kf, ins = m.standard, m.kfold, m.in_sample
            lines.append(
                f"| {s.model} | {s.test} | {s.shots} | {s.n_items} | {s.n_schemes:,} | {metric} "
                f"| {_fmt(m.baseline)} | {_fmt(std and std.acc)} ({_fmt(std and std.norm, 2)}) "
                f"| {_fmt(ins.acc)} ({_fmt(ins.norm_score, 2)}) "
                f"| {_fmt(m.split_mean)} ({_fmt(m.split_mean_norm, 2)}) "
                f"| {_fmt(kf.acc)} [{_fmt(kf.lo)}, {_fmt(kf.hi)}] ({_fmt(kf.norm, 2)}) | {_cc(kf.acc, m.baseline)} "
                f"| {_fmt(m.distribution.quantiles['q50'])} "
                f"| {_fmt(m.distribution.expected_best_if_all_chance)} |"
            )
    return "\n".join(lines) + "\n"


def heldout_markdown(summaries: Sequence[RunSummary]) -> str:
    """The held-out best against its procedure (:mod:`walklens.lab.experiments.heldout`) as one Markdown table: the
    pooled Wilson interval, the bootstrap interval of the whole select-then-score procedure, held-out / baseline
    with the baseline resampled alike, and the paired test against the baseline on the same items."""
    kf_ = kfold_label(summaries)
    lines = [
        f"| model | test | shots | items | schemes | metric | baseline | {kf_} held-out | Wilson 95% | bootstrap 95% "
        "| held-out / baseline [bootstrap 95%] | chance-corrected [bootstrap 95%] | held-out - baseline [paired 95%] "
        "| discordant (held-out / baseline) | McNemar p |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        for metric, m in s.metrics.items():
            kf, b, p = m.kfold, m.bootstrap, m.paired
            boot = "-" if b is None else f"[{_fmt(b.acc_lo)}, {_fmt(b.acc_hi)}]"
            norm = f"{_fmt(kf.norm, 2)}" + ("" if b is None else f" [{_fmt(b.norm_lo, 2)}, {_fmt(b.norm_hi, 2)}]")
            cc = _cc(kf.acc, m.baseline)
            cc += "" if b is None else f" [{_fmt(b.corrected_lo, 2)}, {_fmt(b.corrected_hi, 2)}]"
            pair = "-" if p is None else f"{p.diff:+.3f} [{p.lo:+.3f}, {p.hi:+.3f}]"
            disc = "-" if p is None else f"{p.only_best} / {p.only_base}"
            lines.append(
                f"| {s.model} | {s.test} | {s.shots} | {s.n_items} | {s.n_schemes:,} | {metric} | {_fmt(m.baseline)} "
                f"| {_fmt(kf.acc)} | [{_fmt(kf.lo)}, {_fmt(kf.hi)}] | {boot} | {norm} | {cc} | {pair} | {disc} "
                f"| {'-' if p is None else f'{p.p:.3g}'} |"
            )
    return "\n".join(lines) + "\n"


def _summary_rows(summaries: Sequence[RunSummary]) -> tuple[list[str], list[list[Any]]]:
    """The summary table of every run and metric: its headers and one row per (run, metric)."""
    rows = [_summary_row(s, metric, m) for s in summaries for metric, m in s.metrics.items()]
    return _summary_headers(kfold_label(summaries)), rows


def _summary_headers(kf_: str) -> list[str]:
    """The summary table's headers (``kf_``: the k-fold estimate's label)."""
    return [
        "model",
        "test",
        "shots",
        "metric",
        "items",
        "schemes",
        "baseline",
        "standard acc",
        "standard norm",
        "best acc (in-sample)",
        "best norm (in-sample)",
        "best acc (split-half, held-out)",
        "best norm (split-half)",
        f"best acc ({kf_} held-out)",
        "ci lo",
        "ci hi",
        f"best norm ({kf_})",
        "median acc",
        "share above chance (95%)",
        "share expected above by chance",
        "E[best] if all chance",
        "bootstrap lo",
        "bootstrap hi",
        "norm bootstrap lo",
        "norm bootstrap hi",
        "held-out - baseline (paired)",
        "paired lo",
        "paired hi",
        "McNemar p",
    ]


def _summary_row(s: RunSummary, metric: str, m: MetricSummary) -> list[Any]:
    """One row of the summary table: run ``s``'s ``metric``."""
    std, kf, d = m.standard, m.kfold, m.distribution
    return [
        s.model,
        s.test,
        s.shots,
        metric,
        s.n_items,
        s.n_schemes,
        m.baseline,
        std and std.acc,
        std and std.norm,
        m.in_sample.acc,
        m.in_sample.norm_score,
        m.split_mean,
        m.split_mean_norm,
        kf.acc,
        kf.lo,
        kf.hi,
        kf.norm,
        d.quantiles["q50"],
        d.frac_above_chance_ci,
        d.expected_above_chance_ci,
        d.expected_best_if_all_chance,
        *_procedure_cells(m),
    ]


def _procedure_cells(m: MetricSummary) -> list[Any]:
    b, p = m.bootstrap, m.paired
    boot = [None] * 4 if b is None else [b.acc_lo, b.acc_hi, b.norm_lo, b.norm_hi]
    return boot + ([None] * 4 if p is None else [p.diff, p.lo, p.hi, p.p])


def _run_section(rep: Report, s: RunSummary) -> None:
    """One run: per metric its top 10, honest estimates, score histogram and marginal effects."""
    tag = _tag(s)
    params = PARAMS if s.test == 2 else TEST1_PARAMS
    rep.h2(f"{s.model}: Test {s.test}, {s.shots}-shot ({s.n_items} items, {s.n_schemes} schemes)")
    for metric, m in s.metrics.items():
        top_rows = []
        for t in m.top10:
            p = dict(Scheme.parse(t.scheme).pairs())
            top_rows.append([t.rank, *[p.get(k, "") for k in params], t.acc, t.norm])
        th = ["rank", *params, metric, f"{metric}:pct"]
        rep.attach(f"top10_{tag}_{metric}.csv", csv_text(th, top_rows))
        rep.p(f"Top 10 schemes by {metric} (like Figs. 13-16); baseline {metric} = {m.baseline}")
        rep.table(th, top_rows)
        ins, kf = m.in_sample, m.kfold
        hon: list[list[Any]] = [["in-sample best", ins.scheme, ins.acc, ins.lo, ins.hi, ins.norm_score]]
        hon += [[sp.how, sp.scheme, sp.acc, sp.lo, sp.hi, sp.norm_score] for sp in m.split]
        hon.append(
            [f"{kf.k}-fold held-out (pooled)", " | ".join(sorted(set(kf.fold_schemes))), kf.acc, kf.lo, kf.hi, kf.norm]
        )
        if m.bootstrap is not None:
            b = m.bootstrap
            hon.append(
                [
                    f"{kf.k}-fold held-out, bootstrap of the procedure ({b.replicates} resamples, folds redrawn)",
                    f"{b.candidates:,} candidate schemes of {b.n_schemes:,}",
                    kf.acc,
                    b.acc_lo,
                    b.acc_hi,
                    f"{_fmt(kf.norm, 3)} [{_fmt(b.norm_lo, 3)}, {_fmt(b.norm_hi, 3)}]",
                ]
            )
        if m.paired is not None:
            pr = m.paired
            hon.append(
                [
                    f"held-out - baseline, same items (McNemar p = {pr.p:.3g})",
                    f"{pr.only_best} items only held-out right, {pr.only_base} only baseline",
                    pr.diff,
                    pr.lo,
                    pr.hi,
                    None,
                ]
            )
        if m.standard:
            hon.append(["standard scheme", m.standard.scheme, m.standard.acc, None, None, m.standard.norm])
        rep.table(["estimate", "scheme(s)", metric, "95% lo", "95% hi", "normalised"], hon)
        rep.figure(
            _hist_figure(m, f"{s.model} Test {s.test} {s.shots}-shot: {metric} across the grid"), f"hist_{tag}_{metric}"
        )
        mrows = [
            [param, v.value, v.n, v.mean, v.best, v.mean_norm, v.best_norm]
            for param, vals in m.marginals.items()
            for v in sorted(vals, key=lambda r: -r.mean)
        ]
        mh = ["parameter", "value", "schemes", f"mean {metric}", f"best {metric}", "mean norm", "best norm"]
        rep.attach(f"marginals_{tag}_{metric}.csv", csv_text(mh, mrows))
        rep.p("Marginal effects: mean and best score over all schemes with each parameter value.", note=True)
        rep.table(mh, mrows)


def document(summaries: Sequence[RunSummary], source: str = "") -> dict[str, Any]:
    """The JSON document of the sweep report (sec. 5.1, A.6): the database it summarises (``source``) and every
    field of each run's summary (:class:`~walklens.lab.experiments.summary.RunSummary`: per metric the distribution,
    the top 10, the honest best scores and the marginal effects); ``summary.json`` holds its ``runs``."""
    return {"source": source, "runs": list(summaries)}


def build(summaries: Sequence[RunSummary], source: str = "") -> Report:
    """The ``walklens report`` report of the sweep runs ``summaries`` (:func:`~walklens.lab.experiments.summary.
    summarise_db`), with its CSV tables, ``summary.json`` and ``summary.md`` attached; ``source`` (the database)
    goes into the subtitle."""
    rep = Report(
        "Composition-scheme sweeps",
        f"{f'database {source}; ' if source else ''}seed 000 sec. 5.1, A.6, Figs. 10, 13-16",
    )
    if not summaries:
        return rep.p("No sweep results in this database.")
    kf_ = kfold_label(summaries)
    headers, rows = _summary_rows(summaries)
    rep.attach("summary.csv", csv_text(headers, rows))
    rep.attach("summary.md", summary_markdown(summaries))
    rep.attach("heldout.md", heldout_markdown(summaries))
    rep.h2("Summary: standard scheme, in-sample best and held-out best")
    rep.p(
        "Normalised score = accuracy / the baseline's accuracy on the same items, model and shots (sec. 5.1). "
        "The in-sample best is chosen and scored on the same items (biased upward, like the seed's star "
        f"markers); the split-half and {kf_} scores choose the best scheme on some items and score it on the "
        "others. 'E[best] if all chance' is the expected best accuracy of that many independent coin-flip "
        "schemes: the selection bias in the worst case.",
        note=True,
    )
    rep.table(headers, rows)
    for test in sorted({s.test for s in summaries}):
        for metric in sorted({m for s in summaries if s.test == test for m in s.metrics}):
            rep.figure(
                bar_chart(summaries, test, metric),
                f"fig10_test{test}_{metric}",
                caption=f"Like seed Fig. 10{'a' if test == 1 else 'b'}: Test {test}, {metric}.",
            )
    for s in summaries:
        _run_section(rep, s)
    rep.attach("summary.json", json.dumps(jsonable(document(summaries, source)["runs"]), indent=1))
    return rep


__all__ = ["bar_chart", "build", "csv_text", "document", "heldout_markdown", "kfold_label", "summary_markdown"]
