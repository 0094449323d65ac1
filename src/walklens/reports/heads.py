"""The attention-heads report (``walklens heads``; seed 000, sec. 2.2.1, A.2, A.3; Figs. 5, 7) and its JSON.

:func:`build` draws the results of :mod:`walklens.analyses.attention` (the A.3 identity with its trace, the cluster
views, self masses and per-head statistics; position kernels too when given) into a
:class:`~walklens.reports.html.Report`; :func:`document` is the ``--json`` output, made of one document per
result (:func:`cluster_document`, :func:`self_mass_document`, :func:`head_stats_document`), which the
explorer's attention view sends too.  Each ``add_*`` function draws one result as a section.  They take the
plain results and never load a model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .html import Report, block_labels, block_mean, fields_of, pyplot, ticks
from .kernels import add_kernels

if TYPE_CHECKING:
    from ..analyses.attention import ClusterView, HeadStats, IdentityResult, SelfMass
    from ..analyses.kernels import PositionKernels
    from ..core.trace import Trace


def _tok(s: str) -> str:
    return repr(s)[1:-1]


def add_identity(report: Report, result: IdentityResult, tol: float = 1e-4) -> Report:
    """Table of the A.3 identity errors per attention module."""
    report.h2("A.3 identity: sum_h A_h X W_vo,h + biases vs the module's real output")
    report.p(
        f"max |error| over all modules: {result.max_error:.3g} (tolerance {tol:g}: "
        f"{'holds' if result.holds(tol) else 'FAILS'})"
    )
    report.table(
        ["module", "max |recomputed - real|", "max |real output|", "relative"],
        [[c.name, f"{c.max_abs_error:.3g}", f"{c.max_abs_output:.4g}", f"{c.rel_error:.2g}"] for c in result.checks],
    )
    return report


def add_attention_maps(
    report: Report,
    attentions: Mapping[str, torch.Tensor],
    query_tokens: Sequence[str],
    key_tokens: Sequence[str] | None = None,
    kind: str = "attn",
    title: str = "",
    layers: Sequence[int] | None = None,
) -> Report:
    """One heatmap per layer: the attention matrices of all heads side by side (Figs. 5 and 7).

    Rows are query positions, columns ``h{head}:{key token}``; a grey column separates heads.
    """
    keys = key_tokens if key_tokens is not None else query_tokens
    names = sorted((k for k in attentions if k.endswith("." + kind)), key=lambda k: int(k[1:].split(".")[0]))
    if layers is not None:
        names = [n for n in names if int(n[1:].split(".")[0]) in set(layers)]
    report.h2(title or ("cross-attention maps" if kind == "cross" else "self-attention maps"))
    report.p(
        "Rows: query positions; columns: key positions of every head (h0, h1, ...). A row is the query's "
        "soft-cluster membership (sec. 2.2.1).",
        note=True,
    )
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
        report.heatmap(
            z,
            row_labels=[_tok(t) for t in query_tokens],
            col_labels=cols,
            title=name,
            vmin=0.0,
            cell=max(4, min(14, 1100 // max(len(cols), 1))),
        )
    return report


def add_cluster_views(report: Report, views: Sequence[ClusterView]) -> Report:
    """Cluster & aggregate at one query position, one row per head."""
    if not views:
        return report
    v0 = views[0]
    report.h2(f"cluster & aggregate: layer {v0.layer} {v0.kind}, query position {v0.position}")
    report.p(
        "self mass = A_h[t,t] (the self-association pull, A.2); the query moves (1 - self mass) of the way "
        "from x_t to the centroid of the foreign positions; centroid = A_h[t] X, filtered by W_vo,h.",
        note=True,
    )
    rows = []
    for v in views:
        members = ", ".join(f"{j}:{_tok(t)} {w:.2f}" for j, t, w in v.top_members)
        rows.append(
            [
                v.head,
                f"{v.self_mass:.3f}",
                f"{v.foreign_mass:.3f}",
                f"{v.move_distance:.3g}",
                f"{v.foreign_distance:.3g}",
                f"{v.cos_query_centroid:.3f}",
                f"{float(v.filtered_centroid.norm()):.3g}",
                members,
            ]
        )
    report.table(
        [
            "head",
            "self mass",
            "foreign mass",
            "|centroid - x_t|",
            "|foreign centroid - x_t|",
            "cos(x_t, centroid)",
            "|head output|",
            "top members (pos:token weight)",
        ],
        rows,
    )
    return report


def add_self_mass(report: Report, sm: SelfMass, title: str = "") -> Report:
    """Layers x heads of self mass / uniform (below 1: the head attenuates the query itself), drawn from
    :func:`self_mass_document` by ``walklensResults.selfMass`` (the explorer's attention view draws it too)."""
    report.h2(title or f"self-attention mass per layer and head{f' ({sm.stack})' if sm.stack else ''}")
    report.p(
        "colour: log2 of mean A_h[t,t] divided by its value under uniform attention; < 0 means the query's own "
        "position is attenuated (negative self-bias in effect), > 0 amplified.",
        note=True,
    )
    return report.result("self_mass", self_mass_document(sm))


def add_head_stats(report: Report, stats: HeadStats, title: str = "") -> Report:
    """Per-head W_vo / W_qk summaries: Frobenius norms, copying score (computed from the factors), drawn from
    :func:`head_stats_document` by ``walklensResults.headStats`` (the explorer's attention view draws it too)."""
    report.h2(title or "per-head filters W_vo,h and W_qk,h (factored, A.3)")
    return report.result("head_stats", head_stats_document(stats))


def _layer(key: str) -> int:
    """The layer of an attention key ``L{l}.attn`` / ``L{l}.cross``."""
    return int(key.split(".")[0][1:])


def _kept(attn: Mapping[str, torch.Tensor], layers: Sequence[int] | None) -> dict[str, torch.Tensor]:
    return {k: a for k, a in attn.items() if layers is None or _layer(k) in layers}


def _trace(ident: IdentityResult) -> Trace:
    if ident.trace is None:
        raise ValueError("the A.3 identity was computed without its trace")
    return ident.trace


#: the fields of a cluster view a document leaves out: the trace's tokens (the document has them once) and the two
#: [D] vectors (``head_output_norm`` is the norm of the head's output)
CLUSTER_LEAVE_OUT = ("tokens", "centroid", "filtered_centroid")


def cluster_document(view: ClusterView) -> dict[str, Any]:
    """The document of a :class:`~walklens.analyses.attention.ClusterView` (sec. 2.2.1, A.2): every field but
    :data:`CLUSTER_LEAVE_OUT`, and ``head_output_norm`` (|filtered centroid|, the head's output)."""
    return {**fields_of(view, CLUSTER_LEAVE_OUT), "head_output_norm": float(view.filtered_centroid.norm())}


def self_mass_document(sm: SelfMass) -> dict[str, Any]:
    """The document of a :class:`~walklens.analyses.attention.SelfMass` (A.2): every field."""
    return fields_of(sm)


def head_stats_document(stats: HeadStats) -> dict[str, Any]:
    """The document of a :class:`~walklens.analyses.attention.HeadStats` (A.3): every field."""
    return fields_of(stats)


def document(
    ident: IdentityResult,
    views: Sequence[ClusterView],
    masses: Mapping[str, SelfMass],
    stats: Mapping[str, HeadStats],
    model: str,
    layers: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The ``--json`` document: the A.3 errors, the cluster views, self masses, per-head statistics (the
    documents above; the explorer's attention view sends them too) and the attention of every layer (of
    ``layers`` when given; keys ``enc.``/``dec.`` on encoder-decoder models)."""
    trace = _trace(ident)
    enc = trace.encoder
    return {
        "model": model,
        "tokens": trace.tokens,
        "encoder_tokens": enc.tokens if enc is not None else None,
        "identity": dict(ident),
        "identity_max": ident.max_error,
        "identity_relative": {c.name: c.rel_error for c in ident.checks},
        "cluster": [cluster_document(v) for v in views],
        "self_mass": {k: self_mass_document(v) for k, v in masses.items()},
        "head_stats": {k: head_stats_document(v) for k, v in stats.items()},
        "attentions": {
            **{
                f"{trace.stack + '.' if enc is not None else ''}{k}": a
                for k, a in _kept(trace.attentions, layers).items()
            },
            **({f"{enc.stack}.{k}": a for k, a in _kept(enc.attentions, layers).items()} if enc is not None else {}),
        },
    }


def _attention_maps(rep: Report, trace: Trace, block: int, layers: Sequence[int] | None) -> None:
    """The attention maps of ``layers`` (default: all) as means over ``block`` x ``block`` positions: the
    self-attention of the model, or of the encoder and the decoder and the decoder's cross-attention."""
    if block > 1:
        rep.p(
            f"Attention maps: each cell is the mean attention weight over a block of {block} x {block} positions "
            f"(labels: first-last position and its first token); --json holds the full maps.",
            note=True,
        )

    def shown(attn: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: block_mean(a, block) for k, a in _kept(attn, layers).items()}

    toks = block_labels(trace.tokens, block)
    if trace.encoder is not None:
        enc = block_labels(trace.encoder.tokens, block)
        add_attention_maps(rep, shown(trace.encoder.attentions), enc, title="encoder self-attention", layers=layers)
        add_attention_maps(rep, shown(trace.attentions), toks, title="decoder self-attention", layers=layers)
        add_attention_maps(
            rep,
            shown(trace.attentions),
            toks,
            enc,
            kind="cross",
            title="decoder cross-attention (keys: encoder output)",
            layers=layers,
        )
    else:
        add_attention_maps(rep, shown(trace.attentions), toks, layers=layers)


def build(
    ident: IdentityResult,
    views: Sequence[ClusterView],
    masses: Mapping[str, SelfMass],
    stats: Mapping[str, HeadStats],
    title: str,
    subtitle: str = "",
    *,
    block: int = 1,
    layers: Sequence[int] | None = None,
    kernels: PositionKernels | None = None,
    figures: bool = True,
) -> Report:
    """The ``walklens heads`` report: the A.3 identity, the cluster views, the attention maps of ``layers``
    (default: all) as means over ``block`` x ``block`` positions (1: every position), self masses, per-head
    W_vo / W_qk and, when given, the position kernels; ``figures``: the copying scores and self masses also as
    PNG files beside the page."""
    trace = _trace(ident)
    rep = Report(title, subtitle)
    add_identity(rep, ident)
    add_cluster_views(rep, views)
    _attention_maps(rep, trace, block, layers)
    for name, sm in masses.items():
        add_self_mass(rep, sm, title=f"self-attention mass ({name})")
    for name, st in stats.items():
        add_head_stats(rep, st, title=f"per-head filters W_vo,h and W_qk,h ({name}; factored, A.3)")
        if figures:
            rep.figure(copying_figure(st, name), f"copying_{name.replace(' ', '_')}", embed=False)
    if figures:
        for name, sm in masses.items():
            rep.figure(self_mass_figure(sm, name), f"self_mass_{name.replace(' ', '_').replace(',', '')}", embed=False)
    if kernels is not None:
        add_kernels(rep, kernels)
    return rep


def copying_figure(stats: HeadStats, name: str = "") -> Any:
    """The copying score of W_vo,h per layer (rows) and head (columns) as a PNG figure, on the fixed scale -1..1,
    with a colour bar saying which sign copies."""
    plt = pyplot()
    z = stats.vo_copying.float().numpy()
    rows = [f"L{l}" for l in stats.layers]
    cols = [f"h{h}" for h in range(z.shape[1])]
    fig, ax = plt.subplots(figsize=(min(16.0, 3.0 + 0.35 * len(cols)), min(14.0, 2.0 + 0.25 * len(rows))))
    im = ax.imshow(z, aspect="auto", cmap="RdBu_r", vmin=-1.0, vmax=1.0, interpolation="nearest")
    ax.set_yticks(*ticks(rows), fontsize=7)
    ax.set_xticks(*ticks(cols), fontsize=7)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"W_vo copying score ({name or stats.stack or 'model'}): sum Re(eig) / sum |eig|", fontsize=10)
    bar = fig.colorbar(im, ax=ax)
    bar.set_label("+1 (red): copies what it attends to; -1 (blue): negates it")
    fig.tight_layout()
    return fig


def self_mass_figure(sm: SelfMass, name: str = "") -> Any:
    """Each head's mean self mass over its value under uniform attention (log2; below 0: the query's own position
    attenuated) per layer and head, as a PNG figure with its colour bar."""
    plt = pyplot()
    ratio = (sm.mass.double() / sm.uniform.double()).clamp_min(1e-12).log2().float()
    z = ratio.numpy()
    rows = [f"L{l}" for l in range(z.shape[0])]
    cols = [f"h{h}" for h in range(z.shape[1])]
    m = float(max(abs(float(ratio.min())), abs(float(ratio.max())), 1e-6))
    fig, ax = plt.subplots(figsize=(min(16.0, 3.0 + 0.35 * len(cols)), min(14.0, 2.0 + 0.25 * len(rows))))
    im = ax.imshow(z, aspect="auto", cmap="RdBu_r", vmin=-m, vmax=m, interpolation="nearest")
    ax.set_yticks(*ticks(rows), fontsize=7)
    ax.set_xticks(*ticks(cols), fontsize=7)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"self mass over uniform ({name})", fontsize=10)
    fig.colorbar(im, ax=ax).set_label("log2(self mass / uniform): < 0 attenuates its own position")
    fig.tight_layout()
    return fig


__all__ = [
    "CLUSTER_LEAVE_OUT",
    "add_attention_maps",
    "add_cluster_views",
    "add_head_stats",
    "add_identity",
    "add_self_mass",
    "build",
    "cluster_document",
    "copying_figure",
    "self_mass_figure",
    "document",
    "head_stats_document",
    "self_mass_document",
]
