"""Paper-style reports of scheme sweeps (seed 000, Fig. 10 and Figs. 13-16).

For every sweep run in a database (one model, shot count and test): the top-10 schemes table with their
parameters, accuracy and normalised score (like Figs. 13-16), the honest best scores (in-sample, split-half and
k-fold held-out with 95% intervals; :mod:`walklens.concepts.stats`), the distribution of scores across the grid
next to chance, and per-parameter marginal effects (mean and best normalised score per value).  Across models:
the normalised-score bar chart with a marker for each model's best scheme (like Fig. 10), here with the
held-out best beside the in-sample one.

Output: ``index.html`` (self-contained, offline), PNG charts, and CSV tables (``summary.csv``,
``top10_*.csv``, ``marginals_*.csv``) plus ``summary.json`` and ``summary.md`` (the summary table in Markdown).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..concepts.stats import honest_summary_counts, marginal_effects
from ..concepts.schemes import Scheme
from ..concepts.store import SweepResults, SweepStore
from ..outputs import make_dir, write_atomic
from .html import Report

PARAMS = ("enc", "layer", "word", "norm", "seg", "ex", "sim", "out_layer", "out_word")


def _parse(name: str) -> dict[str, str]:
    """The parameters of a stored scheme name, as they are written in it (:meth:`Scheme.parse`)."""
    return dict(Scheme.parse(name).pairs())


def _tag(run: dict[str, Any]) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(str(run["model"])).name)
    n = run.get("n_items")
    return f"{safe}_test{run['test']}_{run['shots']}shot" + (f"_{n}items" if n is not None else "")


def write_csv(path: Path, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> Path:
    """Write a CSV file atomically."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(headers)
    for r in rows:
        w.writerow(["" if v is None else (f"{v:.6g}" if isinstance(v, float) else v) for v in r])
    return write_atomic(path, buf.getvalue())


def standard_name(run: dict[str, Any]) -> str:
    arch = run.get("arch") or "decoder"
    return str(Scheme.standard(int(run["test"]), arch))


def summarise_run(res: SweepResults, k: int = 5, seed: int = 0) -> dict[str, Any]:
    """Honest scores, top 10, marginals and the standard scheme's score of one run, per metric.

    ``res`` holds either predictions or the per-cell hit counts of :meth:`SweepStore.load_counts` (the same
    numbers: the statistics only need the counts)."""
    run = res.run
    # Test 1's enc=cross_encoding scheme is the baseline itself (no composition): it is reported as the
    # baseline and kept out of the schemes a best is chosen from (else Test 1's best is the baseline, trivially).
    keep = [i for i, name in enumerate(res.schemes) if not name.startswith("enc=cross_encoding,")]
    names = [res.schemes[i] for i in keep]
    out: dict[str, Any] = {"model": run["model"], "shots": run["shots"], "test": run["test"], "n_items": run["n_items"],
                           "n_schemes": len(names), "data": run["data"], "metrics": {}}
    std = standard_name(run)
    std_i = names.index(std) if std in names else None
    for m_i, metric in enumerate(res.metrics):
        base = res.baseline(metric)
        acc = res.acc[m_i].astype(np.float64)[keep]
        counts = res.counts(metric, k=k, seed=seed)
        if len(keep) < len(res.schemes):
            counts = counts.take(keep)
        summ = honest_summary_counts(counts, names, base)
        order = np.lexsort((np.arange(len(acc)), -acc))[:10]
        top = [{"rank": r + 1, "scheme": names[i], "acc": float(acc[i]),
                "norm": float(acc[i]) / base if base else None} for r, i in enumerate(order)]
        summ["top10"] = top
        summ["marginals"] = marginal_effects(names, acc, base)
        summ["standard"] = None if std_i is None else {"scheme": std, "acc": float(acc[std_i]),
                                                        "norm": float(acc[std_i]) / base if base else None}
        out["metrics"][metric] = summ
    return out


def _hist_figure(summary: dict[str, Any], title: str) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = summary["distribution"]
    fig, ax = plt.subplots(figsize=(6.4, 2.8))
    edges = np.array(d["hist_edges"])
    ax.bar(edges[:-1], d["hist"], width=np.diff(edges), align="edge", color="#7aa6c2", edgecolor="white")
    ax.axvline(d["chance"], color="k", ls="--", lw=1, label="chance (25%)")
    if summary.get("baseline"):
        ax.axvline(summary["baseline"], color="#c0392b", lw=1.2, label="baseline")
    ax.axvline(summary["in_sample"]["acc"], color="#e67e22", lw=1, ls=":", label="in-sample best")
    ax.axvline(summary["kfold"]["acc"], color="#27ae60", lw=1, ls="-.", label="k-fold held-out best")
    ax.set_xlabel("accuracy")
    ax.set_ylabel("schemes")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return fig


def bar_chart(summaries: Sequence[dict[str, Any]], test: int, metric: str = "acc") -> Any:
    """Fig. 10 style: per (model, shots) the standard scheme's normalised score as a bar, the in-sample best
    as a star and the k-fold held-out best as a diamond with its 95% interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted((s for s in summaries if s["test"] == test and metric in s["metrics"]),
                  key=lambda s: (str(s["model"]), s["shots"], s["n_items"]))
    fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(rows) + 1.5), 3.4))
    xs = np.arange(len(rows))
    seen: set[str] = set()

    def once(label: str) -> str | None:
        if label in seen:
            return None
        seen.add(label)
        return label

    for x, s in zip(xs, rows):
        m = s["metrics"][metric]
        std = m.get("standard")
        if std and std["norm"] is not None:
            ax.bar(x, std["norm"], color="#7aa6c2", width=0.6, label=once("standard scheme"))
        ins = m["in_sample"]["norm_score"]
        if ins is not None:
            ax.plot(x, ins, marker="*", ms=13, color="#e67e22", ls="none", label=once("best, in-sample"))
        kf = m["kfold"]
        if kf["norm"] is not None:
            ax.errorbar(x + 0.18, kf["norm"], yerr=[[kf["norm"] - kf["norm_lo"]], [kf["norm_hi"] - kf["norm"]]],
                        marker="D", ms=6, color="#27ae60", capsize=3, ls="none",
                        label=once("best, k-fold held-out (95% CI)"))
        if m["baseline"]:
            ax.plot([x - 0.35, x + 0.35], [0.25 / m["baseline"]] * 2, color="k", ls="--", lw=0.8,
                    label=once("chance"))
    ax.axhline(1.0, color="#c0392b", lw=0.8)
    ax.set_xticks(xs, [f"{Path(str(s['model'])).name}\n{s['shots']}-shot, {s['n_items']} items" for s in rows],
                  fontsize=8)
    ax.set_ylabel(f"normalised score ({metric} / baseline {metric})")
    ax.set_title(f"Test {test}: {'pyramidal generation' if test == 1 else 'concept similarity'}", fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    ax.set_xlim(-0.7, len(rows) - 0.3)
    return fig


def _fmt(x: Any, places: int = 3) -> str:
    return "-" if x is None else f"{x:.{places}f}"


def kfold_label(summaries: Sequence[dict[str, Any]]) -> str:
    """``"5-fold"`` when every run used k = 5 folds (k is capped at a run's item count), else ``"k-fold"``."""
    ks = {m["kfold"]["k"] for s in summaries for m in s["metrics"].values()}
    return f"{ks.pop()}-fold" if len(ks) == 1 else "k-fold"


def summary_markdown(summaries: Sequence[dict[str, Any]]) -> str:
    """The summary as one Markdown table (the one docs/sweep.md quotes): per run and metric the baseline, the
    standard scheme, the in-sample, split-half and k-fold held-out best (normalised in brackets), the median
    scheme and the expected best of as many coin-flip schemes."""
    kf_ = kfold_label(summaries)
    lines = ["| model | test | shots | items | schemes | metric | baseline | standard (norm) | best in-sample (norm) "
             f"| split-half held-out (norm) | {kf_} held-out [95% CI] (norm) | median scheme | E[best] if all chance |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        for metric, m in s["metrics"].items():
            std, kf, ins = m.get("standard") or {}, m["kfold"], m["in_sample"]
            lines.append(
                f"| {s['model']} | {s['test']} | {s['shots']} | {s['n_items']} | {s['n_schemes']:,} | {metric} "
                f"| {_fmt(m['baseline'])} | {_fmt(std.get('acc'))} ({_fmt(std.get('norm'), 2)}) "
                f"| {_fmt(ins['acc'])} ({_fmt(ins['norm_score'], 2)}) "
                f"| {_fmt(m['split_mean'])} ({_fmt(m['split_mean_norm'], 2)}) "
                f"| {_fmt(kf['acc'])} [{_fmt(kf['lo'])}, {_fmt(kf['hi'])}] ({_fmt(kf['norm'], 2)}) "
                f"| {_fmt(m['distribution']['quantiles']['q50'])} "
                f"| {_fmt(m['distribution']['expected_best_if_all_chance'])} |")
    return "\n".join(lines) + "\n"


def build_report(db: str | Path, out_dir: str | Path, k: int = 5, seed: int = 0, chunk: int | None = None) -> Path:
    """Write the report of every sweep run in ``db`` to ``out_dir``; returns the HTML path.

    The database is opened read-only (never created or changed; a damaged file is refused) and each run's
    predictions are streamed ``chunk`` schemes at a time (:meth:`SweepStore.load_counts`), so a full grid over
    all 10,042 HellaSwag items fits in a few hundred MB."""
    out = Path(out_dir)
    make_dir(out, "report folder")
    summaries: list[dict[str, Any]] = []
    with SweepStore(db, readonly=True) as store:
        runs = store.runs()
        for run in runs:
            res = store.load_counts(run["id"], k=k, seed=seed, chunk=chunk)
            if not res.schemes:
                continue
            summaries.append(summarise_run(res, k=k, seed=seed))
    rep = Report("Composition-scheme sweeps", f"database {db}; seed 000 sec. 5.1, A.6, Figs. 10, 13-16")
    if not summaries:
        rep.p("No sweep results in this database.")
        return rep.save(out)
    # ---- summary across models ----------------------------------------------------------------------------
    kf_ = kfold_label(summaries)
    rows = []
    for s in summaries:
        for metric, m in s["metrics"].items():
            std = m.get("standard") or {}
            kf = m["kfold"]
            rows.append([s["model"], s["test"], s["shots"], metric, s["n_items"], s["n_schemes"], m["baseline"],
                         std.get("acc"), std.get("norm"), m["in_sample"]["acc"], m["in_sample"]["norm_score"],
                         m["split_mean"], m["split_mean_norm"], kf["acc"], kf["lo"], kf["hi"], kf["norm"],
                         m["distribution"]["quantiles"]["q50"], m["distribution"]["frac_above_chance_ci"],
                         m["distribution"]["expected_best_if_all_chance"]])
    headers = ["model", "test", "shots", "metric", "items", "schemes", "baseline", "standard acc", "standard norm",
               "best acc (in-sample)", "best norm (in-sample)", "best acc (split-half, held-out)",
               "best norm (split-half)", f"best acc ({kf_} held-out)", "ci lo", "ci hi", f"best norm ({kf_})",
               "median acc", "share above chance (95%)", "E[best] if all chance"]
    write_csv(out / "summary.csv", headers, rows)
    write_atomic(out / "summary.md", summary_markdown(summaries))
    rep.h2("Summary: standard scheme, in-sample best and held-out best")
    rep.p("Normalised score = accuracy / the baseline's accuracy on the same items, model and shots (sec. 5.1). "
          "The in-sample best is chosen and scored on the same items (biased upward, like the seed's star "
          f"markers); the split-half and {kf_} scores choose the best scheme on some items and score it on the "
          "others. 'E[best] if all chance' is the expected best accuracy of that many independent coin-flip "
          "schemes: the selection bias in the worst case.", note=True)
    rep.table(headers, rows)
    for test in sorted({s["test"] for s in summaries}):
        metrics = sorted({m for s in summaries if s["test"] == test for m in s["metrics"]})
        for metric in metrics:
            rep.figure(bar_chart(summaries, test, metric), f"fig10_test{test}_{metric}",
                       caption=f"Like seed Fig. 10{'a' if test == 1 else 'b'}: Test {test}, {metric}.")
    # ---- per run ----------------------------------------------------------------------------------------------
    for s in summaries:
        tag = _tag(s)
        rep.h2(f"{s['model']}: Test {s['test']}, {s['shots']}-shot ({s['n_items']} items, {s['n_schemes']} schemes)")
        for metric, m in s["metrics"].items():
            top_rows = []
            for t in m["top10"]:
                p = _parse(t["scheme"])
                top_rows.append([t["rank"]] + [p.get(k_, "") for k_ in PARAMS if s["test"] == 2 or k_ in PARAMS[:6]]
                                + [t["acc"], t["norm"]])
            th = ["rank"] + [k_ for k_ in PARAMS if s["test"] == 2 or k_ in PARAMS[:6]] + [metric, f"{metric}:pct"]
            write_csv(out / f"top10_{tag}_{metric}.csv", th, top_rows)
            rep.p(f"Top 10 schemes by {metric} (like Figs. 13-16); baseline {metric} = {m['baseline']}")
            rep.table(th, top_rows)
            ins, kf = m["in_sample"], m["kfold"]
            hon = [["in-sample best", ins["scheme"], ins["acc"], ins["lo"], ins["hi"], ins["norm_score"]]]
            for sp in m["split"]:
                hon.append([sp["how"], sp["scheme"], sp["acc"], sp["lo"], sp["hi"], sp["norm_score"]])
            hon.append([f"{kf['k']}-fold held-out (pooled)", " | ".join(sorted(set(kf["fold_schemes"]))),
                        kf["acc"], kf["lo"], kf["hi"], kf["norm"]])
            if m.get("standard"):
                hon.append(["standard scheme", m["standard"]["scheme"], m["standard"]["acc"], None, None,
                            m["standard"]["norm"]])
            rep.table(["estimate", "scheme(s)", metric, "95% lo", "95% hi", "normalised"], hon)
            rep.figure(_hist_figure(m, f"{s['model']} Test {s['test']} {s['shots']}-shot: {metric} across the grid"),
                       f"hist_{tag}_{metric}")
            mrows = []
            for param, vals in m["marginals"].items():
                for v in sorted(vals, key=lambda r: -r["mean"]):
                    mrows.append([param, v["value"], v["n"], v["mean"], v["best"], v["mean_norm"], v["best_norm"]])
            mh = ["parameter", "value", "schemes", f"mean {metric}", f"best {metric}", "mean norm", "best norm"]
            write_csv(out / f"marginals_{tag}_{metric}.csv", mh, mrows)
            rep.p("Marginal effects: mean and best score over all schemes with each parameter value.", note=True)
            rep.table(mh, mrows)
    write_atomic(out / "summary.json", json.dumps(summaries, indent=1, default=float))
    return rep.save(out)
