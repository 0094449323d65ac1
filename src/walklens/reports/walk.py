"""The encoding-walk report (``walklens walk``; seed 000, sec. 2.2.2, Fig. 9, A.2) and its JSON document.

:func:`build` draws the result dataclasses of :mod:`walklens.analyses.walks` plus a ``labels`` mapping from token id to
its text; :func:`document` is the ``--json`` output, made of one :func:`walk_document` per reading; the
explorer's walk views (``walklens serve``) send the same document, or its part at one point
(:func:`point_document`) or one cell (:func:`cell_document`).  Nothing here loads a model or recomputes an
analysis.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..base.outputs import jsonable
from .html import Report, fields_of, pyplot, show, ticks

if TYPE_CHECKING:
    from ..analyses.walks import EncodingWalk
    from ..analyses.walks.target import TargetAnswer

TOP_HOVER = 5  # nearest tokens in each heatmap cell's tooltip
MAX_COLS = 96  # positions the report shows (the JSON holds all of them)


def walk_document(walk: EncodingWalk) -> dict[str, Any]:
    """The document of one :class:`~walklens.analyses.walks.EncodingWalk` (sec. 2.2.2, A.2): every field (the encoder's
    walk as its own document) and the names of the escape points.  The explorer's walk views send it too."""
    return {
        **fields_of(walk, ("encoder", "labels")),
        "escape_names": walk.escape_names,
        "escape_stable_names": walk.escape_stable_names,
        "encoder": walk_document(walk.encoder) if walk.encoder is not None else None,
    }


def _per_cell(walk: EncodingWalk) -> list[str]:
    """The fields with a value per cell: tensors [points, positions, ...]."""
    shape = (len(walk.points), len(walk.tokens))
    return [
        k
        for k, v in fields_of(walk).items()
        if isinstance(v, torch.Tensor) and v.dim() >= 2 and tuple(v.shape[:2]) == shape
    ]


def _per_position(walk: EncodingWalk) -> list[str]:
    """The fields with a value per position: tensors [positions] (token ids, escape points)."""
    return [
        k for k, v in fields_of(walk).items() if isinstance(v, torch.Tensor) and tuple(v.shape) == (len(walk.tokens),)
    ]


def _cut(v: torch.Tensor, k: int | None) -> torch.Tensor:
    return v[..., :k] if k is not None and v.dim() > 0 else v


def point_document(walk: EncodingWalk, point: int, k: int | None = None) -> dict[str, Any]:
    """The walk's document at one point, every position: each per-cell field's row (top-k lists cut to ``k``)."""
    return {"point": walk.points[point], **{f: _cut(getattr(walk, f)[point], k) for f in _per_cell(walk)}}


def cell_document(
    walk: EncodingWalk, point: int, position: int, k: int | None = None, reading: EncodingWalk | None = None
) -> dict[str, Any]:
    """The walk's document at one cell: each per-cell field there (top-k lists cut to ``k``), each per-position
    field at the position (its escape points index ``walk.points``), w_t and w_t+1 (None at the last position).
    ``reading``: the same walk read at that one point only, with more (top k, probabilities): the per-cell
    fields come from it."""
    T = len(walk.tokens)
    src, p = (reading, 0) if reading is not None else (walk, point)
    nxt = position + 1 < T
    return {
        "point": walk.points[point],
        "position": position,
        "token": walk.tokens[position],
        "next": walk.tokens[position + 1] if nxt else None,
        "next_id": int(walk.token_ids[position + 1]) if nxt else None,
        **{f: getattr(walk, f)[position] for f in _per_position(walk)},
        **{f: _cut(getattr(src, f)[p, position], k) for f in _per_cell(src)},
    }


def document(walks: Mapping[str, EncodingWalk], labels: Mapping[int, str], model: str, text: str) -> dict[str, Any]:
    """The ``--json`` document: the text, its tokens, the labels of every token id mentioned and every number
    of each reading's walk (:func:`walk_document`, as JSON values)."""
    first = next(iter(walks.values()))
    return {
        "model": model,
        "text": text,
        "tokens": first.tokens,
        "token_ids": first.token_ids,
        "labels": labels,
        "walks": {k: jsonable(walk_document(w)) for k, w in walks.items()},
    }


def _pos_labels(tokens: Sequence[str], n: int) -> list[str]:
    return [f"{t}:{show(tokens[t])}" for t in range(n)]


def _rows(walk: EncodingWalk) -> list[int]:
    """Residual points to show as rows: embed, after attention (resid_mid/resid_cross), after MLP, final.

    ``resid_pre`` of layer l+1 equals ``resid_post`` of layer l, so it is left out.
    """
    out = [i for i, (p, r) in enumerate(zip(walk.points, walk.residual)) if r and not p.endswith(".resid_pre")]
    return out or list(range(len(walk.points)))


def _rank_figure(z: torch.Tensor, rows: list[str], cols: list[str], title: str) -> Any:
    plt = pyplot()
    h = min(14.0, 2.0 + 0.22 * len(rows))
    w = min(18.0, 3.0 + 0.14 * len(cols))
    fig, ax = plt.subplots(figsize=(w, h))
    im = ax.imshow(z.numpy(), aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_yticks(*ticks(rows), fontsize=7)
    ax.set_xticks(*ticks(cols), fontsize=7, rotation=90)
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, label="log10(1 + rank)  (0 = nearest token)")
    fig.tight_layout()
    return fig


def _grid_html(walk: EncodingWalk, labels: Mapping[int, str], rows: list[int], n_cols: int) -> str:
    """Nearest-token grid: the top-1 token of each position at each point (Fig. 9 style).

    Green: the top-1 token is w_{t+1} (the walk reached the next token's neighbourhood); grey: it is w_t.
    """
    cols = _pos_labels(walk.tokens, n_cols)
    head = "<tr><th>point</th>" + "".join(f"<th>{html.escape(c)}</th>" for c in cols) + "</tr>"
    ids = walk.token_ids.tolist()
    body = []
    for i in rows:
        cells = []
        for t in range(n_cols):
            top = int(walk.top_ids[i, t, 0])
            style = ""
            if t + 1 < len(ids) and top == ids[t + 1]:
                style = " style='background:#c8f0c8'"
            elif top == ids[t]:
                style = " style='background:#e4e4e4'"
            cells.append(f"<td{style}>{html.escape(show(labels.get(top, str(top))))}</td>")
        body.append(f"<tr><th>{html.escape(walk.points[i])}</th>{''.join(cells)}</tr>")
    return f"<div style='overflow-x:auto'><table class='wl wl-grid'>{head}{''.join(body)}</table></div>"


def _band(x: torch.Tensor) -> tuple[list[float], list[float], list[float]]:
    """Mean and 10th/90th percentiles over positions (NaNs ignored) for each row of x [points, tokens]."""
    mean, lo, hi = [], [], []
    for row in x:
        v = row[~torch.isnan(row)]
        if len(v) == 0:
            mean.append(float("nan"))
            lo.append(float("nan"))
            hi.append(float("nan"))
            continue
        mean.append(float(v.mean()))
        lo.append(float(torch.quantile(v, 0.1)))
        hi.append(float(torch.quantile(v, 0.9)))
    return mean, lo, hi


def _summary_table(report: Report, walk: EncodingWalk, labels: Mapping[int, str], n_cols: int, fi: int) -> None:
    """Per position: w_t, w_t+1, the top-1 token and the ranks at point ``fi``, the escape points (A.2)."""
    T = len(walk.tokens)
    esc, stab = walk.escape_names, walk.escape_stable_names
    table_rows = []
    for t in range(n_cols):
        nxt = show(walk.tokens[t + 1]) if t + 1 < T else ""
        top = int(walk.top_ids[fi, t, 0])
        rn = int(walk.rank_of_next[fi, t])
        table_rows.append(
            [
                t,
                show(walk.tokens[t]),
                nxt,
                show(labels.get(top, str(top))),
                int(walk.rank_of_input[fi, t]),
                rn if rn >= 0 else "",
                float(walk.prob_of_next[fi, t]) if rn >= 0 else "",
                esc[t] or "-",
                stab[t] or "-",
            ]
        )
    report.table(
        [
            "t",
            "w_t",
            "w_t+1",
            f"top-1 at {walk.points[fi]}",
            "rank w_t",
            "rank w_t+1",
            "P(w_t+1)",
            "w_t+1 first outranks w_t",
            "… and stays ahead from",
        ],
        table_rows,
    )


def rank_map_document(
    walk: EncodingWalk, labels: Mapping[int, str], rows: Sequence[int], n_cols: int, top: int = TOP_HOVER
) -> dict[str, Any]:
    """The document of a walk's rank maps (sec. 2.2.2, A.2), drawn by ``walklensResults.rankMap`` of
    ``assets/results.js`` (the explorer's walk view draws its :func:`walk_document` reply with the same function):
    the ranks of w_t and w_t+1 at the points ``rows`` and the first ``n_cols`` positions, the escape points as rows
    of the map (-1: none, or not a row shown) and each cell's ``top`` nearest tokens."""
    row = {int(i): r for r, i in enumerate(rows)}
    cols = range(n_cols)
    return {
        "points": [walk.points[i] for i in rows],
        "columns": walk.tokens[:n_cols],
        "block": 1,
        "rank_of_input": walk.rank_of_input[list(rows), :n_cols],
        "rank_of_next": walk.rank_of_next[list(rows), :n_cols],
        "escape_point": [row.get(int(p), -1) for p in walk.escape_point[:n_cols]],
        "escape_stable": [row.get(int(p), -1) for p in walk.escape_stable[:n_cols]],
        "nearest": [[[labels.get(int(j), str(int(j))) for j in walk.top_ids[i, t, :top]] for t in cols] for i in rows],
    }


def _rank_maps(
    report: Report,
    walk: EncodingWalk,
    labels: Mapping[int, str],
    rows: list[int],
    n_cols: int,
    name: tuple[str, str],
    figures: bool,
) -> None:
    """The rank maps of w_t and w_t+1 (one row per point, one column per position, hover for the nearest tokens),
    drawn on the page from :func:`rank_map_document` by the explorer's own function; ``name``: (key, heading) of
    the walk, for the PNGs."""
    key, heading = name
    report.result("rank_map", rank_map_document(walk, labels, rows, n_cols))
    if not figures:
        return
    cols = _pos_labels(walk.tokens, n_cols)
    row_names = [walk.points[i] for i in rows]
    for what, ranks in (("input", walk.rank_of_input), ("next", walk.rank_of_next)):
        r = ranks[rows, :n_cols]
        z = torch.log10(1 + r.clamp_min(0).float())
        z[r < 0] = float("nan")
        sym = "w_t" if what == "input" else "w_t+1"
        report.figure(
            _rank_figure(z, row_names, cols, f"{heading}: rank of {sym}"),
            f"rank_{what}_{key}",
            caption=f"log10(1 + rank of {sym}) at each point (rows) and position (columns)",
            embed=False,
        )  # the interactive map above shows the same view


def _curves(report: Report, walk: EncodingWalk, rows: list[int]) -> None:
    """Per-layer curves (mean over positions, 10-90 % band) of the cosines with w_t and w_t+1, per position too
    for short texts, and of the step length and angle."""
    T = len(walk.tokens)
    x = [walk.points[i] for i in rows]
    ci, cn = walk.cos_input[rows], walk.cos_next[rows]
    series: list[dict[str, Any]] = []
    for name, v, colour in (("cos(x, w_t)", ci, "#1f77b4"), ("cos(x, w_t+1)", cn, "#d62728")):
        m, lo, hi = _band(v)
        series.append({"name": name + " mean", "y": m, "band": [lo, hi], "color": colour})
    if T <= 12:
        for t in range(T - 1):
            series.append(
                {
                    "name": f"{t}:{show(walk.tokens[t])} → {show(walk.tokens[t + 1])}",
                    "y": cn[:, t].tolist(),
                    "dash": True,
                }
            )
    report.lines(
        x, series, title="cosine with w_t and with w_t+1 through the stack", xlabel="point", width=900, height=340
    )
    curves: tuple[tuple[torch.Tensor, str, str, str | None], ...] = (
        (
            walk.step_length[rows],
            "step length |x_p - x_p-1|",
            "step length between consecutive residual points (mean over positions, 10-90 % band)",
            None,
        ),
        (walk.step_angle[rows], "angle (degrees)", "angle between consecutive residual points", "#2ca02c"),
    )
    for v, label, title, line_colour in curves:
        m, lo, hi = _band(v)
        line = {"name": label, "y": m, "band": [lo, hi], **({"color": line_colour} if line_colour else {})}
        report.lines(x, [line], title=title, xlabel="point", width=900, height=300)


def add_walk(
    report: Report,
    walk: EncodingWalk,
    labels: Mapping[int, str],
    key: str,
    heading: str,
    figures: bool = True,
    max_cols: int = MAX_COLS,
) -> None:
    """One encoding walk (one reading, one stack) as report sections (sec. 2.2.2, Fig. 9, A.2)."""
    rows = _rows(walk)
    T = len(walk.tokens)
    n_cols = min(T, max_cols)
    fi = walk.points.index("final") if "final" in walk.points else rows[-1]
    report.h2(heading)
    report.p(
        f"metric: {walk.metric}; norm: {walk.norm}; compared with: {walk.matrix}; k = {walk.k}. "
        f"Ranks count the tokens scoring strictly higher (0 = nearest).",
        note=True,
    )
    if n_cols < T:
        report.p(f"Showing the first {n_cols} of {T} positions; the JSON output holds all of them.", note=True)
    _summary_table(report, walk, labels, n_cols, fi)
    _rank_maps(report, walk, labels, rows, n_cols, (key, heading), figures)
    report.raw("<h3>nearest token at each point (green: w_t+1, grey: w_t)</h3>")
    grid_rows = (
        rows if len(rows) <= 70 else [i for i in rows if not walk.points[i].endswith(("resid_mid", "resid_cross"))]
    )
    report.raw(_grid_html(walk, labels, grid_rows, n_cols))
    _curves(report, walk, rows)


#: each reading's heading, the most informative first (the logit lens)
READINGS = {
    "final": "final norm + the model's head (norm=final, the logit lens)",
    "none": "raw vectors against V (norm=none, the papers' reading)",
}
_SHORT = {"final": "lens", "none": "raw"}


def add_answers(report: Report, answers: Sequence[TargetAnswer]) -> None:
    """Where a chosen token becomes top-1 and stays (one :class:`~walklens.analyses.walks.target.TargetAnswer`
    per reading): the answer in words, and its rank at each residual point as a table and a curve."""
    if not answers:
        return
    first = answers[0]
    report.h2(f"Target {show(first.token)!r} at position {first.position}: where it becomes top-1 and stays")
    report.table(
        ["reading", "top-1 from (and stays)", "layer", "rank at the last point", "ranks"],
        [
            [
                _SHORT.get(a.reading, a.reading),
                a.point or "never",
                "" if a.layer is None else a.layer,
                "" if a.ranks[-1] is None else a.ranks[-1],
                "exact" if a.exact else "from the top k (beyond it: blank)",
            ]
            for a in answers
        ],
    )
    rows = [i for i, r in enumerate(first.residual) if r and not first.points[i].endswith(".resid_pre")]
    rows = rows or list(range(len(first.points)))
    series = [
        {
            "name": f"log10(1 + rank), {_SHORT.get(a.reading, a.reading)}",
            "y": [None if (r := a.ranks[i]) is None else math.log10(1 + r) for i in rows],
        }
        for a in answers
    ]
    report.lines(
        [first.points[i] for i in rows],
        series,
        title=f"rank of {show(first.token)!r} through the stack (0 = top-1)",
        xlabel="point",
        width=900,
        height=300,
    )


def targets_of(walks: Mapping[str, EncodingWalk]) -> list[TargetAnswer]:
    """The answer of each walk that read a target (its reading's), the logit lens first."""
    order = sorted(walks, key=lambda k: k != "final")
    return [w.first_top(tid) for w in (walks[k] for k in order) if (tid := w.target_id) is not None]


def build(
    walks: Mapping[str, EncodingWalk],
    labels: Mapping[int, str],
    title: str,
    subtitle: str = "",
    figures: bool = True,
    max_cols: int = MAX_COLS,
) -> Report:
    """The ``walklens walk`` report of one text's encoding walks; ``walks`` maps a reading (``"none"``: raw
    vectors against V, ``"final"``: the logit lens) to a walk.

    Encoder-decoder walks (``walk.encoder``) get an encoder section beside the decoder's (A.2).  A walk that read
    a target opens the page with its answer (:func:`add_answers`); the logit lens comes before the raw reading.
    """
    rep = Report(title, subtitle)
    add_answers(rep, targets_of(walks))
    for key in sorted(walks, key=lambda k: k != "final"):
        walk = walks[key]
        label = READINGS.get(key, key)
        if walk.encoder is not None:
            add_walk(rep, walk.encoder, labels, f"enc_{key}", f"Encoder walk: {label}", figures, max_cols)
            add_walk(rep, walk, labels, key, f"Decoder walk: {label}", figures, max_cols)
        else:
            add_walk(rep, walk, labels, key, f"Encoding walk: {label}", figures, max_cols)
    return rep


__all__ = [
    "MAX_COLS",
    "READINGS",
    "add_answers",
    "targets_of",
    "add_walk",
    "build",
    "cell_document",
    "document",
    "point_document",
    "rank_map_document",
    "walk_document",
]
