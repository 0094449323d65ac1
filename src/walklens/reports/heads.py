"""HTML sections for attention heads and position kernels (seed 000, sec. 2.2.1, A.2, A.3; Figs. 5-8).

Each ``add_*`` function draws one result of :mod:`walklens.attention` or :mod:`walklens.kernels` into a
:class:`~walklens.reports.html.Report`; they take the plain results (tensors, dataclasses, token strings) and
never load a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch

from .html import Report

if TYPE_CHECKING:
    from ..attention import ClusterView, IdentityResult, SelfMass
    from ..kernels import PositionKernels


def _tok(s: str) -> str:
    return repr(s)[1:-1]


def add_identity(report: Report, result: IdentityResult, tol: float = 1e-4) -> Report:
    """Table of the A.3 identity errors per attention module."""
    report.h2("A.3 identity: sum_h A_h X W_vo,h + biases vs the module's real output")
    report.p(f"max |error| over all modules: {result.max_error:.3g} (tolerance {tol:g}: "
             f"{'holds' if result.holds(tol) else 'FAILS'})")
    report.table(["module", "max |recomputed - real|", "max |real output|", "relative"],
                 [[c.name, f"{c.max_abs_error:.3g}", f"{c.max_abs_output:.4g}", f"{c.rel_error:.2g}"]
                  for c in result.checks])
    return report


def add_attention_maps(report: Report, attentions: Mapping[str, torch.Tensor], query_tokens: Sequence[str],
                       key_tokens: Sequence[str] | None = None, kind: str = "attn", title: str = "",
                       layers: Sequence[int] | None = None) -> Report:
    """One heatmap per layer: the attention matrices of all heads side by side (Figs. 5 and 7).

    Rows are query positions, columns ``h{head}:{key token}``; a grey column separates heads.
    """
    keys = key_tokens if key_tokens is not None else query_tokens
    names = sorted((k for k in attentions if k.endswith("." + kind)), key=lambda k: int(k[1:].split(".")[0]))
    if layers is not None:
        names = [n for n in names if int(n[1:].split(".")[0]) in set(layers)]
    report.h2(title or ("cross-attention maps" if kind == "cross" else "self-attention maps"))
    report.p("Rows: query positions; columns: key positions of every head (h0, h1, ...). A row is the query's "
             "soft-cluster membership (sec. 2.2.1).", note=True)
    for name in names:
        A = attentions[name].float()
        H, T, S = A.shape
        z: list[list[float | None]] = []
        for i in range(T):
            row: list[float | None] = []
            for h in range(H):
                row += A[h, i].tolist() + ([None] if h < H - 1 else [])
            z.append(row)
        cols: list[str] = []
        for h in range(H):
            cols += [f"h{h}:{_tok(t)}" for t in keys] + ([""] if h < H - 1 else [])
        report.heatmap(z, row_labels=[_tok(t) for t in query_tokens], col_labels=cols, title=name, vmin=0.0,
                       cell=max(4, min(14, 1100 // max(len(cols), 1))))
    return report


def add_cluster_views(report: Report, views: Sequence[ClusterView]) -> Report:
    """Cluster & aggregate at one query position, one row per head."""
    if not views:
        return report
    v0 = views[0]
    report.h2(f"cluster & aggregate: layer {v0.layer} {v0.kind}, query position {v0.position}")
    report.p("self mass = A_h[t,t] (the self-association pull, A.2); the query moves (1 - self mass) of the way "
             "from x_t to the centroid of the foreign positions; centroid = A_h[t] X, filtered by W_vo,h.",
             note=True)
    rows = []
    for v in views:
        members = ", ".join(f"{j}:{_tok(t)} {w:.2f}" for j, t, w in v.top_members)
        rows.append([v.head, f"{v.self_mass:.3f}", f"{v.foreign_mass:.3f}", f"{v.move_distance:.3g}",
                     f"{v.foreign_distance:.3g}", f"{v.cos_query_centroid:.3f}",
                     f"{float(v.filtered_centroid.norm()):.3g}", members])
    report.table(["head", "self mass", "foreign mass", "|centroid - x_t|", "|foreign centroid - x_t|",
                  "cos(x_t, centroid)", "|head output|", "top members (pos:token weight)"], rows)
    return report


def add_self_mass(report: Report, sm: SelfMass, title: str = "") -> Report:
    """Heatmap layers x heads of self mass / uniform (below 1: the head attenuates the query itself)."""
    report.h2(title or f"self-attention mass per layer and head{f' ({sm.stack})' if sm.stack else ''}")
    report.p("colour: mean A_h[t,t] divided by its value under uniform attention; < 1 means the query's own "
             "position is attenuated (negative self-bias in effect), > 1 amplified.", note=True)
    L, H = sm.mass.shape
    hover = [[f"self mass {float(sm.mass[l, h]):.3f}, uniform {float(sm.uniform[l, h]):.3f}" for h in range(H)]
             for l in range(L)]
    report.heatmap(sm.ratio.log2(), row_labels=[f"L{l}" for l in range(L)], col_labels=[f"h{h}" for h in range(H)],
                   hover=hover, diverging=True, cell=18)
    report.p("(colour is log2 of the ratio)", note=True)
    return report


def add_head_stats(report: Report, stats: Mapping[str, Any], title: str = "") -> Report:
    """Per-head W_vo / W_qk summaries: Frobenius norms, copying score (computed from the factors).

    ``stats``: ``layers`` (row labels) and [L, H] tensors ``vo_norm``, ``qk_norm``, ``vo_copying``."""
    report.h2(title or "per-head filters W_vo,h and W_qk,h (factored, A.3)")
    labels = stats["layers"]
    H = len(stats["vo_norm"][0])
    for key, title, div in (("vo_norm", "||W_vo,h||_F", False), ("qk_norm", "||W_qk,h||_F", False),
                            ("vo_copying", "W_vo copying score: sum Re(eig) / sum |eig| (+1 copies, -1 negates)",
                             True)):
        report.heatmap(stats[key], row_labels=labels, col_labels=[f"h{h}" for h in range(H)], title=title,
                       diverging=div, cell=18)
    return report


def add_kernels(report: Report, pk: PositionKernels) -> Report:
    """Position kernels (Figs. 6, 8) per stack, and the self-bias fractions (A.2)."""
    report.h2(f"position kernels ({pk.scheme}, {pk.units})")
    report.p(pk.estimator, note=True)
    if pk.notes and pk.notes != pk.estimator:
        report.p(pk.notes, note=True)
    report.h2(f"self-bias classes (margin {pk.margin:g} nats)")
    fr = pk.fractions()
    cols = ["negative_self", "far_amplifying", "local", "flat"]
    report.table(["stack", "kernels", *cols],
                 [[st, sum(len(r) for r in pk.stack(st if st != "model" else "").classes),
                   *[f"{f[c]:.1%}" for c in cols]] for st, f in fr.items()])
    sweep = pk.margin_sweep()
    rows = []
    for st, per in sweep.items():
        for m, f in per.items():
            rows.append([st, m, f"{f['negative_self']:.1%}", f"{f['far_amplifying']:.1%}"])
    report.p("fractions for other margins:", note=True)
    report.table(["stack", "margin", "negative self-bias", "far-amplifying"], rows)
    for s in pk.stacks:
        name = s.stack or "model"
        K, H, n = s.values.shape
        row_labels = [f"{'L' + str(l) + ' ' if l is not None else ''}h{h}" for l in s.layers for h in range(H)]
        labels = [c.label for row in s.classes for c in row]
        z = s.log_values.reshape(K * H, n)
        z = z - z[:, s.distances.index(0)][:, None]  # relative to distance 0
        hover = [[f"{labels[r]}; value {float(s.values.reshape(K * H, n)[r, j]):.4g}"
                  + (f" +- {float(s.ci95.reshape(K * H, n)[r, j]):.2g}" if s.ci95 is not None else "")
                  for j in range(n)] for r in range(K * H)]
        report.heatmap(z, row_labels=row_labels, col_labels=[str(d) for d in s.distances], hover=hover,
                       diverging=True, title=f"{name}: kernel minus its value at distance 0 (logit units; columns: "
                                             f"distance key - query)", cell=max(3, min(16, 900 // n)))
        if s.layers == [None]:  # one kernel per head: draw them as curves (Figs. 6 and 8)
            for start in range(0, H, 8):
                series = [{"name": f"h{h} ({labels[h]})", "y": s.values[0, h]} for h in range(start, min(H, start + 8))]
                report.lines(s.distances, series, title=f"{name}: heads {start}-{min(H, start + 8) - 1}",
                             xlabel="distance (key - query)")
        else:  # per-layer (empirical) kernels: curves with 95% CI bands for the first, middle and last layer
            for r in sorted({0, K // 2, K - 1}):
                band = s.ci95[r] if s.ci95 is not None else None
                series = [{"name": f"h{h} ({labels[r * H + h]})", "y": s.values[r, h],
                           **({"band": [s.values[r, h] - band[h], s.values[r, h] + band[h]]} if band is not None
                              else {})} for h in range(H)]
                report.lines(s.distances, series, title=f"{name}: layer {s.layers[r]} ({pk.units}, 95% CI bands)",
                             xlabel="distance (key - query)")
        report.table(["kernel", "class"], [[row_labels[r], labels[r]] for r in range(K * H)])
    return report


__all__ = ["add_identity", "add_attention_maps", "add_cluster_views", "add_self_mass", "add_head_stats",
           "add_kernels"]
