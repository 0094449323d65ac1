"""The dtype agreement study as Markdown tables (docs/dtype.md, "Agreement study").

Renders a :class:`~walklens.lab.experiments.agreement.AgreementStudy`: for single runs (baseline, Test 1's standard
scheme) the identical picks, the paired difference of the accuracies and the score differences; for sweeps the
share of schemes that move, the best-k sets, the rank correlations and the reference's best schemes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..experiments.agreement import AgreementStudy, GridAgreement, GridMetricAgreement, PairedDifference, RunAgreement


def _f(x: float | None, digits: int = 4) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def _line(text: str) -> str:
    """A string from the database on one line."""
    return " ".join(text.split())


def _cell(text: str) -> str:
    """A table cell: one line, ``|`` (in word aggregations such as ``-relu+|mean``) escaped."""
    return _line(text).replace("|", "\\|")


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


def _diff(d: PairedDifference) -> str:
    return f"{d.diff:+.4f} [{d.lo:+.4f}, {d.hi:+.4f}]"


def _run(title: str, r: RunAgreement, ref: str, other: str) -> list[str]:
    out = [
        f"### {title}",
        "",
        f"{r.n} items ({r.scheme})"
        + (
            f"; left out, stored for one dtype only: {r.only_reference} ({ref}), {r.only_other} ({other})"
            if r.only_reference or r.only_other
            else ""
        ),
        "",
    ]
    rows = [
        [
            p.metric,
            f"{p.same} / {p.n} = {_pct(p.share)} [{_pct(p.share_lo)}, {_pct(p.share_hi)}]",
            _f(p.difference.reference),
            _f(p.difference.other),
            _diff(p.difference),
            _f(p.difference.mcnemar_p, 3),
            f"{p.difference.only_reference} / {p.difference.only_other}",
        ]
        for p in r.picks
    ]
    out += _table(
        [
            "metric",
            "same picks [95% Wilson]",
            f"acc {ref}",
            f"acc {other}",
            f"{other} - {ref} [95% Newcombe paired]",
            "McNemar exact p",
            f"right only in {ref} / only in {other}",
        ],
        rows,
    )
    s = r.scores
    q, a = s.quantiles, s.abs_quantiles
    out += [
        "",
        f"Score differences {other} - {ref}, per ending ({s.n_endings} endings): "
        f"mean {s.mean:+.4g}, mean |d| {s.mean_abs:.4g}; quantiles q1 {q['q1']:+.4g}, q5 {q['q5']:+.4g}, "
        f"median {q['q50']:+.4g}, q95 {q['q95']:+.4g}, q99 {q['q99']:+.4g}; |d| median {a['q50']:.4g}, "
        f"q90 {a['q90']:.4g}, q99 {a['q99']:.4g}, max {s.max_abs:.4g} (item {s.max_abs_item}). "
        + (
            f"acc picks changed on {s.n_flips} items, where the {ref} scores of the two picks were at most "
            f"{s.flip_gap_max:.4g} apart."
            if s.flip_gap_max is not None
            else "No acc pick changed."
        ),
        "",
    ]
    return out


def _metric_row(m: GridMetricAgreement) -> list[str]:
    """One metric's row of the agreement table: how far accuracy moved, the rank correlations, the top-k sets."""
    tops = [
        ("same" if t.same_set else f"{t.overlap} of {t.k}" + (", same up to ties" if t.same_up_to_ties else ""))
        + f" ({t.distinct_reference} distinct)"
        for t in m.top_k
    ]
    return [
        m.metric,
        str(m.n_schemes),
        f"{m.moved} ({_pct(m.share_moved)})",
        _f(m.max_move),
        _f(m.mean_abs_move),
        _pct(m.same_picks),
        _pct(m.min_same_picks),
        _f(m.spearman),
        _f(m.kendall),
    ] + tops


def _grid(title: str, g: GridAgreement, ref: str, other: str, best_rows: int) -> list[str]:
    out = [
        f"### {title}",
        "",
        f"{g.n_schemes} schemes over {g.n_items} items"
        + (
            f"; left out, stored for one dtype only: {g.only_reference} ({ref}), {g.only_other} ({other})"
            if g.only_reference or g.only_other
            else ""
        ),
        "",
    ]
    ks = [t.k for t in g.metrics[0].top_k] if g.metrics else []
    rows = [_metric_row(m) for m in g.metrics]
    out += _table(
        [
            "metric",
            "schemes",
            "accuracy moved",
            "max move",
            "mean move",
            "same picks",
            "fewest same picks",
            "Spearman rho",
            "Kendall tau-b",
        ]
        + [f"best {k} the same?" for k in ks],
        rows,
    )
    for m in g.metrics:
        out += _best_schemes(m, ref, other, best_rows)
    return out + [""]


def _best_schemes(m: GridMetricAgreement, ref: str, other: str, best_rows: int) -> list[str]:
    """The reference's best schemes of one metric, with their accuracy, rank and identical picks in both dtypes
    and the paired difference (Markdown lines)."""
    out = [
        "",
        f"Best {min(best_rows, len(m.best))} schemes by {ref} `{m.metric}` (rank: 1 + schemes strictly "
        f"better; {other}'s own best: `{_line(m.best_other.scheme)}`, {_f(m.best_other.other)} in {other}, "
        f"{_f(m.best_other.reference)} in {ref}):",
        "",
    ]
    out += _table(
        [
            "scheme",
            f"{m.metric} {ref}",
            f"{m.metric} {other}",
            f"rank {ref}",
            f"rank {other}",
            "same picks",
            f"{other} - {ref} [95%]",
        ],
        [
            [
                _cell(s.scheme),
                _f(s.reference),
                _f(s.other),
                str(s.rank_reference),
                str(s.rank_other),
                _pct(s.same_picks),
                _diff(s.difference),
            ]
            for s in m.best[:best_rows]
        ],
    )
    return out


def agreement_markdown(study: AgreementStudy, best_rows: int = 20) -> str:
    """The study as Markdown (one section per part that was compared)."""
    ref, other = study.reference_dtype, study.other_dtype  # the column names; the runs' names in the title
    items = f"the first {study.items} items" if study.items is not None else "the items both dtypes hold"
    out = [
        f"## {study.model}: {ref} against {other}, {study.shots}-shot, {items}",
        "",
        f"Runs `{_line(study.reference)}` and `{_line(study.other)}`, data `{_line(study.data)}`.",
        "",
    ]
    if study.baseline is not None:
        out += _run("Baseline", study.baseline, ref, other)
    if study.test1_standard is not None:
        out += _run("Test 1, standard scheme", study.test1_standard, ref, other)
    if study.test2_grid is not None:
        out += _grid("Test 2 sweep", study.test2_grid, ref, other, best_rows)
    if study.test1_grid is not None:
        out += _grid("Test 1 sweep", study.test1_grid, ref, other, best_rows)
    return "\n".join(out)


__all__ = ["agreement_markdown"]
