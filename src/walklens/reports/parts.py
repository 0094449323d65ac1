"""Views of the results no command draws on its own page: a trace, one steering result, a compacted context and
its explanation, a run's items, head matrices, a control vector.  Each builder takes the result and returns a
:class:`~walklens.reports.html.Report`, as every topic's ``build`` does; a notebook shows them
(:mod:`walklens.reports.notebook`).  The tables are the result's own ``to_pandas()`` columns (the same names and
numbers), cut to :data:`ROWS` rows with a note saying so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .heads import add_attention_maps
from .html import Report, show

if TYPE_CHECKING:
    from ..analyses.association import BlockContrast, Cooccurrence
    from ..analyses.attention import HeadMatrices
    from ..analyses.compaction import Compacted, CompactionReport
    from ..analyses.controlvectors import ControlVector
    from ..analyses.steering import SteerResult
    from ..core.trace import Trace

ROWS = 200  #: rows of a table a view shows (``to_pandas()`` holds them all)


def add_columns(rep: Report, columns: Mapping[str, Sequence[Any]], what: str, rows: int = ROWS) -> Report:
    """A result's plain columns (its ``_columns()``, the table of ``to_pandas()``) as a table, first ``rows``."""
    names = list(columns)
    n = len(columns[names[0]]) if names else 0
    if n > rows:
        rep.p(f"The first {rows} of {n:,} rows; {what}.to_pandas() holds them all.", note=True)
    cut = {k: list(v[:rows]) for k, v in columns.items()}
    rep.table(names, [[cut[k][i] for k in names] for i in range(min(n, rows))])
    return rep


def blocks(b: BlockContrast) -> Report:
    """The block contrast of one similarity map (seed 000, Figs. 3, 11, 12): per class, within and between
    similarity, the contrast with its interval and the permutation test."""
    rep = Report(f"Blocks of a similarity map{f' of {b.model_name}' if b.model_name else ''}",
                 f"{b.name}; {b.n_tokens} tokens; {b.n_perm} shuffles, {b.n_boot} resamples")  # fmt: skip
    rows = [[c.cls, c.n, c.within, c.between, c.contrast, c.lo, c.hi, c.p_above, c.null_hi] for c in b.classes]
    rep.table(["class", "n", "within", "between", "contrast", "lo", "hi", "p (shuffles >=)", "null 95 %"], rows)
    return rep


def cooccurrence(c: Cooccurrence) -> Report:
    """Result 4 (seed 000, sec. 2.2): Spearman correlations of co-occurrence and similarity, with the controls."""
    rep = Report(f"Co-occurrence and similarity{f' of {c.model_name}' if c.model_name else ''}",
                 f"{c.n_pairs:,} pairs, window {c.window}, count >= {c.min_count}, {c.n_tokens:,} tokens")  # fmt: skip
    names = ("pmi_dot", "pmi_cos", "dot_cos", "partial_dot", "partial_cos", "matched_dot", "matched_cos", "excess_cos")
    rep.table(
        ["Spearman", "rho", "lo", "hi"], [[n, getattr(c, n).rho, getattr(c, n).lo, getattr(c, n).hi] for n in names]
    )
    return rep


def trace(tr: Trace) -> Report:
    """A trace: |x| at every captured point and position (a heatmap with each vector's norm), then the attention
    maps it holds (captured with ``attentions=True``)."""
    rep = Report(f"Trace of {tr.model_name or 'a model'}", f"{len(tr.tokens)} tokens, {len(tr.points)} points")
    for part in ([tr.encoder] if tr.encoder is not None else []) + [tr]:
        labels = [show(t) for t in part.tokens]
        rep.heatmap(
            part.hidden.float().norm(dim=-1),
            row_labels=part.points,
            col_labels=labels,
            title=f"|x| at each point and position{f' ({part.stack})' if part.stack else ''}",
        )
        if part.attentions:
            add_attention_maps(rep, {k: a.float() for k, a in part.attentions.items()}, labels)
    return rep


def steer_result(res: SteerResult) -> Report:
    """One steering edit (seed 002): its method, strength, layers and, for eigen-steering, each layer's edit."""
    sign = (
        f"; the edit's sign {res.sign:+d} (chosen on the {res.chosen_on}: target log-prob {res.gain:+.3g})"
        if res.chosen_on != "given"
        else ""
    )
    rep = Report(f"Steering toward {res.label!r}", f"{res.method}, alpha {res.alpha:g}, layers {res.layers}{sign}")
    layers = ", ".join(map(str, res.layers))
    rep.table(
        ["method", "alpha", "layers", "sign", "chosen on", "target log-prob gain"],
        [[res.method, res.alpha, layers, res.sign, res.chosen_on, res.gain]],
    )
    rows = [[e.layer, e.reach, e.error] for e in res.edits]
    if rows:
        rep.table(["layer", "reach |P u|", "error of F' - F"], rows)
    return rep


def compacted(c: Compacted) -> Report:
    """A compacted context (seed 000, footnote 11): each concept vector's span of the text."""
    rep = Report(f"Compacted context ({c.method}, {c.bounds})", f"{len(c.segments)} concept vectors")
    return add_columns(rep, c._columns("segments"), "Compacted")


def compaction(r: CompactionReport) -> Report:
    """A compaction's explanation: the segments, each vector's nearest tokens and the continuation with the full
    context against the compacted one."""
    rep = compacted(r.compacted)
    rep.h2("nearest tokens of each concept vector")
    add_columns(rep, r._columns("neighbours"), "CompactionReport")
    rep.h2("continuation: full context against compacted")
    return add_columns(rep, r._columns("continuation"), "CompactionReport")


def head_matrices(hm: HeadMatrices) -> Report:
    """A layer's per-head filters W_vo,h and W_qk,h (A.3): each head's norms and copying score."""
    rep = Report(f"Head matrices of layer {hm.layer}{f' ({hm.stack})' if hm.stack else ''}", hm.family)
    return add_columns(rep, hm._columns("heads"), "HeadMatrices")


def control_vector(cv: ControlVector) -> Report:
    """A control vector: the norm of each layer's residual direction (and its cosine with u for eigen-steering)."""
    rep = Report(f"Control vector {cv.label or ''}".strip(), f"{cv.model_hint} {cv.method}".strip())
    rows = [[k, float(cv.directions[k].norm()), cv.along_u.get(k, float("nan"))] for k in cv.layers]
    rep.lines([r[0] for r in rows], [{"name": "|direction|", "y": [r[1] for r in rows]}], xlabel="layer")
    return rep.table(["layer", "norm", "cos with u"], rows)


__all__ = [
    "ROWS",
    "add_columns",
    "compacted",
    "compaction",
    "control_vector",
    "head_matrices",
    "steer_result",
    "trace",
]
